package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// apply decodes each line as ingest would and applies it.
func apply(t *testing.T, r *replica.Replica, lines ...string) {
	t.Helper()
	for _, l := range lines {
		ev, err := schema.Decode([]byte(l))
		require.NoError(t, err, l)
		require.NoError(t, r.Apply(context.Background(), &ev))
	}
}

func newReplica(t *testing.T, now time.Time) (*replica.Replica, *policy.Directory, *policy.Ledger) {
	dir, spend := policy.NewDirectory(), policy.NewLedger(0)
	// Apply needs no servers (Bootstrap and Run do).
	r, err := replica.New(replica.Config{Directory: dir, Ledger: spend, Catalog: pricing.Default(), Now: func() time.Time { return now }})
	require.NoError(t, err)
	return r, dir, spend
}

const (
	alice     = `{"id":"u1","type":"user.registered","time":"2026-11-02T09:00:00Z","org_id":"acme","actor":{"id":"sys","type":"system"},"subject":{"id":"u-alice","type":"user"},"source":"t","data":{"handle":"alice"}}`
	partner   = `{"id":"u2","type":"user.registered","time":"2026-11-02T09:00:00Z","org_id":"other","actor":{"id":"sys","type":"system"},"subject":{"id":"u-partner","type":"user"},"source":"t","data":{"handle":"partner"}}`
	architect = `{"id":"a1","type":"agent.registered","time":"2026-11-02T09:00:01Z","org_id":"acme","actor":{"id":"u-alice","type":"user"},"subject":{"id":"a-arch","type":"agent"},"source":"t","data":{"handle":"alice/architect","owner_id":"u-alice","model":"gpt-5-mini","personal_registry_access":true,"listed":true}}`
	reviewer  = `{"id":"a2","type":"agent.registered","time":"2026-11-02T09:00:01Z","org_id":"other","actor":{"id":"u-partner","type":"user"},"subject":{"id":"a-rev","type":"agent"},"source":"t","data":{"handle":"partner/reviewer","owner_id":"u-partner","model":"gpt-5-mini","personal_registry_access":true,"listed":true}}`
)

func TestApplyBuildsTheDirectoryFromEvents(t *testing.T) {
	r, dir, _ := newReplica(t, time.Now())
	apply(t, r, alice, partner, architect, reviewer,
		`{"topic":"agent_contacts:a-rev","event":"contact_request_received","payload":{"id":"req-1","from_handle":"@alice/architect","status":"pending","inserted_at":"2026-11-02T10:00:00Z"}}`)
	snap := dir.Snapshot()
	require.Len(t, snap.Pending, 1)
	assert.Equal(t, policy.PendingRequest{ID: "req-1", From: "a-arch", To: "a-rev"}, snap.Pending[0])
	assert.Empty(t, snap.Contacts)

	apply(t, r, `{"topic":"agent_contacts:a-rev","event":"contact_request_updated","payload":{"id":"req-1","from_handle":"alice/architect","status":"approved","inserted_at":"2026-11-02T10:00:00Z","updated_at":"2026-11-02T10:05:00Z"}}`)
	snap = dir.Snapshot()
	assert.Empty(t, snap.Pending, "approved is final")
	require.Len(t, snap.Contacts, 1)

	apply(t, r,
		`{"topic":"room_participants:room-1","event":"participant_added","payload":{"id":"a-arch","name":"Architect","type":"Agent","inserted_at":"2026-11-02T10:06:00Z"}}`,
		`{"topic":"agent_rooms:a-rev","event":"room_added","payload":{"id":"room-1","title":"Webhook Retries","inserted_at":"2026-11-02T10:07:00Z"}}`)
	assert.ElementsMatch(t, []string{"a-arch", "a-rev"}, dir.Snapshot().Rooms["room-1"])

	apply(t, r,
		`{"topic":"agent_rooms:a-rev","event":"room_removed","payload":{"id":"room-1","title":"Webhook Retries","inserted_at":"2026-11-02T10:08:00Z"}}`,
		`{"topic":"agent_contacts:a-arch","event":"contact_removed","payload":{"id":"a-rev","handle":"partner/reviewer","type":"Agent","inserted_at":"2026-11-02T10:09:00Z"}}`)
	snap = dir.Snapshot()
	assert.Equal(t, []string{"a-arch"}, snap.Rooms["room-1"])
	assert.Empty(t, snap.Contacts)
}

// The process's directory is shared with the pipeline and the live reader, each at its
// own position in the stream. The policies see the newest registration any of them
// read, and an older one read after it changes nothing.
func TestRegistrationsComeFromTheProcesssDirectory(t *testing.T) {
	shared := directory.New()
	dir := policy.NewDirectory()
	r, err := replica.New(replica.Config{Directory: dir, Registrations: shared, Ledger: policy.NewLedger(0), Catalog: pricing.Default()})
	require.NoError(t, err)
	updated := `{"id":"a1u","type":"agent.updated","time":"2026-11-02T11:00:00Z","org_id":"acme","actor":{"id":"u-alice","type":"user"},"subject":{"id":"a-arch","type":"agent"},"source":"t","data":{"handle":"alice/architect","owner_id":"u-alice","model":"claude-opus-4","global":true,"personal_registry_access":true,"listed":true}}`
	ev, err := schema.Decode([]byte(updated))
	require.NoError(t, err)
	_, err = shared.Apply(&ev) // the pipeline read the update first
	require.NoError(t, err)

	apply(t, r, alice, architect) // the replica reads the registration
	a, ok := dir.Agent("a-arch")
	require.True(t, ok)
	assert.Equal(t, "claude-opus-4", a.Model)
	assert.True(t, a.Global)
	people := dir.Snapshot().People
	require.Len(t, people, 1)
	assert.Equal(t, "alice", people[0].Handle)

	// A forged row of ClickHouse's directory table reaches enrichment only.
	shared.Load([]store.DirectoryRow{{Kind: directory.KindAgent, ID: "a-arch", OrgID: "evil", Version: ^uint64(0)}})
	apply(t, r, architect)
	a, _ = dir.Agent("a-arch")
	assert.Equal(t, "acme", a.Org)
	assert.Equal(t, "claude-opus-4", a.Model)
}

func TestRejectedRequestIsCleared(t *testing.T) {
	r, dir, _ := newReplica(t, time.Now())
	apply(t, r, alice, partner, architect, reviewer,
		`{"topic":"agent_contacts:a-rev","event":"contact_request_received","payload":{"id":"req-2","from_handle":"alice/architect","status":"pending","inserted_at":"2026-11-02T10:00:00Z"}}`,
		`{"topic":"agent_contacts:a-rev","event":"contact_request_updated","payload":{"id":"req-2","from_handle":"alice/architect","status":"rejected","inserted_at":"2026-11-02T10:00:00Z","updated_at":"2026-11-02T10:01:00Z"}}`)
	snap := dir.Snapshot()
	assert.Empty(t, snap.Pending)
	assert.Empty(t, snap.Contacts)
}

func TestUsageOfTodayCountsTowardsBudgets(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, spend := newReplica(t, now)
	apply(t, r, alice, architect,
		`{"id":"u-1","type":"usage.reported","time":"2026-11-02T11:00:00Z","room_id":"room-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0}}`,
		`{"id":"u-2","type":"usage.reported","time":"2026-11-01T11:00:00Z","room_id":"room-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":5000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	tokens, cost, _, _ := spend.Spent("acme", policy.ScopeAgent, "a-arch", policy.PeriodDay, now)
	assert.Equal(t, int64(1100), tokens, "yesterday's usage does not count today")
	want, _ := pricing.Default().Cost("gpt-5-mini", schema.UsageData{InputTokens: 1000, OutputTokens: 100})
	assert.Equal(t, want, cost)
	orgTokens, _, _, _ := spend.Spent("acme", policy.ScopeOrg, "acme", policy.PeriodDay, now)
	assert.Equal(t, int64(1100), orgTokens, "frames carry no org: it comes from the directory")
	monthTokens, _, _, _ := spend.Spent("acme", policy.ScopeRoom, "room-1", policy.PeriodMonth, now)
	assert.Equal(t, int64(6200), monthTokens, "yesterday's usage counts this month")
}

func TestOperatorSuspensionSurvivesPlatformUpdates(t *testing.T) {
	r, dir, _ := newReplica(t, time.Now())
	suspend := `{"id":"s1","type":"agent.suspended","time":"2026-11-02T09:10:00Z","org_id":"acme","actor":{"id":"key-op","type":"system"},"subject":{"id":"a-arch","type":"agent"},"source":"bandplane-policy","data":{"reason":"chatty"}}`
	update := `{"id":"a3","type":"agent.updated","time":"2026-11-02T09:11:00Z","org_id":"acme","actor":{"id":"u-alice","type":"user"},"subject":{"id":"a-arch","type":"agent"},"source":"t","data":{"handle":"alice/architect","owner_id":"u-alice","model":"gpt-5-mini","personal_registry_access":true,"listed":true,"suspended":false}}`
	resume := `{"id":"s2","type":"agent.resumed","time":"2026-11-02T09:12:00Z","org_id":"acme","actor":{"id":"key-op","type":"system"},"subject":{"id":"a-arch","type":"agent"},"source":"bandplane-policy"}`

	apply(t, r, alice, architect, suspend, update)
	a, ok := dir.Agent("a-arch")
	require.True(t, ok)
	assert.True(t, a.IsSuspended(), "the platform's update (suspended: false) must not lift the operator's suspension: %+v", a)
	assert.True(t, a.OperatorSuspended)

	apply(t, r, resume)
	a, _ = dir.Agent("a-arch")
	assert.False(t, a.IsSuspended(), "only a resume lifts it: %+v", a)

	// A suspension replayed before the agent's registration (bootstrap order) holds
	// once the agent registers.
	r2, dir2, _ := newReplica(t, time.Now())
	apply(t, r2, alice, suspend, architect, update)
	a, _ = dir2.Agent("a-arch")
	assert.True(t, a.IsSuspended())
}

func TestRoomDeletedForgetsMembership(t *testing.T) {
	r, dir, _ := newReplica(t, time.Now())
	apply(t, r, alice, architect,
		`{"topic":"room_participants:room-9","event":"participant_added","payload":{"id":"a-arch","name":"Architect","type":"Agent","inserted_at":"2026-11-02T10:06:00Z"}}`)
	require.Contains(t, dir.Snapshot().Rooms, "room-9")
	apply(t, r, `{"id":"rd","type":"room.deleted","time":"2026-11-02T10:07:00Z","room_id":"room-9","actor":{"id":"sys","type":"system"},"source":"t"}`)
	assert.NotContains(t, dir.Snapshot().Rooms, "room-9")
}

func TestUsageUnderAnotherOrgSparesTheAgentsBudget(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, spend := newReplica(t, now)
	apply(t, r, alice, architect,
		`{"id":"u-9","type":"usage.reported","time":"2026-11-02T11:00:00Z","org_id":"mallory","room_id":"room-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":1000,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	tokens, _, _, _ := spend.Spent("acme", policy.ScopeAgent, "a-arch", policy.PeriodDay, now)
	assert.Zero(t, tokens, "usage stamped with another organization must not eat acme's agent budget")
	tokens, _, _, _ = spend.Spent("mallory", policy.ScopeAgent, "a-arch", policy.PeriodDay, now)
	assert.Zero(t, tokens)
	tokens, _, _, _ = spend.Spent("acme", policy.ScopeOwner, "u-alice", policy.PeriodDay, now)
	assert.Zero(t, tokens)
	tokens, _, _, _ = spend.Spent("mallory", policy.ScopeOrg, "mallory", policy.PeriodDay, now)
	assert.Equal(t, int64(1000), tokens, "it counts against the organization it was written for")
}

func TestBudgetEventsSetAndSettle(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	set := `{"id":"b1","type":"budget.set","time":"2026-11-02T09:00:00Z","org_id":"acme","actor":{"id":"key-m","type":"system"},"source":"bandplane-policy",` +
		`"data":{"org":"acme","scope":"agent","scope_id":"a-arch","period":"day","tokens":5000,"hard":true,"updated_at":"2026-11-02T09:00:00Z"}}`
	apply(t, r, alice, architect, set)
	st := ledger.Budgets("acme", now)
	require.Len(t, st, 1)
	assert.Equal(t, policy.BudgetID("acme", policy.ScopeAgent, "a-arch", policy.PeriodDay), st[0].ID)

	_, deny := ledger.Reserve("d1", policy.Charge{Org: "acme", Owner: "u-alice", Agent: "a-arch", Tokens: 4000}, "exec-1", policy.DefaultLimits{}, now)
	require.Nil(t, deny)
	apply(t, r, `{"id":"u-1","type":"usage.reported","time":"2026-11-02T11:59:00Z","org_id":"acme","room_id":"room-1","execution_id":"exec-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	st = ledger.Budgets("acme", now)
	assert.Equal(t, [2]int64{1100, 0}, [2]int64{st[0].SpentTokens, st[0].ReservedTokens}, "the usage of the execution replaces its estimate")

	// Forged budget events are refused: another source, or another organization's budget.
	for _, forged := range []string{
		`{"id":"b2","type":"budget.set","time":"2026-11-02T09:01:00Z","org_id":"acme","actor":{"id":"x","type":"system"},"source":"router",` +
			`"data":{"org":"acme","scope":"agent","scope_id":"a-arch","period":"day","tokens":1,"hard":true,"updated_at":"2026-11-02T09:01:00Z"}}`,
		`{"id":"b3","type":"budget.set","time":"2026-11-02T09:01:00Z","org_id":"acme","actor":{"id":"x","type":"system"},"source":"bandplane-policy",` +
			`"data":{"org":"other","scope":"org","period":"day","tokens":1,"hard":true,"updated_at":"2026-11-02T09:01:00Z"}}`,
		`{"id":"b4","type":"budget.set","time":"2026-11-02T09:01:00Z","org_id":"acme","actor":{"id":"x","type":"system"},"source":"bandplane-policy",` +
			`"data":{"org":"acme","scope":"team","scope_id":"x","period":"day","tokens":1,"updated_at":"2026-11-02T09:01:00Z"}}`,
	} {
		ev, err := schema.Decode([]byte(forged))
		require.NoError(t, err)
		assert.Error(t, r.Apply(context.Background(), &ev))
	}
	assert.Equal(t, int64(5000), ledger.Budgets("acme", now)[0].Tokens)
	assert.Empty(t, ledger.Budgets("other", now))

	apply(t, r, `{"id":"b5","type":"budget.deleted","time":"2026-11-02T10:00:00Z","org_id":"acme","actor":{"id":"key-m","type":"system"},"source":"bandplane-policy",`+
		`"data":{"org":"acme","scope":"agent","scope_id":"a-arch","period":"day","tokens":5000,"hard":true,"updated_at":"2026-11-02T10:00:00Z"}}`)
	assert.Empty(t, ledger.Budgets("acme", now))
}

func TestUsageBeforeRegistrationCountsOnceItRegisters(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	// Usage travels on its room's partition, the registration on another: it may come first.
	apply(t, r, `{"id":"u-0","type":"usage.reported","time":"2026-11-02T11:00:00Z","room_id":"room-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":700,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	tokens, _, _, _ := ledger.Spent("acme", policy.ScopeOwner, "u-alice", policy.PeriodDay, now)
	assert.Zero(t, tokens)
	apply(t, r, alice, architect)
	tokens, _, _, _ = ledger.Spent("acme", policy.ScopeOwner, "u-alice", policy.PeriodDay, now)
	assert.Equal(t, int64(700), tokens, "kept until the agent registered, then counted once")
	apply(t, r, architect) // an update does not count it again
	tokens, _, _, _ = ledger.Spent("acme", policy.ScopeAgent, "a-arch", policy.PeriodDay, now)
	assert.Equal(t, int64(700), tokens)
}

func TestUsageSeenTwiceCountsOnce(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	u := `{"id":"u-dup","type":"usage.reported","time":"2026-11-02T11:00:00Z","room_id":"room-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":300,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`
	apply(t, r, alice, architect, u, u) // a client's retried POST: two records, one event id
	tokens, _, _, _ := ledger.Spent("acme", policy.ScopeAgent, "a-arch", policy.PeriodDay, now)
	assert.Equal(t, int64(300), tokens)
}

// Bindings reach the process's directory, where spans are attributed from, from
// bandplane's own sources only, and only to an agent of the binding's organization.
func TestBindingsComeFromBandplaneOnly(t *testing.T) {
	shared := directory.New()
	r, err := replica.New(replica.Config{Directory: policy.NewDirectory(), Registrations: shared, Ledger: policy.NewLedger(0), Catalog: pricing.Default()})
	require.NoError(t, err)
	bind := `{"id":"bind-1","type":"agent.bound","time":"2026-11-02T09:05:00Z","org_id":"acme","actor":{"id":"cli:ops","type":"system"},"subject":{"id":"a-arch","type":"agent"},"source":"bandplane-policy","data":{"kind":"service","value":"checkout","agent_id":"a-arch"}}`
	apply(t, r, alice, partner, architect, reviewer, bind)
	agent, ok := shared.Bound("acme", schema.BindingService, "checkout")
	assert.True(t, ok)
	assert.Equal(t, "a-arch", agent)

	for name, forged := range map[string]string{
		// A client's bind (the collector refuses the type; a row that slipped in is
		// ignored all the same).
		"another source":        `{"id":"bind-2","type":"agent.bound","time":"2026-11-02T09:06:00Z","org_id":"other","actor":{"id":"x","type":"system"},"subject":{"id":"a-rev","type":"agent"},"source":"router","data":{"kind":"service","value":"checkout","agent_id":"a-rev"}}`,
		"the platform's source": `{"id":"bind-3","type":"agent.unbound","time":"2026-11-02T09:07:00Z","org_id":"acme","actor":{"id":"x","type":"system"},"source":"band","data":{"kind":"service","value":"checkout"}}`,
	} {
		ev, err := schema.Decode([]byte(forged))
		require.NoError(t, err, name)
		err = r.Apply(context.Background(), &ev)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "bindings come from bandplane only", name)
	}
	agent, ok = shared.Bound("acme", schema.BindingService, "checkout")
	assert.True(t, ok, "the forged unbind changed nothing")
	assert.Equal(t, "a-arch", agent)
	_, ok = shared.Bound("other", schema.BindingService, "checkout")
	assert.False(t, ok, "the forged bind changed nothing")

	// bandplane's own bind of another organization's agent attributes nothing.
	apply(t, r, `{"id":"bind-4","type":"agent.bound","time":"2026-11-02T09:08:00Z","org_id":"acme","actor":{"id":"cli:ops","type":"system"},"subject":{"id":"a-rev","type":"agent"},"source":"bandplane-policy","data":{"kind":"agent","value":"gen-ai-rev","agent_id":"a-rev"}}`)
	_, ok = shared.Bound("acme", schema.BindingAgent, "gen-ai-rev")
	assert.False(t, ok, "a-rev is other's")

	// Invalid data is an error naming the field; nothing changes.
	ev, err := schema.Decode([]byte(`{"id":"bind-5","type":"agent.bound","time":"2026-11-02T09:09:00Z","org_id":"acme","actor":{"id":"cli:ops","type":"system"},"source":"bandplane-policy","data":{"kind":"host","value":"checkout","agent_id":"a-arch"}}`))
	require.NoError(t, err)
	err = r.Apply(context.Background(), &ev)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "data.kind")

	apply(t, r, `{"id":"unbind-1","type":"agent.unbound","time":"2026-11-02T09:10:00Z","org_id":"acme","actor":{"id":"cli:ops","type":"system"},"source":"bandplane-policy","data":{"kind":"service","value":"checkout"}}`)
	_, ok = shared.Bound("acme", schema.BindingService, "checkout")
	assert.False(t, ok)
	assert.Len(t, shared.Bindings("acme"), 1, "the agent binding of a-rev is listed, not bound")
}

// An unbound OTLP sender ("otlp:<service>") never registers: its usage counts against
// its organization at once instead of waiting for a registration.
func TestUnboundSendersUsageCountsAgainstItsOrganization(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	apply(t, r, `{"id":"otlp-1","type":"usage.reported","time":"2026-11-02T11:00:00Z","org_id":"acme","room_id":"conv-1","actor":{"id":"otlp:checkout","type":"agent"},"source":"otlp","data":{"input_tokens":400,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	tokens, _, _, _ := ledger.Spent("acme", policy.ScopeOrg, "acme", policy.PeriodDay, now)
	assert.Equal(t, int64(400), tokens)
}

// Two organizations' reports with one id are two reports: OTLP's ids come from span ids,
// which two tenants may share.
func TestUsageIDsAreSeenPerOrganization(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	for _, org := range []string{"acme", "globex"} {
		apply(t, r, `{"id":"otlp-same","type":"usage.reported","time":"2026-11-02T11:00:00Z","org_id":"`+org+`","room_id":"conv-1","actor":{"id":"otlp:x","type":"agent"},"source":"otlp","data":{"input_tokens":100,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	}
	for _, org := range []string{"acme", "globex"} {
		tokens, _, _, _ := ledger.Spent(org, policy.ScopeOrg, org, policy.PeriodDay, now)
		assert.Equal(t, int64(100), tokens, org)
	}
}
