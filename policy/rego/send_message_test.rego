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
