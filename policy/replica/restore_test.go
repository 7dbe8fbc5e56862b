package replica

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/pricing"
)

// clock is a settable time for the engine (the limiter's now).
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

type trail struct {
	mu     sync.Mutex
	events []schema.Event
}

func (tr *trail) Produce(_ context.Context, evs []schema.Event) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, evs...)
	return nil
}

// process is one policy process: an engine on clk, its API auditing to tr.
func process(t *testing.T, clk *clock, tr *trail) (*api.API, *policy.Engine) {
	t.Helper()
	ctx := context.Background()
	snap, err := policy.LoadDirectoryFile("../testdata/directory.json")
	require.NoError(t, err)
	dir := policy.NewDirectory()
	require.NoError(t, dir.Load(ctx, snap))
	eng, err := policy.New(ctx, policy.Config{Directory: dir, Now: clk.now})
	require.NoError(t, err)
	cfg := api.Config{Engine: eng}
	if tr != nil {
		cfg.Auditor = tr
	}
	a, err := api.New(cfg)
	require.NoError(t, err)
	return a, eng
}

func restarted(t *testing.T, eng *policy.Engine, started time.Time, owns func(string) bool, now func() time.Time) *Replica {
	t.Helper()
	r, err := New(Config{Directory: eng.Directory(), Ledger: eng.Ledger(), Catalog: pricing.Default(), Limiter: eng.Limiter(),
		Owns: owns, Started: started, Now: now})
	require.NoError(t, err)
	r.restored.seen = map[uint64]struct{}{}
	return r
}

type answer struct {
	allow bool
	retry int64
}

func ask(t *testing.T, a *api.API, agent, room string) answer {
	t.Helper()
	d, err := a.Decide(context.Background(), policy.SendMessage, &policy.MessageInput{Agent: agent, Room: room})
	require.NoError(t, err)
	return answer{d.Allow, d.RetryAfterMs}
}

// TestARestartedProcessLimitsAsTheOldOne: the chatty agent is kept at its limit for ten
// windows (it asks again as soon as retry_after says), in two rooms; a new process that
// restores only the last window's decisions then answers every question as the old
// one would have.
func TestARestartedProcessLimitsAsTheOldOne(t *testing.T) {
	const room = "room-webhook-retries" // a-architect of org-acme: 60 a minute, 12 a minute here
	start := time.Unix(1_800_000_000, 0).UTC()
	clk := &clock{t: start}
	tr := &trail{}
	old, _ := process(t, clk, tr)
	takenAt := map[int]time.Time{} // index in the trail -> the engine's time
	for clk.now().Before(start.Add(10 * time.Minute)) {
		a := ask(t, old, "a-architect", room)
		if a.allow {
			takenAt[len(tr.events)-1] = clk.now()
			continue
		}
		clk.set(clk.now().Add(time.Duration(a.retry) * time.Millisecond))
	}
	require.Greater(t, len(takenAt), 12*10)
	stop := clk.now()

	twin, twinEng := process(t, clk, nil)
	r := restarted(t, twinEng, time.Now().Add(time.Hour), nil, clk.now)
	restored := 0
	for i, ev := range tr.events {
		if at, ok := takenAt[i]; !ok || at.Before(stop.Add(-time.Minute)) {
			continue // denied, or before the last window: a restart does not read it
		}
		if r.restoreDecision(ev.ID, ev.OrgID, ev.Data) {
			restored++
		}
	}
	require.Greater(t, restored, 0)
	assert.Less(t, restored, len(takenAt)/5, "only the last window's decisions were needed")

	fresh, _ := process(t, clk, nil)
	assert.True(t, ask(t, fresh, "a-architect", room).allow, "without the restore, a fresh burst")

	// From now on both answer alike: at once (denied), then across the next windows.
	for i := range 200 {
		clk.set(stop.Add(time.Duration(i) * 700 * time.Millisecond))
		assert.Equal(t, ask(t, old, "a-architect", room), ask(t, twin, "a-architect", room), "question %d at %s", i, clk.now())
	}
}

func TestRestoreTakesOnlyWhatIsThisProcesssToRestore(t *testing.T) {
	clk := &clock{t: time.Now()}
	tr := &trail{}
	old, _ := process(t, clk, tr)
	for range 5 {
		require.True(t, ask(t, old, "a-architect", "room-webhook-retries").allow)
	}
	for range 8 {
		ask(t, old, "a-architect", "room-webhook-retries") // 7 allowed, then denied: 12 in the room
	}
	require.Len(t, tr.events, 13)

	for _, tc := range []struct {
		name    string
		started time.Time
		owns    func(string) bool
		want    int
	}{
		{"owned, before the start", time.Now().Add(time.Minute), nil, 12},
		{"another replica's organization", time.Now().Add(time.Minute), func(org string) bool { return org != "org-acme" }, 0},
		{"taken after the start: this process's own", time.Now().Add(-time.Minute), nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, eng := process(t, clk, nil)
			r := restarted(t, eng, tc.started, tc.owns, clk.now)
			n := 0
			for _, ev := range tr.events {
				if r.restoreDecision(ev.ID, ev.OrgID, ev.Data) {
					n++
				}
			}
			assert.Equal(t, tc.want, n)
			// Twice (ClickHouse and the topic's tail both hold it): once.
			for _, ev := range tr.events {
				assert.False(t, r.restoreDecision(ev.ID, ev.OrgID, ev.Data))
			}
			if tc.want > 0 {
				d, err := eng.Decide(context.Background(), policy.SendMessage, &policy.MessageInput{Agent: "a-architect", Room: "room-webhook-retries"})
				require.NoError(t, err)
				assert.False(t, d.Allow, "the room's 12 are taken")
			}
		})
	}

	// Decisions that took nothing, or of other versions, are not restored.
	_, eng := process(t, clk, nil)
	r := restarted(t, eng, time.Now().Add(time.Minute), nil, clk.now)
	for _, data := range []string{
		`{"decision":"send_message","allow":true,"input":{"agent":"a-architect","room":"r"}}`, // no taken: an older version
		`{"decision":"send_message","allow":false,"input":{"agent":"a-architect","room":"r"},"taken":{"at":"2020-01-01T00:00:00Z","quota":{"window_seconds":60,"messages_per_window_agent":1}}}`,
		`{"decision":"add_participant","allow":true,"input":{"actor":"a-architect"}}`,
		`not json`,
	} {
		assert.False(t, r.restoreDecision(fmt.Sprint(len(data)), "org-acme", []byte(data)), data)
	}
	assert.Equal(t, 0, eng.Limiter().Len())
}

// TestADecisionWithoutTATsIsReplayed: the fallback of an event that recorded no TAT.
func TestADecisionWithoutTATsIsReplayed(t *testing.T) {
	now := time.Now()
	_, eng := process(t, &clock{t: now}, nil)
	r := restarted(t, eng, now.Add(time.Minute), nil, func() time.Time { return now })
	for i := range 3 {
		data := fmt.Sprintf(`{"decision":"send_message","allow":true,"input":{"agent":"a-architect","room":"r"},"taken":{"at":%q,"quota":{"window_seconds":60,"messages_per_window_agent":3,"messages_per_window_agent_room":0}}}`,
			now.Add(time.Duration(i)*time.Millisecond).Format(time.RFC3339Nano))
		require.True(t, r.restoreDecision(fmt.Sprint("d", i), "org-acme", []byte(data)))
	}
	ok, retry := eng.Limiter().Allow(policy.AgentRateKey("a-architect"), 3, time.Minute, now.Add(3*time.Millisecond))
	assert.False(t, ok, "three replayed of three a minute")
	assert.Equal(t, 20*time.Second-3*time.Millisecond, retry)
}

// TestOpenReservationsAreRestored: a decision's reservation of an execution no usage
// report settled comes back with its expiry; a settled one, one without an execution
// id, or one restored after catching up, does not.
func TestOpenReservationsAreRestored(t *testing.T) {
	now := time.Now()
	clk := &clock{t: now}
	tr := &trail{}
	old, oldEng := process(t, clk, tr)
	const room = "room-webhook-retries"
	for _, in := range []policy.MessageInput{
		{Agent: "a-architect", Room: room, Tokens: 100, ExecutionID: "e1"},
		{Agent: "a-architect", Room: room, Tokens: 100, ExecutionID: "e2"},
		{Agent: "a-architect", Room: room, Tokens: 100, CostMicros: 5, ExecutionID: "e3"},
		{Agent: "a-architect", Room: room, Tokens: 100},       // no execution id
		{Agent: "a-architect", Room: room, ExecutionID: "e4"}, // no estimate
		{Agent: "a-architect", Room: room, Tokens: 100, ExecutionID: "e5"},
	} {
		d, err := old.Decide(context.Background(), policy.SendMessage, &in)
		require.NoError(t, err)
		require.True(t, d.Allow)
	}
	require.Equal(t, 5, oldEng.Ledger().Reservations())
	// e2's usage report is in ClickHouse; e5's arrives in the topic's tail.
	oldEng.Ledger().Spend(policy.Charge{Org: "org-acme", Owner: "u-alice", Agent: "a-architect", Room: room, Tokens: 90}, "e2", now, now)

	_, eng := process(t, clk, nil)
	r := restarted(t, eng, time.Now(), nil, clk.now)
	r.restored.settled = map[[2]string]time.Time{{"a-architect", "e2"}: now}
	for _, ev := range tr.events {
		require.True(t, r.restoreDecision(ev.ID, ev.OrgID, ev.Data))
	}
	assert.Equal(t, 3, eng.Ledger().Reservations(), "e1, e3 and e5")
	_, _, resT, resC := eng.Ledger().Spent("org-acme", policy.ScopeAgent, "a-architect", policy.PeriodDay, now)
	assert.Equal(t, int64(300), resT)
	assert.Equal(t, int64(5), resC)
	eng.Ledger().Spend(policy.Charge{Org: "org-acme", Owner: "u-alice", Agent: "a-architect", Room: room, Tokens: 80}, "e5", now, now)
	assert.Equal(t, 2, eng.Ledger().Reservations(), "the tail's usage report settles a restored reservation")

	assert.Zero(t, eng.Ledger().Expire(now.Add(policy.DefaultReservationTTL-time.Second)))
	assert.Equal(t, 2, eng.Ledger().Expire(now.Add(policy.DefaultReservationTTL+time.Second)), "with the decision's expiry")

	// Once caught up, nothing more is reserved on restore.
	r.caughtUp(&catchUp{start: now}, nil)
	_, eng2 := process(t, clk, nil)
	r2 := restarted(t, eng2, time.Now(), nil, clk.now)
	r2.restored.seen = nil
	for _, ev := range tr.events {
		r2.restoreDecision(ev.ID, ev.OrgID, ev.Data)
	}
	assert.Zero(t, eng2.Ledger().Reservations())
}

// A restored reservation holds its initiator again: a restart keeps the initiator's
// budget reserved, and the usage report of the execution settles it and counts on the
// initiator. The restarted replica learns the execution's initiator from the decision
// (chains), for the usage of the tail.
func TestRestoredReservationsKeepTheirInitiator(t *testing.T) {
	now := time.Now()
	clk := &clock{t: now}
	tr := &trail{}
	old, oldEng := process(t, clk, tr)
	b := policy.Budget{Org: "org-acme", Scope: policy.ScopeInitiator, ScopeID: "u-alice", Period: policy.PeriodDay, Tokens: 1000, Hard: true, UpdatedAt: now}
	b.Normalize()
	oldEng.Ledger().Set(b, now)
	d, err := old.Decide(context.Background(), policy.SendMessage, &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 600,
		ExecutionID: "e1", Chain: &policy.Chain{Depth: 2, Handoffs: 1, Initiator: "u-alice", InitiatorType: "user"}})
	require.NoError(t, err)
	require.True(t, d.Allow, "%+v", d)

	_, eng := process(t, clk, nil)
	eng.Ledger().Set(b, now)
	r := restarted(t, eng, time.Now(), nil, clk.now)
	for _, ev := range tr.events {
		r.chains.remember(ev.Data)
		require.True(t, r.restoreDecision(ev.ID, ev.OrgID, ev.Data))
	}
	_, _, reserved, _ := eng.Ledger().Spent("org-acme", policy.ScopeInitiator, "u-alice", policy.PeriodDay, now)
	assert.Equal(t, int64(600), reserved)
	deny, err := eng.SendMessage(context.Background(), policy.MessageInput{Agent: "a-architect", Room: "room-webhook-retries", Tokens: 500,
		Chain: &policy.Chain{Depth: 1, Initiator: "u-alice", InitiatorType: "user"}})
	require.NoError(t, err)
	assert.False(t, deny.Allow, "the restored reservation holds the initiator's budget")

	ev, err := schema.Decode([]byte(`{"id":"u-1","type":"usage.reported","time":"` + now.UTC().Format(time.RFC3339) + `","org_id":"org-acme","room_id":"room-webhook-retries","execution_id":"e1",` +
		`"actor":{"id":"a-coder","type":"agent"},"source":"t","data":{"input_tokens":200,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`))
	require.NoError(t, err)
	require.NoError(t, r.Apply(context.Background(), &ev))
	spent, _, reserved, _ := eng.Ledger().Spent("org-acme", policy.ScopeInitiator, "u-alice", policy.PeriodDay, now)
	assert.Equal(t, [2]int64{200, 0}, [2]int64{spent, reserved})
}
