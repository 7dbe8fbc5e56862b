package seal

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/pricing"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
)

// workload is canonical traffic: a person and an agent registered in org-1, then
// messages and usage reports by the agent (attributed and priced by ingest), and
// system events of no organization (the org "" chain).
func workload(prefix string, n int, at time.Time) []schema.Event {
	system := schema.Party{ID: "system", Type: schema.ActorSystem}
	user := schema.Party{ID: "user-1", Type: schema.ActorUser, Handle: "ann"}
	agent := schema.Party{ID: "agent-1", Type: schema.ActorAgent, Handle: "ann/bot"}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	evs := []schema.Event{
		{ID: "reg-user-1", Type: schema.TypeUserRegistered, Time: at, OrgID: "org-1", Actor: system, Subject: &user,
			Source: "test", SchemaVersion: 1, Data: raw(schema.UserData{Handle: "ann", Name: "Ann"})},
		{ID: "reg-agent-1", Type: schema.TypeAgentRegistered, Time: at, OrgID: "org-1", Actor: user, Subject: &agent,
			Source: "test", SchemaVersion: 1, Data: raw(schema.AgentData{Handle: "ann/bot", Name: "Bot", OwnerID: "user-1", Model: "claude-opus-4-6"})},
	}
	for i := range n {
		t := at.Add(time.Duration(i+1) * 700 * time.Millisecond)
		switch i % 4 {
		case 0, 1:
			evs = append(evs, schema.Event{ID: fmt.Sprintf("%s-msg-%d", prefix, i), Type: schema.TypeMessageCreated, Time: t,
				RoomID: "room-1", Actor: agent, Source: "test", SchemaVersion: 1, Data: raw(schema.MessageData{Content: fmt.Sprintf("hello %d", i)})})
		case 2:
			evs = append(evs, schema.Event{ID: fmt.Sprintf("%s-use-%d", prefix, i), Type: schema.TypeUsageReported, Time: t,
				RoomID: "room-1", Actor: agent, Source: "test", SchemaVersion: 1,
				Data: raw(schema.UsageData{InputTokens: int64(100 + i), OutputTokens: 20})})
		case 3:
			evs = append(evs, schema.Event{ID: fmt.Sprintf("%s-sys-%d", prefix, i), Type: "room.added", Time: t,
				Actor: system, Source: "test", SchemaVersion: 1, Data: raw(map[string]string{"room_id": fmt.Sprintf("r%d", i)})})
		}
	}
	return evs
}

type pipelineEnv struct {
	t     *testing.T
	conn  driver.Conn
	db    string
	topic string
	group string
	p     *kafka.Producer
}

func (e *pipelineEnv) produce(evs []schema.Event) {
	e.t.Helper()
	require.NoError(e.t, e.p.Produce(context.Background(), evs))
}

// drained waits until ingest has committed everything in the topic.
func (e *pipelineEnv) drained() {
	e.t.Helper()
	ok := stacktest.Eventually(e.t, 60*time.Second, 100*time.Millisecond, func() bool {
		lag, _, err := kafka.Lag(context.Background(), stacktest.Brokers(), e.topic, e.group)
		return err == nil && lag == 0
	})
	require.True(e.t, ok, "ingest did not catch up with topic %s", e.topic)
}

func (e *pipelineEnv) count(q string) uint64 {
	e.t.Helper()
	var n uint64
	require.NoError(e.t, e.conn.QueryRow(context.Background(), q).Scan(&n))
	return n
}

// The whole path, as serve runs it: events through Kafka and the real ingest consumer,
// a sealer every second whose audit.sealed events go through the same topic (and are
// sealed in their turn), an operator's `audit seal` at the same time, a replay of
// everything, a consumer restarted mid-stream and a reprice — and verify stays clean.
func TestIntegrationSealPipeline(t *testing.T) {
	conn, db := testDB(t)
	topic := stacktest.Topic(t, 4)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	e := &pipelineEnv{t: t, conn: conn, db: db, topic: topic, group: "ingest-" + topic, p: p}
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)

	stopIngest := stacktest.RunIngest(t, topic, conn, db, e.group)
	first := workload("a", 60, now.Add(-2*time.Hour))
	e.produce(first)
	e.drained()
	require.Equal(t, uint64(len(first)), e.count("SELECT count() FROM "+db+".events FINAL"))

	serveSealer := newSealer(t, conn, db, key, p, func(c *Config) { c.Every = time.Second })
	runCtx, stopRun := context.WithCancel(ctx)
	var runWG sync.WaitGroup
	runWG.Go(func() { assert.NoError(t, serveSealer.Run(runCtx)) })
	operator := newSealer(t, conn, db, key, p)

	check := func(step string) Report {
		t.Helper()
		time.Sleep(2500 * time.Millisecond) // serve's sealer: every second, settle 1 s
		// And an operator's thorough seal: on a loaded machine an insert can land after
		// serve's sealer looked past it (its next whole-margin look is minutes away).
		_, err := operator.SealNow(ctx)
		require.NoError(t, err)
		before := e.count("SELECT count() FROM " + db + ".events FINAL")
		rep := verify(t, conn, db, pubOf(key), Filter{})
		after := e.count("SELECT count() FROM " + db + ".events FINAL") // announcements keep coming
		assert.Empty(t, rep.Problems, step)
		assert.GreaterOrEqual(t, rep.SealedEvents+rep.UnsealedEvents, int(before), step)
		assert.LessOrEqual(t, rep.SealedEvents+rep.UnsealedEvents, int(after), step)
		t.Logf("%s: %d seals, %d sealed, %d unsealed", step, rep.Seals, rep.SealedEvents, rep.UnsealedEvents)
		assert.LessOrEqual(t, rep.UnsealedEvents, 12, "%s: only the latest announcements wait for a seal", step)
		return rep
	}

	require.Eventually(t, func() bool {
		return e.count("SELECT count() FROM "+db+".events WHERE type = 'audit.sealed'") >= 2
	}, 30*time.Second, 100*time.Millisecond, "the announcements of the first seals are ingested")
	_, err = operator.SealNow(ctx)
	require.NoError(t, err)
	rep := check("first seals")
	assert.GreaterOrEqual(t, rep.SealedEvents, len(first))

	// A replay: every event produced again.
	e.produce(first)
	e.drained()
	check("replay")

	// A consumer restarted mid-stream, twice.
	second := workload("b", 200, now.Add(-time.Hour))
	for i, part := range [][]schema.Event{second[:70], second[70:140], second[140:]} {
		e.produce(part)
		if i < 2 {
			time.Sleep(150 * time.Millisecond)
			stopIngest()
			stopIngest = stacktest.RunIngest(t, topic, conn, db, e.group)
		}
	}
	e.drained()
	_, err = operator.SealNow(ctx) // the operator at the same time as serve's sealer
	require.NoError(t, err)
	check("restarts")

	// A reprice with other prices rewrites usage rows, not the trail.
	cat, err := pricing.Parse([]byte(`{"version":"test-2","currency":"USD","models":[{"model":"claude-opus-4-6","provider":"anthropic",
		"input_per_mtok":"7.00","output_per_mtok":"30.00","cache_read_per_mtok":"0.70","cache_write_per_mtok":"8.00","effective":"2026-02-05"}]}`))
	require.NoError(t, err)
	st := store.New(conn, db)
	dir := ingest.NewDirectory()
	dirRows, err := st.LoadDirectory(ctx)
	require.NoError(t, err)
	dir.Load(dirRows)
	rp, err := ingest.Reprice(ctx, st, dir, cat, store.UsageFilter{From: now.Add(-3 * time.Hour), To: now.Add(time.Hour)})
	require.NoError(t, err)
	assert.Positive(t, rp.Changed)
	check("reprice")

	// Serve stops: ingest first, then the sealer's last seal.
	time.Sleep(1500 * time.Millisecond)
	stopIngest()
	stopRun()
	runWG.Wait()
	rep = check("stopped")
	assert.Zero(t, rep.UnsealedEvents-int(e.count("SELECT count() FROM "+db+".events WHERE type = 'audit.sealed' AND ingested_at >= (SELECT max(through) FROM "+db+".seals)")),
		"only announcements ingested after the last seal are left unsealed")
	sealedAnnouncements := e.count("SELECT count() FROM " + db + ".seal_entries WHERE id LIKE 'seal-%'")
	assert.Positive(t, sealedAnnouncements, "audit.sealed events are part of the trail and sealed too")
	assert.Positive(t, e.count("SELECT count() FROM "+db+".seal_entries WHERE org_id = ''"), "the org \"\" chain")

	// Tampering through the same path is still caught.
	mutate(t, conn, db, "events", "UPDATE data = '{}' WHERE id = 'b-msg-5'")
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Equal(t, []string{"modified b-msg-5"}, kinds(rep))
	// Cutting off the newest seals of org-1 is caught by the announcement of the first
	// one removed, which is in the trail.
	// (An announcement counts once it is older than verify's clock-skew allowance.)
	var seq uint64
	require.Eventually(t, func() bool {
		require.NoError(t, conn.QueryRow(ctx, "SELECT max(s.seq) FROM "+db+".seals AS s WHERE s.org_id = 'org-1' AND concat('seal-', s.hash) IN (SELECT id FROM "+db+".events WHERE type = 'audit.sealed' AND ingested_at < now() - 31)").Scan(&seq))
		return seq > 0
	}, 45*time.Second, 500*time.Millisecond)
	mutate(t, conn, db, "seals", fmt.Sprintf("DELETE WHERE org_id = 'org-1' AND seq >= %d", seq))
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Contains(t, kinds(rep), fmt.Sprintf("missing seal:org-1:%d", seq))
}

// An idle trail converges. Each seal is announced by an audit.sealed event, which
// ingest stores and the next run seals; a seal of announcements only is not announced
// in its turn, so the run after that finds nothing new — instead of one new seal per
// organization every run, forever.
func TestIntegrationSealIdle(t *testing.T) {
	conn, db := testDB(t)
	topic := stacktest.Topic(t, 1)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	e := &pipelineEnv{t: t, conn: conn, db: db, topic: topic, group: "ingest-" + topic, p: p}
	key := testKey(t)
	ctx := context.Background()
	stacktest.RunIngest(t, topic, conn, db, e.group)
	e.produce(workload("a", 12, time.Now().UTC().Add(-time.Hour)))
	e.drained()

	s := newSealer(t, conn, db, key, p) // settle 1 s
	var runs []Result
	for range 5 {
		time.Sleep(2100 * time.Millisecond) // rows stamped in second S are eligible once floor(now) − 1 s > S
		res, err := s.SealNow(ctx)
		require.NoError(t, err)
		runs = append(runs, res)
		e.drained() // its announcements are stored
	}
	t.Logf("runs: %+v", runs)
	orgs := runs[0].Orgs
	require.Positive(t, orgs)
	// The workload: one seal per organization, announced.
	assert.Equal(t, orgs, runs[0].Seals)
	assert.Equal(t, runs[0].Seals, runs[0].Emitted)
	assert.Zero(t, runs[0].Unannounced)
	// Its announcements, one per organization: sealed, not announced.
	assert.Equal(t, Result{Seals: orgs, Events: orgs, Orgs: orgs, Through: runs[1].Through, Unannounced: orgs}, runs[1])
	for i, res := range runs[2:] {
		assert.Zero(t, res.Seals, "run %d", i+3)
		assert.Zero(t, res.Emitted, "run %d", i+3)
	}
	assert.Equal(t, uint64(orgs), e.count("SELECT count() FROM "+db+".events WHERE type = 'audit.sealed'"))

	// serve's loop, every second for a few seconds: nothing to seal either.
	seals := e.count("SELECT count() FROM " + db + ".seals")
	runCtx, stop := context.WithTimeout(ctx, 4*time.Second)
	defer stop()
	require.NoError(t, newSealer(t, conn, db, key, p, func(c *Config) { c.Every = time.Second }).Run(runCtx))
	e.drained()
	assert.Equal(t, seals, e.count("SELECT count() FROM "+db+".seals"))
	assert.Equal(t, uint64(2*orgs), seals)

	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Zero(t, rep.UnsealedEvents)
	assert.Equal(t, int(e.count("SELECT count() FROM "+db+".events FINAL")), rep.SealedEvents)

	// New traffic is sealed and announced again, and the trail settles again.
	e.produce(workload("b", 4, time.Now().UTC().Add(-time.Hour)))
	e.drained()
	for i, want := range []int{orgs, 0} {
		time.Sleep(2100 * time.Millisecond)
		res, err := s.SealNow(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, res.Emitted, "run %d after new traffic", i+1)
		e.drained()
	}
	time.Sleep(2100 * time.Millisecond)
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Seals)
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Zero(t, rep.UnsealedEvents)
}
