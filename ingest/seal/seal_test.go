package seal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
)

var orgs3 = []string{"org-a", "org-b", ""}

// sealed is a database holding 30 events of three organizations (org "" among them),
// all sealed.
func sealed(t *testing.T) (*fakeProducer, Report, func() Report, func(string, string)) {
	t.Helper()
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 30, orgs3, now.Add(-2*time.Hour), now.Add(-time.Minute)))
	p := &fakeProducer{}
	res, err := newSealer(t, conn, db, key, p).SealNow(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Seals)
	require.Equal(t, 30, res.Events)
	rep := verify(t, conn, db, pubOf(key), Filter{})
	again := func() Report { return verify(t, conn, db, pubOf(key), Filter{}) }
	exec := func(table, stmt string) { mutate(t, conn, db, table, stmt) }
	return p, rep, again, exec
}

func TestIntegrationSealThenVerify(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 30, orgs3, now.Add(-2*time.Hour), now.Add(-time.Minute)))
	// Ingested a moment ago: left for the next run (settle).
	insert(t, conn, db, rows("fresh", 4, orgs3, now.Add(-time.Hour), now.Add(time.Second)))

	p := &fakeProducer{}
	s := newSealer(t, conn, db, key, p)
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, Result{Seals: 3, Events: 30, Orgs: 3, Through: res.Through, Emitted: 3}, res)
	// Every row ingested before through is sealed: the 30 rows, not the 4 fresh ones.
	assert.True(t, res.Through.After(now.Add(-time.Minute)), res.Through)
	assert.False(t, res.Through.After(now.Add(time.Second)), res.Through)

	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.Seals)
	assert.Equal(t, 30, rep.SealedEvents)
	assert.Equal(t, 4, rep.UnsealedEvents)

	// The announcements: one per seal, valid canonical events of bandplane's own.
	evs := p.all()
	require.Len(t, evs, 3)
	byOrg := map[string]SealData{}
	for _, ev := range evs {
		require.NoError(t, ev.Validate())
		assert.Equal(t, schema.TypeAuditSealed, ev.Type)
		assert.True(t, schema.OwnType(ev.Type) && schema.OwnSource(ev.Source))
		var d SealData
		require.NoError(t, json.Unmarshal(ev.Data, &d))
		assert.Equal(t, EventID(d.Hash), ev.ID)
		assert.Equal(t, uint64(1), d.Seq)
		assert.Equal(t, uint64(10), d.Events)
		assert.Equal(t, KeyID(pubOf(key)), d.KeyID)
		byOrg[ev.OrgID] = d
	}
	assert.Len(t, byOrg, 3)

	// Nothing new: nothing sealed. Then the fresh rows settle and are sealed, chained.
	time.Sleep(3100 * time.Millisecond) // stamped now+1 s, settle 1 s
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Seals)
	assert.Equal(t, 4, res.Events)
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Seals)

	seals, err := loadSeals(ctx, conn, db, []string{"org-a"})
	require.NoError(t, err)
	require.Len(t, seals, 2)
	assert.Equal(t, uint64(2), seals[1].Seq)
	assert.Equal(t, seals[0].Hash, seals[1].Prev)
	assert.Equal(t, byOrg["org-a"].Hash, seals[0].Hash)

	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, Report{Seals: 6, SealedEvents: 34, Problems: []Problem{}}, rep)

	// One chain, and a time range.
	rep = verify(t, conn, db, pubOf(key), Filter{Orgs: []string{""}})
	assert.Equal(t, Report{Seals: 2, SealedEvents: 11, Problems: []Problem{}}, rep)
	rep = verify(t, conn, db, pubOf(key), Filter{From: now.Add(-2 * time.Hour), To: now.Add(-2*time.Hour + 15*time.Second)})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 10, rep.SealedEvents, "events 0..9 are 1.5 s apart")
	assert.Equal(t, 3, rep.Seals, "only the first seals overlap that range")
}

func TestIntegrationSealTamperUpdate(t *testing.T) {
	_, rep, again, exec := sealed(t)
	require.Empty(t, rep.Problems)
	exec("events", "UPDATE data = '{}' WHERE id = 'ev-00004'")
	rep = again()
	require.Len(t, rep.Problems, 1, rep.Problems)
	p := rep.Problems[0]
	assert.Equal(t, Problem{ID: "ev-00004", Kind: KindModified, Seal: "seal:org-b:1", Org: "org-b", Reason: p.Reason}, p)
	assert.Equal(t, 30, rep.SealedEvents)

	exec("events", "UPDATE owner_id = 'someone-else' WHERE id = 'ev-00005'") // the attribution is sealed too
	assert.Equal(t, []string{"modified ev-00004", "modified ev-00005"}, kinds(again()))
}

func TestIntegrationSealTamperDelete(t *testing.T) {
	_, _, again, exec := sealed(t)
	exec("events", "DELETE WHERE id = 'ev-00007'")
	rep := again()
	require.Len(t, rep.Problems, 1, rep.Problems)
	assert.Equal(t, Problem{ID: "ev-00007", Kind: KindMissing, Seal: "seal:org-b:1", Org: "org-b", Reason: rep.Problems[0].Reason}, rep.Problems[0])
	assert.Equal(t, 29, rep.SealedEvents)
}

func TestIntegrationSealTamperInsert(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 30, orgs3, now.Add(-2*time.Hour), now.Add(-time.Minute)))
	_, err := newSealer(t, conn, db, key, &fakeProducer{}).SealNow(context.Background())
	require.NoError(t, err)

	// A plausible row: ingested an hour ago, long before the trail was sealed.
	old := rows("forged-old", 1, []string{"org-a"}, now.Add(-90*time.Minute), now.Add(-time.Hour))
	// A row claiming to be ingested tomorrow.
	future := rows("forged-future", 1, []string{"org-b"}, now.Add(-90*time.Minute), now.Add(24*time.Hour))
	// A row inserted just now: not sealed yet, which is no problem (yet).
	recent := rows("recent", 1, []string{"org-a"}, now.Add(-90*time.Minute), now)
	// By hand, as an attacker would: only some columns, the rest defaults.
	b, err := conn.PrepareBatch(context.Background(), "INSERT INTO "+db+".events (id, type, time, org_id, actor_id, source, schema_version, data, ingested_at)")
	require.NoError(t, err)
	for _, r := range append(append(old, future...), recent...) {
		require.NoError(t, b.Append(r.ID, r.Type, r.Time, r.OrgID, "x", "band", uint16(1), "{}", r.IngestedAt))
	}
	require.NoError(t, b.Send())
	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Equal(t, []string{"unexpected forged-future-00000", "unexpected forged-old-00000"}, kinds(rep))
	for _, p := range rep.Problems {
		assert.Empty(t, p.Seal)
	}
	assert.Equal(t, 1, rep.UnsealedEvents)
	assert.Equal(t, 30, rep.SealedEvents)
}

func TestIntegrationSealTamperSeals(t *testing.T) {
	t.Run("seal row altered", func(t *testing.T) {
		_, _, again, exec := sealed(t)
		exec("seals", "UPDATE events = 9 WHERE org_id = 'org-a'")
		rep := again()
		require.Len(t, rep.Problems, 1, rep.Problems)
		assert.Equal(t, "seal:org-a:1", rep.Problems[0].ID)
		assert.Equal(t, KindModified, rep.Problems[0].Kind)
		assert.Contains(t, rep.Problems[0].Reason, "do not match its hash")
	})
	t.Run("entry altered", func(t *testing.T) {
		_, _, again, exec := sealed(t)
		exec("seal_entries", "UPDATE digest = '"+fmt.Sprintf("%064d", 0)+"' WHERE id = 'ev-00003'")
		rep := again()
		assert.Equal(t, []string{"modified ev-00003", "modified seal:org-a:1"}, kinds(rep))
		assert.Contains(t, rep.Problems[1].Reason, "do not match its root")
	})
	t.Run("entry deleted", func(t *testing.T) {
		_, _, again, exec := sealed(t)
		exec("seal_entries", "DELETE WHERE id = 'ev-00003'")
		// The seal no longer matches its root. The event is in no seal now, but was
		// ingested within the margin before the watermark: not sealed yet, not unexpected.
		rep := again()
		assert.Equal(t, []string{"modified seal:org-a:1"}, kinds(rep))
		assert.Equal(t, 1, rep.UnsealedEvents)
	})
	t.Run("seal row deleted", func(t *testing.T) {
		p, _, again, exec := sealed(t)
		exec("seals", "DELETE WHERE org_id = 'org-b'")
		// Its announcement names it (the fake producer kept it; in production ingest
		// stores it in the events table, see the pipeline test). Here the entries are
		// left without a seal and nothing refers to them: the events read as unsealed.
		require.Len(t, p.all(), 3)
		rep := again()
		assert.Empty(t, rep.Problems)
		assert.Equal(t, 10, rep.UnsealedEvents)
	})
}

// A seal removed from the middle of a chain breaks the next one's link; one announced
// by an audit.sealed event in the trail is missed even at the chain's head.
func TestIntegrationSealTamperChain(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	p := &fakeProducer{}
	s := newSealer(t, conn, db, key, p)
	for i := range 3 { // three runs, each after the previous one's watermark
		insert(t, conn, db, rows(fmt.Sprintf("b%d", i), 4, []string{"org-a"}, now.Add(-time.Hour), time.Now().UTC().Add(-time.Second)))
		time.Sleep(1100 * time.Millisecond)
		res, err := s.SealNow(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, res.Seals, "run %d", i)
	}
	rep := verify(t, conn, db, pubOf(key), Filter{})
	require.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.Seals)

	mutate(t, conn, db, "seals", "DELETE WHERE seq = 2")
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Equal(t, []string{"missing seal:org-a:2"}, kinds(rep))

	// The head's announcement, stored as ingest stores it; then the head goes too.
	evs := p.all()
	require.Len(t, evs, 3)
	var d SealData
	require.NoError(t, json.Unmarshal(evs[2].Data, &d))
	require.Equal(t, uint64(3), d.Seq)
	insert(t, conn, db, []store.EventRow{eventRow(evs[2], time.Now().UTC().Add(-time.Minute))})
	mutate(t, conn, db, "seals", "DELETE WHERE seq = 3")
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Equal(t, []string{"missing seal:org-a:2", "missing seal:org-a:3"}, kinds(rep))
}

func TestIntegrationSealVerifyWrongKey(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 6, orgs3, now.Add(-time.Hour), now.Add(-time.Minute)))
	_, err := newSealer(t, conn, db, key, &fakeProducer{}).SealNow(context.Background())
	require.NoError(t, err)

	other := pubOf(testKey(t))
	var progress bytes.Buffer
	rep := verify(t, conn, db, other, Filter{Progress: &progress})
	assert.Equal(t, []string{"modified seal::1", "modified seal:org-a:1", "modified seal:org-b:1"}, kinds(rep))
	for _, p := range rep.Problems {
		assert.Contains(t, p.Reason, "signed with key "+KeyID(pubOf(key))+", not with the given key "+KeyID(other))
	}
	assert.Contains(t, progress.String(), "no seal verifies with the given key "+KeyID(other))

	// Hostile filters.
	_, err = Verify(context.Background(), conn, db, pubOf(key), Filter{Orgs: []string{"nobody"}})
	assert.ErrorContains(t, err, `organization "nobody" has no seals`)
	_, err = Verify(context.Background(), conn, db, pubOf(key), Filter{From: now, To: now.Add(-time.Hour)})
	assert.ErrorContains(t, err, "must be after --from")
	_, err = Verify(context.Background(), conn, db, nil, Filter{})
	assert.ErrorContains(t, err, "no Ed25519 public key")
}

// Many seals per run when a stretch holds more than MaxEntries rows.
func TestIntegrationSealBoundedSize(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	for i := range 5 { // five seconds of ingest, 20 rows each
		insert(t, conn, db, rows(fmt.Sprintf("s%d", i), 20, []string{"org-a", "org-b"}, now.Add(-time.Hour), now.Add(-time.Minute+time.Duration(i)*time.Second)))
	}
	res, err := newSealer(t, conn, db, key, &fakeProducer{}, func(c *Config) { c.MaxEntries = 7 }).SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 100, res.Events)
	seals, err := loadSeals(ctx, conn, db, nil)
	require.NoError(t, err)
	assert.Len(t, seals, res.Seals)
	for _, s := range seals {
		assert.LessOrEqual(t, s.Events, uint64(7))
	}
	// One second of ingest (20 rows) is more than 7: it was cut into seals of at most 7.
	assert.GreaterOrEqual(t, res.Seals, 16)
	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 100, rep.SealedEvents)
	assert.Zero(t, rep.UnsealedEvents)
}

// Rows that land after the seal that should have covered them (a slow insert, a
// replica behind): sealed by the next run that looks back the whole margin, and never
// reported meanwhile.
func TestIntegrationSealLateRows(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 10, orgs3, now.Add(-time.Hour), now.Add(-time.Minute)))
	s := newSealer(t, conn, db, key, &fakeProducer{})
	_, err := s.SealNow(ctx)
	require.NoError(t, err)
	// Stamped 4 minutes ago (within Margin/2), stored only now.
	insert(t, conn, db, rows("late", 3, orgs3, now.Add(-time.Hour), now.Add(-4*time.Minute)))
	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.UnsealedEvents)

	// A periodic run soon after looks back 2·Settle only.
	periodic := func(s *Sealer) Result {
		t.Helper()
		res, err := s.seal(ctx, s.cfg.Settle, false)
		require.NoError(t, err)
		return res
	}
	assert.Zero(t, periodic(s).Events)
	assert.Empty(t, verify(t, conn, db, pubOf(key), Filter{}).Problems)

	// Margin/2 later, a periodic run looks back the whole margin.
	s.lastFull = time.Now().Add(-DefaultMargin / 2)
	assert.Equal(t, 3, periodic(s).Events)
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 13, rep.SealedEvents)

	// The first run of a process looks back the whole margin too.
	insert(t, conn, db, rows("later", 2, orgs3, now.Add(-time.Hour), now.Add(-3*time.Minute)))
	assert.Equal(t, 2, periodic(newSealer(t, conn, db, key, &fakeProducer{})).Events)
	assert.Empty(t, verify(t, conn, db, pubOf(key), Filter{}).Problems)

	// An operator's SealNow always does: rows that landed late are sealed at once.
	insert(t, conn, db, rows("latest", 4, orgs3, now.Add(-time.Hour), now.Add(-2*time.Minute)))
	assert.Zero(t, periodic(s).Events, "a periodic run right after a full one does not look back")
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 4, res.Events)
	assert.Empty(t, verify(t, conn, db, pubOf(key), Filter{}).Problems)
}

// The same rows stored again, as ingest does when it retries a batch insert after one
// of its tables failed or bisects a batch after a refused record: same content, a newer
// ingested_at. Stored twice before the seal: one entry. Stored again after it: sealed
// again when the first seal is older than the lookback (two equal entries), or found
// among the recent entries. Never a problem, and counted once.
func TestIntegrationSealReplayedRows(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	entries := func(db string) uint64 {
		var n uint64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".seal_entries").Scan(&n))
		return n
	}
	// Ingested 20 minutes ago, before the margin the next run looks back.
	rs := rows("ev", 12, orgs3, now.Add(-time.Hour), now.Add(-20*time.Minute))
	insert(t, conn, db, rs)
	// Before the seal: a second copy of each row, stamped later (a retried insert).
	for i := range rs {
		rs[i].IngestedAt = now.Add(-19 * time.Minute)
	}
	insert(t, conn, db, rs)
	s := newSealer(t, conn, db, key, &fakeProducer{})
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 12, res.Events, "two copies of a row are one entry")
	assert.Equal(t, uint64(12), entries(db))
	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 12, rep.SealedEvents)

	// Stored again after the seal, long after the first copies (a retry after a long
	// back-off): the seal is older than the recent entries the run looks up, so the
	// rows are sealed again (stamped more than 2 s after the seal, see sealedKeys).
	time.Sleep(4200 * time.Millisecond)
	for i := range rs {
		rs[i].IngestedAt = time.Now().UTC().Add(-time.Second)
		rs[i].Offset += 1000
	}
	insert(t, conn, db, rs)
	time.Sleep(1100 * time.Millisecond)
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	// Sealed again (two equal entries each) or, when the machine is slow and the seal
	// still counts as recent, found among the recent entries: either way no alarm.
	switch res.Events {
	case 12:
		assert.Equal(t, uint64(24), entries(db), "each row has two equal entries now")
	case 0:
		assert.Equal(t, uint64(12), entries(db))
	default:
		t.Errorf("sealed %d of the 12 copies", res.Events)
	}
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 12, rep.SealedEvents, "counted once")
	assert.Zero(t, rep.UnsealedEvents)
	var copies uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".events").Scan(&copies))
	t.Logf("%d stored copies of 12 rows (some may have merged)", copies)

	// Stored again right after its seal: found among the recent entries, not resealed.
	conn, db = testDB(t)
	rs = rows("ev", 12, orgs3, now.Add(-time.Hour), time.Now().UTC().Add(-3*time.Second))
	insert(t, conn, db, rs)
	s = newSealer(t, conn, db, key, &fakeProducer{})
	_, err = s.SealNow(ctx)
	require.NoError(t, err)
	for i := range rs {
		rs[i].IngestedAt = time.Now().UTC().Add(-time.Second)
	}
	insert(t, conn, db, rs)
	time.Sleep(1100 * time.Millisecond)
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Events, "already sealed")
	assert.Equal(t, uint64(12), entries(db))
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 12, rep.SealedEvents)
}

// A sealer that stopped between writing its entries and its seal leaves entries that
// nothing refers to: ignored, and the events are sealed again.
func TestIntegrationSealCrashBetweenEntriesAndSeal(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 6, []string{"org-a"}, now.Add(-time.Hour), now.Add(-time.Minute)))
	orphan := &Seal{OrgID: "org-a", Seq: 1, SealedAt: now, Through: now, Events: 6, Hash: "0123abcd"}
	var es []Entry
	for _, r := range rows("ev", 6, []string{"org-a"}, now.Add(-time.Hour), now.Add(-time.Minute)) {
		es = append(es, Entry{Time: r.Time, ID: r.ID, Digest: r.SealDigest()})
	}
	orphan.Root = Root(es)
	require.NoError(t, writeEntries(ctx, conn, db, orphan, es))

	res, err := newSealer(t, conn, db, key, &fakeProducer{}).SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 6, res.Events)
	var progress bytes.Buffer
	rep := verify(t, conn, db, pubOf(key), Filter{Progress: &progress})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 6, rep.SealedEvents)
	assert.Contains(t, progress.String(), "6 entries belong to no stored seal")
}

// Kafka down: the seals are stored, SealNow says the announcements failed, and the next
// call sends them.
func TestIntegrationSealProducerDown(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 6, orgs3, now.Add(-time.Hour), now.Add(-time.Minute)))
	p := &fakeProducer{fail: errors.New("broker down")}
	s := newSealer(t, conn, db, key, p)
	res, err := s.SealNow(ctx)
	assert.ErrorContains(t, err, "cannot produce 3 audit.sealed events")
	assert.Equal(t, 3, res.Seals)
	assert.Zero(t, res.Emitted)
	p.mu.Lock()
	p.fail = nil
	p.mu.Unlock()
	res, err = s.SealNow(ctx)
	require.NoError(t, err)
	assert.Zero(t, res.Seals)
	assert.Equal(t, 3, res.Emitted)
	assert.Len(t, p.all(), 3)
	assert.Empty(t, verify(t, conn, db, pubOf(key), Filter{}).Problems)
}

// Run seals at once, every Every, and once more when its context ends.
func TestIntegrationSealRun(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	insert(t, conn, db, rows("ev", 6, orgs3, now.Add(-time.Hour), now.Add(-time.Minute)))
	p := &fakeProducer{}
	s := newSealer(t, conn, db, key, p, func(c *Config) { c.Every = time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	require.Eventually(t, func() bool { return len(p.all()) == 3 }, 10*time.Second, 50*time.Millisecond)
	insert(t, conn, db, rows("later", 3, orgs3, now.Add(-time.Hour), time.Now().UTC().Add(-3*time.Second)))
	require.Eventually(t, func() bool { return len(p.all()) == 6 }, 10*time.Second, 50*time.Millisecond)
	// Stored just before the stop: the last seal takes it (no settle).
	insert(t, conn, db, rows("last", 3, orgs3, now.Add(-time.Hour), time.Now().UTC()))
	cancel()
	require.NoError(t, <-done)
	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 12, rep.SealedEvents)
}

func TestIntegrationSealConcurrent(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	start := time.Now().UTC()
	// Two serve processes and an operator, all sealing while events keep arriving.
	var sealers []*Sealer
	for range 3 {
		sealers = append(sealers, newSealer(t, conn, db, key, &fakeProducer{}, func(c *Config) { c.MaxEntries = 9; c.Settle = time.Second }))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			insert(t, conn, db, rows(fmt.Sprintf("w%03d", i), 13, orgs3, start.Add(-time.Hour), time.Now().UTC()))
			time.Sleep(80 * time.Millisecond)
		}
	})
	var retries, total int
	var mu sync.Mutex
	for _, s := range sealers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.SealNow(ctx)
				assert.NoError(t, err)
				mu.Lock()
				retries += res.Retries
				total += res.Seals
				mu.Unlock()
			}
		})
	}
	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()
	// What the last inserts left, and rows whose insert took longer than the lookback
	// of 2·Settle on this loaded machine (late rows: sealed by the next run that looks
	// back the whole margin — the first run of an operator's `audit seal` does).
	time.Sleep(2100 * time.Millisecond) // rows stamped in second S are eligible once floor(now) − 1 s > S
	late, err := newSealer(t, conn, db, key, &fakeProducer{}).SealNow(ctx)
	require.NoError(t, err)
	t.Logf("the last seal took %d events", late.Events)

	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Zero(t, rep.UnsealedEvents)
	assert.Positive(t, rep.SealedEvents)
	var n uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".events").Scan(&n))
	assert.Equal(t, int(n), rep.SealedEvents)

	var forks uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM (SELECT org_id, seq FROM "+db+".seals FINAL GROUP BY org_id, seq HAVING count() > 1)").Scan(&forks))
	t.Logf("%d seals, %d restarts after another sealer moved a head, %d forks, %d events", total, retries, forks, rep.SealedEvents)
}

// A fork — two seals with the same seq, as two sealers that both passed their head
// check write them — is accepted, and sealing goes on from one of them.
func TestIntegrationSealFork(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	insert(t, conn, db, rows("a", 10, []string{"org-a"}, now.Add(-time.Hour), now.Add(-time.Minute)))
	s := newSealer(t, conn, db, key, &fakeProducer{})
	_, err := s.SealNow(ctx)
	require.NoError(t, err)
	hs, _, err := heads(ctx, conn, db)
	require.NoError(t, err)

	// Two sealers build seal 2 from the same head, over different rows.
	var made []*Seal
	for i, prefix := range []string{"b", "c"} {
		rs := rows(prefix, 4, []string{"org-a"}, now.Add(-time.Duration(i+1)*20*time.Minute), now.Add(-2*time.Second))
		insert(t, conn, db, rs)
		var es []Entry
		for _, r := range rs {
			es = append(es, Entry{Time: r.Time, ID: r.ID, Digest: r.SealDigest()})
		}
		sl := &Seal{OrgID: "org-a", Seq: 2, Prev: hs["org-a"].hash, SealedAt: now, Through: now.Add(-time.Second).Truncate(time.Second), Events: 4}
		sl.FirstTime, sl.LastTime = es[0].Time.Truncate(time.Second), es[3].Time.Truncate(time.Second)
		sl.Root = Root(es)
		sl.sign(key)
		require.NoError(t, writeSeal(ctx, conn, db, sl, es))
		made = append(made, sl)
	}
	rep := verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 3, rep.Seals)
	assert.Equal(t, 18, rep.SealedEvents)

	insert(t, conn, db, rows("d", 3, []string{"org-a"}, now.Add(-time.Hour), time.Now().UTC().Add(-2*time.Second)))
	res, err := s.SealNow(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, res.Events, "the events of both sides of the fork count as sealed")
	seals, err := loadSeals(ctx, conn, db, nil)
	require.NoError(t, err)
	require.Len(t, seals, 4)
	assert.Equal(t, uint64(3), seals[3].Seq)
	assert.Equal(t, min(made[0].Hash, made[1].Hash), seals[3].Prev, "the next seal links to the smaller hash")
	rep = verify(t, conn, db, pubOf(key), Filter{})
	assert.Empty(t, rep.Problems)
	assert.Equal(t, 4, rep.Seals)
	assert.Equal(t, 21, rep.SealedEvents)
}

func TestSealConfigValidate(t *testing.T) {
	err := (&Config{Database: "bad-name", Every: time.Millisecond, Margin: time.Second, MaxEntries: -1, Settle: -1}).Validate()
	require.Error(t, err)
	for _, want := range []string{"no clickhouse connection", `database "bad-name"`, "no Ed25519 private key", "no producer",
		"--seal-every must be at least 1s", "margin must be at least 2s", "max entries must not be negative", "settle must not be negative"} {
		assert.ErrorContains(t, err, want)
	}
}
