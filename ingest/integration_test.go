package ingest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
)

// pipeline is a real ingest consumer on a unique topic and database.
type pipeline struct {
	t        *testing.T
	topic    string
	conn     driver.Conn
	db       string
	producer *kafka.Producer
}

// newPipeline creates the topic and database; start runs the consumer.
func newPipeline(t *testing.T) *pipeline {
	topic := stacktest.Topic(t, 4)
	conn, db := stacktest.Database(t)
	p := &pipeline{t: t, topic: topic, conn: conn, db: db}
	var err error
	p.producer, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.producer.Close() })
	return p
}

// start runs the consumer; the returned function stops it gracefully: the consumer
// flushes and commits, then the rollup rebuilds every hour marked until then.
func (p *pipeline) start(group string) (stop func()) {
	return stacktest.RunIngest(p.t, p.topic, p.conn, p.db, group)
}

// simulate produces a seeded workload to the topic and returns the simulator's summary.
func (p *pipeline) simulate(events int, seed int64) simulate.Summary {
	return p.simulateFrom(events, seed, time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC))
}

// simulateFrom is simulate with the workload's clock starting at start.
func (p *pipeline) simulateFrom(events int, seed int64, start time.Time) simulate.Summary {
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed = events, seed
	cfg.Start = start
	sum, err := simulate.Run(context.Background(), cfg, ingest.ProducerSink{Producer: p.producer}, nil)
	require.NoError(p.t, err, "producing %d simulated events to %s", events, p.topic)
	require.Equal(p.t, events, sum.Events, "events the simulator produced")
	return sum
}

type sums struct {
	Events                               uint64
	Input, Output, CacheRead, CacheWrite uint64
	CostMicros                           int64
	Unpriced                             uint64
	RollupInput, RollupOutput            uint64
	RollupCostMicros                     int64
	RollupEvents                         uint64
}

func (p *pipeline) sums() sums {
	ctx := context.Background()
	var s sums
	// The simulator's events: bandplane's own (the seals' announcements, the price
	// catalog's seeding by serve) are not among them.
	require.NoError(p.t, p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".events FINAL WHERE lower(source) NOT LIKE 'bandplane%'").Scan(&s.Events))
	var cost, rcost decimal.Decimal
	require.NoError(p.t, p.conn.QueryRow(ctx, `SELECT sum(input_tokens), sum(output_tokens), sum(cache_read_tokens),
		sum(cache_write_tokens), sum(cost), countIf(priced = 0) FROM `+p.db+`.usage FINAL`).
		Scan(&s.Input, &s.Output, &s.CacheRead, &s.CacheWrite, &cost, &s.Unpriced))
	require.NoError(p.t, p.conn.QueryRow(ctx, `SELECT sum(events), sum(input_tokens), sum(output_tokens), sum(cost)
		FROM `+p.db+`.usage_hourly FINAL`).Scan(&s.RollupEvents, &s.RollupInput, &s.RollupOutput, &rcost))
	s.CostMicros = cost.Shift(6).IntPart()
	s.RollupCostMicros = rcost.Shift(6).IntPart()
	return s
}

func expected(sum simulate.Summary) sums {
	return sums{
		Events: uint64(sum.Events), Input: uint64(sum.InputTokens), Output: uint64(sum.OutputTokens),
		CacheRead: uint64(sum.CacheReadTokens), CacheWrite: uint64(sum.CacheWriteTokens),
		CostMicros: sum.CostMicros, Unpriced: uint64(sum.UnpricedEvents),
		RollupInput: uint64(sum.InputTokens), RollupOutput: uint64(sum.OutputTokens),
		RollupCostMicros: sum.CostMicros, RollupEvents: uint64(sum.UsageEvents),
	}
}

// waitSums waits until the database holds exactly want, and fails with the last
// difference if it does not within timeout.
func (p *pipeline) waitSums(want sums, timeout time.Duration) {
	p.t.Helper()
	var got sums
	ok := stacktest.Eventually(p.t, timeout, 250*time.Millisecond, func() bool {
		got = p.sums()
		return got == want
	})
	if !ok {
		assert.Equal(p.t, want, got, "database sums never matched the simulator's summary")
		p.logRollupDiff()
		p.t.FailNow()
	}
}

// logRollupDiff logs the (org, hour, agent, model) groups where the rollup disagrees
// with usage FINAL, to tell a missed rebuild from a wrong one.
func (p *pipeline) logRollupDiff() {
	rows, err := p.conn.Query(context.Background(), `SELECT org_id, h, agent_id, model, ue, re, toString(uc), toString(rc) FROM
		(SELECT org_id, toStartOfHour(time) AS h, agent_id, model, count() AS ue, sum(cost) AS uc
		 FROM `+p.db+`.usage FINAL GROUP BY org_id, h, agent_id, model)
		FULL OUTER JOIN
		(SELECT org_id, hour AS h, agent_id, model, sum(events) AS re, sum(cost) AS rc
		 FROM `+p.db+`.usage_hourly FINAL GROUP BY org_id, h, agent_id, model)
		USING (org_id, h, agent_id, model) WHERE ue != re OR uc != rc ORDER BY h LIMIT 20`)
	if err != nil {
		p.t.Logf("cannot compare rollup with usage: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var org, agent, model, uc, rc string
		var h time.Time
		var ue, re uint64
		if err := rows.Scan(&org, &h, &agent, &model, &ue, &re, &uc, &rc); err != nil {
			p.t.Logf("cannot read rollup difference: %v", err)
			return
		}
		p.t.Logf("rollup differs: org %q hour %s agent %s model %q: usage %d events cost %s, rollup %d events cost %s",
			org, h.UTC().Format(time.RFC3339), agent, model, ue, uc, re, rc)
	}
}

func (p *pipeline) rawCount(table string) uint64 {
	var n uint64
	require.NoError(p.t, p.conn.QueryRow(context.Background(), "SELECT count() FROM "+p.db+"."+table).Scan(&n))
	return n
}

// waitLag waits until the consumer group has committed everything in the topic.
func (p *pipeline) waitLag(group string, timeout time.Duration) {
	p.t.Helper()
	var lag int64
	ok := stacktest.Eventually(p.t, timeout, 200*time.Millisecond, func() bool {
		var err error
		lag, _, err = kafka.Lag(context.Background(), stacktest.Brokers(), p.topic, group)
		return err == nil && lag == 0
	})
	require.True(p.t, ok, "consumer lag still %d", lag)
}

func TestIntegrationPipelineReconcilesAndReplayIsIdempotent(t *testing.T) {
	p := newPipeline(t)
	stop := p.start("ingest")
	sum := p.simulate(5000, 7)
	require.Greater(t, sum.UsageEvents, 50, "the workload should report usage")
	require.Greater(t, sum.CostMicros, int64(0))
	want := expected(sum)
	p.waitSums(want, 60*time.Second)

	// Produce exactly the same events again: nothing that queries read changes.
	again := p.simulate(5000, 7)
	require.Equal(t, sum.CostMicros, again.CostMicros)
	// Offsets are committed only after a batch is in ClickHouse, so lag 0 means the
	// replayed copies have been written; stopping the pipeline then has the rollup
	// rebuild every hour they touched before it returns.
	p.waitLag("ingest", 60*time.Second)
	stop()
	assert.Greater(t, p.rawCount("usage"), uint64(0))
	if !assert.Equal(t, want, p.sums(), "replaying the same events changed a sum") {
		rows, err := p.conn.Query(context.Background(), "SELECT id, type, groupArray(org_id), groupArray(toString(time)), any(actor_id), any(subject_id) FROM "+p.db+".events FINAL GROUP BY id, type HAVING count() > 1 LIMIT 20")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var id, typ, actor, subject string
			var orgs, times []string
			require.NoError(t, rows.Scan(&id, &typ, &orgs, &times, &actor, &subject))
			t.Logf("doubled: %s %s orgs=%v times=%v actor=%s subject=%s", id, typ, orgs, times, actor, subject)
		}
		require.NoError(t, rows.Err())
	}
}

func TestIntegrationPoisonRecordsGoToDeadLetters(t *testing.T) {
	p := newPipeline(t)
	p.start("ingest")
	ctx := context.Background()
	good := p.simulate(1000, 3)
	poison := []struct{ value, reason string }{
		{`{"topic":"chat_room:r1","event":"message_created","payload":`, "invalid JSON"},
		{`{"id":"e1","type":"usage.reported","time":"2026-11-02T10:00:00Z","org_id":"o","actor":{"id":"a","type":"agent"},"source":"t","schema_version":1,"data":{"input_tokens":-5,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0}}`, "negative"},
		{`["not","an","event"]`, "object"},
	}
	var msgs []kafkaMessage
	for _, pz := range poison {
		msgs = append(msgs, kafkaMessage{Key: []byte("poison"), Value: []byte(pz.value)})
	}
	require.NoError(t, p.producer.ProduceMessages(ctx, msgs))
	after := p.simulate(1000, 4) // the stream goes on after the poison
	want := expected(good)
	want.Events += uint64(after.Events)
	// Only event counts are simple to combine across two runs; check those and the dead letters.
	require.True(t, stacktest.Eventually(t, 60*time.Second, 250*time.Millisecond, func() bool {
		return p.sums().Events == want.Events && p.rawCount("dead_letters") == uint64(len(poison))
	}), "events %d (want %d), dead letters %d (want %d)", p.sums().Events, want.Events, p.rawCount("dead_letters"), len(poison))

	rows, err := p.conn.Query(ctx, "SELECT raw, stage, reason, topic FROM "+p.db+".dead_letters ORDER BY offset")
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var raw, stage, reason, topic string
		require.NoError(t, rows.Scan(&raw, &stage, &reason, &topic))
		assert.Equal(t, p.topic, topic)
		got[raw] = stage + ": " + reason
	}
	require.NoError(t, rows.Err())
	for _, pz := range poison {
		assert.Contains(t, got[pz.value], pz.reason, "dead letter for %s", pz.value)
	}
}

func TestIntegrationLateRegistrationIsRepricedAndReplaysStillCountOnce(t *testing.T) {
	p := newPipeline(t)
	stop := p.start("ingest")
	ctx := context.Background()
	usage := eventLine("late-u1", "usage.reported", "agent-late", "agent", "", usageData)
	msg := eventLine("late-m1", "message.created", "agent-late", "agent", "", `{"content":"hello"}`)
	produce := func(lines ...string) {
		var msgs []kafkaMessage
		for _, l := range lines {
			msgs = append(msgs, kafkaMessage{Key: []byte("room-1"), Value: []byte(l)})
		}
		require.NoError(t, p.producer.ProduceMessages(ctx, msgs))
	}
	produce(usage, msg)
	p.waitLag("ingest", 30*time.Second)
	var priced uint8
	var org, model string
	require.NoError(t, p.conn.QueryRow(ctx, "SELECT priced, org_id, model FROM "+p.db+".usage FINAL").Scan(&priced, &org, &model))
	require.Equal(t, uint8(0), priced, "no model is known yet")
	require.Equal(t, "", org)
	require.Equal(t, ingest.Unknown, model)

	// The registration arrives later, in another batch: the usage gets priced.
	produce(registration("agent-late", "owner-1", "org-9", "gpt-5-mini"))
	want, ok := pricing.Default().Cost("gpt-5-mini", mustUsage(t, usageData))
	require.True(t, ok)
	var cost decimal.Decimal
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		err := p.conn.QueryRow(ctx, "SELECT priced, model, cost FROM "+p.db+".usage FINAL").Scan(&priced, &model, &cost)
		return err == nil && priced == 1
	}), "usage was not repriced after the registration")
	assert.Equal(t, "gpt-5-mini", model)
	assert.Equal(t, want, cost.Shift(6).IntPart())

	// Replaying the early events (now attributable) must not add rows to any sum. Lag 0:
	// the replayed copies are stored; the stop: the rollup has rebuilt their hours.
	produce(usage, msg)
	p.waitLag("ingest", 30*time.Second)
	stop()
	s := p.sums()
	assert.Equal(t, uint64(3), s.Events, "two events and the registration, each once")
	assert.Equal(t, uint64(1000), s.Input)
	assert.Equal(t, want, s.CostMicros)
	assert.Equal(t, want, s.RollupCostMicros)
}

// TestIntegrationLateRegistrationRepricesOnlyItsOwnUsage: two organizations' usage
// names the same agent id, which nobody has registered; the id then registers in one
// of them. That organization's usage, and the usage stored without organization, are
// the agent's and get priced; the other organization's stays unpriced, model unknown.
func TestIntegrationLateRegistrationRepricesOnlyItsOwnUsage(t *testing.T) {
	p := newPipeline(t)
	p.start("ingest")
	ctx := context.Background()
	p.produceLines(
		eventLine("same-id-mine", "usage.reported", "agent-same", "agent", "org-mine", usageData),
		eventLine("same-id-other", "usage.reported", "agent-same", "agent", "org-other", usageData),
		eventLine("same-id-none", "usage.reported", "agent-same", "agent", "", usageData),
	)
	p.waitLag("ingest", 30*time.Second)
	require.Equal(t, uint64(3), p.count("SELECT count() FROM "+p.db+".usage FINAL WHERE priced = 0 AND model = ?", ingest.Unknown),
		"no model is known yet")
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return p.count("SELECT sum(events) FROM "+p.db+".usage_hourly FINAL") == 3
	}), "the rollup of the three organizations' hour was not built")

	p.produceLines(registration("agent-same", "owner-1", "org-mine", "gpt-5-mini"))
	want, ok := pricing.Default().Cost("gpt-5-mini", mustUsage(t, usageData))
	require.True(t, ok)
	// The rollup of org-mine's hour holds the new cost only once its reprice is done:
	// one insert of every row it changed, so the other organization's row is settled too.
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		var cost decimal.Decimal
		err := p.conn.QueryRow(ctx, "SELECT sum(cost) FROM "+p.db+".usage_hourly FINAL WHERE org_id = 'org-mine'").Scan(&cost)
		return err == nil && cost.Shift(6).IntPart() == want
	}), "org-mine's usage was not repriced after the registration")

	type usage struct {
		Model  string
		Priced uint8
		Cost   int64
	}
	got := map[string]usage{}
	rows, err := p.conn.Query(ctx, "SELECT org_id, model, priced, cost FROM "+p.db+".usage FINAL")
	require.NoError(t, err)
	for rows.Next() {
		var org string
		var u usage
		var cost decimal.Decimal
		require.NoError(t, rows.Scan(&org, &u.Model, &u.Priced, &cost))
		u.Cost = cost.Shift(6).IntPart()
		got[org] = u
	}
	require.NoError(t, rows.Err())
	rows.Close()
	assert.Equal(t, map[string]usage{
		"org-mine":  {Model: "gpt-5-mini", Priced: 1, Cost: want},
		"":          {Model: "gpt-5-mini", Priced: 1, Cost: want},
		"org-other": {Model: ingest.Unknown, Priced: 0, Cost: 0},
	}, got)
	var otherModels []string
	var otherCost decimal.Decimal
	require.NoError(t, p.conn.QueryRow(ctx, "SELECT groupUniqArray(model), sum(cost) FROM "+p.db+".usage_hourly FINAL WHERE org_id = 'org-other'").
		Scan(&otherModels, &otherCost))
	assert.Equal(t, []string{ingest.Unknown}, otherModels, "org-other's rollup keeps its usage under model unknown")
	assert.True(t, otherCost.IsZero(), "org-other's rollup keeps its usage unpriced, got %s", otherCost)
}

// produceLines writes raw lines to the pipeline's topic, all keyed by one room (one
// partition, in order).
func (p *pipeline) produceLines(lines ...string) {
	p.t.Helper()
	msgs := make([]kafkaMessage, len(lines))
	for i, l := range lines {
		msgs[i] = kafkaMessage{Key: []byte("room-1"), Value: []byte(l)}
	}
	require.NoError(p.t, p.producer.ProduceMessages(context.Background(), msgs))
}

func (p *pipeline) count(q string, args ...any) uint64 {
	p.t.Helper()
	var n uint64
	require.NoError(p.t, p.conn.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// lineAt is a message.created event at a given time.
func lineAt(id, org string, at time.Time, room, content string) string {
	return fmt.Sprintf(`{"id":%q,"type":"message.created","time":%q,"org_id":%q,"room_id":%q,"actor":{"id":"u1","type":"user"},"source":"test","schema_version":1,"data":{"content":%q}}`,
		id, at.UTC().Format(time.RFC3339Nano), org, room, content)
}

type deadLetterRow struct {
	Raw, Stage, Reason string
	Offset             int64
	RawBytes           uint64
	RawTruncated       uint8
}

func (p *pipeline) deadLetters() []deadLetterRow {
	p.t.Helper()
	rows, err := p.conn.Query(context.Background(), "SELECT raw, stage, reason, offset, raw_bytes, raw_truncated FROM "+p.db+".dead_letters FINAL ORDER BY offset")
	require.NoError(p.t, err)
	defer rows.Close()
	var out []deadLetterRow
	for rows.Next() {
		var d deadLetterRow
		require.NoError(p.t, rows.Scan(&d.Raw, &d.Stage, &d.Reason, &d.Offset, &d.RawBytes, &d.RawTruncated))
		out = append(out, d)
	}
	require.NoError(p.t, rows.Err())
	return out
}

// readDeadLetterTopic reads n messages from the pipeline's dead-letter topic.
func (p *pipeline) readDeadLetterTopic(n int) []kafkago.Message {
	p.t.Helper()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: stacktest.Brokers(), Topic: p.topic + "_dlq", Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close() //nolint:errcheck // a partition reader commits nothing
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []kafkago.Message
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		require.NoError(p.t, err, "read %d of %d dead letters from the topic", len(out), n)
		out = append(out, m)
	}
	return out
}

// TestIntegrationRefusedRowIsIsolatedAndIngestGoesOn gives the events table a column
// that refuses one room (a constraint ClickHouse enforces for good), sends one such
// record among many good ones: everything else lands, that record is dead-lettered
// with ClickHouse's reason, and ingest continues with later records.
func TestIntegrationRefusedRowIsIsolatedAndIngestGoesOn(t *testing.T) {
	p := newPipeline(t)
	ctx := context.Background()
	require.NoError(t, p.conn.Exec(ctx, "ALTER TABLE "+p.db+".events ADD COLUMN poison UInt8 MATERIALIZED throwIf(room_id = 'poison-room')"))
	p.start("ingest")
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	var lines []string
	for i := range 400 {
		room := "room-1"
		if i == 217 {
			room = "poison-room"
		}
		lines = append(lines, lineAt(fmt.Sprintf("g%d", i), "org-1", at.Add(time.Duration(i)*time.Millisecond), room, "hello"))
	}
	p.produceLines(lines...)
	p.waitLag("ingest", 60*time.Second)
	assert.Equal(t, uint64(399), p.count("SELECT count() FROM "+p.db+".events FINAL"), "everything but the refused record landed")
	assert.Zero(t, p.count("SELECT count() FROM "+p.db+".events WHERE id = 'g217'"))
	dls := p.deadLetters()
	require.Len(t, dls, 1)
	d := dls[0]
	assert.Equal(t, "store", d.Stage)
	assert.Contains(t, d.Reason, "code: 395")
	assert.Contains(t, d.Reason, "throwIf")
	assert.Equal(t, lines[217], d.Raw)
	assert.Equal(t, uint64(len(lines[217])), d.RawBytes)
	assert.Zero(t, d.RawTruncated)
	m := p.readDeadLetterTopic(1)[0]
	assert.Equal(t, lines[217], string(m.Value))
	stage := ""
	for _, h := range m.Headers {
		if h.Key == "bandplane-stage" {
			stage = string(h.Value)
		}
	}
	assert.Equal(t, "store", stage)

	// Ingest goes on with later records.
	p.produceLines(lineAt("after-1", "org-1", at, "room-1", "later"), lineAt("after-2", "org-1", at, "room-1", "later"))
	p.waitLag("ingest", 30*time.Second)
	assert.Equal(t, uint64(401), p.count("SELECT count() FROM "+p.db+".events FINAL"))
	assert.Len(t, p.deadLetters(), 1)
}

// TestIntegrationReusedIDNeverReplacesTheOriginal: a later event with the same id,
// organization and time but other data is dead-lettered and the original stays; the
// identical event again is a replay: no dead letter, no second row.
func TestIntegrationReusedIDNeverReplacesTheOriginal(t *testing.T) {
	p := newPipeline(t)
	p.start("ingest")
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	orig := lineAt("evt-1", "org-1", at, "room-1", "the original")
	p.produceLines(orig)
	p.waitLag("ingest", 30*time.Second)
	require.Equal(t, uint64(1), p.count("SELECT count() FROM "+p.db+".events"))
	var ingested time.Time
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT ingested_at FROM "+p.db+".events").Scan(&ingested))

	p.produceLines(lineAt("evt-1", "org-1", at, "room-1", "a forgery"))
	p.waitLag("ingest", 30*time.Second)
	var data string
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT data FROM "+p.db+".events FINAL").Scan(&data))
	assert.Contains(t, data, "the original")
	assert.Equal(t, uint64(1), p.count("SELECT count() FROM "+p.db+".events"), "the forgery was never written")
	dls := p.deadLetters()
	require.Len(t, dls, 1)
	assert.Equal(t, "store", dls[0].Stage)
	assert.Contains(t, dls[0].Reason, ingest.ReasonIDReused)
	assert.Contains(t, dls[0].Reason, "evt-1")
	assert.Contains(t, dls[0].Raw, "a forgery")

	// Once the clock is a second past the original's ingested_at (DateTime: seconds), a
	// rewrite would show a later one.
	require.True(t, stacktest.Eventually(t, 3*time.Second, 10*time.Millisecond, func() bool {
		return !time.Now().Before(ingested.Add(time.Second))
	}))
	p.produceLines(orig)
	p.waitLag("ingest", 30*time.Second)
	assert.Len(t, p.deadLetters(), 1, "a replay is not a reuse")
	assert.Equal(t, uint64(1), p.count("SELECT count() FROM "+p.db+".events"), "a replay is not written again")
	var again time.Time
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT ingested_at FROM "+p.db+".events").Scan(&again))
	assert.Equal(t, ingested, again, "the original keeps its ingested_at")
}

// TestIntegrationBatchSpanning250DaysLandsWhole: one batch of events and usage over
// 250 daily partitions (current ClickHouse refuses more than 100 in one INSERT block).
func TestIntegrationBatchSpanning250DaysLandsWhole(t *testing.T) {
	p := newPipeline(t)
	reg := registration("agent-d", "owner-1", "org-1", "gpt-5-mini")
	start := time.Now().UTC().AddDate(0, 0, -260).Truncate(time.Hour)
	lines := []string{reg}
	for d := range 250 {
		at := start.AddDate(0, 0, d)
		lines = append(lines, lineAt(fmt.Sprintf("m%d", d), "org-1", at, "room-1", "daily"))
		lines = append(lines, fmt.Sprintf(`{"id":"u%d","type":"usage.reported","time":%q,"org_id":"org-1","room_id":"room-1","actor":{"id":"agent-d","type":"agent"},"source":"test","schema_version":1,"data":%s}`,
			d, at.Add(time.Minute).Format(time.RFC3339Nano), usageData))
	}
	p.produceLines(lines...) // before the consumer starts: one batch
	p.start("ingest")
	p.waitLag("ingest", 60*time.Second)
	assert.Equal(t, uint64(501), p.count("SELECT count() FROM "+p.db+".events FINAL"))
	assert.Equal(t, uint64(250), p.count("SELECT count() FROM "+p.db+".usage FINAL"))
	assert.Equal(t, uint64(250), p.count("SELECT uniqExact(partition) FROM system.parts WHERE database = ? AND table = 'usage' AND active", p.db))
	assert.Empty(t, p.deadLetters())
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return p.count("SELECT sum(events) FROM "+p.db+".usage_hourly FINAL") == 250
	}), "the rollup covers every day")
	rows, err := p.conn.Query(context.Background(), "SELECT min_block_number, uniqExact(partition) FROM system.parts WHERE database = ? AND table = 'events' AND active GROUP BY min_block_number", p.db)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var block int64
		var parts uint64
		require.NoError(t, rows.Scan(&block, &parts))
		assert.LessOrEqual(t, parts, uint64(100), "insert %d", block)
	}
	require.NoError(t, rows.Err())
}
