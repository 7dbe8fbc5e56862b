package ingest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// rowsStorage answers lookups from rows; it is never written to here.
type rowsStorage struct {
	nop
	rows []store.EventRow
}

func (s rowsStorage) StoredEvents(_ context.Context, keys []store.EventKey) ([]store.EventRow, error) {
	want := map[store.EventKey]bool{}
	for _, k := range keys {
		want[k] = true
	}
	var out []store.EventRow
	for i := range s.rows {
		if want[store.KeyOf(&s.rows[i])] {
			out = append(out, s.rows[i])
		}
	}
	return out, nil
}

// TestToRowsNotesNoRecheckForADeadLetteredUsageEvent: a usage event of a party with
// rows stored without an organization is late-attributed, so its index is noted for
// checkStored; if its usage row cannot be built it is dead-lettered and has no event
// row. Its index used to be noted first: it then pointed at the next event (another
// party's) or past the end, and checkStored indexed out of range.
func TestToRowsNotesNoRecheckForADeadLetteredUsageEvent(t *testing.T) {
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	dir := directory.New()
	dir.Load([]store.DirectoryRow{{Kind: "agent", ID: "agent-7", OrgID: "org-9", OwnerID: "owner-1", Model: "gpt-5-mini", Version: 1}})
	agent := schema.Party{ID: "agent-7", Type: schema.ActorAgent}
	ev := func(id, typ string, actor schema.Party, org, data string) schema.Event {
		return schema.Event{ID: id, Type: typ, Time: at, OrgID: org, RoomID: "room-1", Actor: actor, Source: "t",
			SchemaVersion: 1, Data: []byte(data)}
	}
	first := ev("m1", schema.TypeMessageCreated, schema.Party{ID: "u1", Type: schema.ActorUser}, "org-1", `{"content":"hi"}`)
	// Usage data that does not decode: the decoder refuses it, so only a record that
	// reached toRows some other way (or a future check in UsageRow) gets here.
	bad := ev("u-bad", schema.TypeUsageReported, agent, "", `{"input_tokens":"many"}`)
	other := ev("m2", schema.TypeMessageCreated, schema.Party{ID: "u2", Type: schema.ActorUser}, "org-1", `{"content":"hi"}`)
	replay := ev("m3", schema.TypeMessageCreated, agent, "", `{"content":"stored before the agent registered"}`)
	stored := EventRow(&replay, "", 0, 99) // as stored then: no organization, no owner

	c, err := New(Config{Reader: nop{}, DeadLetters: nop{}, Storage: rowsStorage{rows: []store.EventRow{stored}}, Directory: dir,
		Catalog: pricing.Default(), BatchSize: 10, BatchAge: time.Second, LateParties: map[string]time.Time{"agent-7": time.Now()}})
	require.NoError(t, err)
	c.now = func() time.Time { return at }
	p := newPending(10)
	for i, e := range []schema.Event{first, bad, other, replay} {
		c.add(p, record{msg: kafkago.Message{Partition: 0, Offset: int64(i)}, ev: e})
		switch i {
		case 1:
			require.Len(t, p.batch.DeadLetters, 1, "the bad usage event is dead-lettered")
			assert.Equal(t, "validate", p.batch.DeadLetters[0].Stage)
			assert.Empty(t, p.recheck, "no index for an event that has no row (it would be past the end)")
		case 2:
			assert.Empty(t, p.recheck, "nor one that lands on the next, unrelated event")
		}
	}
	c.resolveParked(p)
	require.Equal(t, []int{2}, p.recheck, "the late-attributed event is rechecked at its own index")
	assert.Equal(t, "m3", p.batch.Events[2].ID)
	assert.Equal(t, "org-9", p.batch.Events[2].OrgID, "attributed while batching")

	require.True(t, c.checkStored(context.Background(), p))
	var ids []string
	for _, e := range p.batch.Events {
		ids = append(ids, e.ID)
		assert.NotEqual(t, "m3", e.ID, "the replay is recognised under org \"\" and not written again")
	}
	assert.Equal(t, []string{"m1", "m2"}, ids)
	assert.Equal(t, 1, p.replays)
}

// A party is marked late only for an event that is stored without an organization,
// not for one that is dead-lettered.
func TestToRowsMarksNoPartyLateForADeadLetteredEvent(t *testing.T) {
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	c, err := New(Config{Reader: nop{}, DeadLetters: nop{}, Storage: nop{}, Directory: directory.New(), Catalog: pricing.Default(),
		BatchSize: 10, BatchAge: time.Second})
	require.NoError(t, err)
	p := newPending(10)
	p.msgs = append(p.msgs, kafkago.Message{Offset: 0}, kafkago.Message{Offset: 1})
	bad := schema.Event{ID: "u-bad", Type: schema.TypeUsageReported, Time: at, RoomID: "r", Actor: schema.Party{ID: "agent-x", Type: schema.ActorAgent},
		Source: "t", SchemaVersion: 1, Data: []byte(`{"input_tokens":"many"}`)}
	c.toRows(p, &bad, 0, at) // as resolveParked does for an unknown party
	assert.Empty(t, p.batch.Events)
	assert.False(t, c.late.has("agent-x", at))
	good := bad
	good.ID, good.Data = "u-ok", []byte(`{"input_tokens":1,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0}`)
	c.toRows(p, &good, 1, at)
	assert.Len(t, p.batch.Events, 1)
	assert.True(t, c.late.has("agent-x", at), "stored without an organization: remembered")
}

// TestByteBudget runs in a synctest bubble: synctest.Wait returns once the goroutine
// acquiring is blocked (or done), so an acquire that has not returned by then waits.
func TestByteBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newByteBudget(100)
		ctx := context.Background()
		require.True(t, b.acquire(ctx, 60))
		require.True(t, b.acquire(ctx, 40))
		assert.Equal(t, 100, b.held())

		got := make(chan bool, 1)
		waiting := func(msg string) {
			t.Helper()
			synctest.Wait()
			select {
			case <-got:
				t.Fatal(msg)
			default:
			}
		}

		// Full: the next acquire waits for a release.
		go func() { got <- b.acquire(ctx, 30) }()
		waiting("acquired past the limit")
		b.release(20) // 80 held: 30 does not fit yet
		waiting("acquired past the limit after a partial release")
		b.release(60)
		assert.True(t, <-got, "woken by the release")
		assert.Equal(t, 50, b.held())

		// A stop ends the wait.
		cctx, cancel := context.WithCancel(ctx)
		go func() { got <- b.acquire(cctx, 80) }()
		waiting("acquired past the limit before the stop")
		cancel()
		assert.False(t, <-got, "woken by the stop")
		assert.Equal(t, 50, b.held(), "a cancelled acquire takes nothing")

		// More than the whole limit: only once nothing is held, and then at once.
		go func() { got <- b.acquire(ctx, 500) }()
		waiting("an oversized acquire must wait for the others")
		b.release(50)
		assert.True(t, <-got, "an oversized record is let through once nothing is held")
		assert.Equal(t, 500, b.held())
		b.release(500)
		assert.Zero(t, b.held())
	})
}

// With several ingest processes, a registration consumed by another process reaches
// this one through ClickHouse: a batch ending with an unknown party reloads the
// directory (at most once a second), and the event is attributed.
func TestParkedEventOfAnotherProcesssRegistrationIsAttributed(t *testing.T) {
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	reloads := 0
	c, err := New(Config{Reader: nop{}, DeadLetters: nop{}, Storage: nop{}, Directory: directory.New(), Catalog: pricing.Default(),
		BatchSize: 10, BatchAge: time.Second, ReloadDirectory: func(context.Context) ([]store.DirectoryRow, error) {
			reloads++
			return []store.DirectoryRow{{Kind: "agent", ID: "agent-elsewhere", OrgID: "org-1", OwnerID: "owner-1", Version: 1}}, nil
		}})
	require.NoError(t, err)
	c.now = func() time.Time { return at }
	p := newPending(10)
	p.msgs = append(p.msgs, kafkago.Message{Offset: 0})
	ev := schema.Event{ID: "m-1", Type: schema.TypeMessageCreated, Time: at, RoomID: "r", Actor: schema.Party{ID: "agent-elsewhere", Type: schema.ActorAgent},
		Source: "t", SchemaVersion: 1, Data: []byte(`{"content":"hi"}`)}
	p.parked = append(p.parked, parked{ev: ev, rec: 0})
	c.resolveParked(p)
	require.Len(t, p.batch.Events, 1)
	assert.Equal(t, "org-1", p.batch.Events[0].OrgID, "attributed from the reloaded directory")
	assert.Equal(t, 1, reloads)

	// Hostile: a party that never registers costs one reload a second, not one a batch.
	q := newPending(10)
	q.msgs = append(q.msgs, kafkago.Message{Offset: 1})
	ev.ID, ev.Actor.ID = "m-2", "agent-never"
	q.parked = append(q.parked, parked{ev: ev, rec: 0})
	c.resolveParked(q)
	assert.Equal(t, 1, reloads)
	assert.Empty(t, q.batch.Events[0].OrgID)
}
