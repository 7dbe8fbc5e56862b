package directory_test

import (
	"encoding/json"
	"fmt"
	"strings"
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

func bindEvent(t *testing.T, typ, id, org, kind, value, agent string, at time.Time) *schema.Event {
	t.Helper()
	data, err := json.Marshal(schema.BindingData{Kind: kind, Value: value, AgentID: agent})
	require.NoError(t, err)
	ev := &schema.Event{ID: id, Type: typ, Time: at, OrgID: org, Actor: schema.Party{ID: "cli:ops", Type: schema.ActorSystem},
		Source: "bandplane-policy", SchemaVersion: schema.Version, Data: data}
	if agent != "" {
		ev.Subject = &schema.Party{ID: agent, Type: schema.ActorAgent}
	}
	return ev
}

func TestBindingAttributesToARegisteredAgentOfItsOrg(t *testing.T) {
	d := directory.New()
	_, err := d.Apply(agentEvent(t, "a1", "org-a", "m", t0))
	require.NoError(t, err)
	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentBound, "b1", "org-a", schema.BindingService, "checkout", "a1", t0.Add(time.Minute))))
	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentBound, "b2", "org-a", schema.BindingAgent, "gen-ai-7", "a1", t0.Add(2*time.Minute))))

	agent, ok := d.Bound("org-a", schema.BindingService, "checkout")
	assert.True(t, ok)
	assert.Equal(t, "a1", agent)
	agent, ok = d.Bound("org-a", schema.BindingAgent, "gen-ai-7")
	assert.True(t, ok)
	assert.Equal(t, "a1", agent)

	for name, q := range map[string][3]string{
		"another kind":         {"org-a", schema.BindingAgent, "checkout"},
		"another value":        {"org-a", schema.BindingService, "Checkout"},
		"another organization": {"org-b", schema.BindingService, "checkout"},
	} {
		_, ok := d.Bound(q[0], q[1], q[2])
		assert.False(t, ok, name)
	}

	assert.Equal(t, []directory.Binding{
		{Kind: schema.BindingAgent, Value: "gen-ai-7", AgentID: "a1", Time: t0.Add(2 * time.Minute)},
		{Kind: schema.BindingService, Value: "checkout", AgentID: "a1", Time: t0.Add(time.Minute)},
	}, d.Bindings("org-a"))
	assert.Empty(t, d.Bindings("org-b"))

	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentUnbound, "u1", "org-a", schema.BindingService, "checkout", "", t0.Add(time.Hour))))
	_, ok = d.Bound("org-a", schema.BindingService, "checkout")
	assert.False(t, ok, "unbound")
	assert.Len(t, d.Bindings("org-a"), 1)
}

// A binding made in one organization for an agent registered in another attributes
// nothing: an operator of org-b cannot make org-b's spans count against org-a's agent,
// nor the other way round. And an agent that moves leaves its bindings behind.
func TestBindingToAnAgentOfAnotherOrgIsNotBound(t *testing.T) {
	d := directory.New()
	_, err := d.Apply(agentEvent(t, "a1", "org-a", "m", t0))
	require.NoError(t, err)
	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentBound, "b1", "org-b", schema.BindingService, "checkout", "a1", t0.Add(time.Minute))))
	_, ok := d.Bound("org-b", schema.BindingService, "checkout")
	assert.False(t, ok)
	_, ok = d.Bound("org-a", schema.BindingService, "checkout")
	assert.False(t, ok, "a binding belongs to its event's organization only")
	assert.Len(t, d.Bindings("org-b"), 1, "listed all the same: the operator sees what was recorded")

	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentBound, "b2", "org-a", schema.BindingService, "checkout", "a1", t0.Add(time.Minute))))
	_, ok = d.Bound("org-a", schema.BindingService, "checkout")
	require.True(t, ok)
	_, err = d.Apply(agentEvent(t, "a1", "org-c", "m", t0.Add(time.Hour)))
	require.NoError(t, err)
	_, ok = d.Bound("org-a", schema.BindingService, "checkout")
	assert.False(t, ok, "the agent is registered in org-c now")
}

// The directory table (Load) is not the trail: a forged row of it never makes an agent
// bound, whatever organization the row says.
func TestBindingNeedsTheTrailsRegistration(t *testing.T) {
	d := directory.New()
	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentBound, "b1", "org-a", schema.BindingService, "checkout", "a-late", t0.Add(time.Minute))))
	_, ok := d.Bound("org-a", schema.BindingService, "checkout")
	assert.False(t, ok, "not registered yet")

	d.Load([]store.DirectoryRow{{Kind: directory.KindAgent, ID: "a-late", OrgID: "org-a", Version: ^uint64(0)}})
	_, ok = d.Bound("org-a", schema.BindingService, "checkout")
	assert.False(t, ok, "a directory table row is enrichment's only")

	// Registrations and bindings travel on different partitions: the registration may
	// come later, even timed earlier.
	_, err := d.Apply(agentEvent(t, "a-late", "org-a", "m", t0.Add(time.Hour)))
	require.NoError(t, err)
	agent, ok := d.Bound("org-a", schema.BindingService, "checkout")
	assert.True(t, ok)
	assert.Equal(t, "a-late", agent)

	// A person with the id is not an agent.
	require.NoError(t, d.ApplyBinding(bindEvent(t, schema.TypeAgentBound, "b2", "org-a", schema.BindingAgent, "x", "u-alice", t0)))
	_, err = d.Apply(userEvent("u-alice", "org-a", "alice", t0))
	require.NoError(t, err)
	_, ok = d.Bound("org-a", schema.BindingAgent, "x")
	assert.False(t, ok)
}

// Readers meet the binds and unbinds of an identity in different orders (the replica
// replays ClickHouse, then follows the topic; a retried CLI writes the same event
// twice): each ends with the newest, by the event's time and, at the same millisecond,
// by its id.
func TestBindingNewestWinsWhateverTheOrder(t *testing.T) {
	bind := func(id, agent string, at time.Time) *schema.Event {
		return bindEvent(t, schema.TypeAgentBound, id, "org-a", schema.BindingService, "checkout", agent, at)
	}
	unbind := func(id string, at time.Time) *schema.Event {
		return bindEvent(t, schema.TypeAgentUnbound, id, "org-a", schema.BindingService, "checkout", "", at)
	}
	for name, c := range map[string]struct {
		events []*schema.Event
		want   string // "" for not bound
	}{
		"an unbind older than the bind is ignored":  {[]*schema.Event{bind("b1", "a1", t0.Add(time.Minute)), unbind("u1", t0)}, "a1"},
		"a bind older than the unbind is ignored":   {[]*schema.Event{unbind("u1", t0.Add(time.Minute)), bind("b1", "a1", t0)}, ""},
		"the newer bind wins, read second":          {[]*schema.Event{bind("b1", "a1", t0), bind("b2", "a2", t0.Add(time.Millisecond))}, "a2"},
		"the newer bind wins, read first":           {[]*schema.Event{bind("b2", "a2", t0.Add(time.Millisecond)), bind("b1", "a1", t0)}, "a2"},
		"same millisecond: the greater id, first":   {[]*schema.Event{bind("b-2", "a2", t0), bind("b-1", "a1", t0)}, "a2"},
		"same millisecond: the greater id, second":  {[]*schema.Event{bind("b-1", "a1", t0), bind("b-2", "a2", t0)}, "a2"},
		"sub-millisecond times are one millisecond": {[]*schema.Event{bind("b-2", "a2", t0.Add(100*time.Microsecond)), bind("b-1", "a1", t0.Add(900*time.Microsecond))}, "a2"},
		"the same event twice":                      {[]*schema.Event{bind("b1", "a1", t0), unbind("u1", t0.Add(time.Second)), bind("b1", "a1", t0)}, ""},
		"rebound after an unbind":                   {[]*schema.Event{bind("b1", "a1", t0), unbind("u1", t0.Add(time.Second)), bind("b2", "a2", t0.Add(2*time.Second))}, "a2"},
	} {
		t.Run(name, func(t *testing.T) {
			d := directory.New()
			for _, id := range []string{"a1", "a2"} {
				_, err := d.Apply(agentEvent(t, id, "org-a", "m", t0))
				require.NoError(t, err)
			}
			for _, ev := range c.events {
				require.NoError(t, d.ApplyBinding(ev))
			}
			agent, ok := d.Bound("org-a", schema.BindingService, "checkout")
			assert.Equal(t, c.want, agent)
			assert.Equal(t, c.want != "", ok)
		})
	}
}

func TestApplyBindingNamesWhatIsWrong(t *testing.T) {
	ok := func() *schema.Event {
		return bindEvent(t, schema.TypeAgentBound, "b1", "org-a", schema.BindingService, "checkout", "a1", t0)
	}
	with := func(f func(ev *schema.Event)) *schema.Event { ev := ok(); f(ev); return ev }
	data := func(s string) *schema.Event { return with(func(ev *schema.Event) { ev.Data = json.RawMessage(s) }) }
	for name, c := range map[string]struct {
		ev    *schema.Event
		field string
	}{
		"another type":       {with(func(ev *schema.Event) { ev.Type = schema.TypeAgentSuspended }), "type"},
		"no organization":    {with(func(ev *schema.Event) { ev.OrgID = "" }), "org_id"},
		"no time":            {with(func(ev *schema.Event) { ev.Time = time.Time{} }), "time"},
		"no data":            {with(func(ev *schema.Event) { ev.Data = nil }), "data"},
		"data not an object": {data(`["service"]`), "data"},
		"kind not a string":  {data(`{"kind":1,"value":"x","agent_id":"a1"}`), "data.kind"},
		"no kind":            {data(`{"value":"x","agent_id":"a1"}`), "data.kind"},
		"unknown kind":       {data(`{"kind":"host","value":"x","agent_id":"a1"}`), "data.kind"},
		"no value":           {data(`{"kind":"service","agent_id":"a1"}`), "data.value"},
		"value too long":     {data(`{"kind":"service","value":"` + strings.Repeat("v", schema.MaxIDBytes+1) + `","agent_id":"a1"}`), "data.value"},
		"value with control": {data(`{"kind":"service","value":"check\u0007out","agent_id":"a1"}`), "data.value"},
		"value with C1":      {data(`{"kind":"service","value":"check\u0085out","agent_id":"a1"}`), "data.value"},
		"value not UTF-8":    {data("{\"kind\":\"service\",\"value\":\"check\xffout\",\"agent_id\":\"a1\"}"), "data.value"},
		"bound without agent": {with(func(ev *schema.Event) {
			ev.Subject, ev.Data = nil, json.RawMessage(`{"kind":"service","value":"x"}`)
		}), "data.agent_id"},
		"agent too long":  {data(`{"kind":"service","value":"x","agent_id":"` + strings.Repeat("a", schema.MaxIDBytes+1) + `"}`), "data.agent_id"},
		"another subject": {with(func(ev *schema.Event) { ev.Subject.ID = "a2" }), "subject.id"},
	} {
		t.Run(name, func(t *testing.T) {
			d := directory.New()
			_, err := d.Apply(agentEvent(t, "a1", "org-a", "m", t0))
			require.NoError(t, err)
			err = d.ApplyBinding(c.ev)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.field+": ", "the error names the field")
			assert.Contains(t, err.Error(), c.ev.ID, "and the event")
			assert.Empty(t, d.Bindings(c.ev.OrgID))
			_, bound := d.Bound("org-a", schema.BindingService, "checkout")
			assert.False(t, bound)
		})
	}
}

func TestBindingDataValidate(t *testing.T) {
	assert.NoError(t, schema.BindingData{Kind: schema.BindingAgent, Value: "gen-ai-7", AgentID: "a1"}.Validate())
	assert.NoError(t, schema.BindingData{Kind: schema.BindingService, Value: "checkout"}.ValidateFor(schema.TypeAgentUnbound),
		"an unbinding need not name the agent")
	err := schema.BindingData{Kind: schema.BindingService, Value: "checkout"}.Validate()
	require.Error(t, err)
	assert.ErrorIs(t, err, schema.ErrInvalid)
	assert.Contains(t, err.Error(), "data.agent_id: missing")
	err = schema.BindingData{Kind: schema.BindingService, Value: "checkout", AgentID: "a\x00"}.ValidateFor(schema.TypeAgentUnbound)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "data.agent_id: control character")
	err = schema.BindingData{Kind: schema.BindingService, Value: "checkout", AgentID: "a1"}.ValidateFor(schema.TypeAgentSuspended)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "type: ")
}

func TestBindingsConcurrentWithReads(t *testing.T) {
	d := directory.New()
	_, err := d.Apply(agentEvent(t, "a1", "org-a", "m", t0))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			for i := range 50 {
				at := t0.Add(time.Duration((i*(r+1))%50) * time.Second)
				typ, agent := schema.TypeAgentBound, "a1"
				if i%2 == 1 {
					typ, agent = schema.TypeAgentUnbound, ""
				}
				assert.NoError(t, d.ApplyBinding(bindEvent(t, typ, fmt.Sprintf("e-%d-%d", r, i), "org-a", schema.BindingService, "checkout", agent, at)))
				d.Bound("org-a", schema.BindingService, "checkout")
				d.Bindings("org-a")
			}
		})
	}
	wg.Wait()
	_, ok := d.Bound("org-a", schema.BindingService, "checkout")
	assert.False(t, ok, "the newest is an unbinding (at 49 s, of reader 0)")
}
