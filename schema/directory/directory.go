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
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package directory

import (
	"fmt"
	"sync"

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

// Directory holds the agents and people. Safe for concurrent use.
type Directory struct {
	mu     sync.RWMutex
	agents map[string]*entry
	people map[string]*entry
}

// New returns an empty directory.
func New() *Directory {
	return &Directory{agents: map[string]*entry{}, people: map[string]*entry{}}
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
