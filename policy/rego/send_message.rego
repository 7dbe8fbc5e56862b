# Package bandplane.send_message decides whether an agent may post in a room and which
# quota applies; the Go limiter enforces the rates and daily budgets of that quota.
#
# input: {"agent": id, "room": id, "tokens"?: n, "cost_micros"?: n, "execution_id"?: id,
#         "chain"?: {"depth"?: n, "handoffs"?: n, "initiator"?: id, "initiator_type"?: kind}}
# output: allow, reasons, agent, owner, org, quota (data.quotas.defaults overlaid with
# data.quotas.orgs[org], then data.quotas.agents[agent]; 0 means unlimited).
#
# The loop guard: a message of an execution deeper in its chain of mentions than the
# quota's max_chain_depth, or of the latest of more than max_handoffs handoffs in a row
# between the same two agents, is denied with code "loop".
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

# The chain of the sending agent's execution, when the input has one: every field is
# checked whatever the agent (the engine reserves on the initiator's budgets). A
# well-formed chain passes chain_ok, a few comparisons; only another one is taken
# apart by chain_error, for the message naming its first problem.
chain_fields := {"depth", "handoffs", "initiator", "initiator_type"}

initiator_types := {"user", "agent", "system"}

max_chain_figure := 1000

max_initiator_chars := 256

# A chain the engine built from a typed input and checked in Go (policy.Chain.Validate,
# the HTTP API's rules) is marked input.facts.chain_valid: it is not checked again on
# every message. Any other chain is checked here. Every comparison costs on every
# message, so the check is written for few: d >= 0 and d <= 1000 hold only for a number
# (Rego orders null < booleans < numbers < strings < …), so floor never sees anything
# else; the initiator's kind is looked up against 0 for no initiator and 1 for one.
chain_ok if {
	facts.chain_valid == true
} else := true if {
	c := input.chain
	is_object(c)
	count(object.remove(c, chain_fields)) == 0
	d := object.get(c, "depth", 0)
	d >= 0
	d <= max_chain_figure
	floor(d) == d
	h := object.get(c, "handoffs", 0)
	h >= 0
	h <= max_chain_figure
	floor(h) == h
	id := object.get(c, "initiator", "")
	is_string(id)
	count(id) <= max_initiator_chars
	{"": 0, "user": 1, "agent": 1, "system": 1}[object.get(c, "initiator_type", "")] == min([count(id), 1])
}

chain_error := "input.chain: must be an object" if {
	c := input.chain
	not is_object(c)
} else := msg if {
	unknown := object.keys(input.chain) - chain_fields
	count(unknown) > 0
	msg := sprintf("input.chain: unknown field %s (known: depth, handoffs, initiator, initiator_type)", [concat(", ", sort(unknown))])
} else := msg if {
	msg := figure_error("depth")
} else := msg if {
	msg := figure_error("handoffs")
} else := sprintf("input.chain.initiator: must be a non-empty string of at most %d characters, got %s", [max_initiator_chars, json.marshal(v)]) if {
	v := input.chain.initiator
	not valid_initiator(v)
} else := sprintf("input.chain.initiator_type: must be user, agent or system, got %s", [json.marshal(v)]) if {
	v := input.chain.initiator_type
	not v in initiator_types
} else := "input.chain.initiator_type: missing (user, agent or system: the kind of input.chain.initiator)" if {
	"initiator" in object.keys(input.chain)
	not "initiator_type" in object.keys(input.chain)
} else := "input.chain.initiator: missing (input.chain.initiator_type names the kind of an initiator)" if {
	"initiator_type" in object.keys(input.chain)
	not "initiator" in object.keys(input.chain)
}

# A figure is checked for its type, then its range, and only then for a fraction, so
# that floor never sees a number too large for it.
figure_error(field) := sprintf("input.chain.%s: must be a whole number, got %s", [field, json.marshal(v)]) if {
	v := input.chain[field]
	not is_number(v)
} else := sprintf("input.chain.%s: must be 0..%d, got %s", [field, max_chain_figure, json.marshal(v)]) if {
	v := input.chain[field]
	not v >= 0
} else := sprintf("input.chain.%s: must be 0..%d, got %s", [field, max_chain_figure, json.marshal(v)]) if {
	v := input.chain[field]
	v > max_chain_figure
} else := sprintf("input.chain.%s: must be a whole number, got %s", [field, json.marshal(v)]) if {
	v := input.chain[field]
	floor(v) != v
}

valid_initiator(v) if {
	is_string(v)
	v != ""
	count(v) <= max_initiator_chars
}

# The loop guard, on the agent's quota (max_chain_depth, max_handoffs; 0, or none: no
# limit): the quota is evaluated once per decision, where data read on its own would
# cost a lookup of its rules on every message.
loop_reason := sprintf("loop: chain depth %v is past max_chain_depth %v", [depth, quota.max_chain_depth]) if {
	depth := input.chain.depth
	quota.max_chain_depth > 0
	depth > quota.max_chain_depth
} else := sprintf("loop: %v handoffs in a row between the same two agents is past max_handoffs %v", [handoffs, quota.max_handoffs]) if {
	handoffs := input.chain.handoffs
	quota.max_handoffs > 0
	handoffs > quota.max_handoffs
}

# The first failed check decides. An agent or a room that is not a non-empty string has
# no record or no membership, so validity is only checked then (as in add_participant).
decision := {"allow": false, "reasons": [{"code": "invalid_input", "message": "input.agent and input.room must be non-empty strings"}]} if {
	record.kind == "unknown"
	not valid
} else := {"allow": false, "reasons": [{"code": "invalid_input", "message": "input.agent and input.room must be non-empty strings"}]} if {
	facts.in_room == false
	not valid
} else := {"allow": false, "reasons": [{"code": "invalid_input", "message": msg}]} if {
	input.chain
	not chain_ok
	msg := chain_error
} else := {"allow": false, "reasons": [{"code": "unknown_agent", "message": sprintf("unknown agent %s", [input.agent])}]} if {
	record.kind == "unknown"
} else := {"allow": false, "reasons": [{"code": "suspended", "message": sprintf("agent %s is suspended", [input.agent])}]} if {
	record.suspended == true
} else := {"allow": false, "reasons": [{"code": "not_participant", "message": sprintf("%s is not in room %s", [input.agent, input.room])}]} if {
	facts.in_room == false
} else := {"allow": false, "reasons": [{"code": "loop", "message": msg}]} if {
	msg := loop_reason
} else := {
	"allow": true,
	"reasons": [],
	"agent": input.agent,
	"owner": record.owner,
	"org": record.org,
	"quota": quota,
}
