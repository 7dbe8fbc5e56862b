package bandplane.send_message_test

import data.bandplane.fixture
import data.bandplane.send_message

room := "room-webhook-retries"

decide(agent, r) := d if {
	d := send_message.decision with input as fixture.message_input(fixture.directory, agent, r, {"tokens": 10})
		with data.directory as fixture.directory
		with data.quotas as {
			"defaults": {"window_seconds": 60, "messages_per_window_agent": 30, "tokens_per_day_org": 100},
			"orgs": {"org-acme": {"messages_per_window_agent": 60}},
			"agents": {"a-coder": {"tokens_per_day_org": 5}},
		}
}

codes(d) := {r.code | some r in d.reasons}

test_quota_defaults_then_org_then_agent if {
	d := decide("a-architect", room)
	d.allow
	d.owner == "u-alice"
	d.org == "org-acme"
	d.quota == {"window_seconds": 60, "messages_per_window_agent": 60, "tokens_per_day_org": 100}
	decide("a-coder", room).quota.tokens_per_day_org == 5
}

test_shipped_data_has_defaults if {
	d := send_message.decision with input as fixture.message_input(fixture.directory, "a-architect", room, {})
		with data.directory as fixture.directory
	d.quota.window_seconds > 0
	d.quota.messages_per_window_agent_room > 0
}

test_suspended if {
	d := decide("a-frozen", room)
	not d.allow
	codes(d) == {"suspended"}
}

test_not_participant if {
	codes(decide("a-reviewer", room)) == {"not_participant"}
}

test_unknown_and_invalid if {
	codes(decide("nobody", room)) == {"unknown_agent"}
	codes(decide("a-architect", "")) == {"invalid_input"}
	codes(decide(7, room)) == {"invalid_input"}
}

# The tests' quotas: the loop thresholds data.json ships (the Go tests check the
# shipped file; these hold for any data.json an operator deploys).
loop_quotas := {"defaults": {"window_seconds": 60, "max_chain_depth": 12, "max_handoffs": 6}, "orgs": {}, "agents": {}}

# chained is a message of a-architect in the room with chain c on loop_quotas;
# chained_with on the quotas q.
chained(c) := chained_with(c, loop_quotas)

chained_with(c, q) := d if {
	d := send_message.decision with input as fixture.message_input(fixture.directory, "a-architect", room, {"chain": c})
		with data.directory as fixture.directory
		with data.quotas as q
}

only_reason(d) := r if {
	count(d.reasons) == 1
	r := d.reasons[0]
}

test_loop_guard_allows_up_to_the_thresholds if {
	chained({"depth": 12, "handoffs": 6, "initiator": "u-alice", "initiator_type": "user"}).allow
	chained({"depth": 0, "handoffs": 0}).allow
	chained({}).allow
	chained({"depth": 12.0, "initiator": "webhook:ci", "initiator_type": "system"}).allow
}

test_loop_guard_denies_past_max_chain_depth if {
	d := chained({"depth": 13, "handoffs": 1, "initiator": "u-alice", "initiator_type": "user"})
	not d.allow
	only_reason(d) == {"code": "loop", "message": "loop: chain depth 13 is past max_chain_depth 12"}
	not d.quota
}

test_loop_guard_denies_ping_pong if {
	d := chained({"depth": 9, "handoffs": 7})
	not d.allow
	only_reason(d) == {"code": "loop", "message": "loop: 7 handoffs in a row between the same two agents is past max_handoffs 6"}
}

test_loop_guard_depth_decides_first if {
	only_reason(chained({"depth": 1000, "handoffs": 1000})).message == "loop: chain depth 1000 is past max_chain_depth 12"
}

test_loop_thresholds_per_org_and_agent_and_zero_is_no_limit if {
	q := {
		"defaults": {"window_seconds": 60, "max_chain_depth": 12, "max_handoffs": 6},
		"orgs": {"org-acme": {"max_chain_depth": 3, "max_handoffs": 0}},
		"agents": {"a-coder": {"max_chain_depth": 20}},
	}
	only_reason(chained_with({"depth": 4}, q)).message == "loop: chain depth 4 is past max_chain_depth 3"
	chained_with({"depth": 3, "handoffs": 3}, q).allow
	chained_with({"depth": 3, "handoffs": 999}, q).allow
	chained_with({"depth": 3, "handoffs": 999}, q).quota.max_chain_depth == 3
	coder := send_message.decision with input as fixture.message_input(fixture.directory, "a-coder", room, {"chain": {"depth": 20}})
		with data.directory as fixture.directory
		with data.quotas as q
	coder.allow
	partner := send_message.decision with input as fixture.message_input(
		fixture.directory_with_rooms({room: {"a-partner-reviewer": true}}), "a-partner-reviewer", room, {"chain": {"depth": 13}},
	)
		with data.directory as fixture.directory_with_rooms({room: {"a-partner-reviewer": true}})
		with data.quotas as q
	only_reason(partner).code == "loop" # another organization keeps the defaults
}

test_no_thresholds_no_loop_guard if {
	chained_with({"depth": 1000, "handoffs": 1000}, {"defaults": {"window_seconds": 60}, "orgs": {}, "agents": {}}).allow
}

# A chain the engine checked in Go (input.facts.chain_valid) is not checked again; the
# loop guard still applies.
test_a_chain_checked_in_go_is_trusted if {
	input_checked := object.union(
		fixture.message_input(fixture.directory, "a-architect", room, {"chain": {"depth": 13}}),
		{"facts": {"chain_valid": true}},
	)
	d := send_message.decision with input as input_checked
		with data.directory as fixture.directory
		with data.quotas as loop_quotas
	only_reason(d).code == "loop"
	unchecked := object.union(
		fixture.message_input(fixture.directory, "a-architect", room, {"chain": {"depth": 2, "extra": 1}}),
		{"facts": {"chain_valid": false}},
	)
	e := send_message.decision with input as unchecked
		with data.directory as fixture.directory
		with data.quotas as loop_quotas
	only_reason(e).code == "invalid_input"
}

# The checks before the loop guard still decide first.
test_loop_guard_after_the_agent_checks if {
	c := {"depth": 50}
	frozen := send_message.decision with input as fixture.message_input(fixture.directory, "a-frozen", room, {"chain": c})
		with data.directory as fixture.directory
		with data.quotas as loop_quotas
	codes(frozen) == {"suspended"}
	outside := send_message.decision with input as fixture.message_input(fixture.directory, "a-reviewer", room, {"chain": c})
		with data.directory as fixture.directory
		with data.quotas as loop_quotas
	codes(outside) == {"not_participant"}
}
invalid(c) := only_reason(chained(c)).message if {
	d := chained(c)
	not d.allow
	only_reason(d).code == "invalid_input"
}

test_hostile_chains_are_invalid_input if {
	invalid([1]) == "input.chain: must be an object"
	invalid("deep") == "input.chain: must be an object"
	invalid(null) == "input.chain: must be an object"
	invalid({"depth": 1, "hops": 2, "admin": true}) == "input.chain: unknown field admin, hops (known: depth, handoffs, initiator, initiator_type)"
	invalid({"depth": -1}) == "input.chain.depth: must be 0..1000, got -1"
	invalid({"depth": 1001}) == "input.chain.depth: must be 0..1000, got 1001"
	invalid({"depth": 1e30}) == "input.chain.depth: must be 0..1000, got 1e30"
	invalid({"depth": 1.5}) == "input.chain.depth: must be a whole number, got 1.5"
	invalid({"depth": "3"}) == `input.chain.depth: must be a whole number, got "3"`
	invalid({"depth": true}) == "input.chain.depth: must be a whole number, got true"
	invalid({"handoffs": -2}) == "input.chain.handoffs: must be 0..1000, got -2"
	invalid({"handoffs": {"n": 1}}) == `input.chain.handoffs: must be a whole number, got {"n":1}`
	invalid({"initiator": "", "initiator_type": "user"}) == `input.chain.initiator: must be a non-empty string of at most 256 characters, got ""`
	invalid({"initiator": 7, "initiator_type": "user"}) == "input.chain.initiator: must be a non-empty string of at most 256 characters, got 7"
	long := sprintf("%0257d", [0])
	startswith(invalid({"initiator": long, "initiator_type": "user"}), "input.chain.initiator: must be a non-empty string of at most 256 characters")
	invalid({"initiator": "u-alice", "initiator_type": "robot"}) == `input.chain.initiator_type: must be user, agent or system, got "robot"`
	invalid({"initiator": "u-alice"}) == "input.chain.initiator_type: missing (user, agent or system: the kind of input.chain.initiator)"
	invalid({"initiator_type": "user"}) == "input.chain.initiator: missing (input.chain.initiator_type names the kind of an initiator)"
}

# An invalid chain is invalid input even where the loop guard would deny.
test_invalid_chain_before_the_loop_guard if {
	invalid({"depth": 99, "handoffs": -1}) == "input.chain.handoffs: must be 0..1000, got -1"
}
