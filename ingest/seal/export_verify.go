package seal

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bandplane/bandplane/ingest/store"
)

// Kinds of ExportProblem.
const (
	ExportChanged   = "changed"   // a line's content differs from what its seal sealed
	ExportDropped   = "dropped"   // an event the proof marks exported has no line
	ExportAdded     = "added"     // a line no seal of the export marks exported
	ExportSelection = "selection" // a line outside the export's selection
	ExportOrder     = "order"     // a line out of (time, id) order, or a record out of place
	ExportMalformed = "malformed" // a record that is not one the export format writes
	ExportSeal      = "seal"      // a seal that does not verify: signature, hash, root, entries, link
	ExportManifest  = "manifest"  // the manifest does not verify or does not match the file
	ExportMissing   = "missing"   // a sealed event of the range is gone from the trail
	ExportTruncated = "truncated" // the file stops before its manifest
)

// ExportProblem is one thing VerifyExport found wrong. Line is the line of the file
// where the record starts (for a dropped event: the line it belonged at), ID the
// event's id when there is one.
type ExportProblem struct {
	Line   int64  `json:"line,omitempty"`
	ID     string `json:"id,omitempty"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// MaxExportProblems bounds the problems a report lists; the rest are counted.
const MaxExportProblems = 1000

// ExportReport is what VerifyExport found. Problems is never nil.
type ExportReport struct {
	Encoding     string          `json:"encoding"`
	Org          string          `json:"org"`
	From         string          `json:"from"`
	To           string          `json:"to"`
	AsOf         string          `json:"as_of"`
	KeyID        string          `json:"key_id"`
	Events       int64           `json:"events"`
	Seals        int64           `json:"seals"`
	Entries      int64           `json:"entries"`
	Exported     int64           `json:"exported_entries"`
	Expired      int64           `json:"expired_entries"`
	Problems     []ExportProblem `json:"problems"`
	MoreProblems int64           `json:"more_problems,omitempty"`
}

// OK says whether the export proved itself.
func (r ExportReport) OK() bool { return len(r.Problems) == 0 && r.MoreProblems == 0 }

// ExportVerifyOptions tune VerifyExport.
type ExportVerifyOptions struct {
	// ChunkLines is how many lines are held in memory at once (default 1,000,000, about
	// 100 MB); a larger export is checked in stretches of row keys, one more read of
	// its events and of its proof each.
	ChunkLines int
}

// lineKey is a line's row key: its time in seconds and its id (the table's key within
// an organization).
type lineKey struct {
	sec int64
	id  string
}

func compareLineKey(a, b lineKey) int {
	return cmp.Or(cmp.Compare(a.sec, b.sec), strings.Compare(a.id, b.id))
}

type lineRec struct {
	id      string
	line    int64
	digest  store.Digest
	matched bool
	changed bool
}

type boundary struct {
	key  lineKey
	line int64
}

type sealInfo struct {
	name       string // seal:<org>:<seq>
	seq        uint64
	hash, prev string
	line       int64
}

// VerifyExport checks an export file offline against the audit key's public half: the
// manifest, every seal and its entries, and every line (ExportFormat's doc). Problems
// with the content are in the report; the error is for reading the file or ctx.
func VerifyExport(ctx context.Context, r io.ReaderAt, size int64, pub ed25519.PublicKey, opt ExportVerifyOptions) (ExportReport, error) {
	if len(pub) != ed25519.PublicKeySize {
		return ExportReport{}, errors.New("no Ed25519 public key (--audit-key)")
	}
	if opt.ChunkLines <= 0 {
		opt.ChunkLines = 1_000_000
	}
	v := &exportVerifier{ctx: ctx, ra: r, size: size, pub: pub, pubID: KeyID(pub), opt: opt,
		rep: ExportReport{Problems: []ExportProblem{}}, seen: map[string]bool{}}
	err := v.run()
	return v.rep, err
}

type exportVerifier struct {
	ctx   context.Context
	ra    io.ReaderAt
	size  int64
	pub   ed25519.PublicKey
	pubID string
	opt   ExportVerifyOptions
	rep   ExportReport
	seen  map[string]bool // problems reported, to report each once

	enc    string
	sel    Selection
	asOf   time.Time
	header ExportHeader

	eventsStart, proofStart int64 // byte offsets
	firstEventLine          int64
	proofLine               int64 // the line of the first record after the events
	endLine                 int64 // the line after the last record
	boundaries              []boundary
	lines                   map[lineKey]*lineRec // the lines of the chunk being joined
	inMemory                bool                 // every line is in lines

	canon    *encoder // re-encodes lines for the canonical check
	seals    []sealInfo
	dropped  map[lineKey]string // exported marks without a line: key -> seal name
	manifest bool
}

func (v *exportVerifier) problem(p ExportProblem) {
	key := fmt.Sprint(p.Line, "\x00", p.ID, "\x00", p.Kind, "\x00", p.Reason)
	if v.seen[key] {
		return
	}
	if len(v.rep.Problems) >= MaxExportProblems {
		v.rep.MoreProblems++
		return
	}
	v.seen[key] = true
	v.rep.Problems = append(v.rep.Problems, p)
}

// errStop ends reading: the rest of the file cannot be read as records.
var errStop = errors.New("stop")

func (v *exportVerifier) run() error {
	first := make([]byte, 1)
	if v.size == 0 {
		v.problem(ExportProblem{Kind: ExportTruncated, Reason: "the file is empty"})
		return nil
	}
	if _, err := v.ra.ReadAt(first, 0); err != nil {
		return fmt.Errorf("cannot read the export: %w", err)
	}
	switch first[0] {
	case '{':
		v.enc = EncodingNDJSON
	case 'k':
		v.enc = EncodingCSV
	default:
		v.problem(ExportProblem{Line: 1, Kind: ExportMalformed, Reason: "not a bandplane export: line 1 is neither an NDJSON header nor the CSV column row"})
		return nil
	}
	v.rep.Encoding = v.enc
	if err := v.passA(); err != nil {
		return err
	}
	if !v.inMemory && v.rep.Events > 0 && v.proofStart > 0 {
		if err := v.chunks(); err != nil {
			return err
		}
	}
	v.checkChain()
	slices.SortStableFunc(v.rep.Problems, func(a, b ExportProblem) int { return cmp.Compare(lineOr(a.Line), lineOr(b.Line)) })
	return nil
}

// lineOr sorts problems without a line (about the whole file) last.
func lineOr(l int64) int64 {
	if l == 0 {
		return 1 << 62
	}
	return l
}

// rawRecord is one record of the file.
type rawRecord struct {
	kind       string
	line       int64
	start, end int64
	obj        []byte   // the JSON object (all NDJSON records; CSV records but events)
	fields     []string // a CSV event row
	bad        string   // why the record cannot be read ("" when it can)
	badKind    string   // the problem kind of bad
	fatal      bool     // nothing after it can be read
}

type recordReader interface {
	next() (*rawRecord, error) // io.EOF after the last record
}

// ndjsonReader reads lines of at most MaxExportLineBytes; a longer one is skipped.
type ndjsonReader struct {
	br   *bufio.Reader
	off  int64
	line int64
	buf  []byte
	rec  rawRecord
}

func newNDJSONReader(ra io.ReaderAt, off, size, line int64) *ndjsonReader {
	return &ndjsonReader{br: bufio.NewReaderSize(io.NewSectionReader(ra, off, size-off), 1<<20), off: off, line: line - 1}
}

func (r *ndjsonReader) next() (*rawRecord, error) {
	start := r.off
	r.buf = r.buf[:0]
	tooLong, terminated := false, false
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.off += int64(len(chunk))
		if !tooLong {
			if len(r.buf)+len(chunk) > MaxExportLineBytes+1 {
				tooLong, r.buf = true, r.buf[:0]
			} else {
				r.buf = append(r.buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			if r.off == start {
				return nil, io.EOF
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read the export at byte %d: %w", r.off, err)
		}
		terminated = true
		break
	}
	r.line++
	r.rec = rawRecord{line: r.line, start: start, end: r.off}
	switch {
	case tooLong:
		r.rec.bad, r.rec.badKind = fmt.Sprintf("the line is %d bytes long, more than an export writes (%d)", r.off-start, MaxExportLineBytes), ExportMalformed
	case !terminated:
		r.rec.bad, r.rec.badKind = "the file ends inside this line: it is cut off", ExportTruncated
	}
	r.rec.obj = bytes.TrimSuffix(r.buf, []byte("\n"))
	if r.rec.bad == "" {
		r.rec.kind = recordKind(EncodingNDJSON, r.rec.obj)
		if r.rec.kind == "" {
			r.rec.bad, r.rec.badKind = "not a record of an export (each line is an object starting with its \"kind\")", ExportMalformed
		}
	}
	return &r.rec, nil
}

// budgetReader fails once more than limit bytes are read since reset: it bounds the
// memory csv.Reader spends on one record.
type budgetReader struct {
	r     io.Reader
	n     int64
	limit int64
}

var errRecordTooLong = errors.New("record too long")

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.n > b.limit {
		return 0, errRecordTooLong
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

type csvReader struct {
	budget   *budgetReader
	cr       *csv.Reader
	base     int64 // byte offset of the section
	baseLine int64
	prev     int64
	size     int64
	lastNL   bool // the file ends with a newline
	rec      rawRecord
}

func newCSVReader(ra io.ReaderAt, off, size, line int64, lastNL bool) *csvReader {
	b := &budgetReader{r: io.NewSectionReader(ra, off, size-off), limit: MaxExportLineBytes + 1<<16}
	cr := csv.NewReader(b)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	return &csvReader{budget: b, cr: cr, base: off, baseLine: line, size: size, lastNL: lastNL}
}

func (r *csvReader) next() (*rawRecord, error) {
	r.budget.n = 0
	fields, err := r.cr.Read()
	start, end := r.base+r.prev, r.base+r.cr.InputOffset()
	r.prev = r.cr.InputOffset()
	if errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	line := r.baseLine
	if err == nil && len(fields) > 0 { // FieldPos panics after an error
		if l, _ := r.cr.FieldPos(0); l > 0 {
			line = r.baseLine + int64(l) - 1
		}
	}
	r.rec = rawRecord{line: line, start: start, end: end}
	var pe *csv.ParseError
	switch {
	case errors.Is(err, errRecordTooLong):
		r.rec.bad, r.rec.badKind, r.rec.fatal = fmt.Sprintf("a record longer than an export writes (%d bytes): the rest of the file cannot be read", MaxExportLineBytes), ExportMalformed, true
		return &r.rec, nil
	case errors.As(err, &pe):
		r.rec.line = r.baseLine + int64(pe.StartLine) - 1
		if errors.Is(pe.Err, csv.ErrQuote) && end >= r.size {
			r.rec.bad, r.rec.badKind = "the file ends inside this record: it is cut off", ExportTruncated
		} else {
			r.rec.bad, r.rec.badKind = fmt.Sprintf("not CSV (%v): the rest of the file cannot be read", pe.Err), ExportMalformed
		}
		r.rec.fatal = true
		return &r.rec, nil
	case err != nil:
		return nil, fmt.Errorf("cannot read the export at byte %d: %w", end, err)
	}
	if end-start > MaxExportLineBytes {
		r.rec.bad, r.rec.badKind = fmt.Sprintf("the record is %d bytes long, more than an export writes (%d)", end-start, MaxExportLineBytes), ExportMalformed
		return &r.rec, nil
	}
	if end >= r.size && !r.lastNL {
		r.rec.bad, r.rec.badKind = "the file ends inside this record: it is cut off", ExportTruncated
		return &r.rec, nil
	}
	r.rec.kind = recordKind(EncodingCSV, []byte(fields[0]+","))
	switch {
	case r.rec.kind == KindEvent:
		r.rec.fields = fields
	case r.rec.kind == "columns":
		r.rec.fields = fields
	case r.rec.kind == "":
		r.rec.bad, r.rec.badKind = fmt.Sprintf("not a record of an export (kind %q)", clip(fields[0])), ExportMalformed
	case len(fields) != 2:
		r.rec.bad, r.rec.badKind = fmt.Sprintf("a %s record has %d fields, want 2 (kind, JSON)", r.rec.kind, len(fields)), ExportMalformed
	default:
		r.rec.obj = []byte(fields[1])
	}
	return &r.rec, nil
}

func (v *exportVerifier) reader(off, line int64) (recordReader, error) {
	if v.enc == EncodingNDJSON {
		return newNDJSONReader(v.ra, off, v.size, line), nil
	}
	last := make([]byte, 1)
	if _, err := v.ra.ReadAt(last, v.size-1); err != nil {
		return nil, fmt.Errorf("cannot read the export: %w", err)
	}
	return newCSVReader(v.ra, off, v.size, line, last[0] == '\n'), nil
}

// strict decodes one JSON object into v, refusing unknown fields and trailing data.
func strict(obj []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the object")
	}
	return nil
}

// passA reads the whole file once: header, events (their digests and order, and the
// first chunk of them), the proof (seals, roots, marks) and the manifest.
func (v *exportVerifier) passA() error {
	rr, err := v.reader(0, 1)
	if err != nil {
		return err
	}
	rec, err := rr.next()
	if err != nil {
		return v.eof(err, 1)
	}
	if v.enc == EncodingCSV {
		if rec.bad != "" || !slices.Equal(rec.fields, ExportColumns) {
			v.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: "not a bandplane CSV export: the first row is not the export's columns (" + strings.Join(ExportColumns, ",") + ")"})
			return nil
		}
		if rec, err = rr.next(); err != nil {
			return v.eof(err, 2)
		}
	}
	if !v.readHeader(rec) {
		return nil
	}
	v.lines, v.inMemory = map[lineKey]*lineRec{}, true
	v.dropped = map[lineKey]string{}
	ph := newProofHash()
	var prev *lineKey
	var prevMilli int64
	var prevID string
	var prevLine int64
	var cur *openSeal
	var last *rawRecord
	for n := 0; ; n++ {
		if n%4096 == 0 && v.ctx.Err() != nil {
			return v.ctx.Err()
		}
		rec, err = rr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		last = rec
		if v.manifest {
			v.problem(ExportProblem{Line: rec.line, Kind: ExportManifest, Reason: "data after the manifest: the manifest is the last record"})
			if rec.fatal {
				break
			}
			continue
		}
		if rec.bad != "" {
			v.problem(ExportProblem{Line: rec.line, Kind: rec.badKind, Reason: rec.bad})
			if v.proofStart == 0 && rec.badKind != ExportTruncated {
				v.rep.Events++ // a line in the events that cannot be read is one of them, unreadable
			}
			if rec.fatal {
				break
			}
			continue
		}
		if rec.kind == KindEvent {
			if v.proofStart > 0 {
				v.problem(ExportProblem{Line: rec.line, Kind: ExportOrder, Reason: "an event line after the proof began: events come first"})
				continue
			}
			if v.eventsStart == 0 {
				v.eventsStart, v.firstEventLine = rec.start, rec.line
			}
			v.rep.Events++
			key, ms, digest, ok := v.event(rec, true)
			if !ok {
				continue
			}
			if prev != nil && (ms < prevMilli || ms == prevMilli && key.id <= prevID) {
				v.problem(ExportProblem{Line: rec.line, ID: key.id, Kind: ExportOrder,
					Reason: fmt.Sprintf("event %q at %s comes after event %q at %s (line %d): lines are in (time, id) order", clip(key.id),
						fmtMilli(time.UnixMilli(ms)), clip(prevID), fmtMilli(time.UnixMilli(prevMilli)), prevLine)})
			}
			k := key
			prev, prevMilli, prevID, prevLine = &k, ms, key.id, rec.line
			if (v.rep.Events-1)%int64(v.opt.ChunkLines) == 0 {
				v.boundaries = append(v.boundaries, boundary{key: key, line: rec.line})
			}
			if v.inMemory {
				if v.rep.Events > int64(v.opt.ChunkLines) {
					v.lines, v.inMemory = nil, false // joined chunk by chunk after this pass
				} else {
					v.addLine(key, rec.line, digest)
				}
			}
			continue
		}
		if v.proofStart == 0 {
			v.proofStart, v.proofLine = rec.start, rec.line
		}
		switch rec.kind {
		case KindSeal:
			v.finishSeal(cur)
			cur = v.openSeal(rec, ph)
		case KindEntry:
			if cur == nil {
				v.problem(ExportProblem{Line: rec.line, Kind: ExportOrder, Reason: "an entry before any seal: entries follow their seal"})
				ph.add(rec.obj)
				v.rep.Entries++
				continue
			}
			v.entry(rec, cur, ph, v.inMemory)
		case KindManifest:
			v.finishSeal(cur)
			cur = nil
			v.checkManifest(rec, ph)
			v.manifest = true
		case KindError:
			var e exportError
			_ = json.Unmarshal(rec.obj, &e)
			v.problem(ExportProblem{Line: rec.line, Kind: ExportTruncated, Reason: fmt.Sprintf("the server stopped the export here: %s (`bandplane audit export --resume` continues it)", clip(e.Error))})
		default:
			v.problem(ExportProblem{Line: rec.line, Kind: ExportOrder, Reason: fmt.Sprintf("a %s record in the middle of the export", rec.kind)})
		}
	}
	v.finishSeal(cur)
	if last != nil {
		v.endLine = last.line + 1
	} else {
		v.endLine = v.firstEventLine
	}
	if v.proofStart == 0 {
		v.proofLine = v.endLine
	}
	if !v.manifest {
		line := v.endLine - 1
		v.problem(ExportProblem{Line: line, Kind: ExportTruncated, Reason: fmt.Sprintf("the file ends without its manifest after %d events: the export is incomplete (`bandplane audit export --resume` continues it)", v.rep.Events)})
	}
	if v.inMemory {
		v.report(nil)
	}
	return nil
}

func (v *exportVerifier) eof(err error, line int64) error {
	if errors.Is(err, io.EOF) {
		v.problem(ExportProblem{Line: line, Kind: ExportTruncated, Reason: "the file ends before its header"})
		return nil
	}
	return err
}

func (v *exportVerifier) readHeader(rec *rawRecord) bool {
	fail := func(why string) bool {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: "not a bandplane export: " + why})
		return false
	}
	if rec.bad != "" {
		return fail(rec.bad)
	}
	if rec.kind != KindHeader {
		return fail(fmt.Sprintf("the first record is a %q record, not the header", rec.kind))
	}
	if err := strict(rec.obj, &v.header); err != nil {
		return fail(fmt.Sprintf("the header is not readable: %v", err))
	}
	sel, asOf, err := v.header.selection()
	if err != nil {
		return fail(fmt.Sprintf("the header: %v", err))
	}
	if v.header.Encoding != v.enc {
		return fail(fmt.Sprintf("the header says %s, the file is %s", v.header.Encoding, v.enc))
	}
	v.sel, v.asOf = sel, asOf
	v.rep.Org, v.rep.From, v.rep.To, v.rep.AsOf, v.rep.KeyID = sel.Org, v.header.From, v.header.To, v.header.AsOf, v.header.KeyID
	return true
}

// event reads an event record: its key, its time in ms, its digest. report says
// whether to report what is wrong with it (the first pass does; later passes not).
func (v *exportVerifier) event(rec *rawRecord, report bool) (lineKey, int64, store.Digest, bool) {
	bad := func(kind, why string, id string) (lineKey, int64, store.Digest, bool) {
		if report {
			v.problem(ExportProblem{Line: rec.line, ID: id, Kind: kind, Reason: why})
		}
		return lineKey{}, 0, store.Digest{}, false
	}
	var ev exportEvent
	var err error
	if v.enc == EncodingNDJSON {
		// Unknown fields, duplicate keys and anything after the object fail the
		// canonical check below: the line must be what re-encoding it gives.
		err = json.Unmarshal(rec.obj, &ev)
	} else {
		ev, err = eventFromCSV(rec.fields)
	}
	if err != nil {
		return bad(ExportMalformed, fmt.Sprintf("not an event record: %v", err), "")
	}
	row, err := ev.row()
	if err != nil {
		return bad(ExportMalformed, fmt.Sprintf("not an event record: %v", err), clip(ev.ID))
	}
	canon := eventRecord(&row, v.enc)
	if !reflect.DeepEqual(canon, ev) {
		return bad(ExportMalformed, "the event is not written as an export writes it (base64 where none is needed, or an actor type not as stored)", clip(row.ID))
	}
	if v.enc == EncodingNDJSON {
		if v.canon == nil {
			v.canon = newEncoder(v.enc)
		}
		if b, err := v.canon.event(&canon); err != nil || !bytes.Equal(bytes.TrimSuffix(b, []byte("\n")), rec.obj) {
			return bad(ExportMalformed, "the line is not in the export's canonical JSON (field order, spacing, escapes, duplicate keys)", clip(row.ID))
		}
	}
	key := lineKey{sec: row.Time.Unix(), id: row.ID}
	if why := v.outside(&row); why != "" && report {
		v.problem(ExportProblem{Line: rec.line, ID: clip(row.ID), Kind: ExportSelection, Reason: "not in the export's selection: " + why})
	}
	return key, row.Time.UnixMilli(), row.SealDigest(), true
}

// outside says why a row is not in the selection, or "".
func (v *exportVerifier) outside(r *store.EventRow) string {
	s := &v.sel
	switch {
	case r.OrgID != s.Org:
		return fmt.Sprintf("organization %q, the export's is %q", clip(r.OrgID), clip(s.Org))
	case r.Time.Before(s.From) || !r.Time.Before(s.To):
		return fmt.Sprintf("time %s is outside [%s, %s)", fmtMilli(r.Time), fmtMilli(s.From), fmtMilli(s.To))
	case len(s.Types) > 0 && !slices.Contains(s.Types, r.Type):
		return fmt.Sprintf("type %q is not one of the export's types", clip(r.Type))
	case len(s.Actors) > 0 && !slices.Contains(s.Actors, r.ActorID):
		return fmt.Sprintf("actor %q is not one of the export's actors", clip(r.ActorID))
	case len(s.Rooms) > 0 && !slices.Contains(s.Rooms, r.RoomID):
		return fmt.Sprintf("room %q is not one of the export's rooms", clip(r.RoomID))
	}
	return ""
}

func (v *exportVerifier) addLine(key lineKey, line int64, d store.Digest) bool {
	if prev, ok := v.lines[key]; ok {
		v.problem(ExportProblem{Line: line, ID: clip(key.id), Kind: ExportAdded,
			Reason: fmt.Sprintf("event %q at %s repeats the event of line %d", clip(key.id), fmtSec(time.Unix(key.sec, 0)), prev.line)})
		return false
	}
	v.lines[key] = &lineRec{id: key.id, line: line, digest: d}
	return true
}

// openSeal is the seal whose entries are being read.
type openSeal struct {
	idx     int
	seal    Seal
	ok      bool // its record is readable
	line    int64
	entries []Entry
	count   uint64
	corrupt int
	over    bool
}

func (v *exportVerifier) openSeal(rec *rawRecord, ph *proofHash) *openSeal {
	ph.add(rec.obj)
	v.rep.Seals++
	o := &openSeal{idx: -1, line: rec.line}
	var sr exportSeal
	if err := strict(rec.obj, &sr); err != nil {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: fmt.Sprintf("a seal record that is not readable: %v", err)})
		return o
	}
	s, err := sr.seal()
	if err != nil {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: fmt.Sprintf("a seal record that is not readable: %v", err)})
		return o
	}
	o.seal, o.ok = s, true
	name := s.ID()
	if s.OrgID != v.sel.Org {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s is a seal of organization %q, not of the export's %q", name, clip(s.OrgID), clip(v.sel.Org))})
	}
	if why := s.checkSignature(v.pub, v.pubID); why != "" {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s: %s", name, why)})
	}
	o.idx = len(v.seals)
	v.seals = append(v.seals, sealInfo{name: name, seq: s.Seq, hash: s.Hash, prev: s.Prev, line: rec.line})
	return o
}

func (v *exportVerifier) sealName(o *openSeal) string {
	if o.idx < 0 {
		return fmt.Sprintf("the seal of line %d", o.line)
	}
	return v.seals[o.idx].name
}

// entry reads an entry of the open seal. join matches an exported entry with its line
// now (every line is in memory).
func (v *exportVerifier) entry(rec *rawRecord, o *openSeal, ph *proofHash, join bool) {
	ph.add(rec.obj)
	v.rep.Entries++
	o.count++
	var er exportEntry
	if err := strict(rec.obj, &er); err != nil || er.Kind != KindEntry || er.ID == "" {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: fmt.Sprintf("an entry record that is not readable (%v)", err)})
		o.corrupt++
		return
	}
	t, ok := parseMilli(er.Time)
	d, dok := parseDigest(er.Digest)
	if !ok || !dok {
		v.problem(ExportProblem{Line: rec.line, ID: clip(er.ID), Kind: ExportSeal, Reason: fmt.Sprintf("an entry of %s with a time %q or digest %q that is not the trail's", v.sealName(o), clip(er.Time), clip(er.Digest))})
		o.corrupt++
		return
	}
	if !o.over {
		if len(o.entries) >= MaxSealEntries || o.ok && uint64(len(o.entries)) >= o.seal.Events {
			o.over = true // reported by finishSeal; the root cannot match
			o.entries = nil
		} else {
			o.entries = append(o.entries, Entry{Time: t, ID: er.ID, Digest: d})
		}
	}
	inRange := !t.Before(v.sel.From) && t.Before(v.sel.To)
	switch er.Mark {
	case MarkExported:
		v.rep.Exported++
		if !inRange {
			v.problem(ExportProblem{Line: rec.line, ID: clip(er.ID), Kind: ExportSeal, Reason: fmt.Sprintf("%s marks event %q at %s exported, but it is outside the range", v.sealName(o), clip(er.ID), fmtMilli(t))})
		}
		if join {
			v.mark(lineKey{sec: t.Unix(), id: er.ID}, d, v.sealName(o))
		}
	case MarkMissing:
		v.problem(ExportProblem{Line: rec.line, ID: clip(er.ID), Kind: ExportMissing,
			Reason: fmt.Sprintf("event %q at %s, sealed by %s inside the range, is gone from the trail (deleted in ClickHouse?): the export cannot tell whether it belongs to the selection", clip(er.ID), fmtMilli(t), v.sealName(o))})
	case MarkExpired:
		v.rep.Expired++
	case MarkOther:
	default:
		v.problem(ExportProblem{Line: rec.line, ID: clip(er.ID), Kind: ExportMalformed, Reason: fmt.Sprintf("an entry with the unknown mark %q", clip(er.Mark))})
	}
}

// mark joins an exported mark with the line of its row key.
func (v *exportVerifier) mark(k lineKey, d store.Digest, seal string) {
	lr := v.lines[k]
	if lr == nil {
		if _, ok := v.dropped[k]; !ok && len(v.dropped) < 4*MaxExportProblems {
			v.dropped[k] = seal
		} else if !ok {
			v.rep.MoreProblems++
		}
		return
	}
	lr.matched = true
	if lr.digest != d && !lr.changed {
		lr.changed = true
		v.problem(ExportProblem{Line: lr.line, ID: clip(k.id), Kind: ExportChanged,
			Reason: fmt.Sprintf("event %q differs from what %s sealed: the line or the trail was edited", clip(k.id), seal)})
	}
}

func (v *exportVerifier) finishSeal(o *openSeal) {
	if o == nil || !o.ok {
		return
	}
	s := &o.seal
	fail := func(why string) {
		v.problem(ExportProblem{Line: o.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s: %s", s.ID(), why)})
	}
	switch {
	case o.count != s.Events:
		fail(fmt.Sprintf("%d entries follow it, the seal covers %d", o.count, s.Events))
	case o.over:
		fail(fmt.Sprintf("more than %d entries", MaxSealEntries))
	case o.corrupt > 0:
		fail(fmt.Sprintf("%d of its entries are not readable", o.corrupt))
	case len(o.entries) == 0:
		fail("it covers no entries (a seal is made for one event at least)")
	case Root(o.entries) != s.Root:
		fail("its entries do not match its root")
	default:
		first, last := o.entries[0].Time.Truncate(time.Second), o.entries[0].Time.Truncate(time.Second)
		for _, e := range o.entries {
			t := e.Time.Truncate(time.Second)
			if t.Before(first) {
				first = t
			}
			if t.After(last) {
				last = t
			}
		}
		if !first.Equal(s.FirstTime) || !last.Equal(s.LastTime) {
			fail("its entries' times do not match its first and last time")
		}
	}
	o.entries = nil
}

func (v *exportVerifier) checkManifest(rec *rawRecord, ph *proofHash) {
	fail := func(why string) {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportManifest, Reason: why})
	}
	var m exportManifest
	if err := strict(rec.obj, &m); err != nil {
		fail(fmt.Sprintf("the manifest is not readable: %v", err))
		return
	}
	h := v.header
	if m.Format != ExportFormat || m.Org != h.Org || m.From != h.From || m.To != h.To || m.AsOf != h.AsOf ||
		!slices.Equal(nonNil(m.Types), h.Types) || !slices.Equal(nonNil(m.Actors), h.Actors) || !slices.Equal(nonNil(m.Rooms), h.Rooms) {
		fail("the manifest's selection or as_of differs from the header's: the header was edited, or the two come from different exports")
	}
	sig, err := hex.DecodeString(m.Signature)
	switch {
	case err != nil || len(sig) != ed25519.SignatureSize:
		fail("the manifest's signature is not a hex Ed25519 signature")
	case !ed25519.Verify(v.pub, ManifestContent(v.sel, v.asOf, m.Events, m.Seals, m.Entries, m.ProofSHA256, m.KeyID), sig):
		if m.KeyID != v.pubID {
			fail(fmt.Sprintf("the manifest is signed with key %s, not with the given key %s", clip(m.KeyID), v.pubID))
		} else {
			fail(fmt.Sprintf("the manifest's signature does not verify with key %s: the manifest was edited", v.pubID))
		}
	}
	if m.Events != uint64(v.rep.Events) {
		fail(fmt.Sprintf("the manifest counts %d events, the file holds %d", m.Events, v.rep.Events))
	}
	if m.Seals != uint64(v.rep.Seals) || m.Entries != uint64(v.rep.Entries) {
		fail(fmt.Sprintf("the manifest counts %d seals and %d entries, the file holds %d and %d", m.Seals, m.Entries, v.rep.Seals, v.rep.Entries))
	}
	if got := ph.sum(); m.ProofSHA256 != got {
		fail("the proof records (seals and entries, marks included) do not match the manifest's proof hash: they were edited")
	}
}

// report names the lines of the chunk no mark matched and the marks no line matched.
// next is the boundary after the chunk (nil for the last).
func (v *exportVerifier) report(next *boundary) {
	var added []*lineRec
	keys := make([]lineKey, 0, len(v.lines))
	for k, lr := range v.lines {
		keys = append(keys, k)
		if !lr.matched {
			added = append(added, lr)
		}
	}
	slices.SortFunc(added, func(a, b *lineRec) int { return cmp.Compare(a.line, b.line) })
	for _, lr := range added {
		v.problem(ExportProblem{Line: lr.line, ID: clip(lr.id), Kind: ExportAdded,
			Reason: fmt.Sprintf("event %q is in no seal of the export: the line was added", clip(lr.id))})
	}
	if len(v.dropped) == 0 {
		return
	}
	slices.SortFunc(keys, compareLineKey)
	dropped := make([]lineKey, 0, len(v.dropped))
	for k := range v.dropped {
		dropped = append(dropped, k)
	}
	slices.SortFunc(dropped, compareLineKey)
	for _, k := range dropped {
		i := sort.Search(len(keys), func(i int) bool { return compareLineKey(keys[i], k) > 0 })
		at := v.proofLine
		switch {
		case i < len(keys):
			at = v.lines[keys[i]].line
		case next != nil:
			at = next.line
		}
		v.problem(ExportProblem{Line: at, ID: clip(k.id), Kind: ExportDropped,
			Reason: fmt.Sprintf("event %q at %s is missing from the file, though %s marks it exported (it belongs at line %d)", clip(k.id), fmtSec(time.Unix(k.sec, 0)), v.dropped[k], at)})
	}
	v.dropped = map[lineKey]string{}
}

// chunks joins lines and marks stretch by stretch of row keys when the lines do not
// fit in memory at once: each stretch reads the events, then the proof, again.
func (v *exportVerifier) chunks() error {
	bs := slices.Clone(v.boundaries)
	slices.SortFunc(bs, func(a, b boundary) int { return compareLineKey(a.key, b.key) })
	bs = slices.CompactFunc(bs, func(a, b boundary) bool { return compareLineKey(a.key, b.key) == 0 })
	for i := range bs {
		lo := bs[i].key
		var next *boundary
		if i+1 < len(bs) {
			next = &bs[i+1]
		}
		in := func(k lineKey) bool {
			return (i == 0 || compareLineKey(k, lo) >= 0) && (next == nil || compareLineKey(k, next.key) < 0)
		}
		v.lines = map[lineKey]*lineRec{}
		rr, err := v.reader(v.eventsStart, v.firstEventLine)
		if err != nil {
			return err
		}
		for n := 0; ; n++ {
			if n%4096 == 0 && v.ctx.Err() != nil {
				return v.ctx.Err()
			}
			rec, err := rr.next()
			if errors.Is(err, io.EOF) || err == nil && (rec.fatal || rec.start >= v.proofStart) {
				break
			}
			if err != nil {
				return err
			}
			if rec.bad != "" || rec.kind != KindEvent {
				continue
			}
			key, _, d, ok := v.event(rec, false)
			if !ok || !in(key) {
				continue
			}
			if len(v.lines) >= 2*v.opt.ChunkLines {
				v.problem(ExportProblem{Kind: ExportOrder, Reason: fmt.Sprintf("more than %d lines fall between two of every %d lines: the file is too far out of order to join its lines with the proof", 2*v.opt.ChunkLines, v.opt.ChunkLines)})
				return nil
			}
			v.addLine(key, rec.line, d)
		}
		rr, err = v.reader(v.proofStart, v.proofLine)
		if err != nil {
			return err
		}
		seal := ""
		for n := 0; ; n++ {
			if n%4096 == 0 && v.ctx.Err() != nil {
				return v.ctx.Err()
			}
			rec, err := rr.next()
			if errors.Is(err, io.EOF) || err == nil && rec.fatal {
				break
			}
			if err != nil {
				return err
			}
			switch {
			case rec.bad != "":
			case rec.kind == KindSeal:
				var sr exportSeal
				seal = fmt.Sprintf("the seal of line %d", rec.line)
				if strict(rec.obj, &sr) == nil {
					seal = SealID(sr.OrgID, sr.Seq)
				}
			case rec.kind == KindEntry:
				var er exportEntry
				if strict(rec.obj, &er) != nil || er.Mark != MarkExported {
					continue
				}
				t, ok := parseMilli(er.Time)
				d, dok := parseDigest(er.Digest)
				if !ok || !dok {
					continue
				}
				if k := (lineKey{sec: t.Unix(), id: er.ID}); in(k) {
					v.mark(k, d, seal)
				}
			}
		}
		v.report(next)
	}
	v.lines = nil
	return nil
}

// checkChain checks the links between the included seals: a seal whose seq − 1 is
// included links to one of those (forks are side by side).
func (v *exportVerifier) checkChain() {
	bySeq := map[uint64][]sealInfo{}
	hashes := map[string]int64{}
	for i, s := range v.seals {
		if line, ok := hashes[s.hash]; ok {
			v.problem(ExportProblem{Line: s.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s is included twice (line %d)", s.name, line)})
		}
		hashes[s.hash] = s.line
		bySeq[s.seq] = append(bySeq[s.seq], s)
		if i > 0 {
			p := v.seals[i-1]
			if p.seq > s.seq || p.seq == s.seq && p.hash > s.hash {
				v.problem(ExportProblem{Line: s.line, Kind: ExportOrder, Reason: fmt.Sprintf("%s comes after %s: seals are in (seq, hash) order", s.name, p.name)})
			}
		}
	}
	for _, s := range v.seals {
		switch {
		case s.seq == 0:
			v.problem(ExportProblem{Line: s.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s: seq 0, chains start at 1", s.name)})
		case s.seq == 1 && s.prev != "":
			v.problem(ExportProblem{Line: s.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s: the first seal links to a previous one", s.name)})
		case s.seq > 1 && len(bySeq[s.seq-1]) > 0:
			linked := false
			for _, p := range bySeq[s.seq-1] {
				linked = linked || p.hash == s.prev
			}
			if !linked {
				v.problem(ExportProblem{Line: s.line, Kind: ExportSeal, Reason: fmt.Sprintf("%s links to seal %s, which is not the export's seal %d: the chain is broken", s.name, short(s.prev), s.seq-1)})
			}
		}
	}
}
