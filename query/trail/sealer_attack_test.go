package trail

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// Attacks on the sealer itself: bookkeeping rows planted so that a genuine note looks
// sealed, a database restored behind a sealer's back, sealers handing the topic over,
// and key rotations.

// plantLeaf writes log_leaves and log_index rows claiming that r's leaf sits at idx.
func (tr *trail) plantLeaf(r *store.EventRow, idx uint64) {
	tr.t.Helper()
	ctx := context.Background()
	lf := tlog.LeafOf(r)
	in := lf.Inner()
	require.NoError(tr.t, tr.s.db.insert(ctx, "log_leaves", leafCols,
		[]string{lf.Org}, []time.Time{lf.Time.Truncate(time.Second)}, []uint16{uint16(lf.Time.Nanosecond() / 1e6)}, []string{lf.ID},
		[]uint64{idx}, []string{hexOf(lf.Digest[:])}, []time.Time{lf.IngestedAt}, []int32{lf.Partition}, []int64{lf.Offset}))
	require.NoError(tr.t, tr.s.db.insert(ctx, "log_index", "org_id, idx, time_ms, inner",
		[]string{lf.Org}, []uint64{idx}, []int64{lf.Time.UnixMilli()}, []string{hexOf(in[:])}))
}

func TestIntegrationPlantedLeavesNeverMakeANoteHeld(t *testing.T) {
	tr, _ := sealedTrail(t)
	now := time.Now().UTC()
	victim := rows("victim", 1, []string{"org-a"}, now.Add(-30*time.Minute), now.Add(-20*time.Minute))[0]
	tr.store([]store.EventRow{victim})
	// Before the sealer runs: rows saying the victim's leaf is at index 3 of org-a's
	// log, which holds another leaf there.
	tr.plantLeaf(&victim, 3)
	res := tr.seal()
	assert.Equal(t, 1, res.Leaves, "the log does not prove the planted leaf: the note is appended")
	assert.Zero(t, res.Duplicates)

	// The planted rows and the victim's row go: verify names the sealed row as gone.
	tr.exec("log_leaves", "DELETE WHERE id = 'victim-00000' AND idx = 3")
	tr.exec("log_index", fmt.Sprintf("DELETE WHERE org_id = 'org-a' AND idx = 3 AND time_ms = %d", victim.Time.UnixMilli()))
	tr.exec("events", "DELETE WHERE id = 'victim-00000'")
	rep := tr.verify(Filter{Checkpoints: tr.topic.externals(), Margin: testMargin})
	assert.Equal(t, []string{"missing victim-00000"}, kinds(rep))

	// A note really held is still recognised after the plants, by its proof.
	tr.notes.add([]store.EventRow{victim})
	res = tr.seal()
	assert.Equal(t, 1, res.Duplicates)
	assert.Zero(t, res.Leaves)
}

// snapshot copies the log's tables and the events; restore puts the copy back, as an
// attacker restoring a backup does.
func (tr *trail) snapshot() (restore func()) {
	tr.t.Helper()
	ctx := context.Background()
	tables := []string{"events", "log_leaves", "log_index", "log_tree", "checkpoints"}
	for _, table := range tables {
		require.NoError(tr.t, tr.conn.Exec(ctx, "CREATE TABLE "+tr.db+".backup_"+table+" AS "+tr.db+"."+table))
		require.NoError(tr.t, tr.conn.Exec(ctx, "INSERT INTO "+tr.db+".backup_"+table+" SELECT * FROM "+tr.db+"."+table))
	}
	return func() {
		for _, table := range tables {
			require.NoError(tr.t, tr.conn.Exec(ctx, "DROP TABLE "+tr.db+"."+table))
			require.NoError(tr.t, tr.conn.Exec(ctx, "RENAME TABLE "+tr.db+".backup_"+table+" TO "+tr.db+"."+table))
		}
	}
}

func TestIntegrationSealerReloadsWhenHandedTheTopicAgain(t *testing.T) {
	tr, _ := sealedTrail(t) // serve's sealer, tr.s, has read the topic and holds the logs
	restore := tr.snapshot()
	now := time.Now().UTC()

	// An operator's `audit seal` takes the topic over and seals 6 events.
	tr.notes.handOut(false)
	op := tr.sealer(tr.key)
	tr.store(rows("operator", 6, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	res, err := op.SealNow(context.Background())
	require.NoError(t, err)
	require.Equal(t, 6, res.Leaves)

	// The attacker restores the database from before; serve's sealer gets the topic
	// back and is given more notes. It reads the topic again and refuses to extend
	// the restored logs.
	restore()
	tr.notes.handOut(false)
	tr.store(rows("serve", 6, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	res = tr.seal()
	assert.Zero(t, res.Leaves)
	assert.Zero(t, res.Fresh, "no fresh checkpoint of a refused log")
	require.Len(t, res.Refused, 3)
	for org, why := range res.Refused {
		assert.Contains(t, why, "rolled back: the checkpoints topic has a checkpoint of 12 leaves", org)
	}
	rep := tr.verify(Filter{Checkpoints: tr.topic.externals(), Margin: testMargin})
	assert.Contains(t, kinds(rep), "truncated log:org-a")

	// Every run says so again, and the notes stay.
	res = tr.seal()
	assert.Len(t, res.Refused, 3)
	assert.Equal(t, 3, tr.notes.pending())
}

func TestIntegrationFreshCheckpointsAfterATakeover(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	now := time.Now().UTC()
	tr.notes.handOut(false)
	op := tr.sealer(tr.key)
	tr.store(rows("operator", 6, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	_, err := op.SealNow(ctx)
	require.NoError(t, err)

	// serve's sealer gets the topic back: its fresh checkpoints state the logs as the
	// operator's run left them, not as serve last saw them.
	tr.notes.handOut(false)
	tr.store(rows("serve", 1, []string{"org-a"}, now.Add(-time.Hour), now.Add(-20*time.Second)))
	res := tr.seal()
	assert.Equal(t, 1, res.Leaves)
	assert.Equal(t, 2, res.Fresh)
	ring, err := tlog.NewKeyRing(tlog.DefaultPrefix(tr.db), []ed25519.PublicKey{pubOf(tr.key)}, nil)
	require.NoError(t, err)
	latest, _ := tr.topic.read(ctx)
	for org, want := range map[string]uint64{"org-a": 13, "org-b": 12, "": 12} {
		c, err := ring.Open(latest[org])
		require.NoError(t, err)
		assert.Equal(t, want, c.Size, org)
	}

	// A cut of org-b back to 10 leaves is caught by the topic.
	tr.exec("checkpoints", "DELETE WHERE org_id = 'org-b' AND size > 10")
	tr.exec("log_leaves", "DELETE WHERE org_id = 'org-b' AND idx >= 10")
	tr.exec("log_index", "DELETE WHERE org_id = 'org-b' AND idx >= 10")
	tr.exec("events", "DELETE WHERE org_id = 'org-b' AND id LIKE 'operator-%'")
	rep := tr.verify(Filter{Checkpoints: tr.topic.externals(), Margin: testMargin})
	assert.Contains(t, kinds(rep), "truncated log:org-b")
}

func TestIntegrationSealerHoldingNothingSignsNothing(t *testing.T) {
	tr, _ := sealedTrail(t)
	before := tr.topic.all
	tr.notes.handOut(true)
	res := tr.seal()
	assert.True(t, res.Idle)
	assert.Equal(t, before, tr.topic.all, "not even fresh checkpoints")
}

func TestIntegrationStaleSealerAppendsNothingTwice(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	now := time.Now().UTC()
	tr.store(rows("x", 3, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	// Another sealer gets the same notes (a rebalance overlapping this one's run) and
	// seals them first.
	other := &memNotes{queue: slices.Clone(tr.notes.queue)}
	b := tr.sealer(tr.key, func(c *Config) { c.Notes = other })
	res, err := b.SealNow(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Leaves)

	res = tr.seal() // its cached heads are stale
	assert.Zero(t, res.Leaves)
	assert.Equal(t, 3, res.Duplicates)
	var n uint64
	require.NoError(t, tr.conn.QueryRow(ctx, "SELECT count() FROM "+tr.db+".log_index").Scan(&n))
	assert.Equal(t, uint64(33), n)
	assert.Empty(t, tr.verify(Filter{Checkpoints: tr.topic.externals()}).Problems)
}

// untilPast waits for the wall clock to pass at. The signer stamps checkpoints with it,
// in whole seconds, and key validity is in whole seconds too: a test that needs a
// later second waits for it rather than sleeps.
func untilPast(t *testing.T, at time.Time) {
	t.Helper()
	require.True(t, stacktest.Eventually(t, 5*time.Second, 20*time.Millisecond, func() bool { return time.Now().After(at) }))
}

func TestIntegrationSealerSignsOnlyWithinItsKeysValidity(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	next := testKey(t)
	now := time.Now().UTC()

	// A rotation an hour ahead: the new key may not sign yet, the old one still does.
	later, err := tlog.Rotation(tlog.DefaultPrefix(tr.db), tr.key, next, now.Add(time.Hour))
	require.NoError(t, err)
	require.NoError(t, tr.s.db.writeRotation(ctx, now, later))
	early := tr.sealer(next)
	tr.store(rows("a", 3, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	_, err = early.SealNow(ctx)
	require.ErrorIs(t, err, ErrKeyNotValid)
	assert.ErrorContains(t, err, "outside the key's validity")
	assert.Equal(t, 3, tr.notes.pending(), "nothing sealed, nothing committed")
	res := tr.seal()
	assert.Equal(t, 3, res.Leaves)
	tr.exec("key_rotations", "DELETE WHERE 1 = 1")

	// A rotation effective the second after the newest checkpoint: once the clock has
	// passed it, the old key signs nothing, the new one takes over the same logs.
	from := afterEveryHead(tr.verify(Filter{}))
	rec, err := tlog.Rotation(tlog.DefaultPrefix(tr.db), tr.key, next, from)
	require.NoError(t, err)
	require.NoError(t, tr.s.db.writeRotation(ctx, now, rec))
	untilPast(t, from)
	tr.store(rows("b", 3, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	old := tr.sealer(tr.key)
	_, err = old.SealNow(ctx)
	require.ErrorIs(t, err, ErrKeyNotValid)
	assert.Equal(t, 3, tr.notes.pending())

	// The record deleted from ClickHouse: the sealer that saw it still signs nothing.
	tr.exec("key_rotations", "DELETE WHERE 1 = 1")
	_, err = old.SealNow(ctx)
	require.ErrorIs(t, err, ErrKeyNotValid)
	// A new key's sealer that never saw it trusts none of the logs' checkpoints: it
	// refuses them rather than start them again at 0.
	res, err = tr.sealer(next).SealNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Leaves)
	require.Len(t, res.Refused, 3)
	assert.Contains(t, res.Refused["org-a"], "none of its 2 checkpoint rows verifies")

	// The record is on the checkpoints topic too (audit rotate puts it there): an old
	// key's sealer started now finds it there, and the new key's takes over.
	require.NoError(t, tr.topic.ProduceMessages(ctx, []kafkago.Message{{Key: []byte(RotationKeyPrefix + tlog.KeyID(pubOf(next))), Value: rec}}))
	_, err = tr.sealer(tr.key).SealNow(ctx)
	require.ErrorIs(t, err, ErrKeyNotValid)
	res, err = tr.sealer(next).SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Leaves)
	assert.Empty(t, res.Refused)
	for name, anchor := range map[string]ed25519.PrivateKey{"the first key": tr.key, "the current key": next} {
		rep, err := Verify(ctx, tr.conn, tr.db, Keys{Anchors: []ed25519.PublicKey{pubOf(anchor)}, Rotations: [][]byte{rec}}, Filter{Checkpoints: tr.topic.externals()})
		require.NoError(t, err)
		assert.Empty(t, rep.Problems, name)
		assert.Equal(t, 36, rep.SealedEvents, name)
	}
}

// With the real group reader: a run that refuses an organization leaves its notes (and
// the ones after them) to the next run, which checks the log again and seals them once
// it is mended.
func TestIntegrationRefusedNotesAreReadAgain(t *testing.T) {
	conn, db := testDB(t)
	topic := stacktest.Topic(t, 1)
	key := testKey(t)
	ctx := context.Background()
	s, tp := kafkaSealer(t, conn, db, topic, "ingest-"+topic, key, 0, time.Minute)
	np, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: tp.Stored})
	require.NoError(t, err)
	t.Cleanup(func() { _ = np.Close() })
	now := time.Now().UTC()
	n := 0
	storeOne := func(org string) store.EventRow {
		n++
		r := rows(fmt.Sprintf("r%d", n), 1, []string{org}, now.Add(-time.Hour).Add(time.Duration(n)*time.Second), now.Add(-time.Minute))[0]
		r.Offset = int64(n)
		insert(t, conn, db, []store.EventRow{r})
		for _, b := range tlog.EncodeNotes([]tlog.Leaf{tlog.LeafOf(&r)}) {
			require.NoError(t, np.ProduceMessages(ctx, []kafkago.Message{{Key: []byte(org), Value: b}}))
		}
		return r
	}
	verify := func() Report {
		latest, err := kafka.ReadLatest(ctx, stacktest.Brokers(), tp.Checkpoints)
		require.NoError(t, err)
		var ext []External
		for k, v := range latest {
			if k != CoverageKey {
				ext = append(ext, External{Source: k, Note: v})
			}
		}
		rep, err := Verify(ctx, conn, db, Keys{Anchors: []ed25519.PublicKey{pubOf(key)}}, Filter{Checkpoints: ext})
		require.NoError(t, err)
		return rep
	}
	storeOne("org-a")
	storeOne("org-b")
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Leaves)

	// Junk checkpoint rows above org-a's head refuse org-a.
	for i := range maxForged + 1 {
		require.NoError(t, s.db.insert(ctx, "checkpoints", "org_id, size, root, signed_at, key_id, note",
			[]string{"org-a"}, []uint64{uint64(100 + i)}, []string{""}, []time.Time{now}, []string{""}, []string{fmt.Sprintf("junk %d", i)}))
	}
	victim := storeOne("org-a")
	storeOne("org-b")
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	assert.Contains(t, res.Refused["org-a"], "do not verify")
	mutate(t, conn, db, "checkpoints", "DELETE WHERE note LIKE 'junk%'")

	// The next run checks org-a's log again and, mended, seals the victim; org-b's
	// note, sealed by the refused run, comes back as a duplicate.
	storeOne("org-b")
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, res.Refused)
	assert.Zero(t, s.refusedOrgs())
	assert.Equal(t, 2, res.Leaves)
	assert.Equal(t, 1, res.Duplicates)
	rep := verify()
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 5, rep.SealedEvents)

	mutate(t, conn, db, "events", "DELETE WHERE id = '"+victim.ID+"'")
	assert.Equal(t, []string{"missing " + victim.ID}, kinds(verify()))
}

func TestIntegrationNotesWaitForTheirCheckpointsOnTheTopic(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	now := time.Now().UTC()
	tr.topic.fail = errors.New("kafka: not enough in-sync replicas")
	tr.store(rows("victim", 3, []string{"org-a"}, now.Add(-time.Hour), now.Add(-20*time.Second)))
	_, err := tr.s.SealNow(ctx)
	require.ErrorContains(t, err, "cannot publish")
	assert.Equal(t, 1, tr.notes.pending(), "the notes (one message) wait for the topic")

	// The attacker removes the victims, their leaves and the checkpoint only ClickHouse
	// had; the topic is handed out again, and Kafka recovers: the notes are sealed again
	// and the topic shows what the attacker removed.
	tr.exec("events", "DELETE WHERE id LIKE 'victim-%'")
	tr.exec("log_leaves", "DELETE WHERE org_id = 'org-a' AND idx >= 10")
	tr.exec("log_index", "DELETE WHERE org_id = 'org-a' AND idx >= 10")
	tr.exec("checkpoints", "DELETE WHERE org_id = 'org-a' AND size > 10")
	tr.notes.handOut(false)
	tr.topic.fail = nil
	res := tr.seal()
	assert.Equal(t, 3, res.Leaves)
	assert.Zero(t, tr.notes.pending())
	rep := tr.verify(Filter{Checkpoints: tr.topic.externals()})
	assert.Equal(t, []string{"missing victim-00000", "missing victim-00001", "missing victim-00002"}, kinds(rep))
}

// flakyConn fails the next query that reads log_tree once armed: a ClickHouse restart,
// a timeout, "too many simultaneous queries".
type flakyConn struct {
	driver.Conn
	armed atomic.Bool
}

func (c *flakyConn) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	if strings.Contains(q, ".log_tree") && c.armed.CompareAndSwap(true, false) {
		return nil, errors.New("code: 202, message: Too many simultaneous queries")
	}
	return c.Conn.Query(ctx, q, args...)
}

func TestIntegrationADatabaseErrorRefusesNothing(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	fc := &flakyConn{Conn: tr.conn}
	fc.armed.Store(true)
	s := tr.sealer(tr.key, func(c *Config) { c.Conn = fc })
	tr.notes.handOut(false)
	now := time.Now().UTC()
	tr.store(rows("x", 3, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	_, err := s.SealNow(ctx)
	require.ErrorContains(t, err, "code: 202")
	assert.Equal(t, 3, tr.notes.pending())
	assert.Zero(t, s.refusedOrgs())

	// The next run seals.
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, res.Refused)
	assert.Equal(t, 3, res.Leaves)
	assert.Empty(t, tr.verify(Filter{Checkpoints: tr.topic.externals()}).Problems)
}
