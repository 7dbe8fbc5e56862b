# Package bandplane.send_message decides whether an agent may post in a room and which
# quota applies; the Go limiter enforces the rates and daily budgets of that quota.
#
# input: {"agent": id, "room": id, "tokens"?: n, "cost_micros"?: n}
# output: allow, reasons, agent, owner, org, quota (data.quotas.defaults overlaid with
# data.quotas.orgs[org], then data.quotas.agents[agent]; 0 means unlimited).
package bandplane.send_message

import data.bandplane.lib
import data.directory as dir

agent_id := input.agent

room := input.room

valid if {
	is_string(agent_id)
	agent_id != ""
	is_string(room)
	room != ""
}

record := dir.agents[agent_id]

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
	not record
} else := deny("suspended", sprintf("agent %s is suspended", [agent_id])) if {
	record.suspended == true
} else := deny("not_participant", sprintf("%s is not in room %s", [agent_id, room])) if {
	not dir.rooms[room][agent_id]
} else := {
	"allow": true,
	"reasons": [],
	"agent": agent_id,
	"owner": record.owner,
	"org": record.org,
	"quota": quota,
}
