// Package directory is a process's one directory of agents and people: what their
// registrations (agent.registered, agent.updated, user.registered) say. The pipeline
// enriches events from it, the live hub names parties from it, the collector checks an
// organization's parties against it, and the policy replica feeds OPA's store from it.
//
// Its readers consume the events topic at different positions (the pipeline at its
// group's offsets, the live reader from there to the newest offset, the policy replica
// from ClickHouse's trail and then its own group). Each applies every registration it
// reads; the newest version of an entry wins (the event's time in milliseconds, a tie
// going to the later arrival), so applying an event twice, or in any order across
// readers, leaves one answer, and a reader that lags sees what the others read already.
//
// Two views, because the two sources are not trusted alike:
//   - Agent and Person are enrichment's view: the newest of what the stream said and
//     what ClickHouse's directory table holds (Load).
//   - Registered and OrgOf are the trail's view: registrations read from the stream or
//     replayed from the trail, never a row of the directory table. An attacker who can
//     write to ClickHouse can edit that table; what it says must not decide who a key
//     may write as, nor what the policies see.
//
// It also holds an operator's bindings of the identities OpenTelemetry senders choose
// (service.name, gen_ai.agent.id) to agents (agent.bound, agent.unbound): a span is an
// agent's only through one, and only while that agent is registered, by the trail's
// view, in the binding's organization (Bound).
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package directory

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// Kinds of entries, as the directory table stores them.
const (
	KindAgent = "agent"
	KindUser  = "user"
)

// entry is one agent or person: the newest row of either source, and the newest row
// a registration event gave.
type entry struct {
	newest   store.DirectoryRow
	trail    store.DirectoryRow
	hasTrail bool
}

// Directory holds the agents and people, and the bindings. Safe for concurrent use.
type Directory struct {
	mu     sync.RWMutex
	agents map[string]*entry
	people map[string]*entry
	// bindings are by organization, then kind and value; an unbinding stays as a
	// tombstone, so that a bind older than it, read later, changes nothing.
	bindings map[string]map[bindingKey]binding
}

// New returns an empty directory.
func New() *Directory {
	return &Directory{agents: map[string]*entry{}, people: map[string]*entry{}, bindings: map[string]map[bindingKey]binding{}}
}

// Parse reads a registration event as the directory row it makes. The version is the
// event's time in milliseconds.
func Parse(ev *schema.Event) (store.DirectoryRow, error) {
	if !schema.IsDirectoryType(ev.Type) {
		return store.DirectoryRow{}, fmt.Errorf("%s event %s is not a registration", ev.Type, ev.ID)
	}
	if ev.Subject == nil || ev.Subject.ID == "" {
		return store.DirectoryRow{}, fmt.Errorf("%s event %s has no subject", ev.Type, ev.ID)
	}
	row := store.DirectoryRow{
		ID: ev.Subject.ID, OrgID: ev.OrgID, EventID: ev.ID, UpdatedAt: ev.Time,
		Version: uint64(max(ev.Time.UnixMilli(), 0)),
	}
	if ev.Type == schema.TypeUserRegistered {
		var u schema.UserData
		if len(ev.Data) > 0 {
			if err := schema.DecodeData(ev.Data, &u); err != nil {
				return row, fmt.Errorf("cannot decode data of %s event %s: %w", ev.Type, ev.ID, err)
			}
		}
		row.Kind, row.Handle, row.Name = KindUser, u.Handle, u.Name
		if row.Handle == "" {
			row.Handle = ev.Subject.Handle
		}
		return row, nil
	}
	var a schema.AgentData
	if err := schema.DecodeData(ev.Data, &a); err != nil {
		return row, fmt.Errorf("cannot decode data of %s event %s: %w", ev.Type, ev.ID, err)
	}
	row.Kind, row.Handle, row.Name, row.OwnerID, row.Model, row.Desc = KindAgent, a.Handle, a.Name, a.OwnerID, a.Model, a.Description
	row.PersonalRegistryAccess, row.SharedWithOrg, row.Global, row.Listed, row.Suspended = a.PersonalRegistryAccess, a.SharedWithOrg, a.Global, a.Listed, a.Suspended
	return row, nil
}

// Apply records a registration read from the stream (or replayed from the trail) and
// returns the row it makes, which the pipeline stores whether or not it changed the
// directory: an older registration arriving after a newer one changes nothing.
func (d *Directory) Apply(ev *schema.Event) (store.DirectoryRow, error) {
	row, err := Parse(ev)
	if err != nil {
		return row, err
	}
	d.mu.Lock()
	d.putLocked(row, true)
	d.mu.Unlock()
	return row, nil
}

// Load adds the rows of ClickHouse's directory table to enrichment's view, where they
// are newer. The trail's view is left as it is.
func (d *Directory) Load(rows []store.DirectoryRow) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range rows {
		d.putLocked(r, false)
	}
}

func (d *Directory) putLocked(r store.DirectoryRow, fromTrail bool) {
	m := d.agents
	switch r.Kind {
	case KindAgent:
	case KindUser:
		m = d.people
	default:
		return
	}
	e := m[r.ID]
	if e == nil {
		e = &entry{newest: r}
		m[r.ID] = e
	} else if e.newest.Version <= r.Version {
		e.newest = r
	}
	if fromTrail && (!e.hasTrail || e.trail.Version <= r.Version) {
		e.trail, e.hasTrail = r, true
	}
}

// Agent returns enrichment's view of an agent.
func (d *Directory) Agent(id string) (store.DirectoryRow, bool) {
	return d.get(d.agents, id, false)
}

// Person returns enrichment's view of a person.
func (d *Directory) Person(id string) (store.DirectoryRow, bool) {
	return d.get(d.people, id, false)
}

// Registered returns the newest registration of an agent or a person that the stream
// or the trail gave.
func (d *Directory) Registered(id string) (store.DirectoryRow, bool) {
	if r, ok := d.get(d.agents, id, true); ok {
		return r, true
	}
	return d.get(d.people, id, true)
}

// OrgOf returns the organization an agent or a person is registered in, by the
// trail's view (the collector's check of who an organization's key may write as).
func (d *Directory) OrgOf(id string) (org string, known bool) {
	r, ok := d.Registered(id)
	return r.OrgID, ok
}

func (d *Directory) get(m map[string]*entry, id string, trail bool) (store.DirectoryRow, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e := m[id]
	switch {
	case e == nil:
		return store.DirectoryRow{}, false
	case trail:
		return e.trail, e.hasTrail
	default:
		return e.newest, true
	}
}

// Handle names a party of org for live payloads: its handle and whether it is a
// person. An id of another organization is unknown here.
func (d *Directory) Handle(org, id string) (handle string, person, ok bool) {
	if a, found := d.Agent(id); found && a.OrgID == org {
		return a.Handle, false, true
	}
	if p, found := d.Person(id); found && p.OrgID == org {
		return p.Handle, true, true
	}
	return "", false, false
}

// Len returns the number of agents and people known.
func (d *Directory) Len() (agents, people int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.agents), len(d.people)
}

type bindingKey struct{ kind, value string }

// binding is the newest agent.bound or agent.unbound of one identity.
type binding struct {
	agentID string
	unbound bool
	ms      int64  // the event's time in milliseconds: the newest wins
	eventID string // of two at the same millisecond, the greater id wins
	at      time.Time
}

// newer says whether b replaces old: a later millisecond, or the same one and a
// greater event id, so that every reader, whatever order it reads them in, keeps the
// same one. The same event again changes nothing.
func (b binding) newer(old binding) bool {
	if b.ms != old.ms {
		return b.ms > old.ms
	}
	return b.eventID > old.eventID
}

// Binding is one identity of an organization's senders bound to an agent.
type Binding struct {
	Kind    string    `json:"kind"` // schema.BindingAgent or schema.BindingService
	Value   string    `json:"value"`
	AgentID string    `json:"agent_id"`
	Time    time.Time `json:"time"` // of the agent.bound event
}

// ApplyBinding records an agent.bound or agent.unbound event of organization ev.OrgID.
// It trusts the event's origin: only bandplane's own producers write these types (the
// collector refuses them from every client), and its callers apply only events of
// bandplane's sources. The error names the field that is wrong.
func (d *Directory) ApplyBinding(ev *schema.Event) error {
	b, key, err := parseBinding(ev)
	if err != nil {
		return fmt.Errorf("cannot apply %s event %s: %w", ev.Type, ev.ID, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.bindings[ev.OrgID]
	if m == nil {
		m = map[bindingKey]binding{}
		d.bindings[ev.OrgID] = m
	}
	if old, ok := m[key]; !ok || b.newer(old) {
		m[key] = b
	}
	return nil
}

func parseBinding(ev *schema.Event) (binding, bindingKey, error) {
	if ev.Type != schema.TypeAgentBound && ev.Type != schema.TypeAgentUnbound {
		return binding{}, bindingKey{}, fmt.Errorf("type: %q is not %s or %s", ev.Type, schema.TypeAgentBound, schema.TypeAgentUnbound)
	}
	if ev.OrgID == "" {
		return binding{}, bindingKey{}, errors.New("org_id: missing (a binding belongs to an organization)")
	}
	if ev.Time.IsZero() {
		return binding{}, bindingKey{}, errors.New("time: missing (the newest binding wins)")
	}
	if len(ev.Data) == 0 {
		return binding{}, bindingKey{}, errors.New("data: missing")
	}
	var data schema.BindingData
	if err := schema.DecodeData(ev.Data, &data); err != nil {
		return binding{}, bindingKey{}, err // a *schema.FieldError naming the member
	}
	if err := data.ValidateFor(ev.Type); err != nil {
		return binding{}, bindingKey{}, err
	}
	if ev.Subject != nil && ev.Subject.ID != "" && data.AgentID != "" && ev.Subject.ID != data.AgentID {
		return binding{}, bindingKey{}, fmt.Errorf("subject.id: %q is not the agent of data.agent_id, %q", ev.Subject.ID, data.AgentID)
	}
	return binding{agentID: data.AgentID, unbound: ev.Type == schema.TypeAgentUnbound, ms: ev.Time.UnixMilli(), eventID: ev.ID,
		at: ev.Time.UTC().Truncate(time.Millisecond)}, bindingKey{data.Kind, data.Value}, nil
}

// Bound returns the agent an identity (kind, value) of org's senders is bound to: only
// if a binding is in force and its agent is registered in org by the trail's view
// (never by a row of the directory table), so that a binding made for an agent that
// is not registered yet takes effect when it registers, and one whose agent moved to
// another organization attributes nothing.
func (d *Directory) Bound(org, kind, value string) (agentID string, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	b, found := d.bindings[org][bindingKey{kind, value}]
	if !found || b.unbound {
		return "", false
	}
	e := d.agents[b.agentID]
	if e == nil || !e.hasTrail || e.trail.OrgID != org {
		return "", false
	}
	return b.agentID, true
}

// Bindings returns org's bindings in force, sorted by kind, then value, whether or not
// their agent is registered (Bound says which attribute).
func (d *Directory) Bindings(org string) []Binding {
	d.mu.RLock()
	out := make([]Binding, 0, len(d.bindings[org]))
	for k, b := range d.bindings[org] {
		if !b.unbound {
			out = append(out, Binding{Kind: k.kind, Value: k.value, AgentID: b.agentID, Time: b.at})
		}
	}
	d.mu.RUnlock()
	slices.SortFunc(out, func(a, b Binding) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Value, b.Value))
	})
	return out
}
