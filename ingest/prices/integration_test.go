package prices_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

var platformAdmin = keys.Key{ID: "key-platform-admin", Org: keys.PlatformOrg, Role: keys.RoleAdmin}

// env is one test's database, audit topic and producer.
type env struct {
	t        *testing.T
	conn     driver.Conn
	db       string
	topic    string
	producer *kafka.Producer
}

func newEnv(t *testing.T) *env {
	conn, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 1)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic, BatchSize: kafka.AuditBatchSize})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return &env{t: t, conn: conn, db: db, topic: topic, producer: p}
}

// service is a price service of its own, as another process would have.
func (e *env) service(runner string, tune func(*prices.Config)) *prices.Service {
	cfg := prices.Config{Conn: e.conn, Database: e.db, Seed: pricing.Default(), Auditor: e.producer, Logger: stacktest.Logger(),
		Refresh: 200 * time.Millisecond, Poll: 100 * time.Millisecond, Heartbeat: 300 * time.Millisecond, StaleAfter: 2 * time.Second,
		Retry: 50 * time.Millisecond, Runner: runner}
	if tune != nil {
		tune(&cfg)
	}
	s, err := prices.New(context.Background(), cfg)
	require.NoError(e.t, err)
	return s
}

// audit reads the audit events of the topic until want have arrived.
func (e *env) audit(want int) []schema.Event {
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: stacktest.Brokers(), Topic: e.topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close() //nolint:errcheck // a partition reader commits nothing
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out []schema.Event
	for len(out) < want {
		m, err := r.ReadMessage(ctx)
		require.NoError(e.t, err, "after %d audit events of %d", len(out), want)
		var ev schema.Event
		require.NoError(e.t, json.Unmarshal(m.Value, &ev))
		out = append(out, ev)
	}
	return out
}

// Upserts make catalog versions in ClickHouse, each with its price.set event; another
// process sees them on its next refresh; only platform admins may write.
func TestIntegrationUpsertVersionsAndAudit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.service("a", nil)
	assert.Equal(t, uint64(1), a.CurrentVersion(), "the empty table is seeded as version 1")
	b := e.service("b", nil) // a second process: the table is seeded already
	assert.Equal(t, uint64(1), b.CurrentVersion())

	eff := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	v, err := a.UpsertPrice(ctx, platformAdmin, prices.PriceInput{Model: "gpt-5-mini", Input: "0.3", Output: "2.5", CacheRead: "0.03", Effective: eff})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), v.CatalogVersion)
	assert.Equal(t, "0.3", v.Input)
	assert.Equal(t, "0.3", v.CacheWrite, "cache write defaults to the input price")
	assert.Equal(t, platformAdmin.ID, v.SetBy)
	assert.Equal(t, "2", a.Live().Current().Version(), "the writer prices with it at once")

	_, err = a.UpsertPrice(ctx, keys.Key{ID: "org-admin", Org: "acme", Role: keys.RoleAdmin}, prices.PriceInput{Model: "gpt-5-mini", Input: "0", Output: "0"})
	assert.ErrorIs(t, err, schema.ErrForbidden)
	_, err = a.UpsertPrice(ctx, platformAdmin, prices.PriceInput{Model: "gpt-5-mini", Input: "-1", Output: "x"})
	assert.True(t, errors.Is(err, schema.ErrInvalid))
	assert.Equal(t, uint64(2), a.CurrentVersion(), "refused upserts make no version")

	// b writes the next version on top of a's, though it had not refreshed yet.
	v, err = b.UpsertPrice(ctx, platformAdmin, prices.PriceInput{Model: "acme-llm", Input: "1", Output: "2", Effective: eff})
	require.NoError(t, err)
	assert.Equal(t, uint64(3), v.CatalogVersion)
	require.NoError(t, a.Refresh(ctx))
	cur := a.Live().Current()
	assert.Equal(t, "3", cur.Version())
	got, ok := cur.CostAt("gpt-5-mini", time.Now(), schema.UsageData{InputTokens: 1_000_000, OutputTokens: 1_000_000})
	require.True(t, ok)
	assert.Equal(t, int64(2_800_000), got, "a's change is in b's version")
	got, ok = cur.CostAt("gpt-5-mini", eff.Add(-time.Second), schema.UsageData{InputTokens: 1_000_000})
	require.True(t, ok)
	assert.Equal(t, int64(250_000), got, "before the new effective time: the seed's price")
	_, ok = cur.CostAt("acme-llm", eff.Add(-time.Second), schema.UsageData{InputTokens: 1})
	assert.False(t, ok, "a new model is unpriced before its first effective time")

	list, err := a.ListPrices(ctx)
	require.NoError(t, err)
	var mini []prices.PriceVersion
	for _, p := range list {
		if p.Model == "gpt-5-mini" {
			mini = append(mini, p)
		}
	}
	require.Len(t, mini, 2, "the seed's entry and the new one")
	assert.Equal(t, uint64(1), mini[0].CatalogVersion)
	assert.Equal(t, uint64(2), mini[1].CatalogVersion)
	assert.Equal(t, []string{"gpt-5-mini-2025-08-07"}, mini[1].Aliases)

	evs := e.audit(3)
	assert.Equal(t, prices.TypePriceSeeded, evs[0].Type)
	for i, ev := range evs[1:] {
		assert.Equal(t, prices.TypePriceSet, ev.Type)
		assert.Equal(t, platformAdmin.ID, ev.Actor.ID, "the actor is the API key")
		assert.Equal(t, "", ev.OrgID, "prices are platform-wide")
		assert.Equal(t, prices.Source, ev.Source)
		var d prices.PriceEventData
		require.NoError(t, json.Unmarshal(ev.Data, &d))
		assert.Equal(t, uint64(2+i), d.CatalogVersion)
	}
	var d prices.PriceEventData
	require.NoError(t, json.Unmarshal(evs[1].Data, &d))
	require.NotNil(t, d.Previous, "the entry it replaces in effect then")
	assert.Equal(t, "0.25", d.Previous.Input)
}

// usageRow is one usage fact priced with cat, as ingest would have stored it.
func usageRow(cat *pricing.Catalog, id, org, model string, at time.Time, in, out uint64) store.UsageRow {
	return ingest.PriceUsage(cat, store.UsageRow{EventID: id, Time: at, OrgID: org, OwnerID: "owner-" + org, AgentID: "agent-" + org,
		RoomID: "room-1", Model: model, InputTokens: in, OutputTokens: out}, nil)
}

type hourKey struct {
	org  string
	hour time.Time
}

// rollupHours reads usage_hourly FINAL summed per organization and hour.
func rollupHours(t *testing.T, conn driver.Conn, db string, from, to time.Time) (events map[hourKey]uint64, cost map[hourKey]decimal.Decimal) {
	rows, err := conn.Query(context.Background(), `SELECT org_id, hour, sum(events), sum(cost) FROM
		(SELECT org_id, hour, events, cost FROM `+db+`.usage_hourly FINAL WHERE hour >= ? AND hour < ?) AS h GROUP BY org_id, hour`, from, to)
	require.NoError(t, err)
	defer rows.Close()
	events, cost = map[hourKey]uint64{}, map[hourKey]decimal.Decimal{}
	for rows.Next() {
		var k hourKey
		var n uint64
		var c decimal.Decimal
		require.NoError(t, rows.Scan(&k.org, &k.hour, &n, &c))
		k.hour = k.hour.UTC()
		events[k], cost[k] = n, c
	}
	require.NoError(t, rows.Err())
	return events, cost
}

func count(t *testing.T, conn driver.Conn, q string, args ...any) uint64 {
	var n uint64
	require.NoError(t, conn.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// A reprice job of every organization over five days is stopped after two (its
// runner's context cancelled, as a serve's SIGTERM does): no event is ever counted
// twice, each hour is wholly at its old or its new prices, the days before the cursor
// are repriced, the answer says the figures are provisional; another runner resumes it
// from its checkpoint and the final sums are exactly the new prices'.
func TestIntegrationInterruptedRepriceNeverDoubleCounts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.service("runner-a", nil)
	st := store.New(e.conn, e.db)
	old := a.Live().Current()

	d0 := time.Now().UTC().Truncate(24 * time.Hour).Add(-8 * 24 * time.Hour)
	const nDays = 5
	end := d0.Add(nDays * 24 * time.Hour)
	orgs := []string{"acme", "globex", ""} // "" is the unattributed usage, in a job of every organization
	var rows []store.UsageRow
	for day := 0; day < nDays; day++ {
		for _, org := range orgs {
			for i := 0; i < 24; i++ {
				at := d0.Add(time.Duration(day)*24*time.Hour + time.Duration(i)*time.Hour + time.Duration(i*7)*time.Second + 250*time.Millisecond)
				model := "gpt-5-mini"
				if i%4 == 3 {
					model = "mystery-model" // unknown to the seed: unpriced
				}
				rows = append(rows, usageRow(old, fmt.Sprintf("%s-%d-%d", org, day, i), org, model, at, uint64(1000+37*i), uint64(500+11*day)))
			}
		}
	}
	require.NoError(t, st.InsertUsage(ctx, rows))
	var hours []store.HourKey
	for _, r := range rows {
		hours = append(hours, store.HourKey{OrgID: r.OrgID, Hour: r.Time.Truncate(time.Hour)})
	}
	require.NoError(t, st.RefreshRollup(ctx, hours))

	// New prices: gpt-5-mini for the whole range, the mystery model from day 2 on only.
	_, err := a.UpsertPrice(ctx, platformAdmin, prices.PriceInput{Model: "gpt-5-mini", Input: "0.4", Output: "3.3", Effective: d0.Add(-24 * time.Hour)})
	require.NoError(t, err)
	_, err = a.UpsertPrice(ctx, platformAdmin, prices.PriceInput{Model: "mystery-model", Input: "7", Output: "11", Effective: d0.Add(2 * 24 * time.Hour)})
	require.NoError(t, err)
	cur := a.Live().Current()
	require.Equal(t, "3", cur.Version())

	// What each hour must show before and after, from the rows themselves.
	oldHour, newHour := map[hourKey]int64{}, map[hourKey]int64{}
	newOrg, newUnpriced := map[string]int64{}, map[string]uint64{}
	for _, r := range rows {
		k := hourKey{r.OrgID, r.Time.Truncate(time.Hour)}
		oldHour[k] += r.CostMicros
		nr := ingest.PriceUsage(cur, r, nil)
		newHour[k] += nr.CostMicros
		newOrg[r.OrgID] += nr.CostMicros
		if !nr.Priced {
			newUnpriced[r.OrgID]++
		}
	}
	require.Equal(t, uint64(12), newUnpriced["acme"], "days 0 and 1 of the mystery model stay unpriced: no price was in effect")

	job, err := a.StartReprice(ctx, platformAdmin, keys.PlatformOrg, d0, end)
	require.NoError(t, err)
	assert.Equal(t, prices.JobQueued, job.State)
	assert.Equal(t, nDays, job.DaysTotal)

	// Runner a stops after two days.
	runCtx, stop := context.WithCancel(ctx)
	var once sync.Once
	a2 := e.service("runner-a", func(c *prices.Config) {
		c.OnProgress = func(j prices.Job) {
			if j.DaysDone == 2 {
				once.Do(stop)
			}
		}
	})
	done := make(chan struct{})
	go func() { defer close(done); _ = a2.Run(runCtx) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("runner a did not stop")
	}
	job, err = a.Job(ctx, keys.PlatformOrg, job.ID)
	require.NoError(t, err)
	require.Equal(t, prices.JobQueued, job.State, "an interrupted job goes back to the queue")
	require.Equal(t, uint64(3), job.CatalogVersion, "pinned at its start")
	require.Equal(t, d0.Add(2*24*time.Hour), job.Cursor, "checkpointed per day")
	assert.Equal(t, 2, job.DaysDone)

	// Never a second row, never a double count.
	require.Equal(t, uint64(len(rows)), count(t, e.conn, "SELECT count() FROM "+e.db+".usage FINAL"))
	require.Equal(t, uint64(len(rows)), count(t, e.conn, "SELECT uniqExact(event_id) FROM "+e.db+".usage"))
	events, cost := rollupHours(t, e.conn, e.db, d0, end)
	for k, n := range events {
		require.Equal(t, uint64(1), n, "hour %v counts its event once", k)
		c := cost[k]
		isOld, isNew := c.Equal(decimal.New(oldHour[k], -6)), c.Equal(decimal.New(newHour[k], -6))
		require.True(t, isOld || isNew, "hour %v is at its old (%d) or new (%d) prices, not %s", k, oldHour[k], newHour[k], c)
		switch {
		case k.hour.Before(job.Cursor):
			require.True(t, isNew, "hour %v before the cursor is repriced", k)
		case !k.hour.Before(job.Cursor.Add(24 * time.Hour)):
			require.True(t, isOld, "hour %v after the day in progress is untouched", k)
		}
	}
	require.Len(t, events, len(orgs)*nDays*24)
	q := query.New(e.conn, e.db)
	rep, err := q.Costs(ctx, query.CostQuery{OrgID: "acme", From: d0, To: end})
	require.NoError(t, err)
	require.Equal(t, uint64(nDays*24), rep.Totals[0].Events, "each event once, old price or new")
	require.Len(t, rep.Repricing, 1, "the figures are provisional")
	assert.Equal(t, job.ID, rep.Repricing[0].ID)
	assert.True(t, rep.Repricing[0].Provisional())
	rep, err = q.Costs(ctx, query.CostQuery{OrgID: "acme", From: end, To: end.Add(time.Hour)})
	require.NoError(t, err)
	assert.Empty(t, rep.Repricing, "a range the job does not cover is final")

	// Another runner resumes it from the checkpoint.
	var progress []prices.Job
	var mu sync.Mutex
	b := e.service("runner-b", func(c *prices.Config) {
		c.OnProgress = func(j prices.Job) { mu.Lock(); progress = append(progress, j); mu.Unlock() }
	})
	bctx, stopB := context.WithCancel(ctx)
	bdone := make(chan struct{})
	go func() { defer close(bdone); _ = b.Run(bctx) }()
	t.Cleanup(func() { stopB(); <-bdone })
	require.True(t, stacktest.Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		job, err = b.Job(ctx, keys.PlatformOrg, job.ID)
		return err == nil && job.State.Finished()
	}), "the job is resumed and finishes")
	require.Equal(t, prices.JobDone, job.State, job.Error)
	assert.Equal(t, nDays, job.DaysDone)
	assert.Equal(t, "runner-b", job.Runner)
	mu.Lock()
	require.NotEmpty(t, progress)
	assert.Equal(t, 3, progress[0].DaysDone, "resumed after the checkpoint, not from the start")
	mu.Unlock()

	require.Equal(t, uint64(len(rows)), count(t, e.conn, "SELECT count() FROM "+e.db+".usage FINAL"))
	events, cost = rollupHours(t, e.conn, e.db, d0, end)
	for k := range events {
		require.Equal(t, uint64(1), events[k])
		require.True(t, cost[k].Equal(decimal.New(newHour[k], -6)), "hour %v: %s, want %d", k, cost[k], newHour[k])
	}
	for _, org := range []string{"acme", "globex"} {
		rep, err = q.Costs(ctx, query.CostQuery{OrgID: org, From: d0, To: end})
		require.NoError(t, err)
		require.Len(t, rep.Totals, 1)
		assert.Equal(t, uint64(nDays*24), rep.Totals[0].Events, org)
		assert.Equal(t, decimal.New(newOrg[org], -6).StringFixed(6), rep.Totals[0].Cost.StringFixed(6), "%s: exactly the new prices", org)
		assert.Equal(t, newUnpriced[org], rep.Totals[0].UnpricedEvents, org)
		assert.Empty(t, rep.Repricing, "%s: final", org)
	}
	// The rows say which version priced them: the repriced ones 3, none older than the
	// one that priced them alike.
	assert.Equal(t, uint64(0), count(t, e.conn, "SELECT count() FROM "+e.db+".usage FINAL WHERE model = 'gpt-5-mini' AND catalog_version != '3'"))

	// Running it again changes nothing.
	j2, err := a.RunNow(ctx, "test", "acme", "", d0, end)
	require.NoError(t, err)
	assert.Equal(t, prices.JobDone, j2.State)
	assert.Equal(t, uint64(nDays*24), j2.RowsScanned)
	assert.Zero(t, j2.RowsChanged, "idempotent")

	// The trail: seed, two prices, then each job queued, started (the second start a
	// resumption) and finished.
	evs := e.audit(3 + 3 + 1 + 3)
	var types []string
	resumed := 0
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.Type == prices.TypeJobStarted {
			var d prices.JobEventData
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			if d.Resumed {
				resumed++
			}
		}
	}
	assert.Equal(t, []string{prices.TypePriceSeeded, prices.TypePriceSet, prices.TypePriceSet,
		prices.TypeJobQueued, prices.TypeJobStarted, prices.TypeJobStarted, prices.TypeJobFinished,
		prices.TypeJobQueued, prices.TypeJobStarted, prices.TypeJobFinished}, types)
	assert.Equal(t, 1, resumed)
}

// A cancelled job never runs; a job overlapping an unfinished one waits in the queue;
// jobs are seen by their organization only.
func TestIntegrationJobsCancelAndScope(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.service("r", nil)
	from, to := time.Now().UTC().Add(-72*time.Hour), time.Now().UTC()
	acmeAdmin := keys.Key{ID: "acme-admin", Org: "acme", Role: keys.RoleAdmin}
	j, err := s.StartReprice(ctx, acmeAdmin, "acme", from, to)
	require.NoError(t, err)
	all, err := s.StartReprice(ctx, platformAdmin, keys.PlatformOrg, from, to)
	require.NoError(t, err, "every organization's job overlaps acme's: it is queued, to run after it")
	assert.Equal(t, prices.JobQueued, all.State)
	other, err := s.StartReprice(ctx, keys.Key{ID: "globex-admin", Org: "globex", Role: keys.RoleAdmin}, "globex", from, to)
	require.NoError(t, err, "another organization's job does not conflict")

	list, err := s.Jobs(ctx, "acme", 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, j.ID, list[0].ID)
	_, err = s.Job(ctx, "acme", other.ID)
	assert.ErrorIs(t, err, schema.ErrNotFound, "globex's job is not acme's to see")
	_, err = s.CancelJob(ctx, acmeAdmin, other.ID)
	assert.ErrorIs(t, err, schema.ErrNotFound, "nor to cancel")
	listed, err := s.Jobs(ctx, keys.PlatformOrg, 10)
	require.NoError(t, err)
	assert.Len(t, listed, 3)

	c, err := s.CancelJob(ctx, acmeAdmin, j.ID)
	require.NoError(t, err)
	assert.Equal(t, prices.JobCancelled, c.State)
	_, err = s.CancelJob(ctx, acmeAdmin, j.ID)
	assert.ErrorIs(t, err, schema.ErrConflict, "already cancelled")
	j2, err := s.StartReprice(ctx, acmeAdmin, "acme", from, to)
	require.NoError(t, err, "a cancelled job is finished: a new one may start")

	// A runner runs the queued ones, never the cancelled one.
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx) }()
	require.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		a, err1 := s.Job(ctx, "acme", j2.ID)
		g, err2 := s.Job(ctx, "globex", other.ID)
		p, err3 := s.Job(ctx, keys.PlatformOrg, all.ID)
		return err1 == nil && err2 == nil && err3 == nil && a.State == prices.JobDone && g.State == prices.JobDone && p.State == prices.JobDone
	}))
	stop()
	<-done
	c, err = s.Job(ctx, "acme", j.ID)
	require.NoError(t, err)
	assert.Equal(t, prices.JobCancelled, c.State, "a runner's write never brings a finished job back")
	assert.True(t, c.StartedAt.IsZero(), "it never ran")
}
