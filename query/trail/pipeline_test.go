package trail

import (
	"context"
	"crypto/ed25519"
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
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// kafkaSealer is a sealer on the real stored-events and checkpoints topics of topic.
func kafkaSealer(t *testing.T, conn driver.Conn, db, topic, group string, key ed25519.PrivateKey, priority uint8, every time.Duration) (*Sealer, Topics) {
	t.Helper()
	tp := Topics{Brokers: stacktest.Brokers(), Stored: stacktest.StoredTopic(topic), Checkpoints: topic + "_checkpoints", Priority: priority}
	require.NoError(t, EnsureTopics(context.Background(), tp, 1))
	s, closeAll, err := NewOnKafka(Config{Conn: conn, Database: db, Key: key, Every: every, Logger: stacktest.Logger(),
		Ingested: func(ctx context.Context) (map[int]int64, error) {
			return kafka.CommittedOffsets(ctx, stacktest.Brokers(), topic, group)
		},
		IngestTopic: topic, IngestGroup: group}, tp)
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAll() })
	return s, tp
}

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
// which notes what it stores on the stored-events topic; serve's sealer every second
// on that topic, an operator's `audit seal` taking it over at the same time, a replay
// of everything, a consumer restarted mid-stream, a reprice, a retried insert — and
// verify stays clean, against the checkpoints topic too; then an edit is caught.
func TestIntegrationSealPipeline(t *testing.T) {
	conn, db := testDB(t)
	topic := stacktest.Topic(t, 4)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	e := &pipelineEnv{t: t, conn: conn, db: db, topic: topic, group: "ingest-" + topic, p: p}
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)

	stopIngest := stacktest.RunIngest(t, topic, conn, db, e.group)
	first := workload("a", 60, now.Add(-2*time.Hour))
	e.produce(first)
	e.drained()
	require.Equal(t, uint64(len(first)), e.count("SELECT count() FROM "+db+".events FINAL"))

	serveSealer, tp := kafkaSealer(t, conn, db, topic, e.group, key, 0, time.Second)
	runCtx, stopRun := context.WithCancel(ctx)
	var runWG sync.WaitGroup
	runWG.Go(func() { assert.NoError(t, serveSealer.Run(runCtx)) })

	// check waits until the log covers every stored row, then verifies against the
	// checkpoints topic as well.
	check := func(step string) Report {
		t.Helper()
		var rep Report
		ok := stacktest.Eventually(t, 60*time.Second, 250*time.Millisecond, func() bool {
			latest, err := kafka.ReadLatest(ctx, stacktest.Brokers(), tp.Checkpoints)
			require.NoError(t, err)
			var ext []External
			for k, v := range latest {
				if k != CoverageKey {
					ext = append(ext, External{Source: "topic", Note: v})
				}
			}
			rep, err = Verify(ctx, conn, db, Keys{Anchors: []ed25519.PublicKey{pubOf(key)}}, Filter{Checkpoints: ext})
			require.NoError(t, err)
			require.Empty(t, rep.Problems, "%s: %v", step, rep.Problems)
			return rep.UnsealedEvents == 0
		})
		require.True(t, ok, "%s: %d events not sealed after a minute", step, rep.UnsealedEvents)
		assert.Equal(t, int(e.count("SELECT count() FROM "+db+".events FINAL")), rep.SealedEvents, step)
		t.Logf("%s: %d checkpoints, %d leaves, %d sealed events", step, rep.Checkpoints, rep.Leaves, rep.SealedEvents)
		return rep
	}
	check("first")

	// A replay: every event produced again. No leaf is added for what is stored.
	leaves := e.count("SELECT count() FROM " + db + ".log_index")
	e.produce(first)
	e.drained()
	check("replay")
	assert.Equal(t, leaves, e.count("SELECT count() FROM "+db+".log_index"), "a replay adds no leaf")

	// A consumer restarted mid-stream, twice, while the operator's `audit seal` takes
	// the topic over from serve's sealer.
	operator, _ := kafkaSealer(t, conn, db, topic, e.group, key, 1, time.Minute)
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
	res, err := operator.SealNow(ctx)
	require.NoError(t, err)
	t.Logf("operator: %+v", res)
	check("restarts")

	// A reprice with other prices rewrites usage rows, not the trail.
	cat, err := pricing.Parse([]byte(`{"version":"test-2","currency":"USD","models":[{"model":"claude-opus-4-6","provider":"anthropic",
		"input_per_mtok":"7.00","output_per_mtok":"30.00","cache_read_per_mtok":"0.70","cache_write_per_mtok":"8.00","effective":"2026-02-05"}]}`))
	require.NoError(t, err)
	st := store.New(conn, db)
	dir := directory.New()
	dirRows, err := st.LoadDirectory(ctx)
	require.NoError(t, err)
	dir.Load(dirRows)
	rp, err := ingest.Reprice(ctx, st, dir, cat, store.UsageFilter{From: now.Add(-3 * time.Hour), To: now.Add(time.Hour)})
	require.NoError(t, err)
	assert.Positive(t, rp.Changed)
	check("reprice")

	// An insert attempt that stored the events but not the batch (retried later):
	// an earlier copy of rows whose leaf is the retry's.
	var r store.EventRow
	rows, err := conn.Query(ctx, "SELECT "+eventCols+" FROM "+db+".events WHERE id = 'b-msg-4'")
	require.NoError(t, err)
	require.True(t, rows.Next())
	require.NoError(t, scanEvent(rows, &r))
	rows.Close()
	r.IngestedAt = r.IngestedAt.Add(-5 * time.Second)
	insert(t, conn, db, []store.EventRow{r})
	check("an earlier copy")

	// Serve stops: ingest first, then the sealer's last run.
	stopIngest()
	stopRun()
	runWG.Wait()
	rep := check("stopped")
	assert.Positive(t, e.count("SELECT count() FROM "+db+".log_leaves WHERE org_id = ''"), "the log of events without an organization")
	latest, err := kafka.ReadLatest(ctx, stacktest.Brokers(), tp.Checkpoints)
	require.NoError(t, err)
	assert.Contains(t, latest, CoverageKey, "a coverage note is published")
	assert.Len(t, rep.Heads, len(latest)-1, "the topic has every organization's checkpoint")

	// Tampering through the same path is still caught.
	mutate(t, conn, db, "events", "UPDATE data = '{}' WHERE id = 'b-msg-5'")
	rep, err = Verify(ctx, conn, db, Keys{Anchors: []ed25519.PublicKey{pubOf(key)}}, Filter{})
	require.NoError(t, err)
	assert.Equal(t, []string{"modified b-msg-5"}, kinds(rep))
}
