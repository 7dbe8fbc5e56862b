package seal

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema/chdb"
)

// exportFixture is an export built in memory with the writer the server uses: rows of
// one organization, sealed in a chain of seals that also cover rows the selection
// leaves out.
type exportFixture struct {
	key     ed25519.PrivateKey
	sel     Selection
	asOf    time.Time
	rows    []store.EventRow // the exported rows, in export order
	others  []store.EventRow // sealed, stored, not selected
	gone    []store.EventRow // sealed in the range, no longer stored (missing)
	cuts    *cuts            // retention cuts honoured (nil: none)
	perSeal int
}

var exportBase = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newExportFixture(t testing.TB, n int) *exportFixture {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	f := &exportFixture{key: key, asOf: exportBase.Add(time.Hour), perSeal: 7,
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
		ActorHandle: "@alice/coder", OwnerID: "user-1", Source: "band", SchemaVersion: 1, Data: data, IngestedAt: t.Add(time.Second)}
}

// build writes the export: header, rows, the seals (chained, perSeal rows each, the
// others and the gone spread over them) and the manifest.
func (f *exportFixture) build(t testing.TB, encoding string) []byte {
	t.Helper()
	var buf bytes.Buffer
	xw := newExportWriter(&buf, encoding, nil)
	require.NoError(t, xw.header(newHeader(f.sel, encoding, f.asOf, KeyID(f.key.Public().(ed25519.PublicKey)))))
	for i := range f.rows {
		require.NoError(t, xw.event(&f.rows[i]))
	}
	exported := map[rowKey]bool{}
	for _, r := range f.rows {
		exported[rowKey{org: r.OrgID, id: r.ID, sec: r.Time.Unix()}] = true
	}
	for _, r := range f.others {
		exported[rowKey{org: r.OrgID, id: r.ID, sec: r.Time.Unix()}] = false
	}
	all := append(append(append([]store.EventRow{}, f.rows...), f.others...), f.gone...)
	slices.SortStableFunc(all, func(a, b store.EventRow) int { return a.Time.Compare(b.Time) }) // seals mix selected and other rows
	prev := ""
	for seq, i := uint64(1), 0; i < len(all); seq++ {
		part := all[i:min(len(all), i+f.perSeal)]
		i += len(part)
		entries := make([]Entry, len(part))
		pes := make([]proofEntry, len(part))
		for j := range part {
			entries[j] = Entry{Time: part[j].Time, ID: part[j].ID, Digest: part[j].SealDigest()}
			pes[j] = proofEntry{id: part[j].ID, t: part[j].Time, digest: hex.EncodeToString(entries[j].Digest[:])}
		}
		s := &Seal{OrgID: "org-a", Seq: seq, SealedAt: f.asOf, Through: f.asOf, Events: uint64(len(part)), Prev: prev}
		s.FirstTime, s.LastTime = part[0].Time.Truncate(time.Second), part[0].Time.Truncate(time.Second)
		for _, e := range entries {
			if e.Time.Truncate(time.Second).Before(s.FirstTime) {
				s.FirstTime = e.Time.Truncate(time.Second)
			}
			if e.Time.Truncate(time.Second).After(s.LastTime) {
				s.LastTime = e.Time.Truncate(time.Second)
			}
		}
		s.Root = Root(entries)
		s.sign(f.key)
		prev = s.Hash
		marks, include := markEntries(f.sel, s, pes, exported, f.cuts)
		if include {
			require.NoError(t, xw.seal(s, pes, marks))
		}
	}
	require.NoError(t, xw.manifest(f.key, f.sel, f.asOf))
	return buf.Bytes()
}

func (f *exportFixture) pub() ed25519.PublicKey { return f.key.Public().(ed25519.PublicKey) }

func verifyBytes(t testing.TB, b []byte, pub ed25519.PublicKey, chunk int) ExportReport {
	t.Helper()
	rep, err := VerifyExport(context.Background(), bytes.NewReader(b), int64(len(b)), pub, ExportVerifyOptions{ChunkLines: chunk})
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
	f.gone = nil
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		for _, chunk := range []int{0, 3, 40, 41} {
			t.Run(fmt.Sprintf("%s/chunk=%d", enc, chunk), func(t *testing.T) {
				b := f.build(t, enc)
				rep := verifyBytes(t, b, f.pub(), chunk)
				require.True(t, rep.OK(), "%+v", rep.Problems)
				assert.Equal(t, int64(40), rep.Events)
				assert.Equal(t, int64(40), rep.Exported)
				assert.Equal(t, int64(40+13), rep.Entries)
				assert.Equal(t, int64(8), rep.Seals, "every seal but the last holds an exported row")
				assert.Equal(t, "org-a", rep.Org)
				assert.Equal(t, fmtSec(f.asOf), rep.AsOf)
				assert.Equal(t, enc, rep.Encoding)
			})
		}
	}
	// The proof is the same bytes whatever the encoding: the manifests sign the same hash.
	var hashes []string
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		sc := NewExportScanner(enc)
		_, _ = sc.Write(b)
		require.True(t, sc.Complete())
		i := bytes.LastIndex(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
		m, err := ParseExportManifest(enc, b[i+1:])
		require.NoError(t, err)
		assert.Equal(t, uint64(40), m.Events)
		obj, err := object(enc, b[i+1:])
		require.NoError(t, err)
		var man exportManifest
		require.NoError(t, strict(obj, &man))
		hashes = append(hashes, man.ProofSHA256)
	}
	assert.Equal(t, hashes[0], hashes[1])
}

// Values CSV and JSON cannot carry as they are, and the ones that trip CSV readers,
// come back byte for byte: the digest of every line is recomputed from them.
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
	// An id with a comma, a quote and a newline: ids are stored as sent (the collector
	// refuses control characters; a row written by hand may hold anything).
	f.rows = append(f.rows, exportRow("id,with\"odd\nchars", "message.created", exportBase.Add(time.Minute), "x"))
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		t.Run(enc, func(t *testing.T) {
			b := f.build(t, enc)
			rep := verifyBytes(t, b, f.pub(), 0)
			require.True(t, rep.OK(), "%+v", rep.Problems)
			assert.Equal(t, int64(len(f.rows)), rep.Events)
			sc := NewExportScanner(enc)
			for p := b; len(p) > 0; { // fed in odd pieces, as a network delivers them
				n := min(len(p), 1+mrand.IntN(97))
				_, _ = sc.Write(p[:n])
				p = p[n:]
			}
			assert.True(t, sc.Complete())
			assert.Equal(t, uint64(len(f.rows)), sc.Events)
			last, err := ExportEventKey(enc, sc.LastEvent)
			require.NoError(t, err)
			assert.Equal(t, "id,with\"odd\nchars", last.ID)
		})
	}
}

func TestExportVerifyNamesTampering(t *testing.T) {
	f := newExportFixture(t, 30)
	b := f.build(t, EncodingNDJSON)
	ls := lines(b)
	// Line 1 is the header; the event of line n is f.rows[n-2].
	reencode := func(r store.EventRow) []byte {
		ev := eventRecord(&r, EncodingNDJSON)
		out, err := newEncoder(EncodingNDJSON).event(&ev)
		require.NoError(t, err)
		return bytes.Clone(out)
	}

	t.Run("changed", func(t *testing.T) {
		r := f.rows[10]
		r.Data = `{"content":"I never said that"}`
		c := append([][]byte{}, ls...)
		c[11] = reencode(r) // line 12
		rep := verifyBytes(t, join(c), f.pub(), 0)
		assert.Equal(t, []string{ExportChanged}, exportKinds(rep))
		assert.Equal(t, int64(12), rep.Problems[0].Line)
		assert.Equal(t, "ev-010", rep.Problems[0].ID)
		assert.Contains(t, rep.Problems[0].Reason, "differs from what seal:org-a:3 sealed")
	})
	t.Run("dropped", func(t *testing.T) {
		for _, chunk := range []int{0, 4} {
			c := append(append([][]byte{}, ls[:14]...), ls[15:]...) // line 15
			rep := verifyBytes(t, join(c), f.pub(), chunk)
			// The manifest counts 30 events, the file 29; the proof says which.
			require.Equal(t, []string{ExportDropped, ExportManifest}, exportKinds(rep), "chunk %d: %+v", chunk, rep.Problems)
			assert.Equal(t, int64(15), rep.Problems[0].Line, "the line it belonged at")
			assert.Equal(t, "ev-013", rep.Problems[0].ID)
			assert.Contains(t, rep.Problems[1].Reason, "counts 30 events, the file holds 29")
		}
	})
	t.Run("added", func(t *testing.T) {
		extra := reencode(exportRow("ev-999", "message.created", f.rows[20].Time.Add(time.Millisecond), `{"content":"forged"}`))
		c := append(append(append([][]byte{}, ls[:22]...), extra), ls[22:]...) // after ev-020, line 22
		rep := verifyBytes(t, join(c), f.pub(), 0)
		require.Equal(t, []string{ExportAdded, ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(23), rep.Problems[0].Line)
		assert.Equal(t, "ev-999", rep.Problems[0].ID)
	})
	t.Run("added not selected", func(t *testing.T) {
		// A sealed event the selection leaves out, smuggled in: outside the selection
		// and not exported.
		c := append(append(append([][]byte{}, ls[:3]...), reencode(f.others[0])), ls[3:]...)
		rep := verifyBytes(t, join(c), f.pub(), 0)
		assert.ElementsMatch(t, []string{ExportSelection, ExportOrder, ExportAdded, ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
	})
	t.Run("swapped", func(t *testing.T) {
		c := append([][]byte{}, ls...)
		c[5], c[6] = c[6], c[5]
		rep := verifyBytes(t, join(c), f.pub(), 0)
		require.Equal(t, []string{ExportOrder}, exportKinds(rep), "%+v", rep.Problems)
		assert.Equal(t, int64(7), rep.Problems[0].Line)
		assert.Equal(t, "ev-004", rep.Problems[0].ID)
	})
	t.Run("duplicated", func(t *testing.T) {
		c := append(append(append([][]byte{}, ls[:8]...), ls[7]), ls[8:]...)
		rep := verifyBytes(t, join(c), f.pub(), 0)
		assert.ElementsMatch(t, []string{ExportOrder, ExportAdded, ExportManifest}, exportKinds(rep), "%+v", rep.Problems)
		assert.Contains(t, problemsOf(rep, ExportAdded)[0].Reason, "repeats the event of line 8")
	})
	t.Run("non-canonical", func(t *testing.T) {
		c := append([][]byte{}, ls...)
		c[4] = bytes.Replace(c[4], []byte(`"kind":"event",`), []byte(`"kind":"event", `), 1)
		c[5] = bytes.Replace(c[5], []byte(`,"data":`), []byte(`,"data":"x","data":`), 1) // a duplicate key
		rep := verifyBytes(t, join(c), f.pub(), 0)
		m := problemsOf(rep, ExportMalformed)
		require.Len(t, m, 2, "%+v", rep.Problems)
		assert.Equal(t, int64(5), m[0].Line)
		assert.Equal(t, int64(6), m[1].Line)
		assert.Len(t, problemsOf(rep, ExportDropped), 2, "an unreadable line is not its event")
	})
	t.Run("mark flipped", func(t *testing.T) {
		c := append([][]byte{}, ls...)
		i := bytes.Index(join(c), []byte(`"mark":"exported"`))
		require.Positive(t, i)
		tampered := bytes.Replace(join(c), []byte(`"mark":"exported"`), []byte(`"mark":"other"`), 1)
		// Drop the line that entry is about: without the manifest's hash this would pass.
		rep := verifyBytes(t, tampered, f.pub(), 0)
		assert.Contains(t, exportKinds(rep), ExportManifest)
		assert.Contains(t, problemsOf(rep, ExportManifest)[0].Reason, "proof records")
		assert.Contains(t, exportKinds(rep), ExportAdded, "the line whose mark was flipped is in no seal of the export")
	})
	t.Run("entry tampered", func(t *testing.T) {
		var d store.Digest
		tampered := bytes.Replace(b, []byte(`"digest":"`), []byte(`"digest":"`+hex.EncodeToString(d[:])+`","x":"`), 1)
		rep := verifyBytes(t, tampered, f.pub(), 0)
		assert.Contains(t, exportKinds(rep), ExportMalformed, "%+v", rep.Problems)
		// A digest replaced in place: the root no longer matches, nor the proof hash.
		i := bytes.Index(b, []byte(`"digest":"`)) + len(`"digest":"`)
		tampered = append(bytes.Clone(b[:i]), []byte(hex.EncodeToString(d[:]))...)
		tampered = append(tampered, b[i+64:]...)
		rep = verifyBytes(t, tampered, f.pub(), 0)
		assert.Contains(t, exportKinds(rep), ExportSeal)
		assert.Contains(t, problemsOf(rep, ExportSeal)[0].Reason, "do not match its root")
		assert.Contains(t, exportKinds(rep), ExportManifest)
	})
	t.Run("forged manifest", func(t *testing.T) {
		// The whole trailer rebuilt and signed with another key, lines dropped to match.
		_, other, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		g := *f
		g.key = other
		g.rows = f.rows[:20]
		rep := verifyBytes(t, g.build(t, EncodingNDJSON), f.pub(), 0)
		assert.Contains(t, exportKinds(rep), ExportManifest)
		assert.Contains(t, problemsOf(rep, ExportManifest)[0].Reason, "signed with key")
		assert.Contains(t, exportKinds(rep), ExportSeal)
		// The manifest's counts edited: its signature fails.
		edited := bytes.Replace(b, []byte(`"events":30,"seals"`), []byte(`"events":29,"seals"`), 1)
		rep = verifyBytes(t, edited, f.pub(), 0)
		assert.Contains(t, problemsOf(rep, ExportManifest)[0].Reason, "signature does not verify")
	})
	t.Run("header edited", func(t *testing.T) {
		edited := bytes.Replace(b, []byte(`"types":["message.created"]`), []byte(`"types":[]`), 1)
		rep := verifyBytes(t, edited, f.pub(), 0)
		assert.Contains(t, problemsOf(rep, ExportManifest)[0].Reason, "differs from the header's")
	})
	t.Run("wrong key", func(t *testing.T) {
		_, other, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		rep := verifyBytes(t, b, other.Public().(ed25519.PublicKey), 0)
		assert.False(t, rep.OK())
		assert.Len(t, problemsOf(rep, ExportSeal), 6)
		assert.Len(t, problemsOf(rep, ExportManifest), 1)
	})
	t.Run("seal removed", func(t *testing.T) {
		// Seal 3 and its entries cut out: its events are added lines, and the manifest
		// does not match (a gap in the seqs alone is no problem: seals that cover no
		// exported event are left out).
		start := bytes.Index(b, []byte(`{"kind":"seal","org_id":"org-a","seq":3,`))
		end := bytes.Index(b, []byte(`{"kind":"seal","org_id":"org-a","seq":4,`))
		exported := bytes.Count(b[start:end], []byte(`"mark":"exported"`))
		require.Positive(t, exported)
		c := append(bytes.Clone(b[:start]), b[end:]...)
		rep := verifyBytes(t, c, f.pub(), 0)
		assert.Len(t, problemsOf(rep, ExportAdded), exported)
		assert.Len(t, problemsOf(rep, ExportManifest), 2, "counts and proof hash")
	})
}

func TestExportVerifyCSVTampering(t *testing.T) {
	f := newExportFixture(t, 12)
	f.rows[4].Data = "multi\nline \"quoted\", data"
	b := f.build(t, EncodingCSV)
	require.True(t, verifyBytes(t, b, f.pub(), 0).OK())
	// The data of the fifth event spans two lines of the file: lines are counted as the
	// file shows them.
	changed := bytes.Replace(b, []byte(`multi`), []byte(`MULTI`), 1)
	rep := verifyBytes(t, changed, f.pub(), 0)
	require.Equal(t, []string{ExportChanged}, exportKinds(rep), "%+v", rep.Problems)
	assert.Equal(t, "ev-004", rep.Problems[0].ID)
	assert.Equal(t, int64(7), rep.Problems[0].Line, "row 1 the columns, 2 the header")
	// A field cut so that a quote is left open swallows the rest: not CSV any more.
	broken := bytes.Replace(b, []byte(`"multi`), []byte(`"mul"ti`), 1)
	rep = verifyBytes(t, broken, f.pub(), 0)
	assert.Contains(t, exportKinds(rep), ExportMalformed)
	// Another column row.
	rep = verifyBytes(t, append([]byte("kind,id\n"), b[bytes.IndexByte(b, '\n')+1:]...), f.pub(), 0)
	assert.Equal(t, []string{ExportMalformed}, exportKinds(rep))
	assert.Contains(t, rep.Problems[0].Reason, "not a bandplane CSV export")
	// An event row with a field too many.
	extra := bytes.Replace(b, []byte("ev-002,message.created"), []byte("ev-002,message.created,surplus"), 1)
	rep = verifyBytes(t, extra, f.pub(), 0)
	assert.Contains(t, exportKinds(rep), ExportMalformed)
}

func TestExportVerifyHostileFiles(t *testing.T) {
	f := newExportFixture(t, 10)
	for _, enc := range []string{EncodingNDJSON, EncodingCSV} {
		b := f.build(t, enc)
		t.Run(enc+"/truncated everywhere", func(t *testing.T) {
			// Cut at every offset: never a panic, never OK, always truncated (or, cut
			// inside the first record, not an export at all).
			for n := 0; n < len(b); n += 1 + n/40 {
				rep := verifyBytes(t, b[:n], f.pub(), 3)
				require.False(t, rep.OK(), "cut at %d", n)
				k := exportKinds(rep)
				require.True(t, len(k) > 0 && (contains(k, ExportTruncated) || contains(k, ExportMalformed)), "cut at %d: %+v", n, rep.Problems)
			}
		})
		t.Run(enc+"/garbage", func(t *testing.T) {
			ls := lines(b)
			for _, g := range []string{"garbage\n", "{}\n", "{\"kind\":\"event\"}\n", "\n", "{\"kind\":\"seal\",\"seq\":\"x\"}\n", "\x00\x01\x02\n",
				"{\"kind\":\"header\",\"format\":\"bandplane.export.v1\"}\n", "[1,2,3]\n", "{\"kind\":\"entry\",\"id\":\"e\",\"time\":\"1\",\"digest\":\"zz\",\"mark\":\"exported\"}\n"} {
				for _, at := range []int{3, len(ls) - 4, len(ls) - 1} {
					if g == "\n" && enc == EncodingCSV {
						continue // CSV readers skip blank lines: it adds nothing
					}
					c := append(append(append([][]byte{}, ls[:at]...), []byte(g)), ls[at:]...)
					rep := verifyBytes(t, join(c), f.pub(), 0)
					require.False(t, rep.OK(), "%q at %d", g, at)
				}
			}
			for _, g := range []string{"", "garbage", "\xff\xfe", "{", strings.Repeat("{", 10000), "kind,id,type\n", "{\"kind\":\"event\"}\n"} {
				rep := verifyBytes(t, []byte(g), f.pub(), 0)
				require.False(t, rep.OK(), "%q", g)
			}
		})
		t.Run(enc+"/huge line", func(t *testing.T) {
			ls := lines(b)
			huge := []byte(`{"kind":"event","id":"` + strings.Repeat("a", MaxExportLineBytes) + "\"}\n")
			if enc == EncodingCSV {
				huge = []byte("event," + strings.Repeat("a", MaxExportLineBytes) + "\n")
			}
			c := append(append(append([][]byte{}, ls[:3]...), huge), ls[3:]...)
			rep := verifyBytes(t, join(c), f.pub(), 0)
			require.False(t, rep.OK())
			m := problemsOf(rep, ExportMalformed)
			require.NotEmpty(t, m)
			assert.Contains(t, m[0].Reason, "more than an export writes")
			if enc == EncodingNDJSON {
				// The line is skipped; the rest of the file is still checked.
				assert.Equal(t, int64(11), rep.Events)
				assert.Contains(t, exportKinds(rep), ExportManifest, "the manifest counts 10 events")
			}
		})
	}
	t.Run("a seal of no entries", func(t *testing.T) {
		// A seal record that claims 0 events, with the root of no entries: a seal
		// problem, never an index out of range.
		var sealLine []byte
		for _, l := range lines(f.build(t, EncodingNDJSON)) {
			if bytes.Contains(l, []byte(`"kind":"seal"`)) {
				sealLine = l
				break
			}
		}
		require.NotNil(t, sealLine)
		forged := regexp.MustCompile(`"events":[0-9]+`).ReplaceAll(bytes.TrimRight(sealLine, "\n"), []byte(`"events":0`))
		forged = regexp.MustCompile(`"root":"[0-9a-f]+"`).ReplaceAll(forged, []byte(`"root":"`+Root(nil)+`"`))
		require.NotEqual(t, bytes.TrimRight(sealLine, "\n"), forged)
		ls := lines(f.build(t, EncodingNDJSON))
		var out [][]byte
		for _, l := range ls {
			switch {
			case bytes.Contains(l, []byte(`"kind":"seal"`)):
				out = append(out, append(forged, '\n'))
			case bytes.Contains(l, []byte(`"kind":"entry"`)):
			default:
				out = append(out, l)
			}
		}
		rep := verifyBytes(t, join(out), f.pub(), 0)
		require.False(t, rep.OK())
		assert.NotEmpty(t, problemsOf(rep, ExportSeal), "%+v", rep.Problems)
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
		rep := verifyBytes(t, join(c), g.pub(), 0)
		assert.Len(t, rep.Problems, MaxExportProblems)
		assert.Positive(t, rep.MoreProblems)
	})
}

func contains(v []string, s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

func TestExportVerifyMissingAndExpired(t *testing.T) {
	f := newExportFixture(t, 10)
	f.gone = []store.EventRow{exportRow("deleted-1", "message.created", exportBase.Add(30*time.Second), "{}")}
	b := f.build(t, EncodingNDJSON)
	rep := verifyBytes(t, b, f.pub(), 0)
	require.Equal(t, []string{ExportMissing}, exportKinds(rep), "%+v", rep.Problems)
	assert.Equal(t, "deleted-1", rep.Problems[0].ID)
	assert.Contains(t, rep.Problems[0].Reason, "gone from the trail")
	assert.Contains(t, string(b), `"mark":"missing"`)
	// Under a retention cut signed with the audit key, recorded after the seal, that
	// covers its time and left no row of its day, the same entry is expired.
	before := exportBase.Add(time.Hour)
	f.cuts = &cuts{honoured: []chdb.Cut{{Table: "events", Before: before, At: f.asOf.Add(time.Hour)}}, maxBefore: []time.Time{before}, present: map[uint32]bool{}}
	b = f.build(t, EncodingNDJSON)
	rep = verifyBytes(t, b, f.pub(), 0)
	require.True(t, rep.OK(), "%+v", rep.Problems)
	assert.Equal(t, int64(1), rep.Expired)
	assert.Contains(t, string(b), `"mark":"expired"`)
}

func TestExportMarks(t *testing.T) {
	sel := Selection{Org: "o", From: exportBase, To: exportBase.Add(time.Minute)}
	s := &Seal{OrgID: "o", Seq: 1, SealedAt: exportBase.Add(time.Hour)}
	in, out := exportBase.Add(10*time.Second), exportBase.Add(2*time.Minute)
	entries := []proofEntry{{id: "b", t: in}, {id: "a", t: in}, {id: "c", t: in}, {id: "d", t: out}, {id: "e", t: in}}
	exported := map[rowKey]bool{{"o", "a", in.Unix()}: true, {"o", "b", in.Unix()}: false}
	marks, include := markEntries(sel, s, entries, exported, nil)
	assert.True(t, include)
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.id)
	}
	assert.Equal(t, []string{"a", "b", "c", "d", "e"}, ids, "Root's order")
	assert.Equal(t, []string{MarkExported, MarkOther, MarkMissing, MarkOther, MarkMissing}, marks)
	_, include = markEntries(sel, s, []proofEntry{{id: "b", t: in}, {id: "d", t: out}}, exported, nil)
	assert.False(t, include, "a seal of only other entries is left out")
}

func TestParseExportRequest(t *testing.T) {
	q := func(s string) url.Values {
		v, err := url.ParseQuery(s)
		require.NoError(t, err)
		return v
	}
	req, err := ParseExportRequest(q("org=o&from=2026-03-01&to=2026-03-02T00:00:00.5Z&types=b,a&types=a&actors=x&rooms=r1,r2&format=csv"))
	require.NoError(t, err)
	assert.Equal(t, Selection{Org: "o", From: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2026, 3, 2, 0, 0, 0, 5e8, time.UTC),
		Types: []string{"a", "b"}, Actors: []string{"x"}, Rooms: []string{"r1", "r2"}}, req.Selection)
	assert.Equal(t, EncodingCSV, req.Encoding)
	req, err = ParseExportRequest(q("from=2026-03-01&to=2026-03-02"))
	require.NoError(t, err, "the organization may come from the key")
	assert.Equal(t, EncodingNDJSON, req.Encoding)
	assert.Empty(t, req.Selection.Org)
	// Values gives the request back.
	req.Selection.Org = "o"
	back, err := ParseExportRequest(req.Values())
	require.NoError(t, err)
	assert.Equal(t, req, back)

	long := strings.Repeat("r", 257)
	var distinct []string
	for i := range 101 {
		distinct = append(distinct, fmt.Sprint("t", i))
	}
	many := strings.Join(distinct, ",")
	for _, tc := range []struct{ query, want string }{
		{"", "from: required"},
		{"from=2026-03-01", "to: required"},
		{"from=2026-03-02&to=2026-03-01", "to: must be after from"},
		{"from=2026-03-01&to=2026-03-01", "to: must be after from"},
		{"from=2020-01-01&to=2026-01-01", "spans more than 401 days"},
		{"from=1969-12-31&to=1970-01-02", "from: 1969-12-31T00:00:00.000Z is outside the times"},
		{"from=yesterday&to=2026-01-01", `from: "yesterday" is neither RFC 3339 nor YYYY-MM-DD`},
		{"from=2026-03-01&from=2026-03-02&to=2026-04-01", "from: given 2 times"},
		{"from=2026-03-01&to=2026-03-02&types=" + many, "types: 101 values; at most 100"},
		{"from=2026-03-01&to=2026-03-02&rooms=" + long, "rooms: a value of 257 bytes is longer than 256 bytes"},
		{"from=2026-03-01&to=2026-03-02&types=" + strings.Repeat("t", 65), "types: a value of 65 bytes is longer than 64 bytes"},
		{"from=2026-03-01&to=2026-03-02&actors=a%00b", `actors: "a\x00b" has a control character at byte 1`},
		{"from=2026-03-01&to=2026-03-02&actors=%ff", "actors: a value of 1 bytes is not valid UTF-8"},
		{"from=2026-03-01&to=2026-03-02&actors=a,,b", "actors: an empty value"},
		{"from=2026-03-01&to=2026-03-02&org=", "org: empty"},
		{"from=2026-03-01&to=2026-03-02&org=*", "org: '*' is not an organization"},
		{"from=2026-03-01&to=2026-03-02&format=xml", `format: "xml" is not ndjson or csv`},
		{"from=2026-03-01&to=2026-03-02&type=x", `unknown parameter "type"`},
		{"from=2026-03-01&to=2026-03-02&as_of=2026-03-01T00:00:00.5Z", "as_of: want the as_of of an export's header"},
		{"from=2026-03-01&to=2026-03-02&after=x1", "after: malformed cursor"},
		{"from=2026-03-01&to=2026-03-02&after=" + Cursor{Events: 0}.String(), "after: needs as_of"},
		{"from=2026-03-01&to=2026-03-02&after=" + strings.Repeat("A", 3000), "after: the cursor is 3000 bytes"},
	} {
		_, err := ParseExportRequest(q(tc.query))
		require.Error(t, err, tc.query)
		assert.Contains(t, err.Error(), tc.want, tc.query)
	}
	// Every problem at once.
	_, err = ParseExportRequest(q("format=xml&types=" + long + "&nope=1"))
	require.Error(t, err)
	for _, want := range []string{"format:", "types:", `unknown parameter "nope"`, "from: required"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestExportCursor(t *testing.T) {
	sel := Selection{Org: "o", From: exportBase, To: exportBase.Add(time.Hour), Types: []string{"x"}}
	sel.Normalize()
	h := newHeader(sel, EncodingNDJSON, exportBase.Add(2*time.Hour), "k")
	c, err := NewCursor(&h, 42, exportBase.Add(1500*time.Millisecond), "ev:with:colons")
	require.NoError(t, err)
	back, err := DecodeCursor(c.String())
	require.NoError(t, err)
	assert.Equal(t, c, back)
	assert.Equal(t, binding(sel, EncodingNDJSON, exportBase.Add(2*time.Hour)), c.Bind)
	assert.NotEqual(t, binding(sel, EncodingCSV, exportBase.Add(2*time.Hour)), c.Bind, "bound to the encoding")
	other := sel
	other.Types = []string{"y"}
	assert.NotEqual(t, binding(other, EncodingNDJSON, exportBase.Add(2*time.Hour)), c.Bind, "bound to the selection")
	assert.NotEqual(t, binding(sel, EncodingNDJSON, exportBase.Add(3*time.Hour)), c.Bind, "bound to as_of")
	start, err := NewCursor(&h, 0, time.Time{}, "")
	require.NoError(t, err)
	back, err = DecodeCursor(start.String())
	require.NoError(t, err)
	assert.Equal(t, start, back)
	enc := func(s string) string { return base64URL(s) }
	for _, bad := range []string{"", "!!!", enc("x2:0000000000000000:1:0:a"), enc("x1:00:1:0:a"), enc("x1:0000000000000000:-1:0:a"),
		enc("x1:0000000000000000:1:x:a"), enc("x1:0000000000000000:1:0:"), enc("x1:0000000000000000:0:5:"), enc("x1:0000000000000000:1:0:a\nb"),
		enc("x1:0000000000000000:1:99999999999999999:a"), enc("x1:0000000000000000:1:0:" + strings.Repeat("a", 300))} {
		_, err := DecodeCursor(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// A file cut anywhere resumes from its last complete event: what the scanner keeps is
// exactly the prefix the server continues after.
func TestExportScannerResumePoint(t *testing.T) {
	f := newExportFixture(t, 25)
	f.rows[3].Data = "new\nline and \"quotes\""
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
			// The events before keep are the first sc.Events rows, nothing cut.
			prefix := NewExportScanner(enc)
			_, _ = prefix.Write(b[:keep])
			assert.Equal(t, sc.Events, prefix.Events, "cut at %d", n)
			assert.Equal(t, keep, prefix.LastEnd, "cut at %d", n)
		}
	}
}

func base64URL(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
