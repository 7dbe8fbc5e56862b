# Package bandplane.add_participant answers whether actor may add participant to room.
#
# input: {"actor": id, "room": id, "participant": id}
# The actor (an agent, or a person acting in the web app) must be in the room, and the
# participant must be one of its peers (the platform's rules, room exclusion aside).
# Suspended agents may neither add nor be added. When
# data.governance.cross_org_add_requires_contact is true, a participant from another
# organization also needs an approved contact with the actor, even a global agent.
#
# This is the hot decision. OPA's cost grows with each evaluated expression and is
# highest for store lookups and negations (`not` evaluates a sub-query), so it decides
# from input.facts, which the engine adds from the directory (policy/facts.go,
# policy/README.md): the actor's and the participant's records (kind "unknown" for an
# unknown id) and the booleans actor_in_room, participant_in_room and contact; and it
# tests those facts for equality instead of negating them. Each answer is written out
# in full (a helper function costs more than the object). Its grant repeats
# lib.agent_grant's rules (peer_visible's) for an agent actor; the differential test
# (policy/differential_test.go) holds both decisions to the Go reference.
package bandplane.add_participant

import input.facts
import input.facts.actor as a
import input.facts.participant as p

valid if {
	is_string(input.actor)
	input.actor != ""
	is_string(input.room)
	input.room != ""
	is_string(input.participant)
	input.participant != ""
}

# The first failed check decides, in this order. An id that is not a non-empty string
# has no record and no membership, so validity is only checked when the actor is not
# in the room or the participant is unknown, which keeps the common path short.
decision := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "invalid_input", "message": "input.actor, input.room and input.participant must be non-empty strings"}]} if {
	facts.actor_in_room == false
	not valid
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "invalid_input", "message": "input.actor, input.room and input.participant must be non-empty strings"}]} if {
	p.kind == "unknown"
	not valid
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "unknown_actor", "message": sprintf("unknown actor %s", [input.actor])}]} if {
	a.kind == "unknown"
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "suspended", "message": sprintf("%s is suspended", [input.actor])}]} if {
	a.suspended == true
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "actor_not_in_room", "message": sprintf("%s is not in room %s", [input.actor, input.room])}]} if {
	facts.actor_in_room == false
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "self", "message": "an actor cannot add itself"}]} if {
	input.actor == input.participant
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "unknown_participant", "message": sprintf("unknown participant %s", [input.participant])}]} if {
	p.kind == "unknown"
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "participant_suspended", "message": sprintf("%s is suspended", [input.participant])}]} if {
	p.suspended == true
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "already_participant", "message": sprintf("%s is already in room %s", [input.participant, input.room])}]} if {
	facts.participant_in_room == true
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "not_peer", "message": sprintf("%s is not a peer of %s", [input.participant, input.actor])}]} if {
	grant == "none"
} else := {"allow": false, "is_contact": facts.contact, "reasons": [{"code": "cross_org_requires_contact", "message": sprintf("%s is in another organization and needs an approved contact with %s", [input.participant, input.actor])}]} if {
	data.governance.cross_org_add_requires_contact == true
	facts.contact == false
	a.org != p.org
} else := {
	"allow": true,
	"is_contact": facts.contact,
	"reason": grant,
	"reasons": [{"code": grant, "message": sprintf("%s may add %s as %s", [input.actor, input.participant, grant])}],
}

# grant is why the actor may add the participant (different ids, both known), "none"
# when the participant is not a peer of the actor. The agent
# rules (as lib.agent_grant) and the person rules share one precedence chain: the
# agent's owner or an agent the person owns, a contact, a sibling (agent with Personal
# Registry Access on), a global agent, an agent shared with the actor's organization
# (for an agent, both only while its registry access is on). In each branch the test
# that fails for most participants comes first.
grant := "owner" if {
	a.owner == input.participant
} else := "owned" if {
	p.owner == input.actor
	a.kind == "person"
} else := "contact" if {
	facts.contact == true
} else := "sibling" if {
	p.owner == a.owner
	a.registry_access == true
} else := "global" if {
	p.global == true
	reaches_registry
} else := "org_shared" if {
	p.shared_with_org == true
	p.org == a.org
	reaches_registry
} else := "none"

# reaches_registry: the actor reaches global and organization-shared agents, an agent
# while its Personal Registry Access is on, a person always.
reaches_registry if a.registry_access == true

reaches_registry if a.kind == "person"
