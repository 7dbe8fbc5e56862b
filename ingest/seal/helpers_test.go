package seal

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
)

// testDB is a migrated database of the test's own.
func testDB(t testing.TB) (driver.Conn, string) {
	t.Helper()
	return stacktest.Database(t)
}

func testKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return k
}

// fakeProducer keeps what it is given; fail makes Produce fail.
type fakeProducer struct {
	mu     sync.Mutex
	events []schema.Event
	fail   error
}

func (p *fakeProducer) Produce(_ context.Context, evs []schema.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	p.events = append(p.events, evs...)
	return nil
}

func (p *fakeProducer) all() []schema.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]schema.Event(nil), p.events...)
}

func newSealer(t testing.TB, conn driver.Conn, db string, key ed25519.PrivateKey, p Producer, tweak ...func(*Config)) *Sealer {
	t.Helper()
	cfg := Config{Conn: conn, Database: db, Key: key, Producer: p, Settle: time.Second, Logger: stacktest.Logger()}
	for _, f := range tweak {
		f(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	return s
}

// rows makes n event rows spread over orgs, with event times around at and
// ingested_at at ingested.
func rows(prefix string, n int, orgs []string, at, ingested time.Time) []store.EventRow {
	out := make([]store.EventRow, n)
	for i := range out {
		out[i] = store.EventRow{
			ID: fmt.Sprintf("%s-%05d", prefix, i), Type: schema.TypeMessageCreated,
			Time:  at.Add(time.Duration(i) * 1500 * time.Millisecond).Truncate(time.Millisecond),
			OrgID: orgs[i%len(orgs)], RoomID: fmt.Sprintf("room-%d", i%5),
			ActorID: fmt.Sprintf("agent-%d", i%7), ActorType: "agent", OwnerID: fmt.Sprintf("user-%d", i%3),
			Source: "band", SchemaVersion: 1, Data: fmt.Sprintf(`{"content":"message %d"}`, i),
			IngestedAt: ingested, Partition: int32(i % 4), Offset: int64(i),
		}
	}
	return out
}

func insert(t testing.TB, conn driver.Conn, db string, rs []store.EventRow) {
	t.Helper()
	require.NoError(t, store.New(conn, db).BatchInsert(context.Background(), &store.Batch{Events: rs}))
}

func verify(t testing.TB, conn driver.Conn, db string, pub ed25519.PublicKey, f Filter) Report {
	t.Helper()
	rep, err := Verify(context.Background(), conn, db, pub, f)
	require.NoError(t, err)
	return rep
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// mutate runs an ALTER TABLE … UPDATE/DELETE and waits for the mutation to finish
// (they are asynchronous on 18.16).
func mutate(t testing.TB, conn driver.Conn, db, table, stmt string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, conn.Exec(ctx, "ALTER TABLE "+db+"."+table+" "+stmt))
	ok := stacktest.Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		var pending uint64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM system.mutations WHERE database = ? AND table = ? AND is_done = 0", db, table).Scan(&pending))
		return pending == 0
	})
	require.True(t, ok, "mutation %q on %s.%s did not finish", stmt, db, table)
}

// kinds lists the problems as sorted "kind id" strings.
func kinds(rep Report) []string {
	var out []string
	for _, p := range rep.Problems {
		out = append(out, p.Kind+" "+p.ID)
	}
	slices.Sort(out)
	return out
}

// eventRow is the row ingest stores for ev (ingest.EventRow, without the directory).
func eventRow(ev schema.Event, ingested time.Time) store.EventRow {
	r := store.EventRow{ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, RoomID: ev.RoomID,
		ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type), ActorHandle: ev.Actor.Handle,
		ExecutionID: ev.ExecutionID, Source: ev.Source, SchemaVersion: uint16(ev.SchemaVersion),
		Data: string(ev.Data), IngestedAt: ingested}
	if ev.Subject != nil {
		r.SubjectID, r.SubjectType, r.SubjectHandle = ev.Subject.ID, string(ev.Subject.Type), ev.Subject.Handle
	}
	return r
}
