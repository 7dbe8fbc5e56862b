package trail

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/compact"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
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

// afterEveryHead is the second after the newest head of any organization: a rotation
// from then on leaves every checkpoint signed so far to the old key. One run signs the
// organizations one after another, so their heads may fall in two seconds.
func afterEveryHead(rep Report) time.Time {
	var newest time.Time
	for _, h := range rep.Heads {
		if h.SignedAt.After(newest) {
			newest = h.SignedAt
		}
	}
	return newest.Add(time.Second)
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
	from := afterEveryHead(tr.verify(Filter{}))
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
	// The events topic ends at 2000 in each partition, and holds forged[2]'s event
	// where it claims it.
	records := fakeRecords(0, 2000, map[[2]int64][]byte{{2, 1500}: eventJSON(t, forged[2])})
	rep := tr.verify(Filter{Coverage: cov, EventsTopic: "events", Records: records})
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

// eventJSON is r's event as a canonical record of the events topic.
func eventJSON(t testing.TB, r store.EventRow) []byte {
	t.Helper()
	ev := schema.Event{ID: r.ID, Type: r.Type, Time: r.Time, OrgID: r.OrgID, RoomID: r.RoomID,
		Actor:  schema.Party{ID: r.ActorID, Type: schema.ActorType(r.ActorType), Handle: r.ActorHandle},
		Source: r.Source, SchemaVersion: int(r.SchemaVersion), Data: json.RawMessage(r.Data)}
	b, err := json.Marshal(&ev)
	require.NoError(t, err)
	return b
}

// fakeTopic stands in for the events topic as Filter.Records reads it: partitions
// 0-3, each from first to end, holding values at (partition, offset) and nothing
// elsewhere; unread offsets are left unread. asked records each call's offsets.
type fakeTopic struct {
	first, end int64
	values     map[[2]int64][]byte
	unread     map[int64]bool
	asked      map[int32][]int64
}

func fakeRecords(first, end int64, values map[[2]int64][]byte) func(context.Context, int32, []int64) (Claimed, error) {
	return (&fakeTopic{first: first, end: end, values: values}).records
}

func (f *fakeTopic) records(_ context.Context, partition int32, offsets []int64) (Claimed, error) {
	if f.asked == nil {
		f.asked = map[int32][]int64{}
	}
	f.asked[partition] = append(f.asked[partition], offsets...)
	if partition < 0 || partition > 3 {
		return Claimed{NoPartition: true}, nil
	}
	c := Claimed{First: f.first, End: f.end, Records: map[int64]ClaimedRecord{}}
	for _, o := range offsets {
		switch {
		case o < f.first || o >= f.end:
		case f.unread[o]:
			c.Unread = append(c.Unread, o)
		default:
			if v, ok := f.values[[2]int64{int64(partition), o}]; ok {
				c.Records[o] = ClaimedRecord{Value: v, Time: time.Now()}
			}
		}
	}
	return c, nil
}

// problemOf is the problem of id, or fails.
func problemOf(t *testing.T, rep Report, id string) Problem {
	t.Helper()
	for _, p := range rep.Problems {
		if p.ID == id {
			return p
		}
	}
	t.Fatalf("no problem of %s in %v", id, kinds(rep))
	return Problem{}
}

// A forged row claims a Kafka record above the coverage and below the end, which an
// attacker can keep true by moving its kafka_offset after each seal run: the record is
// read, and must be this event.
func TestIntegrationVerifyChecksTheClaimedRecord(t *testing.T) {
	tr, rs := sealedTrail(t)
	now := time.Now().UTC()
	forged := rows("forged", 9, []string{"org-a"}, now.Add(-time.Hour), now)
	at := func(i int, p int32, o int64) { forged[i].Partition, forged[i].Offset = p, o }
	at(0, 1, 1100) // (a) another event's record
	at(1, 1, 1101) // (b) a record that is not an event
	at(2, 1, 5000) // (c) past the end
	at(3, 2, 1200) // (d) its own record: stays unsealed
	at(4, 2, 3)    // (e) removed by retention: not checked
	at(5, 3, 1300) // no record there
	at(6, 9, 10)   // a partition the topic does not have
	at(7, 3, 1301) // not read (a byte bound): not checked
	at(8, 2, 1201) // its own record, though ingest attributed it to another org
	insert(t, tr.conn, tr.db, forged)
	own := forged[8]
	own.OrgID = ""
	topic := &fakeTopic{first: 1000, end: 2000, unread: map[int64]bool{1301: true}, values: map[[2]int64][]byte{
		{1, 1100}: eventJSON(t, rs[7]),
		{1, 1101}: []byte("\x00not an event"),
		{2, 1200}: eventJSON(t, forged[3]),
		{2, 1201}: eventJSON(t, own),
	}}
	cov, err := tr.s.signer.SignCoverage("events", "ingest", map[int]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000}, now)
	require.NoError(t, err)
	// forged[4] claims an offset below the coverage: without coverage, it is judged
	// by its record alone.
	for name, f := range map[string]Filter{
		"with the coverage":    {Coverage: cov, EventsTopic: "events", IngestGroup: "ingest"},
		"without the coverage": {},
	} {
		t.Run(name, func(t *testing.T) {
			var progress strings.Builder
			f.Records, f.Progress = topic.records, &progress
			rep := tr.verify(f)
			want := []string{"unexpected forged-00000", "unexpected forged-00001", "unexpected forged-00002",
				"unexpected forged-00005", "unexpected forged-00006"}
			if f.Coverage != nil {
				want = append(want, "unexpected forged-00004")
				slices.Sort(want)
			}
			assert.Equal(t, want, kinds(rep))
			assert.Contains(t, problemOf(t, rep, "forged-00000").Reason, "(partition 1, offset 1100) is event ev-00007 at ")
			assert.Contains(t, problemOf(t, rep, "forged-00001").Reason, "(partition 1, offset 1101) holds 13 bytes that are not an event")
			assert.Contains(t, problemOf(t, rep, "forged-00002").Reason, "(partition 1, offset 5000) is past the end of the events topic (2000)")
			assert.Contains(t, problemOf(t, rep, "forged-00005").Reason, "the events topic holds no record at partition 3, offset 1300")
			assert.Contains(t, problemOf(t, rep, "forged-00006").Reason, "its Kafka partition 9 is not one of the events topic's")
			if f.Coverage == nil {
				assert.Equal(t, 4, rep.UnsealedEvents, "its own record's two, the one retention removed and the one not read")
				assert.Contains(t, progress.String(), "1 unsealed copies claim Kafka records that retention removed")
			} else {
				assert.Contains(t, problemOf(t, rep, "forged-00004").Reason, "lies below the coverage")
				assert.Equal(t, 3, rep.UnsealedEvents, "its own record's two and the one not read")
			}
			assert.Contains(t, progress.String(), "1 unsealed copies' Kafka records were not read")
		})
	}

	// At most MaxRecords records are read, the lowest offsets of each partition in
	// turn (here 1/1100 and 2/3); the rows beyond are checked against the partition's
	// end only.
	var progress strings.Builder
	capped := &fakeTopic{first: 1000, end: 2000, values: topic.values}
	rep := tr.verify(Filter{Records: capped.records, MaxRecords: 2, Progress: &progress})
	assert.Equal(t, []string{"unexpected forged-00000", "unexpected forged-00002", "unexpected forged-00006"}, kinds(rep))
	assert.Equal(t, map[int32][]int64{1: {1100}, 2: {3}, 3: nil, 9: nil}, capped.asked)
	assert.Equal(t, 6, rep.UnsealedEvents)
	assert.Contains(t, progress.String(), "5 unsealed copies' Kafka records were not read (at most 2 records are")
}

// The coverage note of another ingest group (say, a second deployment's on the same
// topic) says nothing of this one's rows.
func TestIntegrationVerifyIgnoresTheCoverageOfAnotherGroup(t *testing.T) {
	tr, _ := sealedTrail(t)
	now := time.Now().UTC()
	forged := rows("forged", 1, []string{"org-a"}, now.Add(-time.Hour), now)
	forged[0].Partition, forged[0].Offset = 0, 12
	insert(t, tr.conn, tr.db, forged)
	cov, err := tr.s.signer.SignCoverage("events", "other-ingest", map[int]int64{0: 1000}, now)
	require.NoError(t, err)
	records := fakeRecords(0, 2000, map[[2]int64][]byte{{0, 12}: eventJSON(t, forged[0])})
	var progress strings.Builder
	rep := tr.verify(Filter{Coverage: cov, EventsTopic: "events", IngestGroup: "ingest", Records: records, Progress: &progress})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 1, rep.UnsealedEvents)
	assert.Contains(t, progress.String(), "ignoring the coverage note of ingest group other-ingest (this deployment's ingest group is ingest)")
	// Of this group, the row is below it.
	rep = tr.verify(Filter{Coverage: cov, EventsTopic: "events", IngestGroup: "other-ingest", Records: records})
	assert.Equal(t, []string{"unexpected forged-00000"}, kinds(rep))
}

// With a coverage note, a row no leaf covers is not judged by its ingested_at being
// long before the newest checkpoint (ingest stores a row with its first insert
// attempt's ingested_at, and an outage may keep it from view long after), but by its
// Kafka record; a row stamped in the future still is unexpected.
func TestIntegrationVerifyDropsTheOverdueRuleWithTheCoverage(t *testing.T) {
	tr, _ := sealedTrail(t)
	now := time.Now().UTC()
	late := rows("late", 2, []string{"org-a"}, now.Add(-time.Hour), now.Add(-3*time.Hour))
	late[0].Partition, late[0].Offset = 0, 1500
	late[1].Partition, late[1].Offset = 1, 1600
	future := rows("future", 1, []string{"org-b"}, now.Add(-time.Hour), now.Add(time.Hour))
	future[0].Partition, future[0].Offset = 2, 1700
	insert(t, tr.conn, tr.db, append(late, future...))
	values := map[[2]int64][]byte{{0, 1500}: eventJSON(t, late[0]), {1, 1600}: eventJSON(t, late[1]), {2, 1700}: eventJSON(t, future[0])}
	records := fakeRecords(0, 2000, values)
	cov, err := tr.s.signer.SignCoverage("events", "ingest", map[int]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000}, now)
	require.NoError(t, err)

	// Without the coverage, the time rules as before: overdue and in the future.
	assert.Equal(t, []string{"unexpected future-00000", "unexpected late-00000", "unexpected late-00001"},
		kinds(tr.verify(Filter{Margin: testMargin, Records: records})))
	rep := tr.verify(Filter{Margin: testMargin, Coverage: cov, EventsTopic: "events", IngestGroup: "ingest", Records: records})
	assert.Equal(t, []string{"unexpected future-00000"}, kinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "is in the future")
	assert.Equal(t, 2, rep.UnsealedEvents, "the late rows' records are theirs")

	// One of them claims a record that is not its event: the record decides.
	delete(values, [2]int64{1, 1600})
	rep = tr.verify(Filter{Margin: testMargin, Coverage: cov, EventsTopic: "events", IngestGroup: "ingest", Records: records})
	assert.Equal(t, []string{"unexpected future-00000", "unexpected late-00001"}, kinds(rep))
}

// The same against a real events topic, read by KafkaRecords: a few events and a
// record that is not one, and rows written by hand that claim them.
func TestIntegrationVerifyReadsTheClaimedRecordsFromKafka(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	topic := stacktest.Topic(t, 1)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	now := time.Now().UTC()
	evs := workload("w", 3, now.Add(-2*time.Hour).Truncate(time.Millisecond)) // offsets 0-4
	require.NoError(t, p.Produce(ctx, evs))
	require.NoError(t, p.ProduceMessages(ctx, []kafkago.Message{{Key: []byte("x"), Value: []byte(`{"not":"an event"}`)}})) // offset 5

	forged := rows("forged", 4, []string{"org-a"}, now.Add(-time.Hour), now)
	forged[0].Offset = 2  // (a) w-msg-0's record
	forged[1].Offset = 5  // (b) not an event
	forged[2].Offset = 50 // (c) past the end
	// (d) w-msg-1 itself, at its own record, attributed to org-1 by ingest (its
	// record has no organization).
	forged[3].ID, forged[3].Time, forged[3].Offset = evs[3].ID, evs[3].Time, 3
	for i := range forged {
		forged[i].Partition = 0
	}
	insert(t, tr.conn, tr.db, forged)
	cov, err := tr.s.signer.SignCoverage(topic, "ingest", map[int]int64{0: 1}, now)
	require.NoError(t, err)

	var progress strings.Builder
	rep := tr.verify(Filter{Coverage: cov, EventsTopic: topic, IngestGroup: "ingest", Progress: &progress,
		Records: KafkaRecords(stacktest.Brokers(), topic, 0)})
	assert.Equal(t, []string{"unexpected forged-00000", "unexpected forged-00001", "unexpected forged-00002"}, kinds(rep))
	assert.Contains(t, problemOf(t, rep, "forged-00000").Reason, "(partition 0, offset 2) is event w-msg-0 at "+evs[2].Time.Format(time.RFC3339Nano))
	assert.Contains(t, problemOf(t, rep, "forged-00001").Reason, "(partition 0, offset 5) holds 18 bytes that are not an event")
	assert.Contains(t, problemOf(t, rep, "forged-00002").Reason, "(partition 0, offset 50) is past the end of the events topic (6)")
	assert.Equal(t, 1, rep.UnsealedEvents, "w-msg-1 at its own record stays unsealed")
	assert.Contains(t, progress.String(), "read the Kafka records of 3 unsealed copies; 3 rows unexpected by the events topic")

	// A partition the topic does not have.
	tr.exec("events", "UPDATE kafka_partition = 3 WHERE id = '"+evs[3].ID+"'")
	rep = tr.verify(Filter{EventsTopic: topic, Records: KafkaRecords(stacktest.Brokers(), topic, 0)})
	assert.Contains(t, problemOf(t, rep, evs[3].ID).Reason, "its Kafka partition 3 is not one of the events topic's")
}
