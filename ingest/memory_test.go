package ingest

import (
	"context"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// nop is a reader, writer and storage that the tests here never reach.
type nop struct{}

func (nop) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	<-ctx.Done()
	return kafkago.Message{}, ctx.Err()
}
func (nop) CommitMessages(context.Context, ...kafkago.Message) error                 { return nil }
func (nop) ProduceMessages(context.Context, []kafkago.Message) error                 { return nil }
func (nop) BatchInsert(context.Context, *store.Batch) error                          { return nil }
func (nop) StoredEvents(context.Context, []store.EventKey) ([]store.EventRow, error) { return nil, nil }

func TestExpiring(t *testing.T) {
	e := newExpiring(time.Hour)
	t0 := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	e.mark("a", t0)
	e.mark("b", t0.Add(30*time.Minute))
	e.mark("a", t0.Add(-time.Hour)) // an older mark never shortens the life
	assert.True(t, e.has("a", t0.Add(59*time.Minute)))
	assert.False(t, e.has("a", t0.Add(time.Hour)), "expired at the horizon, swept or not")
	assert.False(t, e.has("c", t0))
	n, ok := e.sweep(t0.Add(61 * time.Minute))
	assert.True(t, ok)
	assert.Equal(t, 1, n)
	assert.Equal(t, 1, e.len())
	_, ok = e.sweep(t0.Add(62 * time.Minute))
	assert.False(t, ok, "sweeps at most every horizon/8")
	e.remove("b")
	assert.Zero(t, e.len())
}

// TestConsumerMemoryStaysBoundedUnderChurn feeds 100,000 distinct agents over 20
// simulated hours, each with one usage report the consumer can neither attribute nor
// price: each is remembered as late and as unpriced, and forgotten after its horizon.
func TestConsumerMemoryStaysBoundedUnderChurn(t *testing.T) {
	const agents, batch = 100_000, 1000
	c, err := New(Config{Reader: nop{}, DeadLetters: nop{}, Storage: nop{}, Directory: directory.New(), Catalog: pricing.Default(),
		BatchSize: batch, BatchAge: time.Second, LateHorizon: time.Hour, UnpricedHorizon: 4 * time.Hour})
	require.NoError(t, err)
	clock := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return clock }
	step := 20 * time.Hour / agents // 5,000 new agents an hour
	p := newPending(batch)
	usage := []byte(`{"input_tokens":1,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0}`)
	maxLate, maxUnpriced := 0, 0
	for i := range agents {
		clock = clock.Add(step)
		ev := schema.Event{ID: fmt.Sprintf("u%d", i), Type: schema.TypeUsageReported, Time: clock, RoomID: "r",
			Actor: schema.Party{ID: fmt.Sprintf("agent-%d", i), Type: schema.ActorAgent}, Source: "t", SchemaVersion: 1, Data: usage}
		c.add(p, record{msg: kafkago.Message{Offset: int64(i)}, ev: ev})
		if len(p.msgs) == batch {
			c.resolveParked(p)
			require.Len(t, p.batch.Usage, batch)
			p = newPending(batch)
		}
		maxLate, maxUnpriced = max(maxLate, c.late.len()), max(maxUnpriced, c.unpriced.len())
	}
	perHour := int(time.Hour / step)
	// At most 9/8 of a horizon's worth (sweeps run every horizon/8), plus the batch
	// that is marked at once when it is handed off.
	assert.LessOrEqual(t, maxLate, perHour*9/8+batch)
	assert.LessOrEqual(t, maxUnpriced, 4*perHour*9/8+batch)
	// And they were remembered for their horizon: not swept early.
	assert.GreaterOrEqual(t, maxLate, perHour-batch)
	assert.GreaterOrEqual(t, maxUnpriced, 4*perHour-batch)
	assert.True(t, c.late.has(fmt.Sprintf("agent-%d", agents-1), clock))
	assert.False(t, c.late.has("agent-0", clock))
	t.Logf("agents %d, %d an hour: at most %d late and %d unpriced remembered", agents, perHour, maxLate, maxUnpriced)
}
