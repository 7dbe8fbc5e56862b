package seal

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
)

// exportAll runs one export request to the end and returns what it wrote.
func exportAll(t testing.TB, x *Exporter, req ExportRequest) ([]byte, ExportStats) {
	t.Helper()
	e, err := x.Prepare(context.Background(), req)
	require.NoError(t, err)
	var buf bytes.Buffer
	st, err := e.Stream(context.Background(), &buf, nil)
	require.NoError(t, err)
	return buf.Bytes(), st
}

func newTestExporter(t testing.TB, conn driver.Conn, db string, key []byte, windowRows, groupEntries int) *Exporter {
	t.Helper()
	x, err := NewExporter(ExportConfig{Conn: conn, Database: db, Key: key, WindowRows: windowRows, GroupEntries: groupEntries})
	require.NoError(t, err)
	return x
}

// Small windows and groups, many seals and a crowded second: the export is whole and
// in order whatever the windows, and resuming after any line gives the same bytes.
func TestIntegrationExportWindowsAndResume(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	base := now.Add(-3 * time.Hour).Truncate(time.Second)
	rs := rows("w", 1500, []string{"org-a", "org-b"}, base, now.Add(-time.Minute))
	for i := range rs[:120] { // 120 rows in one second, 60 of them org-a's
		rs[i].Time = base.Add(time.Duration(i) * 7 * time.Millisecond)
	}
	for i := range rs {
		if i%4 == 3 {
			rs[i].Type = schema.TypeToolCall
		}
	}
	insert(t, conn, db, rs)
	_, err := newSealer(t, conn, db, key, &fakeProducer{}, func(c *Config) { c.MaxEntries = 200 }).SealNow(context.Background())
	require.NoError(t, err)

	sel := Selection{Org: "org-a", From: base, To: base.Add(2 * time.Hour), Types: []string{schema.TypeMessageCreated}}
	want := 0
	for _, r := range rs {
		if r.OrgID == "org-a" && r.Type == schema.TypeMessageCreated {
			want++
		}
	}
	wide := newTestExporter(t, conn, db, key, 0, 0)
	narrow := newTestExporter(t, conn, db, key, 25, 150)
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		full, st := exportAll(t, wide, ExportRequest{Selection: sel, Encoding: enc})
		assert.Equal(t, uint64(want), st.Total)
		assert.Greater(t, st.Seals, uint64(2))
		rep := verifyBytes(t, full, pubOf(key), 0)
		require.True(t, rep.OK(), "%+v", rep.Problems)
		require.Equal(t, int64(want), rep.Events)
		// The same bytes through many small windows and groups.
		e, err := narrow.Prepare(context.Background(), ExportRequest{Selection: sel, Encoding: enc})
		require.NoError(t, err)
		assert.Greater(t, len(e.windows), 10)
		var buf bytes.Buffer
		_, err = e.Stream(context.Background(), &buf, nil)
		require.NoError(t, err)
		require.True(t, bytes.Equal(full, buf.Bytes()), "%s: windows change the bytes", enc)

		// Resume after the header, inside the crowded second, at a window's edge, and
		// after the last event.
		hs := NewExportScanner(enc)
		_, _ = hs.Write(full)
		h, err := ParseExportHeader(enc, hs.Header)
		require.NoError(t, err)
		asOf, _ := parseSec(h.AsOf)
		for _, k := range []int{0, 1, 26, 59, want - 1, want} {
			sc := NewExportScanner(enc)
			// Feed the file up to the end of its k-th event.
			cut := cutAfter(t, enc, full, k)
			_, _ = sc.Write(full[:cut])
			require.Equal(t, uint64(k), sc.Events)
			var c Cursor
			if k == 0 {
				c, err = NewCursor(&h, 0, time.Time{}, "")
			} else {
				last, kerr := ExportEventKey(enc, sc.LastEvent)
				require.NoError(t, kerr)
				c, err = NewCursor(&h, uint64(k), last.Time, last.ID)
			}
			require.NoError(t, err)
			rest, st := exportAll(t, narrow, ExportRequest{Selection: sel, Encoding: enc, AsOf: asOf, After: &c})
			assert.Equal(t, uint64(want), st.Total)
			require.True(t, bytes.Equal(full, append(bytes.Clone(full[:cut]), rest...)), "%s: resumed after event %d, the file differs", enc, k)
		}
	}
}

// cutAfter is the offset after the k-th event record of an export (after the header
// for k = 0).
func cutAfter(t testing.TB, enc string, b []byte, k int) int {
	t.Helper()
	sc := NewExportScanner(enc)
	for i := range b {
		_, _ = sc.Write(b[i : i+1])
		if k == 0 && sc.Header != nil {
			return int(sc.HeaderEnd)
		}
		if k > 0 && sc.Events == uint64(k) {
			return int(sc.LastEventEnd)
		}
	}
	t.Fatalf("the export has fewer than %d events", k)
	return 0
}

// As of W the export does not change: not with a row that landed after W's seal run
// (it is not sealed by then), not with a copy stored again later, not with new seals.
// A later export holds the late row.
func TestIntegrationExportAsOf(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	ctx := context.Background()
	now := time.Now().UTC()
	base := now.Add(-2 * time.Hour).Truncate(time.Second)
	rs := rows("a", 200, []string{"org-a"}, base, now.Add(-time.Minute))
	insert(t, conn, db, rs)
	s := newSealer(t, conn, db, key, &fakeProducer{})
	_, err := s.SealNow(ctx)
	require.NoError(t, err)
	x := newTestExporter(t, conn, db, key, 0, 0)
	sel := Selection{Org: "org-a", From: base, To: base.Add(time.Hour)}
	first, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.Equal(t, uint64(200), st.Total)
	sc := NewExportScanner(EncodingNDJSON)
	_, _ = sc.Write(first)
	h, err := ParseExportHeader(EncodingNDJSON, sc.Header)
	require.NoError(t, err)
	w, _ := parseSec(h.AsOf)

	// A row stamped before W that lands only now, and a copy of a sealed row stored
	// again with a newer ingested_at.
	late := rows("late", 1, []string{"org-a"}, base.Add(30*time.Second), w.Add(-5*time.Second))
	again := rs[10]
	again.IngestedAt = now
	insert(t, conn, db, append(late, again))
	b, _ := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: w})
	require.True(t, bytes.Equal(first, b), "the late row is not sealed as of W: not exported")
	// Sealed now (the next run looks back): in a new export, not in one as of W.
	time.Sleep(2 * time.Second)
	_, err = s.SealNow(ctx)
	require.NoError(t, err)
	b, _ = exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: w})
	require.True(t, bytes.Equal(first, b), "an export as of W is the same after later seals")
	latest, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.Equal(t, uint64(201), st.Total)
	assert.Contains(t, string(latest), `"id":"late-00000"`)
	rep := verifyBytes(t, latest, pubOf(key), 0)
	require.True(t, rep.OK(), "%+v", rep.Problems)

	// An as_of no seal has, and an organization with no seal: 409.
	_, err = x.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: w.Add(-time.Second)})
	assert.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "is not the through of any seal")
	other := sel
	other.Org = "org-nobody"
	_, err = x.Prepare(ctx, ExportRequest{Selection: other, Encoding: EncodingNDJSON})
	assert.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "is serve running with --audit-key?")
	// Seals of another key are not a watermark for this one.
	y := newTestExporter(t, conn, db, testKey(t), 0, 0)
	_, err = y.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.True(t, errors.Is(err, ErrExportConflict), "%v", err)
}

// A client that goes away stops the export; the connection pool is not left with a
// query running.
func TestIntegrationExportCancel(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	insert(t, conn, db, rows("c", 3000, []string{"org-a"}, now.Add(-3*time.Hour), now.Add(-time.Minute)))
	_, err := newSealer(t, conn, db, key, &fakeProducer{}).SealNow(context.Background())
	require.NoError(t, err)
	x := newTestExporter(t, conn, db, key, 100, 0)
	sel := Selection{Org: "org-a", From: now.Add(-4 * time.Hour), To: now}
	ctx, cancel := context.WithCancel(context.Background())
	e, err := x.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.NoError(t, err)
	w := &cancelAfter{n: 100_000, cancel: cancel}
	_, err = e.Stream(ctx, w, nil)
	require.Error(t, err)
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.Less(t, w.written, 400_000, "stopped soon after the client went away")
	assert.NotContains(t, string(w.tail), `"kind":"error"`, "no error record for a client that is gone")
	// The database still answers.
	var one uint8
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT 1").Scan(&one))
}

// cancelAfter cancels its context once n bytes are written, as a client that hangs up.
type cancelAfter struct {
	n, written int
	cancel     func()
	tail       []byte
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	c.written += len(p)
	c.tail = append(c.tail[:0], p[max(0, len(p)-200):]...)
	if c.written >= c.n {
		c.cancel()
	}
	return len(p), nil
}

// Entries deleted from seal_entries would take their rows out of the export (only what
// is sealed is exported): the seal is in the proof all the same, and the verifier
// names it.
func TestIntegrationExportLostEntries(t *testing.T) {
	conn, db := testDB(t)
	key := testKey(t)
	now := time.Now().UTC()
	base := now.Add(-2 * time.Hour).Truncate(time.Second)
	insert(t, conn, db, rows("e", 300, []string{"org-a"}, base, now.Add(-time.Minute)))
	_, err := newSealer(t, conn, db, key, &fakeProducer{}, func(c *Config) { c.MaxEntries = 100 }).SealNow(context.Background())
	require.NoError(t, err)
	x := newTestExporter(t, conn, db, key, 0, 0)
	sel := Selection{Org: "org-a", From: base, To: base.Add(time.Hour)}
	full, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.Equal(t, uint64(300), st.Total)
	require.Equal(t, uint64(3), st.Seals)
	require.True(t, verifyBytes(t, full, pubOf(key), 0).OK())

	mutate(t, conn, db, "seal_entries", "DELETE WHERE org_id = 'org-a' AND seq = 2")
	mutate(t, conn, db, "seal_entries", "DELETE WHERE org_id = 'org-a' AND seq = 3 AND id = 'e-00250'")
	b, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.Equal(t, uint64(199), st.Total, "the rows of the lost entries are not sealed any more")
	assert.Equal(t, uint64(3), st.Seals)
	rep := verifyBytes(t, b, pubOf(key), 0)
	var seals []string
	for _, p := range rep.Problems {
		if p.Kind == ExportSeal {
			seals = append(seals, p.Reason)
		}
	}
	require.Len(t, seals, 2, "%+v", rep.Problems)
	assert.Contains(t, seals[0], "seal:org-a:2: 0 entries follow it, the seal covers 100")
	assert.Contains(t, seals[1], "seal:org-a:3: 99 entries follow it, the seal covers 100")
}
