package trail

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

var orgs3 = []string{"org-a", "org-b", ""}

// sealedTrail is a database holding 30 events of three organizations (org "" among
// them), all sealed.
func sealedTrail(t *testing.T) (*trail, []store.EventRow) {
	t.Helper()
	tr := newTrail(t)
	now := time.Now().UTC()
	rs := rows("ev", 30, orgs3, now.Add(-2*time.Hour), now.Add(-time.Minute))
	tr.store(rs)
	res := tr.seal()
	require.Equal(t, 3, res.Checkpoints)
	require.Equal(t, 30, res.Leaves)
	rep := tr.verify(Filter{})
	require.Empty(t, rep.Problems)
	require.Equal(t, 30, rep.SealedEvents)
	return tr, rs
}

func TestIntegrationSealThenVerify(t *testing.T) {
	tr := newTrail(t)
	now := time.Now().UTC()
	tr.store(rows("ev", 30, orgs3, now.Add(-2*time.Hour), now.Add(-time.Minute)))
	res := tr.seal()
	assert.Equal(t, Result{Checkpoints: 3, Leaves: 30, Orgs: 3, Published: 3}, res)
	assert.Zero(t, tr.notes.pending(), "the notes are committed")

	rep := tr.verify(Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.Orgs)
	assert.Equal(t, 3, rep.Checkpoints)
	assert.Equal(t, uint64(30), rep.Leaves)
	assert.Equal(t, 30, rep.SealedEvents)
	require.Len(t, rep.Heads, 3)
	for _, h := range rep.Heads {
		assert.Equal(t, uint64(10), h.Size, h.Org)
		assert.Equal(t, tlog.KeyID(pubOf(tr.key)), h.KeyID)
	}

	// The topic has every organization's checkpoint, which verifies on its own.
	ring, err := tlog.NewKeyRing(tlog.DefaultPrefix(tr.db), []ed25519.PublicKey{pubOf(tr.key)}, nil)
	require.NoError(t, err)
	latest, _ := tr.topic.read(context.Background())
	require.Len(t, latest, 3)
	for org, note := range latest {
		c, err := ring.Open(note)
		require.NoError(t, err)
		assert.Equal(t, org, c.Org)
		assert.Equal(t, uint64(10), c.Size)
	}

	// A run with nothing new signs a fresh checkpoint of each organization, to the
	// topic only.
	res = tr.seal()
	assert.Equal(t, Result{Fresh: 3, Published: 3}, res)
	assert.Equal(t, 3, tr.verify(Filter{}).Checkpoints, "fresh checkpoints are not stored")

	// New rows grow only their organization's log.
	tr.store(rows("more", 4, []string{"org-a"}, now.Add(-time.Hour), now.Add(-30*time.Second)))
	res = tr.seal()
	assert.Equal(t, Result{Checkpoints: 1, Leaves: 4, Orgs: 1, Fresh: 2, Published: 3}, res)
	rep = tr.verify(Filter{Checkpoints: tr.topic.externals()})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 34, rep.SealedEvents)
}

func TestIntegrationSealDeduplicatesNotes(t *testing.T) {
	tr, again := sealedTrail(t)
	// The same rows noted again (ingest retried a batch whose notes Kafka had taken, or
	// a redelivery): no new leaf.
	tr.notes.add(again)
	tr.notes.add(again[:5])
	res := tr.seal()
	assert.Equal(t, 0, res.Leaves)
	assert.Equal(t, 35, res.Duplicates)
	assert.Empty(t, tr.verify(Filter{}).Problems)

	// A copy stored by another insert attempt (another ingested_at) is a leaf of its own.
	retried := append([]store.EventRow(nil), again[:3]...)
	for i := range retried {
		retried[i].IngestedAt = retried[i].IngestedAt.Add(30 * time.Second)
	}
	tr.store(retried)
	res = tr.seal()
	assert.Equal(t, 3, res.Leaves)
	rep := tr.verify(Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 30, rep.SealedEvents)
}

func TestIntegrationSealIgnoresRowsWithoutNotes(t *testing.T) {
	tr, _ := sealedTrail(t)
	now := time.Now().UTC()
	// Written into ClickHouse by hand, fresh: never sealed (no note), pending until the
	// margin has passed.
	insert(t, tr.conn, tr.db, rows("forged", 2, []string{"org-a"}, now.Add(-time.Hour), now))
	res := tr.seal()
	assert.Equal(t, 0, res.Leaves)
	rep := tr.verify(Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 2, rep.UnsealedEvents)
	// With a margin shorter than their age behind the newest checkpoint they are
	// unexpected: the next checkpoint is signed in a second after theirs.
	untilPast(t, now.Truncate(time.Second).Add(time.Second))
	tr.store(rows("later", 1, []string{"org-b"}, now, now))
	tr.seal()
	rep = tr.verify(Filter{Margin: time.Nanosecond})
	assert.Equal(t, []string{"unexpected forged-00000", "unexpected forged-00001"}, kinds(rep))
}

func TestIntegrationSealerRefusesARolledBackLog(t *testing.T) {
	tr, _ := sealedTrail(t)
	now := time.Now().UTC()
	tr.store(rows("late", 6, []string{"org-a"}, now.Add(-time.Hour), now.Add(-20*time.Second)))
	tr.seal() // org-a at 16; the topic says so
	// Truncate org-a's log back to its first checkpoint: rows, leaves and checkpoint.
	tr.exec("checkpoints", "DELETE WHERE org_id = 'org-a' AND size > 10")
	tr.exec("log_leaves", "DELETE WHERE org_id = 'org-a' AND idx >= 10")
	tr.exec("log_index", "DELETE WHERE org_id = 'org-a' AND idx >= 10")
	tr.exec("events", "DELETE WHERE org_id = 'org-a' AND id LIKE 'late-%'")

	// Without the topic's checkpoint, the database alone looks whole.
	assert.Empty(t, tr.verify(Filter{}).Problems)
	// With it, the truncation is named.
	rep := tr.verify(Filter{Checkpoints: tr.topic.externals()})
	assert.Equal(t, []string{"truncated log:org-a"}, kinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "holds 10 leaves, but the checkpoint of 16 leaves")

	// A sealer that starts now reads the topic and refuses to extend org-a.
	tr.notes.add(rows("next", 2, []string{"org-a", "org-b"}, now, now))
	s := tr.sealer(tr.key)
	res, err := s.SealNow(context.Background())
	require.NoError(t, err)
	assert.Contains(t, res.Refused["org-a"], "rolled back")
	assert.Equal(t, 2, tr.notes.pending(), "the notes stay uncommitted while an organization is refused")
	assert.Greater(t, s.unsealedAge(), 0.0)
	assert.Equal(t, 1.0, s.refusedOrgs())
}

func TestIntegrationForgedCheckpointRowsNeverMoveAHead(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	// A forged, unsigned row with a huge size, and one signed by another key.
	other, err := tlog.NewSigner(tlog.DefaultPrefix(tr.db), testKey(t))
	require.NoError(t, err)
	foreign, err := other.Sign("org-a", 999, make([]byte, 32))
	require.NoError(t, err)
	require.NoError(t, tr.s.db.insert(ctx, "checkpoints", "org_id, size, root, signed_at, key_id, note",
		[]string{"org-a", "org-a"}, []uint64{1 << 40, 999}, []string{"00", "00"},
		[]time.Time{time.Now().UTC(), time.Now().UTC()}, []string{"x", foreign.KeyID},
		[]string{"bandplane/x/org/org-a\n1099511627776\nAAAA\n\n— forged AAAA\n", string(foreign.Note)}))

	now := time.Now().UTC()
	tr.store(rows("after", 3, []string{"org-a"}, now.Add(-time.Hour), now.Add(-10*time.Second)))
	s := tr.sealer(tr.key) // a fresh sealer reads the heads from ClickHouse
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Leaves, "sealing goes on from the signed head")
	assert.Empty(t, res.Refused)

	rep := tr.verify(Filter{})
	assert.Equal(t, []string{"forged checkpoint:org-a:1099511627776", "forged checkpoint:org-a:999"}, kinds(rep))
	for _, p := range rep.Problems {
		assert.Equal(t, "org-a", p.Org)
	}
}

func TestIntegrationSealErrors(t *testing.T) {
	tr, _ := sealedTrail(t)
	tr.notes.fail = errors.New("kafka is down")
	_, err := tr.s.SealNow(context.Background())
	assert.ErrorContains(t, err, "kafka is down")
	tr.notes.fail = nil

	// Checkpoints the topic did not take are published by the next run.
	tr.topic.fail = errors.New("broker gone")
	now := time.Now().UTC()
	tr.store(rows("x", 3, orgs3, now.Add(-time.Hour), now.Add(-10*time.Second)))
	_, err = tr.s.SealNow(context.Background())
	assert.ErrorContains(t, err, "broker gone")
	tr.topic.fail = nil
	res := tr.seal()
	assert.Equal(t, 6, res.Published, "the 3 pending and 3 fresh")
	assert.Empty(t, tr.verify(Filter{Checkpoints: tr.topic.externals()}).Problems)
}

func TestSealerConfigErrors(t *testing.T) {
	cfg := Config{Database: "bad-name", Key: []byte{1}, Every: time.Millisecond, MaxLeaves: -1, Prefix: "has space"}
	err := cfg.Validate()
	require.Error(t, err)
	for _, want := range []string{"no clickhouse connection", "not a plain identifier", "no Ed25519 private key", "stored-events notes",
		"publisher", "at least 1s", "must not be negative", "--audit-origin"} {
		assert.Contains(t, err.Error(), want)
	}
}
