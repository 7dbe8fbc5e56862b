package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema"
)

var day = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)

// trail is a directory of two sibling agents and one peer_visible decision about them,
// allowed live, recorded at the position after the registrations.
func trail(t *testing.T) *replay.Memory {
	t.Helper()
	at := day.Add(time.Hour)
	var recs []replay.Record
	add := func(typ string, actor schema.Party, subject *schema.Party, data any) {
		raw, err := json.Marshal(data)
		require.NoError(t, err)
		recs = append(recs, replay.Record{Partition: 0, Offset: int64(len(recs)), Event: schema.Event{ID: typ + "-" + subject.ID, Type: typ, Time: at,
			OrgID: "acme", Actor: actor, Subject: subject, Source: "t", SchemaVersion: schema.Version, Data: raw}})
	}
	ola := schema.Party{ID: "u-ola", Type: schema.ActorUser}
	add(schema.TypeUserRegistered, schema.Party{ID: "sys", Type: schema.ActorSystem}, &ola, schema.UserData{Handle: "ola"})
	for _, a := range []string{"one", "two"} {
		sub := schema.Party{ID: "a-" + a, Type: schema.ActorAgent}
		add(schema.TypeAgentRegistered, ola, &sub, schema.AgentData{Handle: "ola/" + a, OwnerID: "u-ola", PersonalRegistryAccess: true, Listed: true})
	}
	in, _ := json.Marshal(policy.PeerInput{Agent: "a-one", Candidate: "a-two"})
	data, _ := json.Marshal(api.DecidedData{Decision: policy.PeerVisible, Allow: true, Reasons: []policy.Reason{{Code: "sibling"}},
		Input: in, Position: policy.Position{0: int64(len(recs))}, DecidedAt: at.Add(time.Second)})
	recs = append(recs, replay.Record{Partition: 0, Offset: int64(len(recs)), Event: schema.Event{ID: "d-1", Type: schema.TypePolicyDecided,
		Time: at.Add(time.Second), OrgID: "acme", Actor: schema.Party{ID: "a-one", Type: schema.ActorAgent}, Source: api.SourcePolicy, Data: data}})
	return &replay.Memory{Trail: recs}
}

func TestReplayOfTheLiveBundleChangesNothing(t *testing.T) {
	var last replay.Progress
	r, err := replay.Run(context.Background(), replay.Config{Source: trail(t), Bundle: policy.DefaultBundle(), From: day, To: day.Add(24 * time.Hour),
		Progress: func(p replay.Progress) { last = p }})
	require.NoError(t, err)
	assert.Equal(t, 1, r.Decisions)
	assert.Equal(t, 1, r.Unchanged)
	assert.Equal(t, 1, r.ByKind[policy.PeerVisible].Decisions)
	assert.Equal(t, 1, r.ByOrg["acme"].Decisions)
	assert.NotEmpty(t, r.Bundle.Revision)
	assert.Contains(t, r.Bundle.Digest, "sha256:")
	assert.Equal(t, 1, last.Decisions)
	assert.InDelta(t, 1, last.Fraction, 0)
	for _, k := range []string{policy.PeerVisible, policy.AddParticipant, policy.ContactRequest, policy.SendMessage} {
		assert.NotEmpty(t, r.State[k], "the result says where %s's state comes from", k)
	}
}

func TestReplayRefusesBadConfigurationsAndHostileBundles(t *testing.T) {
	ctx := context.Background()
	_, err := replay.Run(ctx, replay.Config{Source: trail(t), Bundle: policy.DefaultBundle(), From: day, To: day})
	assert.ErrorContains(t, err, "must be before")
	_, err = replay.Run(ctx, replay.Config{Source: trail(t), Bundle: policy.DefaultBundle(), From: day, To: day.Add(time.Hour), Kinds: []string{"send_mail"}})
	assert.ErrorContains(t, err, `unknown decision kind "send_mail"`)

	hostile := fstest.MapFS{}
	require.NoError(t, copyFS(policy.DefaultBundle(), hostile))
	hostile["leak.rego"] = &fstest.MapFile{Data: []byte("package bandplane.leak\n\nx := http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1\"})\n")}
	_, err = replay.Run(ctx, replay.Config{Source: trail(t), Bundle: hostile, From: day, To: day.Add(24 * time.Hour)})
	assert.ErrorContains(t, err, "the candidate bundle is refused")
	assert.ErrorContains(t, err, "leak.rego:3 calls http.send")
}

func copyFS(src fs.FS, dst fstest.MapFS) error {
	return fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(src, p)
		if err != nil {
			return err
		}
		dst[p] = &fstest.MapFile{Data: b}
		return nil
	})
}

// peerRulesAdded is the built-in bundle without its Rego tests (a candidate's tests
// would judge the rules added), with rules appended to peer_visible.rego.
func peerRulesAdded(t *testing.T, rules string) fstest.MapFS {
	t.Helper()
	b := fstest.MapFS{}
	require.NoError(t, copyFS(policy.DefaultBundle(), b))
	for name := range b {
		if strings.HasSuffix(name, "_test.rego") {
			delete(b, name)
		}
	}
	src, err := fs.ReadFile(b, "peer_visible.rego")
	require.NoError(t, err)
	b["peer_visible.rego"] = &fstest.MapFile{Data: append(src, rules...)}
	return b
}

// A candidate that takes longer than the evaluation bound is refused, not counted as
// flips of decisions it never decided.
func TestReplayBoundsEvaluationTime(t *testing.T) {
	// Without the bundle's tests: they would be refused for their time already (10 s each).
	slow := peerRulesAdded(t, `
candidate_deny contains lib.reason("slow", "slow") if {
	count([1 | walk(data.bulk.bulk.items, _); walk(data.bulk.bulk.items, _)]) < 0
}
`)
	big := make([]int, 3000)
	raw, _ := json.Marshal(map[string]map[string]any{"bulk": {"items": big}})
	slow["bulk/data.json"] = &fstest.MapFile{Data: raw}
	_, err := replay.Run(context.Background(), replay.Config{Source: trail(t), Bundle: slow, From: day, To: day.Add(24 * time.Hour),
		EvalTimeout: 20 * time.Millisecond})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "took longer than 20ms (--eval-timeout)")
}

// Usage and budgets applied before the first decision count at the decision's day:
// a live budget denial replays as one.
func TestReplayAppliesRecordsAtTheDecisionsClock(t *testing.T) {
	m := trail(t)
	at := day.Add(2 * time.Hour)
	add := func(e schema.Event) {
		m.Trail = append(m.Trail, replay.Record{Partition: 0, Offset: int64(len(m.Trail)), Event: e})
	}
	one := schema.Party{ID: "a-one", Type: schema.ActorAgent}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	add(schema.Event{ID: "join", Type: schema.TypeParticipantAdded, Time: at, OrgID: "acme", RoomID: "room-1", Actor: schema.Party{ID: "sys", Type: schema.ActorSystem},
		Subject: &one, Source: "t", Data: raw(schema.ParticipantData{ParticipantID: "a-one"})})
	add(schema.Event{ID: "budget", Type: schema.TypeBudgetSet, Time: at, OrgID: "acme", Actor: schema.Party{ID: "cli:ops", Type: schema.ActorSystem}, Source: api.SourcePolicy,
		Data: json.RawMessage(`{"org":"acme","scope":"agent","scope_id":"a-one","period":"day","tokens":1000,"hard":true,"updated_at":"` + at.Format(time.RFC3339) + `"}`)})
	add(schema.Event{ID: "spent", Type: schema.TypeUsageReported, Time: at, OrgID: "acme", RoomID: "room-1", Actor: one, Source: "t",
		Data: raw(schema.UsageData{InputTokens: 5000})})
	in, _ := json.Marshal(policy.MessageInput{Agent: "a-one", Room: "room-1", Tokens: 10})
	decided := at.Add(time.Minute)
	add(schema.Event{ID: "d-2", Type: schema.TypePolicyDecided, Time: decided, OrgID: "acme", Actor: one, Source: api.SourcePolicy,
		Data: raw(api.DecidedData{Decision: policy.SendMessage, Allow: false, Reasons: []policy.Reason{{Code: policy.CodeBudgetExceeded}},
			Input: in, Position: policy.Position{0: int64(len(m.Trail))}, DecidedAt: decided})})
	r, err := replay.Run(context.Background(), replay.Config{Source: m, Bundle: policy.DefaultBundle(), From: day, To: day.Add(24 * time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, 2, r.Decisions)
	assert.Equal(t, 2, r.Unchanged, "%+v", r.Examples)
}

// --org replays one organization's decisions: another's are neither counted nor
// named, whatever the state they share.
func TestReplayOfOneOrganization(t *testing.T) {
	m := trail(t)
	other := m.Trail[len(m.Trail)-1]
	other.Offset, other.Event.ID, other.Event.OrgID = int64(len(m.Trail)), "d-2", "globex"
	m.Trail = append(m.Trail, other)
	for _, tc := range []struct {
		org  string
		want map[string]int
	}{
		{"", map[string]int{"acme": 1, "globex": 1}},
		{"acme", map[string]int{"acme": 1}},
		{"globex", map[string]int{"globex": 1}},
		{"initech", map[string]int{}},
	} {
		r, err := replay.Run(context.Background(), replay.Config{Source: m, Bundle: policy.DefaultBundle(), From: day, To: day.Add(24 * time.Hour), Org: tc.org})
		require.NoError(t, err)
		got := map[string]int{}
		for org, c := range r.ByOrg {
			got[org] = c.Decisions
		}
		assert.Equal(t, tc.want, got, "--org %q", tc.org)
		assert.Equal(t, len(tc.want), r.Decisions, "--org %q", tc.org)
	}
}

// A scoped replay (a tenant's) reads the organization's own trail only: a candidate
// that names every agent of the directory in its reasons, or denies by what another
// organization holds, learns nothing of it. A decision whose recorded answer needed
// another organization's state is out of scope, not a flip.
func TestScopedReplayReadsTheOrganizationsOwnTrailOnly(t *testing.T) {
	m := trail(t)
	add := func(e schema.Event) {
		m.Trail = append(m.Trail, replay.Record{Partition: 0, Offset: int64(len(m.Trail)), Event: e})
	}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	at := day.Add(2 * time.Hour)
	sys := schema.Party{ID: "sys", Type: schema.ActorSystem}
	gus := schema.Party{ID: "u-gus", Type: schema.ActorUser}
	spy := schema.Party{ID: "g-spy", Type: schema.ActorAgent}
	add(schema.Event{ID: "reg-gus", Type: schema.TypeUserRegistered, Time: at, OrgID: "globex", Actor: sys, Subject: &gus, Source: "t",
		SchemaVersion: schema.Version, Data: raw(schema.UserData{Handle: "gus"})})
	add(schema.Event{ID: "reg-spy", Type: schema.TypeAgentRegistered, Time: at, OrgID: "globex", Actor: gus, Subject: &spy, Source: "t",
		SchemaVersion: schema.Version, Data: raw(schema.AgentData{Handle: "gus/secret-merger", OwnerID: "u-gus", Listed: true, Global: true})})
	// acme's second decision is made after globex's agent exists, and one of globex's.
	decide := func(id, org, agent string, in policy.PeerInput, allow bool, code string) {
		decided := at.Add(time.Minute)
		add(schema.Event{ID: id, Type: schema.TypePolicyDecided, Time: decided, OrgID: org, Actor: schema.Party{ID: agent, Type: schema.ActorAgent},
			Source: api.SourcePolicy, Data: raw(api.DecidedData{Decision: policy.PeerVisible, Allow: allow, Reasons: []policy.Reason{{Code: code}},
				Input: raw(in), Position: policy.Position{0: int64(len(m.Trail))}, DecidedAt: decided})})
	}
	decide("d-acme-2", "acme", "a-one", policy.PeerInput{Agent: "a-one", Candidate: "a-two"}, true, "sibling")
	decide("d-globex", "globex", "g-spy", policy.PeerInput{Agent: "g-spy", Candidate: "g-spy"}, false, "self")

	// The candidate denies every decision, naming in its reason each agent handle the
	// state holds, and allows only if globex's agent is there.
	leak := peerRulesAdded(t, `
candidate_deny contains lib.reason("seen", concat(",", sort([a.handle | some a in data.directory.agents])))
`)
	cfg := replay.Config{Source: m, Bundle: leak, From: day, To: day.Add(24 * time.Hour), Org: "acme", Examples: 10}

	whole, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	require.Len(t, whole.Examples.AllowToDeny, 2)
	assert.Contains(t, whole.Examples.AllowToDeny[1].Candidate.Reasons[0].Message, "gus/secret-merger",
		"unscoped (the operator's replay) reads every organization's state, as the live decisions did")

	cfg.Scoped, cfg.Baseline = true, policy.DefaultBundle()
	scoped, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	assert.Equal(t, 2, scoped.Decisions)
	assert.Equal(t, 2, scoped.AllowToDeny)
	assert.Equal(t, map[string]int{"acme": 2}, map[string]int{"acme": scoped.ByOrg["acme"].Decisions}, "%v", scoped.ByOrg)
	assert.Len(t, scoped.ByOrg, 1, "globex's decision is not replayed")
	body, err := json.Marshal(scoped)
	require.NoError(t, err)
	assert.NotContains(t, string(body), "secret-merger")
	assert.NotContains(t, string(body), "g-spy")
	for _, ex := range scoped.Examples.AllowToDeny {
		assert.Equal(t, "ola/one,ola/two", ex.Candidate.Reasons[0].Message)
	}
	assert.Contains(t, scoped.State[policy.PeerVisible], "own trail only")

	// A recorded answer the serving bundle does not give again on the cut state is out
	// of scope: here acme's agent saw globex's live, which acme's trail cannot show.
	cross := trail(t)
	cross.Trail = append(cross.Trail, m.Trail[len(cross.Trail):len(cross.Trail)+2]...)
	in := raw(policy.PeerInput{Agent: "a-one", Candidate: "g-spy"})
	decided := at.Add(time.Minute)
	cross.Trail = append(cross.Trail, replay.Record{Partition: 0, Offset: int64(len(cross.Trail)), Event: schema.Event{ID: "d-cross", Type: schema.TypePolicyDecided,
		Time: decided, OrgID: "acme", Actor: schema.Party{ID: "a-one", Type: schema.ActorAgent}, Source: api.SourcePolicy,
		Data: raw(api.DecidedData{Decision: policy.PeerVisible, Allow: true, Reasons: []policy.Reason{{Code: "global"}}, Input: in,
			Position: policy.Position{0: int64(len(cross.Trail))}, DecidedAt: decided})}})
	cfg.Source, cfg.Bundle = cross, policy.DefaultBundle()
	live, err := replay.Run(t.Context(), replay.Config{Source: cross, Bundle: policy.DefaultBundle(), From: day, To: day.Add(24 * time.Hour), Org: "acme"})
	require.NoError(t, err)
	require.Equal(t, 2, live.Unchanged, "the recorded answers are the serving bundle's on the whole state: %+v", live.Examples)
	r, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	assert.Equal(t, 1, r.OutOfScope)
	assert.Equal(t, 1, r.Decisions)
	assert.Equal(t, 1, r.Unchanged)

	cfg.Baseline = nil
	_, err = replay.Run(t.Context(), cfg)
	assert.ErrorContains(t, err, "a scoped replay needs an organization and a baseline bundle")
}

// readsOf is a Source that counts the records it hands out of organizations other than
// org.
type readsOf struct {
	replay.Source
	org     string
	foreign *int
}

type countingCursor struct {
	replay.Cursor
	r readsOf
}

func (c countingCursor) Next() (replay.Record, bool, error) {
	rec, ok, err := c.Cursor.Next()
	if ok && rec.Event.OrgID != c.r.org {
		*c.r.foreign++
	}
	return rec, ok, err
}

func (r readsOf) Records(ctx context.Context, partition int, org string) (replay.Cursor, error) {
	c, err := r.Source.Records(ctx, partition, org)
	return countingCursor{c, r}, err
}

func (r readsOf) Decisions(ctx context.Context, from, to time.Time, org string) (replay.Cursor, error) {
	c, err := r.Source.Decisions(ctx, from, to, org)
	return countingCursor{c, r}, err
}

func TestScopedReplayLeavesOtherOrganizationsRowsUnread(t *testing.T) {
	m := trail(t)
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	at := day.Add(2 * time.Hour)
	gus := schema.Party{ID: "u-gus", Type: schema.ActorUser}
	m.Trail = append(m.Trail,
		replay.Record{Partition: 0, Offset: int64(len(m.Trail)), Event: schema.Event{ID: "reg-gus", Type: schema.TypeUserRegistered, Time: at, OrgID: "globex",
			Actor: schema.Party{ID: "sys", Type: schema.ActorSystem}, Subject: &gus, Source: "t", SchemaVersion: schema.Version, Data: raw(schema.UserData{Handle: "gus"})}},
		// globex's decision that cannot be read: no concern of acme's replay, scoped or not.
		replay.Record{Partition: 0, Offset: int64(len(m.Trail) + 1), Event: schema.Event{ID: "d-globex-broken", Type: schema.TypePolicyDecided, Time: at, OrgID: "globex",
			Actor: gus, Source: api.SourcePolicy, Data: json.RawMessage(`{"decision": 7}`)}})

	foreign := 0
	cfg := replay.Config{Source: readsOf{Source: m, org: "acme", foreign: &foreign}, Bundle: policy.DefaultBundle(),
		From: day, To: day.Add(24 * time.Hour), Org: "acme"}
	whole, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	assert.Positive(t, foreign, "the operator's replay of one organization reads the whole state")
	assert.Zero(t, whole.Skipped, "another organization's unreadable decision is not counted: %s", whole.SkipReason)
	assert.Empty(t, whole.SkipReason)

	foreign = 0
	cfg.Scoped, cfg.Baseline = true, policy.DefaultBundle()
	scoped, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	assert.Zero(t, foreign, "a scoped replay asks the source for its organization's rows only")
	assert.Equal(t, 1, scoped.Decisions)
	assert.Zero(t, scoped.Skipped)
}

func TestExamplesOfCodesOnlyAreBounded(t *testing.T) {
	// A candidate whose deny holds 40 reasons, each with a code of 136 bytes that ends
	// in a rune of three bytes, and a long message.
	var rules strings.Builder
	for i := range 40 {
		fmt.Fprintf(&rules, "\ncandidate_deny contains lib.reason(%q, %q)\n", fmt.Sprintf("%02d", i)+strings.Repeat("x", 125)+"€€€", strings.Repeat("m", 5000))
	}
	noisy := peerRulesAdded(t, rules.String())
	cfg := replay.Config{Source: trail(t), Bundle: noisy, From: day, To: day.Add(24 * time.Hour)}
	whole, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	require.Len(t, whole.Examples.AllowToDeny, 1)
	assert.Len(t, whole.Examples.AllowToDeny[0].Candidate.Reasons, 40, "the CLI keeps every reason")

	cfg.CodesOnly = true
	r, err := replay.Run(t.Context(), cfg)
	require.NoError(t, err)
	require.Len(t, r.Examples.AllowToDeny, 1)
	reasons := r.Examples.AllowToDeny[0].Candidate.Reasons
	require.Len(t, reasons, replay.MaxExampleReasons+1)
	assert.Equal(t, "… 24 more", reasons[replay.MaxExampleReasons].Code)
	for _, rs := range reasons {
		assert.Empty(t, rs.Message)
		assert.LessOrEqual(t, len(rs.Code), replay.MaxReasonCodeBytes)
		assert.True(t, utf8.ValidString(rs.Code), "%q", rs.Code)
	}
	assert.True(t, strings.HasSuffix(reasons[0].Code, "…"), reasons[0].Code)
	assert.Equal(t, []policy.Reason{{Code: "sibling"}}, r.Examples.AllowToDeny[0].Live.Reasons)
}
