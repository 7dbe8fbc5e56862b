# Package bandplane.contact_request validates a contact request the way the platform's
# Agent API does (POST /api/v1/agent/contacts/add).
#
# input: {"from": agent id, "handle": handle as typed, with or without "@"}
# output: allow, status ("pending", or "approved" when the recipient already has a
# pending request to the sender), http_status, code, message, recipient, request_id.
package bandplane.contact_request

import data.bandplane.lib
import data.directory as dir

# The handle as the directory keys it: trimmed, lowercase, without the leading "@".
handle := trim_prefix(lower(trim_space(input.handle)), "@") if is_string(input.handle)

else := ""

handle_pattern := `^[a-z0-9][a-z0-9._-]{0,63}(/[a-z0-9][a-z0-9._-]{0,63})?$`

valid_handle if regex.match(handle_pattern, handle)

recipient := dir.handles[handle]

sender := object.get(input, "from", "")

display := concat("", ["@", handle])

out(code, http_status, message) := {
	"allow": false,
	"http_status": http_status,
	"code": code,
	"message": message,
	"reasons": [lib.reason(code, message)],
}

decision := out("invalid_input", 400, "input.from must be a non-empty string") if {
	not lib.valid_id(sender)
} else := out("unknown_agent", 403, sprintf("Unknown agent: %s", [sender])) if {
	not dir.agents[sender]
} else := out("suspended", 403, sprintf("Agent %s is suspended", [sender])) if {
	lib.suspended(sender)
} else := out("invalid_handle", 400, "Invalid handle format") if {
	not valid_handle
} else := out("handle_not_found", 404, sprintf("Handle not found: %s", [display])) if {
	not recipient
} else := out("self", 409, "Cannot send a contact request to this entity") if {
	recipient == sender
} else := out("recipient_is_owner", 409, "Cannot send a contact request to this agent's owner") if {
	recipient == dir.agents[sender].owner
} else := out("not_contactable", 409, "Cannot send a contact request to this entity") if {
	lib.suspended(recipient)
} else := out("not_contactable", 409, "Cannot send a contact request to this entity") if {
	dir.agents[recipient].listed == false
} else := out("already_contacts", 409, sprintf("Already contacts with %s", [display])) if {
	lib.contact_flag(sender, recipient)
} else := out("pending_exists", 409, sprintf("A pending request already exists for %s", [display])) if {
	dir.pending[sender][recipient]
} else := {
	"allow": true,
	"status": "approved",
	"http_status": 200,
	"code": "approved",
	"message": sprintf("%s had a pending request to you; both are now contacts", [display]),
	"recipient": recipient,
	"request_id": dir.pending[recipient][sender],
	"reasons": [lib.reason("approved", "the opposite request was pending")],
} if {
	dir.pending[recipient][sender]
} else := {
	"allow": true,
	"status": "pending",
	"http_status": 200,
	"code": "pending",
	"message": sprintf("Contact request sent to %s", [display]),
	"recipient": recipient,
	"reasons": [lib.reason("pending", "the request waits for the recipient")],
}
