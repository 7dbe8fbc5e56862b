package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// paddedLine is an event of about 1 KiB whose length does not depend on i (< 10).
func paddedLine(i int) string {
	return eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"`+strings.Repeat("x", 1000)+`"}`)
}

func TestConsumerFlushesOnBytes(t *testing.T) {
	size := len(paddedLine(0))
	st := &fakeStorage{}
	// Neither the size (1000) nor the age (an hour) would flush these nine records.
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.BatchBytes = 1000, 3*size })
	for i := range 9 {
		h.send(0, paddedLine(i))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 9 }, 5*time.Second, time.Millisecond)
	st.mu.Lock()
	defer st.mu.Unlock()
	require.Len(t, st.batches, 3, "a batch is flushed once its records hold BatchBytes")
	for _, b := range st.batches {
		assert.Len(t, b.Events, 3)
	}
}

func TestConsumerByteLimitsAreValidated(t *testing.T) {
	base := ingest.Config{Reader: newFakeReader(), DeadLetters: &fakeDLQ{}, Storage: &fakeStorage{}, Directory: directory.New(),
		Catalog: pricing.Default(), BatchSize: 10, BatchAge: time.Second}
	for _, tc := range []struct {
		name                string
		batch, pending      int
		wantErr, wantInText string
	}{
		{"defaults", 0, 0, "", ""},
		{"pending of one batch", 1 << 20, 1 << 20, "", ""},
		{"negative batch bytes", -1, 0, "batch bytes", ""},
		{"negative pending bytes", 0, -1, "pending bytes", ""},
		{"pending below the batch", 1 << 20, 1<<20 - 1, "pending bytes", "1048576"},
		{"pending below the default batch", 0, 1 << 20, "pending bytes", fmt.Sprint(ingest.DefaultBatchBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.BatchBytes, cfg.MaxPendingBytes = tc.batch, tc.pending
			_, err := ingest.New(cfg)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), tc.wantInText)
		})
	}
}

// A record larger than the whole budget is let through once nothing else is held: it
// must not wait forever.
func TestConsumerRecordLargerThanThePendingBudget(t *testing.T) {
	st := &fakeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.BatchBytes, c.MaxPendingBytes = 1000, 500, 500 })
	for i := range 3 {
		h.send(0, paddedLine(i)) // twice the budget each
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 3 }, 5*time.Second, time.Millisecond)
	assert.Len(t, st.events(), 3)
	st.mu.Lock()
	defer st.mu.Unlock()
	assert.Len(t, st.batches, 3, "one record a batch: each is over BatchBytes alone")
}

// bigReader is an endless stream of events of about 16 KiB on one partition. At each
// FetchMessage it notes how many bytes it has handed out that are not committed yet.
type bigReader struct {
	mu             sync.Mutex
	sizes          []int // of each offset handed out
	fetched        int   // bytes handed out
	committed      int64 // next offset committed
	committedBytes int
	maxOutstanding int
}

func (r *bigReader) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	if err := ctx.Err(); err != nil {
		return kafkago.Message{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxOutstanding = max(r.maxOutstanding, r.fetched-r.committedBytes)
	off := int64(len(r.sizes))
	v := eventLine(fmt.Sprintf("big-%d", off), "message.created", "u1", "user", "org-1", `{"content":"`+strings.Repeat("y", 16<<10)+`"}`)
	r.sizes = append(r.sizes, len(v))
	r.fetched += len(v)
	return kafkago.Message{Topic: "events", Partition: 0, Offset: off, Value: []byte(v), Time: time.Now()}, nil
}

func (r *bigReader) CommitMessages(_ context.Context, msgs ...kafkago.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		for ; r.committed <= m.Offset; r.committed++ {
			r.committedBytes += r.sizes[r.committed]
		}
	}
	return nil
}

// slowStorage is a ClickHouse that is the bottleneck: an insert waits until the fetch
// loop has run ahead of the commits by more than ahead bytes, then takes delay.
type slowStorage struct {
	*fakeStorage
	r     *bigReader
	ahead int
	delay time.Duration
}

func (s slowStorage) BatchInsert(ctx context.Context, b *store.Batch) error {
	for !s.r.ranAhead(s.ahead) {
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(s.delay)
	return s.fakeStorage.BatchInsert(ctx, b)
}

// ranAhead says whether the records fetched and not committed have held more than n
// bytes at a fetch.
func (r *bigReader) ranAhead(n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxOutstanding > n
}

// TestConsumerBoundsThePendingBytes: with a slow ClickHouse and large records, the
// records fetched and not yet committed never hold more than MaxPendingBytes, although
// the record counts (BatchSize 10,000, the channels of thousands) would let the fetch
// loop run far ahead. The first insert is held until the fetch loop has used more than
// half the budget (nothing is released before an insert returns), so the budget is
// shown to be used, whatever the scheduling.
func TestConsumerBoundsThePendingBytes(t *testing.T) {
	const record = 16<<10 + 200
	r := &bigReader{}
	st := &fakeStorage{}
	cfg := ingest.Config{
		Reader: r, DeadLetters: &fakeDLQ{}, Storage: slowStorage{st, r, 6 * record, 5 * time.Millisecond}, Directory: directory.New(),
		Catalog: pricing.Default(), Topic: "events", Decoders: 2, BatchSize: 10_000, BatchAge: time.Hour,
		BatchBytes: 4 * record, MaxPendingBytes: 12 * record, RetryMin: time.Millisecond, RetryMax: time.Millisecond,
	}
	c, err := ingest.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.committed > 40
	}, time.Minute, time.Millisecond, "ingest goes on while the budget holds it back")
	cancel()
	<-done

	r.mu.Lock()
	defer r.mu.Unlock()
	t.Logf("fetched %d records, committed %d; at most %d bytes outstanding (budget %d)", len(r.sizes), r.committed, r.maxOutstanding, cfg.MaxPendingBytes)
	assert.LessOrEqual(t, r.maxOutstanding, cfg.MaxPendingBytes, "records fetched and not committed are bounded in bytes")
	assert.Greater(t, r.maxOutstanding, cfg.MaxPendingBytes/2, "and the budget is used, or the test proves nothing")
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, b := range st.batches[:len(st.batches)-1] { // the last one is the stop's
		assert.LessOrEqual(t, len(b.Events), 4, "batches flush on their bytes")
	}
}

func memoryLimit() error {
	return fmt.Errorf("cannot insert rows into db.events: %w",
		&clickhouse.Exception{Code: 241, Message: "Memory limit (for query) exceeded: would use 9.31 GiB"})
}

func TestConsumerSplitsABatchClickHouseHasNotTheMemoryFor(t *testing.T) {
	st := &fakeStorage{}
	st.refuse = func(b *store.Batch) error {
		if len(b.Events) > 2 {
			return memoryLimit()
		}
		return nil
	}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 8 })
	for i := range 8 {
		h.send(0, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 8 }, 5*time.Second, time.Millisecond)
	all := st.all()
	var ids []string
	for _, e := range all.Events {
		ids = append(ids, e.ID)
	}
	assert.Equal(t, []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7"}, ids, "each stored once, in order")
	assert.Empty(t, all.DeadLetters, "nothing is refused: the batch was too big at once")
	assert.Empty(t, h.dlq.all())
	assert.Zero(t, counterValue(t, h.metrics.InsertRejections))
	assert.Equal(t, float64(8), counterValue(t, h.metrics.Records.WithLabelValues("stored")))
	st.mu.Lock()
	defer st.mu.Unlock()
	// 8 → 4+4 → 2+2+2+2: three refused inserts, four that pass.
	assert.Equal(t, 7, st.attempts)
}

func TestConsumerRetriesASingleRecordClickHouseHasNotTheMemoryFor(t *testing.T) {
	st := &fakeStorage{}
	e2Left := 3
	st.refuse = func(b *store.Batch) error {
		if len(b.Events) > 1 {
			return memoryLimit()
		}
		if b.Events[0].ID == "e2" && e2Left > 0 {
			e2Left--
			return memoryLimit()
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
	assert.Empty(t, all.DeadLetters, "a single record out of memory is retried, never dead-lettered")
	st.mu.Lock()
	defer st.mu.Unlock()
	// 4 → 2+2 → 1+1+1+1, and e2 three times more.
	assert.Equal(t, 3+4+3, st.attempts)
}

func TestConsumerSplitsForMemoryAndStillIsolatesARefusedRecord(t *testing.T) {
	st := &fakeStorage{}
	st.refuse = func(b *store.Batch) error {
		if len(b.Events) > 2 {
			return memoryLimit()
		}
		return refuseRoom(b)
	}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 8 })
	for i := range 8 {
		line := eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`)
		if i == 5 {
			line = strings.Replace(line, `"room-1"`, `"poison-room"`, 1)
		}
		h.send(0, line)
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 8 }, 5*time.Second, time.Millisecond)
	all := st.all()
	assert.Len(t, all.Events, 7)
	require.Len(t, all.DeadLetters, 1, "only the record ClickHouse refuses is dead-lettered")
	assert.Equal(t, int64(5), all.DeadLetters[0].Offset)
	assert.Contains(t, all.DeadLetters[0].Reason, "code: 395")
}

func TestConsumerStoresRefusedRecordsOneByOneWhenTheirDeadLettersNeedTooMuchMemory(t *testing.T) {
	st := &fakeStorage{}
	st.refuse = func(b *store.Batch) error {
		if len(b.DeadLetters) > 1 {
			return memoryLimit()
		}
		return refuseRoom(b)
	}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 4 })
	for i := range 4 {
		line := eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`)
		if i%2 == 1 {
			line = strings.Replace(line, `"room-1"`, `"poison-room"`, 1)
		}
		h.send(0, line)
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 4 }, 5*time.Second, time.Millisecond)
	all := st.all()
	assert.Len(t, all.Events, 2)
	require.Len(t, all.DeadLetters, 2)
	for _, d := range all.DeadLetters {
		assert.Contains(t, d.Raw, "poison-room", "stored whole, one by one")
		assert.False(t, d.RawTruncated)
	}
	assert.Zero(t, counterValue(t, h.metrics.Dropped))
}

func TestConsumerSplitsALookupClickHouseHasNotTheMemoryFor(t *testing.T) {
	orig := eventLine("e0", "message.created", "u1", "user", "org-1", `{"content":"hi"}`)
	stored := storedRow(t, orig, 0, 0)
	stored.OwnerID = "u1"
	st := &fakeStorage{preStored: []store.EventRow{stored}}
	st.refuseLookup = func(keys []store.EventKey) error {
		if len(keys) > 2 {
			return memoryLimit()
		}
		return nil
	}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize = 6 })
	for i := range 6 {
		h.send(0, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`)) // e0: a replay
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 6 }, 5*time.Second, time.Millisecond)
	var ids []string
	for _, e := range st.events() {
		ids = append(ids, e.ID)
	}
	assert.Equal(t, []string{"e1", "e2", "e3", "e4", "e5"}, ids, "the replay was found by a half lookup and not written again")
	assert.Equal(t, float64(1), counterValue(t, h.metrics.Records.WithLabelValues("replayed")))
	assert.Zero(t, counterValue(t, h.metrics.LookupErrors), "the batch was not written unchecked")
	st.mu.Lock()
	defer st.mu.Unlock()
	assert.Equal(t, 1+2+4, st.lookups, "6 keys → 3+3 → 1+2+1+2")
}
