# Package bandplane.lib holds the directory helpers and the platform's peer rules
# shared by the decisions. Everything reads data.directory (see policy/README.md).
package bandplane.lib

import data.directory as dir

# reason builds a reason object with a stable machine code and a text.
reason(code, message) := {"code": code, "message": message}

exists(id) if dir.agents[id]

exists(id) if dir.people[id]

kind(id) := "agent" if dir.agents[id]
else := "person" if dir.people[id]

handle(id) := object.get(dir.agents, [id, "handle"], object.get(dir.people, [id, "handle"], ""))

suspended(id) if dir.agents[id].suspended == true

in_room(room, id) if dir.rooms[room][id] == true

# contact_flag is true or false, never undefined, so it can sit in an object.
contact_flag(a, b) := object.get(dir, ["contacts", a, b], false) == true

registry_on(a) if dir.agents[a].registry_access == true

valid_id(x) if {
	is_string(x)
	x != ""
}

# agent_grant is why candidate c is a peer of agent a, in precedence order: its owner,
# its contacts, and while Personal Registry Access is on its siblings, global agents and
# agents shared with its owner's organization. Undefined when c is no peer. Room
# membership and suspension are checked by the callers.
agent_grant(a, c) := "owner" if {
	c != a
	dir.agents[a].owner == c
} else := "contact" if {
	c != a
	dir.contacts[a][c] == true
} else := "sibling" if {
	c != a
	registry_on(a)
	dir.agents[c].owner == dir.agents[a].owner
} else := "global" if {
	c != a
	registry_on(a)
	dir.agents[c].global == true
} else := "org_shared" if {
	c != a
	registry_on(a)
	dir.agents[c].shared_with_org == true
	dir.agents[c].org == dir.agents[a].org
}

# agent_candidates are the ids that may be peers of agent a, taken from the indexes
# (owner, contacts, and the registry sets) instead of scanning every agent.
agent_candidates(a) := ({dir.agents[a].owner} | object.keys(object.get(dir, ["contacts", a], {}))) | registry_candidates(a)

registry_candidates(a) := (object.keys(object.get(dir, ["owned", dir.agents[a].owner], {})) | object.keys(object.get(dir, "global", {}))) | object.keys(object.get(dir, ["org_shared", dir.agents[a].org], {})) if {
	registry_on(a)
} else := set()

# sorted turns a set of reasons into an array ordered by code.
sorted(reasons) := [r | some r in reasons]
