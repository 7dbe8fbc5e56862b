package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/pricing"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
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

type fakeStorage struct {
	mu           sync.Mutex
	failures     int // fail this many inserts first
	attempts     int
	batches      []store.Batch
	unattributed map[string]bool
}

func (s *fakeStorage) BatchInsert(_ context.Context, b *store.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	if s.failures > 0 {
		s.failures--
		return errors.New("clickhouse: connection refused")
	}
	s.batches = append(s.batches, *b)
	return nil
}

func (s *fakeStorage) UnattributedIDs(_ context.Context, ids []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, id := range ids {
		if s.unattributed[id] {
			out[id] = true
		}
	}
	return out, nil
}

func (s *fakeStorage) events() []store.EventRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.EventRow
	for _, b := range s.batches {
		out = append(out, b.Events...)
	}
	return out
}

func (s *fakeStorage) all() store.Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out store.Batch
	for _, b := range s.batches {
		out.Events = append(out.Events, b.Events...)
		out.Usage = append(out.Usage, b.Usage...)
		out.DeadLetters = append(out.DeadLetters, b.DeadLetters...)
		out.Directory = append(out.Directory, b.Directory...)
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

type harness struct {
	reader  *fakeReader
	storage *fakeStorage
	dlq     *fakeDLQ
	cancel  context.CancelFunc
	done    chan struct{}
	offset  map[int]int64
}

func startConsumer(t *testing.T, batchSize int, age time.Duration, storage *fakeStorage) *harness {
	h := &harness{reader: newFakeReader(), storage: storage, dlq: &fakeDLQ{}, done: make(chan struct{}), offset: map[int]int64{}}
	c, err := ingest.New(ingest.Config{
		Reader: h.reader, DeadLetters: h.dlq, Storage: storage, Directory: ingest.NewDirectory(), Catalog: pricing.Default(),
		Topic: "events", BatchSize: batchSize, BatchAge: age, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond,
	})
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

func canonical(id, typ, actor, actorType, org, data string) string {
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
		h.send(0, canonical(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, st.events(), 3, "the commit must follow the insert of all three")
}

func TestConsumerFlushesOnAge(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 1000, 20*time.Millisecond, st)
	h.send(1, canonical("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(1) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, st.events(), 1)
}

func TestConsumerRetriesAndDoesNotCommitUntilStored(t *testing.T) {
	st := &fakeStorage{failures: 5}
	h := startConsumer(t, 1, time.Hour, st)
	h.send(0, canonical("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
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
	h.send(0, canonical("bad", "usage.reported", "a1", "agent", "org-1", `{"input_tokens":-5,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0}`))
	h.send(0, canonical("ok", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, 5*time.Millisecond)
	all := st.all()
	require.Len(t, all.Events, 1)
	assert.Equal(t, "ok", all.Events[0].ID)
	require.Len(t, all.DeadLetters, 2)
	assert.Equal(t, "decode", all.DeadLetters[0].Stage)
	assert.Contains(t, all.DeadLetters[0].Reason, "invalid JSON")
	assert.Equal(t, int64(0), all.DeadLetters[0].Offset)
	assert.Equal(t, "validate", all.DeadLetters[1].Stage)
	assert.Contains(t, all.DeadLetters[1].Reason, "data.input_tokens")
	h.dlq.mu.Lock()
	defer h.dlq.mu.Unlock()
	require.Len(t, h.dlq.msgs, 2)
	assert.Equal(t, `{"topic":"chat_room:r1"`, string(h.dlq.msgs[0].Value), "the raw record goes to the DLQ unchanged")
	assert.Equal(t, "bandplane-reason", h.dlq.msgs[0].Headers[0].Key)
}

func TestConsumerResolvesRegistrationLaterInTheSameBatch(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 2, time.Hour, st)
	// Usage from an agent the directory does not know yet (its registration is on
	// another partition, read later in the same batch).
	h.send(0, canonical("u1", "usage.reported", "agent-7", "agent", "", usageData))
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

func TestConsumerKeepsFirstAttributionOnReplay(t *testing.T) {
	// "u1" was stored earlier without an organization; now the agent is known, and a
	// replay of u1 must keep org "" so that ClickHouse collapses the two copies.
	st := &fakeStorage{unattributed: map[string]bool{"u1": true}}
	h := &harness{reader: newFakeReader(), storage: st, dlq: &fakeDLQ{}, done: make(chan struct{}), offset: map[int]int64{}}
	var mu sync.Mutex
	marked := map[string]bool{} // org of each hour the rollup was told to rebuild
	c, err := ingest.New(ingest.Config{
		Reader: h.reader, DeadLetters: h.dlq, Storage: st, Directory: ingest.NewDirectory(), Catalog: pricing.Default(),
		BatchSize: 3, BatchAge: time.Hour, LateParties: []string{"agent-7"},
		AfterFlush: func(hours []store.HourKey, _ []string) {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range hours {
				marked[k.OrgID] = true
			}
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { defer close(h.done); _ = c.Run(ctx) }()
	t.Cleanup(h.stop)
	h.send(0, registration("agent-7", "owner-1", "org-9", "gpt-5-mini"))
	h.send(1, canonical("u1", "usage.reported", "agent-7", "agent", "", usageData))
	h.send(1, canonical("u2", "usage.reported", "agent-7", "agent", "", usageData))
	require.Eventually(t, func() bool { return h.reader.commit(1) == 2 }, 5*time.Second, 5*time.Millisecond)
	orgs := map[string]string{}
	for _, u := range st.all().Usage {
		orgs[u.EventID] = u.OrgID
	}
	for _, e := range st.all().Events {
		if e.Type == "usage.reported" {
			assert.Equal(t, orgs[e.ID], e.OrgID, "event and usage rows of %s must agree", e.ID)
		}
	}
	assert.Equal(t, "", orgs["u1"], "a replay keeps its first attribution")
	assert.Equal(t, "org-9", orgs["u2"], "a new event is attributed")
	// The rollup must rebuild the hours where the rows were stored: u1's under org "".
	// (Found by TestIntegrationOutageKafkaRestart: the hour was marked under the
	// agent's organization, and the rollup kept u1 unpriced.)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]bool{"": true, "org-9": true}, marked)
}

func TestConsumerGracefulStopFlushesAndCommits(t *testing.T) {
	st := &fakeStorage{}
	h := startConsumer(t, 1000, time.Hour, st)
	h.send(0, canonical("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	h.send(0, canonical("e2", "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	require.Eventually(t, func() bool { return len(h.reader.msgs) == 0 }, time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // let the consumer take them into its batch
	h.stop()
	assert.Equal(t, int64(2), h.reader.commit(0))
	assert.Len(t, st.events(), 2)
}

func mustUsage(t *testing.T, data string) (u schema.UsageData) {
	t.Helper()
	require.NoError(t, json.Unmarshal([]byte(data), &u))
	return u
}
