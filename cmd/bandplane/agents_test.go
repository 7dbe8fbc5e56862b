package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
)

func agentsCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"agents"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// Bad flags and arguments exit 2 naming the flag, before any connection (the stack
// flags point nowhere).
func TestAgentsBadFlags(t *testing.T) {
	nowhere := []string{"--clickhouse", "127.0.0.1:1", "--kafka", "127.0.0.1:1"}
	long := strings.Repeat("x", schema.MaxIDBytes+1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: bandplane agents"},
		{[]string{"rebind"}, `unknown command "rebind"`},
		{[]string{"bind", "--agent", "a1", "--service", "checkout"}, "bandplane agents bind: --org is required"},
		{[]string{"bind", "--org", "acme", "--service", "checkout"}, "--agent is required"},
		{[]string{"bind", "--org", "acme", "--agent", "a1"}, "--service or --agent-key is required"},
		{[]string{"bind", "--org", "acme", "--agent", "a1", "--service", "checkout", "--agent-key", "k"}, "--service and --agent-key: give one of them, not both"},
		{[]string{"bind", "--org", "*", "--agent", "a1", "--service", "checkout"}, `--org: "*" is reserved`},
		{[]string{"bind", "--org", "ac\x07me", "--agent", "a1", "--service", "checkout"}, "--org: control character 0x07"},
		{[]string{"bind", "--org", "acme", "--agent", "a1", "--service", long}, "--service: 257 bytes is longer than the limit of 256"},
		{[]string{"bind", "--org", "acme", "--agent", "a1", "--agent-key", "k\x85ey"}, "--agent-key: invalid UTF-8"},
		{[]string{"bind", "--org", "acme", "--agent", "a1", "--agent-key", "k\u0085ey"}, "--agent-key: control character U+0085"},
		{[]string{"bind", "--org", "acme", "--agent", long, "--service", "checkout"}, "--agent: 257 bytes is longer than the limit of 256"},
		{[]string{"bind", "--org", "acme", "--agent", "a1", "--service", "checkout", "extra"}, `unexpected argument "extra"`},
		{[]string{"bind", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"unbind", "--service", "checkout"}, "bandplane agents unbind: --org is required"},
		{[]string{"unbind", "--org", "acme"}, "--service or --agent-key is required"},
		{[]string{"unbind", "--org", "acme", "--service", long}, "--service: 257 bytes"},
		{[]string{"unbind", "--org", "acme", "--agent", "a1", "--service", "checkout"}, "flag provided but not defined: -agent"},
		{[]string{"list"}, "bandplane agents list: --org is required"},
		{[]string{"list", "--org", "acme", "extra"}, `unexpected argument "extra"`},
	} {
		code, stdout, stderr := agentsCmd(t, append(c.args, nowhere...)...)
		assert.Equal(t, 2, code, "%q: %s", c.args, stderr)
		assert.Contains(t, stderr, c.want, "%q", c.args)
		assert.Empty(t, stdout, "%q", c.args)
	}
	code, _, stderr := agentsCmd(t, "bind", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "--org ORG --agent AGENT_ID (--service NAME | --agent-key VALUE)")
}

// Without a server nothing is written: bind checks the agent first, and says what could
// not be reached, on stderr, exit 1.
func TestAgentsStackDown(t *testing.T) {
	for _, args := range [][]string{
		{"list", "--org", "acme"},
		{"bind", "--org", "acme", "--agent", "a1", "--service", "checkout"},
		{"unbind", "--org", "acme", "--agent-key", "k"},
	} {
		code, stdout, stderr := agentsCmd(t, append(args, "--clickhouse", "127.0.0.1:1", "--kafka", "127.0.0.1:1", "--clickhouse-timeout", "2s")...)
		assert.Equal(t, 1, code, "%q: %s", args, stderr)
		assert.Empty(t, stdout, "%q", args)
		assert.Contains(t, stderr, "bandplane agents: ", "%q", args)
		assert.Contains(t, stderr, "127.0.0.1:1", "%q", args)
	}
}

var bindAt = time.Date(2026, 11, 3, 9, 0, 0, 123_456_789, time.UTC)

// What bind and unbind write is a valid event of bandplane's own, which no client may
// write, and which the directory's model applies.
func TestBindingEventIsBandplanesOwn(t *testing.T) {
	d := schema.BindingData{Kind: schema.BindingService, Value: "checkout", AgentID: "a1"}
	ev := bindingEvent(schema.TypeAgentBound, "acme", d, "ops@host", bindAt)
	require.NoError(t, ev.Validate())
	assert.Equal(t, "binding-acme-service-checkout-a1-"+ms(bindAt), ev.ID)
	assert.Equal(t, bindAt.Truncate(time.Millisecond), ev.Time)
	assert.Equal(t, "acme", ev.OrgID)
	assert.Equal(t, schema.Party{ID: "cli:ops@host", Type: schema.ActorSystem}, ev.Actor)
	assert.Equal(t, &schema.Party{ID: "a1", Type: schema.ActorAgent}, ev.Subject)
	assert.True(t, schema.OwnSource(ev.Source), ev.Source)
	assert.True(t, schema.OwnType(ev.Type), "the collector refuses it from every client")
	assert.JSONEq(t, `{"kind":"service","value":"checkout","agent_id":"a1"}`, string(ev.Data))

	unbind := bindingEvent(schema.TypeAgentUnbound, "acme", schema.BindingData{Kind: schema.BindingService, Value: "checkout"}, "ops@host", bindAt)
	require.NoError(t, unbind.Validate())
	assert.Nil(t, unbind.Subject, "no agent to name")
	assert.NotEqual(t, ev.ID, unbind.ID, "a bind and an unbind of one millisecond are two events")
	other := bindingEvent(schema.TypeAgentBound, "acme", schema.BindingData{Kind: schema.BindingService, Value: "checkout", AgentID: "a2"}, "ops@host", bindAt)
	assert.NotEqual(t, ev.ID, other.ID, "so are two binds of one millisecond")

	dir := directory.New()
	reg, err := json.Marshal(schema.AgentData{Handle: "alice/a1", OwnerID: "u-alice"})
	require.NoError(t, err)
	_, err = dir.Apply(&schema.Event{ID: "r1", Type: schema.TypeAgentRegistered, Time: bindAt.Add(-time.Hour), OrgID: "acme",
		Subject: &schema.Party{ID: "a1", Type: schema.ActorAgent}, Data: reg})
	require.NoError(t, err)
	require.NoError(t, dir.ApplyBinding(&ev))
	agent, ok := dir.Bound("acme", schema.BindingService, "checkout")
	assert.True(t, ok)
	assert.Equal(t, "a1", agent)
	require.NoError(t, dir.ApplyBinding(&unbind))
	_, ok = dir.Bound("acme", schema.BindingService, "checkout")
	assert.False(t, ok, "at the same millisecond the greater id wins: unbinding-… sorts after binding-…")
	require.NoError(t, dir.ApplyBinding(&ev))
	_, ok = dir.Bound("acme", schema.BindingService, "checkout")
	assert.False(t, ok, "whatever the order")
	later := bindingEvent(schema.TypeAgentBound, "acme", d, "ops@host", bindAt.Add(time.Millisecond))
	require.NoError(t, dir.ApplyBinding(&later))
	_, ok = dir.Bound("acme", schema.BindingService, "checkout")
	assert.True(t, ok)
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// Ids stay within the limit whatever the organization and value, distinct per part.
func TestBindingEventIDFitsTheLimit(t *testing.T) {
	long := strings.Repeat("o", schema.MaxIDBytes)
	seen := map[string]bool{}
	for _, c := range []struct{ org, value, agent string }{
		{long, "checkout", "a1"}, {long, "checkout", "a2"}, {"acme", long, "a1"}, {"acme", long[1:], "a1"},
	} {
		for _, typ := range []string{schema.TypeAgentBound, schema.TypeAgentUnbound} {
			ev := bindingEvent(typ, c.org, schema.BindingData{Kind: schema.BindingAgent, Value: c.value, AgentID: c.agent}, "ops", bindAt)
			assert.LessOrEqual(t, len(ev.ID), schema.MaxIDBytes, ev.ID)
			require.NoError(t, ev.Validate())
			assert.False(t, seen[ev.ID], "one id for two different changes: %s", ev.ID)
			seen[ev.ID] = true
		}
	}
	a := bindingEvent(schema.TypeAgentBound, long, schema.BindingData{Kind: schema.BindingAgent, Value: "v", AgentID: "a1"}, "ops", bindAt)
	b := bindingEvent(schema.TypeAgentBound, long, schema.BindingData{Kind: schema.BindingAgent, Value: "v", AgentID: "a1"}, "someone else", bindAt)
	assert.Equal(t, a.ID, b.ID, "the same change at the same millisecond: the same id")
}

// list folds what the trail holds as the replica does: newest wins, and rows that are
// not bandplane's, of another organization or invalid are skipped and counted.
func TestFoldBindings(t *testing.T) {
	stored := func(ev schema.Event) query.Event {
		q := query.Event{ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type),
			Source: ev.Source, SchemaVersion: uint16(ev.SchemaVersion), Data: string(ev.Data)}
		if ev.Subject != nil {
			q.SubjectID, q.SubjectType = ev.Subject.ID, string(ev.Subject.Type)
		}
		return q
	}
	svc := func(agent string) schema.BindingData {
		return schema.BindingData{Kind: schema.BindingService, Value: "checkout", AgentID: agent}
	}
	bound := bindingEvent(schema.TypeAgentBound, "acme", svc("a1"), "ops", bindAt)
	rebound := bindingEvent(schema.TypeAgentBound, "acme", svc("a2"), "ops", bindAt.Add(time.Minute))
	oldUnbind := bindingEvent(schema.TypeAgentUnbound, "acme", svc(""), "ops", bindAt.Add(-time.Minute))
	keyBound := bindingEvent(schema.TypeAgentBound, "acme", schema.BindingData{Kind: schema.BindingAgent, Value: "gen-ai-7", AgentID: "a3"}, "ops", bindAt)
	forged := bindingEvent(schema.TypeAgentBound, "acme", svc("a-mallory"), "ops", bindAt.Add(time.Hour))
	forged.Source = "router"
	elsewhere := bindingEvent(schema.TypeAgentBound, "other", schema.BindingData{Kind: schema.BindingService, Value: "billing", AgentID: "a9"}, "ops", bindAt)
	invalid := bindingEvent(schema.TypeAgentBound, "acme", schema.BindingData{Kind: schema.BindingService, Value: "x", AgentID: "a1"}, "ops", bindAt)
	invalid.Data = json.RawMessage(`{"kind":"host","value":"x","agent_id":"a1"}`)

	var rows []query.Event
	for _, ev := range []schema.Event{rebound, forged, keyBound, bound, oldUnbind, elsewhere, invalid} { // newest first, as read
		rows = append(rows, stored(ev))
	}
	inForce, skipped := foldBindings("acme", rows)
	assert.Equal(t, 3, skipped)
	assert.Equal(t, []directory.Binding{
		{Kind: schema.BindingAgent, Value: "gen-ai-7", AgentID: "a3", Time: bindAt.Truncate(time.Millisecond)},
		{Kind: schema.BindingService, Value: "checkout", AgentID: "a2", Time: bindAt.Add(time.Minute).Truncate(time.Millisecond)},
	}, inForce)
}

func TestPrintBindings(t *testing.T) {
	list := []listedBinding{
		{Binding: directory.Binding{Kind: schema.BindingService, Value: "checkout", AgentID: "a1", Time: bindAt}, Handle: "alice/coder", Name: "Coder"},
		{Binding: directory.Binding{Kind: schema.BindingAgent, Value: "k", AgentID: "a-gone", Time: bindAt}},
	}
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out}
	require.NoError(t, printBindings(e, list, false))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 2)
	assert.JSONEq(t, `{"kind":"service","value":"checkout","agent_id":"a1","time":"2026-11-03T09:00:00.123456789Z","handle":"alice/coder","name":"Coder"}`, lines[0])
	assert.JSONEq(t, `{"kind":"agent","value":"k","agent_id":"a-gone","time":"2026-11-03T09:00:00.123456789Z"}`, lines[1])

	out.Reset()
	require.NoError(t, printBindings(e, list, true))
	rows := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, rows, 3)
	assert.Equal(t, []string{"KIND", "VALUE", "AGENT", "HANDLE", "NAME", "BOUND"}, strings.Fields(rows[0]))
	assert.Equal(t, []string{"service", "checkout", "a1", "@alice/coder", "Coder", "2026-11-03T09:00:00Z"}, strings.Fields(rows[1]))
	assert.Equal(t, []string{"agent", "k", "a-gone", "-", "-", "2026-11-03T09:00:00Z"}, strings.Fields(rows[2]))
}
