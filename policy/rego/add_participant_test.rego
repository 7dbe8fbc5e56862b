package bandplane.add_participant_test

import data.bandplane.add_participant
import data.bandplane.fixture

room := "room-webhook-retries"

decide(actor, participant) := d if {
	d := add_participant.decision with input as fixture.add_input(fixture.directory, actor, room, participant)
		with data.directory as fixture.directory
}

codes(d) := {r.code | some r in d.reasons}

test_architect_adds_sibling_reviewer if {
	d := decide("a-architect", "a-reviewer")
	d.allow
	d.reason == "sibling"
	d.is_contact == false
}

test_agent_grants if {
	decide("a-architect", "a-security").reason == "org_shared"
	d := add_participant.decision with input as fixture.add_input(fixture.directory, "a-architect", room, "a-search")
		with data.directory as fixture.directory
		with data.governance.cross_org_add_requires_contact as false
	d.reason == "global"
}

test_partner_reviewer_needs_contact if {
	d := decide("a-architect", "a-partner-reviewer")
	not d.allow
	codes(d) == {"not_peer"}
}

test_contact_adds_person if {
	d := decide("a-coder", "u-bob")
	d.allow
	d.reason == "contact"
}

test_contact_adds_partner_reviewer if {
	d := decide("a-coder", "a-partner-reviewer")
	d.allow
	d.reason == "contact"
	d.is_contact
}

test_cross_org_global_agent_needs_contact if {
	d := add_participant.decision with input as fixture.add_input(fixture.directory, "a-architect", room, "a-search")
		with data.directory as fixture.directory
		with data.governance.cross_org_add_requires_contact as true
	codes(d) == {"cross_org_requires_contact"}
	d2 := add_participant.decision with input as fixture.add_input(fixture.directory, "a-architect", room, "a-search")
		with data.directory as fixture.directory
		with data.governance.cross_org_add_requires_contact as false
	d2.allow
}

test_person_actor if {
	d := decide("u-alice", "a-reviewer")
	d.allow
	d.reason == "owned"
	decide("u-alice", "a-partner-reviewer").reason == "contact"
	decide("u-alice", "a-security").reason == "org_shared"
	codes(decide("u-alice", "a-notes")) == {"not_peer"}
}

test_person_actor_global if {
	d := add_participant.decision with input as fixture.add_input(fixture.directory, "u-alice", room, "a-search")
		with data.directory as fixture.directory
		with data.governance.cross_org_add_requires_contact as false
	d.reason == "global"
}

test_suspended_cannot_add_or_be_added if {
	codes(decide("a-frozen", "a-reviewer")) == {"suspended"}
	codes(decide("u-alice", "a-frozen")) == {"participant_suspended"}
}

test_actor_must_be_in_room if {
	codes(decide("a-reviewer", "a-closed")) == {"actor_not_in_room"}
}

test_already_participant if {
	codes(decide("a-architect", "a-coder")) == {"already_participant"}
}

test_self_and_unknown if {
	codes(decide("a-architect", "a-architect")) == {"self"}
	codes(decide("a-architect", "nobody")) == {"unknown_participant"}
	codes(decide("nobody", "a-reviewer")) == {"unknown_actor"}
}

test_invalid_input if {
	# The engine's facts for an input without a participant.
	no_participant := object.remove(fixture.add_input(fixture.directory, "a-architect", room, ""), {"participant"})
	d := add_participant.decision with input as no_participant
		with data.directory as fixture.directory
	codes(d) == {"invalid_input"}
	not d.allow

	# An actor or a room that is not a string: no record, no membership.
	bad_actor := add_participant.decision with input as fixture.add_input(fixture.directory, 7, room, "a-reviewer")
		with data.directory as fixture.directory
	codes(bad_actor) == {"invalid_input"}
	bad_room := add_participant.decision with input as fixture.add_input(fixture.directory, "a-architect", ["r"], "a-reviewer")
		with data.directory as fixture.directory
	codes(bad_room) == {"invalid_input"}
}

test_agent_adds_its_owner if {
	dir := fixture.directory_with_rooms({room: {"a-architect": true}})
	d := add_participant.decision with input as fixture.add_input(dir, "a-architect", room, "u-alice")
		with data.directory as dir
	d.allow
	d.reason == "owner"
}

test_registry_access_off_limits_grants if {
	dir := fixture.directory_with_rooms({room: {"a-closed": true}})
	d := add_participant.decision with input as fixture.add_input(dir, "a-closed", room, "a-reviewer")
		with data.directory as dir
	codes(d) == {"not_peer"}
}
