# Package bandplane.fixture is the directory the Rego tests share, in the store layout
# the Go Directory writes (see policy/README.md): the Webhook Retries room with
# Architect, Coder and Reviewer owned by alice, a partner's reviewer in another org,
# a global agent, an org-shared agent, a pending request and a suspended agent.
package bandplane.fixture

agent(id, handle, owner, org, extra) := object.union(
	{
		"id": id, "handle": handle, "owner": owner, "org": org, "model": "m",
		"registry_access": true, "shared_with_org": false, "global": false,
		"listed": true, "suspended": false,
	},
	extra,
)

directory := {
	"agents": {
		"a-architect": agent("a-architect", "alice/architect-agent", "u-alice", "org-acme", {}),
		"a-coder": agent("a-coder", "alice/coder-agent", "u-alice", "org-acme", {}),
		"a-reviewer": agent("a-reviewer", "alice/reviewer-agent", "u-alice", "org-acme", {}),
		"a-closed": agent("a-closed", "alice/closed-agent", "u-alice", "org-acme", {"registry_access": false}),
		"a-frozen": agent("a-frozen", "alice/frozen-agent", "u-alice", "org-acme", {"suspended": true}),
		"a-partner-reviewer": agent("a-partner-reviewer", "partner/reviewer-agent", "u-partner", "org-partner", {}),
		"a-hidden": agent("a-hidden", "partner/hidden-agent", "u-partner", "org-partner", {"listed": false}),
		"a-security": agent("a-security", "bob/security-agent", "u-bob", "org-acme", {"shared_with_org": true}),
		"a-notes": agent("a-notes", "bob/notes-agent", "u-bob", "org-acme", {}),
		"a-search": agent("a-search", "band/search-agent", "u-band", "org-band", {"global": true}),
	},
	"people": {
		"u-alice": {"id": "u-alice", "handle": "alice", "org": "org-acme"},
		"u-bob": {"id": "u-bob", "handle": "bob", "org": "org-acme"},
		"u-partner": {"id": "u-partner", "handle": "partner", "org": "org-partner"},
		"u-band": {"id": "u-band", "handle": "band", "org": "org-band"},
	},
	"handles": {
		"alice/architect-agent": "a-architect",
		"alice/coder-agent": "a-coder",
		"alice/reviewer-agent": "a-reviewer",
		"alice/closed-agent": "a-closed",
		"alice/frozen-agent": "a-frozen",
		"partner/reviewer-agent": "a-partner-reviewer",
		"partner/hidden-agent": "a-hidden",
		"bob/security-agent": "a-security",
		"bob/notes-agent": "a-notes",
		"band/search-agent": "a-search",
		"alice": "u-alice",
		"bob": "u-bob",
		"partner": "u-partner",
		"band": "u-band",
	},
	"contacts": {
		"a-coder": {"a-partner-reviewer": true, "u-bob": true},
		"a-partner-reviewer": {"a-coder": true},
		"u-bob": {"a-coder": true},
		"u-alice": {"a-partner-reviewer": true},
	},
	"pending": {
		"a-architect": {"a-partner-reviewer": "req-1"},
		"a-partner-reviewer": {"a-notes": "req-2"},
	},
	"rooms": {"room-webhook-retries": {"u-alice": true, "a-architect": true, "a-coder": true, "a-frozen": true}},
	"owned": {
		"u-alice": {"a-architect": true, "a-coder": true, "a-reviewer": true, "a-closed": true, "a-frozen": true},
		"u-partner": {"a-partner-reviewer": true, "a-hidden": true},
		"u-bob": {"a-security": true, "a-notes": true},
		"u-band": {"a-search": true},
	},
	"global": {"a-search": true},
	"org_shared": {"org-acme": {"a-security": true}},
}

# add_input and message_input build the input the engine gives add_participant and
# send_message (policy/facts.go): the request plus input.facts, derived here from the
# directory dir the test evaluates against.
add_input(dir, actor, room, participant) := {
	"actor": actor, "room": room, "participant": participant,
	"facts": {
		"actor": record(dir, actor),
		"participant": record(dir, participant),
		"actor_in_room": object.get(dir, ["rooms", room, actor], false),
		"participant_in_room": object.get(dir, ["rooms", room, participant], false),
		"contact": object.get(dir, ["contacts", actor, participant], false),
	},
}

message_input(dir, agent, room, extra) := object.union(extra, {
	"agent": agent, "room": room,
	"facts": {"agent": agent_record(dir, agent), "in_room": object.get(dir, ["rooms", room, agent], false)},
})

record(dir, id) := agent_record(dir, id) if dir.agents[id]
else := object.union(dir.people[id], {"kind": "person"}) if dir.people[id]
else := {"kind": "unknown"}

agent_record(dir, id) := object.union(dir.agents[id], {"kind": "agent"}) if dir.agents[id]
else := {"kind": "unknown"}

# directory_with_rooms is the directory with its room membership replaced.
directory_with_rooms(rooms) := object.union(object.remove(directory, {"rooms"}), {"rooms": rooms})
