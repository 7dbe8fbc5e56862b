package seal

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/compact"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest/seal/tlog"
	"github.com/bandplane/bandplane/ingest/store"
)

// The attacks of someone who can write to ClickHouse but does not hold the audit key,
// one at a time on a sealed trail of 30 events, each named by id and kind.

// testMargin is shorter than the age of sealedTrail's rows (ingested a minute before
// they were sealed), so that a row that lost its leaf is unexpected at once.
const testMargin = 30 * time.Second

// TestIntegrationVerifyNamesEveryColumnEdit edits each column of one sealed row of
// events. The key columns cannot be updated in place: the row is deleted and written
// again with the edit, which leaves the sealed row missing and an unsealed one behind.
func TestIntegrationVerifyNamesEveryColumnEdit(t *testing.T) {
	const id = "ev-00004" // org-b
	for _, c := range []struct {
		col, set string
		want     []string
	}{
		{"type", "'policy.decided'", []string{"modified " + id}},
		{"time_ms", "(time_ms + 1) % 1000", []string{"modified " + id}},
		{"room_id", "'room-x'", []string{"modified " + id}},
		{"actor_id", "'agent-x'", []string{"modified " + id}},
		{"actor_handle", "'@x'", []string{"modified " + id}},
		{"owner_id", "'user-x'", []string{"modified " + id}},
		{"subject_id", "'s'", []string{"modified " + id}},
		{"subject_type", "'agent'", []string{"modified " + id}},
		{"subject_handle", "'@s'", []string{"modified " + id}},
		{"execution_id", "'exec-x'", []string{"modified " + id}},
		{"source", "'bandplane'", []string{"modified " + id}},
		{"schema_version", "2", []string{"modified " + id}},
		{"data", "'{\"content\":\"edited\"}'", []string{"modified " + id}},
		{"ingested_at", "toDateTime('2105-01-01 00:00:00', 'UTC')", []string{"modified " + id}},
		{"ingested_at", "ingested_at - 3600", []string{"modified " + id}},
		{"kafka_partition", "kafka_partition + 1", []string{"modified " + id}},
		{"kafka_offset", "kafka_offset + 1000", []string{"modified " + id}},
	} {
		t.Run(c.col+"="+c.set, func(t *testing.T) {
			tr, _ := sealedTrail(t)
			tr.exec("events", fmt.Sprintf("UPDATE %s = %s WHERE id = '%s'", c.col, c.set, id))
			rep := tr.verify(Filter{})
			assert.Equal(t, c.want, kinds(rep))
			for _, p := range rep.Problems {
				assert.Equal(t, "org-b", p.Org)
				assert.NotNil(t, p.Leaf, "names the leaf it differs from")
			}
		})
	}
	// 18.16 cannot UPDATE an Enum8 column in place (code 44): the edited row is written
	// again instead, under the same key.
	t.Run("actor_type", func(t *testing.T) {
		tr, rs := sealedTrail(t)
		r := rs[4]
		r.ActorType = "user"
		tr.exec("events", "DELETE WHERE id = '"+id+"'")
		insert(t, tr.conn, tr.db, []store.EventRow{r})
		assert.Equal(t, []string{"modified " + id}, kinds(tr.verify(Filter{})))
	})
	for name, edit := range map[string]func(*store.EventRow){
		"id":     func(r *store.EventRow) { r.ID += "-x" },
		"time":   func(r *store.EventRow) { r.Time = r.Time.Add(-time.Second) },
		"org_id": func(r *store.EventRow) { r.OrgID = "org-a" },
	} {
		t.Run(name, func(t *testing.T) {
			tr, rs := sealedTrail(t)
			r := rs[4]
			edit(&r)
			tr.exec("events", "DELETE WHERE id = '"+id+"'")
			insert(t, tr.conn, tr.db, []store.EventRow{r})
			rep := tr.verify(Filter{Margin: testMargin})
			assert.Equal(t, []string{"missing " + id, "unexpected " + r.ID}, kinds(rep), "the sealed row missing and its edited copy unexpected")
		})
	}
}

func TestIntegrationVerifyNamesDeletesAndInserts(t *testing.T) {
	t.Run("delete", func(t *testing.T) {
		tr, _ := sealedTrail(t)
		tr.exec("events", "DELETE WHERE id = 'ev-00007'")
		rep := tr.verify(Filter{})
		assert.Equal(t, []string{"missing ev-00007"}, kinds(rep))
		assert.Contains(t, rep.Problems[0].Reason, "no retention cut covers its time")
	})
	t.Run("insert into the sealed past", func(t *testing.T) {
		tr, _ := sealedTrail(t)
		now := time.Now().UTC()
		insert(t, tr.conn, tr.db, rows("forged", 1, []string{"org-a"}, now.Add(-3*time.Hour), now.Add(-time.Hour)))
		assert.Equal(t, []string{"unexpected forged-00000"}, kinds(tr.verify(Filter{})))
	})
	t.Run("insert stamped in the future", func(t *testing.T) {
		tr, _ := sealedTrail(t)
		now := time.Now().UTC()
		insert(t, tr.conn, tr.db, rows("forged", 1, []string{"org-a"}, now.Add(-3*time.Hour), now.Add(time.Hour)))
		assert.Equal(t, []string{"unexpected forged-00000"}, kinds(tr.verify(Filter{})))
	})
	t.Run("a copy of a sealed row with other content", func(t *testing.T) {
		tr, rs := sealedTrail(t)
		r := rs[5]
		r.Data = `{"content":"the other story"}`
		insert(t, tr.conn, tr.db, rs[5:5])
		insert(t, tr.conn, tr.db, append(rs[:0:0], r))
		assert.Equal(t, []string{"modified ev-00005"}, kinds(tr.verify(Filter{})))
	})
}

// TestIntegrationVerifyNamesLogEdits edits the log's own tables.
func TestIntegrationVerifyNamesLogEdits(t *testing.T) {
	for _, c := range []struct {
		name  string
		table string
		stmt  string
		want  []string
	}{
		{"a leaf's digest in log_leaves", "log_leaves", "UPDATE digest = '" + fmt.Sprintf("%064d", 0) + "' WHERE org_id = 'org-a' AND idx = 3",
			[]string{"missing leaf:org-a:3", "modified leaf:org-a:3", "unexpected ev-00009"}},
		{"a leaf's ingested_at in log_leaves", "log_leaves", "UPDATE ingested_at = ingested_at + 86400 WHERE org_id = 'org-a' AND idx = 3",
			[]string{"missing leaf:org-a:3", "modified leaf:org-a:3", "unexpected ev-00009"}},
		{"a leaf deleted from log_leaves", "log_leaves", "DELETE WHERE org_id = 'org-a' AND idx = 3",
			[]string{"missing leaf:org-a:3", "unexpected ev-00009"}},
		{"a leaf's time moved in log_index", "log_index", "UPDATE time_ms = time_ms + 1000 WHERE org_id = 'org-a' AND idx = 3",
			[]string{"forked log:org-a", "missing leaf:org-a:3", "modified leaf:org-a:3", "unexpected ev-00009"}},
		{"a leaf's inner digest in log_index", "log_index", "UPDATE inner = '" + fmt.Sprintf("%064d", 0) + "' WHERE org_id = 'org-a' AND idx = 3",
			[]string{"forked log:org-a", "missing leaf:org-a:3", "modified leaf:org-a:3", "unexpected ev-00009"}},
		// The index is cut at 3: the leaves after it are past the last leaf that can be
		// checked, and their rows with them.
		{"a leaf deleted from log_index", "log_index", "DELETE WHERE org_id = 'org-a' AND idx = 3",
			[]string{"missing leaf:org-a:3", "missing log:org-a", "truncated log:org-a", "unexpected ev-00009", "unexpected ev-00012",
				"unexpected ev-00015", "unexpected ev-00018", "unexpected ev-00021", "unexpected ev-00024", "unexpected ev-00027"}},
		{"a checkpoint's plain columns", "checkpoints", "UPDATE root = '00', signed_at = now() - 86400, key_id = 'x' WHERE org_id = 'org-a'", nil},
		{"a checkpoint deleted", "checkpoints", "DELETE WHERE org_id = 'org-a'",
			[]string{"missing log:org-a", "unexpected ev-00000", "unexpected ev-00003", "unexpected ev-00006", "unexpected ev-00009", "unexpected ev-00012",
				"unexpected ev-00015", "unexpected ev-00018", "unexpected ev-00021", "unexpected ev-00024", "unexpected ev-00027"}},
		{"a checkpoint's note replaced by an altered one", "checkpoints", "DELETE WHERE org_id = 'org-a'", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, _ := sealedTrail(t)
			var altered string
			if c.want == nil && c.stmt[:6] == "DELETE" {
				require.NoError(t, tr.conn.QueryRow(context.Background(), "SELECT replaceOne(note, '\\n10\\n', '\\n11\\n') FROM "+tr.db+
					".checkpoints WHERE org_id = 'org-a'").Scan(&altered))
			}
			tr.exec(c.table, c.stmt)
			if altered != "" {
				require.NoError(t, tr.s.db.insert(context.Background(), "checkpoints", "org_id, size, root, signed_at, key_id, note",
					[]string{"org-a"}, []uint64{11}, []string{""}, []time.Time{time.Now().UTC()}, []string{""}, []string{altered}))
				c.want = []string{"forged checkpoint:org-a:11", "missing log:org-a"}
				for _, id := range []string{"00", "03", "06", "09", "12", "15", "18", "21", "24", "27"} {
					c.want = append(c.want, "unexpected ev-000"+id)
				}
			}
			rep := tr.verify(Filter{Margin: testMargin})
			assert.Equal(t, c.want, kinds(rep))
		})
	}
	t.Run("a tree node edited: proofs fail, never pass", func(t *testing.T) {
		tr, _ := sealedTrail(t)
		ctx := context.Background()
		head := headOf(t, tr.verify(Filter{}), "org-a")
		leaf3, err := tr.s.db.ReadNodes(ctx, "org-a", []compact.NodeID{compact.NewNodeID(0, 3)})
		require.NoError(t, err)
		pr, err := tlog.InclusionProofs(ctx, tr.s.db, "org-a", []uint64{3}, head.Size)
		require.NoError(t, err)
		require.NoError(t, tlog.VerifyInclusion(3, head.Size, leaf3[0], pr[0], head.Root))
		// Node 1/0 is on leaf 3's path; node 1/4 is on the right edge of size 10.
		tr.exec("log_tree", "UPDATE hash = '"+fmt.Sprintf("%064d", 0)+"' WHERE org_id = 'org-a' AND level = 1 AND idx IN (0, 4)")
		rep := tr.verify(Filter{})
		require.Empty(t, rep.Problems, "verify recomputes the tree from the leaves; interior nodes serve proofs only")
		pr, err = tlog.InclusionProofs(ctx, tr.s.db, "org-a", []uint64{3}, head.Size)
		require.NoError(t, err)
		assert.Error(t, tlog.VerifyInclusion(3, head.Size, leaf3[0], pr[0], head.Root))
		// The sealer refuses to extend a log whose stored right edge does not give its root.
		s := tr.sealer(tr.key)
		now := time.Now().UTC()
		tr.store(rows("new", 1, []string{"org-a"}, now, now))
		res, err := s.SealNow(ctx)
		require.NoError(t, err)
		assert.Contains(t, res.Refused["org-a"], "does not give the root")
	})
}

func headOf(t *testing.T, rep Report, org string) Head {
	t.Helper()
	for _, h := range rep.Heads {
		if h.Org == org {
			return h
		}
	}
	t.Fatalf("no head of org %q", org)
	return Head{}
}

// TestIntegrationVerifyCatchesARollback restores the whole database to an older copy:
// the database alone verifies, the topic's checkpoint and an auditor's saved one do not.
func TestIntegrationVerifyCatchesARollback(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	latest, _ := tr.topic.read(ctx)
	saved := latest["org-a"] // what an auditor kept: org-a at 10
	// Copy every table aside (the "backup"), seal more, then restore the backup.
	tables := []string{"events", "log_leaves", "log_index", "log_tree", "checkpoints"}
	for _, table := range tables {
		require.NoError(t, tr.conn.Exec(ctx, "CREATE TABLE "+tr.db+".backup_"+table+" AS "+tr.db+"."+table))
		require.NoError(t, tr.conn.Exec(ctx, "INSERT INTO "+tr.db+".backup_"+table+" SELECT * FROM "+tr.db+"."+table))
	}
	now := time.Now().UTC()
	tr.store(rows("after", 9, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	tr.seal()
	for _, table := range tables {
		require.NoError(t, tr.conn.Exec(ctx, "DROP TABLE "+tr.db+"."+table))
		require.NoError(t, tr.conn.Exec(ctx, "RENAME TABLE "+tr.db+".backup_"+table+" TO "+tr.db+"."+table))
	}
	assert.Empty(t, tr.verify(Filter{}).Problems, "the older copy is consistent in itself")
	rep := tr.verify(Filter{Checkpoints: tr.topic.externals()})
	assert.Equal(t, []string{"truncated log:", "truncated log:org-a", "truncated log:org-b"}, kinds(rep))
	// The auditor's older checkpoint is still extended: no problem from it.
	rep = tr.verify(Filter{Checkpoints: []External{{Source: "auditor.checkpoint", Note: saved}}})
	assert.Empty(t, rep.Problems)
}

// TestIntegrationVerifyAcrossARotation rotates the audit key: one verify run passes
// across it anchored at either key, and a key no rotation introduced is refused.
func TestIntegrationVerifyAcrossARotation(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	next := testKey(t)
	// The hand-over is the second after the old key's last checkpoint (timestamps are
	// whole seconds); the new key signs only once the clock has passed it.
	from := headOf(t, tr.verify(Filter{}), "org-a").SignedAt.Add(time.Second)
	rec, err := tlog.Rotation(tlog.DefaultPrefix(tr.db), tr.key, next, from)
	require.NoError(t, err)
	require.NoError(t, tr.s.db.writeRotation(ctx, time.Now(), rec))
	require.True(t, stacktest.Eventually(t, 5*time.Second, 20*time.Millisecond, func() bool { return !time.Now().Before(from) }))
	s := tr.sealer(next)
	now := time.Now().UTC()
	tr.store(rows("after", 6, orgs3, now.Add(-time.Hour), now.Add(-20*time.Second)))
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	require.Empty(t, res.Refused, "the new key's sealer extends logs the old key signed")
	require.Equal(t, 6, res.Leaves)

	for name, anchor := range map[string]ed25519.PrivateKey{"the first key": tr.key, "the current key": next} {
		rep, err := Verify(ctx, tr.conn, tr.db, Keys{Anchors: []ed25519.PublicKey{pubOf(anchor)}}, Filter{})
		require.NoError(t, err)
		assert.Empty(t, rep.Problems, name)
		assert.Equal(t, 36, rep.SealedEvents, name)
	}

	// A sealer with a key no rotation introduced trusts no head: it refuses the logs
	// instead of starting them again.
	rogue := testKey(t)
	tr.store(rows("rogue", 3, []string{"org-a"}, now.Add(-time.Hour), now.Add(-10*time.Second)))
	res, err = tr.sealer(rogue).SealNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Leaves)
	assert.Contains(t, res.Refused["org-a"], "none of its")
	rep, err := Verify(ctx, tr.conn, tr.db, Keys{Anchors: []ed25519.PublicKey{pubOf(tr.key)}}, Filter{})
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
}

func TestIntegrationVerifyNamesAnEditNotedAgain(t *testing.T) {
	tr, rs := sealedTrail(t)
	// A sealed row is moved in ClickHouse, and a redelivery gets the moved row noted
	// and sealed again: the leaf of the row as first sealed has no copy any more.
	r := rs[4]
	tr.exec("events", "UPDATE ingested_at = ingested_at + 3600, kafka_offset = kafka_offset + 100000 WHERE id = '"+r.ID+"'")
	moved := r
	moved.IngestedAt, moved.Offset = r.IngestedAt.Add(time.Hour), r.Offset+100000
	tr.notes.add([]store.EventRow{moved})
	require.Equal(t, 1, tr.seal().Leaves)
	rep := tr.verify(Filter{Margin: testMargin})
	assert.Equal(t, []string{"modified " + r.ID}, kinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "no stored copy of the row is the one leaf")

	// Two copies of an insert attempt and its retry, both noted by a replay: once a
	// merge has dropped the earlier copy, its leaf is excused by the later one.
	tr2, rs2 := sealedTrail(t)
	early := rs2[7]
	early.IngestedAt = rs2[7].IngestedAt.Add(-5 * time.Second)
	tr2.store([]store.EventRow{early})
	require.Equal(t, 1, tr2.seal().Leaves)
	assert.Empty(t, tr2.verify(Filter{Margin: testMargin}).Problems)
	tr2.exec("events", fmt.Sprintf("DELETE WHERE id = '%s' AND ingested_at = toDateTime(%d)", early.ID, early.IngestedAt.Unix()))
	assert.Empty(t, tr2.verify(Filter{Margin: testMargin}).Problems)
}

func TestIntegrationVerifyJudgesUnsealedRowsByTheCoverage(t *testing.T) {
	tr, _ := sealedTrail(t)
	now := time.Now().UTC()
	// Rows written by hand with an ingested_at of now, which an attacker can keep
	// current: by the time alone they are merely unsealed.
	forged := rows("forged", 3, []string{"org-a"}, now.Add(-time.Hour), now)
	forged[0].Partition, forged[0].Offset = 0, 12   // below the coverage
	forged[1].Partition, forged[1].Offset = 1, 5000 // above it, past the end
	forged[2].Partition, forged[2].Offset = 2, 1500 // above it, before the end
	insert(t, tr.conn, tr.db, forged)
	assert.Equal(t, 3, tr.verify(Filter{}).UnsealedEvents)

	cov, err := tr.s.signer.SignCoverage("events", "ingest", map[int]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000}, now)
	require.NoError(t, err)
	ends := func(context.Context) (map[int]int64, error) {
		return map[int]int64{0: 2000, 1: 2000, 2: 2000, 3: 2000}, nil
	}
	rep := tr.verify(Filter{Coverage: cov, EventsTopic: "events", Ends: ends})
	assert.Equal(t, []string{"unexpected forged-00000", "unexpected forged-00001"}, kinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "lies below the coverage")
	assert.Contains(t, rep.Problems[1].Reason, "past the end of the events topic")
	assert.Equal(t, 1, rep.UnsealedEvents)

	// Another deployment's coverage says nothing here; a forged one is named.
	assert.Empty(t, tr.verify(Filter{Coverage: cov, EventsTopic: "other"}).Problems)
	other, err := tlog.NewSigner(tlog.DefaultPrefix(tr.db), testKey(t))
	require.NoError(t, err)
	bad, err := other.SignCoverage("events", "ingest", map[int]int64{0: 1 << 40}, now)
	require.NoError(t, err)
	assert.Equal(t, []string{"forged coverage"}, kinds(tr.verify(Filter{Coverage: bad, EventsTopic: "events"})))
}
