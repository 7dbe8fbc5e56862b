package ingest

import (
	"fmt"
	"sync"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// Agent is what enrichment needs to know of an agent.
type Agent struct {
	ID, OrgID, OwnerID, Handle, Model string
	Version                           uint64
}

// Person is what enrichment needs to know of a person.
type Person struct {
	ID, OrgID, Handle string
	Version           uint64
}

// Directory maps agents to owners, organizations and models, and people to
// organizations. It is built from directory events (agent.registered, agent.updated,
// user.registered) and bootstrapped from the ClickHouse snapshot at start. Safe for
// concurrent use.
type Directory struct {
	mu     sync.RWMutex
	agents map[string]Agent
	people map[string]Person
}

func NewDirectory() *Directory {
	return &Directory{agents: map[string]Agent{}, people: map[string]Person{}}
}

func (d *Directory) Agent(id string) (Agent, bool) {
	d.mu.RLock()
	a, ok := d.agents[id]
	d.mu.RUnlock()
	return a, ok
}

func (d *Directory) Person(id string) (Person, bool) {
	d.mu.RLock()
	p, ok := d.people[id]
	d.mu.RUnlock()
	return p, ok
}

// Len returns the number of agents and people known.
func (d *Directory) Len() (agents, people int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.agents), len(d.people)
}

// Load replaces entries with the snapshot's rows where those are newer.
func (d *Directory) Load(rows []store.DirectoryRow) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range rows {
		d.putLocked(r)
	}
}

func (d *Directory) putLocked(r store.DirectoryRow) bool {
	switch r.Kind {
	case "agent":
		if cur, ok := d.agents[r.ID]; ok && cur.Version > r.Version {
			return false
		}
		d.agents[r.ID] = Agent{ID: r.ID, OrgID: r.OrgID, OwnerID: r.OwnerID, Handle: r.Handle, Model: r.Model, Version: r.Version}
	case "user":
		if cur, ok := d.people[r.ID]; ok && cur.Version > r.Version {
			return false
		}
		d.people[r.ID] = Person{ID: r.ID, OrgID: r.OrgID, Handle: r.Handle, Version: r.Version}
	}
	return true
}

// Apply records a directory event and returns the snapshot row to store. An older
// registration arriving after a newer one is stored but does not change the directory.
// The version is the event time in milliseconds.
func (d *Directory) Apply(ev *schema.Event) (store.DirectoryRow, error) {
	if ev.Subject == nil || ev.Subject.ID == "" {
		return store.DirectoryRow{}, fmt.Errorf("%s event %s has no subject", ev.Type, ev.ID)
	}
	row := store.DirectoryRow{
		ID: ev.Subject.ID, OrgID: ev.OrgID, EventID: ev.ID, UpdatedAt: ev.Time,
		Version: uint64(ev.Time.UnixMilli()),
	}
	if ev.Type == schema.TypeUserRegistered {
		var u schema.UserData
		if len(ev.Data) > 0 {
			if err := schema.DecodeData(ev.Data, &u); err != nil {
				return row, fmt.Errorf("cannot decode data of %s event %s: %w", ev.Type, ev.ID, err)
			}
		}
		row.Kind, row.Handle, row.Name = "user", u.Handle, u.Name
		if row.Handle == "" {
			row.Handle = ev.Subject.Handle
		}
	} else {
		var a schema.AgentData
		if err := schema.DecodeData(ev.Data, &a); err != nil {
			return row, fmt.Errorf("cannot decode data of %s event %s: %w", ev.Type, ev.ID, err)
		}
		row.Kind, row.Handle, row.Name, row.OwnerID, row.Model, row.Desc = "agent", a.Handle, a.Name, a.OwnerID, a.Model, a.Description
		row.PersonalRegistryAccess, row.SharedWithOrg, row.Global, row.Listed, row.Suspended = a.PersonalRegistryAccess, a.SharedWithOrg, a.Global, a.Listed, a.Suspended
	}
	d.mu.Lock()
	d.putLocked(row)
	d.mu.Unlock()
	return row, nil
}
