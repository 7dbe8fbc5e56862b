package trail

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// Kinds of ExportProblem.
const (
	ExportChanged     = "changed"     // a line or gap is not its leaf at the checkpoint: content, bookkeeping or proof edited
	ExportDropped     = "dropped"     // a leaf the index records list has no line or gap in the file
	ExportAdded       = "added"       // a line or gap the index records do not list
	ExportSelection   = "selection"   // a line outside the export's selection
	ExportOrder       = "order"       // a record out of (time, id) order, or out of place
	ExportMalformed   = "malformed"   // a record that is not one the export format writes
	ExportCheckpoint  = "checkpoint"  // the checkpoint, a rotation record or the manifest's key is not trusted
	ExportManifest    = "manifest"    // the manifest does not verify or does not match the file
	ExportMissing     = "missing"     // a gap: a sealed event of the range is gone from the trail
	ExportModified    = "modified"    // a gap: a sealed event of the range is stored with other content
	ExportExpired     = "expired"     // a gap marked expired that no retention cut of the header excuses
	ExportConsistency = "consistency" // the log at the checkpoint does not extend a checkpoint held outside it
	ExportTruncated   = "truncated"   // the file stops before its manifest
)

// ExportProblem is one thing VerifyExport found wrong. Line is the line of the file
// where the record starts (for a dropped record: the line it belonged at), ID the
// event's id and Leaf its leaf index when there are some.
type ExportProblem struct {
	Line   int64   `json:"line,omitempty"`
	ID     string  `json:"id,omitempty"`
	Leaf   *uint64 `json:"leaf,omitempty"`
	Kind   string  `json:"kind"`
	Reason string  `json:"reason"`
}

// MaxExportProblems bounds the problems a report lists; the rest are counted.
const MaxExportProblems = 1000

// ExportReport is what VerifyExport found. Problems is never nil.
type ExportReport struct {
	Encoding     string `json:"encoding"`
	OriginPrefix string `json:"origin_prefix"`
	Org          string `json:"org"`
	From         string `json:"from"`
	To           string `json:"to"`
	// Size and Root are the checkpoint's; SignedAt and CheckpointKey say when and by
	// which key it was signed, KeyID which key signed the manifest.
	Size          uint64    `json:"size"`
	Root          string    `json:"root"`
	SignedAt      time.Time `json:"signed_at"`
	CheckpointKey string    `json:"checkpoint_key_id"`
	KeyID         string    `json:"key_id"`
	Events        int64     `json:"events"`
	Gaps          int64     `json:"gaps"`
	Expired       int64     `json:"expired"`
	// Consistent lists the held checkpoints (--checkpoint) the log at Size extends.
	Consistent   []string        `json:"consistent,omitempty"`
	Problems     []ExportProblem `json:"problems"`
	MoreProblems int64           `json:"more_problems,omitempty"`
}

// OK says whether the export proved itself.
func (r ExportReport) OK() bool { return len(r.Problems) == 0 && r.MoreProblems == 0 }

// ExportVerifyOptions say what VerifyExport trusts and how it reads.
type ExportVerifyOptions struct {
	// Anchors are the audit public keys the key ring starts from: the first or the
	// current key (the header's rotation records link the others).
	Anchors []ed25519.PublicKey
	// Prefix is the deployment's origin prefix the checkpoint must have; "" takes it
	// from the checkpoint (the report names it).
	Prefix string
	// Checkpoints are checkpoints kept outside the trail (an auditor's files): the
	// export's log must extend each, by a consistency record of its size.
	Checkpoints []External
	// ChunkLines is how many lines and index entries are held in memory at once
	// (default 1,000,000, about 60 MB); a larger export is joined in stretches of leaf
	// indexes, reading it again for each.
	ChunkLines int
}

// VerifyExport checks an export file offline (no database): the checkpoint against
// the key ring, every line and gap against it by its inclusion proof, the consistency
// records, the index records against the lines, and the manifest (ExportFormat's doc).
// Problems with the content are in the report; the error is for reading the file or
// ctx.
func VerifyExport(ctx context.Context, r io.ReaderAt, size int64, opt ExportVerifyOptions) (ExportReport, error) {
	if len(opt.Anchors) == 0 {
		return ExportReport{}, errors.New("no audit public key to check the export against (--audit-key)")
	}
	for _, a := range opt.Anchors {
		if len(a) != ed25519.PublicKeySize {
			return ExportReport{}, errors.New("an audit key is not an Ed25519 public key (--audit-key)")
		}
	}
	if opt.ChunkLines <= 0 {
		opt.ChunkLines = 1_000_000
	}
	v := &exportVerifier{ctx: ctx, ra: r, size: size, opt: opt, rep: ExportReport{Problems: []ExportProblem{}}, seen: map[string]bool{},
		consistency: map[uint64][][]byte{}}
	err := v.run()
	slices.SortStableFunc(v.rep.Problems, func(a, b ExportProblem) int { return cmp.Compare(lineOr(a.Line), lineOr(b.Line)) })
	return v.rep, err
}

// lineOr sorts problems without a line (about the whole file) last.
func lineOr(l int64) int64 {
	if l == 0 {
		return 1 << 62
	}
	return l
}

// heldRec is a line or gap as the join holds it.
type heldRec struct {
	leaf uint64
	line int64
	id   string
}

// idxEntry is one entry of the index records: the pos-th record's leaf.
type idxEntry struct {
	pos, leaf uint64
}

type exportVerifier struct {
	ctx  context.Context
	ra   io.ReaderAt
	size int64
	opt  ExportVerifyOptions
	rep  ExportReport
	seen map[string]bool // problems reported, to report each once

	enc     string
	header  ExportHeader
	sel     Selection
	ring    *tlog.KeyRing
	cp      *tlog.Checkpoint // nil: the checkpoint does not verify, and no proof can be checked
	prefix  string
	cuts    []chdb.Cut  // the header's cuts that verify
	cutBad  []string    // why the others do not
	rotFrom []time.Time // the rotations' hand-over times

	// consistency holds each consistency record's proof by size, once checked.
	consistency map[uint64][][]byte

	// The join of the lines and gaps with the index records.
	bodyStart, indexStart int64 // byte offsets of the first body and index record
	bodyLine, indexLine   int64
	trailerLine           int64 // the line of the first record after the body
	held                  []heldRec
	entries               []idxEntry
	inMemory              bool
	hist                  []uint32 // body records per bucket of leaf indexes
	histShift             uint
	indexCount            uint64
	matched               []uint64 // bitset over index positions
	dropped               []idxEntry
	manifest              bool
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

func (v *exportVerifier) run() error {
	if v.size == 0 {
		v.problem(ExportProblem{Kind: ExportTruncated, Reason: "the file is empty"})
		return nil
	}
	first := make([]byte, 1)
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
	if v.header.Kind == "" {
		return nil
	}
	if err := v.join(); err != nil {
		return err
	}
	v.checkHeld()
	return nil
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
	b := &budgetReader{r: bufio.NewReaderSize(io.NewSectionReader(ra, off, size-off), 1<<20), limit: MaxExportLineBytes + 1<<16}
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
	case r.rec.kind == KindEvent, r.rec.kind == "columns":
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

// Phases of a file: the body (events and gaps), then the consistency records, the
// index records and the manifest.
const (
	phaseBody = iota
	phaseConsistency
	phaseIndex
	phaseManifest
)

// passA reads the whole file once: the header, every line and gap (each checked), the
// consistency and index records and the manifest, holding the lines' and index's
// leaves while they fit. Lines and gaps are checked by workers, a batch each, and
// their results applied in file order, so that a report does not depend on timing.
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
		v.header = ExportHeader{}
		return nil
	}
	v.inMemory = true
	pl := v.newPipeline()
	defer pl.stop()
	ih := newIndexHash()
	phase := phaseBody
	var last *rawRecord
	var m *rawRecord
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
		p, known := kindPhase[rec.kind]
		if rec.bad != "" || phase == phaseBody && p == phaseBody && known {
			if v.bodyStart == 0 && rec.bad == "" {
				v.bodyStart, v.bodyLine = rec.start, rec.line
			}
			pl.add(rec)
			if rec.fatal {
				break
			}
			continue
		}
		pl.drain()
		switch {
		case rec.kind == KindError:
			var e exportError
			_ = json.Unmarshal(rec.obj, &e)
			v.problem(ExportProblem{Line: rec.line, Kind: ExportTruncated, Reason: fmt.Sprintf("the server stopped the export here: %s (`bandplane audit export --resume` continues it)", clip(e.Error))})
			continue
		case !known:
			v.problem(ExportProblem{Line: rec.line, Kind: ExportOrder, Reason: fmt.Sprintf("a %s record in the middle of the export", rec.kind)})
			continue
		case p < phase:
			v.problem(ExportProblem{Line: rec.line, Kind: ExportOrder, Reason: fmt.Sprintf("a %s record after the %s records began: the order is lines and gaps, consistency, index, manifest", rec.kind, phaseName(phase))})
			continue
		}
		if v.trailerLine == 0 {
			v.trailerLine = rec.line
		}
		phase = p
		switch rec.kind {
		case KindConsistency:
			v.consistencyRecord(rec)
		case KindIndex:
			if v.indexStart == 0 {
				v.indexStart, v.indexLine = rec.start, rec.line
			}
			ih.add(rec.obj)
			v.indexRecord(rec, func(pos, leaf uint64) {
				if !v.inMemory {
					return
				}
				if len(v.entries) >= 2*v.opt.ChunkLines {
					v.held, v.entries, v.inMemory = nil, nil, false
					return
				}
				v.entries = append(v.entries, idxEntry{pos: pos, leaf: leaf})
			})
		case KindManifest:
			m = rec
			v.manifest = true
		}
	}
	pl.drain()
	endLine := int64(2)
	if last != nil {
		endLine = last.line + 1
	}
	if v.trailerLine == 0 {
		v.trailerLine = endLine
	}
	for _, s := range v.header.Consistency {
		if _, ok := v.consistency[s]; !ok && v.manifest {
			v.problem(ExportProblem{Kind: ExportConsistency, Reason: fmt.Sprintf("the header asks for the consistency with size %d, and no consistency record of that size verifies", s)})
		}
	}
	if m != nil {
		v.checkManifest(m, ih.sum())
	} else {
		v.problem(ExportProblem{Line: endLine - 1, Kind: ExportTruncated, Reason: fmt.Sprintf("the file ends without its manifest after %d events: the export is incomplete (`bandplane audit export --resume` continues it)", v.rep.Events)})
	}
	return nil
}

// bodyResult is what a worker found of one line or gap (or unreadable record).
type bodyResult struct {
	kind     string
	line     int64
	held     heldRec
	ms       int64
	ok       bool // readable: held and ms are set
	expired  bool
	problems []ExportProblem
}

// bodyBatch is a run of consecutive body records and, once done is closed, their
// results.
type bodyBatch struct {
	recs []rawRecord
	res  []bodyResult
	done chan struct{}
}

// batchRecords is how many records one batch holds: neighbours share a worker, and
// so its cache of verified proof nodes.
const batchRecords = 512

// pipeline checks body records on every core and applies the results in order.
type pipeline struct {
	v       *exportVerifier
	jobs    chan *bodyBatch
	pending []*bodyBatch
	cur     *bodyBatch
	workers int
	wg      sync.WaitGroup

	prevMs   int64
	prevID   string
	prevLine int64
	prevKind string
	prevLeaf uint64
	havePrev bool
}

func (v *exportVerifier) newPipeline() *pipeline {
	pl := &pipeline{v: v, workers: max(1, runtime.GOMAXPROCS(0))}
	pl.jobs = make(chan *bodyBatch, pl.workers)
	for range pl.workers {
		w := &bodyWorker{v: v, canon: newEncoder(v.enc)}
		if v.cp != nil {
			w.checker = newProofChecker(v.cp.Size, v.cp.Root)
		}
		pl.wg.Go(func() {
			for b := range pl.jobs {
				b.res = make([]bodyResult, len(b.recs))
				for i := range b.recs {
					b.res[i] = w.check(&b.recs[i])
				}
				close(b.done)
			}
		})
	}
	return pl
}

// add queues a copy of rec (the readers reuse their buffers).
func (pl *pipeline) add(rec *rawRecord) {
	if pl.cur == nil {
		pl.cur = &bodyBatch{recs: make([]rawRecord, 0, batchRecords), done: make(chan struct{})}
	}
	c := *rec
	c.obj = bytes.Clone(rec.obj)
	c.fields = slices.Clone(rec.fields)
	pl.cur.recs = append(pl.cur.recs, c)
	if len(pl.cur.recs) == batchRecords {
		pl.send()
		for len(pl.pending) > 2*pl.workers {
			pl.apply()
		}
	}
}

func (pl *pipeline) send() {
	if pl.cur == nil {
		return
	}
	pl.jobs <- pl.cur
	pl.pending = append(pl.pending, pl.cur)
	pl.cur = nil
}

// apply waits for the oldest batch and applies its results.
func (pl *pipeline) apply() {
	b := pl.pending[0]
	pl.pending = pl.pending[1:]
	<-b.done
	v := pl.v
	for _, r := range b.res {
		for _, p := range r.problems {
			v.problem(p)
		}
		switch r.kind {
		case KindEvent:
			v.rep.Events++
		case KindGap:
			v.rep.Gaps++
		}
		if r.expired {
			v.rep.Expired++
		}
		if !r.ok {
			continue
		}
		if pl.havePrev {
			if why := pl.outOfOrder(&r); why != "" {
				v.problem(ExportProblem{Line: r.line, ID: clip(r.held.id), Kind: ExportOrder, Reason: why})
			}
		}
		pl.prevMs, pl.prevID, pl.prevLine, pl.prevKind, pl.prevLeaf, pl.havePrev = r.ms, r.held.id, r.line, r.kind, r.held.leaf, true
		v.hold(r.held)
	}
}

// outOfOrder says why r may not follow the previous record, or "": records are in
// (time, id) order, and those of one row key are its gaps in leaf order, then at most
// one line.
func (pl *pipeline) outOfOrder(r *bodyResult) string {
	switch c := leafOrder(r.ms, r.held.id, pl.prevMs, pl.prevID); {
	case c > 0:
		return ""
	case c < 0:
		return fmt.Sprintf("%s %q at %s comes after %q at %s (line %d): lines and gaps are in (time, id) order", r.kind, clip(r.held.id),
			fmtMilli(time.UnixMilli(r.ms)), clip(pl.prevID), fmtMilli(time.UnixMilli(pl.prevMs)), pl.prevLine)
	case pl.prevKind == KindGap && (r.kind == KindEvent || r.held.leaf > pl.prevLeaf):
		return ""
	case pl.prevKind == KindEvent:
		return fmt.Sprintf("%s %q at %s follows the line of the same event (line %d): an event has one line, after its gaps", r.kind, clip(r.held.id),
			fmtMilli(time.UnixMilli(r.ms)), pl.prevLine)
	}
	return fmt.Sprintf("gap %q at %s (leaf %d) follows the gap of leaf %d of the same event (line %d): an event's gaps are in leaf order", clip(r.held.id),
		fmtMilli(time.UnixMilli(r.ms)), r.held.leaf, pl.prevLeaf, pl.prevLine)
}

// drain applies every queued record.
func (pl *pipeline) drain() {
	pl.send()
	for len(pl.pending) > 0 {
		pl.apply()
	}
}

func (pl *pipeline) stop() {
	close(pl.jobs)
	pl.wg.Wait()
}

var kindPhase = map[string]int{KindEvent: phaseBody, KindGap: phaseBody, KindConsistency: phaseConsistency, KindIndex: phaseIndex, KindManifest: phaseManifest}

func phaseName(p int) string {
	return [...]string{"event", "consistency", "index", "manifest"}[p]
}

func (v *exportVerifier) eof(err error, line int64) error {
	if errors.Is(err, io.EOF) {
		v.problem(ExportProblem{Line: line, Kind: ExportTruncated, Reason: "the file ends before its header"})
		return nil
	}
	return err
}

// hold keeps a line's or gap's leaf for the join, and counts it by leaf bucket.
func (v *exportVerifier) hold(h heldRec) {
	if h.leaf >= v.header.Size {
		return // reported as changed: no leaf of the checkpoint
	}
	v.hist[h.leaf>>v.histShift]++
	if !v.inMemory {
		return
	}
	if len(v.held) >= v.opt.ChunkLines {
		v.held, v.entries, v.inMemory = nil, nil, false // joined chunk by chunk after this pass
		return
	}
	v.held = append(v.held, h)
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
	sel, err := v.header.selection()
	if err != nil {
		return fail(fmt.Sprintf("the header: %v", err))
	}
	if v.header.Encoding != v.enc {
		return fail(fmt.Sprintf("the header says %s, the file is %s", v.header.Encoding, v.enc))
	}
	if !identRe.MatchString(v.header.Database) {
		return fail(fmt.Sprintf("the header's database %q is not a plain identifier", clip(v.header.Database)))
	}
	v.sel = sel
	v.rep.Org, v.rep.From, v.rep.To, v.rep.Size = sel.Org, v.header.From, v.header.To, v.header.Size
	for v.histShift = 0; v.header.Size>>v.histShift > 1<<16; v.histShift++ {
	}
	v.hist = make([]uint32, (v.header.Size>>v.histShift)+1)
	v.openCheckpoint(rec.line)
	return true
}

// openCheckpoint builds the key ring from the anchors and the header's rotation
// records and opens the header's checkpoint with it; without a checkpoint that
// verifies, no proof can be checked (one problem says so, not one per line).
func (v *exportVerifier) openCheckpoint(line int64) {
	fail := func(why string) {
		v.problem(ExportProblem{Line: line, Kind: ExportCheckpoint, Reason: why + ": no line of the export can be checked"})
	}
	origin, _, _ := strings.Cut(v.header.Checkpoint, "\n")
	suffix := "/org/" + url.PathEscape(v.sel.Org)
	prefix, ok := strings.CutSuffix(origin, suffix)
	switch {
	case !ok || prefix == "":
		fail(fmt.Sprintf("the checkpoint's origin %q is not a log of organization %q", clip(origin), clip(v.sel.Org)))
		return
	case v.opt.Prefix != "" && prefix != v.opt.Prefix:
		fail(fmt.Sprintf("the checkpoint is of the deployment %q, not of %q", clip(prefix), clip(v.opt.Prefix)))
		return
	}
	if err := tlog.CheckPrefix(prefix); err != nil {
		fail(fmt.Sprintf("the checkpoint's origin prefix: %v", err))
		return
	}
	v.prefix, v.rep.OriginPrefix = prefix, prefix
	rotations := make([][]byte, len(v.header.Rotations))
	for i, r := range v.header.Rotations {
		rotations[i] = []byte(r)
		if rec, err := tlog.OpenRotation(prefix, rotations[i]); err == nil {
			v.rotFrom = append(v.rotFrom, rec.From)
		}
	}
	ring, err := tlog.NewKeyRing(prefix, v.opt.Anchors, rotations)
	if err != nil {
		fail(err.Error())
		return
	}
	v.ring = ring
	for _, p := range ring.Problems() {
		v.problem(ExportProblem{Line: line, Kind: ExportCheckpoint, Reason: "the header's " + p})
	}
	cp, err := ring.Open([]byte(v.header.Checkpoint))
	switch {
	case err != nil:
		fail("the checkpoint does not verify: " + err.Error())
		return
	case cp.Org != v.sel.Org || cp.Size != v.header.Size:
		fail(fmt.Sprintf("the checkpoint is of organization %q at size %d, the header says %q at %d", clip(cp.Org), cp.Size, clip(v.sel.Org), v.header.Size))
		return
	}
	v.cp = &cp
	v.rep.Root, v.rep.SignedAt, v.rep.CheckpointKey = base64.StdEncoding.EncodeToString(cp.Root), cp.SignedAt, cp.KeyID
	for i := range v.header.Cuts {
		c, ok := v.header.Cuts[i].cut()
		var why string
		switch {
		case !ok:
			why = "its times are not RFC 3339 in whole seconds"
		case c.Table != "events":
			why = fmt.Sprintf("it cuts table %q, not events", clip(c.Table))
		default:
			why = checkCut(&c, v.header.Database, ring)
		}
		if why != "" {
			v.cutBad = append(v.cutBad, fmt.Sprintf("the retention cut recorded at %s: %s", clip(v.header.Cuts[i].At), why))
			continue
		}
		v.cuts = append(v.cuts, c)
	}
}

// bodyWorker checks lines and gaps; it reads the verifier's header, checkpoint and
// cuts (set before any worker starts) and writes only its own scratch.
type bodyWorker struct {
	v       *exportVerifier
	canon   *encoder
	scratch []byte
	checker *proofChecker
	res     *bodyResult
}

func (w *bodyWorker) problem(p ExportProblem) { w.res.problems = append(w.res.problems, p) }

func (w *bodyWorker) check(rec *rawRecord) bodyResult {
	res := bodyResult{kind: rec.kind, line: rec.line}
	w.res = &res
	switch {
	case rec.bad != "":
		res.kind = ""
		w.problem(ExportProblem{Line: rec.line, Kind: rec.badKind, Reason: rec.bad})
	case rec.kind == KindEvent:
		res.held, res.ms, res.ok = w.event(rec)
	default:
		res.held, res.ms, res.ok = w.gap(rec)
	}
	return res
}

// event checks a line: canonical, in the selection, and its leaf (recomputed from the
// line) in the checkpoint's tree by its proof.
func (w *bodyWorker) event(rec *rawRecord) (heldRec, int64, bool) {
	bad := func(why, id string) (heldRec, int64, bool) {
		w.problem(ExportProblem{Line: rec.line, ID: id, Kind: ExportMalformed, Reason: why})
		return heldRec{}, 0, false
	}
	var ev exportEvent
	var err error
	layout := false // the line is byte for byte appendEventJSON's of ev
	switch {
	case w.v.enc == EncodingCSV:
		ev, err = eventFromCSV(rec.fields)
	case parseEventJSON(rec.obj, &ev, &w.scratch):
		layout = true
	default:
		// Not the layout an export writes: encoding/json reads it, and the canonical
		// check below judges it (unknown fields, duplicate keys and anything after the
		// object fail it: the line must be what re-encoding it gives).
		ev = exportEvent{}
		err = json.Unmarshal(rec.obj, &ev)
	}
	if err != nil {
		return bad(fmt.Sprintf("not an event record: %v", err), "")
	}
	row, err := ev.row()
	if err != nil {
		return bad(fmt.Sprintf("not an event record: %v", err), clip(ev.ID))
	}
	canon := eventRecord(&row, ev.Leaf, ev.Proof, w.v.enc)
	switch {
	case layout:
		if !sameEvent(&canon, &ev) {
			return bad("the line is not as an export writes it (base64 where none is needed, or an actor type not as stored)", clip(row.ID))
		}
	case w.v.enc == EncodingNDJSON:
		b, err := w.canon.event(&canon)
		if err != nil || !bytes.Equal(bytes.TrimSuffix(b, []byte("\n")), rec.obj) {
			return bad("the line is not in the export's canonical JSON (field order, spacing, escapes, base64 where none is needed, duplicate keys)", clip(row.ID))
		}
	case !slices.Equal(canon.csvFields(), rec.fields):
		return bad("the row is not as an export writes it (base64 where none is needed, or an actor type not as stored)", clip(row.ID))
	}
	if why := w.v.outside(&row); why != "" {
		w.problem(ExportProblem{Line: rec.line, ID: clip(row.ID), Kind: ExportSelection, Reason: "not in the export's selection: " + why})
	}
	lf := tlog.LeafOf(&row)
	w.prove(rec.line, "event", row.ID, ev.Leaf, lf.Hash(), ev.Proof, "the line or its proof was edited, or it is an event of another log")
	return heldRec{leaf: ev.Leaf, line: rec.line, id: row.ID}, row.Time.UnixMilli(), true
}

// prove checks a record's leaf hash at leaf against the checkpoint's root.
func (w *bodyWorker) prove(line int64, kind, id string, leaf uint64, hash []byte, proof, why string) {
	if w.checker == nil {
		return
	}
	size := w.v.cp.Size
	changed := func(reason string) {
		w.problem(ExportProblem{Line: line, ID: clip(id), Leaf: leafRef(leaf), Kind: ExportChanged, Reason: reason})
	}
	if leaf >= size {
		changed(fmt.Sprintf("%s %q names leaf %d, beyond the checkpoint's %d leaves", kind, clip(id), leaf, size))
		return
	}
	ok, err := w.checker.verify(leaf, hash, proof)
	switch {
	case err != nil:
		changed(fmt.Sprintf("%s %q: %v", kind, clip(id), err))
	case !ok:
		changed(fmt.Sprintf("%s %q is not leaf %d of the log at size %d: %s", kind, clip(id), leaf, size, why))
	}
}

// gap checks a gap record: canonical, in the range, its leaf in the checkpoint's tree
// by its proof, and an expired one's retention cut.
func (w *bodyWorker) gap(rec *rawRecord) (heldRec, int64, bool) {
	v := w.v
	var g exportGap
	if err := strict(rec.obj, &g); err != nil || g.Kind != KindGap {
		w.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: fmt.Sprintf("a gap record that is not readable (%v)", err)})
		return heldRec{}, 0, false
	}
	lf, err := g.leaf(v.sel.Org)
	if err != nil {
		w.problem(ExportProblem{Line: rec.line, ID: clip(g.ID), Kind: ExportMalformed, Reason: fmt.Sprintf("a gap record that is not readable: %v", err)})
		return heldRec{}, 0, false
	}
	il := IndexedLeaf{Leaf: lf, Index: g.Leaf}
	if b, err := w.canon.object(gapRecord(&il, g.Mark, g.Proof)); err != nil || !bytes.Equal(b, rec.obj) {
		w.problem(ExportProblem{Line: rec.line, ID: clip(lf.ID), Kind: ExportMalformed, Reason: "the gap record is not in the export's canonical JSON"})
		return heldRec{}, 0, false
	}
	if !v.sel.inRange(lf.Time) {
		w.problem(ExportProblem{Line: rec.line, ID: clip(lf.ID), Leaf: leafRef(g.Leaf), Kind: ExportSelection,
			Reason: fmt.Sprintf("a gap at %s, outside [%s, %s)", fmtMilli(lf.Time), v.header.From, v.header.To)})
	}
	w.prove(rec.line, "gap", lf.ID, g.Leaf, lf.Hash(), g.Proof, "the gap or its proof was edited")
	at := fmtMilli(lf.Time)
	switch g.Mark {
	case MarkMissing:
		w.problem(ExportProblem{Line: rec.line, ID: clip(lf.ID), Leaf: leafRef(g.Leaf), Kind: ExportMissing,
			Reason: fmt.Sprintf("event %q at %s (leaf %d), sealed inside the range, is gone from the trail (deleted in ClickHouse?): the export cannot tell whether it belongs to the selection", clip(lf.ID), at, g.Leaf)})
	case MarkModified:
		w.problem(ExportProblem{Line: rec.line, ID: clip(lf.ID), Leaf: leafRef(g.Leaf), Kind: ExportModified,
			Reason: fmt.Sprintf("event %q at %s (leaf %d), sealed inside the range, is stored with other content or bookkeeping than its leaf sealed (edited in ClickHouse?): the export carries the sealed digest, not the stored row", clip(lf.ID), at, g.Leaf)})
	case MarkExpired:
		if coveredOffline(v.cuts, lf.Time, lf.IngestedAt) {
			w.res.expired = true
			break
		}
		why := "no retention cut of the header covers its time after it was written"
		if len(v.cutBad) > 0 {
			why += "; " + strings.Join(v.cutBad, "; ")
		}
		w.problem(ExportProblem{Line: rec.line, ID: clip(lf.ID), Leaf: leafRef(g.Leaf), Kind: ExportExpired,
			Reason: fmt.Sprintf("event %q at %s (leaf %d) is marked expired, but %s", clip(lf.ID), at, g.Leaf, why)})
	default:
		w.problem(ExportProblem{Line: rec.line, ID: clip(lf.ID), Kind: ExportMalformed, Reason: fmt.Sprintf("a gap with the unknown mark %q", clip(g.Mark))})
	}
	return heldRec{leaf: g.Leaf, line: rec.line, id: lf.ID}, lf.Time.UnixMilli(), true
}

// outside says why a row is not in the selection, or "".
func (v *exportVerifier) outside(r *store.EventRow) string {
	s := &v.sel
	switch {
	case r.OrgID != s.Org:
		return fmt.Sprintf("organization %q, the export's is %q", clip(r.OrgID), clip(s.Org))
	case !s.inRange(r.Time):
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

// consistencyRecord checks a consistency record on its own: a size the header asks
// for, and a proof from its root to the checkpoint's.
func (v *exportVerifier) consistencyRecord(rec *rawRecord) {
	fail := func(kind, why string) {
		v.problem(ExportProblem{Line: rec.line, Kind: kind, Reason: why})
	}
	var c exportConsistency
	if err := strict(rec.obj, &c); err != nil || c.Kind != KindConsistency {
		fail(ExportMalformed, fmt.Sprintf("a consistency record that is not readable (%v)", err))
		return
	}
	if !slices.Contains(v.header.Consistency, c.Size) {
		fail(ExportConsistency, fmt.Sprintf("a consistency record of size %d, which the header does not ask for", c.Size))
		return
	}
	if _, ok := v.consistency[c.Size]; ok {
		fail(ExportConsistency, fmt.Sprintf("a second consistency record of size %d", c.Size))
		return
	}
	root, err := base64.StdEncoding.DecodeString(c.Root)
	pr, perr := decodeProof(c.Proof)
	if err != nil || len(root) != 32 || perr != nil {
		fail(ExportMalformed, fmt.Sprintf("the consistency record of size %d holds no root or proof an export writes", c.Size))
		return
	}
	if v.cp == nil {
		return
	}
	if tlog.VerifyConsistency(c.Size, v.cp.Size, pr, root, v.cp.Root) != nil {
		fail(ExportConsistency, fmt.Sprintf("the consistency record of size %d does not prove that the log at size %d extends it: the record was edited", c.Size, v.cp.Size))
		return
	}
	v.consistency[c.Size] = append([][]byte{root}, pr...)
}

// indexRecord reads an index record, passing each entry to fn.
func (v *exportVerifier) indexRecord(rec *rawRecord, fn func(pos, leaf uint64)) {
	var x exportIndex
	if err := strict(rec.obj, &x); err != nil || x.Kind != KindIndex {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportMalformed, Reason: fmt.Sprintf("an index record that is not readable (%v)", err)})
		return
	}
	if x.First != v.indexCount {
		v.problem(ExportProblem{Line: rec.line, Kind: ExportManifest, Reason: fmt.Sprintf("an index record that starts at entry %d, after %d entries", x.First, v.indexCount)})
	}
	for _, leaf := range x.Leaves {
		if leaf >= v.header.Size {
			v.problem(ExportProblem{Line: rec.line, Kind: ExportManifest, Reason: fmt.Sprintf("the index lists leaf %d, beyond the checkpoint's %d leaves", leaf, v.header.Size)})
		} else {
			fn(v.indexCount, leaf)
		}
		v.indexCount++
	}
}

// manifestKey is the ring key that may have signed the manifest: one valid at the
// checkpoint's time or after it (a key rotated in since signs exports of an older
// checkpoint).
func (v *exportVerifier) manifestKey(id string) (ed25519.PublicKey, string) {
	times := []time.Time{v.cp.SignedAt, time.Unix(1<<40, 0)}
	for _, t := range v.rotFrom {
		if t.After(v.cp.SignedAt) {
			times = append(times, t)
		}
	}
	var why string
	for _, t := range times {
		pub, w := v.ring.Trusted(id, t)
		if pub != nil {
			return pub, ""
		}
		if why == "" {
			why = w
		}
	}
	return nil, why
}

func (v *exportVerifier) checkManifest(rec *rawRecord, index string) {
	fail := func(kind, why string) {
		v.problem(ExportProblem{Line: rec.line, Kind: kind, Reason: why})
	}
	var m exportManifest
	if err := strict(rec.obj, &m); err != nil || m.Kind != KindManifest {
		fail(ExportManifest, fmt.Sprintf("the manifest is not readable (%v)", err))
		return
	}
	v.rep.KeyID = m.KeyID
	h := v.header
	if m.Format != ExportFormat || m.Database != h.Database || m.Org != h.Org || m.From != h.From || m.To != h.To || m.Size != h.Size ||
		!slices.Equal(nonNil(m.Types), nonNil(h.Types)) || !slices.Equal(nonNil(m.Actors), nonNil(h.Actors)) || !slices.Equal(nonNil(m.Rooms), nonNil(h.Rooms)) ||
		!slices.Equal(nonNilSizes(m.Consistency), nonNilSizes(h.Consistency)) {
		fail(ExportManifest, "the manifest's selection, database, size or consistency sizes differ from the header's: the header was edited, or the two come from different exports")
	}
	if m.Proves != ExportProves || m.DoesNotProve != ExportDoesNotProve {
		fail(ExportManifest, "the manifest's statements of what the export proves are not the format's")
	}
	if v.cp == nil {
		return
	}
	if m.Root != base64.StdEncoding.EncodeToString(v.cp.Root) {
		fail(ExportManifest, "the manifest's root is not the checkpoint's")
	}
	pub, why := v.manifestKey(m.KeyID)
	sig, err := hex.DecodeString(m.Signature)
	switch {
	case pub == nil:
		fail(ExportCheckpoint, fmt.Sprintf("the manifest is signed with key %s, which the key ring does not trust: %s", clip(m.KeyID), why))
	case err != nil || len(sig) != ed25519.SignatureSize:
		fail(ExportManifest, "the manifest's signature is not a hex Ed25519 signature")
	case !ed25519.Verify(pub, ManifestContent(h.Database, v.sel, v.cp.Size, v.cp.Root, normSizes(h.Consistency), m.Events, m.Gaps, m.IndexSHA256, m.KeyID), sig):
		fail(ExportManifest, fmt.Sprintf("the manifest's signature does not verify with key %s: the manifest was edited", clip(m.KeyID)))
	}
	if m.Events != uint64(v.rep.Events) || m.Gaps != uint64(v.rep.Gaps) {
		fail(ExportManifest, fmt.Sprintf("the manifest counts %d events and %d gaps, the file holds %d and %d", m.Events, m.Gaps, v.rep.Events, v.rep.Gaps))
	}
	if m.IndexSHA256 != index {
		fail(ExportManifest, "the index records do not match the manifest's index hash: they were edited")
	} else if v.indexCount != m.Events+m.Gaps {
		fail(ExportManifest, fmt.Sprintf("the index records list %d leaves for %d events and %d gaps", v.indexCount, m.Events, m.Gaps))
	}
}

// join matches the lines and gaps with the index records, by leaf: a leaf the index
// lists that no record has is dropped (named with the line it belonged at), a record
// the index does not list is added. What does not fit in memory is joined in stretches
// of leaf indexes, each reading the file again.
func (v *exportVerifier) join() error {
	v.matched = make([]uint64, (v.indexCount+63)/64)
	if v.inMemory {
		v.joinChunk(v.held, v.entries)
		return v.placeDropped()
	}
	var chunks [][2]uint64 // [lo, hi) of leaf indexes
	var n uint64
	for b, c := range v.hist {
		lo := uint64(b) << v.histShift
		if len(chunks) > 0 && n+uint64(c) <= uint64(v.opt.ChunkLines) {
			chunks[len(chunks)-1][1] = lo + 1<<v.histShift
			n += uint64(c)
			continue
		}
		chunks = append(chunks, [2]uint64{lo, lo + 1<<v.histShift})
		n = uint64(c)
	}
	for _, c := range chunks {
		in := func(leaf uint64) bool { return leaf >= c[0] && leaf < c[1] }
		var held []heldRec
		if err := v.eachBody(func(h heldRec) {
			if in(h.leaf) {
				held = append(held, h)
			}
		}); err != nil {
			return err
		}
		var entries []idxEntry
		over := false
		if err := v.eachIndex(func(e idxEntry) {
			if in(e.leaf) && !over {
				if len(entries) > 2*v.opt.ChunkLines+len(held) {
					over = true
					return
				}
				entries = append(entries, e)
			}
		}); err != nil {
			return err
		}
		if over {
			v.problem(ExportProblem{Kind: ExportManifest, Reason: fmt.Sprintf("the index lists far more leaves between %d and %d than the file has lines and gaps there: it cannot be joined with them", c[0], c[1])})
			return nil
		}
		v.joinChunk(held, entries)
	}
	return v.placeDropped()
}

// eachBody reads the lines and gaps again, passing each one's leaf, line and id.
func (v *exportVerifier) eachBody(fn func(heldRec)) error {
	if v.bodyStart == 0 {
		return nil
	}
	rr, err := v.reader(v.bodyStart, v.bodyLine)
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		if n%4096 == 0 && v.ctx.Err() != nil {
			return v.ctx.Err()
		}
		rec, err := rr.next()
		if errors.Is(err, io.EOF) || err == nil && rec.fatal {
			return nil
		}
		if err != nil {
			return err
		}
		if rec.bad != "" {
			continue
		}
		switch rec.kind {
		case KindEvent:
			var ev exportEvent
			if v.enc == EncodingNDJSON {
				err = json.Unmarshal(rec.obj, &ev)
			} else {
				ev, err = eventFromCSV(rec.fields)
			}
			if err != nil {
				continue
			}
			row, err := ev.row()
			if err != nil || ev.Leaf >= v.header.Size {
				continue
			}
			fn(heldRec{leaf: ev.Leaf, line: rec.line, id: row.ID})
		case KindGap:
			var g exportGap
			if strict(rec.obj, &g) != nil {
				continue
			}
			if lf, err := g.leaf(v.sel.Org); err == nil && g.Leaf < v.header.Size {
				fn(heldRec{leaf: g.Leaf, line: rec.line, id: lf.ID})
			}
		case KindConsistency, KindIndex, KindManifest:
			return nil
		}
	}
}

// eachIndex reads the index records again, passing each entry.
func (v *exportVerifier) eachIndex(fn func(idxEntry)) error {
	if v.indexStart == 0 {
		return nil
	}
	rr, err := v.reader(v.indexStart, v.indexLine)
	if err != nil {
		return err
	}
	pos := uint64(0)
	for {
		rec, err := rr.next()
		if errors.Is(err, io.EOF) || err == nil && (rec.fatal || rec.kind == KindManifest) {
			return nil
		}
		if err != nil {
			return err
		}
		var x exportIndex
		if rec.bad != "" || rec.kind != KindIndex || strict(rec.obj, &x) != nil {
			continue
		}
		for _, leaf := range x.Leaves {
			if leaf < v.header.Size {
				fn(idxEntry{pos: pos, leaf: leaf})
			}
			pos++
		}
	}
}

// joinChunk matches the records and index entries of one stretch of leaves.
func (v *exportVerifier) joinChunk(held []heldRec, entries []idxEntry) {
	slices.SortFunc(held, func(a, b heldRec) int { return cmp.Or(cmp.Compare(a.leaf, b.leaf), cmp.Compare(a.line, b.line)) })
	used := make([]bool, len(held))
	for _, e := range entries {
		i := sort.Search(len(held), func(i int) bool { return held[i].leaf >= e.leaf })
		for i < len(held) && held[i].leaf == e.leaf && used[i] {
			i++
		}
		if i < len(held) && held[i].leaf == e.leaf {
			used[i] = true
			v.matched[e.pos/64] |= 1 << (e.pos % 64)
			continue
		}
		if len(v.dropped) < 4*MaxExportProblems {
			v.dropped = append(v.dropped, e)
		} else {
			v.rep.MoreProblems++
		}
	}
	for i, h := range held {
		if used[i] {
			continue
		}
		reason := fmt.Sprintf("%q (leaf %d) is in no index record of the export: the line was added", clip(h.id), h.leaf)
		for j := i - 1; j >= 0 && held[j].leaf == h.leaf; j-- {
			if used[j] {
				reason = fmt.Sprintf("%q repeats leaf %d of line %d", clip(h.id), h.leaf, held[j].line)
				break
			}
		}
		v.problem(ExportProblem{Line: h.line, ID: clip(h.id), Leaf: leafRef(h.leaf), Kind: ExportAdded, Reason: reason})
	}
}

// placeDropped names each dropped leaf with the line it belonged at: the line of the
// next entry of the index that has its record (the first trailer line when none has).
func (v *exportVerifier) placeDropped() error {
	if len(v.dropped) == 0 {
		return nil
	}
	slices.SortFunc(v.dropped, func(a, b idxEntry) int { return cmp.Compare(a.pos, b.pos) })
	next := make(map[uint64]uint64, len(v.dropped)) // dropped position -> the next matched position
	for _, d := range v.dropped {
		for p := d.pos + 1; p < v.indexCount; p++ {
			if v.matched[p/64]&(1<<(p%64)) != 0 {
				next[d.pos] = p
				break
			}
		}
	}
	want := map[uint64]uint64{} // matched position -> its leaf
	for _, p := range next {
		want[p] = 0
	}
	leafLine := map[uint64]int64{}
	if v.inMemory {
		for _, e := range v.entries {
			if _, ok := want[e.pos]; ok {
				want[e.pos] = e.leaf
			}
		}
		for _, h := range v.held {
			leafLine[h.leaf] = h.line
		}
	} else {
		if err := v.eachIndex(func(e idxEntry) {
			if _, ok := want[e.pos]; ok {
				want[e.pos] = e.leaf
			}
		}); err != nil {
			return err
		}
		leaves := map[uint64]bool{}
		for _, l := range want {
			leaves[l] = true
		}
		if err := v.eachBody(func(h heldRec) {
			if leaves[h.leaf] {
				if _, ok := leafLine[h.leaf]; !ok {
					leafLine[h.leaf] = h.line
				}
			}
		}); err != nil {
			return err
		}
	}
	for _, d := range v.dropped {
		at := v.trailerLine
		if p, ok := next[d.pos]; ok {
			if l, ok := leafLine[want[p]]; ok {
				at = l
			}
		}
		v.problem(ExportProblem{Line: at, Leaf: leafRef(d.leaf), Kind: ExportDropped,
			Reason: fmt.Sprintf("leaf %d, the %d-th line or gap of the export, is missing from the file (it belongs at line %d)", d.leaf, d.pos+1, at)})
	}
	return nil
}

// checkHeld checks the checkpoints held outside the trail (an auditor's files): the
// export's log must extend each.
func (v *exportVerifier) checkHeld() {
	for _, e := range v.opt.Checkpoints {
		fail := func(kind, why string) {
			v.problem(ExportProblem{Kind: kind, Reason: fmt.Sprintf("the checkpoint of %s %s", e.Source, why)})
		}
		if v.ring == nil || v.cp == nil {
			fail(ExportConsistency, "cannot be compared: the export's checkpoint does not verify")
			continue
		}
		held, err := v.ring.Open(e.Note)
		switch {
		case err != nil:
			fail(ExportCheckpoint, "does not verify: "+err.Error())
			continue
		case held.Origin != v.cp.Origin:
			fail(ExportConsistency, fmt.Sprintf("is of the log %s, the export's is %s", clip(held.Origin), clip(v.cp.Origin)))
			continue
		case held.Size > v.cp.Size:
			fail(ExportConsistency, fmt.Sprintf("has %d leaves, the export's checkpoint %d: the log was rolled back, or export with as_of ≥ %d", held.Size, v.cp.Size, held.Size))
			continue
		}
		var pr [][]byte
		if held.Size < v.cp.Size {
			c, ok := v.consistency[held.Size]
			if !ok {
				fail(ExportConsistency, fmt.Sprintf("(size %d) has no consistency record in the export: export with --checkpoint %s", held.Size, e.Source))
				continue
			}
			pr = c[1:]
		}
		if err := tlog.Extends(&held, v.cp, pr); err != nil {
			fail(ExportConsistency, "is not extended by the export's log: "+err.Error())
			continue
		}
		v.rep.Consistent = append(v.rep.Consistent, fmt.Sprintf("%s (size %d)", e.Source, held.Size))
	}
}
