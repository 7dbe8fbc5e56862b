package policy

import (
	"slices"
	"strings"
)

// Reference is a plain-Go statement of the peer and add rules, written for obviousness
// rather than speed (the peer list scans every agent and person). The differential test
// holds the Rego policies to it; keep the two in step when a rule changes.
type Reference struct {
	agents   map[string]Agent
	people   map[string]Person
	contacts map[string]map[string]bool
	rooms    map[string]map[string]bool
	// crossOrgRequiresContact mirrors data.governance.cross_org_add_requires_contact.
	crossOrgRequiresContact bool
}

// NewReference builds the reference rules over a snapshot.
func NewReference(s Snapshot, crossOrgRequiresContact bool) *Reference {
	r := &Reference{
		agents:                  map[string]Agent{},
		people:                  map[string]Person{},
		contacts:                map[string]map[string]bool{},
		rooms:                   map[string]map[string]bool{},
		crossOrgRequiresContact: crossOrgRequiresContact,
	}
	for _, p := range s.People {
		r.people[p.ID] = p
	}
	for _, a := range s.Agents {
		r.agents[a.ID] = a
	}
	link := func(m map[string]map[string]bool, a, b string) {
		if m[a] == nil {
			m[a] = map[string]bool{}
		}
		m[a][b] = true
	}
	for _, c := range s.Contacts {
		link(r.contacts, c[0], c[1])
		link(r.contacts, c[1], c[0])
	}
	for room, ids := range s.Rooms {
		for _, id := range ids {
			link(r.rooms, room, id)
		}
	}
	return r
}

func (r *Reference) exists(id string) bool {
	_, agent := r.agents[id]
	_, person := r.people[id]
	return agent || person
}

func (r *Reference) suspended(id string) bool { return r.agents[id].IsSuspended() }

func (r *Reference) orgOf(id string) (string, bool) {
	if a, ok := r.agents[id]; ok {
		return a.Org, true
	}
	if p, ok := r.people[id]; ok {
		return p.Org, true
	}
	return "", false
}

// agentGrant is why c is a peer of agent a ("" if it is not), first match wins: the
// owner, a contact, and with Personal Registry Access on: a sibling, a global agent,
// an agent shared with a's organization.
func (r *Reference) agentGrant(a, c string) string {
	agent := r.agents[a]
	switch {
	case c == a:
		return ""
	case agent.Owner == c:
		return "owner"
	case r.contacts[a][c]:
		return "contact"
	case !agent.RegistryAccess:
		return ""
	}
	cand, ok := r.agents[c]
	switch {
	case !ok:
		return ""
	case cand.Owner == agent.Owner:
		return "sibling"
	case cand.Global:
		return "global"
	case cand.SharedWithOrg && cand.Org == agent.Org:
		return "org_shared"
	}
	return ""
}

// personGrant is why person p may add c: p owns c, c is p's contact, c is global, or c
// is shared with p's organization.
func (r *Reference) personGrant(p, c string) string {
	cand, isAgent := r.agents[c]
	switch {
	case c == p:
		return ""
	case isAgent && cand.Owner == p:
		return "owned"
	case r.contacts[p][c]:
		return "contact"
	case isAgent && cand.Global:
		return "global"
	case isAgent && cand.SharedWithOrg && cand.Org == r.people[p].Org:
		return "org_shared"
	}
	return ""
}

func (r *Reference) grant(actor, c string) string {
	if _, ok := r.agents[actor]; ok {
		return r.agentGrant(actor, c)
	}
	if _, ok := r.people[actor]; ok {
		return r.personGrant(actor, c)
	}
	return ""
}

func codes(cs ...string) []Reason {
	out := make([]Reason, 0, len(cs))
	for _, c := range cs {
		out = append(out, Reason{Code: c})
	}
	return out
}

// PeerVisible answers peer_visible: for one candidate, or the list when Candidate is
// empty. Reasons carry codes only.
func (r *Reference) PeerVisible(in PeerInput) Decision {
	d := Decision{Name: PeerVisible}
	_, isAgent := r.agents[in.Agent]
	switch {
	case in.Agent == "":
		d.Reasons = codes("invalid_input")
		return d
	case !isAgent:
		d.Reasons = codes("unknown_agent")
		return d
	case r.suspended(in.Agent):
		d.Reasons = codes("suspended")
		return d
	}
	inRoom := func(id string) bool { return in.Room != "" && r.rooms[in.Room][id] }
	if in.Candidate == "" {
		d.Allow = true
		d.Reasons = []Reason{}
		d.Peers = []Peer{}
		ids := slices.Concat(keys(r.agents), keys(r.people))
		for _, c := range ids {
			g := r.agentGrant(in.Agent, c)
			if g == "" || inRoom(c) || r.suspended(c) {
				continue
			}
			kind, handle := "agent", r.agents[c].Handle
			if p, ok := r.people[c]; ok {
				kind, handle = "person", p.Handle
			}
			d.Peers = append(d.Peers, Peer{ID: c, Kind: kind, Handle: handle, IsContact: r.contacts[in.Agent][c], Reason: g})
		}
		slices.SortFunc(d.Peers, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
		return d
	}
	c := in.Candidate
	d.IsContact = r.contacts[in.Agent][c]
	var deny []string
	if !r.exists(c) {
		deny = append(deny, "unknown_candidate")
	}
	if c == in.Agent {
		deny = append(deny, "self")
	}
	if r.suspended(c) {
		deny = append(deny, "candidate_suspended")
	}
	if inRoom(c) {
		deny = append(deny, "already_participant")
	}
	g := r.agentGrant(in.Agent, c)
	if r.exists(c) && c != in.Agent && g == "" {
		deny = append(deny, "not_peer")
	}
	if len(deny) > 0 {
		d.Reasons = codes(deny...)
		return d
	}
	d.Allow, d.Via, d.Reasons = true, g, codes(g)
	return d
}

// AddParticipant answers add_participant. Reasons carry codes only.
func (r *Reference) AddParticipant(in AddInput) Decision {
	d := Decision{Name: AddParticipant, IsContact: r.contacts[in.Actor][in.Participant]}
	if in.Actor == "" || in.Room == "" || in.Participant == "" {
		d.Reasons = codes("invalid_input")
		return d
	}
	g := r.grant(in.Actor, in.Participant)
	actorOrg, _ := r.orgOf(in.Actor)
	partOrg, _ := r.orgOf(in.Participant)
	// The first failed check decides, in the policy's order.
	checks := []struct {
		failed bool
		code   string
	}{
		{!r.exists(in.Actor), "unknown_actor"},
		{r.suspended(in.Actor), "suspended"},
		{!r.rooms[in.Room][in.Actor], "actor_not_in_room"},
		{in.Actor == in.Participant, "self"},
		{!r.exists(in.Participant), "unknown_participant"},
		{r.suspended(in.Participant), "participant_suspended"},
		{r.rooms[in.Room][in.Participant], "already_participant"},
		{g == "", "not_peer"},
		{r.crossOrgRequiresContact && !d.IsContact && actorOrg != partOrg, "cross_org_requires_contact"},
	}
	for _, c := range checks {
		if c.failed {
			d.Reasons = codes(c.code)
			return d
		}
	}
	d.Allow, d.Via, d.Reasons = true, g, codes(g)
	return d
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
