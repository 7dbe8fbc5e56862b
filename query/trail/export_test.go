package trail

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/compact"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// memTree is an organization's log in memory: it serves the nodes of proofs as logDB
// does, from the leaves' hashes.
type memTree struct {
	leaves [][]byte
	memo   map[compact.NodeID][]byte
}

func (m *memTree) node(id compact.NodeID) []byte {
	if id.Level == 0 {
		return m.leaves[id.Index]
	}
	if h, ok := m.memo[id]; ok {
		return h
	}
	h := tlog.HashChildren(m.node(compact.NewNodeID(id.Level-1, 2*id.Index)), m.node(compact.NewNodeID(id.Level-1, 2*id.Index+1)))
	m.memo[id] = h
	return h
}

func (m *memTree) ReadNodes(_ context.Context, _ string, ids []compact.NodeID) ([][]byte, error) {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		out[i] = m.node(id)
	}
	return out, nil
}

func (m *memTree) root(size uint64) []byte {
	rng := tlog.NewRange()
	for _, h := range m.leaves[:size] {
		if err := rng.Append(h, nil); err != nil {
			panic(err)
		}
	}
	return tlog.Root(rng)
}

// exportFixture is an export built in memory with the writer the server uses: the
// lines of rows, the rows the lists leave out, and gaps, all leaves of one log whose
// checkpoint the key signs.
type exportFixture struct {
	key         ed25519.PrivateKey
	prefix, db  string
	sel         Selection
	rows        []store.EventRow // the lines
	others      []store.EventRow // in the log, left out by the lists
	gaps        []store.EventRow // in the log, no row: a gap each
	marks       map[string]string
	cuts        []chdb.Cut
	rotations   [][]byte
	consistency []uint64
	extra       int // leaves of the log after the range's

	tree *memTree
	cp   tlog.Checkpoint
}

var exportBase = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newExportFixture(t testing.TB, n int) *exportFixture {
	t.Helper()
	f := &exportFixture{key: testKey(t), prefix: "bandplane/bandplane", db: "bandplane", marks: map[string]string{},
		sel: Selection{Org: "org-a", From: exportBase, To: exportBase.Add(time.Hour), Types: []string{"message.created"}}}
	f.sel.Normalize()
	for i := range n {
		f.rows = append(f.rows, exportRow(fmt.Sprintf("ev-%03d", i), "message.created", exportBase.Add(time.Duration(i)*1337*time.Millisecond),
			fmt.Sprintf(`{"content":"hello %d"}`, i)))
	}
	for i := range n / 3 {
		f.others = append(f.others, exportRow(fmt.Sprintf("tool-%03d", i), "tool.called", exportBase.Add(time.Duration(i)*2*time.Second), `{}`))
	}
	return f
}

func exportRow(id, typ string, t time.Time, data string) store.EventRow {
	return store.EventRow{ID: id, Type: typ, Time: t, OrgID: "org-a", RoomID: "room-1", ActorID: "agent-1", ActorType: "agent",
		ActorHandle: "@alice/coder", OwnerID: "user-1", Source: "band", SchemaVersion: 1, Data: data, IngestedAt: t.Add(time.Second).Truncate(time.Second),
		Partition: 1, Offset: t.UnixMilli() % 100_000}
}

func (f *exportFixture) pub() ed25519.PublicKey { return pubOf(f.key) }

func (f *exportFixture) opts(chunk int) ExportVerifyOptions {
	return ExportVerifyOptions{Anchors: []ed25519.PublicKey{f.pub()}, ChunkLines: chunk}
}

// build writes the export. The log holds every row of rows, others and gaps, in an
// order that is not the lines' (so that indexes and lines differ in order), and extra
// leaves after them.
func (f *exportFixture) build(t testing.TB, encoding string) []byte {
	t.Helper()
	all := append(append(append([]store.EventRow{}, f.rows...), f.others...), f.gaps...)
	r := mrand.New(mrand.NewPCG(1, 2))
	r.Shuffle(len(all), func(i, j int) {
		if i/5 == j/5 { // local disorder only, as late rows give
			all[i], all[j] = all[j], all[i]
		}
	})
	for i := range f.extra {
		all = append(all, exportRow(fmt.Sprintf("late-%03d", i), "message.created", exportBase.Add(2*time.Hour), "{}"))
	}
	f.tree = &memTree{memo: map[compact.NodeID][]byte{}}
	index := map[string]uint64{} // by leaf hash: a gap may share its row key with a line
	for i := range all {
		lf := tlog.LeafOf(&all[i])
		f.tree.leaves = append(f.tree.leaves, lf.Hash())
		index[string(lf.Hash())] = uint64(i)
	}
	leafOf := func(r *store.EventRow) uint64 {
		lf := tlog.LeafOf(r)
		return index[string(lf.Hash())]
	}
	n := uint64(len(all))
	signer, err := tlog.NewSigner(f.prefix, f.key)
	require.NoError(t, err)
	f.cp, err = signer.Sign(f.sel.Org, n, f.tree.root(n))
	require.NoError(t, err)

	var buf bytes.Buffer
	xw := newExportWriter(&buf, encoding, nil)
	req := ExportRequest{Selection: f.sel, Encoding: encoding, Consistency: f.consistency}
	require.NoError(t, xw.header(newHeader(f.db, f.sel, req, &f.cp, f.rotations, f.cuts)))
	type rec struct {
		row  *store.EventRow
		gap  bool
		leaf uint64
	}
	var recs []rec
	for i := range f.rows {
		recs = append(recs, rec{row: &f.rows[i], leaf: leafOf(&f.rows[i])})
	}
	for i := range f.gaps {
		recs = append(recs, rec{row: &f.gaps[i], gap: true, leaf: leafOf(&f.gaps[i])})
	}
	slices.SortFunc(recs, func(a, b rec) int { // recOrder's
		return cmp.Or(leafOrder(a.row.Time.UnixMilli(), a.row.ID, b.row.Time.UnixMilli(), b.row.ID),
			cmp.Compare(boolInt(!a.gap), boolInt(!b.gap)), cmp.Compare(a.leaf, b.leaf))
	})
	idx := make([]uint64, len(recs))
	for i := range recs {
		idx[i] = recs[i].leaf
	}
	prs, err := tlog.InclusionProofs(context.Background(), f.tree, f.sel.Org, idx, n)
	require.NoError(t, err)
	var list indexList
	var events, gaps uint64
	for i, r := range recs {
		if r.gap {
			lf := IndexedLeaf{Leaf: tlog.LeafOf(r.row), Index: r.leaf}
			mark := f.marks[r.row.ID]
			if mark == "" {
				mark = MarkMissing
			}
			require.NoError(t, xw.gap(&lf, mark, encodeProof(prs[i])))
			gaps++
		} else {
			require.NoError(t, xw.event(r.row, r.leaf, encodeProof(prs[i])))
			events++
		}
		list.add(r.leaf)
	}
	var cons []exportConsistency
	for _, m := range normSizes(f.consistency) {
		pr, err := tlog.ConsistencyProof(context.Background(), f.tree, f.sel.Org, m, n)
		require.NoError(t, err)
		cons = append(cons, exportConsistency{Kind: KindConsistency, Size: m, Root: base64.StdEncoding.EncodeToString(f.tree.root(m)), Proof: encodeProof(pr)})
	}
	require.NoError(t, xw.trailer(cons, &list, func(h string) exportManifest {
		return signManifest(f.key, f.db, f.sel, &f.cp, normSizes(f.consistency), events, gaps, h)
	}))
	return buf.Bytes()
}

func verifyBytes(t testing.TB, b []byte, opt ExportVerifyOptions) ExportReport {
	t.Helper()
	rep, err := VerifyExport(context.Background(), bytes.NewReader(b), int64(len(b)), opt)
	require.NoError(t, err)
	return rep
}

// lines splits an NDJSON export into its lines, newlines kept.
func lines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return append(out, b)
		}
		out = append(out, b[:i+1])
		b = b[i+1:]
	}
	return out
}

func join(ls [][]byte) []byte { return bytes.Join(ls, nil) }

func exportKinds(rep ExportReport) []string {
	var out []string
	for _, p := range rep.Problems {
		out = append(out, p.Kind)
	}
	return out
}

func problemsOf(rep ExportReport, kind string) []ExportProblem {
	var out []ExportProblem
	for _, p := range rep.Problems {
		if p.Kind == kind {
			out = append(out, p)
		}
	}
	return out
}

func TestExportVerifyHappy(t *testing.T) {
	f := newExportFixture(t, 40)
	f.extra = 7
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		for _, chunk := range []int{0, 3, 40, 41} {
			t.Run(fmt.Sprintf("%s/chunk=%d", enc, chunk), func(t *testing.T) {
				rep := verifyBytes(t, b, f.opts(chunk))
				require.True(t, rep.OK(), "%+v", rep.Problems)
				assert.Equal(t, int64(40), rep.Events)
				assert.Zero(t, rep.Gaps)
				assert.Equal(t, "org-a", rep.Org)
				assert.Equal(t, uint64(40+13+7), rep.Size)
				assert.Equal(t, f.prefix, rep.OriginPrefix)
				assert.Equal(t, tlog.KeyID(f.pub()), rep.KeyID)
				assert.Equal(t, enc, rep.Encoding)
			})
		}
	}
	// The index records are the same bytes whatever the encoding: the manifests sign the
	// same hash.
	var hashes []string
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		sc := NewExportScanner(enc)
		_, _ = sc.Write(b)
		require.True(t, sc.Complete())
		assert.Equal(t, uint64(40), sc.Events)
		m, err := ParseExportManifest(enc, sc.Manifest)
		require.NoError(t, err)
		assert.Equal(t, uint64(40), m.Events)
		obj, err := object(enc, sc.Manifest)
		require.NoError(t, err)
		var man exportManifest
		require.NoError(t, strict(obj, &man))
		hashes = append(hashes, man.IndexSHA256)
	}
	assert.Equal(t, hashes[0], hashes[1])
	// Proofs stay small: at most log2(size) hashes.
	for _, l := range lines(f.build(t, EncodingNDJSON)) {
		if k, err := ExportEventKey(EncodingNDJSON, l); err == nil {
			assert.NotEmpty(t, k.ID)
		}
	}
}

// Values CSV and JSON cannot carry as they are, and the ones that trip CSV readers,
// come back byte for byte: the leaf of every line is recomputed from them.
func TestExportVerifyAwkwardData(t *testing.T) {
	f := newExportFixture(t, 0)
	awkward := []string{
		"plain", "", `with "quotes" inside`, "comma, separated", "new\nline", "crlf\r\nline", "lone\rcr", "\"", "\"\"",
		"  leading space", "trailing space  ", "\\.", "\x00nul\x00", "tab\tsep", "\xff\xfe not utf-8", "é ü 日本 🙂",
		"\u2028\u2029", "<script>&amp;</script>", "line\n\"quoted\"\n,", "\n", "\r", "a\x7fdel", strings.Repeat("x", 70_000),
	}
	for i, d := range awkward {
		r := exportRow(fmt.Sprintf("odd-%02d", i), "message.created", exportBase.Add(time.Duration(i)*time.Second), d)
		r.ActorHandle = d // every string column goes through the same encoding
		r.SubjectID = d
		f.rows = append(f.rows, r)
	}
	// An id with a comma, a quote and a newline (a row written by hand may hold
	// anything), and a gap whose id is not UTF-8.
	f.rows = append(f.rows, exportRow("id,with\"odd\nchars", "message.created", exportBase.Add(time.Minute), "x"))
	f.gaps = append(f.gaps, exportRow("gap-\xff", "message.created", exportBase.Add(2*time.Minute), "x"))
	f.marks["gap-\xff"] = MarkMissing
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		t.Run(enc, func(t *testing.T) {
			b := f.build(t, enc)
			rep := verifyBytes(t, b, f.opts(0))
			assert.Equal(t, []string{ExportMissing}, exportKinds(rep), "%+v", rep.Problems)
			assert.Equal(t, int64(len(f.rows)), rep.Events)
			sc := NewExportScanner(enc)
			for p := b; len(p) > 0; { // fed in odd pieces, as a network delivers them
				n := min(len(p), 1+mrand.IntN(97))
				_, _ = sc.Write(p[:n])
				p = p[n:]
			}
			assert.True(t, sc.Complete())
			assert.Equal(t, uint64(len(f.rows)), sc.Events)
			assert.Equal(t, uint64(1), sc.Gaps)
			last, err := ExportEventKey(enc, sc.LastEvent)
			require.NoError(t, err)
			assert.Equal(t, "id,with\"odd\nchars", last.ID)
		})
	}
}

// reencode is the NDJSON line of row at leaf with proof.
func reencode(t testing.TB, r store.EventRow, leaf uint64, proof string) []byte {
	t.Helper()
	ev := eventRecord(&r, leaf, proof, EncodingNDJSON)
	out, err := newEncoder(EncodingNDJSON).event(&ev)
	require.NoError(t, err)
	return bytes.Clone(out)
}

// lineEvent decodes an NDJSON event line.
func lineEvent(t testing.TB, l []byte) exportEvent {
	t.Helper()
	var ev exportEvent
	require.NoError(t, strict(bytes.TrimSuffix(l, []byte("\n")), &ev))
	return ev
}

func TestExportVerifyNamesTampering(t *testing.T) {
	f := newExportFixture(t, 30)
	b := f.build(t, EncodingNDJSON)
	ls := lines(b)
	require.True(t, verifyBytes(t, b, f.opts(0)).OK())
	// Line 1 is the header; the event of line n is f.rows[n-2].
	ev := func(line int) exportEvent { return lineEvent(t, ls[line-1]) }

	t.Run("changed", func(t *testing.T) {
		r := f.rows[10]
		r.Data = `{"content":"I never said that"}`
		c := slices.Clone(ls)
		c[11] = reencode(t, r, ev(12).Leaf, ev(12).Proof) // line 12
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportChanged}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(12), rep.Problems[0].Line)
		assert.Equal(t, "ev-010", rep.Problems[0].ID)
		assert.Equal(t, ev(12).Leaf, *rep.Problems[0].Leaf)
		assert.Contains(t, rep.Problems[0].Reason, fmt.Sprintf("is not leaf %d of the log at size %d", ev(12).Leaf, f.cp.Size))
	})
	t.Run("bookkeeping changed", func(t *testing.T) {
		r := f.rows[3]
		r.IngestedAt = r.IngestedAt.Add(-time.Hour)
		c := slices.Clone(ls)
		c[4] = reencode(t, r, ev(5).Leaf, ev(5).Proof)
		assert.Equal(t, []string{ExportChanged}, exportKinds(verifyBytes(t, join(c), f.opts(0))))
	})
	t.Run("flipped proof byte", func(t *testing.T) {
		e := ev(8)
		raw, err := base64.StdEncoding.DecodeString(e.Proof)
		require.NoError(t, err)
		raw[len(raw)/2] ^= 1
		c := slices.Clone(ls)
		c[7] = reencode(t, f.rows[6], e.Leaf, base64.StdEncoding.EncodeToString(raw))
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportChanged}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(8), rep.Problems[0].Line)
	})
	t.Run("leaf index edited", func(t *testing.T) {
		e := ev(9)
		c := slices.Clone(ls)
		c[8] = reencode(t, f.rows[7], e.Leaf^1, e.Proof)
		rep := verifyBytes(t, join(c), f.opts(0))
		// The proof fails at the other index, the index records miss it and list the
		// real one.
		assert.ElementsMatch(t, []string{ExportChanged, ExportAdded, ExportDropped}, exportKinds(rep), "%+v", rep.Problems)
	})
	t.Run("dropped", func(t *testing.T) {
		for _, chunk := range []int{0, 4} {
			c := append(slices.Clone(ls[:14]), ls[15:]...) // line 15
			rep := verifyBytes(t, join(c), f.opts(chunk))
			// The manifest counts 30 events, the file 29; the index says which.
			require.Equal(t, []string{ExportDropped, ExportManifest}, exportKinds(rep), "chunk %d: %+v", chunk, rep.Problems)
			assert.Equal(t, int64(15), rep.Problems[0].Line, "the line it belonged at")
			assert.Equal(t, ev(15).Leaf, *rep.Problems[0].Leaf)
			assert.Contains(t, rep.Problems[0].Reason, fmt.Sprintf("leaf %d, the 14-th line or gap of the export, is missing", ev(15).Leaf))
			assert.Contains(t, rep.Problems[1].Reason, "counts 30 events and 0 gaps, the file holds 29 and 0")
		}
		// The last line dropped belongs before the trailer, now at line 31.
		c := append(slices.Clone(ls[:30]), ls[31:]...)
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, ExportDropped, rep.Problems[0].Kind, "%+v", rep.Problems)
		assert.Equal(t, int64(31), rep.Problems[0].Line)
	})
	t.Run("added forged", func(t *testing.T) {
		extra := reencode(t, exportRow("ev-999", "message.created", f.rows[20].Time.Add(time.Millisecond), `{"content":"forged"}`), ev(22).Leaf, ev(22).Proof)
		c := append(append(slices.Clone(ls[:22]), extra), ls[22:]...) // after ev-020, line 22
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportChanged, ExportAdded, ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(23), rep.Problems[0].Line)
		assert.Equal(t, "ev-999", rep.Problems[0].ID)
		assert.Contains(t, rep.Problems[1].Reason, "repeats leaf")
	})
	t.Run("added real event of another selection", func(t *testing.T) {
		// A genuine leaf of the log the lists leave out, with its genuine proof: its
		// proof holds, but it is outside the selection and in no index record.
		other := f.others[1] // tool-001, at 2 s
		var leaf uint64
		for i, h := range f.tree.leaves {
			lf := tlog.LeafOf(&other)
			if bytes.Equal(h, lf.Hash()) {
				leaf = uint64(i)
			}
		}
		pr, err := tlog.InclusionProofs(context.Background(), f.tree, "org-a", []uint64{leaf}, f.cp.Size)
		require.NoError(t, err)
		extra := reencode(t, other, leaf, encodeProof(pr[0]))
		c := append(append(slices.Clone(ls[:3]), extra), ls[3:]...) // between ev-001 (1.3 s) and ev-002 (2.7 s)
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportSelection, ExportAdded, ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(4), rep.Problems[0].Line)
		assert.Contains(t, rep.Problems[0].Reason, `type "tool.called" is not one of the export's types`)
		assert.Contains(t, rep.Problems[1].Reason, "is in no index record of the export: the line was added")
	})
	t.Run("moved out of order", func(t *testing.T) {
		c := slices.Clone(ls)
		c[5], c[6] = c[6], c[5]
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportOrder}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(7), rep.Problems[0].Line)
		assert.Equal(t, "ev-004", rep.Problems[0].ID)
	})
	t.Run("duplicated", func(t *testing.T) {
		c := append(append(slices.Clone(ls[:8]), ls[7]), ls[8:]...)
		rep := verifyBytes(t, join(c), f.opts(0))
		assert.ElementsMatch(t, []string{ExportOrder, ExportAdded, ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
		assert.Contains(t, problemsOf(rep, ExportAdded)[0].Reason, "repeats leaf")
	})
	t.Run("non-canonical", func(t *testing.T) {
		c := slices.Clone(ls)
		c[4] = bytes.Replace(c[4], []byte(`"kind":"event",`), []byte(`"kind":"event", `), 1)
		c[5] = bytes.Replace(c[5], []byte(`,"data":`), []byte(`,"data":"x","data":`), 1) // a duplicate key
		rep := verifyBytes(t, join(c), f.opts(0))
		m := problemsOf(rep, ExportMalformed)
		require.Len(t, m, 2, "%+v", rep.Problems)
		assert.Equal(t, int64(5), m[0].Line)
		assert.Equal(t, int64(6), m[1].Line)
		assert.Len(t, problemsOf(rep, ExportDropped), 2, "an unreadable line is not its event")
	})
	t.Run("forged manifest", func(t *testing.T) {
		// The whole export rebuilt and signed with another key, lines dropped to match:
		// the checkpoint is not the key's, and neither is the manifest.
		g := *f
		g.key = testKey(t)
		g.rows = f.rows[:20]
		rep := verifyBytes(t, g.build(t, EncodingNDJSON), f.opts(0))
		assert.Equal(t, []string{ExportCheckpoint}, exportKinds(rep), "%+v", rep.Problems)
		assert.Contains(t, rep.Problems[0].Reason, "the checkpoint does not verify: no key of the ring")
		// The manifest's counts edited: its signature fails.
		edited := bytes.Replace(b, []byte(`"events":30,"gaps"`), []byte(`"events":29,"gaps"`), 1)
		rep = verifyBytes(t, edited, f.opts(0))
		require.NotEmpty(t, problemsOf(rep, ExportManifest), "%+v", rep.Problems)
		assert.Contains(t, problemsOf(rep, ExportManifest)[0].Reason, "signature does not verify")
		// The manifest re-signed with another key over the true counts.
		other := testKey(t)
		m := ls[len(ls)-1]
		var man exportManifest
		require.NoError(t, strict(bytes.TrimSuffix(m, []byte("\n")), &man))
		forged := signManifest(other, f.db, f.sel, &f.cp, nil, man.Events, man.Gaps, man.IndexSHA256)
		obj, err := newEncoder(EncodingNDJSON).object(forged)
		require.NoError(t, err)
		c := append(slices.Clone(ls[:len(ls)-1]), append(bytes.Clone(obj), '\n'))
		rep = verifyBytes(t, join(c), f.opts(0))
		assert.Equal(t, []string{ExportCheckpoint}, exportKinds(rep), "%+v", rep.Problems)
		assert.Contains(t, rep.Problems[0].Reason, "is signed with key "+tlog.KeyID(pubOf(other)))
	})
	t.Run("header edited", func(t *testing.T) {
		edited := bytes.Replace(b, []byte(`"types":["message.created"]`), []byte(`"types":[]`), 1)
		rep := verifyBytes(t, edited, f.opts(0))
		require.NotEmpty(t, problemsOf(rep, ExportManifest), "%+v", rep.Problems)
		assert.Contains(t, problemsOf(rep, ExportManifest)[0].Reason, "differ from the header's")
	})
	t.Run("index edited", func(t *testing.T) {
		// Two entries of the index swapped: the order the server signed is not the file's.
		c := slices.Clone(ls)
		i := len(c) - 2
		var x exportIndex
		require.NoError(t, strict(bytes.TrimSuffix(c[i], []byte("\n")), &x))
		x.Leaves[0], x.Leaves[1] = x.Leaves[1], x.Leaves[0]
		obj, err := newEncoder(EncodingNDJSON).object(x)
		require.NoError(t, err)
		c[i] = append(bytes.Clone(obj), '\n')
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
		assert.Contains(t, rep.Problems[0].Reason, "index hash")
	})
	t.Run("another key", func(t *testing.T) {
		rep := verifyBytes(t, b, ExportVerifyOptions{Anchors: []ed25519.PublicKey{pubOf(testKey(t))}})
		assert.False(t, rep.OK())
		require.Len(t, rep.Problems, 1, "%+v", rep.Problems)
		assert.Contains(t, rep.Problems[0].Reason, "no line of the export can be checked")
		assert.Empty(t, problemsOf(rep, ExportChanged), "one problem, not one per line")
	})
	t.Run("another deployment", func(t *testing.T) {
		rep := verifyBytes(t, b, ExportVerifyOptions{Anchors: []ed25519.PublicKey{f.pub()}, Prefix: "bandplane/staging"})
		assert.Equal(t, []string{ExportCheckpoint}, exportKinds(rep))
		assert.Contains(t, rep.Problems[0].Reason, `the checkpoint is of the deployment "bandplane/bandplane", not of "bandplane/staging"`)
	})
}

func TestExportVerifyCSVTampering(t *testing.T) {
	f := newExportFixture(t, 12)
	f.rows[4].Data = "multi\nline \"quoted\", data"
	b := f.build(t, EncodingCSV)
	require.True(t, verifyBytes(t, b, f.opts(0)).OK())
	// The data of the fifth event spans two lines of the file: lines are counted as the
	// file shows them.
	changed := bytes.Replace(b, []byte(`multi`), []byte(`MULTI`), 1)
	rep := verifyBytes(t, changed, f.opts(0))
	require.Equal(t, []string{ExportChanged}, exportKinds(rep), "%+v", rep.Problems)
	assert.Equal(t, "ev-004", rep.Problems[0].ID)
	assert.Equal(t, int64(7), rep.Problems[0].Line, "row 1 the columns, 2 the header")
	// A field cut so that a quote is left open swallows the rest: not CSV any more.
	broken := bytes.Replace(b, []byte(`"multi`), []byte(`"mul"ti`), 1)
	rep = verifyBytes(t, broken, f.opts(0))
	assert.Contains(t, exportKinds(rep), ExportMalformed)
	// Another column row.
	rep = verifyBytes(t, append([]byte("kind,id\n"), b[bytes.IndexByte(b, '\n')+1:]...), f.opts(0))
	assert.Equal(t, []string{ExportMalformed}, exportKinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "not a bandplane CSV export")
	// An event row with a field too many.
	extra := bytes.Replace(b, []byte("ev-002,message.created"), []byte("ev-002,message.created,surplus"), 1)
	rep = verifyBytes(t, extra, f.opts(0))
	assert.Contains(t, exportKinds(rep), ExportMalformed)
}

func TestExportVerifyHostileFiles(t *testing.T) {
	f := newExportFixture(t, 10)
	f.gaps = []store.EventRow{exportRow("gone", "message.created", exportBase.Add(5*time.Second), "{}")}
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		t.Run(enc+"/truncated everywhere", func(t *testing.T) {
			// Cut at every offset: never a panic, never OK, always truncated (or, cut
			// inside the first record, not an export at all).
			for n := 0; n < len(b); n += 1 + n/60 {
				rep := verifyBytes(t, b[:n], f.opts(3))
				require.False(t, rep.OK(), "cut at %d", n)
				k := exportKinds(rep)
				require.True(t, slices.Contains(k, ExportTruncated) || slices.Contains(k, ExportMalformed), "cut at %d: %+v", n, rep.Problems)
			}
		})
		t.Run(enc+"/garbage", func(t *testing.T) {
			ls := lines(b)
			for _, g := range []string{"garbage\n", "{}\n", "{\"kind\":\"event\"}\n", "\n", "{\"kind\":\"gap\",\"leaf\":\"x\"}\n", "\x00\x01\x02\n",
				"{\"kind\":\"header\",\"format\":\"bandplane.export.v2\"}\n", "[1,2,3]\n", "{\"kind\":\"index\",\"first\":0,\"leaves\":[99999999]}\n",
				"{\"kind\":\"consistency\",\"size\":1,\"root\":\"\",\"proof\":\"\"}\n"} {
				for _, at := range []int{3, len(ls) - 3, len(ls) - 1} {
					if g == "\n" && enc == EncodingCSV {
						continue // CSV readers skip blank lines: it adds nothing
					}
					c := append(append(slices.Clone(ls[:at]), []byte(g)), ls[at:]...)
					rep := verifyBytes(t, join(c), f.opts(0))
					require.False(t, rep.OK(), "%q at %d", g, at)
				}
			}
			for _, g := range []string{"", "garbage", "\xff\xfe", "{", strings.Repeat("{", 10000), "kind,id,type\n", "{\"kind\":\"event\"}\n"} {
				rep := verifyBytes(t, []byte(g), f.opts(0))
				require.False(t, rep.OK(), "%q", g)
			}
		})
		t.Run(enc+"/huge line", func(t *testing.T) {
			ls := lines(b)
			huge := []byte(`{"kind":"event","id":"` + strings.Repeat("a", MaxExportLineBytes) + "\"}\n")
			if enc == EncodingCSV {
				huge = []byte("event," + strings.Repeat("a", MaxExportLineBytes) + "\n")
			}
			c := append(append(slices.Clone(ls[:3]), huge), ls[3:]...)
			rep := verifyBytes(t, join(c), f.opts(0))
			require.False(t, rep.OK())
			m := problemsOf(rep, ExportMalformed)
			require.NotEmpty(t, m)
			assert.Contains(t, m[0].Reason, "more than an export writes")
			if enc == EncodingNDJSON {
				// The line is skipped; the rest of the file is still checked.
				assert.Equal(t, int64(10), rep.Events)
				assert.Equal(t, []string{ExportMalformed, ExportMissing}, exportKinds(rep), "%+v", rep.Problems)
			}
		})
	}
	t.Run("a proof of too many hashes", func(t *testing.T) {
		b := f.build(t, EncodingNDJSON)
		ls := lines(b)
		e := lineEvent(t, ls[2])
		c := slices.Clone(ls)
		c[2] = reencode(t, f.rows[1], e.Leaf, base64.StdEncoding.EncodeToString(make([]byte, 65*32)))
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Contains(t, exportKinds(rep), ExportChanged)
		assert.Contains(t, problemsOf(rep, ExportChanged)[0].Reason, "more than 64 hashes")
	})
	t.Run("many problems", func(t *testing.T) {
		// Every event line dropped: one problem each, listed up to the cap.
		g := newExportFixture(t, 0)
		for i := range 2500 {
			g.rows = append(g.rows, exportRow(fmt.Sprintf("e-%05d", i), "message.created", exportBase.Add(time.Duration(i)*time.Millisecond), "{}"))
		}
		b := g.build(t, EncodingNDJSON)
		ls := lines(b)
		c := append([][]byte{ls[0]}, ls[1+2500:]...)
		rep := verifyBytes(t, join(c), g.opts(0))
		assert.Len(t, rep.Problems, MaxExportProblems)
		assert.Positive(t, rep.MoreProblems)
	})
}

func TestExportVerifyGaps(t *testing.T) {
	f := newExportFixture(t, 10)
	f.gaps = []store.EventRow{
		exportRow("deleted-1", "message.created", exportBase.Add(30*time.Second), "{}"),
		exportRow("edited-1", "tool.called", exportBase.Add(40*time.Second), "{}"),
	}
	f.marks = map[string]string{"edited-1": MarkModified}
	b := f.build(t, EncodingNDJSON)
	rep := verifyBytes(t, b, f.opts(0))
	require.Equal(t, []string{ExportMissing, ExportModified}, exportKinds(rep), "%+v", rep.Problems)
	assert.Equal(t, "deleted-1", rep.Problems[0].ID)
	assert.Contains(t, rep.Problems[0].Reason, "is gone from the trail")
	assert.Contains(t, rep.Problems[1].Reason, "is stored with other content")
	assert.Equal(t, int64(2), rep.Gaps)
	assert.Contains(t, string(b), `"mark":"missing"`)

	// A gap's proof is checked like a line's: its digest cannot be swapped for another.
	tampered := bytes.Replace(b, []byte(`"mark":"missing"`), []byte(`"mark":"expired"`), 1)
	rep = verifyBytes(t, tampered, f.opts(0))
	assert.Contains(t, exportKinds(rep), ExportExpired, "an expired mark with no cut")

	// Under a retention cut signed with the audit key for this deployment, made after
	// the rows were written and covering their time, the same gaps are expired.
	f.marks = map[string]string{"deleted-1": MarkExpired, "edited-1": MarkExpired}
	cut := chdb.Cut{Table: "events", Before: exportBase.Add(time.Hour), At: exportBase.Add(2 * time.Hour), Partitions: 1}
	CutSigner(f.key, f.db, f.prefix)(&cut)
	f.cuts = []chdb.Cut{cut}
	b = f.build(t, EncodingCSV)
	rep = verifyBytes(t, b, f.opts(0))
	require.True(t, rep.OK(), "%+v", rep.Problems)
	assert.Equal(t, int64(2), rep.Expired)
	// A cut signed for another database excuses nothing here, nor one made before the
	// rows were written, nor one signed by another key.
	for name, c := range map[string]chdb.Cut{
		"another database": func() chdb.Cut { c := cut; CutSigner(f.key, "staging", f.prefix)(&c); return c }(),
		"made before": func() chdb.Cut {
			c := cut
			c.At = exportBase.Add(-time.Hour)
			CutSigner(f.key, f.db, f.prefix)(&c)
			return c
		}(),
		"another key": func() chdb.Cut { c := cut; CutSigner(testKey(t), f.db, f.prefix)(&c); return c }(),
	} {
		f.cuts = []chdb.Cut{c}
		rep = verifyBytes(t, f.build(t, EncodingNDJSON), f.opts(0))
		assert.Equal(t, []string{ExportExpired, ExportExpired}, exportKinds(rep), "%s: %+v", name, rep.Problems)
	}
}

// A row key with a line and leaves no stored copy matches (a sealed copy moved in
// ClickHouse, then noted again as a second leaf): its gaps come first, in leaf order,
// then its line; the verifier takes that order, reports each gap, and refuses any
// other order of the key's records.
func TestExportVerifyGapsBesideTheirLine(t *testing.T) {
	f := newExportFixture(t, 10)
	moved := func(d time.Duration) store.EventRow {
		r := f.rows[4]
		r.IngestedAt = r.IngestedAt.Add(-d)
		return r
	}
	f.gaps = []store.EventRow{moved(time.Hour), moved(2 * time.Hour)}
	f.marks = map[string]string{f.rows[4].ID: MarkModified}
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		rep := verifyBytes(t, b, f.opts(0))
		require.Equal(t, []string{ExportModified, ExportModified}, exportKinds(rep), "%s: %+v", enc, rep.Problems)
		assert.Equal(t, f.rows[4].ID, rep.Problems[0].ID)
		assert.NotEqual(t, *rep.Problems[0].Leaf, *rep.Problems[1].Leaf, "a gap per leaf")
		assert.Equal(t, int64(10), rep.Events)
		assert.Equal(t, int64(2), rep.Gaps)
	}

	// NDJSON: line 1 is the header, lines 2–5 the first events; the key's two gaps are
	// lines 6 and 7, its line 8.
	b := f.build(t, EncodingNDJSON)
	ls := lines(b)
	require.Contains(t, string(ls[5]), `"kind":"gap"`)
	require.Contains(t, string(ls[6]), `"kind":"gap"`)
	require.Contains(t, string(ls[7]), `"kind":"event"`)
	require.Contains(t, string(ls[7]), f.rows[4].ID)
	swap := func(i, j int) []byte {
		c := slices.Clone(ls)
		c[i], c[j] = c[j], c[i]
		return join(c)
	}
	for name, tc := range map[string]struct {
		file []byte
		line int64
		want string
	}{
		"a gap after its line":   {swap(6, 7), 8, "follows the line of the same event"},
		"gaps out of leaf order": {swap(5, 6), 7, "an event's gaps are in leaf order"},
		"a line twice":           {join(append(slices.Clone(ls[:8]), ls[7:]...)), 9, "follows the line of the same event"},
	} {
		rep := verifyBytes(t, tc.file, f.opts(0))
		order := problemsOf(rep, ExportOrder)
		require.Len(t, order, 1, "%s: %+v", name, rep.Problems)
		assert.Equal(t, tc.line, order[0].Line, name)
		assert.Contains(t, order[0].Reason, tc.want, name)
	}
}

func TestExportVerifyConsistency(t *testing.T) {
	f := newExportFixture(t, 20)
	f.extra = 5
	f.consistency = []uint64{9, 31}
	b := f.build(t, EncodingNDJSON)
	signer, err := tlog.NewSigner(f.prefix, f.key)
	require.NoError(t, err)
	held := func(size uint64, root []byte) External {
		c, err := signer.Sign("org-a", size, root)
		require.NoError(t, err)
		return External{Source: fmt.Sprintf("auditor-%d.checkpoint", size), Note: c.Note}
	}
	opt := f.opts(0)
	opt.Checkpoints = []External{held(9, f.tree.root(9)), held(f.cp.Size, f.cp.Root)}
	rep := verifyBytes(t, b, opt)
	require.True(t, rep.OK(), "%+v", rep.Problems)
	assert.Equal(t, []string{"auditor-9.checkpoint (size 9)", "auditor-31.checkpoint (size 31)"}, rep.Consistent)

	for name, c := range map[string]struct {
		held External
		want string
	}{
		"forked":         {held(9, f.tree.root(8)), "is not extended by the export's log: forked"},
		"forked at size": {held(f.cp.Size, f.tree.root(9)), "forked: the log of"},
		"no record":      {held(12, f.tree.root(12)), "(size 12) has no consistency record in the export: export with --checkpoint auditor-12.checkpoint"},
		"rolled back":    {held(40, f.tree.root(9)), "has 40 leaves, the export's checkpoint 31: the log was rolled back, or export with as_of ≥ 40"},
		"another key":    {External{Source: "x", Note: []byte("not a note")}, "does not verify"},
		"another org log": {func() External {
			c, _ := signer.Sign("org-b", 9, f.tree.root(9))
			return External{Source: "b", Note: c.Note}
		}(), "is of the log"},
	} {
		t.Run(name, func(t *testing.T) {
			opt := f.opts(0)
			opt.Checkpoints = []External{c.held}
			rep := verifyBytes(t, b, opt)
			require.Len(t, rep.Problems, 1, "%+v", rep.Problems)
			assert.Contains(t, rep.Problems[0].Reason, c.want)
		})
	}
	// A consistency record edited: its proof does not hold.
	ls := lines(b)
	for i, l := range ls {
		if bytes.HasPrefix(l, []byte(`{"kind":"consistency","size":9,`)) {
			ls[i] = bytes.Replace(l, []byte(`"root":"`), []byte(`"root":"A`), 1)
			ls[i] = append(bytes.Clone(ls[i][:len(`{"kind":"consistency","size":9,"root":"`)+43]), ls[i][len(`{"kind":"consistency","size":9,"root":"`)+44:]...)
		}
	}
	rep = verifyBytes(t, join(ls), opt)
	assert.Contains(t, exportKinds(rep), ExportConsistency, "%+v", rep.Problems)
}

// A checkpoint signed by a key that took over from the first one: a verifier anchored
// at either follows the header's rotation record.
func TestExportVerifyAcrossARotation(t *testing.T) {
	f := newExportFixture(t, 5)
	first := f.key
	next := testKey(t)
	rec, err := tlog.Rotation(f.prefix, first, next, time.Now().Add(-time.Minute))
	require.NoError(t, err)
	f.key, f.rotations = next, [][]byte{rec}
	b := f.build(t, EncodingNDJSON)
	for name, anchor := range map[string]ed25519.PrivateKey{"the first key": first, "the current key": next} {
		rep := verifyBytes(t, b, ExportVerifyOptions{Anchors: []ed25519.PublicKey{pubOf(anchor)}})
		assert.True(t, rep.OK(), "%s: %+v", name, rep.Problems)
		assert.Equal(t, tlog.KeyID(pubOf(next)), rep.CheckpointKey)
	}
	// Without the record, the first key alone trusts nothing of the new one.
	f.rotations = nil
	rep := verifyBytes(t, f.build(t, EncodingNDJSON), ExportVerifyOptions{Anchors: []ed25519.PublicKey{pubOf(first)}})
	assert.Contains(t, exportKinds(rep), ExportCheckpoint)
}

func TestParseExportRequest(t *testing.T) {
	q := func(s string) url.Values {
		v, err := url.ParseQuery(s)
		require.NoError(t, err)
		return v
	}
	req, err := ParseExportRequest(q("org=o&from=2026-03-01&to=2026-03-02T00:00:00.5Z&types=b,a&types=a&actors=x&rooms=r1,r2&format=csv&as_of=42&consistency=7,3&consistency=7"))
	require.NoError(t, err)
	assert.Equal(t, Selection{Org: "o", From: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2026, 3, 2, 0, 0, 0, 5e8, time.UTC),
		Types: []string{"a", "b"}, Actors: []string{"x"}, Rooms: []string{"r1", "r2"}}, req.Selection)
	assert.Equal(t, EncodingCSV, req.Encoding)
	assert.Equal(t, uint64(42), req.AsOf)
	assert.Equal(t, []uint64{3, 7}, req.Consistency)
	req, err = ParseExportRequest(q("from=2026-03-01&to=2026-03-02"))
	require.NoError(t, err, "the organization may come from the key")
	assert.Equal(t, EncodingNDJSON, req.Encoding)
	assert.Empty(t, req.Selection.Org)
	// Values gives the request back.
	for _, r := range []ExportRequest{req, {Selection: req.Selection, Encoding: EncodingCSV, AsOf: 9, Consistency: []uint64{1, 9}}} {
		r.Selection.Org = "o"
		back, err := ParseExportRequest(r.Values())
		require.NoError(t, err)
		assert.Equal(t, r, back)
	}

	long := strings.Repeat("r", 257)
	var distinct []string
	for i := range 101 {
		distinct = append(distinct, fmt.Sprint("t", i))
	}
	many := strings.Join(distinct, ",")
	ok := "from=2026-03-01&to=2026-03-02"
	for _, tc := range []struct{ query, want string }{
		{"", "from: required"},
		{"from=2026-03-01", "to: required"},
		{"from=2026-03-02&to=2026-03-01", "to: must be after from"},
		{"from=2026-03-01&to=2026-03-01", "to: must be after from"},
		{"from=2020-01-01&to=2026-01-01", "spans more than 401 days"},
		{"from=1969-12-31&to=1970-01-02", "from: 1969-12-31T00:00:00.000Z is outside the times"},
		{"from=yesterday&to=2026-01-01", `from: "yesterday" is neither RFC 3339 nor YYYY-MM-DD`},
		{"from=2026-03-01&from=2026-03-02&to=2026-04-01", "from: given 2 times"},
		{ok + "&types=" + many, "types: 101 values; at most 100"},
		{ok + "&rooms=" + long, "rooms: a value of 257 bytes is longer than 256 bytes"},
		{ok + "&types=" + strings.Repeat("t", 65), "types: a value of 65 bytes is longer than 64 bytes"},
		{ok + "&actors=a%00b", `actors: "a\x00b" has a control character at byte 1`},
		{ok + "&actors=%ff", "actors: a value of 1 bytes is not valid UTF-8"},
		{ok + "&actors=a,,b", "actors: an empty value"},
		{ok + "&org=", "org: empty"},
		{ok + "&org=*", "org: '*' is not an organization"},
		{ok + "&format=xml", `format: "xml" is not ndjson or csv`},
		{ok + "&type=x", `unknown parameter "type"`},
		{ok + "&as_of=2026-03-01T00:00:00Z", `as_of: want a log size (a whole number, as in an export's header or a checkpoint), got "2026-03-01T00:00:00Z"`},
		{ok + "&as_of=0", "as_of: 0 is not the size of a checkpoint"},
		{ok + "&as_of=-1", "as_of: want a log size"},
		{ok + "&as_of=007", "as_of: want a log size"},
		{ok + "&as_of=18446744073709551616", "as_of: want a log size"},
		{ok + "&as_of=1&as_of=2", "as_of: given 2 times"},
		{ok + "&consistency=1,2,3,4,5,6,7,8,9", "consistency: 9 values; at most 8"},
		{ok + "&consistency=1&consistency=2,3,4,5,6,7,8&consistency=9", "consistency: 9 values; at most 8"},
		{ok + "&consistency=x", "consistency: want a log size"},
		{ok + "&consistency=0", "consistency: 0 is not the size of a checkpoint"},
		{ok + "&consistency=", "consistency: want a log size"},
		{ok + "&after=x2", "after: malformed cursor"},
		{ok + "&after=" + Cursor{Events: 0}.String(), "after: needs as_of"},
		{ok + "&after=" + strings.Repeat("A", 3000), "after: the cursor is 3000 bytes"},
	} {
		_, err := ParseExportRequest(q(tc.query))
		require.Error(t, err, tc.query)
		assert.Contains(t, err.Error(), tc.want, tc.query)
	}
	// Every problem at once.
	_, err = ParseExportRequest(q("format=xml&types=" + long + "&nope=1&as_of=x"))
	require.Error(t, err)
	for _, want := range []string{"format:", "types:", `unknown parameter "nope"`, "from: required", "as_of:"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestExportCursor(t *testing.T) {
	f := newExportFixture(t, 3)
	f.consistency = []uint64{2}
	b := f.build(t, EncodingNDJSON)
	h, err := ParseExportHeader(EncodingNDJSON, lines(b)[0])
	require.NoError(t, err)
	c, err := NewCursor(&h, 42, exportBase.Add(1500*time.Millisecond), "ev:with:colons")
	require.NoError(t, err)
	back, err := DecodeCursor(c.String())
	require.NoError(t, err)
	assert.Equal(t, c, back)
	sel := f.sel
	assert.Equal(t, binding(sel, EncodingNDJSON, h.Checkpoint, []uint64{2}), c.Bind)
	assert.NotEqual(t, binding(sel, EncodingCSV, h.Checkpoint, []uint64{2}), c.Bind, "bound to the encoding")
	other := sel
	other.Types = []string{"y"}
	assert.NotEqual(t, binding(other, EncodingNDJSON, h.Checkpoint, []uint64{2}), c.Bind, "bound to the selection")
	assert.NotEqual(t, binding(sel, EncodingNDJSON, h.Checkpoint+" ", []uint64{2}), c.Bind, "bound to the checkpoint")
	assert.NotEqual(t, binding(sel, EncodingNDJSON, h.Checkpoint, nil), c.Bind, "bound to the consistency sizes")
	req, err := h.Request(&c)
	require.NoError(t, err)
	assert.Equal(t, f.cp.Size, req.AsOf)
	assert.Equal(t, []uint64{2}, req.Consistency)
	start, err := NewCursor(&h, 0, time.Time{}, "")
	require.NoError(t, err)
	back, err = DecodeCursor(start.String())
	require.NoError(t, err)
	assert.Equal(t, start, back)
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, bad := range []string{"", "!!!", enc("x1:0000000000000000:1:0:a"), enc("x2:00:1:0:a"), enc("x2:0000000000000000:-1:0:a"),
		enc("x2:0000000000000000:01:0:a"), enc("x2:0000000000000000:1:x:a"), enc("x2:0000000000000000:1:0:"), enc("x2:0000000000000000:0:5:"),
		enc("x2:0000000000000000:1:0:a\nb"), enc("x2:0000000000000000:1:99999999999999999:a"), enc("x2:0000000000000000:1:0:" + strings.Repeat("a", 300))} {
		_, err := DecodeCursor(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// A file cut anywhere resumes from its last complete event: what the scanner keeps is
// exactly the prefix the server continues after.
func TestExportScannerResumePoint(t *testing.T) {
	f := newExportFixture(t, 25)
	f.rows[3].Data = "new\nline and \"quotes\""
	f.gaps = []store.EventRow{exportRow("gone", "message.created", f.rows[10].Time.Add(time.Millisecond), "{}")}
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		full := NewExportScanner(enc)
		_, _ = full.Write(b)
		require.True(t, full.Complete())
		require.Equal(t, uint64(25), full.Events)
		h, err := ParseExportHeader(enc, full.Header)
		require.NoError(t, err)
		assert.Equal(t, "org-a", h.Org)
		for n := 0; n <= len(b); n += 1 + mrand.IntN(40) {
			sc := NewExportScanner(enc)
			_, _ = sc.Write(b[:n])
			if sc.Complete() {
				assert.Equal(t, len(b), n)
				continue
			}
			if sc.Header == nil {
				continue // cut inside the header: a resume starts over
			}
			keep := sc.HeaderEnd
			if sc.Events > 0 {
				keep = sc.LastEventEnd
				key, err := ExportEventKey(enc, sc.LastEvent)
				require.NoError(t, err, "cut at %d", n)
				assert.Equal(t, f.rows[sc.Events-1].ID, key.ID, "cut at %d", n)
				assert.Equal(t, f.rows[sc.Events-1].Time, key.Time, "cut at %d", n)
			}
			prefix := NewExportScanner(enc)
			_, _ = prefix.Write(b[:keep])
			assert.Equal(t, sc.Events, prefix.Events, "cut at %d", n)
			assert.Equal(t, keep, prefix.LastEnd, "cut at %d", n)
		}
	}
}

func TestIndexList(t *testing.T) {
	var l indexList
	want := []uint64{5, 6, 7, 3, 1 << 40, 0, 1<<64 - 1, 2}
	for _, i := range want {
		l.add(i)
	}
	var got []uint64
	require.NoError(t, l.each(func(i uint64) error { got = append(got, i); return nil }))
	assert.Equal(t, want, got)
	assert.Equal(t, uint64(len(want)), l.n)
}

func TestExportConfigErrors(t *testing.T) {
	cfg := ExportConfig{Database: "bad-name", Key: []byte{1}, Prefix: "has space", WindowRows: -1, Anchors: []ed25519.PublicKey{{1}}}
	err := cfg.Validate()
	require.Error(t, err)
	for _, want := range []string{"no clickhouse connection", "not a plain identifier", "no Ed25519 private key", "--audit-origin", "anchor 1", "must not be negative"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = VerifyExport(context.Background(), bytes.NewReader(nil), 0, ExportVerifyOptions{})
	assert.ErrorContains(t, err, "no audit public key")
}

func TestLeafOrder(t *testing.T) {
	cases := [][2]struct {
		ms int64
		id string
	}{{{1, "b"}, {2, "a"}}, {{1, "a"}, {1, "b"}}}
	for _, c := range cases {
		assert.Equal(t, -1, leafOrder(c[0].ms, c[0].id, c[1].ms, c[1].id))
		assert.Equal(t, 1, leafOrder(c[1].ms, c[1].id, c[0].ms, c[0].id))
	}
	assert.Zero(t, leafOrder(1, "a", 1, "a"))
}

// appendEventJSON writes what encoding/json writes, on awkward and random values, and
// parseEventJSON reads it back.
func TestEventJSONIsEncodingJSON(t *testing.T) {
	values := []string{"", "plain", `"`, `\`, "\b\f\n\r\t", "\x00\x01\x1f\x7f", "<&>", "\u2028\u2029", "\xff\xfe", "é日本🙂", "a\\u0041", "\ufffd", "/"}
	r := mrand.New(mrand.NewPCG(3, 4))
	for range 2000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = byte(r.IntN(256))
			if r.IntN(3) == 0 {
				b[i] = "\"\\\n\x00\x7fé\u2028"[r.IntN(10)]
			}
		}
		values = append(values, string(b))
	}
	enc := newEncoder(EncodingNDJSON)
	var scratch []byte
	for i, v := range values {
		e := exportEvent{Kind: KindEvent, ID: v, Type: "t", Time: v, OrgID: "o", Data: v, ActorHandle: v, IngestedAt: "x",
			SchemaVersion: uint16(i), KafkaPartition: int32(-i), KafkaOffset: int64(i) << 40, Leaf: uint64(i) * 7, Proof: "p"}
		if i%3 == 0 {
			e.Base64 = []string{"id", v}
		}
		want, err := enc.object(&e)
		require.NoError(t, err)
		got := appendEventJSON(nil, &e)
		require.Equal(t, string(want), string(got), "value %q", v)
		var back exportEvent
		if utf8Valid(v) {
			require.True(t, parseEventJSON(got, &back, &scratch), "%q", got)
			assert.Equal(t, e, back)
		}
	}
	// Whatever parseEventJSON reads is canonical: bytes changed anywhere in a line are
	// refused, or read as values that give exactly the changed line back.
	line := appendEventJSON(nil, &exportEvent{Kind: KindEvent, ID: "a\"b\\c", Type: "t\u2028", Time: "x", Data: "é\x01\n<&>", Proof: "p", Base64: []string{"id"},
		SchemaVersion: 10, KafkaPartition: -3, KafkaOffset: 120, Leaf: 7})
	for i := range 20_000 {
		m := bytes.Clone(line)
		for range 1 + i%3 {
			const pick = "\\\"0u-9a\x00\xffn,]}"
			m[r.IntN(len(m))] = pick[r.IntN(len(pick))]
		}
		var back exportEvent
		if parseEventJSON(m, &back, &scratch) {
			require.Equal(t, string(m), string(appendEventJSON(nil, &back)), "a line read that is not canonical")
		}
	}
	// What the layout does not hold is refused, and left to encoding/json.
	var e exportEvent
	for _, bad := range []string{``, `{}`, `{"kind":"event"}`, `{"kind":"event","id":"a\/b"}`, `{"kind":"header","id":""}`,
		string(bytes.Replace(line, []byte(`"leaf":7`), []byte(`"leaf":07`), 1)), string(bytes.Replace(line, []byte(`\u2028`), []byte(`\u2029`+"\u2028"), 1)),
		string(bytes.Replace(line, []byte(`\u0001`), []byte(`\u0041`), 1)), string(bytes.Replace(line, []byte(`\n`), []byte(`\u000a`), 1))} {
		assert.False(t, parseEventJSON([]byte(bad), &e, &scratch), bad)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

// The proof cache never lets a wrong proof through: a byte flipped in any hash of the
// proof of a line whose neighbours verified first is named.
func TestExportVerifyProofCache(t *testing.T) {
	f := newExportFixture(t, 300)
	f.sel.Types = []string{}
	f.others = nil
	b := f.build(t, EncodingNDJSON)
	ls := lines(b)
	require.True(t, verifyBytes(t, b, f.opts(0)).OK())
	e := lineEvent(t, ls[150])
	raw, err := base64.StdEncoding.DecodeString(e.Proof)
	require.NoError(t, err)
	for h := range len(raw) / 32 {
		flipped := bytes.Clone(raw)
		flipped[h*32+5] ^= 0x40
		c := slices.Clone(ls)
		c[150] = reencode(t, f.rows[149], e.Leaf, base64.StdEncoding.EncodeToString(flipped))
		rep := verifyBytes(t, join(c), f.opts(0))
		require.Equal(t, []string{ExportChanged}, exportKinds(rep), "hash %d: %+v", h, rep.Problems)
		assert.Equal(t, int64(151), rep.Problems[0].Line)
	}
}

// decide matches each leaf of a row key with the stored copies on its own.
func TestExportDecide(t *testing.T) {
	sealed := exportRow("ev-1", "message.created", exportBase, `{"content":"as sealed"}`)
	leaf := func(i uint64, r store.EventRow) IndexedLeaf { return IndexedLeaf{Leaf: tlog.LeafOf(&r), Index: i} }
	at := func(r store.EventRow, d time.Duration) store.EventRow {
		r.IngestedAt = r.IngestedAt.Add(d)
		return r
	}
	edited := sealed
	edited.Data = `{"content":"rewritten"}`
	otherRecord := sealed
	otherRecord.Offset++
	type rec struct {
		leaf uint64
		mark string // "" for the line
	}
	for name, tc := range map[string]struct {
		leaves []IndexedLeaf
		copies []store.EventRow
		types  []string
		want   []rec
	}{
		"one leaf, its copy":                    {[]IndexedLeaf{leaf(4, sealed)}, []store.EventRow{sealed}, nil, []rec{{4, ""}}},
		"an earlier attempt's copy":             {[]IndexedLeaf{leaf(4, sealed)}, []store.EventRow{at(sealed, -time.Minute)}, nil, []rec{{4, ""}}},
		"the same note twice":                   {[]IndexedLeaf{leaf(4, sealed), leaf(9, sealed)}, []store.EventRow{sealed}, nil, []rec{{4, ""}}},
		"an earlier attempt's copy, noted":      {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(sealed, -3*time.Second))}, []store.EventRow{sealed, at(sealed, -3*time.Second)}, nil, []rec{{4, ""}}},
		"that copy merged away":                 {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(sealed, -3*time.Second))}, []store.EventRow{sealed}, nil, []rec{{4, ""}}},
		"noted before the last attempt's":       {[]IndexedLeaf{leaf(4, at(sealed, -3*time.Second)), leaf(9, sealed)}, []store.EventRow{sealed}, nil, []rec{{9, ""}}},
		"moved within the margin, re-noted":     {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(sealed, 5*time.Minute))}, []store.EventRow{at(sealed, 5*time.Minute)}, nil, []rec{{9, ""}}},
		"moved past the margin, re-noted":       {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(sealed, time.Hour))}, []store.EventRow{at(sealed, time.Hour)}, nil, []rec{{4, MarkModified}, {9, ""}}},
		"moved later, not re-noted":             {[]IndexedLeaf{leaf(4, sealed)}, []store.EventRow{at(sealed, time.Second)}, nil, []rec{{4, MarkModified}}},
		"another record's leaf does not excuse": {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(otherRecord, time.Second))}, []store.EventRow{at(otherRecord, time.Second)}, nil, []rec{{4, MarkModified}, {9, ""}}},
		"edited content":                        {[]IndexedLeaf{leaf(4, sealed)}, []store.EventRow{edited}, nil, []rec{{4, MarkModified}}},
		"deleted, noted twice":                  {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(sealed, -3*time.Second))}, nil, nil, []rec{{4, MarkMissing}, {9, MarkMissing}}},
		"left out by the lists, a gap kept":     {[]IndexedLeaf{leaf(4, sealed), leaf(9, at(sealed, time.Hour))}, []store.EventRow{at(sealed, time.Hour)}, []string{"tool.called"}, []rec{{4, MarkModified}}},
	} {
		t.Run(name, func(t *testing.T) {
			x := &Exporter{cfg: ExportConfig{Margin: DefaultMargin}}
			sel := Selection{Org: "org-a", From: exportBase, To: exportBase.Add(time.Hour), Types: tc.types}
			e := &Export{x: x, req: ExportRequest{Selection: sel}}
			var got []rec
			for _, r := range e.decide(tc.leaves, tc.copies) {
				got = append(got, rec{r.leaf.Index, r.mark})
				if r.row != nil {
					assert.Equal(t, r.leaf.Leaf, tlog.LeafOf(r.row), "a line is its leaf")
				}
			}
			slices.SortFunc(got, func(a, b rec) int { return cmp.Compare(a.leaf, b.leaf) })
			assert.Equal(t, tc.want, got)
		})
	}
}
