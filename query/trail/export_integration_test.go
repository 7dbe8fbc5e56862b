package trail

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

func (tr *trail) exporter(tweak ...func(*ExportConfig)) *Exporter {
	tr.t.Helper()
	cfg := ExportConfig{Conn: tr.conn, Database: tr.db, Key: tr.key}
	for _, f := range tweak {
		f(&cfg)
	}
	x, err := NewExporter(cfg)
	require.NoError(tr.t, err)
	return x
}

// exportAll runs one export request to the end and returns what it wrote.
func exportAll(t testing.TB, x *Exporter, req ExportRequest) ([]byte, ExportStats) {
	t.Helper()
	e, err := x.Prepare(context.Background(), req)
	require.NoError(t, err)
	var buf bytes.Buffer
	st, err := e.Stream(context.Background(), &buf, nil)
	require.NoError(t, err, "%s", tail(buf.Bytes()))
	return buf.Bytes(), st
}

// exportFails runs an export whose log is found edited part-way: Stream fails, and the
// file ends with an error record instead of a manifest.
func exportFails(t testing.TB, x *Exporter, req ExportRequest) (string, []byte) {
	t.Helper()
	e, err := x.Prepare(context.Background(), req)
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = e.Stream(context.Background(), &buf, nil)
	require.Error(t, err)
	require.ErrorIs(t, err, ErrExportConflict)
	sc := NewExportScanner(req.Encoding)
	_, _ = sc.Write(buf.Bytes())
	require.NotNil(t, sc.Error, "an error record")
	require.Nil(t, sc.Manifest, "no manifest")
	return ParseExportError(req.Encoding, sc.Error), buf.Bytes()
}

func tail(b []byte) []byte { return b[max(0, len(b)-600):] }

func (tr *trail) anchors() []ed25519.PublicKey { return []ed25519.PublicKey{pubOf(tr.key)} }

func (tr *trail) verifyExport(b []byte, held ...External) ExportReport {
	tr.t.Helper()
	return verifyBytes(tr.t, b, ExportVerifyOptions{Anchors: tr.anchors(), Checkpoints: held})
}

// exportTrail is a trail of 1500 events of two organizations over three hours, with a
// crowded second, tool calls among messages, sealed in checkpoints of 200 leaves.
func exportTrail(t *testing.T) (*trail, []store.EventRow, time.Time) {
	t.Helper()
	tr := newTrail(t, func(c *Config) { c.MaxLeaves = 200 })
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
	tr.store(rs[:700])
	tr.seal()
	tr.store(rs[700:])
	tr.seal()
	return tr, rs, base
}

// Small windows and scan chunks, several checkpoints and a crowded second: the export
// verifies, is the same bytes whatever the windows, and a resume after any line gives
// the same bytes as the uninterrupted export.
func TestIntegrationExportRoundTripAndResume(t *testing.T) {
	tr, rs, base := exportTrail(t)
	sel := Selection{Org: "org-a", From: base, To: base.Add(2 * time.Hour), Types: []string{schema.TypeMessageCreated}}
	want := 0
	for _, r := range rs {
		if r.OrgID == "org-a" && r.Type == schema.TypeMessageCreated && r.Time.Before(sel.To) {
			want++
		}
	}
	wide := tr.exporter()
	narrow := tr.exporter(func(c *ExportConfig) { c.WindowRows, c.IndexChunk = 25, 100 })
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		t.Run(enc, func(t *testing.T) {
			full, st := exportAll(t, wide, ExportRequest{Selection: sel, Encoding: enc})
			assert.Equal(t, uint64(want), st.Total)
			assert.Zero(t, st.Gaps)
			rep := tr.verifyExport(full)
			require.True(t, rep.OK(), "%+v", rep.Problems)
			require.Equal(t, int64(want), rep.Events)
			assert.Equal(t, uint64(1500/2), rep.Size, "org-a's log")
			assert.Equal(t, tlog.DefaultPrefix(tr.db), rep.OriginPrefix)

			e, err := narrow.Prepare(context.Background(), ExportRequest{Selection: sel, Encoding: enc})
			require.NoError(t, err)
			assert.Greater(t, len(e.windows), 10)
			var buf bytes.Buffer
			_, err = e.Stream(context.Background(), &buf, nil)
			require.NoError(t, err)
			require.True(t, bytes.Equal(full, buf.Bytes()), "windows change the bytes")

			// Resume after the header, inside the crowded second, at a window's edge, and
			// after the last event.
			hs := NewExportScanner(enc)
			_, _ = hs.Write(full)
			h, err := ParseExportHeader(enc, hs.Header)
			require.NoError(t, err)
			for _, k := range []int{0, 1, 26, 59, want - 1, want} {
				cut := cutAfter(t, enc, full, k)
				sc := NewExportScanner(enc)
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
				req, err := h.Request(&c)
				require.NoError(t, err)
				rest, st := exportAll(t, narrow, req)
				assert.Equal(t, uint64(want), st.Total)
				assert.Equal(t, uint64(want-k), st.Events)
				require.True(t, bytes.Equal(full, append(bytes.Clone(full[:cut]), rest...)), "resumed after event %d, the file differs", k)
			}
		})
	}

	// The lists select by the sealed content; each selection verifies on its own.
	for name, s := range map[string]Selection{
		"actors": {Org: "org-a", From: base, To: base.Add(3 * time.Hour), Actors: []string{"agent-0", "agent-2"}},
		"rooms":  {Org: "org-a", From: base, To: base.Add(3 * time.Hour), Rooms: []string{"room-4"}},
		"types":  {Org: "org-b", From: base.Add(500 * time.Millisecond), To: base.Add(time.Hour), Types: []string{schema.TypeToolCall}},
	} {
		n := 0
		for _, r := range rs {
			if r.OrgID == s.Org && s.inRange(r.Time) && s.selects(&r) {
				n++
			}
		}
		b, st := exportAll(t, wide, ExportRequest{Selection: s, Encoding: EncodingNDJSON})
		assert.Equal(t, uint64(n), st.Total, name)
		assert.Positive(t, n, name)
		rep := tr.verifyExport(b)
		assert.True(t, rep.OK(), "%s: %+v", name, rep.Problems)
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

// An export is pinned to a checkpoint: the newest that verifies (a forged newer row is
// skipped) or the one of size as_of, which gives the same bytes after the log grew.
func TestIntegrationExportPinning(t *testing.T) {
	tr, rs := sealedTrail(t)
	ctx := context.Background()
	now := time.Now().UTC()
	sel := Selection{Org: "org-a", From: now.Add(-3 * time.Hour), To: now.Add(time.Hour)}
	x := tr.exporter()
	first, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.Equal(t, uint64(10), st.Total)
	h, err := ParseExportHeader(EncodingNDJSON, lines(first)[0])
	require.NoError(t, err)
	require.Equal(t, uint64(10), h.Size)

	// A forged checkpoint row newer than the real one (unsigned, and one signed by
	// another key): skipped; the export stays pinned to the real one.
	other, err := tlog.NewSigner(tlog.DefaultPrefix(tr.db), testKey(t))
	require.NoError(t, err)
	foreign, err := other.Sign("org-a", 999, make([]byte, 32))
	require.NoError(t, err)
	require.NoError(t, tr.s.db.insert(ctx, "checkpoints", "org_id, size, root, signed_at, key_id, note",
		[]string{"org-a", "org-a"}, []uint64{1 << 40, 999}, []string{"00", "00"},
		[]time.Time{now, now}, []string{"x", foreign.KeyID},
		[]string{"bandplane/x/org/org-a\n1099511627776\nAAAA\n\n— forged AAAA\n", string(foreign.Note)}))
	b, _ := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.True(t, bytes.Equal(first, b), "the forged rows change nothing")
	for _, size := range []uint64{999, 1 << 40, 11} {
		_, err := x.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: size})
		assert.ErrorIs(t, err, ErrExportConflict, "as_of %d", size)
		assert.ErrorContains(t, err, fmt.Sprintf("as_of: organization \"org-a\" has no checkpoint of size %d signed with the audit key", size))
	}

	// More sealed: the newest export grows, one pinned at size 10 is the same bytes.
	tr.store(rows("more", 6, []string{"org-a"}, now.Add(-time.Hour), now.Add(-10*time.Second)))
	tr.seal()
	b, _ = exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: 10})
	require.True(t, bytes.Equal(first, b), "an export pinned at size 10 does not change")
	latest, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.Equal(t, uint64(16), st.Total)
	assert.True(t, tr.verifyExport(latest).OK())

	// Nothing sealed, a consistency size beyond the checkpoint, another key: 409, each
	// saying what to do.
	nobody := sel
	nobody.Org = "org-nobody"
	_, err = x.Prepare(ctx, ExportRequest{Selection: nobody, Encoding: EncodingNDJSON})
	assert.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "is serve running with --audit-key?")
	_, err = x.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: 10, Consistency: []uint64{4, 16}})
	assert.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "has 10 leaves at the pinned checkpoint, fewer than the 16 of the checkpoint you hold: it was rolled back, or pin the export at as_of ≥ 16")
	y := &trail{t: t, conn: tr.conn, db: tr.db, key: testKey(t)}
	_, err = y.exporter().Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "nothing of organization \"org-a\" is sealed with the audit key")
	// Requests Prepare refuses before it reads anything.
	for _, req := range []ExportRequest{
		{Selection: sel, Encoding: "xml"},
		{Selection: Selection{Org: "org-a"}, Encoding: EncodingNDJSON},
		{Selection: sel, Encoding: EncodingNDJSON, Consistency: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{Selection: sel, Encoding: EncodingNDJSON, Consistency: []uint64{0}},
		{Selection: sel, Encoding: EncodingNDJSON, After: &Cursor{}},
	} {
		_, err := x.Prepare(ctx, req)
		assert.Error(t, err, "%+v", req)
		assert.NotErrorIs(t, err, ErrExportConflict, "%+v", req)
	}

	// A cursor of another export, and one whose count the trail does not have: 409.
	c, err := NewCursor(&h, 4, rs[9].Time, rs[9].ID) // rs[9] is org-a's fourth event
	require.NoError(t, err)
	req, err := h.Request(&c)
	require.NoError(t, err)
	_, err = x.Prepare(ctx, req)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		edit func(*ExportRequest)
		want string
	}{
		"other format":      {func(r *ExportRequest) { r.Encoding = EncodingCSV }, "belongs to another export"},
		"other consistency": {func(r *ExportRequest) { r.Consistency = []uint64{5} }, "belongs to another export"},
		"wrong count": {func(r *ExportRequest) {
			c := *r.After
			c.Events = 3
			r.After = &c
		}, "the file holds 3 events up to event \"ev-00009\""},
		"another event": {func(r *ExportRequest) {
			c := *r.After
			c.ID = "ev-00008"
			r.After = &c
		}, "has 3 up to there, the last one event \"ev-00006\""},
	} {
		r := req
		tc.edit(&r)
		_, err := x.Prepare(ctx, r)
		assert.ErrorIs(t, err, ErrExportConflict, name)
		assert.ErrorContains(t, err, tc.want, name)
	}
}

// Rows edited or deleted in ClickHouse after sealing: their leaves are gaps, never
// the stored content; a copy with other content beside the sealed one changes nothing;
// a row stored twice (a retried insert, two leaves) is one line.
func TestIntegrationExportGaps(t *testing.T) {
	tr, rs := sealedTrail(t)
	now := time.Now().UTC()
	sel := Selection{Org: "org-a", From: now.Add(-3 * time.Hour), To: now}
	// Another copy of ev-00006, same key and ingested_at, other content: the export
	// takes the sealed copy (content and Kafka record), whatever ClickHouse returns first.
	forged := rs[6]
	forged.Data = `{"content":"the other story"}`
	insert(t, tr.conn, tr.db, []store.EventRow{forged})
	// ev-00009: an earlier insert attempt left a copy stamped 5 s before the sealed one,
	// and a redelivery noted that copy again: a second leaf, with its own copy. Stored
	// after the sealed copy, it is the one a merge keeps, and it matches both leaves.
	retried := rs[9]
	retried.IngestedAt = retried.IngestedAt.Add(-5 * time.Second)
	tr.store([]store.EventRow{retried})
	// ev-00015: an earlier attempt's copy, never noted: genuine for the sealed leaf.
	attempt := rs[15]
	attempt.IngestedAt = attempt.IngestedAt.Add(-3 * time.Second)
	insert(t, tr.conn, tr.db, []store.EventRow{attempt})
	tr.seal()

	x := tr.exporter()
	b, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.Equal(t, uint64(10), st.Total, "one line per row key")
	assert.Zero(t, st.Gaps)
	rep := tr.verifyExport(b)
	require.True(t, rep.OK(), "%+v", rep.Problems)
	assert.NotContains(t, string(b), "the other story")
	assert.Contains(t, string(b), `"id":"ev-00006"`)

	tr.exec("events", "UPDATE data = '{\"content\":\"rewritten\"}' WHERE id = 'ev-00003'")
	tr.exec("events", "DELETE WHERE id = 'ev-00012'")
	b, st = exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingCSV})
	assert.Equal(t, uint64(8), st.Total)
	assert.Equal(t, uint64(2), st.Gaps)
	assert.NotContains(t, string(b), "rewritten", "no forged content is exported")
	rep = tr.verifyExport(b)
	got := map[string]string{}
	for _, p := range rep.Problems {
		got[p.ID] = p.Kind
	}
	assert.Equal(t, map[string]string{"ev-00003": ExportModified, "ev-00012": ExportMissing}, got, "%+v", rep.Problems)
	assert.Equal(t, int64(2), rep.Gaps)
}

// Each leaf is matched with the stored copies on its own. A sealed row whose
// ingested_at is moved in ClickHouse by more than the margin, and which ingest then
// notes again (a redelivery notes the record's own copy, with the stored
// ingested_at), has two leaves: the second matches the moved copy, and the first,
// whose row is gone, is a modified gap beside that line, never a duplicate of it. A
// row deleted after being noted twice is a missing gap per leaf. An earlier insert
// attempt's copy, noted again and then merged away, leaves a leaf no copy matches
// within the margin before a matched one: a duplicate, no gap. The file verifies as
// such, and resumes anywhere.
func TestIntegrationExportMatchesEachLeaf(t *testing.T) {
	tr, rs := sealedTrail(t)
	now := time.Now().UTC()
	sel := Selection{Org: "org-a", From: now.Add(-3 * time.Hour), To: now}
	x := tr.exporter()
	before, _ := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.True(t, tr.verifyExport(before).OK())

	// ev-00012 moved an hour later, then noted again as stored.
	tr.exec("events", "UPDATE ingested_at = ingested_at + 3600 WHERE id = 'ev-00012'")
	moved := rs[12]
	moved.IngestedAt = moved.IngestedAt.Add(time.Hour)
	tr.notes.add([]store.EventRow{moved})
	// ev-00018 noted twice (an earlier attempt's copy noted again), then deleted.
	again := rs[18]
	again.IngestedAt = again.IngestedAt.Add(-2 * time.Second)
	tr.store([]store.EventRow{again})
	// ev-00021: an earlier attempt's copy noted again, then merged away (the merge
	// keeps the copy of the last attempt, the sealed one).
	attempt := rs[21]
	attempt.IngestedAt = attempt.IngestedAt.Add(-4 * time.Second)
	tr.store([]store.EventRow{attempt})
	require.Equal(t, 3, tr.seal().Leaves)
	tr.exec("events", "DELETE WHERE id = 'ev-00018'")
	tr.exec("events", "DELETE WHERE id = 'ev-00021' AND ingested_at = toDateTime("+strconv.FormatInt(attempt.IngestedAt.Unix(), 10)+")")

	leafOf := func(id string) []uint64 {
		var out []uint64
		rows, err := tr.conn.Query(context.Background(), "SELECT idx FROM "+tr.db+".log_leaves WHERE org_id = 'org-a' AND id = ? ORDER BY idx", id)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var i uint64
			require.NoError(t, rows.Scan(&i))
			out = append(out, i)
		}
		require.NoError(t, rows.Err())
		return out
	}
	movedLeaves, deletedLeaves := leafOf("ev-00012"), leafOf("ev-00018")
	require.Len(t, movedLeaves, 2)
	require.Len(t, deletedLeaves, 2)
	require.Len(t, leafOf("ev-00021"), 2)
	var left uint64
	require.NoError(t, tr.conn.QueryRow(context.Background(), "SELECT count() FROM "+tr.db+".events WHERE id = 'ev-00021'").Scan(&left))
	require.Equal(t, uint64(1), left, "the sealed copy only")

	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		t.Run(enc, func(t *testing.T) {
			b, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: enc})
			assert.Equal(t, uint64(9), st.Total, "ev-00018 has no line")
			assert.Equal(t, uint64(3), st.Gaps, "the moved row's first leaf and both of the deleted row's")
			rep := tr.verifyExport(b)
			type problem struct {
				id, kind string
				leaf     uint64
			}
			var got []problem
			for _, p := range rep.Problems {
				require.NotNil(t, p.Leaf, "%+v", p)
				got = append(got, problem{p.ID, p.Kind, *p.Leaf})
			}
			assert.ElementsMatch(t, []problem{
				{"ev-00012", ExportModified, movedLeaves[0]},
				{"ev-00018", ExportMissing, deletedLeaves[0]},
				{"ev-00018", ExportMissing, deletedLeaves[1]},
			}, got, "%+v", rep.Problems)
			assert.Equal(t, int64(9), rep.Events)

			// The moved row's line is its second leaf, with that leaf's bookkeeping.
			var line ExportEventID
			for k := 1; k <= 9; k++ {
				sc := NewExportScanner(enc)
				_, _ = sc.Write(b[:cutAfter(t, enc, b, k)])
				id, err := ExportEventKey(enc, sc.LastEvent)
				require.NoError(t, err)
				if id.ID == "ev-00012" {
					line = id
					break
				}
			}
			assert.Equal(t, movedLeaves[1], line.Leaf)
			assert.Contains(t, string(b), fmtSec(moved.IngestedAt))

			// Resumed after any line, the file is the same bytes: the gap of a key
			// comes before its line, so a cursor at the line has it behind.
			hs := NewExportScanner(enc)
			_, _ = hs.Write(b)
			h, err := ParseExportHeader(enc, hs.Header)
			require.NoError(t, err)
			for k := range 10 {
				cut := cutAfter(t, enc, b, k)
				sc := NewExportScanner(enc)
				_, _ = sc.Write(b[:cut])
				var c Cursor
				if k == 0 {
					c, err = NewCursor(&h, 0, time.Time{}, "")
				} else {
					last, kerr := ExportEventKey(enc, sc.LastEvent)
					require.NoError(t, kerr)
					c, err = NewCursor(&h, uint64(k), last.Time, last.ID)
				}
				require.NoError(t, err)
				req, err := h.Request(&c)
				require.NoError(t, err)
				rest, _ := exportAll(t, x, req)
				require.True(t, bytes.Equal(b, append(bytes.Clone(b[:cut]), rest...)), "resumed after event %d, the file differs", k)
			}
		})
	}
}

// A real retention run with the audit key: the sealed events it dropped are expired
// gaps, with the cut in the header, and the export verifies.
func TestIntegrationExportExpiredGaps(t *testing.T) {
	tr := newTrail(t)
	ctx := context.Background()
	now := time.Now().UTC()
	tr.store(rows("old", 6, []string{"org-a"}, now.AddDate(0, 0, -30), now.Add(-time.Minute)))
	tr.store(rows("new", 6, []string{"org-a"}, now.Add(-time.Hour), now.Add(-time.Minute)))
	tr.seal()
	// The run's clock is the second after the newest checkpoint: checkpoints and cuts
	// carry whole seconds, and a cut must be recorded after the checkpoints it follows.
	res, err := chdb.ApplyRetention(ctx, tr.conn, chdb.Config{Database: tr.db}, chdb.Retention{Events: 10 * 24 * time.Hour}, afterEveryHead(tr.verify(Filter{})),
		chdb.RetentionOptions{Sign: CutSigner(tr.key, tr.db, tlog.DefaultPrefix(tr.db))})
	require.NoError(t, err)
	require.Len(t, res.Cuts, 1)
	sel := Selection{Org: "org-a", From: now.AddDate(0, 0, -31), To: now}
	b, st := exportAll(t, tr.exporter(), ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	assert.Equal(t, uint64(6), st.Total)
	assert.Equal(t, uint64(6), st.Gaps)
	assert.Equal(t, 6, strings.Count(string(b), `"mark":"expired"`))
	rep := tr.verifyExport(b)
	require.True(t, rep.OK(), "%+v", rep.Problems)
	assert.Equal(t, int64(6), rep.Expired)

	// The cut's record edited in the file: the gaps are no longer excused.
	h, err := ParseExportHeader(EncodingNDJSON, lines(b)[0])
	require.NoError(t, err)
	edited := bytes.Replace(b, []byte(`"partitions":`+strconv.FormatUint(h.Cuts[0].Partitions, 10)), []byte(`"partitions":99`), 1)
	rep = tr.verifyExport(edited)
	assert.Len(t, problemsOf(rep, ExportExpired), 6, "%+v", rep.Problems)
}

// What the server refuses to sign: a log that does not give its checkpoint's root
// (before a byte is sent), and log_leaves or log_tree edited (found part-way: an
// error record, no manifest).
func TestIntegrationExportRefusesAnEditedLog(t *testing.T) {
	now := time.Now().UTC()
	sel := Selection{Org: "org-a", From: now.Add(-3 * time.Hour), To: now}
	req := ExportRequest{Selection: sel, Encoding: EncodingNDJSON}
	for _, c := range []struct {
		name, table, stmt string
		prepare           string // Prepare's error, or "" when Stream finds it
		stream            string
	}{
		{"a leaf's time moved in log_index", "log_index", "UPDATE time_ms = time_ms + 1000 WHERE org_id = 'org-a' AND idx = 3", "its leaves do not give the checkpoint's root", ""},
		{"a leaf's inner digest in log_index", "log_index", "UPDATE inner = '" + fmt.Sprintf("%064d", 0) + "' WHERE org_id = 'org-a' AND idx = 3", "its leaves do not give the checkpoint's root", ""},
		{"a leaf deleted from log_index", "log_index", "DELETE WHERE org_id = 'org-a' AND idx = 3", "log_index has no leaf at index 3", ""},
		{"a leaf deleted from log_leaves", "log_leaves", "DELETE WHERE org_id = 'org-a' AND idx = 3", "", "1 leaves of the range, the first leaf 3, have no row in log_leaves"},
		{"a leaf's time moved in log_leaves", "log_leaves", "UPDATE time_ms = (time_ms + 1) % 1000 WHERE org_id = 'org-a' AND idx = 3", "", "the log_leaves row of leaf 3 (event \"ev-00009\""},
		{"a leaf's time moved out of the range", "log_leaves", "", "", "the first leaf 3, have no row in log_leaves"},
		{"a leaf's digest in log_leaves", "log_leaves", "UPDATE digest = '" + fmt.Sprintf("%064d", 0) + "' WHERE org_id = 'org-a' AND idx = 3", "", "is not the leaf the log holds"},
		// The proofs of lines are built from the leaves the export checked; a consistency
		// proof reads log_tree, and is checked against the roots before it is written.
		{"the tree nodes in log_tree", "log_tree", "UPDATE hash = '" + fmt.Sprintf("%064d", 0) + "' WHERE org_id = 'org-a'", "", "its consistency proof from size 3 fails against the roots (log_tree edited?)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, _ := sealedTrail(t)
			if c.stmt == "" {
				// time is a key column: the row is written again a day earlier, and the
				// sealed one deleted.
				ctx := context.Background()
				var at time.Time
				require.NoError(t, tr.conn.QueryRow(ctx, "SELECT time FROM "+tr.db+".log_leaves WHERE org_id = 'org-a' AND idx = 3").Scan(&at))
				require.NoError(t, tr.conn.Exec(ctx, "INSERT INTO "+tr.db+".log_leaves SELECT org_id, time - 86400, time_ms, id, idx, digest, ingested_at, kafka_partition, kafka_offset FROM "+
					tr.db+".log_leaves WHERE org_id = 'org-a' AND idx = 3"))
				c.stmt = "DELETE WHERE org_id = 'org-a' AND idx = 3 AND time = toDateTime(" + strconv.FormatInt(at.Unix(), 10) + ")"
			}
			tr.exec(c.table, c.stmt)
			x := tr.exporter()
			if c.prepare != "" {
				_, err := x.Prepare(context.Background(), req)
				require.ErrorIs(t, err, ErrExportConflict)
				assert.ErrorContains(t, err, `the log of org "org-a" does not match its checkpoint of size 10 (`+c.prepare)
				assert.ErrorContains(t, err, "run bandplane audit verify")
				return
			}
			if c.table == "log_tree" {
				b, _ := exportAll(t, x, req)
				require.True(t, tr.verifyExport(b).OK(), "the lines' proofs do not come from log_tree")
				req := req
				req.Consistency = []uint64{3}
				msg, _ := exportFails(t, x, req)
				assert.Contains(t, msg, c.stream)
				return
			}
			msg, b := exportFails(t, x, req)
			assert.Contains(t, msg, c.stream)
			assert.Contains(t, msg, "run bandplane audit verify")
			rep := tr.verifyExport(b)
			assert.Contains(t, exportKinds(rep), ExportTruncated)
		})
	}
}

// The trailer proves the log extends checkpoints the client holds: an auditor's
// older checkpoint passes, a forked one (another root at that size, signed with the
// key) does not, and one never asked for is named.
func TestIntegrationExportConsistency(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	latest, err := tr.topic.read(ctx)
	require.NoError(t, err)
	saved := External{Source: "auditor.checkpoint", Note: latest["org-a"]} // org-a at 10
	now := time.Now().UTC()
	tr.store(rows("more", 7, []string{"org-a"}, now.Add(-time.Hour), now.Add(-10*time.Second)))
	tr.seal()
	sel := Selection{Org: "org-a", From: now.Add(-3 * time.Hour), To: now}
	x := tr.exporter()
	b, _ := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, Consistency: []uint64{10, 17}})
	rep := tr.verifyExport(b, saved)
	require.True(t, rep.OK(), "%+v", rep.Problems)
	assert.Equal(t, []string{"auditor.checkpoint (size 10)"}, rep.Consistent)
	assert.Equal(t, uint64(17), rep.Size)

	signer, err := tlog.NewSigner(tlog.DefaultPrefix(tr.db), tr.key)
	require.NoError(t, err)
	fork, err := signer.Sign("org-a", 10, bytes.Repeat([]byte{7}, 32))
	require.NoError(t, err)
	rep = tr.verifyExport(b, External{Source: "forked.checkpoint", Note: fork.Note})
	require.Len(t, rep.Problems, 1, "%+v", rep.Problems)
	assert.Equal(t, ExportConsistency, rep.Problems[0].Kind)
	assert.Contains(t, rep.Problems[0].Reason, "forked")

	plain, _ := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	rep = tr.verifyExport(plain, saved)
	require.Len(t, rep.Problems, 1, "%+v", rep.Problems)
	assert.Contains(t, rep.Problems[0].Reason, "has no consistency record in the export: export with --checkpoint auditor.checkpoint")
}

// An export pinned to the newest checkpoint is compared with the checkpoints topic's:
// ClickHouse rolled back (its newest checkpoints removed, or all of them) is refused
// with 409, and so is a log that does not extend the topic's checkpoint; a topic note
// the key ring does not open is ignored and logged; as_of pins what it names. Without
// the topic, the rolled-back export would verify offline.
func TestIntegrationExportComparesTheTopic(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	now := time.Now().UTC()
	at10, err := tr.topic.read(ctx)
	require.NoError(t, err)
	tr.store(rows("more", 6, []string{"org-a"}, now.Add(-time.Hour), now.Add(-10*time.Second)))
	tr.seal()
	sel := Selection{Org: "org-a", From: now.Add(-3 * time.Hour), To: now}
	req := ExportRequest{Selection: sel, Encoding: EncodingNDJSON}
	var logs bytes.Buffer
	var topicErr error
	x := tr.exporter(func(c *ExportConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Published = func(ctx context.Context) (map[string][]byte, error) {
			if topicErr != nil {
				return nil, topicErr
			}
			return tr.topic.read(ctx)
		}
	})
	setTopic := func(note []byte) {
		tr.topic.mu.Lock()
		defer tr.topic.mu.Unlock()
		tr.topic.latest["org-a"] = note
	}
	latest, err := tr.topic.read(ctx)
	require.NoError(t, err)
	at16 := latest["org-a"]

	// The topic at the pinned size, or at an older size the log extends: served.
	b, st := exportAll(t, x, req)
	assert.Equal(t, uint64(16), st.Total)
	require.True(t, tr.verifyExport(b).OK())
	setTopic(at10["org-a"])
	again, _ := exportAll(t, x, req)
	assert.True(t, bytes.Equal(b, again), "the topic's check leaves the file as it is")

	// Notes the ring does not open: ignored, each with a log line.
	other, err := tlog.NewSigner(tlog.DefaultPrefix(tr.db), testKey(t))
	require.NoError(t, err)
	foreign, err := other.Sign("org-a", 999, make([]byte, 32))
	require.NoError(t, err)
	signer, err := tlog.NewSigner(tlog.DefaultPrefix(tr.db), tr.key)
	require.NoError(t, err)
	otherOrg, err := signer.Sign("org-b", 999, make([]byte, 32))
	require.NoError(t, err)
	for _, note := range [][]byte{foreign.Note, otherOrg.Note, []byte("not a note")} {
		logs.Reset()
		setTopic(note)
		again, _ := exportAll(t, x, req)
		assert.True(t, bytes.Equal(b, again))
		assert.Contains(t, logs.String(), "ignoring a checkpoint of the checkpoints topic that does not verify")
	}

	// Signed with the audit key, another root: at the pinned size, or at a smaller one.
	for _, size := range []uint64{16, 7} {
		fork, err := signer.Sign("org-a", size, bytes.Repeat([]byte{7}, 32))
		require.NoError(t, err)
		setTopic(fork.Note)
		_, err = x.Prepare(ctx, req)
		require.ErrorIs(t, err, ErrExportConflict, "size %d", size)
		assert.ErrorContains(t, err, "run bandplane audit verify")
		if size == 16 {
			assert.ErrorContains(t, err, `the checkpoints topic has another root for org "org-a" at size 16`)
		} else {
			assert.ErrorContains(t, err, `the log of org "org-a" at size 16 does not extend the checkpoints topic's newest checkpoint (size 7`)
		}
	}

	// ClickHouse rolled back to size 10: refused, naming the org, both sizes and what
	// to do; as_of still pins what it names; without the topic, the stale export
	// would have been signed and verified offline.
	setTopic(at16)
	tr.exec("checkpoints", "DELETE WHERE org_id = 'org-a' AND size > 10")
	_, err = x.Prepare(ctx, req)
	require.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, `the checkpoints topic has a checkpoint of 16 leaves for org "org-a"`)
	assert.ErrorContains(t, err, "ClickHouse's newest checkpoint has only 10: ClickHouse's log was rolled back")
	assert.ErrorContains(t, err, "run bandplane audit verify")
	pinned, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON, AsOf: 10})
	assert.Equal(t, uint64(10), st.Total)
	assert.True(t, tr.verifyExport(pinned).OK())
	stale, _ := exportAll(t, tr.exporter(), req)
	assert.True(t, bytes.Equal(pinned, stale), "what the topic's check refuses")

	// Every checkpoint gone from ClickHouse: the topic says it was rolled back.
	tr.exec("checkpoints", "DELETE WHERE org_id = 'org-a'")
	_, err = x.Prepare(ctx, req)
	require.ErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "and ClickHouse has no checkpoint that verifies: ClickHouse's log was rolled back")

	// The topic cannot be read: no export (503), rather than an unchecked one.
	topicErr = errors.New("no broker")
	_, err = x.Prepare(ctx, req)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrExportConflict)
	assert.ErrorContains(t, err, "cannot read the newest checkpoints from the checkpoints topic: no broker")
}

// A client that goes away stops the export; the connection pool is not left with a
// query running.
func TestIntegrationExportCancel(t *testing.T) {
	tr := newTrail(t)
	now := time.Now().UTC()
	tr.store(rows("c", 3000, []string{"org-a"}, now.Add(-3*time.Hour), now.Add(-time.Minute)))
	tr.seal()
	x := tr.exporter(func(c *ExportConfig) { c.WindowRows = 100 })
	ctx, cancel := context.WithCancel(context.Background())
	e, err := x.Prepare(ctx, ExportRequest{Selection: Selection{Org: "org-a", From: now.Add(-4 * time.Hour), To: now}, Encoding: EncodingNDJSON})
	require.NoError(t, err)
	w := &cancelAfter{n: 100_000, cancel: cancel}
	_, err = e.Stream(ctx, w, nil)
	require.Error(t, err)
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.Less(t, w.written, 600_000, "stopped soon after the client went away")
	assert.NotContains(t, string(w.tail), `"kind":"error"`, "no error record for a client that is gone")
	_, err = e.Stream(context.Background(), w, nil)
	assert.ErrorContains(t, err, "streamed already")
	var one uint8
	require.NoError(t, tr.conn.QueryRow(context.Background(), "SELECT 1").Scan(&one))
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

// The attacks on an export file, on one the server wrote: each is named by line, and
// a real event of another selection, with its genuine proof, is no line of this one.
func TestIntegrationExportFileTampering(t *testing.T) {
	tr, _, base := exportTrail(t)
	x := tr.exporter()
	sel := Selection{Org: "org-a", From: base, To: base.Add(3 * time.Hour), Rooms: []string{"room-0", "room-2", "room-4"}}
	b, st := exportAll(t, x, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
	require.True(t, tr.verifyExport(b).OK())
	ls := lines(b)
	ev := func(line int) exportEvent { return lineEvent(t, ls[line-1]) }
	rowOf := func(line int) store.EventRow {
		r, err := ev(line).row()
		require.NoError(t, err)
		return r
	}
	// Events of the organization's other rooms: genuine leaves of the same log.
	others, _ := exportAll(t, x, ExportRequest{Selection: Selection{Org: "org-a", From: base, To: base.Add(3 * time.Hour), Rooms: []string{"room-1", "room-3"}}, Encoding: EncodingNDJSON})
	other := lines(others)[40]
	otherAt := lineEvent(t, other).row2(t).Time

	cases := map[string]struct {
		edit func([][]byte) [][]byte
		want []string
		line int64
	}{
		"changed": {func(l [][]byte) [][]byte {
			r := rowOf(101)
			r.Data = `{"content":"I never said that"}`
			l[100] = reencode(t, r, ev(101).Leaf, ev(101).Proof)
			return l
		}, []string{ExportChanged}, 101},
		"dropped": {func(l [][]byte) [][]byte { return append(l[:200:200], l[201:]...) }, []string{ExportDropped, ExportManifest}, 201},
		"added from another selection": {func(l [][]byte) [][]byte {
			at := 1 + slices.IndexFunc(l[1:], func(x []byte) bool { return lineEvent(t, x).row2(t).Time.After(otherAt) })
			return append(append(l[:at:at], other), l[at:]...)
		}, []string{ExportSelection, ExportAdded, ExportManifest}, 0},
		"moved": {func(l [][]byte) [][]byte {
			l[50], l[51] = l[51], l[50]
			return l
		}, []string{ExportOrder}, 52},
		"flipped proof byte": {func(l [][]byte) [][]byte {
			e := ev(77)
			raw, err := base64.StdEncoding.DecodeString(e.Proof)
			require.NoError(t, err)
			raw[len(raw)-3] ^= 0x10
			l[76] = reencode(t, rowOf(77), e.Leaf, base64.StdEncoding.EncodeToString(raw))
			return l
		}, []string{ExportChanged}, 77},
		"forged manifest": {func(l [][]byte) [][]byte {
			m := lines(b)[len(ls)-1]
			var man exportManifest
			require.NoError(t, strict(bytes.TrimSuffix(m, []byte("\n")), &man))
			h, err := ParseExportHeader(EncodingNDJSON, ls[0])
			require.NoError(t, err)
			cp, err := tr.ring(t).Open([]byte(h.Checkpoint))
			require.NoError(t, err)
			forged := signManifest(testKey(t), tr.db, sel, &cp, nil, man.Events-1, man.Gaps, man.IndexSHA256)
			obj, err := newEncoder(EncodingNDJSON).object(forged)
			require.NoError(t, err)
			l[len(l)-1] = append(bytes.Clone(obj), '\n')
			return append(l[:10:10], l[11:]...)
		}, []string{ExportDropped, ExportCheckpoint, ExportManifest}, 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			rep := tr.verifyExport(join(c.edit(slices.Clone(ls))))
			require.Equal(t, c.want, exportKinds(rep), "%+v", rep.Problems)
			if c.line > 0 {
				assert.Equal(t, c.line, rep.Problems[0].Line)
			}
		})
	}
	t.Run("another key", func(t *testing.T) {
		rep := verifyBytes(t, b, ExportVerifyOptions{Anchors: []ed25519.PublicKey{pubOf(testKey(t))}})
		require.Equal(t, []string{ExportCheckpoint}, exportKinds(rep), "%+v", rep.Problems)
		assert.Contains(t, rep.Problems[0].Reason, "no key of the ring")
	})
	assert.Equal(t, uint64(len(ls)-3), st.Total, "header, index record and manifest besides the lines")
}

func (e exportEvent) row2(t *testing.T) store.EventRow {
	t.Helper()
	r, err := e.row()
	require.NoError(t, err)
	return r
}

func (tr *trail) ring(t *testing.T) *tlog.KeyRing {
	t.Helper()
	ring, err := tlog.NewKeyRing(tlog.DefaultPrefix(tr.db), tr.anchors(), nil)
	require.NoError(t, err)
	return ring
}
