# Package bandplane.send_message decides whether an agent may post in a room and which
# quota applies; the Go limiter enforces the rates and daily budgets of that quota.
#
# input: {"agent": id, "room": id, "tokens"?: n, "cost_micros"?: n}
# output: allow, reasons, agent, owner, org, quota (data.quotas.defaults overlaid with
# data.quotas.orgs[org], then data.quotas.agents[agent]; 0 means unlimited).
#
# It runs on every message, so like add_participant it decides from input.facts, which
# the engine adds from the directory (see policy/README.md): the agent's record (kind
# "unknown" unless the id is a known agent) and in_room; it tests them for equality
# rather than negate them.
package bandplane.send_message

import data.bandplane.lib
import input.facts

agent_id := input.agent

room := input.room

valid if {
	is_string(agent_id)
	agent_id != ""
	is_string(room)
	room != ""
}

record := facts.agent

quota := object.union_n([
	data.quotas.defaults,
	object.get(data.quotas.orgs, record.org, {}),
	object.get(data.quotas.agents, agent_id, {}),
])

deny(code, message) := {"allow": false, "reasons": [lib.reason(code, message)]}

# The first failed check decides.
decision := deny("invalid_input", "input.agent and input.room must be non-empty strings") if {
	not valid
} else := deny("unknown_agent", sprintf("unknown agent %s", [agent_id])) if {
	record.kind == "unknown"
} else := deny("suspended", sprintf("agent %s is suspended", [agent_id])) if {
	record.suspended == true
} else := deny("not_participant", sprintf("%s is not in room %s", [agent_id, room])) if {
	facts.in_room == false
} else := {
	"allow": true,
	"reasons": [],
	"agent": agent_id,
	"owner": record.owner,
	"org": record.org,
	"quota": quota,
}
