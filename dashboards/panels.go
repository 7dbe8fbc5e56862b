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

// grid lays panels out left to right in rows of 24 columns and numbers them.
type grid struct {
	id         uint32
	x, y, rowH uint32
}

func (g *grid) next(w, h uint32) (uint32, dashboard.GridPos) {
	if g.x+w > 24 {
		g.x, g.y, g.rowH = 0, g.y+g.rowH, 0
	}
	pos := dashboard.GridPos{X: g.x, Y: g.y, W: w, H: h}
	g.x += w
	g.rowH = max(g.rowH, h)
	g.id++
	return g.id, pos
}

// newRow starts a new row of panels (the next panel goes to the left edge).
func (g *grid) newRow() {
	if g.x > 0 {
		g.x, g.y, g.rowH = 0, g.y+g.rowH, 0
	}
}

// row is a collapsible row header spanning the width.
func (g *grid) row(title string) *dashboard.RowBuilder {
	g.newRow()
	id, pos := g.next(24, 1)
	g.newRow()
	return dashboard.NewRowBuilder(title).Id(id).GridPos(pos)
}

func statPanel(g *grid, w, h uint32, title, description, rawSQL, unit string) *stat.PanelBuilder {
	id, pos := g.next(w, h)
	return stat.NewPanelBuilder().
		Id(id).
		Title(title).
		Description(description).
		Datasource(*datasourceRef()).
		GridPos(pos).
		WithTarget(NewClickHouseQuery(rawSQL)).
		Unit(unit).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Values(true).Calcs([]string{"lastNotNull"})).
		TextMode(common.BigValueTextModeValueAndName).
		ColorMode(common.BigValueColorModeNone).
		GraphMode(common.BigValueGraphModeNone)
}

// timeSeriesPanel draws one series per label set of the query; legend is the display
// name, e.g. "${__field.labels.agent}", so that it shows the label (a name), not
// "cost {agent=…}".
func timeSeriesPanel(g *grid, w, h uint32, title, description, rawSQL, unit, legend, minInterval string, bars bool) *timeseries.PanelBuilder {
	id, pos := g.next(w, h)
	p := timeseries.NewPanelBuilder().
		Id(id).
		Title(title).
		Description(description).
		Datasource(*datasourceRef()).
		GridPos(pos).
		WithTarget(NewClickHouseQuery(rawSQL).TimeSeries()).
		Unit(unit).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementRight).
			Calcs([]string{"sum"})).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
	if minInterval != "" {
		p = p.Interval(minInterval)
	}
	if legend != "" {
		p = p.DisplayName(legend)
	}
	if bars {
		p = p.DrawStyle(common.GraphDrawStyleBars).
			FillOpacity(80).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal))
	}
	return p
}

func tablePanel(g *grid, w, h uint32, title, description, rawSQL string) *table.PanelBuilder {
	id, pos := g.next(w, h)
	return table.NewPanelBuilder().
		Id(id).
		Title(title).
		Description(description).
		Datasource(*datasourceRef()).
		GridPos(pos).
		WithTarget(NewClickHouseQuery(rawSQL)).
		Filterable(true)
}

func barPanel(g *grid, w, h uint32, title, description, rawSQL, xField, unit string) *barchart.PanelBuilder {
	id, pos := g.next(w, h)
	zero := 0.0
	return barchart.NewPanelBuilder().
		Id(id).
		Title(title).
		Description(description).
		Datasource(*datasourceRef()).
		GridPos(pos).
		WithTarget(NewClickHouseQuery(rawSQL)).
		XField(xField).
		Orientation(common.VizOrientationHorizontal).
		Unit(unit).
		Min(zero).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).Placement(common.LegendPlacementBottom))
}

// hidden keeps a column out of sight: the id columns tables carry for their links.
func hidden() []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{{Id: "custom.hidden", Value: true}}
}

func unitOf(unit string) []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{{Id: "unit", Value: unit}}
}

// cellLink makes a column's cells open url (a data link; ${__data.fields.x} is the row's
// value of column x).
func cellLink(title, url string) []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{{Id: "links", Value: []map[string]any{{"title": title, "url": url}}}}
}

// Links between the dashboards keep the time range (${__url_time_range}) and pass the
// organization (${org:queryparam}: var-org=<id>, or the "All" option) and the id of the
// row's agent or room: an id percent-encoded with Grafana's strict encoding, so that any
// character arrives as it was.
func agentLink(idField string) string {
	return "/d/" + ActivityUID + "?${__url_time_range}&${" + varOrg + ":queryparam}&var-" + varAgent + "=${__data.fields." + idField + ":percentencode}"
}

func roomLink(idField string) string {
	return "/d/" + WorkUID + "?${__url_time_range}&${" + varOrg + ":queryparam}&var-" + varRoom + "=${__data.fields." + idField + ":percentencode}"
}

func orgLink(idField string) string {
	return "/d/" + CostUID + "?${__url_time_range}&var-" + varOrg + "=${__data.fields." + idField + ":percentencode}"
}

// dashboardLinks is the drop-down of the other bandplane dashboards, keeping the time
// range and every variable (org, agent, room… carry over by name).
func dashboardLinks() []cog.Builder[dashboard.DashboardLink] {
	return []cog.Builder[dashboard.DashboardLink]{
		dashboard.NewDashboardLinkBuilder("bandplane").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"bandplane"}).
			AsDropdown(true).
			KeepTime(true).
			IncludeVars(true),
	}
}

func newDashboard(title, uid, description string, tags []string, from string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(description).
		Tags(append([]string{"bandplane"}, tags...)).
		Time(from, "now").
		Timezone("utc").
		Refresh("5m").
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Links(dashboardLinks()).
		WithVariable(datasourceVariable())
}
