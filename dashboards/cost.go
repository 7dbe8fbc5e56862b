package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/barchart"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// usageWhere selects the live rollup rows of the chosen organization in the dashboard's
// range. The rollup's grain is the hour, so the range is widened to the hour that holds
// its start (as the query package does); rows with events = 0 are the tombstones a
// rebuild writes over a group that moved (say, a repriced model), kept out so they do
// not show as empty groups.
const usageWhere = `org_id IN (${org:singlequote})
	  AND hour >= toStartOfHour($__fromTime) AND hour <= $__toTime
	  AND events > 0`

// Directory lookups: one per JOIN, since ClickHouse 18.16 allows one JOIN per SELECT.
const (
	agentHandles = `SELECT id AS agent_id, handle AS agent_handle FROM bandplane.directory FINAL WHERE kind = 'agent'`
	ownerHandles = `SELECT id AS owner_id, handle AS owner_handle FROM bandplane.directory FINAL WHERE kind = 'user'`
)

var (
	costTotalSQL = sql(`
	SELECT currency, toFloat64(sum(cost)) AS total_cost
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere + `
	  AND currency != ''
	GROUP BY currency
	ORDER BY currency`)

	tokensByKindSQL = sql(`
	SELECT
	  sum(input_tokens) AS input,
	  sum(output_tokens) AS output,
	  sum(cache_read_tokens) AS cache_read,
	  sum(cache_write_tokens) AS cache_write,
	  sum(reasoning_tokens) AS reasoning
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere)

	unpricedSQL = sql(`
	SELECT sum(unpriced_events) AS unpriced_events
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere)

	costByModelSQL = sql(`
	SELECT hour AS time, model, toFloat64(sum(cost)) AS cost_total
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere + `
	GROUP BY hour, model
	ORDER BY time, model`)

	costByAgentSQL = sql(`
	SELECT
	  if(agent_handle = '', agent_id, agent_handle) AS agent,
	  if(owner_handle = '', owner_id, owner_handle) AS owner,
	  model,
	  usage_events AS events,
	  input_total AS input_tokens,
	  output_total AS output_tokens,
	  cost_total AS cost,
	  currency
	FROM (
	  SELECT agent_id, owner_id, model, currency, usage_events, input_total, output_total, cost_total, agent_handle
	  FROM (
	    SELECT agent_id, owner_id, model, currency,
	      sum(events) AS usage_events,
	      sum(input_tokens) AS input_total,
	      sum(output_tokens) AS output_total,
	      toFloat64(sum(cost)) AS cost_total
	    FROM bandplane.usage_hourly FINAL
	    WHERE ` + usageWhere + `
	    GROUP BY agent_id, owner_id, model, currency
	  )
	  ANY LEFT JOIN (` + agentHandles + `) USING agent_id
	)
	ANY LEFT JOIN (` + ownerHandles + `) USING owner_id
	ORDER BY cost DESC, agent, model
	LIMIT 200`)

	costByOwnerSQL = sql(`
	SELECT if(owner_handle = '', owner_id, owner_handle) AS owner, cost_total AS cost
	FROM (
	  SELECT owner_id, toFloat64(sum(cost)) AS cost_total
	  FROM bandplane.usage_hourly FINAL
	  WHERE ` + usageWhere + `
	  GROUP BY owner_id
	)
	ANY LEFT JOIN (` + ownerHandles + `) USING owner_id
	ORDER BY cost DESC, owner
	LIMIT 20`)

	// Chattiness is read from the audit trail, not the usage rollup: every message an
	// agent posts counts, priced or not. FINAL so a replayed event counts once.
	chattiestAgentsSQL = sql(`
	SELECT if(agent_handle = '', agent_id, agent_handle) AS agent, messages, events_total AS events
	FROM (
	  SELECT actor_id AS agent_id,
	    countIf(type = 'message.created') AS messages,
	    count() AS events_total
	  FROM bandplane.events FINAL
	  WHERE org_id IN (${org:singlequote})
	    AND $__timeFilter(time)
	    AND actor_type = 'agent'
	  GROUP BY actor_id
	)
	ANY LEFT JOIN (` + agentHandles + `) USING agent_id
	ORDER BY messages DESC, events DESC, agent
	LIMIT 15`)
)

// CostAttribution is "bandplane — Cost & attribution": what an organization spends on
// models, on which agents, owners and models, and how much usage could not be priced.
func CostAttribution() *dashboard.DashboardBuilder {
	zero, one := 0.0, 1.0
	return dashboard.NewDashboardBuilder("bandplane — Cost & attribution").
		Uid(CostUID).
		Description("Model spend of one organization by agent, owner and model, from the hourly usage rollup (bandplane.usage_hourly).").
		Tags([]string{"bandplane", "cost"}).
		Time("now-7d", "now").
		Refresh("5m").
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(datasourceVariable()).
		WithVariable(orgVariable(false)).
		WithPanel(stat.NewPanelBuilder().
			Id(1).
			Title("Total cost").
			Description("Sum of priced usage in the range, per catalog currency.").
			Datasource(*datasourceRef()).
			GridPos(at(0, 0, 6, 5)).
			WithTarget(NewClickHouseQuery(costTotalSQL)).
			Decimals(2).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Values(true).Calcs([]string{"lastNotNull"}).Fields("/^total_cost$/")).
			TextMode(common.BigValueTextModeValueAndName).
			ColorMode(common.BigValueColorModeNone).
			GraphMode(common.BigValueGraphModeNone)).
		WithPanel(stat.NewPanelBuilder().
			Id(2).
			Title("Tokens by kind").
			Description("Tokens reported in the range. Reasoning tokens may also be counted in output, depending on the provider.").
			Datasource(*datasourceRef()).
			GridPos(at(6, 0, 12, 5)).
			WithTarget(NewClickHouseQuery(tokensByKindSQL)).
			Unit("short").
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
			TextMode(common.BigValueTextModeValueAndName).
			ColorMode(common.BigValueColorModeNone).
			GraphMode(common.BigValueGraphModeNone)).
		WithPanel(stat.NewPanelBuilder().
			Id(3).
			Title("Unpriced usage events").
			Description("Usage reports whose model has no price in the catalog: their cost counts as 0 until `bandplane reprice` runs with a catalog that prices them.").
			Datasource(*datasourceRef()).
			GridPos(at(18, 0, 6, 5)).
			WithTarget(NewClickHouseQuery(unpricedSQL)).
			Unit("short").
			Thresholds(thresholds(step("green", nil), step("red", &one))).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
			ColorMode(common.BigValueColorModeBackground).
			GraphMode(common.BigValueGraphModeNone)).
		WithPanel(timeseries.NewPanelBuilder().
			Id(4).
			Title("Cost by model (hourly)").
			Datasource(*datasourceRef()).
			GridPos(at(0, 5, 24, 9)).
			WithTarget(NewClickHouseQuery(costByModelSQL).TimeSeries()).
			Interval("1h").
			DisplayName("${__field.labels.model}").
			Decimals(2).
			DrawStyle(common.GraphDrawStyleBars).
			FillOpacity(80).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).
			Legend(common.NewVizLegendOptionsBuilder().
				ShowLegend(true).
				DisplayMode(common.LegendDisplayModeTable).
				Placement(common.LegendPlacementRight).
				Calcs([]string{"sum"})).
			Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))).
		WithPanel(table.NewPanelBuilder().
			Id(5).
			Title("Cost by agent").
			Description("Per agent, owner and model; handles come from the directory (an id shows when the directory has no entry).").
			Datasource(*datasourceRef()).
			GridPos(at(0, 14, 16, 11)).
			WithTarget(NewClickHouseQuery(costByAgentSQL)).
			Filterable(true).
			SortBy([]cog.Builder[common.TableSortByFieldState]{
				common.NewTableSortByFieldStateBuilder().DisplayName("cost").Desc(true),
			}).
			OverrideByName("cost", []dashboard.DynamicConfigValue{{Id: "decimals", Value: 4}})).
		WithPanel(barchart.NewPanelBuilder().
			Id(6).
			Title("Cost by owner").
			Description("Top 20 owners by spend on their agents.").
			Datasource(*datasourceRef()).
			GridPos(at(16, 14, 8, 11)).
			WithTarget(NewClickHouseQuery(costByOwnerSQL)).
			XField("owner").
			Orientation(common.VizOrientationHorizontal).
			Decimals(2).
			Min(zero).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(false))).
		WithPanel(barchart.NewPanelBuilder().
			Id(7).
			Title("Chattiest agents").
			Description("Agents with the most messages (message.created) in the range, with all their audit events; from the audit trail, so it counts unpriced activity too.").
			Datasource(*datasourceRef()).
			GridPos(at(0, 25, 24, 10)).
			WithTarget(NewClickHouseQuery(chattiestAgentsSQL)).
			XField("agent").
			Orientation(common.VizOrientationHorizontal).
			Min(zero).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).Placement(common.LegendPlacementBottom)))
}
