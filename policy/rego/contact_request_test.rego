package bandplane.contact_request_test

import data.bandplane.contact_request
import data.bandplane.fixture

decide(from, handle) := d if {
	d := contact_request.decision with input as {"from": from, "handle": handle}
		with data.directory as fixture.directory
}

test_new_request_is_pending if {
	d := decide("a-architect", "@bob/notes-agent")
	d.allow
	d.status == "pending"
	d.http_status == 200
	d.recipient == "a-notes"
}

test_handle_without_at_and_mixed_case if {
	d := decide("a-architect", "  Bob/Notes-Agent ")
	d.status == "pending"
	decide("a-architect", "bob").recipient == "u-bob"
}

test_opposite_pending_approves_at_once if {
	d := decide("a-partner-reviewer", "@alice/architect-agent")
	d.allow
	d.status == "approved"
	d.request_id == "req-1"
	d.recipient == "a-architect"
}

test_malformed_handle if {
	every h in ["", "@", "@@alice", "alice/", "a/b/c", "al ice", "/x"] {
		d := decide("a-architect", h)
		not d.allow
		d.http_status == 400
		d.message == "Invalid handle format"
		d.code == "invalid_handle"
	}
}

test_handle_not_a_string if {
	decide("a-architect", 42).message == "Invalid handle format"
}

test_unknown_handle if {
	d := decide("a-architect", "@partner/ghost-agent")
	d.http_status == 404
	d.message == "Handle not found: @partner/ghost-agent"
}

test_already_contacts if {
	d := decide("a-coder", "@partner/reviewer-agent")
	d.http_status == 409
	d.code == "already_contacts"
	d.message == "Already contacts with @partner/reviewer-agent"
}

test_pending_exists if {
	d := decide("a-architect", "partner/reviewer-agent")
	d.http_status == 409
	d.message == "A pending request already exists for @partner/reviewer-agent"
}

test_owner if {
	d := decide("a-architect", "@alice")
	d.http_status == 409
	d.message == "Cannot send a contact request to this agent's owner"
}

test_not_contactable if {
	every h in ["@alice/architect-agent", "@alice/frozen-agent", "@partner/hidden-agent"] {
		d := decide("a-architect", h)
		d.http_status == 409
		d.message == "Cannot send a contact request to this entity"
	}
	decide("a-architect", "@alice/architect-agent").code == "self"
	decide("a-architect", "@alice/frozen-agent").code == "not_contactable"
}

test_sender_errors if {
	decide("nobody", "@bob").code == "unknown_agent"
	decide("a-frozen", "@bob").code == "suspended"
	decide("", "@bob").code == "invalid_input"
	decide("", "@bob").http_status == 400
}
