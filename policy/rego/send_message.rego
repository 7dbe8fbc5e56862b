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

import input.facts
import input.facts.agent as record

valid if {
	is_string(input.agent)
	input.agent != ""
	is_string(input.room)
	input.room != ""
}

quota := object.union_n([
	data.quotas.defaults,
	object.get(data.quotas.orgs, record.org, {}),
	object.get(data.quotas.agents, input.agent, {}),
])

# The first failed check decides. An agent or a room that is not a non-empty string has
# no record or no membership, so validity is only checked then (as in add_participant).
decision := {"allow": false, "reasons": [{"code": "invalid_input", "message": "input.agent and input.room must be non-empty strings"}]} if {
	record.kind == "unknown"
	not valid
} else := {"allow": false, "reasons": [{"code": "invalid_input", "message": "input.agent and input.room must be non-empty strings"}]} if {
	facts.in_room == false
	not valid
} else := {"allow": false, "reasons": [{"code": "unknown_agent", "message": sprintf("unknown agent %s", [input.agent])}]} if {
	record.kind == "unknown"
} else := {"allow": false, "reasons": [{"code": "suspended", "message": sprintf("agent %s is suspended", [input.agent])}]} if {
	record.suspended == true
} else := {"allow": false, "reasons": [{"code": "not_participant", "message": sprintf("%s is not in room %s", [input.agent, input.room])}]} if {
	facts.in_room == false
} else := {
	"allow": true,
	"reasons": [],
	"agent": input.agent,
	"owner": record.owner,
	"org": record.org,
	"quota": quota,
}
