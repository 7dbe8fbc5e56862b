package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// usageWhere selects the live rollup rows of the dashboard's selection in its range.
// The rollup's grain is the hour, so the range is widened to the hour that holds its
// start (as the query package does); rows with events = 0 are the tombstones a rebuild
// writes over a group that moved (say, a repriced model), kept out so they do not show
// as empty groups.
var usageWhere = is("org_id", varOrg) + `
	  AND ` + is("owner_id", varOwner) + `
	  AND ` + is("agent_id", varAgent) + `
	  AND ` + is("model", varModel) + `
	  AND ` + is("room_id", varRoom) + `
	  AND hour >= toStartOfHour(` + fromTime + `, 'UTC') AND hour <= ` + toTime + `
	  AND events > 0`

// initiatorWhere is usageWhere over the initiator rollup (initiator_hourly), which
// keeps owner and model but not agent and room: the agent and room variables do not
// narrow its panels.
var initiatorWhere = is("org_id", varOrg) + `
	  AND ` + is("owner_id", varOwner) + `
	  AND ` + is("model", varModel) + `
	  AND hour >= toStartOfHour(` + fromTime + `, 'UTC') AND hour <= ` + toTime + `
	  AND events > 0`

// tokensSum is what a budget counts as tokens (policy/replica): every kind but reasoning,
// which providers already count in output.
const tokensSum = "input_tokens + output_tokens + cache_read_tokens + cache_write_tokens"

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

	// Cache savings: what the cache reads would have cost as ordinary input, less what
	// they cost, at the prices of the newest catalog version in bandplane.prices (for each
	// model and effective time the row of the highest catalog_version, set_at, set_id, as
	// ingest/prices folds them), the entry in effect at each hour, matched by the model's
	// name or one of its aliases, ignoring case (schema/pricing). A missing cache_read
	// price is stored as the input price (pricing bills it so), which saves nothing.
	cacheSavingsByModelSQL = sql(`
	SELECT model, cache_read_tokens, toFloat64(saved_exact) AS saved, currency
	FROM (
	  SELECT any(model_name) AS model, sum(cache_read) AS cache_read_tokens,
	    sum(toDecimal128(cache_read, 0) * per_mtok / 1000000) AS saved_exact, any(price_currency) AS currency
	  FROM (
	    SELECT hour, model_key, model_name, cache_read,
	      argMax(in_price - cache_price, effective) AS per_mtok, any(currency_code) AS price_currency
	    FROM (
	      SELECT hour, lower(model) AS model_key, any(model) AS model_name, sum(cache_read_tokens) AS cache_read
	      FROM bandplane.usage_hourly FINAL
	      WHERE ` + usageWhere + ` AND cache_read_tokens > 0
	      GROUP BY hour, model_key
	    ) AS u
	    ALL INNER JOIN (
	      SELECT lower(price_name) AS model_key, effective, in_price, cache_price, currency_code
	      FROM (
	        SELECT model AS base_model, effective,
	          argMax(input_per_mtok, (catalog_version, set_at, set_id)) AS in_price,
	          argMax(cache_read_per_mtok, (catalog_version, set_at, set_id)) AS cache_price,
	          argMax(aliases, (catalog_version, set_at, set_id)) AS names,
	          argMax(currency, (catalog_version, set_at, set_id)) AS currency_code
	        FROM bandplane.prices FINAL
	        GROUP BY model, effective
	      ) AS p
	      ARRAY JOIN arrayPushFront(names, base_model) AS price_name
	    ) AS pr USING (model_key)
	    WHERE effective <= hour
	    GROUP BY hour, model_key, model_name, cache_read
	  ) AS s
	  GROUP BY model_key
	) AS m
	ORDER BY saved DESC, model`)

	cacheSavingsTotalSQL = sql(`
	SELECT currency, sum(saved) AS cache_savings
	FROM (` + cacheSavingsByModelSQL + `) AS by_model
	GROUP BY currency
	ORDER BY currency`)

	tokensOverTimeSQL = sql(`
	SELECT ` + bucket("hour") + ` AS time,
	  sum(input_tokens) AS input,
	  sum(output_tokens) AS output,
	  sum(cache_read_tokens) AS cache_read,
	  sum(cache_write_tokens) AS cache_write,
	  sum(reasoning_tokens) AS reasoning
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere + `
	GROUP BY time
	ORDER BY time`)

	tokensByModelOverTimeSQL = sql(`
	SELECT ` + bucket("hour") + ` AS time, model, sum(` + tokensSum + `) AS tokens
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere + `
	GROUP BY time, model
	ORDER BY time, model`)

	spendByModelSQL = sql(`
	SELECT ` + bucket("hour") + ` AS time, model, currency, toFloat64(sum(cost)) AS spend
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere + `
	GROUP BY time, model, currency
	ORDER BY time, model, currency`)

	spendByOrgSQL   = spendOverTime("org_id", orgLookup, "org_name", "organization")
	spendByOwnerSQL = spendOverTime("owner_id", ownerLookup, "owner_name", "owner")
	spendByAgentSQL = spendOverTime("agent_id", agentLookup, "agent_name", "agent")
	spendByRoomSQL  = spendOverTime("room_id", roomLookup, "room_name", "room")

	topSpendersSQL = sql(`
	SELECT agent, owner, ` + nameOr("org_name", "org_id") + ` AS organization, model, usage_events AS events,
	  input_total AS input_tokens, output_total AS output_tokens, cache_read_total AS cache_read_tokens,
	  cost_total AS cost, currency, agent_id, org_id
	FROM (
	  SELECT agent, ` + nameOr("owner_name", "owner_id") + ` AS owner, org_id, model, usage_events, input_total,
	    output_total, cache_read_total, cost_total, currency, agent_id
	  FROM (
	    SELECT ` + nameOr("agent_name", "agent_id") + ` AS agent, owner_id, org_id, model, usage_events, input_total,
	      output_total, cache_read_total, cost_total, currency, agent_id
	    FROM (
	      SELECT agent_id, owner_id, org_id, model, currency,
	        sum(events) AS usage_events,
	        sum(input_tokens) AS input_total,
	        sum(output_tokens) AS output_total,
	        sum(cache_read_tokens) AS cache_read_total,
	        toFloat64(sum(cost)) AS cost_total
	      FROM bandplane.usage_hourly FINAL
	      WHERE ` + usageWhere + `
	      GROUP BY agent_id, owner_id, org_id, model, currency
	    ) AS u
	    ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	  ) AS ua
	  ANY LEFT JOIN ` + ownerLookup + ` USING (owner_id)
	) AS uo
	ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	ORDER BY cost DESC, agent, model
	LIMIT 100`)

	costByOwnerSQL = topBy("owner_id", ownerLookup, "owner_name", "owner", 20)
	// Who set the spend going (schema/cause): the person, the system or the agent
	// acting on its own at the root of the chain of mentions.
	costByInitiatorSQL = sql(`
	SELECT ` + nameOr("initiator_name", "initiator_id") + ` AS initiator, cost_total AS cost
	FROM (
	  SELECT initiator_id, toFloat64(sum(cost)) AS cost_total
	  FROM bandplane.initiator_hourly FINAL
	  WHERE ` + initiatorWhere + `
	  GROUP BY initiator_id
	) AS s
	ANY LEFT JOIN ` + anyNameLookup("initiator_id", "initiator_name", "initiator_names") + ` USING (initiator_id)
	ORDER BY cost DESC, initiator
	LIMIT 20`)
	spendByDepthSQL = sql(`
	SELECT ` + bucket("hour") + ` AS time, toString(chain_depth) AS depth, currency, toFloat64(sum(cost)) AS spend
	FROM bandplane.initiator_hourly FINAL
	WHERE ` + initiatorWhere + `
	GROUP BY time, chain_depth, currency
	ORDER BY time, depth, currency`)

	// crossOwnerSQL is the spend one owner's requests caused on another owner's agents:
	// the agents' owner and the initiator's accountable person differ (a system
	// initiator has none).
	crossOwnerSQL = sql(`
	SELECT ` + nameOr("owner_name", "owner_id") + ` AS agents_owner, caused_by, cost_total AS cost, usage_events AS events, currency
	FROM (
	  SELECT owner_id, ` + nameOr("initiator_owner_name", "initiator_owner") + ` AS caused_by, cost_total, usage_events, currency
	  FROM (
	    SELECT owner_id, initiator_owner, currency, toFloat64(sum(cost)) AS cost_total, sum(events) AS usage_events
	    FROM bandplane.initiator_hourly FINAL
	    WHERE ` + initiatorWhere + ` AND owner_id != initiator_owner AND initiator_owner != ''
	    GROUP BY owner_id, initiator_owner, currency
	  ) AS c
	  ANY LEFT JOIN ` + anyNameLookup("initiator_owner", "initiator_owner_name", "initiator_owner_names") + ` USING (initiator_owner)
	) AS ci
	ANY LEFT JOIN ` + ownerLookup + ` USING (owner_id)
	ORDER BY cost DESC, agents_owner, caused_by
	LIMIT 100`)
	costByRoomSQL = topBy("room_id", roomLookup, "room_name", "room", 20)

	unpricedByModelSQL = sql(`
	SELECT model, sum(unpriced_events) AS unpriced_reports,
	  sum(unpriced_input_tokens) AS unpriced_input,
	  sum(unpriced_output_tokens) AS unpriced_output,
	  sum(unpriced_cache_read_tokens + unpriced_cache_write_tokens) AS unpriced_cache,
	  max(hour) AS last_hour
	FROM bandplane.usage_hourly FINAL
	WHERE ` + usageWhere + ` AND unpriced_events > 0
	GROUP BY model
	ORDER BY unpriced_reports DESC, model`)
)

// spendOverTime is the spend per interval and per key (an id column, or org_id, room_id
// for rooms), named through lookup.
func spendOverTime(key, lookup, nameCol, label string) string {
	id := lastColumn(key)
	return sql(`
	SELECT t AS time, ` + nameOr(nameCol, id) + ` AS ` + label + `, currency, spend
	FROM (
	  SELECT ` + bucket("hour") + ` AS t, ` + key + `, currency, toFloat64(sum(cost)) AS spend
	  FROM bandplane.usage_hourly FINAL
	  WHERE ` + usageWhere + `
	  GROUP BY t, ` + key + `, currency
	) AS s
	ANY LEFT JOIN ` + lookup + ` USING (` + key + `)
	ORDER BY time, ` + label + `, currency`)
}

// topBy is the spend of the n keys that spent most in the range.
func topBy(key, lookup, nameCol, label string, n int) string {
	id := lastColumn(key)
	return sql(`
	SELECT ` + nameOr(nameCol, id) + ` AS ` + label + `, cost_total AS cost
	FROM (
	  SELECT ` + key + `, toFloat64(sum(cost)) AS cost_total
	  FROM bandplane.usage_hourly FINAL
	  WHERE ` + usageWhere + `
	  GROUP BY ` + key + `
	) AS s
	ANY LEFT JOIN ` + lookup + ` USING (` + key + `)
	ORDER BY cost DESC, ` + label + `
	LIMIT ` + itoa(n))
}

// Budgets. A budget is the latest budget.set of its id (bandplane.budgets FINAL, deleted
// ones left out); its data is the policy.Budget JSON, read with visitParam* (no
// JSONExtract on 18.16; keys are matched whole, "scope" never matches "scope_id"). The
// spend is the policy's: tokens of every kind but reasoning, and cost, of the usage in the
// budget's scope (organization, owner, agent or room). Reservations of decisions in
// flight live in the policy process, not in ClickHouse, so "spent" here is settled usage
// only (the policy's budget.crossed events count reservations too).
var budgetFields = `org_id, budget_id,
	    visitParamExtractString(data, 'scope') AS scope,
	    visitParamExtractString(data, 'scope_id') AS scope_id,
	    visitParamExtractString(data, 'period') AS period,
	    visitParamExtractBool(data, 'hard') AS hard,
	    visitParamExtractInt(data, 'tokens') AS limit_tokens,
	    visitParamExtractInt(data, 'cost_micros') AS limit_micros`

// inScope says whether a usage row (owner_id, agent_id, room_id) counts for a budget.
const inScope = `multiIf(scope = 'org', 1, scope = 'owner', owner_id = scope_id,
	      scope = 'agent', agent_id = scope_id, scope = 'room', room_id = scope_id, 0)`

// usedPct is the larger of the two limits' shares, in percent (a limit of 0 is none).
const usedPct = `100 * greatest(if(limit_tokens > 0, spent_tokens / limit_tokens, 0),
	    if(limit_micros > 0, spent_cost * 1000000 / limit_micros, 0))`

var (
	budgetsSQL = sql(`
	SELECT budget_of, scope, period, mode, limit_tokens, limit_cost, spent_tokens, spent_cost, used_pct, remaining_cost,
	  budget_id, scope_id
	FROM ` + budgetStatus(is("org_id", varOrg)) + `
	ORDER BY used_pct DESC, budget_of, period`)

	// The burn-down: for every budget and hour of the range with spend in its scope, the
	// share of the limit used since the start of that hour's period (day or month),
	// accumulated without window functions (18.16): the period's hours sorted into an
	// array, arrayCumSum, ARRAY JOIN back. Usage is read from the start of the month of
	// the range's start, so a period that began before the range counts whole.
	budgetBurnDownSQL = sql(`
	SELECT t AS time, concat(` + nameOr("scope_name", "scope_id") + `, ' (', period, if(hard, ', hard', ', soft'), ')') AS budget, used_pct
	FROM (
	  SELECT scope_id, period, hard, t, ` + usedPct + ` AS used_pct
	  FROM (
	    SELECT scope_id, period, hard, limit_tokens, limit_micros,
	      arraySort(groupArray((hour, hour_tokens, hour_cost))) AS points,
	      arrayMap(x -> x.1, points) AS hours,
	      arrayCumSum(arrayMap(x -> x.2, points)) AS cum_tokens,
	      arrayCumSum(arrayMap(x -> x.3, points)) AS cum_cost
	    FROM (
	      SELECT budget_id, scope_id, period, hard, limit_tokens, limit_micros, hour,
	        if(period = 'month', toDateTime(toStartOfMonth(hour, 'UTC'), 'UTC'), toStartOfDay(hour, 'UTC')) AS period_start,
	        sum(tokens) AS hour_tokens, toFloat64(sum(cost)) AS hour_cost
	      FROM (
	        SELECT ` + budgetFields + `
	        FROM bandplane.budgets FINAL
	        WHERE deleted = 0 AND ` + is("org_id", varOrg) + `
	      ) AS b
	      ALL INNER JOIN (
	        SELECT org_id, owner_id, agent_id, room_id, hour, sum(` + tokensSum + `) AS tokens, sum(cost) AS cost
	        FROM bandplane.usage_hourly FINAL
	        WHERE ` + is("org_id", varOrg) + `
	          AND hour >= toDateTime(toStartOfMonth(` + fromTime + `, 'UTC'), 'UTC') AND hour <= ` + toTime + ` AND events > 0
	        GROUP BY org_id, owner_id, agent_id, room_id, hour
	      ) AS u USING (org_id)
	      WHERE ` + inScope + `
	      GROUP BY budget_id, scope_id, period, hard, limit_tokens, limit_micros, hour, period_start
	    ) AS h
	    GROUP BY budget_id, scope_id, period, hard, limit_tokens, limit_micros, period_start
	  ) AS p
	  ARRAY JOIN hours AS t, cum_tokens AS spent_tokens, cum_cost AS spent_cost
	  WHERE t >= toStartOfHour(` + fromTime + `, 'UTC')
	) AS d
	ANY LEFT JOIN ` + scopeLookup + ` USING (scope_id)
	ORDER BY time, budget`)
)

// budgetStatus is one row per budget in force that orgFilter (a test of org_id) selects,
// with its current period's settled spend.
func budgetStatus(orgFilter string) string {
	return `(
	  SELECT org_id, ` + nameOr("scope_name", "scope_id") + ` AS budget_of, scope, period, if(hard, 'hard', 'soft') AS mode, hard,
	    limit_tokens, toFloat64(limit_micros) / 1000000 AS limit_cost, spent_tokens, toFloat64(spent_exact) AS spent_cost,
	    ` + usedPct + ` AS used_pct,
	    if(limit_micros > 0, toFloat64(limit_micros) / 1000000 - spent_cost, 0) AS remaining_cost,
	    budget_id, scope_id
	  FROM (
	    SELECT org_id, budget_id, scope, scope_id, period, hard, limit_tokens, limit_micros,
	      sumIf(tokens, hour >= period_start AND ` + inScope + `) AS spent_tokens,
	      sumIf(cost, hour >= period_start AND ` + inScope + `) AS spent_exact
	    FROM (
	      SELECT ` + budgetFields + `,
	        if(period = 'month', toDateTime(toStartOfMonth(now(), 'UTC'), 'UTC'), toStartOfDay(now(), 'UTC')) AS period_start
	      FROM bandplane.budgets FINAL
	      WHERE deleted = 0 AND ` + orgFilter + `
	    ) AS b
	    ALL LEFT JOIN (
	      SELECT org_id, owner_id, agent_id, room_id, hour, sum(` + tokensSum + `) AS tokens, sum(cost) AS cost
	      FROM bandplane.usage_hourly FINAL
	      WHERE ` + orgFilter + ` AND hour >= toDateTime(toStartOfMonth(now(), 'UTC'), 'UTC') AND events > 0
	      GROUP BY org_id, owner_id, agent_id, room_id, hour
	    ) AS u USING (org_id)
	    GROUP BY org_id, budget_id, scope, scope_id, period, hard, limit_tokens, limit_micros
	  ) AS spend
	  ANY LEFT JOIN ` + scopeLookup + ` USING (scope_id)
	) AS budget_status`
}

// CostAttribution is "bandplane — Cost & attribution": what the organizations spend on
// models, on which owners, agents, models and rooms, what the cache saved, how budgets
// burn down, and how much usage could not be priced.
func CostAttribution() *dashboard.DashboardBuilder {
	one, eighty, hundred := 1.0, 80.0, 100.0
	g := &grid{}
	d := newDashboard("bandplane — Cost & attribution", CostUID,
		"Model spend by organization, owner, agent, model and room, from the hourly usage rollup (bandplane.usage_hourly), the price catalog (bandplane.prices) and the budgets (bandplane.budgets).",
		[]string{"cost"}, "now-7d").
		WithVariable(orgVariable()).
		WithVariable(ownerVariable()).
		WithVariable(agentVariable(true)).
		WithVariable(modelVariable()).
		WithVariable(roomVariable())

	d = d.WithPanel(statPanel(g, 6, 5, "Total cost",
		"Priced usage in the range, per catalog currency. The rollup is hourly: the range is widened to the hour that holds its start.",
		costTotalSQL, costUnit).Decimals(2))
	d = d.WithPanel(statPanel(g, 8, 5, "Tokens by kind",
		"Tokens reported in the range. Reasoning tokens are also counted in output by every provider of the default catalog.",
		tokensByKindSQL, tokensUnit))
	d = d.WithPanel(statPanel(g, 5, 5, "Cache savings",
		"What the cache reads in the range would have cost as ordinary input tokens, less what they cost, at the newest catalog's prices (model by model, the price in effect at each hour).",
		cacheSavingsTotalSQL, costUnit).Decimals(2).ColorMode(common.BigValueColorModeValue))
	d = d.WithPanel(statPanel(g, 5, 5, "Unpriced usage events",
		"Usage reports whose model has no price in the catalog: their cost counts as 0 until `bandplane reprice` runs with a catalog that prices them (see the table below).",
		unpricedSQL, "short").
		Thresholds(thresholds(step("green", nil), step("red", &one))).
		ColorMode(common.BigValueColorModeBackground))

	d = d.WithRow(g.row("Spend and tokens over time"))
	legend := func(label string) string { return "${__field.labels." + label + "} ${__field.labels.currency}" }
	d = d.WithPanel(timeSeriesPanel(g, 12, 9, "Spend by organization", "Priced usage per interval and organization (an organization is named by its people).",
		spendByOrgSQL, costUnit, legend("organization"), "1h", true))
	d = d.WithPanel(timeSeriesPanel(g, 12, 9, "Spend by model", "Priced usage per interval and model.",
		spendByModelSQL, costUnit, legend("model"), "1h", true))
	d = d.WithPanel(timeSeriesPanel(g, 8, 9, "Spend by owner", "Priced usage per interval and owner of the agents.",
		spendByOwnerSQL, costUnit, legend("owner"), "1h", true))
	d = d.WithPanel(timeSeriesPanel(g, 8, 9, "Spend by agent", "Priced usage per interval and agent.",
		spendByAgentSQL, costUnit, legend("agent"), "1h", true))
	d = d.WithPanel(timeSeriesPanel(g, 8, 9, "Spend by room", "Priced usage per interval and room.",
		spendByRoomSQL, costUnit, legend("room"), "1h", true))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Tokens by kind over time", "Tokens per interval, by kind.",
		tokensOverTimeSQL, tokensUnit, "", "1h", true))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Tokens by model over time", "Input, output and cache tokens (what budgets count) per interval and model.",
		tokensByModelOverTimeSQL, tokensUnit, "${__field.labels.model}", "1h", true))

	d = d.WithRow(g.row("Attribution"))
	d = d.WithPanel(tablePanel(g, 24, 10, "Top spenders",
		"The 100 agent × model pairs that spent most in the range, with their owner and organization; click an agent for its activity.",
		topSpendersSQL).
		SortBy([]cog.Builder[common.TableSortByFieldState]{common.NewTableSortByFieldStateBuilder().DisplayName("cost").Desc(true)}).
		OverrideByName("cost", []dashboard.DynamicConfigValue{{Id: "unit", Value: costUnit}, {Id: "decimals", Value: 4}}).
		OverrideByName("input_tokens", unitOf(tokensUnit)).
		OverrideByName("output_tokens", unitOf(tokensUnit)).
		OverrideByName("cache_read_tokens", unitOf(tokensUnit)).
		OverrideByName("agent", cellLink("Activity of ${__data.fields.agent}", agentLink("agent_id"))).
		OverrideByName("organization", cellLink("Cost of ${__data.fields.organization}", orgLink("org_id"))).
		OverrideByName("agent_id", hidden()).
		OverrideByName("org_id", hidden()))
	d = d.WithPanel(barPanel(g, 12, 9, "Cost by owner", "The 20 owners whose agents spent most in the range.",
		costByOwnerSQL, "owner", costUnit))
	d = d.WithPanel(barPanel(g, 12, 9, "Cost by room", "The 20 rooms where agents spent most in the range.",
		costByRoomSQL, "room", costUnit))
	d = d.WithRow(g.row("Who caused the spend"))
	d = d.WithPanel(barPanel(g, 8, 9, "Cost by initiator",
		"The 20 initiators whose requests set the most spend going, across every agent their @mentions reached: a person, a system such as schedule, or an agent that acted without being mentioned. From the initiator rollup: the agent and room variables do not narrow it.",
		costByInitiatorSQL, "initiator", costUnit))
	d = d.WithPanel(tablePanel(g, 16, 9, "Spend caused by other owners",
		"Spend on one owner's agents that another owner's requests set going (through approved contacts or shared rooms): agents_owner paid for what caused_by asked.",
		crossOwnerSQL).
		OverrideByName("cost", []dashboard.DynamicConfigValue{{Id: "unit", Value: costUnit}, {Id: "decimals", Value: 4}}))
	d = d.WithPanel(timeSeriesPanel(g, 24, 8, "Spend by chain depth",
		"Priced usage per interval by how many hand-overs it is from its initiator: 0 its own, 1 an agent it mentioned, 2 an agent that agent mentioned, and so on. Spend at great depths points to runaway delegation.",
		spendByDepthSQL, costUnit, legend("depth"), "1h", true))

	d = d.WithRow(g.row("Cache and unpriced usage"))
	d = d.WithPanel(tablePanel(g, 12, 8, "Cache savings by model",
		"Per model: cache-read tokens in the range and what they saved against the input price (newest catalog).",
		cacheSavingsByModelSQL).
		OverrideByName("saved", []dashboard.DynamicConfigValue{{Id: "unit", Value: costUnit}, {Id: "decimals", Value: 4}}).
		OverrideByName("cache_read_tokens", unitOf(tokensUnit)))
	d = d.WithPanel(tablePanel(g, 12, 8, "Unpriced usage by model",
		"Models without a price in the catalog, with their usage in the range: set a price (`bandplane prices set`), then `bandplane reprice`.",
		unpricedByModelSQL).
		OverrideByName("unpriced_input", unitOf(tokensUnit)).
		OverrideByName("unpriced_output", unitOf(tokensUnit)).
		OverrideByName("unpriced_cache", unitOf(tokensUnit)))

	d = d.WithRow(g.row("Budgets"))
	d = d.WithPanel(tablePanel(g, 24, 8, "Budgets",
		"Budgets in force and their current period (UTC day or month) so far: settled spend only (reservations of decisions in flight are held by the policy process). Hard budgets deny at 100 %; the alert rule fires at 80 %.",
		budgetsSQL).
		OverrideByName("used_pct", []dashboard.DynamicConfigValue{
			{Id: "unit", Value: "percent"},
			{Id: "decimals", Value: 1},
			{Id: "thresholds", Value: thresholdsValue(step("green", nil), step("orange", &eighty), step("red", &hundred))},
			{Id: "custom.cellOptions", Value: map[string]any{"type": "color-background"}},
		}).
		OverrideByName("limit_cost", unitOf(costUnit)).
		OverrideByName("spent_cost", unitOf(costUnit)).
		OverrideByName("remaining_cost", unitOf(costUnit)).
		OverrideByName("limit_tokens", unitOf(tokensUnit)).
		OverrideByName("spent_tokens", unitOf(tokensUnit)).
		OverrideByName("budget_id", hidden()).
		OverrideByName("scope_id", hidden()))
	d = d.WithPanel(timeSeriesPanel(g, 24, 9, "Budget burn-down",
		"Share of each budget's limit used since the start of its period (it starts again at 0 each UTC day or month), at every hour with spend in its scope; 100 % is the limit.",
		budgetBurnDownSQL, "percent", "${__field.labels.budget}", "1h", false).
		Thresholds(thresholds(step("green", nil), step("orange", &eighty), step("red", &hundred))).
		ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeLine)))
	return d
}

// thresholdsValue is a thresholds config as an override value.
func thresholdsValue(steps ...dashboard.Threshold) dashboard.ThresholdsConfig {
	return dashboard.ThresholdsConfig{Mode: dashboard.ThresholdsModeAbsolute, Steps: steps}
}
