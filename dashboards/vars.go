package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// How a variable's value gets into SQL (the one place it does: value).
//
// Ids may hold any printable character (schema/validate.go refuses only control
// characters and invalid UTF-8), so no variable may be quoted by a format that leaves
// something unescaped that a ClickHouse string literal treats specially:
//   - singlequote and sqlstring escape ' but not \, so an id ending in \ ends the literal
//     early (ClickHouse reads \' as an escaped quote);
//   - queryparam is rendered differently by Grafana releases: scenes dashboards build it
//     from the URL state with encodeURIComponentAsAngularJS, which in older releases
//     leaves ' ( ) ! * unescaped (and @ : $ , ; in all of them).
//
// percentencode is the same everywhere: encodeURIComponentStrict (encodeURIComponent,
// then ! ' ( ) * too), which leaves only A–Z a–z 0–9 - _ . ~ as they are. The encoded
// value therefore holds no quote, backslash, $ or parenthesis: put between quotes it is
// one string literal whatever the id, and decodeURLComponent (ClickHouse 18.16 and 26.9)
// gives the id back byte for byte. A multi-value variable would be encoded as
// "{a,b}" with the separating comma encoded like a comma inside a value, so the
// dashboards' variables are single-value, with an "All" option that $__conditionalAll
// turns into no condition at all (the value is $__all then, and is never decoded).

// Variable names, shared by the dashboards so that links carry them across.
const (
	varOrg      = "org"
	varOwner    = "owner"
	varAgent    = "agent"
	varModel    = "model"
	varRoom     = "room"
	varActor    = "actor"
	varType     = "type"
	varSearch   = "search"
	varDecision = "decision"
)

// value is the SQL expression of the id (or text) variable name holds.
func value(name string) string {
	return "decodeURLComponent('${" + name + ":percentencode}')"
}

// is tests that expr equals the variable's value; with "All" (or nothing) selected it
// is no test at all. The second argument of $__conditionalAll is $name: the form every
// plugin release recognises.
func is(expr, name string) string {
	return "$__conditionalAll(" + expr + " = " + value(name) + ", $" + name + ")"
}

// isEither tests that a or b equals the variable's value (say, the two organizations of
// a cross-organization add); no test for "All".
func isEither(a, b, name string) string {
	return "$__conditionalAll((" + a + " = " + value(name) + " OR " + b + " = " + value(name) + "), $" + name + ")"
}

// contains tests that expr contains the variable's text, ignoring case; an empty text
// is no test.
func contains(expr, name string) string {
	return "$__conditionalAll(positionCaseInsensitiveUTF8(" + expr + ", " + value(name) + ") > 0, $" + name + ")"
}

// Macro forms the dashboards use. The time macros are always written in parentheses:
// the plugin's backend takes everything up to the next ")" as a macro's arguments when
// a "(" comes first, even for a macro without arguments.
const (
	fromTime  = "($__fromTime)"
	toTime    = "($__toTime)"
	intervalS = "($__interval_s)"
)

func timeFilter(col string) string { return "$__timeFilter(" + col + ")" }

// bucket rounds a DateTime column down to the panel's interval. toStartOfInterval and
// $__timeInterval do not exist on ClickHouse 18.16; integer division does. The alias must
// not be the column's own name: ClickHouse would read the alias inside its definition.
func bucket(col string) string {
	return "toDateTime(intDiv(toUInt32(" + col + "), " + intervalS + ") * " + intervalS + ", 'UTC')"
}

// ---- variable definitions ----

// queryVar is a single-value query variable with an "All" option (selected by default):
// its SQL returns the id first and the name second, which the plugin's metricFindQuery
// turns into options that show the name and pass the id (src/data/CHDatasource.ts:
// "convention - assume the first field is an id field"; CHVariableSupport keeps it).
// The query is stored as the plugin's query object (variableQuery), the SQL also as the
// variable's definition (what Grafana's variable list shows).
func queryVar(name, label, description, sql string, refresh dashboard.VariableRefresh) *dashboard.QueryVariableBuilder {
	return dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Description(description).
		Datasource(*datasourceRef()).
		Query(variableQuery(sql)).
		Definition(sql).
		Refresh(refresh).
		Sort(dashboard.VariableSortAlphabeticalCaseInsensitiveAsc).
		IncludeAll(true).
		Multi(false).
		AllowCustomValue(false).
		Current(allOption())
}

// variableQuery is a variable's SQL as the plugin's query object, the one form every
// plugin release runs:
//   - up to 4.18 the plugin has no variable support of its own: Grafana hands the stored
//     query to Datasource.metricFindQuery, which takes a string or an object and runs an
//     object whose editorType is "sql" (or missing) as its rawSql;
//   - from 4.19 (CustomVariableSupport, src/data/CHVariableSupport.tsx) Grafana hands it
//     to CHVariableSupport.query, and some releases of it read target.rawSql only, so a
//     plain string gives no options at all.
//
// The object is what the plugin's variable editor saves for a "Custom SQL" variable
// (CHVariableQuery: refId, queryType "sql", rawSql; database, table, column only for the
// guided types), plus editorType "sql", which is what metricFindQuery wraps a plain
// string into and what it checks. (One revision of CHVariableSupport.query returned a
// text field only, so its options would pass names instead of ids: no stored form helps
// there, one more reason the releases from 4.19 are outside the tested range,
// deploy/grafana/README.md.)
func variableQuery(sql string) dashboard.StringOrMap {
	return dashboard.StringOrMap{Map: map[string]any{
		"refId":      variableRefID,
		"editorType": "sql",
		"queryType":  "sql",
		"rawSql":     sql,
	}}
}

// variableRefID is the refId the plugin's variable editor gives a new variable query.
const variableRefID = "var"

func allOption() dashboard.VariableOption {
	sel := true
	return dashboard.VariableOption{
		Selected: &sel,
		Text:     dashboard.StringOrArrayOfString{String: strPtr(AllText)},
		Value:    dashboard.StringOrArrayOfString{String: strPtr(AllValue)},
	}
}

func strPtr(s string) *string { return &s }

// orgLabel names an organization for people: bandplane's data has no organization
// names, so it is the handles of its first two people (alphabetically), how many more,
// and the start of its id, which keeps two similar organizations apart.
const orgLabel = `concat(
	  if(countIf(kind = 'user') = 0, 'no people',
	    arrayStringConcat(arraySlice(arraySort(groupArrayIf(concat('@', handle), kind = 'user')), 1, 2), ', ')),
	  if(countIf(kind = 'user') > 2, concat(' +', toString(countIf(kind = 'user') - 2)), ''),
	  ' (', substringUTF8(org_id, 1, 8), ')')`

// orgNames is the lookup of organization labels, joined on org_id.
var orgNames = sql(`
	SELECT org_id, ` + orgLabel + ` AS org_name
	  FROM bandplane.directory FINAL
	  WHERE org_id != ''
	  GROUP BY org_id`)

func orgVariable() *dashboard.QueryVariableBuilder {
	q := sql(`
	SELECT org_id, ` + orgLabel + ` AS org_name
	FROM bandplane.directory FINAL
	WHERE org_id != ''
	GROUP BY org_id
	ORDER BY org_name`)
	return queryVar(varOrg, "Organization",
		"bandplane keeps no organization names: an organization is shown by its people's handles and the start of its id.",
		q, dashboard.VariableRefreshOnDashboardLoad)
}

func ownerVariable() *dashboard.QueryVariableBuilder {
	q := sql(`
	SELECT id, if(name = '', concat('@', handle), concat(name, ' (@', handle, ')')) AS owner_name
	FROM bandplane.directory FINAL
	WHERE kind = 'user' AND ` + is("org_id", varOrg) + `
	ORDER BY owner_name`)
	return queryVar(varOwner, "Owner", "People of the organization (agents' owners), from the directory.", q,
		dashboard.VariableRefreshOnDashboardLoad)
}

// agentVariable lists the agents of the organization, and of the owner variable's
// choice when byOwner (dashboards without an owner variable pass false).
func agentVariable(byOwner bool) *dashboard.QueryVariableBuilder {
	filter, description := is("org_id", varOrg), "Agents of the organization, from the directory."
	if byOwner {
		filter += ` AND ` + is("owner_id", varOwner)
		description = "Agents of the organization (and of the owner, when one is chosen), from the directory."
	}
	q := sql(`
	SELECT id, concat('@', handle) AS agent_name
	FROM bandplane.directory FINAL
	WHERE kind = 'agent' AND ` + filter + `
	ORDER BY agent_name`)
	return queryVar(varAgent, "Agent", description, q, dashboard.VariableRefreshOnDashboardLoad)
}

func modelVariable() *dashboard.QueryVariableBuilder {
	q := sql(`
	SELECT DISTINCT model
	FROM bandplane.usage_hourly FINAL
	WHERE ` + is("org_id", varOrg) + ` AND events > 0
	  AND hour >= toStartOfHour(` + fromTime + `, 'UTC') AND hour <= ` + toTime + `
	ORDER BY model`)
	return queryVar(varModel, "Model", "Models with usage in the time range (a model's name is its id).", q,
		dashboard.VariableRefreshOnTimeRangeChanged)
}

func roomVariable() *dashboard.QueryVariableBuilder {
	q := sql(`
	SELECT room_id, ` + nameOr("room_name", "room_id") + ` AS room_label
	FROM (
	  SELECT DISTINCT room_id FROM (
	    SELECT room_id FROM bandplane.rooms FINAL WHERE ` + is("org_id", varOrg) + `
	    UNION ALL
	    SELECT room_id FROM bandplane.room_activity FINAL WHERE ` + is("org_id", varOrg) + `
	  ) AS both_kinds
	  WHERE room_id != ''
	) AS ids
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY room_label`)
	return queryVar(varRoom, "Room", "Rooms of the organization and rooms its agents and people act in, by title (room.added).", q,
		dashboard.VariableRefreshOnDashboardLoad)
}

// actorVariable lists everyone who can act in the trail: people and agents from the
// directory, and the system actors (operators' keys, bandplane's own services) that
// acted in the time range.
func actorVariable() *dashboard.QueryVariableBuilder {
	q := sql(`
	SELECT actor, actor_name FROM (
	  SELECT id AS actor, concat('@', handle, ' (', toString(kind), ')') AS actor_name
	  FROM bandplane.directory FINAL
	  WHERE ` + is("org_id", varOrg) + `
	  UNION ALL
	  SELECT DISTINCT actor_id AS actor, concat(actor_id, ' (system)') AS actor_name
	  FROM bandplane.events FINAL
	  WHERE actor_type = 'system' AND ` + is("org_id", varOrg) + ` AND ` + timeFilter("time") + `
	) AS a
	ORDER BY actor_name`)
	return queryVar(varActor, "Actor", "Who acted: people and agents (directory) and system actors (API keys, bandplane's services) seen in the range.", q,
		dashboard.VariableRefreshOnTimeRangeChanged)
}

func typeVariable() *dashboard.QueryVariableBuilder {
	q := sql(`
	SELECT DISTINCT type
	FROM bandplane.events FINAL
	WHERE ` + is("org_id", varOrg) + ` AND ` + timeFilter("time") + `
	ORDER BY type`)
	return queryVar(varType, "Event type", "Event types in the range (schema/event.go).", q,
		dashboard.VariableRefreshOnTimeRangeChanged)
}

// decisionVariable lists the policy API's decisions (query/decisions.go's
// decisionNames); a custom variable, but its value goes through value() like any other.
func decisionVariable() *dashboard.CustomVariableBuilder {
	return dashboard.NewCustomVariableBuilder(varDecision).
		Label("Decision").
		Description("The policy API's decisions (POST /v1/decisions/*).").
		Values(dashboard.StringOrMap{String: strPtr("peer visible : peer_visible, add participant : add_participant, contact request : contact_request, send message : send_message")}).
		IncludeAll(true).
		Multi(false).
		AllowCustomValue(false).
		Current(allOption())
}

func searchVariable() *dashboard.TextBoxVariableBuilder {
	return dashboard.NewTextBoxVariableBuilder(varSearch).
		Label("Search").
		Description("Text to find in the event's data (case-insensitive); empty: every event.").
		DefaultValue(dashboard.StringOrMap{String: strPtr("")}).
		Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: strPtr("")}, Value: dashboard.StringOrArrayOfString{String: strPtr("")}})
}

// ownedBy tests that the agent id in col belongs to the chosen owner (directory), for
// tables without an owner column; no test for "All". An owner's agents are of the
// owner's organization, so the org filter changes nothing but keeps the read in the
// tenant like every other.
func ownedBy(col string) string {
	return "$__conditionalAll(" + col + " IN (SELECT id FROM bandplane.directory FINAL WHERE kind = 'agent' AND owner_id = " +
		value(varOwner) + " AND " + is("org_id", varOrg) + "), $" + varOwner + ")"
}
