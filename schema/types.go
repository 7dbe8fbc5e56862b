package schema

import "strings"

// The event types by purpose. Each list or predicate here is the one place its purpose
// is decided: ingest, the policy replica and the collector's write rules all read them.

// DirectoryTypes register agents and people: ingest enriches events from them.
var DirectoryTypes = []string{TypeUserRegistered, TypeAgentRegistered, TypeAgentUpdated}

// IsDirectoryType says whether t registers an agent or a person.
func IsDirectoryType(t string) bool {
	return t == TypeUserRegistered || t == TypeAgentRegistered || t == TypeAgentUpdated
}

// GovernanceTypes change what the policies decide from: the directory, contacts and
// contact requests, room membership, and an operator's suspensions. (Budgets change
// them too; the replica reads them from the budgets table, which retention never drops.)
// An operator's bindings of senders' identities to agents are here too: they decide
// which agent a span is attributed to. The policy replica replays them from ClickHouse
// at start and follows them on the stream.
var GovernanceTypes = []string{
	TypeUserRegistered, TypeAgentRegistered, TypeAgentUpdated,
	TypeContactAdded, TypeContactRemoved, TypeContactRequestReceived, TypeContactRequestUpdated,
	TypeParticipantAdded, TypeParticipantRemoved,
	TypeRoomAdded, TypeRoomRemoved, TypeRoomDeleted,
	TypeAgentSuspended, TypeAgentResumed,
	TypeAgentBound, TypeAgentUnbound,
}

// SourceBandplane prefixes the source of every event bandplane itself writes
// ("bandplane-policy", "bandplane-keys", "bandplane-audit"). No client may use it.
const SourceBandplane = "bandplane"

// OwnType says whether t is a type only bandplane's own producers write: policy
// decisions, operator actions (agent.suspended, agent.resumed, agent.control,
// agent.bound, agent.unbound), keys, seals, and the reserved nouns of later features
// (budget.*, price.*, job.*). The collector refuses these from every client, platform
// keys included: a sender that could bind itself would choose which agent its spans
// count against.
func OwnType(t string) bool {
	switch t {
	case TypeAgentControl, TypeAgentSuspended, TypeAgentResumed, TypeAgentBound, TypeAgentUnbound:
		return true
	}
	noun, _, _ := strings.Cut(t, ".")
	switch noun {
	case "policy", "key", "audit", "budget", "price", "job", "bandplane":
		return true
	}
	return false
}

// OwnSource says whether source is reserved for bandplane's own producers: it starts
// with "bandplane" in any case (sources are printable ASCII, see Validate).
func OwnSource(source string) bool {
	return len(source) >= len(SourceBandplane) && strings.EqualFold(source[:len(SourceBandplane)], SourceBandplane)
}

// PlatformOnlyType says whether t may be written only with a platform ingest key (the
// routing core's): registrations, contacts and contact requests, participants and room
// membership — everything that changes what the policies decide, except bandplane's
// own types, which nobody writes through the collector.
func PlatformOnlyType(t string) bool {
	if IsDirectoryType(t) {
		return true
	}
	noun, _, _ := strings.Cut(t, ".")
	switch noun {
	case "contact", "participant", "room":
		return true
	}
	return false
}
