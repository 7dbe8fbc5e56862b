package trail

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
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

// memNotes stands in for the stored-events topic in tests of the sealer's logic (the
// pipeline test runs the real one): what insert stores, it notes here, as ingest does.
// Like the group reader, a Drain continues where the last one stopped, Commit drops
// what the Drains returned and Rewind makes them return it again. gen is the hand-out
// Generation reports; holds false stands for another sealer holding the topic.
type memNotes struct {
	mu      sync.Mutex
	queue   []kafkago.Message
	drained int
	fail    error
	gen     int64
	away    bool
}

func (n *memNotes) add(rows []store.EventRow) {
	byOrg := map[string][]tlog.Leaf{}
	for i := range rows {
		byOrg[rows[i].OrgID] = append(byOrg[rows[i].OrgID], tlog.LeafOf(&rows[i]))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, org := range slices.Sorted(maps.Keys(byOrg)) {
		for _, m := range tlog.EncodeNotes(byOrg[org]) {
			n.queue = append(n.queue, kafkago.Message{Key: []byte(org), Value: m})
		}
	}
}

func (n *memNotes) Drain(_ context.Context, max int) ([]kafkago.Message, bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fail != nil {
		return nil, false, n.fail
	}
	if n.away {
		return nil, false, nil
	}
	k := min(max, len(n.queue)-n.drained)
	out := slices.Clone(n.queue[n.drained : n.drained+k])
	n.drained += k
	return out, n.drained < len(n.queue), nil
}

func (n *memNotes) Commit(context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queue = n.queue[n.drained:]
	n.drained = 0
	return nil
}

func (n *memNotes) Rewind() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drained = 0
}

func (n *memNotes) Holds() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.away
}

func (n *memNotes) Generation() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gen
}

// handOut stands for the group handing the topic out again (to this sealer or,
// with away, to another one): a new generation, from the last commit.
func (n *memNotes) handOut(away bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gen++
	n.away = away
	n.drained = 0
}

func (n *memNotes) pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}

// memTopic stands in for the checkpoints topic: the newest note per organization.
type memTopic struct {
	mu     sync.Mutex
	latest map[string][]byte
	all    int
	fail   error
}

func (p *memTopic) ProduceMessages(_ context.Context, msgs []kafkago.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	if p.latest == nil {
		p.latest = map[string][]byte{}
	}
	for _, m := range msgs {
		p.latest[string(m.Key)] = m.Value
		p.all++
	}
	return nil
}

func (p *memTopic) read(context.Context) (map[string][]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]byte{}
	for k, v := range p.latest {
		out[k] = v
	}
	return out, nil
}

// externals are the topic's checkpoints as verify takes them.
func (p *memTopic) externals() []External {
	m, _ := p.read(context.Background())
	var out []External
	for org, note := range m {
		if org == CoverageKey || strings.HasPrefix(org, RotationKeyPrefix) {
			continue
		}
		out = append(out, External{Source: "the checkpoints topic (" + org + ")", Note: note})
	}
	return out
}

// trail is a test database with its notes, its checkpoints topic and its sealer.
type trail struct {
	t     testing.TB
	conn  driver.Conn
	db    string
	key   ed25519.PrivateKey
	notes *memNotes
	topic *memTopic
	s     *Sealer
}

func newTrail(t testing.TB, tweak ...func(*Config)) *trail {
	t.Helper()
	conn, db := testDB(t)
	tr := &trail{t: t, conn: conn, db: db, key: testKey(t), notes: &memNotes{}, topic: &memTopic{}}
	tr.s = tr.sealer(tr.key, tweak...)
	return tr
}

func (tr *trail) sealer(key ed25519.PrivateKey, tweak ...func(*Config)) *Sealer {
	tr.t.Helper()
	cfg := Config{Conn: tr.conn, Database: tr.db, Key: key, Notes: tr.notes, Publisher: tr.topic, Published: tr.topic.read,
		Logger: stacktest.Logger()}
	for _, f := range tweak {
		f(&cfg)
	}
	s, err := New(cfg)
	require.NoError(tr.t, err)
	return s
}

// store writes rows as ingest does and notes them.
func (tr *trail) store(rs []store.EventRow) {
	tr.t.Helper()
	insert(tr.t, tr.conn, tr.db, rs)
	tr.notes.add(rs)
}

func (tr *trail) seal() Result {
	tr.t.Helper()
	res, err := tr.s.SealNow(context.Background())
	require.NoError(tr.t, err)
	return res
}

func (tr *trail) verify(f Filter) Report {
	tr.t.Helper()
	rep, err := Verify(context.Background(), tr.conn, tr.db, Keys{Anchors: []ed25519.PublicKey{pubOf(tr.key)}}, f)
	require.NoError(tr.t, err)
	return rep
}

func (tr *trail) exec(table, stmt string) { mutate(tr.t, tr.conn, tr.db, table, stmt) }

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
			IngestedAt: ingested.Truncate(time.Second), Partition: int32(i % 4), Offset: int64(i),
		}
	}
	return out
}

func insert(t testing.TB, conn driver.Conn, db string, rs []store.EventRow) {
	t.Helper()
	require.NoError(t, store.New(conn, db).BatchInsert(context.Background(), &store.Batch{Events: rs}))
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
