package trail

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/tlog"
)

func TestCutSignature(t *testing.T) {
	key := testKey(t)
	pub := pubOf(key)
	at := time.Date(2026, 11, 30, 3, 4, 5, 0, time.UTC)
	c := chdb.Cut{Table: "events", Before: time.Date(2025, 10, 27, 0, 0, 0, 0, time.UTC), At: at, Partitions: 2}
	const db, prefix = "bandplane", "bandplane/bandplane"
	ring := testRing(t, prefix, pub)
	CutSigner(key, db, prefix)(&c)
	assert.Equal(t, tlog.KeyID(pub), c.KeyID)
	assert.Len(t, c.Signature, 2*ed25519.SignatureSize)
	assert.Empty(t, checkCut(&c, db, ring))
	notVerify := "its signature does not verify with key " + tlog.KeyID(pub) + " for database bandplane and origin prefix bandplane/bandplane"

	// Every signed field counts.
	for name, tweak := range map[string]func(*chdb.Cut){
		"table":      func(c *chdb.Cut) { c.Table = "usage" },
		"before":     func(c *chdb.Cut) { c.Before = c.Before.AddDate(0, 0, 1) },
		"at":         func(c *chdb.Cut) { c.At = c.At.Add(time.Second) },
		"partitions": func(c *chdb.Cut) { c.Partitions++ },
	} {
		m := c
		tweak(&m)
		assert.NotEqual(t, CutContent(db, prefix, &c), CutContent(db, prefix, &m), name)
		assert.Equal(t, notVerify, checkCut(&m, db, ring), name)
	}
	// Length prefixes: a table name cannot borrow bytes from the times.
	a, b := chdb.Cut{Table: "ab"}, chdb.Cut{Table: "a"}
	assert.False(t, bytes.Equal(CutContent(db, prefix, &a), CutContent(db, prefix, &b)))

	// Bound to the deployment: the same cut signed for another database, or another
	// origin prefix, does not verify here.
	for _, other := range [][2]string{{"staging", prefix}, {db, "bandplane/staging"}} {
		m := c
		CutSigner(key, other[0], other[1])(&m)
		assert.Equal(t, notVerify, checkCut(&m, db, ring), "signed for %v", other)
	}

	// Hostile cuts.
	other := testKey(t)
	forged := c
	CutSigner(other, db, prefix)(&forged)
	assert.Contains(t, checkCut(&forged, db, ring), "key "+tlog.KeyID(pubOf(other))+" is not in the key ring")
	forged.KeyID = tlog.KeyID(pub) // claiming the right key does not help
	assert.Equal(t, notVerify, checkCut(&forged, db, ring))
	unsigned := chdb.Cut{Table: "events", Before: c.Before, At: at, Partitions: 1}
	assert.Contains(t, checkCut(&unsigned, db, ring), "unsigned")
	for _, sig := range []string{"zz", "00", strings.Repeat("0", 2*ed25519.SignatureSize), c.Signature[:10]} {
		g := c
		g.Signature = sig
		assert.NotEmpty(t, checkCut(&g, db, ring), sig)
	}
	g := c
	g.Signature = strings.ToUpper(c.Signature) // hex either case: still the same bytes
	assert.Empty(t, checkCut(&g, db, ring))
}

func testRing(t *testing.T, prefix string, pubs ...ed25519.PublicKey) *tlog.KeyRing {
	t.Helper()
	ring, err := tlog.NewKeyRing(prefix, pubs, nil)
	require.NoError(t, err)
	return ring
}

// insertCut records a cut as an attacker (or a test) would, straight into the table.
func insertCut(t *testing.T, conn driver.Conn, db string, c chdb.Cut) {
	t.Helper()
	b, err := conn.PrepareBatch(context.Background(), "INSERT INTO "+db+".retention_cuts (table_name, before, at, partitions, key_id, signature)")
	require.NoError(t, err)
	require.NoError(t, b.Append(c.Table, c.Before.UTC(), c.At.UTC(), c.Partitions, c.KeyID, c.Signature))
	require.NoError(t, b.Send())
}

func reasons(rep Report) map[string]string {
	out := map[string]string{}
	for _, p := range rep.Problems {
		out[p.ID] = p.Reason
	}
	return out
}

// A real retention run with the audit key: the sealed events it dropped are expired,
// with no alarm; one deleted from a kept day is still missing.
func TestIntegrationSealRetention(t *testing.T) {
	tr := newTrail(t)
	conn, db, key := tr.conn, tr.db, tr.key
	ctx := context.Background()
	now := time.Now().UTC()
	tr.store(rows("old", 6, orgs3, now.AddDate(0, 0, -30), now.Add(-time.Minute)))
	tr.store(rows("new", 6, orgs3, now.Add(-time.Hour), now.Add(-time.Minute)))
	tr.seal()

	// The run's clock is the second after the newest checkpoint: checkpoints and cuts
	// carry whole seconds, and a cut must be recorded after the checkpoints it follows.
	res, err := chdb.ApplyRetention(ctx, conn, chdb.Config{Database: db}, chdb.Retention{Events: 10 * 24 * time.Hour}, afterEveryHead(tr.verify(Filter{})),
		chdb.RetentionOptions{Sign: CutSigner(key, db, tlog.DefaultPrefix(db))})
	require.NoError(t, err)
	require.NotEmpty(t, res.Dropped)
	require.Len(t, res.Cuts, 1)
	assert.Equal(t, tlog.KeyID(pubOf(key)), res.Cuts[0].KeyID)
	var progress bytes.Buffer
	rep := tr.verify(Filter{Progress: &progress})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 6, rep.ExpiredEvents)
	assert.Equal(t, 6, rep.SealedEvents)
	assert.Contains(t, progress.String(), "1 retention cut(s) signed for this deployment")

	mutate(t, conn, db, "events", "DELETE WHERE id = 'new-00001'")
	rep = tr.verify(Filter{})
	assert.Equal(t, []string{"missing new-00001"}, kinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "no retention cut covers its time")
	assert.Equal(t, 6, rep.ExpiredEvents)
	assert.Equal(t, 5, rep.SealedEvents)
}

// Retention without the key: it drops, records an unsigned cut, and verify reports
// the sealed events it dropped as missing, saying why.
func TestIntegrationSealRetentionUnsigned(t *testing.T) {
	tr := newTrail(t)
	conn, db := tr.conn, tr.db
	ctx := context.Background()
	now := time.Now().UTC()
	tr.store(rows("old", 3, []string{"org-a"}, now.AddDate(0, 0, -30), now.Add(-time.Minute)))
	tr.store(rows("new", 3, []string{"org-a"}, now.Add(-time.Hour), now.Add(-time.Minute)))
	tr.seal()
	res, err := chdb.ApplyRetention(ctx, conn, chdb.Config{Database: db}, chdb.Retention{Events: 10 * 24 * time.Hour}, time.Now(), chdb.RetentionOptions{})
	require.NoError(t, err)
	require.Len(t, res.Dropped, 1)
	n, err := SealedIn(ctx, conn, db, []string{res.Dropped[0].Partition})
	require.NoError(t, err)
	assert.Equal(t, uint64(3), n, "what retention warns about")
	n, err = SealedIn(ctx, conn, db, nil)
	require.NoError(t, err)
	assert.Zero(t, n)
	_, err = SealedIn(ctx, conn, "x; DROP", []string{"20260101"})
	assert.ErrorContains(t, err, "not a plain identifier")

	rep := tr.verify(Filter{})
	assert.Equal(t, []string{"missing old-00000", "missing old-00001", "missing old-00002"}, kinds(rep))
	for _, p := range rep.Problems {
		assert.Contains(t, p.Reason, "is ignored: unsigned (bandplane retention ran without --audit-key)")
	}
	assert.Zero(t, rep.ExpiredEvents)
}

// The review's repro: two sealed rows deleted, then a cut inserted by hand to excuse
// them. It is not signed, so they stay missing; a cut signed with the key does not
// excuse them either, because their day still holds rows (a DELETE, not a retention
// drop of the whole day).
func TestIntegrationSealRetentionForgedCut(t *testing.T) {
	tr, _ := sealedTrail(t)
	conn, db, key := tr.conn, tr.db, tr.key
	ctx := context.Background()
	now := time.Now().UTC()
	mutate(t, conn, db, "events", "DELETE WHERE id IN ('ev-00004', 'ev-00011')")
	want := []string{"missing ev-00004", "missing ev-00011"}
	rep := tr.verify(Filter{})
	assert.Equal(t, want, kinds(rep))

	// As the review did it with clickhouse-client (INSERT … VALUES), here with a SELECT:
	// the driver sends VALUES as a data block.
	require.NoError(t, conn.Exec(ctx, "INSERT INTO "+db+".retention_cuts SELECT 'events', now(), now(), 1, '', ''"))
	rep = tr.verify(Filter{})
	assert.Equal(t, want, kinds(rep))
	assert.Zero(t, rep.ExpiredEvents)
	assert.Contains(t, reasons(rep)["ev-00004"], "unsigned")

	// A genuine signed cut covering the rows' time, recorded after their seal (as one
	// whose partition drops failed): their day still has its other rows.
	c := chdb.Cut{Table: "events", Before: time.Now().UTC().Truncate(time.Second), At: time.Now().UTC().Truncate(time.Second), Partitions: 1}
	CutSigner(key, db, tlog.DefaultPrefix(db))(&c)
	insertCut(t, conn, db, c)
	rep = tr.verify(Filter{})
	assert.Equal(t, want, kinds(rep))
	assert.Zero(t, rep.ExpiredEvents)
	assert.Contains(t, reasons(rep)["ev-00011"], "rows of its day "+now.Add(-2*time.Hour).Format(time.DateOnly)+" are still stored")
	assert.Equal(t, 28, rep.SealedEvents)
}

// A whole day deleted, so that its partition is empty as after a retention drop: only
// a cut signed with the audit key, recorded after the seal, excuses it.
func TestIntegrationSealRetentionWholeDay(t *testing.T) {
	tr := newTrail(t)
	conn, db, key := tr.conn, tr.db, tr.key
	pub := pubOf(key)
	now := time.Now().UTC()
	day := now.AddDate(0, 0, -5).Truncate(24 * time.Hour)
	tr.store(rows("old", 3, []string{"org-a"}, day.Add(12*time.Hour), now.Add(-time.Minute)))
	tr.store(rows("new", 3, []string{"org-a"}, now.Add(-time.Hour), now.Add(-time.Minute)))
	tr.seal()
	sealedAt := headOf(t, tr.verify(Filter{}), "org-a").SignedAt
	sign := CutSigner(key, db, tlog.DefaultPrefix(db))
	mutate(t, conn, db, "events", "DELETE WHERE toDate(time) = '"+day.Format(time.DateOnly)+"'")
	want := []string{"missing old-00000", "missing old-00001", "missing old-00002"}
	check := func(step, reason string) {
		t.Helper()
		rep := tr.verify(Filter{})
		assert.Equal(t, want, kinds(rep), step)
		assert.Zero(t, rep.ExpiredEvents, step)
		assert.Contains(t, reasons(rep)["old-00001"], reason, step)
	}
	check("no cut", "no retention cut covers its time")

	before := day.AddDate(0, 0, 1)
	// Checkpoints and cuts carry whole seconds: the cuts below are recorded from the
	// second after the seal.
	at := sealedAt.Add(time.Second)
	// A genuine cut, altered to cover the day: its signature no longer matches.
	genuine := chdb.Cut{Table: "events", Before: day, At: at.Add(time.Second), Partitions: 1}
	sign(&genuine)
	insertCut(t, conn, db, genuine)
	mutate(t, conn, db, "retention_cuts", "UPDATE before = toDateTime('"+before.Format(time.DateTime)+"', 'UTC') WHERE signature = '"+genuine.Signature+"'")
	notVerify := "its signature does not verify with key " + tlog.KeyID(pub)
	check("altered", "the retention cut recorded at "+fmtTime(genuine.At)+" that covers its time is ignored: "+notVerify)

	forged := chdb.Cut{Table: "events", Before: before, At: at, Partitions: 1}
	CutSigner(testKey(t), db, tlog.DefaultPrefix(db))(&forged)
	forged.KeyID = tlog.KeyID(pub)
	insertCut(t, conn, db, forged)
	check("signed with another key", "the retention cut recorded at "+fmtTime(forged.At)+" that covers its time is ignored: "+notVerify)

	// A genuine cut, but of another deployment that shares the key.
	elsewhere := chdb.Cut{Table: "events", Before: before, At: at.Add(2 * time.Second), Partitions: 1}
	CutSigner(key, "staging", tlog.DefaultPrefix("staging"))(&elsewhere)
	insertCut(t, conn, db, elsewhere)
	check("another deployment's", notVerify)

	// A genuine cut recorded before the rows were sealed: it did not remove them.
	early := chdb.Cut{Table: "events", Before: before, At: sealedAt.Add(-time.Hour), Partitions: 1}
	sign(&early)
	insertCut(t, conn, db, early)
	check("recorded before the seal", "recorded before it was sealed")

	// A genuine cut after the seal, and the day is gone: expired (what retention does).
	late := chdb.Cut{Table: "events", Before: before, At: at.Add(2 * time.Second), Partitions: 1}
	sign(&late)
	insertCut(t, conn, db, late)
	rep := tr.verify(Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.ExpiredEvents)
	assert.Equal(t, 3, rep.SealedEvents)

	// …but not under another key: verify honours the cuts of the keys it trusts.
	rep, err := Verify(context.Background(), conn, db, Keys{Anchors: []ed25519.PublicKey{pubOf(testKey(t))}}, Filter{})
	require.NoError(t, err)
	assert.Zero(t, rep.ExpiredEvents)
	assert.NotEmpty(t, rep.Problems)
}
