# Package bandplane.peer_visible answers who an agent can see as a peer.
#
# input: {"agent": id, "room"?: id, "candidate"?: id}
# With a candidate: allow, is_contact and reason (owner|contact|sibling|global|org_shared).
# Without: allow and peers, the visible peers not in the room (band_lookup_peers).
package bandplane.peer_visible

import data.bandplane.lib
import data.directory as dir

room := object.get(input, "room", "")

agent := object.get(input, "agent", "")

candidate := object.get(input, "candidate", "")

# Errors that stop both forms.
deny contains lib.reason("invalid_input", "input.agent must be a non-empty string") if {
	not lib.valid_id(agent)
}

deny contains lib.reason("unknown_agent", sprintf("unknown agent %s", [agent])) if {
	lib.valid_id(agent)
	not dir.agents[agent]
}

deny contains lib.reason("suspended", sprintf("agent %s is suspended", [agent])) if {
	lib.suspended(agent)
}

has_candidate if "candidate" in object.keys(input)

# Why the single candidate is not visible; empty when it is.
candidate_deny contains lib.reason("invalid_input", "input.candidate must be a non-empty string") if {
	not lib.valid_id(candidate)
}

candidate_deny contains lib.reason("unknown_candidate", sprintf("unknown candidate %s", [candidate])) if {
	lib.valid_id(candidate)
	not lib.exists(candidate)
}

candidate_deny contains lib.reason("self", "an agent is not its own peer") if {
	candidate == agent
}

candidate_deny contains lib.reason("candidate_suspended", sprintf("%s is suspended", [candidate])) if {
	lib.suspended(candidate)
}

candidate_deny contains lib.reason("already_participant", sprintf("%s is already in room %s", [candidate, room])) if {
	lib.in_room(room, candidate)
}

candidate_deny contains lib.reason("not_peer", sprintf("%s is not a peer of %s", [candidate, agent])) if {
	lib.exists(candidate)
	candidate != agent
	not lib.agent_grant(agent, candidate)
}

single := {
	"allow": true,
	"is_contact": lib.contact_flag(agent, candidate),
	"reason": grant,
	"reasons": [lib.reason(grant, sprintf("%s is visible to %s as %s", [candidate, agent, grant]))],
} if {
	count(candidate_deny) == 0
	grant := lib.agent_grant(agent, candidate)
} else := {
	"allow": false,
	"is_contact": lib.contact_flag(agent, candidate),
	"reasons": lib.sorted(candidate_deny),
}

peers contains {
	"id": c,
	"kind": lib.kind(c),
	"handle": lib.handle(c),
	"is_contact": lib.contact_flag(agent, c),
	"reason": grant,
} if {
	some c in lib.agent_candidates(agent)
	not lib.in_room(room, c)
	not lib.suspended(c)
	lib.exists(c)
	grant := lib.agent_grant(agent, c)
}

decision := {"allow": false, "reasons": lib.sorted(deny)} if {
	count(deny) > 0
} else := single if {
	has_candidate
	dir.agents[agent]
} else := {"allow": true, "reasons": [], "peers": lib.sorted(peers)} if {
	dir.agents[agent]
}
