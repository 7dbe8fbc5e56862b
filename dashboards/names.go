package dashboards

import "github.com/bandplane/bandplane/schema/pricing"

// Name lookups, joined on an id column so that legends and tables show names: one JOIN
// per SELECT (ClickHouse 18.16 allows no more), each an aliased subquery (every
// ClickHouse since 20.x refuses a JOIN subquery without an alias: Code 206,
// ALIAS_REQUIRED), with column names no other side of the join uses (the 26.9 analyzer
// refuses an ambiguous name). A missing entry joins as ” (ANY LEFT JOIN fills defaults),
// and nameOr falls back to the id. Never ANY INNER JOIN: since 20.x it keeps one row per
// key of the left side too (five adds of one participant become one), where 18.16 keeps
// every left row; ANY LEFT JOIN and a test of a column only the right side sets is the
// same on both.
var (
	agentLookup = `(SELECT id AS agent_id, if(handle = '', '', concat('@', handle)) AS agent_name
	  FROM bandplane.directory FINAL WHERE kind = 'agent') AS agent_names`
	ownerLookup = `(SELECT id AS owner_id, if(handle = '', '', concat('@', handle)) AS owner_name
	  FROM bandplane.directory FINAL WHERE kind = 'user') AS owner_names`
	// actorLookup names any party of the directory (people and agents).
	actorLookup = `(SELECT id AS actor_id, any(if(handle = '', '', concat('@', handle))) AS actor_name
	  FROM bandplane.directory FINAL GROUP BY id) AS actor_names`
	// roomLookup is a room's latest title, by the room id alone: the platform's room ids
	// are unique, and an event's org_id is its actor's organization, which for a
	// participant from another organization is not the room's.
	roomLookup = `(SELECT room_id, argMax(title, time) AS room_name
	  FROM bandplane.rooms FINAL WHERE kind = 'title' GROUP BY room_id) AS room_names`
	orgLookup = "(" + orgNames + ") AS org_names"
	// scopeLookup names what a budget counts: an organization, a person, an agent or a
	// room, all keyed scope_id.
	scopeLookup = anyNameLookup("scope_id", "scope_name", "scope_names")
)

// anyNameLookup names any id: a person or an agent (directory), a room (its title) or
// an organization (orgLabel), as columns key and name.
func anyNameLookup(key, name, alias string) string {
	return `(
	  SELECT id AS ` + key + `, any(if(handle = '', '', concat('@', handle))) AS ` + name + `
	  FROM bandplane.directory FINAL GROUP BY id
	  UNION ALL
	  SELECT room_id AS ` + key + `, argMax(title, time) AS ` + name + `
	  FROM bandplane.rooms FINAL WHERE kind = 'title' GROUP BY room_id
	  UNION ALL
	  SELECT org_id AS ` + key + `, ` + orgLabel + ` AS ` + name + `
	  FROM bandplane.directory FINAL WHERE org_id != '' GROUP BY org_id
	) AS ` + alias
}

// nameOr is the name, or the id when the lookup had none.
func nameOr(name, id string) string { return "if(" + name + " = '', " + id + ", " + name + ")" }

// costUnit is the Grafana unit of cost fields: the currency of bandplane's default
// price catalog (schema/pricing/catalog.json). A deployment with a catalog in another
// currency regenerates the dashboards; the tables show each row's currency anyway.
var costUnit = currencyUnit(pricing.Default().Currency())

func currencyUnit(code string) string {
	switch code {
	case "USD", "EUR", "GBP", "JPY", "CHF", "INR", "SEK", "NOK", "DKK", "PLN", "BRL", "KRW", "ZAR", "TRY", "ILS":
		return "currency" + code
	}
	return "suffix: " + code
}

// tokensUnit scales token counts (1.2 K, 3.4 Mil); the panels' titles say they are tokens.
const tokensUnit = "short"
