package prices_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
)

// clock is a test's time: it moves only when the test moves it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

var base = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

func admin(id, org string) keys.Key { return keys.Key{ID: id, Org: org, Role: keys.RoleAdmin} }

// queueEnv is a price service on the test's clock whose jobs cover one day before it.
type queueEnv struct {
	*env
	clk *clock
	s   *prices.Service
}

func newQueueEnv(t *testing.T) *queueEnv {
	e := newEnv(t)
	clk := &clock{t: base}
	return &queueEnv{env: e, clk: clk, s: e.service("runner", func(c *prices.Config) { c.Now = clk.Now })}
}

// ask starts a reprice job of org by k at second sec after base.
func (q *queueEnv) ask(k keys.Key, org string, sec int) (prices.Job, error) {
	q.clk.Set(base.Add(time.Duration(sec) * time.Second))
	return q.s.StartReprice(context.Background(), k, org, base.Add(-48*time.Hour), base.Add(-24*time.Hour))
}

func (q *queueEnv) mustAsk(k keys.Key, org string, sec int) prices.Job {
	q.t.Helper()
	j, err := q.ask(k, org, sec)
	require.NoError(q.t, err, "%s for %s", k.ID, org)
	return j
}

// run runs the service's jobs until the test ends.
func (q *queueEnv) run() {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = q.s.Run(ctx) }()
	q.t.Cleanup(func() { stop(); <-done })
}

// waitState waits until every job of ids is in state want.
func (q *queueEnv) waitState(want prices.JobState, ids ...string) {
	q.t.Helper()
	var last prices.Job
	ok := stacktest.Eventually(q.t, 60*time.Second, 50*time.Millisecond, func() bool {
		for _, id := range ids {
			j, err := q.s.Job(context.Background(), keys.PlatformOrg, id)
			if err != nil || j.State != want {
				last = j
				return false
			}
		}
		return true
	})
	require.True(q.t, ok, "jobs %v are not all %s (job %s is %s: %s)", ids, want, last.ID, last.State, last.Error)
}

// started is the order of the job.started events of the trail's first n events.
func (q *queueEnv) started(n int) []string {
	var out []string
	for _, ev := range q.audit(n) {
		if ev.Type == prices.TypeJobStarted {
			out = append(out, ev.Subject.ID)
		}
	}
	return out
}

// Jobs queued by two tenants and the platform, in the order of their requests, are
// started in turns: each organization one job, then the next, the platform's in its
// turn, not after every tenant's.
func TestIntegrationRepriceClaimsTakeTurns(t *testing.T) {
	q := newQueueEnv(t)
	a1 := q.mustAsk(admin("ka1", "org-a"), "org-a", 1)
	a2 := q.mustAsk(admin("ka2", "org-a"), "org-a", 2)
	b1 := q.mustAsk(admin("kb1", "org-b"), "org-b", 3)
	b2 := q.mustAsk(admin("kb2", "org-b"), "org-b", 4)
	p1 := q.mustAsk(platformAdmin, keys.PlatformOrg, 5)
	q.clk.Set(base.Add(time.Minute))
	q.run()
	q.waitState(prices.JobDone, a1.ID, a2.ID, b1.ID, b2.ID, p1.ID)
	// The trail: the seed, then each job queued, started and finished.
	assert.Equal(t, []string{a1.ID, b1.ID, p1.ID, a2.ID, b2.ID}, q.started(1+5*3),
		"in turns (a1 b1 p1 a2 b2), not in the order asked (a1 a2 b1 b2 p1)")
}

// One tenant asking for job after job is refused past its shares, at once and as its
// own mistake, while another tenant and the platform still ask and their jobs run;
// rows written straight into the jobs table are neither run nor counted unless a
// request could have written them, and a heartbeat from the future holds nothing.
func TestIntegrationRepriceFloodIsRefusedOthersRun(t *testing.T) {
	q := newQueueEnv(t)
	ctx := context.Background()
	a1 := q.mustAsk(admin("ka1", "org-a"), "org-a", 1)
	_, err := q.ask(admin("ka1", "org-a"), "org-a", 2)
	require.ErrorIs(t, err, schema.ErrTooMany)
	assert.ErrorContains(t, err, "requester ka1 already has 1 reprice job queued or running; at most 1 (MaxJobsPerKey)")
	a2 := q.mustAsk(admin("ka2", "org-a"), "org-a", 3)
	for i := range 20 {
		_, err := q.ask(admin("ka-flood", "org-a"), "org-a", 4+i)
		require.ErrorIs(t, err, schema.ErrTooMany)
		assert.False(t, errors.Is(err, schema.ErrConflict) || errors.Is(err, schema.ErrInvalid))
		assert.ErrorContains(t, err, "organization org-a already has 2 reprice jobs queued or running; at most 2 (MaxJobsPerOrg)")
	}

	st := store.New(q.conn, q.db)
	row := func(id, org, by string, from, to time.Time) store.JobRow {
		return store.JobRow{ID: id, OrgID: org, Kind: prices.KindReprice, From: from, To: to, State: string(prices.JobQueued),
			RequestedBy: by, RequestedAt: base.Add(-time.Hour), CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1}
	}
	// Every organization over the whole DateTime range: some 49,000 days.
	huge := row(schema.NewID(), keys.PlatformOrg, "mallory", time.Unix(1, 0), time.Date(2106, 1, 1, 0, 0, 0, 0, time.UTC))
	// A row of org-b's second key that is no job: it must not take that key's place.
	noID := row("not a job id!", "org-b", "kb2", base.Add(-48*time.Hour), base.Add(-24*time.Hour))
	// A running job of org-c whose heartbeat is a century ahead: it keeps no scope, and a
	// runner takes it over (one day of work, as a request could have asked).
	ghost := row(schema.NewID(), "org-c", "kc", base.Add(-48*time.Hour), base.Add(-24*time.Hour))
	ghost.State, ghost.Runner, ghost.HeartbeatAt = string(prices.JobRunning), "ghost", base.Add(100*365*24*time.Hour)
	for _, r := range []store.JobRow{huge, noID, ghost} {
		require.NoError(t, st.InsertJob(ctx, r))
	}

	b1 := q.mustAsk(admin("kb1", "org-b"), "org-b", 30)
	b2 := q.mustAsk(admin("kb2", "org-b"), "org-b", 31)
	p1 := q.mustAsk(platformAdmin, keys.PlatformOrg, 32)
	q.clk.Set(base.Add(time.Minute))
	q.run()
	q.waitState(prices.JobDone, a1.ID, a2.ID, b1.ID, b2.ID, p1.ID, ghost.ID)

	all, err := q.s.Jobs(ctx, keys.PlatformOrg, 100)
	require.NoError(t, err)
	seen := 0
	for _, j := range all {
		switch j.ID {
		case huge.ID, noID.ID:
			seen++
			assert.Equal(t, prices.JobQueued, j.State, "never run: %s", j.ID)
			assert.True(t, j.StartedAt.IsZero(), j.ID)
		case ghost.ID:
			assert.Equal(t, "runner", j.Runner, "taken over")
		}
	}
	assert.Equal(t, 2, seen)
	assert.Len(t, all, 5+3, "the refused requests left no job")

	// Its jobs done, org-a asks again.
	q.mustAsk(admin("ka-flood", "org-a"), "org-a", 70)
}

// While a tenant's job runs elsewhere, the platform's job (which overlaps it) waits,
// and the jobs whose turn comes after the platform's wait behind it rather than keep
// the runners busy: when the running job ends, the platform's starts before them.
func TestIntegrationPlatformJobWaitsItsTurnNotForever(t *testing.T) {
	q := newQueueEnv(t)
	ctx := context.Background()
	// org-a's job, running on another runner that keeps its heartbeat fresh.
	elsewhere := store.JobRow{ID: schema.NewID(), OrgID: "org-a", Kind: prices.KindReprice, From: base.Add(-48 * time.Hour), To: base.Add(-24 * time.Hour),
		State: string(prices.JobRunning), Runner: "elsewhere", RequestedBy: "ka0", RequestedAt: base, StartedAt: base,
		HeartbeatAt: base.Add(time.Minute), CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1}
	require.NoError(t, store.New(q.conn, q.db).InsertJob(ctx, elsewhere))
	a1 := q.mustAsk(admin("ka1", "org-a"), "org-a", 1)
	b1 := q.mustAsk(admin("kb1", "org-b"), "org-b", 2)
	p1 := q.mustAsk(platformAdmin, keys.PlatformOrg, 3)
	b2 := q.mustAsk(admin("kb2", "org-b"), "org-b", 4)
	q.clk.Set(base.Add(time.Minute))
	q.run()

	// b1 overlaps nothing running: it runs. a1 overlaps the running job, p1 every job.
	q.waitState(prices.JobDone, b1.ID)
	for _, id := range []string{a1.ID, p1.ID, b2.ID} {
		j, err := q.s.Job(ctx, keys.PlatformOrg, id)
		require.NoError(t, err)
		assert.Equal(t, prices.JobQueued, j.State, id)
	}
	_, err := q.s.Cancel(ctx, "test", elsewhere.ID)
	require.NoError(t, err)
	q.waitState(prices.JobDone, a1.ID, p1.ID, b2.ID)
	// The trail: the seed, four jobs queued, started and finished, the cancellation.
	assert.Equal(t, []string{b1.ID, a1.ID, p1.ID, b2.ID}, q.started(1+4*3+1),
		"b2 waited behind p1, whose turn came first, though nothing running overlapped b2")
}
