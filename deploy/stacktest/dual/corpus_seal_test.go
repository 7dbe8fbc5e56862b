package dual_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// collector is a keys.Producer that keeps the events it is given.
type collector struct {
	mu     sync.Mutex
	events []schema.Event
}

func (c *collector) Produce(_ context.Context, evs []schema.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, evs...)
	return nil
}

func (c *collector) take() []schema.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.events
	c.events = nil
	return out
}

// notes stands in for the stored-events topic: the corpus compares SQL, the pipeline
// tests run the topic itself.
type notes struct {
	queue   []kafkago.Message
	drained int
}

func (n *notes) add(rows []store.EventRow) {
	byOrg := map[string][]tlog.Leaf{}
	var orgs []string
	for i := range rows {
		if _, ok := byOrg[rows[i].OrgID]; !ok {
			orgs = append(orgs, rows[i].OrgID)
		}
		byOrg[rows[i].OrgID] = append(byOrg[rows[i].OrgID], tlog.LeafOf(&rows[i]))
	}
	for _, org := range orgs {
		for _, b := range tlog.EncodeNotes(byOrg[org]) {
			n.queue = append(n.queue, kafkago.Message{Key: []byte(org), Value: b})
		}
	}
}

// Drain continues where the last one stopped; Commit drops what was drained, Rewind
// returns it again.
func (n *notes) Drain(_ context.Context, max int) ([]kafkago.Message, bool, error) {
	k := min(max, len(n.queue)-n.drained)
	out := slices.Clone(n.queue[n.drained : n.drained+k])
	n.drained += k
	return out, n.drained < len(n.queue), nil
}

func (n *notes) Commit(context.Context) error {
	n.queue = n.queue[n.drained:]
	n.drained = 0
	return nil
}
func (n *notes) Rewind()           { n.drained = 0 }
func (n *notes) Holds() bool       { return true }
func (n *notes) Generation() int64 { return 1 }

// topic stands in for the checkpoints topic; frozen keeps what it held at a moment.
type topic struct{ latest map[string][]byte }

func (p *topic) ProduceMessages(_ context.Context, msgs []kafkago.Message) error {
	for _, m := range msgs {
		p.latest[string(m.Key)] = m.Value
	}
	return nil
}

func (p *topic) snapshot() map[string][]byte {
	out := map[string][]byte{}
	for k, v := range p.latest {
		out[k] = v
	}
	return out
}

// sealRows are n message rows of org, one every 90 s from at, ingested at ingested.
func sealRows(prefix, org string, n int, at, ingested time.Time) []store.EventRow {
	out := make([]store.EventRow, n)
	for i := range out {
		out[i] = store.EventRow{
			ID: fmt.Sprintf("%s-%04d", prefix, i), Type: schema.TypeMessageCreated,
			Time:  at.Add(time.Duration(i)*90*time.Second + time.Duration(i%1000)*time.Millisecond).UTC(),
			OrgID: org, RoomID: fmt.Sprintf("room-%d", i%3), ActorID: fmt.Sprintf("agent-%d", i%4), ActorType: "agent",
			OwnerID: "user-1", Source: "band", SchemaVersion: 1, Data: fmt.Sprintf(`{"content":"message %d"}`, i),
			IngestedAt: ingested.UTC().Truncate(time.Second), Offset: int64(i),
		}
	}
	return out
}

func problemsOf(rep trail.Report) []string {
	out := make([]string, 0, len(rep.Problems))
	for _, p := range rep.Problems {
		out = append(out, p.Kind+" "+p.ID)
	}
	slices.Sort(out)
	return out
}

// exportAll prepares and streams one export whole.
func exportAll(t *testing.T, x *trail.Exporter, req trail.ExportRequest) ([]byte, trail.ExportStats) {
	t.Helper()
	ctx := context.Background()
	e, err := x.Prepare(ctx, req)
	require.NoError(t, err)
	var buf bytes.Buffer
	st, err := e.Stream(ctx, &buf, nil)
	require.NoError(t, err)
	return buf.Bytes(), st
}

func verifyExport(t *testing.T, b []byte, pub ed25519.PublicKey) trail.ExportReport {
	t.Helper()
	rep, err := trail.VerifyExport(context.Background(), bytes.NewReader(b), int64(len(b)), trail.ExportVerifyOptions{Anchors: []ed25519.PublicKey{pub}})
	require.NoError(t, err)
	return rep
}

// storedRows are every stored copy of every row of db, as ingest noted them (each
// insert's): read past the Recorder (the test's query, not bandplane's).
func storedRows(t *testing.T, rec *dual.Recorder) []store.EventRow {
	t.Helper()
	rows, err := rec.Conn.Query(context.Background(), "SELECT id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle, owner_id, "+
		"subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at, kafka_partition, kafka_offset FROM "+rec.DB()+".events")
	require.NoError(t, err)
	defer rows.Close()
	var out []store.EventRow
	for rows.Next() {
		var r store.EventRow
		var ms uint16
		require.NoError(t, rows.Scan(&r.ID, &r.Type, &r.Time, &ms, &r.OrgID, &r.RoomID, &r.ActorID, &r.ActorType, &r.ActorHandle, &r.OwnerID,
			&r.SubjectID, &r.SubjectType, &r.SubjectHandle, &r.ExecutionID, &r.Source, &r.SchemaVersion, &r.Data, &r.IngestedAt, &r.Partition, &r.Offset))
		r.Time = r.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		r.IngestedAt = r.IngestedAt.UTC()
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// The audit log on simulated traffic plus rows of an organization of the test's own
// (some of them 3 and 20 days old): sealing in small checkpoints, notes that come
// again, a retried insert, a key rotation record, a fresh sealer that loads and checks
// the stored logs against an older topic, verify (whole, filtered, with an edited
// row), the log's proofs, compliance exports (verified offline, resumed after a
// cursor), the policy replica's check of rows, and retention (a dry run, an unsigned
// drop whose sealed events verify reports missing, a signed one under which they are
// expired), on 18.16 and on 26.9.
func TestIntegrationCorpusSealVerifyExportRetention(t *testing.T) {
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	ctx := context.Background()
	start := time.Now()
	sum := loadSimulated(t, rec, 1500)
	loaded := time.Now()

	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pub := key.Public().(ed25519.PublicKey)
	st := store.New(rec, db)
	prefix := tlog.DefaultPrefix(db)

	// Rows of org-seal: 40 of today, 10 of 3 days ago and 10 of 20 days ago, ingested a
	// minute ago; and one stored again by a retried insert (another ingested_at).
	const org = "org-seal"
	now := time.Now().UTC()
	recent := sealRows("recent", org, 40, now.Add(-90*time.Minute), now.Add(-time.Minute))
	day3 := sealRows("day3", org, 10, now.Add(-72*time.Hour).Truncate(24*time.Hour).Add(6*time.Hour), now.Add(-time.Minute))
	day20 := sealRows("day20", org, 10, now.Add(-20*24*time.Hour).Truncate(24*time.Hour).Add(6*time.Hour), now.Add(-time.Minute))
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: append(append(append([]store.EventRow{}, recent...), day3...), day20...)}))
	retried := recent[3]
	retried.IngestedAt = retried.IngestedAt.Add(5 * time.Second)
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{retried}}))
	ownRows := len(recent) + len(day3) + len(day20)

	q := &notes{}
	q.add(storedRows(t, rec))
	tp := &topic{latest: map[string][]byte{}}
	newSealer := func(published map[string][]byte) *trail.Sealer {
		t.Helper()
		s, err := trail.New(trail.Config{Conn: rec, Database: db, Key: key, Notes: q, Publisher: tp, MaxLeaves: 500,
			Published: func(context.Context) (map[string][]byte, error) { return published, nil }})
		require.NoError(t, err)
		return s
	}
	sealer := newSealer(map[string][]byte{})
	res, err := sealer.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, sum.Events+ownRows+1, res.Leaves, "a leaf per stored copy")
	assert.Greater(t, res.Checkpoints, res.Orgs, "MaxLeaves splits the large logs")
	firstTopic := tp.snapshot()

	// Notes that come again (a redelivery) add nothing; a rotation record (taking effect
	// in a day) is read into every run's key ring.
	q.add(recent[:10])
	_, nextKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	rotation, err := tlog.Rotation(prefix, key, nextKey, now.Add(24*time.Hour))
	require.NoError(t, err)
	lg, err := trail.NewLog(rec, db, prefix, []ed25519.PublicKey{pub})
	require.NoError(t, err)
	require.NoError(t, lg.Rotate(ctx, rotation))
	res, err = sealer.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, res.Leaves)
	assert.Equal(t, 10, res.Duplicates)

	// More rows after the first run, sealed by a fresh sealer: it loads every log from
	// ClickHouse and checks it against the topic's older checkpoints (a consistency
	// proof each).
	later := sealRows("later", org, 5, now.Add(-10*time.Minute), now.Add(-30*time.Second))
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: later}))
	q.add(later)
	res, err = newSealer(firstTopic).SealNow(ctx)
	require.NoError(t, err)
	assert.Empty(t, res.Refused)
	assert.Equal(t, len(later), res.Leaves)

	rep, err := trail.Verify(ctx, rec, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", problemsOf(rep))
	assert.Equal(t, sum.Events+ownRows+len(later), rep.SealedEvents)
	assert.Zero(t, rep.UnsealedEvents)
	rep, err = trail.Verify(ctx, rec, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{Orgs: []string{org}, From: now.Add(-2 * time.Hour), To: now.Add(time.Minute)})
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", problemsOf(rep))
	assert.Equal(t, len(recent)+len(later), rep.SealedEvents)
	_, err = trail.Verify(ctx, rec, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{Orgs: []string{"org-nobody"}})
	assert.ErrorContains(t, err, `organization "org-nobody" has no log`)

	// The log's proofs and the policy replica's check of rows.
	ring, err := lg.Ring(ctx)
	require.NoError(t, err)
	head, err := lg.Newest(ctx, ring, org)
	require.NoError(t, err)
	first, err := lg.AtSize(ctx, ring, org, 500)
	if err != nil { // org-seal's log may be smaller than a checkpoint of 500
		first, err = ring.Open(firstTopic[org])
		require.NoError(t, err)
	}
	pr, err := lg.Consistency(ctx, org, first.Size, &head)
	require.NoError(t, err)
	assert.NoError(t, tlog.VerifyConsistency(first.Size, head.Size, pr, first.Root, head.Root))
	lps, err := lg.Inclusion(ctx, org, recent[5].Time, recent[5].ID, &head)
	require.NoError(t, err)
	require.Len(t, lps, 1)
	sealed, err := lg.Sealed(ctx, nil, append([]store.EventRow{recent[6], retried}, store.EventRow{ID: "forged", OrgID: org, Time: now}))
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false}, sealed)

	// The export of the simulated organization with the most events, in small windows,
	// verified offline, and resumed after its 25th event.
	sel := trail.Selection{From: now.Add(-3 * time.Hour), To: now.Add(time.Minute)}
	var simCount uint64
	require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT org_id, count() AS n FROM "+db+".events FINAL WHERE org_id != ? AND time >= ? AND time < ? GROUP BY org_id ORDER BY n DESC, org_id LIMIT 1",
		org, sel.From, sel.To).Scan(&sel.Org, &simCount))
	x, err := trail.NewExporter(trail.ExportConfig{Conn: rec, Database: db, Key: key, WindowRows: 100, IndexChunk: 300})
	require.NoError(t, err)
	full, xs := exportAll(t, x, trail.ExportRequest{Selection: sel, Encoding: trail.EncodingNDJSON})
	assert.Equal(t, simCount, xs.Total, "every event of %s", sel.Org)
	xrep := verifyExport(t, full, pub)
	require.True(t, xrep.OK(), "%+v", xrep.Problems)

	sc := trail.NewExportScanner(trail.EncodingNDJSON)
	cut := 0
	for _, line := range bytes.SplitAfter(full, []byte("\n")) {
		_, _ = sc.Write(line)
		cut += len(line)
		if sc.Events == 25 {
			break
		}
	}
	require.EqualValues(t, 25, sc.Events)
	h, err := trail.ParseExportHeader(trail.EncodingNDJSON, sc.Header)
	require.NoError(t, err)
	last, err := trail.ExportEventKey(trail.EncodingNDJSON, sc.LastEvent)
	require.NoError(t, err)
	c, err := trail.NewCursor(&h, 25, last.Time, last.ID)
	require.NoError(t, err)
	resume, err := h.Request(&c)
	require.NoError(t, err)
	rest, _ := exportAll(t, x, resume)
	assert.True(t, bytes.Equal(full, append(bytes.Clone(full[:cut]), rest...)), "the resumed export continues the file")

	// A row edited in ClickHouse: a copy of the same key with other content: modified.
	edited := recent[7]
	edited.Data = `{"content":"not what was said"}`
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{edited}}))
	rep, err = trail.Verify(ctx, rec, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
	require.NoError(t, err)
	assert.Equal(t, []string{"modified " + edited.ID}, problemsOf(rep))

	// Retention: a dry run lists the two old days of org-seal (and changes nothing), a
	// run without the key drops the older one, whose sealed events are then missing.
	dayOf := func(t time.Time) string { return t.UTC().Format("20060102") }
	keep := chdb.Retention{Events: 2 * 24 * time.Hour}
	sign := trail.CutSigner(key, db, prefix)
	dry, err := chdb.ApplyRetention(ctx, rec, chdb.Config{Database: db}, keep, time.Now(), chdb.RetentionOptions{DryRun: true, Sign: sign})
	require.NoError(t, err)
	var parts []string
	for _, d := range dry.Dropped {
		if d.Table == "events" {
			parts = append(parts, d.Partition)
		}
	}
	assert.Equal(t, []string{dayOf(day20[0].Time), dayOf(day3[0].Time)}, parts)
	require.NotEmpty(t, dry.Cuts)
	assert.NotEmpty(t, dry.Cuts[0].Signature)
	inParts, err := trail.SealedIn(ctx, rec, db, parts)
	require.NoError(t, err)
	assert.EqualValues(t, len(day3)+len(day20), inParts)
	cuts, err := chdb.RetentionCuts(ctx, rec, db, "events")
	require.NoError(t, err)
	assert.Empty(t, cuts, "a dry run records no cut")

	unsigned, err := chdb.ApplyRetention(ctx, rec, chdb.Config{Database: db}, chdb.Retention{Events: 10 * 24 * time.Hour}, time.Now(), chdb.RetentionOptions{})
	require.NoError(t, err)
	assert.Equal(t, []chdb.Dropped{{Table: "events", Partition: dayOf(day20[0].Time)}}, unsigned.Dropped)
	rep, err = trail.Verify(ctx, rec, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
	require.NoError(t, err)
	var missing int
	for _, p := range rep.Problems {
		if p.Kind == trail.KindMissing {
			missing++
			assert.True(t, strings.HasPrefix(p.ID, "day20-"), "%+v", p)
			assert.Contains(t, p.Reason, "unsigned")
		}
	}
	assert.Equal(t, len(day20), missing)
	assert.Zero(t, rep.ExpiredEvents)

	// A signed run drops the other old day: under its cut every dropped sealed event is
	// expired; the edited row is still modified.
	signed, err := chdb.ApplyRetention(ctx, rec, chdb.Config{Database: db}, keep, time.Now().Add(2*time.Second), chdb.RetentionOptions{Sign: sign})
	require.NoError(t, err)
	assert.Equal(t, []chdb.Dropped{{Table: "events", Partition: dayOf(day3[0].Time)}}, signed.Dropped)
	rep, err = trail.Verify(ctx, rec, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
	require.NoError(t, err)
	assert.Equal(t, []string{"modified " + edited.ID}, problemsOf(rep))
	assert.Equal(t, len(day3)+len(day20), rep.ExpiredEvents)

	// The export of org-seal over the three weeks: the dropped events are expired gaps.
	ownSel := trail.Selection{Org: org, From: now.Add(-21 * 24 * time.Hour), To: now.Add(time.Minute)}
	b, xs := exportAll(t, x, trail.ExportRequest{Selection: ownSel, Encoding: trail.EncodingCSV})
	assert.EqualValues(t, len(recent)+len(later), xs.Total)
	xrep = verifyExport(t, b, pub)
	assert.True(t, xrep.OK(), "%+v", xrep.Problems)
	assert.EqualValues(t, len(day3)+len(day20), xrep.Expired)

	ran := time.Now()
	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps; load %s, seal/verify/export/retention %s, replay %s", len(steps),
		loaded.Sub(start).Round(time.Millisecond), ran.Sub(loaded).Round(time.Millisecond), time.Since(ran).Round(time.Millisecond))
	// The replay left the trail as the test did, on both engines.
	replayed(t, rec, other, "log_leaves", "log_index", "log_tree", "checkpoints", "key_rotations", "retention_cuts", "events")
}

// replayed checks that the replay database holds as many rows of each table on the
// 18.16 server and on other as the recorded database.
func replayed(t *testing.T, rec *dual.Recorder, other dual.Engine, tables ...string) {
	t.Helper()
	ctx := context.Background()
	srv := dual.Server(t)
	for _, table := range tables {
		// The replay keeps every part (no merges), the recorded database may have
		// merged replaced rows away: compare the rows that count, FINAL.
		final := " FINAL"
		if table == "retention_cuts" { // a plain MergeTree
			final = ""
		}
		var want uint64
		require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT count() FROM "+rec.DB()+"."+table+final).Scan(&want))
		require.NotZero(t, want, table)
		for _, e := range []dual.Engine{srv, other} {
			r, err := e.Query(ctx, "SELECT count() FROM "+rec.ReplayDB()+"."+table+final)
			require.NoError(t, err, e.Name())
			assert.Equal(t, fmt.Sprint(want), r.Rows[0][0], "%s: rows of %s after the replay", e.Name(), table)
		}
	}
}

// The API key store: create an organization's key and a platform key, list them, look
// their tokens up through the cache, revoke one (again: no new event; an unknown id:
// not found), on 18.16 and on 26.9.
func TestIntegrationCorpusKeys(t *testing.T) {
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	ctx := context.Background()
	start := time.Now()
	events := &collector{}
	ks := keys.NewStore(rec, db, events)

	orgKey, orgToken, err := ks.Create(ctx, "org-a", keys.RoleCompliance, "audit desk", "alice")
	require.NoError(t, err)
	platKey, platToken, err := ks.Create(ctx, keys.PlatformOrg, keys.RoleRouter, "routing core", "ops")
	require.NoError(t, err)
	created := events.take()
	require.Len(t, created, 2, "a key.created event each")
	assert.Equal(t, schema.TypeKeyCreated, created[0].Type)

	list, err := ks.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	ids := map[string]bool{list[0].ID: true, list[1].ID: true}
	assert.True(t, ids[orgKey.ID] && ids[platKey.ID], "%+v", list)

	cache, err := keys.NewCache(keys.CacheConfig{Store: ks})
	require.NoError(t, err)
	require.NoError(t, cache.Load(ctx))
	k, ok := cache.Lookup(ctx, orgToken)
	require.True(t, ok)
	assert.Equal(t, orgKey.ID, k.ID)
	assert.Equal(t, "org-a", k.Org)
	k, ok = cache.Lookup(ctx, platToken)
	require.True(t, ok)
	assert.True(t, k.Platform())
	// A key created after the cache loaded: an unknown token reads the store early.
	lateKey, lateToken, err := ks.Create(ctx, "org-b", keys.RoleViewer, "late", "alice")
	require.NoError(t, err)
	k, ok = cache.Lookup(ctx, lateToken)
	require.True(t, ok)
	assert.Equal(t, lateKey.ID, k.ID)
	assert.Len(t, events.take(), 1)

	revoked, err := ks.Revoke(ctx, orgKey.ID, "bob")
	require.NoError(t, err)
	assert.False(t, revoked.Active())
	assert.Equal(t, "bob", revoked.RevokedBy)
	revokedEvs := events.take()
	require.Len(t, revokedEvs, 1, "a key.revoked event")
	assert.Equal(t, schema.TypeKeyRevoked, revokedEvs[0].Type)
	again, err := ks.Revoke(ctx, orgKey.ID, "carol")
	require.NoError(t, err)
	assert.Equal(t, "bob", again.RevokedBy, "already revoked: returned as it is")
	assert.Empty(t, events.take())
	_, err = ks.Revoke(ctx, "no-such-key", "bob")
	assert.ErrorIs(t, err, schema.ErrNotFound)

	require.NoError(t, cache.Load(ctx))
	_, ok = cache.Lookup(ctx, orgToken)
	assert.False(t, ok, "a revoked key does not authenticate")
	_, ok = cache.Lookup(ctx, platToken)
	assert.True(t, ok)
	list, err = ks.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3, "revoked keys are listed")
	for _, k := range list {
		assert.Equal(t, k.ID != orgKey.ID, k.Active(), "%+v", k)
	}

	ran := time.Now()
	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps; keys %s, replay %s", len(steps), ran.Sub(start).Round(time.Millisecond), time.Since(ran).Round(time.Millisecond))
	replayed(t, rec, other, "api_keys")
}
