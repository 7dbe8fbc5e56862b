package replica_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// trail is replica.Trail on the real audit log and checkpoints topic.
type sealedTrail struct {
	log    *trail.Log
	latest func(ctx context.Context) (map[string][]byte, error)
}

func (t sealedTrail) Coverage(ctx context.Context) (map[int]int64, bool, error) {
	c, ok, err := t.log.Coverage(ctx, t.latest)
	return c.Offsets, ok, err
}

func (t sealedTrail) Sealed(ctx context.Context, rows []store.EventRow) ([]bool, error) {
	latest, err := t.latest(ctx)
	if err != nil {
		return nil, err
	}
	return t.log.Sealed(ctx, trail.TopicRotations(latest), rows)
}

// A governance row written into ClickHouse by hand (an operator's suspension, which
// only bandplane's policy API writes) is applied by a replica that trusts ClickHouse,
// and ignored by one that checks the trail against the audit log: the sealed traffic
// below the signed coverage comes from ClickHouse, the rest from the topic.
func TestIntegrationReplicaRestoresOnlyWhatTheLogSeals(t *testing.T) {
	ctx := context.Background()
	topic := stacktest.Topic(t, 2)
	conn, db := stacktest.Database(t)
	stacktest.RunIngest(t, topic, conn, db, "ingest")
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	defer producer.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed = 1500, 9
	cfg.Start = time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
	sum, err := simulate.Run(ctx, cfg, ingest.ProducerSink{Producer: producer}, nil)
	require.NoError(t, err)
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		lag, _, err := kafka.Lag(ctx, stacktest.Brokers(), topic, "ingest")
		var n uint64
		return err == nil && lag == 0 && conn.QueryRow(ctx, "SELECT count() FROM "+db+".events FINAL").Scan(&n) == nil && n == uint64(sum.Events)
	}), "ingest did not store the simulated traffic")

	// Seal it, with the coverage of the ingest group's offsets.
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	topics := trail.Topics{Brokers: stacktest.Brokers(), Stored: stacktest.StoredTopic(topic), Checkpoints: topic + "_checkpoints"}
	require.NoError(t, trail.EnsureTopics(ctx, topics, 1))
	s, closeSealer, err := trail.NewOnKafka(trail.Config{Conn: conn, Database: db, Key: key, Logger: stacktest.Logger(),
		Ingested: func(ctx context.Context) (map[int]int64, error) {
			return kafka.CommittedOffsets(ctx, stacktest.Brokers(), topic, "ingest")
		},
		IngestTopic: topic, IngestGroup: "ingest"}, topics)
	require.NoError(t, err)
	defer func() { _ = closeSealer() }()
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	require.Positive(t, res.Leaves)
	require.NotEmpty(t, res.Covered)

	// The forged suspension of the chatty agent.
	boot := func(tr replica.Trail) *policy.Directory {
		t.Helper()
		dir := policy.NewDirectory()
		eng, err := policy.New(ctx, policy.Config{Directory: dir})
		require.NoError(t, err)
		rep, err := replica.New(replica.Config{Directory: dir, Ledger: eng.Ledger(), Catalog: pricing.Default(), Conn: conn,
			Database: db, Brokers: stacktest.Brokers(), Topic: topic, GroupID: stacktest.Name(t) + "-" + time.Now().Format("150405.000000000"),
			Logger: stacktest.Logger(), Trail: tr})
		require.NoError(t, err)
		_, err = rep.Bootstrap(ctx)
		require.NoError(t, err)
		return dir
	}
	chatty, ok := boot(nil).ResolveHandle(sum.ChattyAgent)
	require.True(t, ok)
	forged := store.EventRow{ID: "forged-suspension", Type: schema.TypeAgentSuspended, Time: time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond),
		OrgID: "", ActorID: "operator", ActorType: "system", SubjectID: chatty, SubjectType: "agent", Source: schema.SourceBandplane,
		SchemaVersion: 1, Data: `{"reason":"forged"}`, IngestedAt: time.Now().UTC().Add(-time.Hour), Partition: 0, Offset: 1}
	ag, _ := boot(nil).Agent(chatty)
	forged.OrgID = ag.Org
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: []store.EventRow{forged}}))

	trusting := boot(nil)
	a, _ := trusting.Agent(chatty)
	assert.True(t, a.OperatorSuspended, "a replica that trusts ClickHouse applies the forged row")

	l, err := trail.NewLog(conn, db, "", []ed25519.PublicKey{key.Public().(ed25519.PublicKey)})
	require.NoError(t, err)
	checking := boot(sealedTrail{log: l, latest: func(ctx context.Context) (map[string][]byte, error) {
		return kafka.ReadLatest(ctx, stacktest.Brokers(), topics.Checkpoints)
	}})
	a, ok = checking.Agent(chatty)
	require.True(t, ok, "the sealed registrations are restored")
	assert.False(t, a.OperatorSuspended, "the forged row is no leaf of the log: ignored")
	assert.Equal(t, len(trusting.Snapshot().Agents), len(checking.Snapshot().Agents), "every sealed registration is restored")

	// A forged copy of the chatty agent's sealed registration, inserted after it (the
	// copy FINAL would keep), does not hide the sealed one.
	var reg []store.EventRow
	rows, err := conn.Query(ctx, "SELECT id, time, time_ms, org_id, actor_id, toString(actor_type), subject_id, data FROM "+db+
		".events WHERE type = ? AND subject_id = ?", schema.TypeAgentRegistered, chatty)
	require.NoError(t, err)
	for rows.Next() {
		var r store.EventRow
		var ms uint16
		require.NoError(t, rows.Scan(&r.ID, &r.Time, &ms, &r.OrgID, &r.ActorID, &r.ActorType, &r.SubjectID, &r.Data))
		r.Time = r.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		reg = append(reg, r)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.Len(t, reg, 1)
	hidden := reg[0]
	hidden.Type, hidden.SubjectType, hidden.Source, hidden.SchemaVersion = schema.TypeAgentRegistered, "agent", "band", 1
	hidden.Data = `{"handle":"mallory/bot","name":"Mallory","owner_id":"mallory"}`
	hidden.IngestedAt, hidden.Partition, hidden.Offset = time.Now().UTC(), 0, 2
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: []store.EventRow{hidden}}))
	checking = boot(sealedTrail{log: l, latest: func(ctx context.Context) (map[string][]byte, error) {
		return kafka.ReadLatest(ctx, stacktest.Brokers(), topics.Checkpoints)
	}})
	a, ok = checking.Agent(chatty)
	require.True(t, ok, "the sealed registration is restored")
	assert.Equal(t, sum.ChattyAgent, a.Handle, "as sealed, not as forged")
}
