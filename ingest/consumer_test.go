package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// fakeReader hands out queued messages and records commits. A fake, not the broker:
// these unit tests check the consumer's own logic; the pipeline itself is tested
// against the real Kafka and ClickHouse in integration_test.go.
type fakeReader struct {
	msgs      chan kafkago.Message
	mu        sync.Mutex
	committed map[int]int64 // partition -> next offset
}

func newFakeReader() *fakeReader {
	return &fakeReader{msgs: make(chan kafkago.Message, 1000), committed: map[int]int64{}}
}

func (r *fakeReader) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	select {
	case m := <-r.msgs:
		return m, nil
	case <-ctx.Done():
		return kafkago.Message{}, ctx.Err()
	}
}

func (r *fakeReader) CommitMessages(_ context.Context, msgs ...kafkago.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if m.Offset+1 > r.committed[m.Partition] {
			r.committed[m.Partition] = m.Offset + 1
		}
	}
	return nil
}

func (r *fakeReader) commit(p int) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.committed[p]
}

// fakeStorage keeps what it is given. refuse, if set, is asked about every batch
// first: a non-nil answer fails the insert and nothing of the batch is kept.
type fakeStorage struct {
	mu       sync.Mutex
	failures int // fail this many inserts first, transiently
	attempts int
	refuse   func(b *store.Batch) error
	batches  []store.Batch
	// preStored are rows stored before the test (StoredEvents finds them, and the
	// events of the stored batches).
	preStored []store.EventRow
	lookups   int
	// refuseLookup, if set, is asked about every lookup first, like refuse.
	refuseLookup func(keys []store.EventKey) error
}

func (s *fakeStorage) BatchInsert(_ context.Context, b *store.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	if s.failures > 0 {
		s.failures--
		return errors.New("clickhouse: connection refused")
	}
	if s.refuse != nil {
		if err := s.refuse(b); err != nil {
			return err
		}
	}
	s.batches = append(s.batches, cloneBatch(b))
	return nil
}

// cloneBatch copies b as the store would write it (b.IngestedAt on every event row).
func cloneBatch(b *store.Batch) store.Batch {
	c := store.Batch{
		Events: append([]store.EventRow(nil), b.Events...), Usage: append([]store.UsageRow(nil), b.Usage...),
		DeadLetters: append([]store.DeadLetter(nil), b.DeadLetters...), Directory: append([]store.DirectoryRow(nil), b.Directory...),
		Causes: append([]store.CauseRow(nil), b.Causes...),
	}
	if !b.IngestedAt.IsZero() {
		for i := range c.Events {
			c.Events[i].IngestedAt = b.IngestedAt
		}
	}
	return c
}

func (s *fakeStorage) StoredEvents(_ context.Context, keys []store.EventKey) ([]store.EventRow, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	if s.refuseLookup != nil {
		if err := s.refuseLookup(keys); err != nil {
			return nil, err
		}
	}
	want := map[store.EventKey]bool{}
	for _, k := range keys {
		want[k] = true
	}
	var out []store.EventRow
	rows := append([]store.EventRow(nil), s.preStored...)
	for _, b := range s.batches {
		rows = append(rows, b.Events...)
	}
	for i := range rows {
		if want[store.KeyOf(&rows[i])] {
			out = append(out, rows[i])
		}
	}
	return out, nil
}

func (s *fakeStorage) events() []store.EventRow { return s.all().Events }

func (s *fakeStorage) all() store.Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out store.Batch
	for _, b := range s.batches {
		out.Events = append(out.Events, b.Events...)
		out.Usage = append(out.Usage, b.Usage...)
		out.DeadLetters = append(out.DeadLetters, b.DeadLetters...)
		out.Directory = append(out.Directory, b.Directory...)
		out.Causes = append(out.Causes, b.Causes...)
	}
	return out
}

type fakeDLQ struct {
	mu   sync.Mutex
	msgs []kafkago.Message
}

func (d *fakeDLQ) ProduceMessages(_ context.Context, msgs []kafkago.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.msgs = append(d.msgs, msgs...)
	return nil
}

func (d *fakeDLQ) all() []kafkago.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]kafkago.Message(nil), d.msgs...)
}

func header(m kafkago.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

type harness struct {
	reader  *fakeReader
	storage ingest.Storage
	dlq     *fakeDLQ
	metrics *ingest.Metrics
	cancel  context.CancelFunc
	done    chan struct{}
	offset  map[int]int64
}

func startConsumer(t *testing.T, batchSize int, age time.Duration, storage *fakeStorage) *harness {
	return startWith(t, storage, func(c *ingest.Config) { c.BatchSize, c.BatchAge = batchSize, age })
}

func startWith(t *testing.T, storage ingest.Storage, mod func(*ingest.Config)) *harness {
	h := &harness{reader: newFakeReader(), storage: storage, dlq: &fakeDLQ{}, metrics: ingest.NewMetrics(nil), done: make(chan struct{}), offset: map[int]int64{}}
	cfg := ingest.Config{
		Reader: h.reader, DeadLetters: h.dlq, Storage: storage, Directory: directory.New(), Catalog: pricing.Default(),
		Topic: "events", BatchSize: 100, BatchAge: time.Hour, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, Metrics: h.metrics,
	}
	mod(&cfg)
	c, err := ingest.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { defer close(h.done); _ = c.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) send(partition int, value string) {
	h.reader.msgs <- kafkago.Message{Topic: "events", Partition: partition, Offset: h.offset[partition], Value: []byte(value), Time: time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)}
	h.offset[partition]++
}

func (h *harness) stop() {
	h.cancel()
	<-h.done
}

// eventLine is a canonical event on 2026-11-02 at 10:00:00.250 in room-1.
func eventLine(id, typ, actor, actorType, org, data string) string {
	return fmt.Sprintf(`{"id":%q,"type":%q,"time":"2026-11-02T10:00:00.250Z","org_id":%q,"room_id":"room-1","actor":{"id":%q,"type":%q},"source":"test","schema_version":1,"data":%s}`,
		id, typ, org, actor, actorType, data)
}

func registration(agent, owner, org, model string) string {
	return fmt.Sprintf(`{"id":"reg-%s","type":"agent.registered","time":"2026-11-02T09:00:00Z","org_id":%q,"actor":{"id":%q,"type":"user"},"subject":{"id":%q,"type":"agent","handle":"%s/%s"},"source":"test","schema_version":1,"data":{"handle":"%s/%s","owner_id":%q,"model":%q,"personal_registry_access":true}}`,
		agent, org, owner, agent, owner, agent, owner, agent, owner, model)
}

const usageData = `{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0}`

func TestConsumerFlushesOnSizeAndCommitsAfterInsert(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 3, time.Hour, st)
	for i := 0; i < 3; i++ {
		h.send(0, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, st.events(), 3, "the commit must follow the insert of all three")
}

func TestConsumerFlushesOnAge(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 1000, 20*time.Millisecond, st)
	h.send(1, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(1) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, st.events(), 1)
}

func TestConsumerRetriesAndDoesNotCommitUntilStored(t *testing.T) {
	st := &fakeStorage{failures: 5}
	h := startConsumer(t, 1, time.Hour, st)
	h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, time.Millisecond)
	st.mu.Lock()
	defer st.mu.Unlock()
	assert.Equal(t, 6, st.attempts, "five failures, then success")
	assert.Len(t, st.batches, 1)
}

func TestConsumerDeadLettersPoisonAndKeepsGoing(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 3, time.Hour, st)
	h.send(0, `{"topic":"chat_room:r1"`)
	h.send(0, eventLine("bad", "usage.reported", "a1", "agent", "org-1", `{"input_tokens":-5,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0}`))
	h.send(0, eventLine("ok", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, 5*time.Millisecond)
	all := st.all()
	require.Len(t, all.Events, 1)
	assert.Equal(t, "ok", all.Events[0].ID)
	require.Len(t, all.DeadLetters, 2)
	assert.Equal(t, "decode", all.DeadLetters[0].Stage)
	assert.Contains(t, all.DeadLetters[0].Reason, "invalid JSON")
	assert.Equal(t, int64(0), all.DeadLetters[0].Offset)
	assert.Equal(t, uint64(len(`{"topic":"chat_room:r1"`)), all.DeadLetters[0].RawBytes)
	assert.False(t, all.DeadLetters[0].RawTruncated)
	assert.Equal(t, "validate", all.DeadLetters[1].Stage)
	assert.Contains(t, all.DeadLetters[1].Reason, "data.input_tokens")
	msgs := h.dlq.all()
	require.Len(t, msgs, 2)
	assert.Equal(t, `{"topic":"chat_room:r1"`, string(msgs[0].Value), "the raw record goes to the DLQ unchanged")
	assert.Equal(t, "bandplane-reason", msgs[0].Headers[0].Key)
	_, truncated := header(msgs[0], "bandplane-truncated")
	assert.False(t, truncated)
}

func TestConsumerResolvesRegistrationLaterInTheSameBatch(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 2, time.Hour, st)
	// Usage from an agent the directory does not know yet (its registration is on
	// another partition, read later in the same batch).
	h.send(0, eventLine("u1", "usage.reported", "agent-7", "agent", "", usageData))
	h.send(1, registration("agent-7", "owner-1", "org-9", "gpt-5-mini"))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 && h.reader.commit(1) == 1 }, 5*time.Second, 5*time.Millisecond)
	all := st.all()
	require.Len(t, all.Usage, 1)
	u := all.Usage[0]
	assert.Equal(t, "org-9", u.OrgID)
	assert.Equal(t, "owner-1", u.OwnerID)
	assert.Equal(t, "gpt-5-mini", u.Model)
	assert.True(t, u.Priced)
	want, _ := pricing.Default().Cost("gpt-5-mini", mustUsage(t, usageData))
	assert.Equal(t, want, u.CostMicros)
	require.Len(t, all.Directory, 1)
}

// storedRow is the row ingest stores for line when its party is not in the directory.
func storedRow(t *testing.T, line string, partition int32, offset int64) store.EventRow {
	t.Helper()
	ev, err := schema.Decode([]byte(line))
	require.NoError(t, err)
	return ingest.EventRow(&ev, "", partition, offset)
}

func TestConsumerKeepsFirstAttributionOnReplay(t *testing.T) {
	// "u1" was stored earlier without an organization (and without an owner); now the
	// agent is known, and a replay of u1 must keep org "" and owner "" so that it is
	// recognised as the stored event, whose rows stand.
	u1 := eventLine("u1", "usage.reported", "agent-7", "agent", "", usageData)
	st := &fakeStorage{preStored: []store.EventRow{storedRow(t, u1, 1, 0)}}
	var mu sync.Mutex
	marked := map[string]bool{} // org of each hour the rollup was told to rebuild
	h := startWith(t, st, func(c *ingest.Config) {
		c.BatchSize = 3
		c.LateParties = map[string]time.Time{"agent-7": time.Now()}
		c.AfterFlush = func(hours []store.HourKey, _ []ingest.AgentKey) {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range hours {
				marked[k.OrgID] = true
			}
		}
	})
	h.send(0, registration("agent-7", "owner-1", "org-9", "gpt-5-mini"))
	h.send(1, u1)
	h.send(1, eventLine("u2", "usage.reported", "agent-7", "agent", "", usageData))
	require.Eventually(t, func() bool { return h.reader.commit(1) == 2 }, 5*time.Second, 5*time.Millisecond)
	usage := map[string]store.UsageRow{}
	for _, u := range st.all().Usage {
		usage[u.EventID] = u
	}
	assert.NotContains(t, usage, "u1", "a replay's usage row is not written again: the stored one stands, with its first attribution")
	assert.Equal(t, "org-9", usage["u2"].OrgID, "a new event is attributed")
	assert.Equal(t, "owner-1", usage["u2"].OwnerID)
	var ids []string
	for _, e := range st.events() {
		ids = append(ids, e.ID)
		if u, ok := usage[e.ID]; ok {
			assert.Equal(t, u.OrgID, e.OrgID, "event and usage rows of %s must agree", e.ID)
		}
	}
	assert.ElementsMatch(t, []string{"reg-agent-7", "u2"}, ids, "the replayed event row is not written again")
	// The rollup must rebuild the hours where the rows were stored: u1's under org "".
	// (Found by TestIntegrationOutageKafkaRestart: the hour was marked under the
	// agent's organization, and the rollup kept u1 unpriced.)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]bool{"": true, "org-9": true}, marked)
}

// TestConsumerQueuesTheRepriceOfTheRegisteringOrganization: usage of an agent id
// nobody registered is stored unpriced, under the organization its event names (org-1)
// or none; when the id registers in org-9, the rollup is told to reprice org-9's agent,
// not the id wherever it appears.
func TestConsumerQueuesTheRepriceOfTheRegisteringOrganization(t *testing.T) {
	st := &fakeStorage{}
	var mu sync.Mutex
	var queued []ingest.AgentKey
	h := startWith(t, st, func(c *ingest.Config) {
		c.BatchSize = 1
		c.AfterFlush = func(_ []store.HourKey, reprice []ingest.AgentKey) {
			mu.Lock()
			defer mu.Unlock()
			queued = append(queued, reprice...)
		}
	})
	h.send(0, eventLine("u-other", "usage.reported", "agent-7", "agent", "org-1", usageData))
	h.send(0, eventLine("u-none", "usage.reported", "agent-7", "agent", "", usageData))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, 5*time.Millisecond)
	h.send(0, registration("agent-7", "owner-1", "org-9", "gpt-5-mini"))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(queued) > 0
	}, 5*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []ingest.AgentKey{{OrgID: "org-9", AgentID: "agent-7"}}, queued)
	orgs := map[string]string{}
	for _, u := range st.all().Usage {
		assert.False(t, u.Priced, "%s: no model was known when it was stored", u.EventID)
		orgs[u.EventID] = u.OrgID
	}
	assert.Equal(t, map[string]string{"u-other": "org-1", "u-none": ""}, orgs)
}

func TestConsumerGracefulStopFlushesAndCommits(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 1000, time.Hour, st)
	h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	h.send(0, eventLine("e2", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return gaugeValue(t, h.metrics.Batching) == 2 }, 5*time.Second, time.Millisecond,
		"the consumer takes both into its batch")
	h.stop()
	assert.Equal(t, int64(2), h.reader.commit(0))
	assert.Len(t, st.events(), 2)
}

// streamReader is an endless stream over three partitions: FetchMessage never waits.
// Every seventh record is not JSON (a dead letter), the others are distinct events.
type streamReader struct {
	mu        sync.Mutex
	n         int
	next      [3]int64
	committed map[int]int64
}

func (r *streamReader) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	if err := ctx.Err(); err != nil {
		return kafkago.Message{}, err
	}
	r.mu.Lock()
	p := r.n % 3
	r.n++
	off := r.next[p]
	r.next[p]++
	r.mu.Unlock()
	v := fmt.Appendf(nil, `{"id":"p%d-%d","type":"message.created","time":"2026-11-02T10:00:00Z","org_id":"o","room_id":"r","actor":{"id":"u","type":"user"},"source":"t","schema_version":1,"data":{}}`, p, off)
	if off%7 == 3 {
		v = []byte(`{"not json`)
	}
	return kafkago.Message{Topic: "events", Partition: p, Offset: off, Value: v}, nil
}

func (r *streamReader) CommitMessages(_ context.Context, msgs ...kafkago.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.committed[m.Partition] = max(r.committed[m.Partition], m.Offset+1)
	}
	return nil
}

// TestConsumerShutdownCommitsOnlyStoredRecords cancels the consumer under load, many
// times: a committed offset must never pass a record that was not stored (as a row or
// a dead letter). Before the fix a decoder dropped the record it held on cancel and
// went on with the next one, which the merger then handed over in its place.
func TestConsumerShutdownCommitsOnlyStoredRecords(t *testing.T) {
	checkShutdowns(t, rand.New(rand.NewPCG(1, 2)), func(*ingest.Config) {})
}

// TestConsumerShutdownCommitsOnlyStoredRecordsUnderAByteBudget is the same with batches
// flushed for their bytes and a pending budget of one to three batches, so that the
// fetch loop is often waiting for the budget when the stop comes. (A record is about
// 200 bytes.)
func TestConsumerShutdownCommitsOnlyStoredRecordsUnderAByteBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	checkShutdowns(t, rng, func(c *ingest.Config) {
		c.BatchBytes = 500 + rng.IntN(4000)
		c.MaxPendingBytes = c.BatchBytes * (1 + rng.IntN(3))
	})
}

func checkShutdowns(t *testing.T, rng *rand.Rand, mod func(*ingest.Config)) {
	const runs = 200
	committedRuns := 0
	for run := range runs {
		r := &streamReader{committed: map[int]int64{}}
		st := &fakeStorage{}
		cfg := ingest.Config{
			Reader: r, DeadLetters: &fakeDLQ{}, Storage: st, Directory: directory.New(), Catalog: pricing.Default(),
			Topic: "events", Decoders: 4, BatchSize: 1 + rng.IntN(40), BatchAge: time.Millisecond,
			RetryMin: time.Millisecond, RetryMax: time.Millisecond,
		}
		mod(&cfg)
		c, err := ingest.New(cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(ctx) }()
		if run%2 == 0 {
			// Half the runs stop after a commit, so that what is checked below is
			// never vacuous; the others stop at any point, the start included.
			require.Eventually(t, func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return len(r.committed) > 0
			}, time.Minute, 100*time.Microsecond)
		}
		time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		cancel()
		<-done

		stored := map[[2]int64]bool{}
		for _, e := range st.all().Events {
			stored[[2]int64{int64(e.Partition), e.Offset}] = true
		}
		for _, d := range st.all().DeadLetters {
			stored[[2]int64{int64(d.Partition), d.Offset}] = true
		}
		for p, next := range r.committed {
			if next > 0 {
				committedRuns++
			}
			for off := int64(0); off < next; off++ {
				if !stored[[2]int64{int64(p), off}] {
					t.Fatalf("run %d: partition %d committed up to %d, but offset %d was never stored", run, p, next, off)
				}
			}
		}
	}
	t.Logf("%d partitions committed something in %d runs", committedRuns, runs)
	assert.GreaterOrEqual(t, committedRuns, runs/2, "every other run commits before it stops")
}

func TestConsumerSetsIngestedAtWhenTheInsertIsAttempted(t *testing.T) {
	var mu sync.Mutex
	clock := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	var attempts []time.Time
	refusals := 3
	st := &fakeStorage{}
	st.refuse = func(b *store.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, clock)
		clock = clock.Add(time.Minute) // each retry is a minute later
		if refusals > 0 {
			refusals--
			return &clickhouse.Exception{Code: 210, Message: "Connection reset by peer"} // transient
		}
		return nil
	}
	h := startWith(t, st, func(c *ingest.Config) {
		c.BatchSize, c.RetryMin, c.RetryMax, c.Now = 1, time.Millisecond, time.Millisecond, now
	})
	h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, time.Millisecond)
	ev := st.events()
	require.Len(t, ev, 1)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, attempts, 4)
	assert.Equal(t, attempts[3], ev[0].IngestedAt, "ingested_at is the last attempt's, three retries after the first")
}

// refuseRoom refuses, for good, every batch holding an event of room "poison-room", as
// ClickHouse does with a MATERIALIZED throwIf(room_id = 'poison-room') column.
func refuseRoom(b *store.Batch) error {
	for _, e := range b.Events {
		if e.RoomID == "poison-room" {
			return fmt.Errorf("cannot insert %d rows into db.events: %w", len(b.Events),
				&clickhouse.Exception{Code: 395, Message: "Value passed to 'throwIf' function is non zero"})
		}
	}
	return nil
}

func TestConsumerIsolatesTheRecordsClickHouseRefuses(t *testing.T) {
	st := &fakeStorage{refuse: refuseRoom}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.BatchAge = 64, 50*time.Millisecond })
	poison := map[int64]bool{9: true, 40: true}
	for i := range 64 {
		line := eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`)
		if poison[int64(i)] {
			line = strings.Replace(line, `"room-1"`, `"poison-room"`, 1)
		}
		h.send(0, line)
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 64 }, 5*time.Second, time.Millisecond)
	all := st.all()
	assert.Len(t, all.Events, 62, "everything but the two refused records is stored")
	for _, e := range all.Events {
		assert.NotEqual(t, "poison-room", e.RoomID)
	}
	require.Len(t, all.DeadLetters, 2)
	for _, d := range all.DeadLetters {
		assert.True(t, poison[d.Offset], "offset %d", d.Offset)
		assert.Equal(t, "store", d.Stage)
		assert.Contains(t, d.Reason, "code: 395")
		assert.Contains(t, d.Reason, "throwIf")
		assert.Contains(t, d.Raw, "poison-room", "the raw record is kept")
	}
	msgs := h.dlq.all()
	require.Len(t, msgs, 2)
	stage, _ := header(msgs[0], "bandplane-stage")
	assert.Equal(t, "store", stage)
	st.mu.Lock()
	attempts := st.attempts
	st.mu.Unlock()
	// 2 bad records among 64: at most 2·2·log2(64) = 24 inserts, plus the dead letters.
	assert.LessOrEqual(t, attempts, 26)
	assert.Equal(t, float64(2), counterValue(t, h.metrics.DeadLetters.WithLabelValues("store")))
	assert.Equal(t, float64(62), counterValue(t, h.metrics.Records.WithLabelValues("stored")))

	// Ingest goes on.
	h.send(0, eventLine("after", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 65 }, 5*time.Second, time.Millisecond)
}

func TestConsumerRetriesTransientErrorsWithoutSplitting(t *testing.T) {
	for _, ex := range []*clickhouse.Exception{
		{Code: 60, Message: "Table db.events doesn't exist."},
		{Code: 16, Message: "There is no column poison in table"},
		{Code: 252, Message: "Too many parts (300). Merges are processing significantly slower than inserts."},
		{Code: 999, Message: "Coordination::Exception: Session expired"},
	} {
		t.Run(fmt.Sprint(ex.Code), func(t *testing.T) {
			left := 3
			st := &fakeStorage{}
			st.refuse = func(b *store.Batch) error {
				if left > 0 {
					left--
					return ex
				}
				return nil
			}
			h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 4 })
			for i := range 4 {
				h.send(0, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
			}
			require.Eventually(t, func() bool { return h.reader.commit(0) == 4 }, 5*time.Second, time.Millisecond)
			all := st.all()
			assert.Len(t, all.Events, 4)
			assert.Empty(t, all.DeadLetters, "a transient error never dead-letters")
			st.mu.Lock()
			defer st.mu.Unlock()
			assert.Equal(t, 4, st.attempts, "the whole batch retried: three failures, then success")
		})
	}
}

func TestConsumerDeadLetterRefusedByClickHouse(t *testing.T) {
	t.Run("stored without its raw record", func(t *testing.T) {
		st := &fakeStorage{}
		st.refuse = func(b *store.Batch) error {
			for _, d := range b.DeadLetters {
				if strings.Contains(d.Raw, "toxic") {
					return &clickhouse.Exception{Code: 131, Message: "String too large"}
				}
			}
			return nil
		}
		h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 3 })
		h.send(0, `{"toxic`)
		h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
		h.send(0, `{"also bad`)
		require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, time.Millisecond)
		all := st.all()
		assert.Len(t, all.Events, 1)
		require.Len(t, all.DeadLetters, 2)
		byOffset := map[int64]store.DeadLetter{}
		for _, d := range all.DeadLetters {
			byOffset[d.Offset] = d
		}
		assert.Equal(t, "", byOffset[0].Raw)
		assert.True(t, byOffset[0].RawTruncated)
		assert.Equal(t, uint64(len(`{"toxic`)), byOffset[0].RawBytes)
		assert.Equal(t, "decode", byOffset[0].Stage)
		assert.Equal(t, `{"also bad`, byOffset[2].Raw)
		assert.Zero(t, counterValue(t, h.metrics.Dropped))
	})
	t.Run("dropped when even that is refused", func(t *testing.T) {
		st := &fakeStorage{}
		st.refuse = func(b *store.Batch) error {
			if len(b.DeadLetters) > 0 {
				return &clickhouse.Exception{Code: 6, Message: "Cannot parse"}
			}
			return nil
		}
		h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 2 })
		h.send(0, `{"bad`)
		h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
		require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, time.Millisecond)
		assert.Len(t, st.events(), 1)
		assert.Equal(t, float64(1), counterValue(t, h.metrics.Dropped))
		assert.Len(t, h.dlq.all(), 1, "it still went to the dead-letter topic")
	})
}

// TestConsumerChecksABatchWhileTheOneBeforeIsWritten: the next batch is looked up while
// the one before is still being written, unless they share an event key; then it is
// looked up once that one is written, so that a replay, a reused id, and a twin of a
// record ClickHouse refused are told apart exactly as if they were flushed one after
// the other.
func TestConsumerChecksABatchWhileTheOneBeforeIsWritten(t *testing.T) {
	// slowFirst holds the first insert of the batch holding id, with the storage
	// unlocked meanwhile (a lookup then does not see it yet), until the second batch's
	// lookup starts or hold passes, and refuses for good any batch holding an event
	// whose data is {"content":"refused"}. It returns whether the second batch's lookup
	// started while the first write was held. A lookup that may start during the write
	// is waited for (hold is long, and ends when it starts). The subtests where it must
	// not start run in a synctest bubble, whose clock ends hold only once every goroutine
	// is blocked: a lookup that could start during the write has started by then.
	slowFirst := func(st *fakeStorage, id string, hold time.Duration) func() bool {
		var mu sync.Mutex
		lookups := 0
		second := make(chan struct{})
		held, during := false, false
		st.refuse = func(b *store.Batch) error {
			if len(b.Events) > 0 && b.Events[0].ID == id && !held {
				held = true
				st.mu.Unlock()
				select {
				case <-second:
					during = true
				case <-time.After(hold):
				}
				st.mu.Lock()
			}
			for _, e := range b.Events {
				if e.Data == `{"content":"refused"}` {
					return &clickhouse.Exception{Code: 6, Message: "Cannot parse"}
				}
			}
			return nil
		}
		st.refuseLookup = func([]store.EventKey) error {
			mu.Lock()
			defer mu.Unlock()
			if lookups++; lookups == 2 {
				close(second)
			}
			return nil
		}
		return func() bool {
			st.mu.Lock()
			defer st.mu.Unlock()
			return during
		}
	}
	stored := func(st *fakeStorage) []string {
		var got []string
		for _, e := range st.all().Events {
			got = append(got, e.ID+":"+e.Data)
		}
		return got
	}

	t.Run("without a shared key the lookup runs during the write", func(t *testing.T) {
		st := &fakeStorage{}
		during := slowFirst(st, "a1", time.Minute)
		h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 2 })
		for _, id := range []string{"a1", "b1", "a2", "b2"} {
			h.send(0, eventLine(id, "message.created", "u1", "user", "org-1", `{}`))
		}
		require.Eventually(t, func() bool { return h.reader.commit(0) == 4 }, 5*time.Second, time.Millisecond)
		assert.True(t, during(), "the second batch was looked up while the first was written")
		assert.Len(t, stored(st), 4)
	})

	t.Run("a replay and a reused id of the batch being written", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := &fakeStorage{}
			during := slowFirst(st, "a1", 200*time.Millisecond)
			h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 2 })
			first := eventLine("a1", "message.created", "u1", "user", "org-1", `{"content":"first"}`)
			h.send(0, first)
			h.send(0, eventLine("b1", "message.created", "u1", "user", "org-1", `{"content":"other"}`))
			h.send(0, first) // a replay of a1
			h.send(0, eventLine("a1", "message.created", "u1", "user", "org-1", `{"content":"forged"}`))
			require.Eventually(t, func() bool { return h.reader.commit(0) == 4 }, 5*time.Second, time.Millisecond)
			assert.False(t, during(), "the second batch waited for the first to be written")
			assert.ElementsMatch(t, []string{`a1:{"content":"first"}`, `b1:{"content":"other"}`}, stored(st))
			all := st.all()
			require.Len(t, all.DeadLetters, 1)
			assert.True(t, strings.HasPrefix(all.DeadLetters[0].Reason, ingest.ReasonIDReused), all.DeadLetters[0].Reason)
			assert.Equal(t, int64(3), all.DeadLetters[0].Offset)
			assert.Equal(t, float64(1), counterValue(t, h.metrics.Records.WithLabelValues("replayed")))
		})
	})

	t.Run("the twin of a record ClickHouse refused is stored", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := &fakeStorage{}
			during := slowFirst(st, "a1", 200*time.Millisecond)
			h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 2 })
			h.send(0, eventLine("a1", "message.created", "u1", "user", "org-1", `{"content":"refused"}`))
			h.send(0, eventLine("b1", "message.created", "u1", "user", "org-1", `{}`))
			h.send(0, eventLine("a1", "message.created", "u1", "user", "org-1", `{"content":"valid"}`))
			h.send(0, eventLine("c1", "message.created", "u1", "user", "org-1", `{}`))
			require.Eventually(t, func() bool { return h.reader.commit(0) == 4 }, 5*time.Second, time.Millisecond)
			assert.ElementsMatch(t, []string{`a1:{"content":"valid"}`, `b1:{}`, `c1:{}`}, stored(st),
				"nothing of a1 is stored when the second batch is checked, so its other content is not a reused id")
			all := st.all()
			require.Len(t, all.DeadLetters, 1)
			assert.Equal(t, int64(0), all.DeadLetters[0].Offset, "only the refused record is dead-lettered")
			assert.False(t, during(), "the second batch waited for the first to be written")
		})
	})
}

func TestConsumerReplayIsNotWrittenAgainAndAReusedIDIsDeadLettered(t *testing.T) {
	orig := eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"original"}`)
	stored := storedRow(t, orig, 0, 0)
	stored.OwnerID, stored.IngestedAt = "u1", time.Date(2026, 11, 2, 10, 0, 1, 0, time.UTC)
	st := &fakeStorage{preStored: []store.EventRow{stored}}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 6 })
	h.send(0, orig)                                                                                          // a replay
	h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"forged"}`))             // the same key, other content
	h.send(0, eventLine("e2", "message.created", "u1", "user", "org-1", `{"content":"twice"}`))              // new
	h.send(0, eventLine("e2", "message.created", "u1", "user", "org-1", `{"content":"twice"}`))              // its duplicate in the batch
	h.send(0, eventLine("e3", "message.created", "u1", "user", "org-1", `{"content":"first"}`))              // new
	h.send(0, eventLine("e3", "message.created", "u1", "user", "org-1", `{"content":"second, other data"}`)) // reuses it in the batch
	require.Eventually(t, func() bool { return h.reader.commit(0) == 6 }, 5*time.Second, time.Millisecond)
	all := st.all()
	var got []string
	for _, e := range all.Events {
		got = append(got, e.ID+":"+e.Data)
	}
	assert.ElementsMatch(t, []string{`e2:{"content":"twice"}`, `e3:{"content":"first"}`}, got)
	require.Len(t, all.DeadLetters, 2)
	for _, d := range all.DeadLetters {
		assert.Equal(t, "store", d.Stage)
		assert.True(t, strings.HasPrefix(d.Reason, ingest.ReasonIDReused), d.Reason)
	}
	assert.Equal(t, int64(1), all.DeadLetters[0].Offset)
	assert.Contains(t, all.DeadLetters[0].Reason, "event e1")
	assert.Contains(t, all.DeadLetters[0].Raw, "forged")
	assert.Equal(t, int64(5), all.DeadLetters[1].Offset)
	assert.Contains(t, all.DeadLetters[1].Reason, "event e3")
	assert.Equal(t, float64(2), counterValue(t, h.metrics.Records.WithLabelValues("replayed")))
	assert.Equal(t, float64(2), counterValue(t, h.metrics.IDReused))
	st.mu.Lock()
	assert.Equal(t, 1, st.lookups, "one lookup per batch")
	st.mu.Unlock()

	// The same id at another time or in another organization is another event.
	h.send(0, strings.Replace(eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"later"}`), "10:00:00.250", "10:00:07.000", 1))
	h.send(0, eventLine("e1", "message.created", "u1", "user", "org-2", `{"content":"elsewhere"}`))
	for range 4 {
		h.send(0, eventLine(fmt.Sprintf("f%d", h.offset[0]), "message.created", "u1", "user", "org-1", `{}`))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 12 }, 5*time.Second, time.Millisecond)
	assert.Len(t, st.all().DeadLetters, 2)
	assert.Len(t, st.events(), 8)
}

func TestDeadLetterLimits(t *testing.T) {
	const limit = 64 << 10
	st := &fakeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.DeadLetterMaxBytes = 3, limit })
	// A record over the limit, whose reason is over MaxReasonBytes: a field name of
	// 3000 × "é" makes the reason long and multi-byte.
	long := `{"` + strings.Repeat("é", 3000) + `":` + strings.Repeat("1", 2*limit)
	base := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	h.reader.msgs <- kafkago.Message{Topic: "events", Partition: 0, Offset: 0, Key: []byte(strings.Repeat("k", 5000)), Value: []byte(long), Time: base}
	h.reader.msgs <- kafkago.Message{Topic: "events", Partition: 0, Offset: 1, Value: []byte(`{"x"`), Time: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.reader.msgs <- kafkago.Message{Topic: "events", Partition: 0, Offset: 2, Value: []byte(`{"y"`), Time: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, time.Millisecond)
	dls := st.all().DeadLetters
	require.Len(t, dls, 3)
	big := dls[0]
	assert.True(t, big.RawTruncated)
	assert.Equal(t, uint64(len(long)), big.RawBytes)
	assert.Less(t, len(big.Raw), limit)
	assert.True(t, strings.HasPrefix(long, big.Raw))
	assert.LessOrEqual(t, len(big.Reason), ingest.MaxReasonBytes)
	assert.True(t, utf8.ValidString(big.Reason), "the reason is cut at a UTF-8 boundary")
	assert.LessOrEqual(t, len(big.Key), 1024)
	assert.Equal(t, schema.MinTime, dls[1].Time, "a timestamp before 1970 is clamped")
	assert.Equal(t, schema.MaxTime.Truncate(time.Second), dls[2].Time, "a timestamp after 2105 is clamped")
	assert.Equal(t, base, big.Time)

	msgs := h.dlq.all()
	require.Len(t, msgs, 3)
	m := msgs[0]
	assert.LessOrEqual(t, kafka.MessageSize(&m), limit, "the dead letter fits the writer's limit")
	assert.Greater(t, kafka.MessageSize(&m), limit-64, "and uses it")
	size, ok := header(m, "bandplane-truncated")
	assert.True(t, ok)
	assert.Equal(t, fmt.Sprint(len(long)), size)
	assert.Equal(t, big.Raw, string(m.Value))
	reason, _ := header(m, "bandplane-reason")
	assert.Equal(t, big.Reason, reason)
	assert.Equal(t, float64(1), counterValue(t, h.metrics.DeadLettersTruncated))
}

// tooLargeDLQ refuses any message with a value, as a topic whose own limit is lower
// than the writer's would.
type tooLargeDLQ struct{ fakeDLQ }

func (d *tooLargeDLQ) ProduceMessages(ctx context.Context, msgs []kafkago.Message) error {
	for _, m := range msgs {
		if len(m.Value) > 0 {
			return fmt.Errorf("cannot produce: %w", kafkago.WriteErrors{kafkago.MessageSizeTooLarge})
		}
	}
	return d.fakeDLQ.ProduceMessages(ctx, msgs)
}

func TestConsumerDeadLetterTopicRefusingForSizeNeverStalls(t *testing.T) {
	st := &fakeStorage{}
	dlq := &tooLargeDLQ{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.DeadLetters = 1, dlq })
	h.send(0, `{"bad`)
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, time.Millisecond)
	msgs := dlq.all()
	require.Len(t, msgs, 1)
	assert.Empty(t, msgs[0].Value)
	size, _ := header(msgs[0], "bandplane-truncated")
	assert.Equal(t, "5", size)
	require.Len(t, st.all().DeadLetters, 1)
	assert.Equal(t, `{"bad`, st.all().DeadLetters[0].Raw, "the table still has the record")
}

func counterValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}

func mustUsage(t *testing.T, data string) (u schema.UsageData) {
	t.Helper()
	require.NoError(t, json.Unmarshal([]byte(data), &u))
	return u
}

// A batch that comes due while the writer is busy and the queue to it is full goes on
// taking records until there is room: under load the consumer writes fewer, larger
// batches rather than queueing a small one per batch age.
func TestConsumerGrowsADueBatchWhileTheWriterIsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeStorage{}
		release := make(chan struct{})
		st.refuse = func(b *store.Batch) error {
			if len(b.Events) > 0 && b.Events[0].ID == "e0" {
				st.mu.Unlock()
				<-release
				st.mu.Lock()
			}
			return nil
		}
		h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.BatchAge = 100, 10*time.Millisecond })
		// Each record comes once the batch before it is due: e0 is being written, e1
		// checked and waiting for the writer, e2 queued to the checker; e3, e4 and e5
		// find the queue full.
		for i := range 6 {
			h.send(0, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{}`))
			time.Sleep(20 * time.Millisecond)
			synctest.Wait()
		}
		close(release)
		require.Eventually(t, func() bool { return h.reader.commit(0) == 6 }, 5*time.Second, time.Millisecond)
		var sizes []int
		st.mu.Lock()
		for _, b := range st.batches {
			sizes = append(sizes, len(b.Events))
		}
		st.mu.Unlock()
		assert.Equal(t, []int{1, 1, 1, 3}, sizes)
	})
}
