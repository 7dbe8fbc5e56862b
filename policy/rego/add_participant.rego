# Package bandplane.add_participant answers whether actor may add participant to room.
#
# input: {"actor": id, "room": id, "participant": id}
# The actor (an agent, or a person acting in the web app) must be in the room, and the
# participant must be one of its peers (the platform's rules, room exclusion aside).
# Suspended agents may neither add nor be added. When
# data.governance.cross_org_add_requires_contact is true, a participant from another
# organization also needs an approved contact with the actor, even a global agent.
#
# This is the hot decision, and OPA's cost is per evaluated expression, so the checks
# take the ids as function arguments (a data.directory lookup keyed by input.x costs
# an extra expression to bind input.x) and read data.directory directly instead of
# through helper rules. Its grant repeats lib.agent_grant's rules (peer_visible's)
# for an agent actor; the differential test (policy/differential_test.go) holds both
# decisions to the Go reference.
package bandplane.add_participant

import data.directory as dir

valid if {
	is_string(input.actor)
	input.actor != ""
	is_string(input.room)
	input.room != ""
	is_string(input.participant)
	input.participant != ""
}

is_contact := true if dir.contacts[input.actor][input.participant] == true
else := false

deny(code, message) := {"allow": false, "is_contact": is_contact, "reasons": [{"code": code, "message": message}]}

decision := deny("invalid_input", "input.actor, input.room and input.participant must be non-empty strings") if {
	not valid
} else := check(input.actor, input.room, input.participant)

# check is the decision for valid ids: the first failed check decides, in this order.
check(a, r, p) := deny("unknown_actor", sprintf("unknown actor %s", [a])) if {
	not dir.agents[a]
	not dir.people[a]
} else := deny("suspended", sprintf("%s is suspended", [a])) if {
	dir.agents[a].suspended == true
} else := deny("actor_not_in_room", sprintf("%s is not in room %s", [a, r])) if {
	not dir.rooms[r][a]
} else := deny("self", "an actor cannot add itself") if {
	a == p
} else := deny("unknown_participant", sprintf("unknown participant %s", [p])) if {
	not dir.agents[p]
	not dir.people[p]
} else := deny("participant_suspended", sprintf("%s is suspended", [p])) if {
	dir.agents[p].suspended == true
} else := deny("already_participant", sprintf("%s is already in room %s", [p, r])) if {
	dir.rooms[r][p]
} else := deny("not_peer", sprintf("%s is not a peer of %s", [p, a])) if {
	not grant(a, p)
} else := deny("cross_org_requires_contact", sprintf("%s is in another organization and needs an approved contact with %s", [p, a])) if {
	data.governance.cross_org_add_requires_contact == true
	not is_contact
	org(a) != org(p)
} else := {
	"allow": true,
	"is_contact": is_contact,
	"reason": g,
	"reasons": [{"code": g, "message": sprintf("%s may add %s as %s", [a, p, g])}],
} if {
	g := grant(a, p)
}

# grant is why actor a may add c (a != c, both known). The agent rules (as
# lib.agent_grant) and the person rules share one precedence chain, an id never being
# both: the agent's owner or an agent the person owns, a contact, a sibling (agent with
# Personal Registry Access on), a global agent, an agent shared with the actor's
# organization (for an agent, both only while its registry access is on).
grant(a, c) := "owner" if {
	dir.agents[a].owner == c
} else := "owned" if {
	dir.agents[c].owner == a
	dir.people[a]
} else := "contact" if {
	dir.contacts[a][c] == true
} else := "sibling" if {
	dir.agents[a].registry_access == true
	dir.agents[c].owner == dir.agents[a].owner
} else := "global" if {
	reach_org(a)
	dir.agents[c].global == true
} else := "org_shared" if {
	dir.agents[c].shared_with_org == true
	dir.agents[c].org == reach_org(a)
}

# reach_org is the organization whose shared agents a reaches: an agent's own while
# its Personal Registry Access is on, a person's always; undefined otherwise.
reach_org(a) := dir.agents[a].org if {
	dir.agents[a].registry_access == true
} else := dir.people[a].org if {
	not dir.agents[a]
}

# org is an agent's organization, else a person's.
org(id) := dir.agents[id].org if dir.agents[id]
else := dir.people[id].org
