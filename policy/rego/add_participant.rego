# Package bandplane.add_participant answers whether actor may add participant to room.
#
# input: {"actor": id, "room": id, "participant": id}
# The actor (an agent, or a person acting in the web app) must be in the room, and the
# participant must be one of its peers (the platform's rules, room exclusion aside).
# Suspended agents may neither add nor be added. When
# data.governance.cross_org_add_requires_contact is true, a participant from another
# organization also needs an approved contact with the actor, even a global agent.
package bandplane.add_participant

import data.bandplane.lib
import data.directory as dir

actor := input.actor

participant := input.participant

room := input.room

valid if {
	is_string(actor)
	actor != ""
	is_string(room)
	room != ""
	is_string(participant)
	participant != ""
}

# Facts about this input, each evaluated once per decision (complete rules are cached).
actor_agent := dir.agents[actor]

participant_agent := dir.agents[participant]

actor_exists if actor_agent

actor_exists if dir.people[actor]

participant_exists if participant_agent

participant_exists if dir.people[participant]

is_contact := true if dir.contacts[actor][participant] == true
else := false

grant := lib.grant(actor, participant)

cross_org if lib.org(actor) != lib.org(participant)

deny(code, message) := {"allow": false, "is_contact": is_contact, "reasons": [lib.reason(code, message)]}

# The first failed check decides, in this order: it keeps a decision to a few dozen
# expressions, which is what keeps it in microseconds.
decision := deny("invalid_input", "input.actor, input.room and input.participant must be non-empty strings") if {
	not valid
} else := deny("unknown_actor", sprintf("unknown actor %s", [actor])) if {
	not actor_exists
} else := deny("suspended", sprintf("%s is suspended", [actor])) if {
	actor_agent.suspended == true
} else := deny("actor_not_in_room", sprintf("%s is not in room %s", [actor, room])) if {
	not dir.rooms[room][actor]
} else := deny("self", "an actor cannot add itself") if {
	actor == participant
} else := deny("unknown_participant", sprintf("unknown participant %s", [participant])) if {
	not participant_exists
} else := deny("participant_suspended", sprintf("%s is suspended", [participant])) if {
	participant_agent.suspended == true
} else := deny("already_participant", sprintf("%s is already in room %s", [participant, room])) if {
	dir.rooms[room][participant]
} else := deny("not_peer", sprintf("%s is not a peer of %s", [participant, actor])) if {
	not grant
} else := deny("cross_org_requires_contact", sprintf("%s is in another organization and needs an approved contact with %s", [participant, actor])) if {
	data.governance.cross_org_add_requires_contact == true
	not is_contact
	cross_org
} else := {
	"allow": true,
	"is_contact": is_contact,
	"reason": grant,
	"reasons": [lib.reason(grant, sprintf("%s may add %s as %s", [actor, participant, grant]))],
}
