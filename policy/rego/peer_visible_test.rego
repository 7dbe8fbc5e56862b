package bandplane.peer_visible_test

import data.bandplane.fixture
import data.bandplane.peer_visible

room := "room-webhook-retries"

decide(inp) := d if {
	d := peer_visible.decision with input as inp with data.directory as fixture.directory
}

codes(d) := {r.code | some r in d.reasons}

test_list_excludes_room_members_and_sorts_by_grant if {
	d := decide({"agent": "a-architect", "room": room})
	d.allow
	ids := {p.id: p.reason | some p in d.peers}
	ids == {
		"a-reviewer": "sibling",
		"a-closed": "sibling",
		"a-search": "global",
		"a-security": "org_shared",
	}
}

test_list_without_room_includes_owner if {
	d := decide({"agent": "a-coder"})
	owner := [p | some p in d.peers; p.id == "u-alice"][0]
	owner.reason == "owner"
	owner.kind == "person"
	owner.handle == "alice"
	partner := [p | some p in d.peers; p.id == "a-partner-reviewer"][0]
	partner.reason == "contact"
	partner.is_contact == true
	bob := [p | some p in d.peers; p.id == "u-bob"][0]
	bob.is_contact
	not "a-frozen" in {p.id | some p in d.peers}
	not "a-coder" in {p.id | some p in d.peers}
	not "a-notes" in {p.id | some p in d.peers}
}

test_list_registry_access_off_keeps_owner_and_contacts if {
	d := decide({"agent": "a-closed"})
	{p.id | some p in d.peers} == {"u-alice"}
}

test_single_sibling if {
	d := decide({"agent": "a-architect", "room": room, "candidate": "a-reviewer"})
	d.allow
	d.reason == "sibling"
	d.is_contact == false
}

test_single_contact_wins_over_registry if {
	d := decide({"agent": "a-coder", "candidate": "a-partner-reviewer"})
	d.allow
	d.reason == "contact"
	d.is_contact
}

test_single_owner if {
	d := decide({"agent": "a-architect", "candidate": "u-alice"})
	d.reason == "owner"
}

test_single_global_and_org_shared if {
	decide({"agent": "a-architect", "candidate": "a-search"}).reason == "global"
	decide({"agent": "a-architect", "candidate": "a-security"}).reason == "org_shared"
}

test_single_not_peer_private_agents if {
	d := decide({"agent": "a-architect", "candidate": "a-partner-reviewer"})
	not d.allow
	codes(d) == {"not_peer"}
	codes(decide({"agent": "a-architect", "candidate": "a-notes"})) == {"not_peer"}
	codes(decide({"agent": "a-closed", "candidate": "a-reviewer"})) == {"not_peer"}
	codes(decide({"agent": "a-architect", "candidate": "u-bob"})) == {"not_peer"}
}

test_single_in_room_excluded if {
	d := decide({"agent": "a-architect", "room": room, "candidate": "a-coder"})
	not d.allow
	codes(d) == {"already_participant"}
}

test_single_suspended_candidate if {
	codes(decide({"agent": "a-architect", "candidate": "a-frozen"})) == {"candidate_suspended"}
}

test_single_self if {
	codes(decide({"agent": "a-architect", "candidate": "a-architect"})) == {"self"}
}

test_single_unknown_and_invalid_candidate if {
	codes(decide({"agent": "a-architect", "candidate": "nobody"})) == {"unknown_candidate"}
	codes(decide({"agent": "a-architect", "candidate": 7})) == {"invalid_input"}
}

test_agent_errors if {
	codes(decide({"agent": "nobody"})) == {"unknown_agent"}
	codes(decide({})) == {"invalid_input"}
	codes(decide({"agent": ""})) == {"invalid_input"}
	codes(decide({"agent": "a-frozen", "candidate": "a-coder"})) == {"suspended"}
	not decide({"agent": "a-frozen"}).allow
}
