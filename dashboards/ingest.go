package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// eventsWhere selects the audit events of the chosen organizations (no filter for
// "All") by event time, which leads the table's sort key.
const eventsWhere = `$__conditionalAll(org_id IN (${org:singlequote}), $org)
	  AND $__timeFilter(time)`

// bucket rounds a DateTime column down to the panel's interval. toStartOfInterval and
// $__timeInterval do not exist on ClickHouse 18.16; integer division does. The alias must
// not be the column's own name: ClickHouse would read the alias inside its definition.
func bucket(col string) string {
	return "toDateTime(intDiv(toUInt32(" + col + "), $__interval_s) * $__interval_s)"
}

var (
	eventsTotalSQL = sql(`
	SELECT count() AS events
	FROM bandplane.events FINAL
	WHERE ` + eventsWhere)

	eventsByTypeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, type, count() AS events
	FROM bandplane.events FINAL
	WHERE ` + eventsWhere + `
	GROUP BY bucket, type
	ORDER BY bucket, type`)

	// Seconds from an event's own time to its insert into ClickHouse: producer delay,
	// Kafka lag and batching together. UInt32 - UInt32 is signed in ClickHouse, so a
	// producer clock ahead of ours shows as a negative lag instead of wrapping.
	ingestLagSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket,
	  quantile(0.5)(toUInt32(ingested_at) - toUInt32(time)) AS p50,
	  quantile(0.95)(toUInt32(ingested_at) - toUInt32(time)) AS p95,
	  max(toUInt32(ingested_at) - toUInt32(time)) AS max_lag
	FROM bandplane.events FINAL
	WHERE ` + eventsWhere + `
	GROUP BY bucket
	ORDER BY bucket`)

	// Dead letters carry no organization (they could not be decoded or validated), so
	// these panels ignore the org variable. FINAL: a redelivered record is one row.
	deadLettersTotalSQL = sql(`
	SELECT count() AS dead_letters
	FROM bandplane.dead_letters FINAL
	WHERE $__timeFilter(received_at)`)

	deadLettersByStageSQL = sql(`
	SELECT ` + bucket("received_at") + ` AS bucket, stage, count() AS dead_letters
	FROM bandplane.dead_letters FINAL
	WHERE $__timeFilter(received_at)
	GROUP BY bucket, stage
	ORDER BY bucket, stage`)

	deadLetterReasonsSQL = sql(`
	SELECT
	  max(received_at) AS last_seen,
	  stage,
	  reason,
	  count() AS records,
	  argMax(concat(topic, '/', toString("partition"), '@', toString("offset")), received_at) AS last_record
	FROM bandplane.dead_letters FINAL
	WHERE $__timeFilter(received_at)
	GROUP BY stage, reason
	ORDER BY last_seen DESC, stage, reason
	LIMIT 50`)
)

// IngestHealth is "bandplane — Ingest health": what the pipeline writes into ClickHouse,
// how late, and what it turns away into the dead-letter table.
func IngestHealth() *dashboard.DashboardBuilder {
	one := 1.0
	return dashboard.NewDashboardBuilder("bandplane — Ingest health").
		Uid(IngestUID).
		Description("Events written to the audit trail (bandplane.events) and records turned away (bandplane.dead_letters).").
		Tags([]string{"bandplane", "ingest"}).
		Time("now-6h", "now").
		Refresh("1m").
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(datasourceVariable()).
		WithVariable(orgVariable(true)).
		WithPanel(stat.NewPanelBuilder().
			Id(1).
			Title("Events ingested").
			Description("Audit events in the range, by event time, each counted once.").
			Datasource(*datasourceRef()).
			GridPos(at(0, 0, 6, 5)).
			WithTarget(NewClickHouseQuery(eventsTotalSQL)).
			Unit("short").
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
			ColorMode(common.BigValueColorModeNone).
			GraphMode(common.BigValueGraphModeNone)).
		WithPanel(stat.NewPanelBuilder().
			Id(2).
			Title("Dead letters").
			Description("Records that could not be decoded or validated, received in the range (all organizations).").
			Datasource(*datasourceRef()).
			GridPos(at(6, 0, 6, 5)).
			WithTarget(NewClickHouseQuery(deadLettersTotalSQL)).
			Unit("short").
			Thresholds(thresholds(step("green", nil), step("red", &one))).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
			ColorMode(common.BigValueColorModeBackground).
			GraphMode(common.BigValueGraphModeNone)).
		WithPanel(timeseries.NewPanelBuilder().
			Id(3).
			Title("Ingest lag").
			Description("Seconds from an event's time to its insert into ClickHouse, per interval.").
			Datasource(*datasourceRef()).
			GridPos(at(12, 0, 12, 5)).
			WithTarget(NewClickHouseQuery(ingestLagSQL).TimeSeries()).
			Interval("1m").
			Unit("s")).
		WithPanel(timeseries.NewPanelBuilder().
			Id(4).
			Title("Events ingested per type").
			Datasource(*datasourceRef()).
			GridPos(at(0, 5, 24, 10)).
			WithTarget(NewClickHouseQuery(eventsByTypeSQL).TimeSeries()).
			Interval("1m").
			DisplayName("${__field.labels.type}").
			Unit("short").
			DrawStyle(common.GraphDrawStyleBars).
			FillOpacity(80).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).
			Legend(common.NewVizLegendOptionsBuilder().
				ShowLegend(true).
				DisplayMode(common.LegendDisplayModeTable).
				Placement(common.LegendPlacementRight).
				Calcs([]string{"sum"})).
			Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))).
		WithPanel(timeseries.NewPanelBuilder().
			Id(5).
			Title("Dead letters by stage").
			Datasource(*datasourceRef()).
			GridPos(at(0, 15, 24, 8)).
			WithTarget(NewClickHouseQuery(deadLettersByStageSQL).TimeSeries()).
			Interval("1m").
			DisplayName("${__field.labels.stage}").
			Unit("short").
			DrawStyle(common.GraphDrawStyleBars).
			FillOpacity(80).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom))).
		WithPanel(table.NewPanelBuilder().
			Id(6).
			Title("Latest dead-letter reasons").
			Description("One row per stage and reason, most recent first; last_record is topic/partition@offset of the latest record.").
			Datasource(*datasourceRef()).
			GridPos(at(0, 23, 24, 10)).
			WithTarget(NewClickHouseQuery(deadLetterReasonsSQL)).
			Filterable(true))
}
