package directory_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/store"
)

var t0 = time.Date(2026, 11, 3, 9, 0, 0, 0, time.UTC)

func agentEvent(t *testing.T, id, org, model string, at time.Time) *schema.Event {
	t.Helper()
	data, err := json.Marshal(schema.AgentData{Handle: "alice/" + id, OwnerID: "u-alice", Model: model, Listed: true})
	require.NoError(t, err)
	return &schema.Event{ID: "ev-" + id + "-" + at.Format("150405.000"), Type: schema.TypeAgentRegistered, Time: at, OrgID: org,
		Subject: &schema.Party{ID: id, Type: schema.ActorAgent}, Data: data}
}

func userEvent(id, org, handle string, at time.Time) *schema.Event {
	return &schema.Event{ID: "ev-" + id, Type: schema.TypeUserRegistered, Time: at, OrgID: org,
		Subject: &schema.Party{ID: id, Type: schema.ActorUser, Handle: handle}}
}

func TestApplyNewestWinsWhateverTheOrder(t *testing.T) {
	older := agentEvent(t, "a1", "org-a", "claude-sonnet-4", t0)
	newer := agentEvent(t, "a1", "org-a", "claude-opus-4", t0.Add(time.Minute))

	// Two readers at different positions: one reads the update before the
	// registration, the other reads both in order, and each applies what it reads.
	d := directory.New()
	row, err := d.Apply(newer)
	require.NoError(t, err)
	assert.Equal(t, "claude-opus-4", row.Model)
	row, err = d.Apply(older)
	require.NoError(t, err)
	assert.Equal(t, "claude-sonnet-4", row.Model, "the row of the event itself is returned to store")
	_, err = d.Apply(newer)
	require.NoError(t, err)

	for name, get := range map[string]func(string) (store.DirectoryRow, bool){"Agent": d.Agent, "Registered": d.Registered} {
		a, ok := get("a1")
		require.True(t, ok, name)
		assert.Equal(t, "claude-opus-4", a.Model, name)
		assert.Equal(t, uint64(t0.Add(time.Minute).UnixMilli()), a.Version, name)
	}
	agents, people := d.Len()
	assert.Equal(t, [2]int{1, 0}, [2]int{agents, people})
}

func TestPeopleAndHandles(t *testing.T) {
	d := directory.New()
	_, err := d.Apply(userEvent("u-alice", "org-a", "alice", t0))
	require.NoError(t, err)
	_, err = d.Apply(agentEvent(t, "a1", "org-a", "m", t0))
	require.NoError(t, err)

	h, person, ok := d.Handle("org-a", "u-alice")
	assert.Equal(t, "alice", h)
	assert.True(t, person)
	assert.True(t, ok)
	h, person, ok = d.Handle("org-a", "a1")
	assert.Equal(t, "alice/a1", h)
	assert.False(t, person)
	assert.True(t, ok)
	_, _, ok = d.Handle("org-b", "a1")
	assert.False(t, ok, "another organization's party has no name here")

	org, known := d.OrgOf("u-alice")
	assert.Equal(t, "org-a", org)
	assert.True(t, known)
}

// An attacker who can write ClickHouse's directory table can change what enrichment
// reads, but not the trail's view: not who a key may write as, not what the policies
// see.
func TestSnapshotRowsNeverReachTheTrailView(t *testing.T) {
	d := directory.New()
	_, err := d.Apply(agentEvent(t, "a1", "org-a", "m", t0))
	require.NoError(t, err)
	d.Load([]store.DirectoryRow{
		{Kind: directory.KindAgent, ID: "a1", OrgID: "org-evil", Global: true, Version: ^uint64(0)},
		{Kind: directory.KindAgent, ID: "a-forged", OrgID: "org-evil"},
		{Kind: directory.KindUser, ID: "u-forged", OrgID: "org-evil"},
		{Kind: "table", ID: "x"}, // not a kind: ignored
	})

	a, ok := d.Agent("a1")
	require.True(t, ok)
	assert.Equal(t, "org-evil", a.OrgID, "enrichment reads the table's newest row")

	r, ok := d.Registered("a1")
	require.True(t, ok)
	assert.Equal(t, "org-a", r.OrgID)
	assert.False(t, r.Global)
	org, known := d.OrgOf("a1")
	assert.Equal(t, "org-a", org)
	assert.True(t, known)
	for _, id := range []string{"a-forged", "u-forged", "x"} {
		_, known := d.OrgOf(id)
		assert.False(t, known, id)
		_, ok := d.Registered(id)
		assert.False(t, ok, id)
	}

	// A newer registration from the stream still updates the trail's view.
	_, err = d.Apply(agentEvent(t, "a1", "org-a", "m2", t0.Add(time.Hour)))
	require.NoError(t, err)
	r, _ = d.Registered("a1")
	assert.Equal(t, "m2", r.Model)
}

func TestParseRefusesWhatIsNotARegistration(t *testing.T) {
	for name, ev := range map[string]*schema.Event{
		"another type":  {ID: "e1", Type: schema.TypeMessageCreated, Subject: &schema.Party{ID: "a1"}},
		"no subject":    {ID: "e2", Type: schema.TypeAgentRegistered},
		"no subject id": {ID: "e3", Type: schema.TypeAgentRegistered, Subject: &schema.Party{}},
		"bad data":      {ID: "e4", Type: schema.TypeAgentUpdated, Subject: &schema.Party{ID: "a1"}, Data: json.RawMessage(`[1,2]`)},
		"bad user data": {ID: "e5", Type: schema.TypeUserRegistered, Subject: &schema.Party{ID: "u1"}, Data: json.RawMessage(`"x"`)},
	} {
		t.Run(name, func(t *testing.T) {
			d := directory.New()
			_, err := d.Apply(ev)
			require.Error(t, err)
			assert.Contains(t, err.Error(), ev.ID, "the error names the event")
			agents, people := d.Len()
			assert.Zero(t, agents+people)
		})
	}
}

func TestUserHandleFallsBackToTheSubject(t *testing.T) {
	row, err := directory.Parse(userEvent("u1", "org-a", "bob", t0))
	require.NoError(t, err)
	assert.Equal(t, directory.KindUser, row.Kind)
	assert.Equal(t, "bob", row.Handle)
}

func TestConcurrentReaders(t *testing.T) {
	d := directory.New()
	evs := make([]*schema.Event, 50)
	for i := range evs {
		evs[i] = agentEvent(t, "a1", "org-a", "m", t0.Add(time.Duration(i)*time.Second))
	}
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			for i := range evs {
				// Each reader applies the same events, in its own order.
				_, err := d.Apply(evs[(i*(r+1))%len(evs)])
				assert.NoError(t, err)
				d.Agent("a1")
				d.OrgOf("a1")
			}
		})
	}
	wg.Wait()
	r, ok := d.Registered("a1")
	require.True(t, ok)
	assert.Equal(t, uint64(t0.Add(49*time.Second).UnixMilli()), r.Version)
}
