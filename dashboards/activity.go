package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Fields of a policy.decided event's data (policy/api.DecidedData), read with
// visitParam*: each finds the first occurrence of its key, and "decision", "allow" and
// the first reason's "code" come before the nested input (see query/chatty.go).
const (
	decisionName     = "visitParamExtractString(data, 'decision')"
	decisionAllowed  = "visitParamExtractBool(data, 'allow')"
	decisionCode     = "visitParamExtractString(data, 'code')"
	decisionRevision = "visitParamExtractString(data, 'policy_revision')"
)

// throttled is a send_message decision denied for the message rate or a budget: the
// codes the policy engine adds when it enforces a quota (query/chatty.go throttleCodes).
const throttled = decisionName + " = 'send_message' AND " + decisionAllowed + " = 0 AND " +
	decisionCode + " IN ('rate_limited', 'budget_exceeded')"

// mentionIDs are the ids a message's data @mentions (schema.MessageData.mentions). No
// JSONExtract on 18.16: the mentions array is cut out with a regular expression that
// skips JSON strings whole (a handle may hold brackets or quotes), split into its flat
// objects, and each object's "id" read with visitParamExtractString, which undoes JSON's
// escapes (an id may hold \ or ").
const mentionIDs = `arrayMap(o -> visitParamExtractString(o, 'id'),
	      extractAll(extract(data, '"mentions":\\[((?:[^\\[\\]"]|"(?:[^"\\\\]|\\\\.)*")*)\\]'),
	        '\\{(?:[^{}"]|"(?:[^"\\\\]|\\\\.)*")*\\}'))`

// agentEventsWhere selects events of the chosen organization, owner, agent (the actor)
// and room in the range.
var agentEventsWhere = is("org_id", varOrg) + `
	  AND ` + ownedBy("actor_id") + `
	  AND ` + is("actor_id", varAgent) + `
	  AND ` + is("room_id", varRoom) + `
	  AND ` + timeFilter("time")

var (
	messagesOverTimeSQL = sql(`
	SELECT t AS time, ` + nameOr("agent_name", "agent_id") + ` AS agent, messages
	FROM (
	  SELECT ` + bucket("time") + ` AS t, actor_id AS agent_id, count() AS messages
	  FROM bandplane.events FINAL
	  WHERE type = 'message.created' AND actor_type = 'agent' AND ` + agentEventsWhere + `
	  GROUP BY t, agent_id
	) AS m
	ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	ORDER BY time, agent`)

	// One row per agent: each measure from its own table, stacked with UNION ALL and
	// summed (one JOIN per SELECT), then named; only the agents of the directory are kept
	// (is_agent), which leaves out the people a message mentions.
	agentSummarySQL = sql(`
	SELECT ` + nameOr("owner_name", "owner_id") + ` AS owner, agent, messages, mentions_sent, mentions_received,
	  tool_calls, tool_errors, if(tool_calls = 0, 0, 100 * tool_errors / tool_calls) AS tool_error_pct,
	  throttled, denied, agent_id
	FROM (
	  SELECT ` + nameOr("agent_name", "agent_id") + ` AS agent, agent_owner AS owner_id, messages, mentions_sent,
	    mentions_received, tool_calls, tool_errors, throttled, denied, agent_id, is_agent
	  FROM (
	    SELECT agent_id, sum(m) AS messages, sum(ms) AS mentions_sent, sum(mr) AS mentions_received,
	      sum(tc) AS tool_calls, sum(te) AS tool_errors, sum(th) AS throttled, sum(dn) AS denied
	    FROM (
	      SELECT actor_id AS agent_id, count() AS m, sum(length(` + mentionIDs + `)) AS ms,
	        toUInt64(0) AS mr, toUInt64(0) AS tc, toUInt64(0) AS te, toUInt64(0) AS th, toUInt64(0) AS dn
	      FROM bandplane.events FINAL
	      WHERE type = 'message.created' AND actor_type = 'agent' AND ` + agentEventsWhere + `
	      GROUP BY agent_id
	      UNION ALL
	      SELECT mentioned AS agent_id, toUInt64(0) AS m, toUInt64(0) AS ms, count() AS mr,
	        toUInt64(0) AS tc, toUInt64(0) AS te, toUInt64(0) AS th, toUInt64(0) AS dn
	      FROM (
	        SELECT ` + mentionIDs + ` AS mentioned_ids
	        FROM bandplane.events FINAL
	        WHERE type = 'message.created' AND ` + is("org_id", varOrg) + ` AND ` + is("room_id", varRoom) + `
	          AND ` + timeFilter("time") + `
	      ) AS msg
	      ARRAY JOIN mentioned_ids AS mentioned
	      WHERE ` + is("mentioned", varAgent) + ` AND ` + ownedBy("mentioned") + `
	      GROUP BY agent_id
	      UNION ALL
	      SELECT agent_id, toUInt64(0) AS m, toUInt64(0) AS ms, toUInt64(0) AS mr,
	        countIf(kind = 'call') AS tc, countIf(kind = 'result' AND is_error = 1) AS te, toUInt64(0) AS th, toUInt64(0) AS dn
	      FROM bandplane.tool_calls FINAL
	      WHERE ` + is("org_id", varOrg) + ` AND ` + ownedBy("agent_id") + ` AND ` + is("agent_id", varAgent) + `
	        AND ` + is("room_id", varRoom) + ` AND ` + timeFilter("time") + `
	      GROUP BY agent_id
	      UNION ALL
	      SELECT actor_id AS agent_id, toUInt64(0) AS m, toUInt64(0) AS ms, toUInt64(0) AS mr, toUInt64(0) AS tc,
	        toUInt64(0) AS te, countIf(` + throttled + `) AS th, countIf(` + decisionAllowed + ` = 0) AS dn
	      FROM bandplane.events FINAL
	      WHERE type = 'policy.decided' AND ` + agentEventsWhere + `
	      GROUP BY agent_id
	    ) AS measures
	    GROUP BY agent_id
	  ) AS per_agent
	  ANY LEFT JOIN (SELECT id AS agent_id, if(handle = '', '', concat('@', handle)) AS agent_name, owner_id AS agent_owner,
	    toUInt8(1) AS is_agent
	    FROM bandplane.directory FINAL WHERE kind = 'agent') AS agents USING (agent_id)
	  WHERE is_agent = 1
	) AS named
	ANY LEFT JOIN ` + ownerLookup + ` USING (owner_id)
	ORDER BY messages DESC, agent
	LIMIT 200`)

	// Chattiness is read from the audit trail, not the usage rollup: every message an
	// agent posts counts, priced or not.
	chattiestAgentsSQL = sql(`
	SELECT ` + nameOr("agent_name", "agent_id") + ` AS agent, messages, events_total AS events
	FROM (
	  SELECT actor_id AS agent_id,
	    countIf(type = 'message.created') AS messages,
	    count() AS events_total
	  FROM bandplane.events FINAL
	  WHERE actor_type = 'agent' AND ` + agentEventsWhere + `
	  GROUP BY agent_id
	) AS c
	ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	ORDER BY messages DESC, events DESC, agent
	LIMIT 15`)

	toolCallsOverTimeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, countIf(kind = 'call') AS calls, countIf(kind = 'result' AND is_error = 1) AS errors
	FROM bandplane.tool_calls FINAL
	WHERE ` + is("org_id", varOrg) + ` AND ` + ownedBy("agent_id") + ` AND ` + is("agent_id", varAgent) + `
	  AND ` + is("room_id", varRoom) + ` AND ` + timeFilter("time") + `
	GROUP BY bucket
	ORDER BY bucket`)

	throttlesOverTimeSQL = sql(`
	SELECT t AS time, ` + nameOr("agent_name", "agent_id") + ` AS agent, reason, decisions
	FROM (
	  SELECT ` + bucket("time") + ` AS t, actor_id AS agent_id, ` + decisionCode + ` AS reason, count() AS decisions
	  FROM bandplane.events FINAL
	  WHERE type = 'policy.decided' AND ` + throttled + ` AND ` + agentEventsWhere + `
	  GROUP BY t, agent_id, reason
	) AS d
	ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	ORDER BY time, agent, reason`)

	// An operator's action has the agent as subject and the operator's key as actor
	// (policy/api); its data's reason is the operator's.
	suspensionsSQL = sql(`
	SELECT at, ` + nameOr("agent_name", "agent_id") + ` AS agent, action, reason, operator, agent_id
	FROM (
	  SELECT time AS at, subject_id AS agent_id, if(type = 'agent.suspended', 'suspended', 'resumed') AS action,
	    visitParamExtractString(data, 'reason') AS reason, actor_id AS operator
	  FROM bandplane.events FINAL
	  WHERE type IN ('agent.suspended', 'agent.resumed') AND ` + is("org_id", varOrg) + `
	    AND ` + ownedBy("subject_id") + ` AND ` + is("subject_id", varAgent) + ` AND ` + timeFilter("time") + `
	) AS s
	ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	ORDER BY at DESC, agent
	LIMIT 200`)

	agentRoomsSQL = sql(`
	SELECT ` + nameOr("room_name", "room_id") + ` AS room, agents, messages, events_total AS events, last_activity, room_id
	FROM (
	  SELECT org_id, room_id, uniqExact(actor_id) AS agents, countIf(type = 'message.created') AS messages,
	    count() AS events_total, max(time) AS last_activity
	  FROM bandplane.events FINAL
	  WHERE actor_type = 'agent' AND room_id != '' AND ` + agentEventsWhere + `
	  GROUP BY org_id, room_id
	) AS r
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY events DESC, room
	LIMIT 100`)
)

// AgentActivity is "bandplane — Agent activity": what each agent does (messages,
// mentions, tool calls and their errors), which agents talk most, and which the policy
// throttles or an operator suspends.
func AgentActivity() *dashboard.DashboardBuilder {
	g := &grid{}
	d := newDashboard("bandplane — Agent activity", ActivityUID,
		"Messages, mentions, tool calls, throttles and suspensions per agent, from the audit trail (bandplane.events) and the tool calls (bandplane.tool_calls).",
		[]string{"agents"}, "now-24h").
		WithVariable(orgVariable()).
		WithVariable(ownerVariable()).
		WithVariable(agentVariable(true)).
		WithVariable(roomVariable())

	d = d.WithPanel(timeSeriesPanel(g, 16, 9, "Messages per agent", "message.created events per interval and agent.",
		messagesOverTimeSQL, "short", "${__field.labels.agent}", "1m", true))
	d = d.WithPanel(barPanel(g, 8, 9, "Chattiest agents",
		"Agents with the most messages in the range, with all their audit events; from the audit trail, so unpriced activity counts too.",
		chattiestAgentsSQL, "agent", "short"))
	d = d.WithPanel(tablePanel(g, 24, 10, "Activity per agent",
		"Per agent: messages posted, @mentions in them, @mentions of it, tool calls and failed results, and send_message decisions throttled (rate or budget) or denied. Click an agent to focus the dashboard on it.",
		agentSummarySQL).
		SortBy([]cog.Builder[common.TableSortByFieldState]{common.NewTableSortByFieldStateBuilder().DisplayName("messages").Desc(true)}).
		OverrideByName("tool_error_pct", []dashboard.DynamicConfigValue{{Id: "unit", Value: "percent"}, {Id: "decimals", Value: 1}}).
		OverrideByName("agent", cellLink("Activity of ${__data.fields.agent}", agentLink("agent_id"))).
		OverrideByName("agent_id", hidden()))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Tool calls and errors", "Tool calls and failed tool results per interval (bandplane.tool_calls).",
		toolCallsOverTimeSQL, "short", "", "1m", false))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Throttles", "send_message decisions denied for the message rate (rate_limited) or a budget (budget_exceeded), per interval and agent.",
		throttlesOverTimeSQL, "short", "${__field.labels.agent} ${__field.labels.reason}", "1m", true))
	d = d.WithPanel(tablePanel(g, 12, 8, "Suspensions", "Operators' suspensions and resumes in the range (agent.suspended, agent.resumed), newest first.",
		suspensionsSQL).
		OverrideByName("agent", cellLink("Activity of ${__data.fields.agent}", agentLink("agent_id"))).
		OverrideByName("agent_id", hidden()))
	d = d.WithPanel(tablePanel(g, 12, 8, "Rooms", "Rooms the selected agents acted in; click a room for its work status.",
		agentRoomsSQL).
		OverrideByName("room", cellLink("Work in ${__data.fields.room}", roomLink("room_id"))).
		OverrideByName("room_id", hidden()))
	return d
}
