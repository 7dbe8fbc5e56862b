package trail

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// Defaults of ExportConfig.
const (
	DefaultExportWindowRows = 20_000
	DefaultExportIndexChunk = 500_000
)

// ErrExportConflict is wrapped by Prepare when the trail cannot give the export asked
// for (HTTP 409): nothing sealed yet, an as_of no verified checkpoint has, a
// consistency size beyond the checkpoint, a log the checkpoints topic shows rolled
// back or forked, a cursor of another export, or a log that does not match its
// checkpoint. Stream wraps it too when it finds the log edited part-way.
var ErrExportConflict = errors.New("the export conflicts with the trail")

// ExportConfig configures an Exporter.
type ExportConfig struct {
	Conn     driver.Conn
	Database string
	// Prefix is the deployment's origin prefix (tlog.DefaultPrefix(Database) when
	// empty).
	Prefix string
	// Key signs the manifests (the audit key); its public half anchors the key ring.
	Key ed25519.PrivateKey
	// Anchors are further audit keys the ring trusts (rotation records link the
	// others).
	Anchors []ed25519.PublicKey
	// Margin is how far before its leaf's ingested_at a stored copy may have been
	// written and still be the leaf's (0: DefaultMargin), as verify has it.
	Margin time.Duration
	Logger *slog.Logger
	// WindowRows is about how many rows (stored copies and leaves) one window of the
	// stream reads and holds.
	WindowRows int
	// IndexChunk is how many log_index rows one read of the scan asks for (they are
	// streamed, not held).
	IndexChunk int
	// Published reads the newest checkpoint of every organization from the checkpoints
	// topic, as the sealer's Config.Published does. An export pinned to the newest
	// checkpoint is refused when the topic's, verified with the key ring, is larger or
	// is not on the pinned log: ClickHouse alone cannot show that it was rolled back.
	// nil: not compared (ClickHouse's newest checkpoint is pinned unchecked).
	Published func(ctx context.Context) (map[string][]byte, error)
}

func (c *ExportConfig) Validate() error {
	var errs []error
	if c.Conn == nil {
		errs = append(errs, errors.New("export: no clickhouse connection"))
	}
	if !identRe.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("export: database %q is not a plain identifier", c.Database))
	}
	if c.Prefix != "" {
		if err := tlog.CheckPrefix(c.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("export: --audit-origin: %w", err))
		}
	}
	if len(c.Key) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("export: no Ed25519 private key (--audit-key)"))
	}
	for i, a := range c.Anchors {
		if len(a) != ed25519.PublicKeySize {
			errs = append(errs, fmt.Errorf("export: anchor %d is not an Ed25519 public key", i+1))
		}
	}
	if c.Margin < 0 || c.WindowRows < 0 || c.IndexChunk < 0 {
		errs = append(errs, fmt.Errorf("export: margin (%s), window rows (%d) and index chunk (%d) must not be negative", c.Margin, c.WindowRows, c.IndexChunk))
	}
	return errors.Join(errs...)
}

// Exporter streams compliance exports of one database (ExportFormat's doc).
type Exporter struct {
	cfg   ExportConfig
	db    logDB
	pub   ed25519.PublicKey
	keyID string
	log   *slog.Logger
}

func NewExporter(cfg ExportConfig) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = tlog.DefaultPrefix(cfg.Database)
	}
	if cfg.Margin == 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.WindowRows == 0 {
		cfg.WindowRows = DefaultExportWindowRows
	}
	if cfg.IndexChunk == 0 {
		cfg.IndexChunk = DefaultExportIndexChunk
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pub := cfg.Key.Public().(ed25519.PublicKey)
	return &Exporter{cfg: cfg, db: logDB{conn: cfg.Conn, db: cfg.Database}, pub: pub, keyID: tlog.KeyID(pub),
		log: log.With("component", "audit_export", "key_id", tlog.KeyID(pub))}, nil
}

// KeyID names the key that signs the manifests.
func (x *Exporter) KeyID() string { return x.keyID }

// Prefix is the deployment's origin prefix.
func (x *Exporter) Prefix() string { return x.cfg.Prefix }

// Export is one prepared export: the checkpoint is pinned, the log scanned and the
// reads planned. Stream runs it once.
type Export struct {
	x       *Exporter
	req     ExportRequest
	cp      tlog.Checkpoint
	ring    *tlog.KeyRing
	header  ExportHeader
	cuts    cuts
	offline []chdb.Cut // the header's cuts, as the verifier sees them
	sc      *leafScan
	windows []window
	start   int // the window Stream starts at
	covers  coverCache
	checker *proofChecker

	// What the lines and gaps came to so far (those before a resume cursor included).
	events, gaps uint64
	index        indexList
	lastMs       int64 // the last line counted before the cursor
	lastID       string
	streamed     bool
}

// window is [lo, hi) of event time in Unix seconds.
type window struct{ lo, hi int64 }

// Header is the export's header (also when it is not written: a resumed export).
func (e *Export) Header() ExportHeader { return e.header }

// Checkpoint is the checkpoint the export is pinned to.
func (e *Export) Checkpoint() tlog.Checkpoint { return e.cp }

// Expected is about how many event lines the whole export has (the resumed part
// included): the leaves of the range, before duplicates, the lists and gaps.
func (e *Export) Expected() uint64 { return e.sc.inRange }

// maxForgedExport bounds the checkpoint rows that do not verify the exporter reads
// past, above an organization's newest verified one: more is a table that needs audit
// verify.
const maxForgedExport = 1000

// Prepare checks the request against the trail, pins the checkpoint, scans the log up
// to it and plans the reads; a resumed export also recounts its lines up to the
// cursor. A request the trail cannot serve is an error wrapping ErrExportConflict.
func (x *Exporter) Prepare(ctx context.Context, req ExportRequest) (*Export, error) {
	req.Selection.Normalize()
	if err := req.Selection.Validate(); err != nil {
		return nil, err
	}
	if req.Encoding != EncodingNDJSON && req.Encoding != EncodingCSV {
		return nil, fmt.Errorf("format: %q is not ndjson or csv", clip(req.Encoding))
	}
	if len(req.Consistency) > MaxConsistency {
		return nil, fmt.Errorf("consistency: %d sizes; at most %d", len(req.Consistency), MaxConsistency)
	}
	req.Consistency = normSizes(req.Consistency)
	if len(req.Consistency) > 0 && req.Consistency[0] == 0 {
		return nil, errors.New("consistency: 0 is not the size of a checkpoint")
	}
	if req.After != nil && req.AsOf == 0 {
		return nil, errors.New("after: needs as_of, the size of the export it continues")
	}
	sel := req.Selection
	// The topic is read before ClickHouse: the sealer stores a checkpoint before it
	// publishes it, so a checkpoint the topic held then is in ClickHouse by the pin.
	var published []byte
	var latest map[string][]byte
	if req.AsOf == 0 && x.cfg.Published != nil {
		var err error
		if latest, err = x.cfg.Published(ctx); err != nil {
			return nil, fmt.Errorf("cannot read the newest checkpoints from the checkpoints topic: %w", err)
		}
		published = latest[sel.Org]
	}
	rotations, err := x.rotations(ctx, TopicRotations(latest))
	if err != nil {
		return nil, err
	}
	ring, err := tlog.NewKeyRing(x.cfg.Prefix, append([]ed25519.PublicKey{x.pub}, x.cfg.Anchors...), rotations)
	if err != nil {
		return nil, err
	}
	for _, p := range ring.Problems() {
		x.log.Warn("a key rotation record is not followed", "problem", p)
	}
	cp, err := x.pin(ctx, ring, sel.Org, req.AsOf)
	if err != nil {
		if published != nil && errors.As(err, new(noCheckpointError)) {
			// No checkpoint ClickHouse holds verifies: one on the topic means that they
			// were removed.
			if _, terr := x.compareTopic(ring, &tlog.Checkpoint{Org: sel.Org}, published); terr != nil {
				return nil, terr
			}
		}
		return nil, err
	}
	var topic *tlog.Checkpoint
	if published != nil {
		if topic, err = x.compareTopic(ring, &cp, published); err != nil {
			return nil, err
		}
	}
	if n := len(req.Consistency); n > 0 && req.Consistency[n-1] > cp.Size {
		m := req.Consistency[n-1]
		return nil, fmt.Errorf("%w: consistency: the log of org %q has %d leaves at the pinned checkpoint, fewer than the %d of the checkpoint you hold: it was rolled back, or pin the export at as_of ≥ %d",
			ErrExportConflict, sel.Org, cp.Size, m, m)
	}
	e := &Export{x: x, req: req, cp: cp, ring: ring}
	if c := req.After; c != nil {
		if c.Bind != binding(sel, req.Encoding, string(cp.Note), req.Consistency) {
			return nil, fmt.Errorf("%w: the cursor belongs to another export (its selection, format, checkpoint or consistency sizes differ from this request's): resume with the file's own header", ErrExportConflict)
		}
		if c.Events > 0 && !sel.inRange(c.Time) {
			return nil, fmt.Errorf("%w: the cursor's event at %s is outside the selection's range", ErrExportConflict, fmtMilli(c.Time))
		}
	}
	if e.cuts, err = loadCuts(ctx, x.cfg.Conn, x.cfg.Database, ring); err != nil {
		return nil, err
	}
	for _, c := range e.cuts.honoured {
		if c.Before.After(sel.From) {
			e.offline = append(e.offline, c)
		}
	}
	if len(e.offline) > maxHeaderCuts {
		return nil, fmt.Errorf("%w: %d retention cuts cover the range, more than an export carries (%d)", ErrExportConflict, len(e.offline), maxHeaderCuts)
	}
	e.header = newHeader(x.cfg.Database, sel, req, &cp, rotations, e.offline)
	sizes := req.Consistency
	if topic != nil && topic.Size < cp.Size {
		sizes = append(slices.Clone(sizes), topic.Size)
	}
	if e.sc, err = x.scan(ctx, &cp, sel, sizes); err != nil {
		return nil, err
	}
	if topic != nil && topic.Size < cp.Size && !bytes.Equal(e.sc.roots[topic.Size], topic.Root) {
		return nil, fmt.Errorf("%w: the log of org %q at size %d does not extend the checkpoints topic's newest checkpoint (size %d, signed at %s): its leaves give another root at that size (forked or edited); run bandplane audit verify",
			ErrExportConflict, sel.Org, cp.Size, topic.Size, topic.SignedAt.Format(time.RFC3339))
	}
	lo, hi := sel.From.Unix(), sel.To.Unix()
	if sel.To.Nanosecond() > 0 {
		hi++
	}
	if e.windows, err = e.plan(ctx, lo, hi, 0); err != nil {
		return nil, err
	}
	if c := req.After; c != nil && c.Events > 0 {
		if err := e.recount(ctx, c); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func newHeader(db string, s Selection, req ExportRequest, cp *tlog.Checkpoint, rotations [][]byte, cuts []chdb.Cut) ExportHeader {
	h := ExportHeader{Kind: KindHeader, Format: ExportFormat, Encoding: req.Encoding, Database: db, Org: s.Org,
		From: fmtMilli(s.From), To: fmtMilli(s.To), Types: s.Types, Actors: s.Actors, Rooms: s.Rooms, Size: cp.Size,
		Consistency: req.Consistency, Checkpoint: string(cp.Note), Rotations: []string{}, Cuts: []exportCut{}}
	if h.Consistency == nil {
		h.Consistency = []uint64{}
	}
	for _, r := range rotations {
		h.Rotations = append(h.Rotations, string(r))
	}
	for i := range cuts {
		h.Cuts = append(h.Cuts, cutRecord(&cuts[i]))
	}
	return h
}

// rotations are the key rotation records ClickHouse holds and the topic's (extra)
// whose signatures verify on their own (a forged row is not passed on), once each, in
// note order: a record deleted from ClickHouse still counts, and goes in the header.
func (x *Exporter) rotations(ctx context.Context, extra [][]byte) ([][]byte, error) {
	all, err := x.db.rotations(ctx)
	if err != nil {
		return nil, err
	}
	all = append(all, extra...)
	slices.SortFunc(all, bytes.Compare)
	all = slices.CompactFunc(all, bytes.Equal)
	var out [][]byte
	for _, r := range all {
		if _, err := tlog.OpenRotation(x.cfg.Prefix, r); err != nil {
			x.log.Warn("leaving a key rotation row that does not verify out of the export", "err", err)
			continue
		}
		out = append(out, r)
	}
	if len(out) > maxHeaderRotations {
		return nil, fmt.Errorf("%w: %d key rotation records, more than an export carries (%d)", ErrExportConflict, len(out), maxHeaderRotations)
	}
	return out, nil
}

// pin picks the checkpoint: org's newest stored one the ring opens, or the one of size
// asOf; among several notes of one size, the first in note order, so that a size
// always pins the same note.
func (x *Exporter) pin(ctx context.Context, ring *tlog.KeyRing, org string, asOf uint64) (tlog.Checkpoint, error) {
	var rows []storedCheckpoint
	var err error
	if asOf == 0 {
		rows, err = x.db.topCheckpoints(ctx, org, maxForgedExport+1)
	} else {
		rows, err = x.db.checkpointsAt(ctx, org, asOf, maxForgedExport+1)
	}
	if err != nil {
		return tlog.Checkpoint{}, err
	}
	for _, r := range rows {
		c, err := ring.Open(r.Note)
		if err == nil && c.Org == org && c.Size == r.Size {
			return c, nil
		}
		why := "its size or organization differ from its row's"
		if err != nil {
			why = err.Error()
		}
		x.log.Warn("skipping a checkpoint row that does not verify (audit verify names it)", "org_id", org, "size", r.Size, "reason", why)
	}
	switch {
	case asOf > 0:
		return tlog.Checkpoint{}, fmt.Errorf("%w: as_of: organization %q has no checkpoint of size %d signed with the audit key (keys %s; take as_of from an export's header: its size)",
			ErrExportConflict, org, asOf, strings.Join(ring.KeyIDs(), ", "))
	case len(rows) > maxForgedExport:
		return tlog.Checkpoint{}, fmt.Errorf("%w: more than %d of organization %q's newest checkpoint rows do not verify: run bandplane audit verify", ErrExportConflict, maxForgedExport, org)
	}
	return tlog.Checkpoint{}, noCheckpointError{fmt.Errorf("%w: nothing of organization %q is sealed with the audit key (keys %s): is serve running with --audit-key? (`bandplane audit seal` seals now)",
		ErrExportConflict, org, strings.Join(ring.KeyIDs(), ", "))}
}

// noCheckpointError is pin's error when ClickHouse holds no checkpoint of the
// organization that verifies.
type noCheckpointError struct{ err error }

func (e noCheckpointError) Error() string { return e.err.Error() }
func (e noCheckpointError) Unwrap() error { return e.err }

// compareTopic checks the pinned checkpoint against note, the checkpoints topic's
// newest of its organization: a note the ring does not open is ignored (and logged),
// as the sealer ignores it; a larger size, or another root at the pinned size, refuses
// the export. It returns the topic's checkpoint when it is smaller than the pinned one
// (the scan checks its root), else nil.
func (x *Exporter) compareTopic(ring *tlog.KeyRing, cp *tlog.Checkpoint, note []byte) (*tlog.Checkpoint, error) {
	org := cp.Org
	pub, err := ring.Open(note)
	if err == nil && pub.Org != org {
		err = fmt.Errorf("it is of organization %q", clip(pub.Org))
	}
	if err != nil {
		x.log.Warn("ignoring a checkpoint of the checkpoints topic that does not verify", "org_id", org, "err", err)
		return nil, nil
	}
	switch {
	case pub.Size > cp.Size:
		stored := fmt.Sprintf("ClickHouse's newest checkpoint has only %d", cp.Size)
		if cp.Size == 0 {
			stored = "ClickHouse has no checkpoint that verifies"
		}
		return nil, fmt.Errorf("%w: the checkpoints topic has a checkpoint of %d leaves for org %q (signed at %s) and %s: ClickHouse's log was rolled back (restored from an older copy, or its newest rows removed); run bandplane audit verify",
			ErrExportConflict, pub.Size, org, pub.SignedAt.Format(time.RFC3339), stored)
	case pub.Size == cp.Size && !pub.Same(cp):
		return nil, fmt.Errorf("%w: the checkpoints topic has another root for org %q at size %d than ClickHouse's checkpoint: the log was forked; run bandplane audit verify",
			ErrExportConflict, org, cp.Size)
	case pub.Size < cp.Size && pub.Size > 0:
		return &pub, nil
	}
	return nil, nil
}

// logConflict is the error of a log that does not match its checkpoint.
func logConflict(org string, size uint64, format string, args ...any) error {
	return fmt.Errorf("%w: the log of org %q does not match its checkpoint of size %d (%s): run bandplane audit verify",
		ErrExportConflict, org, size, fmt.Sprintf(format, args...))
}

// scanBlock is how many consecutive leaves one stored digest of the scan covers: a
// window re-reads the blocks of its leaves from log_index and checks them against
// those digests, so that the scan keeps 16 bytes per scanBlock leaves, not per leaf.
const scanBlock = 128

// leafScan is what the scan of an organization's index up to the checkpoint learnt:
// which leaves' times lie in the range (pending: not accounted for yet), a digest of
// each block of leaves from the first such leaf to the last, and the roots at the
// consistency sizes.
type leafScan struct {
	size      uint64
	base      uint64   // the first leaf bits covers, a multiple of 64
	bits      []uint64 // leaves of the range not accounted for yet
	inRange   uint64
	firstIn   uint64
	lastIn    uint64
	blockBase uint64 // the block blocks[0] is the digest of
	blocks    [][16]byte
	roots     map[uint64][]byte
}

func (sc *leafScan) set(i uint64) {
	w := (i - sc.base) / 64
	for uint64(len(sc.bits)) <= w {
		sc.bits = append(sc.bits, 0)
	}
	sc.bits[w] |= 1 << ((i - sc.base) % 64)
}

// inRangeLeaf says whether leaf i's verified time lies in the range.
func (sc *leafScan) inRangeLeaf(i uint64) bool {
	return sc.inRange > 0 && i >= sc.firstIn && i <= sc.lastIn
}

func (sc *leafScan) account(i uint64) {
	if i >= sc.base && (i-sc.base)/64 < uint64(len(sc.bits)) {
		sc.bits[(i-sc.base)/64] &^= 1 << ((i - sc.base) % 64)
	}
}

// unaccounted is the first leaf of the range no window accounted for, if any.
func (sc *leafScan) unaccounted() (uint64, int, bool) {
	n := 0
	first := uint64(0)
	for w, word := range sc.bits {
		if word == 0 {
			continue
		}
		if n == 0 {
			first = sc.base + uint64(w)*64 + uint64(bits.TrailingZeros64(word))
		}
		n += bits.OnesCount64(word)
	}
	return first, n, n > 0
}

func (sc *leafScan) blockDigest(b uint64) ([16]byte, bool) {
	if b < sc.blockBase || b-sc.blockBase >= uint64(len(sc.blocks)) {
		return [16]byte{}, false
	}
	return sc.blocks[b-sc.blockBase], true
}

// blockHasher hashes the leaf hashes of one block.
type blockHasher struct {
	h [sha256.Size]byte
	d hash.Hash
}

func newBlockHasher() *blockHasher { return &blockHasher{d: sha256.New()} }

func (b *blockHasher) digest() [16]byte {
	var out [16]byte
	copy(out[:], b.d.Sum(b.h[:0]))
	b.d.Reset()
	return out
}

// scan reads org's log_index in index order up to the checkpoint, recomputing its
// root; a gap, two different rows at one index, or another root refuses the export.
func (x *Exporter) scan(ctx context.Context, cp *tlog.Checkpoint, sel Selection, sizes []uint64) (*leafScan, error) {
	org, n := cp.Org, cp.Size
	sc := &leafScan{size: n, roots: map[uint64][]byte{}}
	want := map[uint64]bool{}
	for _, m := range sizes {
		want[m] = true
	}
	rng := tlog.NewRange()
	bh := newBlockHasher()
	var lastMs int64
	var lastInner [32]byte
	for lo := uint64(0); lo < n; lo += uint64(x.cfg.IndexChunk) {
		hi := min(n, lo+uint64(x.cfg.IndexChunk))
		rows, err := x.db.indexRows(ctx, org, lo, hi)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			row, err := scanIndexRow(rows, x.cfg.Database)
			if err != nil {
				rows.Close()
				return nil, err
			}
			idx, ms, in, ok := row.idx, row.ms, row.inner, row.ok
			switch {
			case idx+1 == rng.End():
				if ms != lastMs || in != lastInner {
					rows.Close()
					return nil, logConflict(org, n, "log_index holds two different leaves at index %d", idx)
				}
				continue
			case idx != rng.End():
				rows.Close()
				return nil, logConflict(org, n, "log_index has no leaf at index %d", rng.End())
			case !ok:
				rows.Close()
				return nil, logConflict(org, n, "the log_index row of leaf %d holds no valid digest", idx)
			}
			h := tlog.LeafHash(ms, in)
			if err := rng.Append(h, nil); err != nil {
				rows.Close()
				return nil, err
			}
			bh.d.Write(h)
			if sel.inRange(time.UnixMilli(ms).UTC()) {
				if sc.inRange == 0 {
					sc.base, sc.firstIn, sc.blockBase = idx&^63, idx, idx/scanBlock
				}
				sc.set(idx)
				sc.inRange++
				sc.lastIn = idx
			}
			if (idx+1)%scanBlock == 0 || idx+1 == n {
				d := bh.digest()
				if sc.inRange > 0 {
					sc.blocks = append(sc.blocks, d)
				}
			}
			if want[idx+1] {
				sc.roots[idx+1] = tlog.Root(rng)
			}
			lastMs, lastInner = ms, in
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("cannot read the index of org %q's log from %s.log_index: %w", org, x.cfg.Database, err)
		}
	}
	if rng.End() != n {
		return nil, logConflict(org, n, "log_index holds %d leaves", rng.End())
	}
	if !bytes.Equal(tlog.Root(rng), cp.Root) {
		return nil, logConflict(org, n, "its leaves do not give the checkpoint's root")
	}
	if sc.inRange > 0 {
		sc.blocks = sc.blocks[:sc.lastIn/scanBlock-sc.blockBase+1]
	}
	return sc, nil
}

// planBuckets bounds the buckets of one histogram query.
const planBuckets = 100_000

// windowBytes bounds about how many bytes of rows one window holds (two are held at
// once).
const windowBytes = 32 << 20

// plan splits [lo, hi) into windows of about WindowRows rows and windowBytes, refining
// a bucket that holds more down to single seconds. The windows are contiguous.
func (e *Export) plan(ctx context.Context, lo, hi int64, depth int) ([]window, error) {
	if lo >= hi {
		return nil, nil
	}
	width := max(1, (hi-lo+planBuckets-1)/planBuckets)
	bs, err := e.x.db.histogram(ctx, e.cp.Org, lo, hi, width, e.cp.Size)
	if err != nil {
		return nil, err
	}
	maxRows := uint64(e.x.cfg.WindowRows)
	var out []window
	var rows, size uint64
	open := false
	for _, b := range bs {
		if (b.rows > maxRows || b.bytes > windowBytes) && b.hi-b.lo > 1 && depth < 3 {
			sub, err := e.plan(ctx, b.lo, b.hi, depth+1)
			if err != nil {
				return nil, err
			}
			out, open = append(out, sub...), false
			continue
		}
		if open && rows+b.rows <= maxRows && size+b.bytes <= windowBytes {
			out[len(out)-1].hi = b.hi
			rows, size = rows+b.rows, size+b.bytes
			continue
		}
		out, rows, size, open = append(out, window{lo: b.lo, hi: b.hi}), b.rows, b.bytes, true
	}
	// Contiguous, from lo to hi: a row the histogram did not see still has a window.
	for i := range out {
		if i == 0 {
			out[i].lo = lo
		} else {
			out[i].lo = out[i-1].hi
		}
	}
	if len(out) > 0 {
		out[len(out)-1].hi = hi
	} else {
		out = []window{{lo: lo, hi: hi}}
	}
	return out, nil
}

// exportRec is a line (row set: its content, with the leaf's bookkeeping) or a gap.
type exportRec struct {
	leaf IndexedLeaf
	hash []byte // the leaf's hash, as authenticate checked it
	row  *store.EventRow
	mark string
}

func (r *exportRec) ms() int64 { return r.leaf.Time.UnixMilli() }

// afterCursor says whether the record comes after the cursor (always, without one).
func afterCursor(r *exportRec, c *Cursor) bool {
	return c == nil || c.Events == 0 || leafOrder(r.ms(), r.leaf.ID, c.Time.UnixMilli(), c.ID) > 0
}

// recount processes the windows up to the cursor's without writing, counting the lines
// and gaps before the cursor and listing their leaves, and checks that the file holds
// as many events, the last one the cursor's.
func (e *Export) recount(ctx context.Context, c *Cursor) error {
	sec := c.Time.Unix()
	e.start = len(e.windows) - 1
	for i, w := range e.windows {
		if w.lo > sec {
			break
		}
		e.start = i
		if err := e.window(ctx, w); err != nil {
			return err
		}
	}
	if e.events != c.Events || e.lastMs != c.Time.UnixMilli() || e.lastID != c.ID {
		last := "none"
		if e.events > 0 {
			last = fmt.Sprintf("event %q at %s", clip(e.lastID), fmtMilli(time.UnixMilli(e.lastMs)))
		}
		return fmt.Errorf("%w: the file holds %d events up to event %q at %s, but the export at size %d has %d up to there, the last one %s: the file is not this export's, or the trail changed (start a new export)",
			ErrExportConflict, c.Events, clip(c.ID), fmtMilli(c.Time), e.cp.Size, e.events, last)
	}
	return nil
}

// windowRecs are one window's lines and gaps, in order, with the blocks of leaves its
// proofs are built from.
type windowRecs struct {
	wt   *windowTree
	recs []*exportRec
}

// read reads the leaves and stored copies of one window and decides its lines and
// gaps.
func (e *Export) read(ctx context.Context, w window) (*windowRecs, error) {
	leaves, wt, err := e.windowLeaves(ctx, w)
	if err != nil || len(leaves) == 0 {
		return &windowRecs{}, err
	}
	recs, err := e.decideWindow(ctx, w, leaves)
	if err != nil {
		return nil, err
	}
	return &windowRecs{wt: wt, recs: recs}, nil
}

// window reads one window and counts its lines and gaps before the cursor, writing
// nothing (a resume's recount).
func (e *Export) window(ctx context.Context, w window) error {
	wr, err := e.read(ctx, w)
	if err != nil {
		return err
	}
	for _, r := range wr.recs {
		if afterCursor(r, e.req.After) {
			break
		}
		e.count(r)
	}
	return nil
}

// write proves and writes a window's lines and gaps after the cursor.
func (e *Export) write(ctx context.Context, wr *windowRecs, xw *exportWriter) error {
	var out []*exportRec
	for _, r := range wr.recs {
		if afterCursor(r, e.req.After) {
			r.hash, _ = wr.wt.node(compact.NewNodeID(0, r.leaf.Index))
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil
	}
	idx := make([]uint64, len(out))
	for i, r := range out {
		idx[i] = r.leaf.Index
	}
	prs, err := e.inclusionProofs(ctx, wr.wt, idx)
	if err != nil {
		return logConflict(e.cp.Org, e.cp.Size, "the inclusion proofs of its leaves cannot be built: %v", err)
	}
	if e.checker == nil {
		e.checker = newProofChecker(e.cp.Size, e.cp.Root)
	}
	for i, r := range out {
		// A line's content is a copy whose digest is its leaf's, with the leaf's
		// bookkeeping: its leaf hash is the leaf's.
		proof := encodeProof(prs[i])
		if ok, _ := e.checker.verify(r.leaf.Index, r.hash, proof); !ok {
			return logConflict(e.cp.Org, e.cp.Size, "the inclusion proof of leaf %d fails against the checkpoint's root (log_tree edited?)", r.leaf.Index)
		}
		if r.row != nil {
			err = xw.event(r.row, r.leaf.Index, proof)
		} else {
			err = xw.gap(&r.leaf, r.mark, proof)
		}
		if err != nil {
			return err
		}
		e.count(r)
	}
	return nil
}

// count adds a record to the export's counts and index list.
func (e *Export) count(r *exportRec) {
	e.index.add(r.leaf.Index)
	if r.row == nil {
		e.gaps++
		return
	}
	e.events++
	e.lastMs, e.lastID = r.ms(), r.leaf.ID
}

// windowLeaves reads the window's leaves of the range, checks each against the scan,
// and marks them accounted for (every one becomes a line, a gap, a duplicate or a row
// the lists leave out).
func (e *Export) windowLeaves(ctx context.Context, w window) ([]IndexedLeaf, *windowTree, error) {
	org, n := e.cp.Org, e.cp.Size
	rows, err := e.x.db.windowLeaves(ctx, org, unix(w.lo), unix(w.hi), n)
	if err != nil {
		return nil, nil, err
	}
	sel := &e.req.Selection
	out := rows[:0]
	for i := range rows {
		lf := rows[i]
		if !sel.inRange(lf.Time) {
			continue
		}
		if len(out) > 0 && out[len(out)-1] == lf {
			continue // the same row twice, before a merge
		}
		if lf.Org != org || !e.sc.inRangeLeaf(lf.Index) {
			return nil, nil, logConflict(org, n, "the log_leaves row of leaf %d puts event %q at %s, in the range, where the log's leaf is not", lf.Index, clip(lf.ID), fmtMilli(lf.Time))
		}
		out = append(out, lf)
	}
	if len(out) == 0 {
		return nil, nil, nil
	}
	wt, err := e.authenticate(ctx, out)
	if err != nil {
		return nil, nil, err
	}
	for i := range out {
		e.sc.account(out[i].Index)
	}
	return out, wt, nil
}

// authenticate checks every leaf row against the log: the blocks of their indexes are
// read again from log_index, checked against the scan's digests, and each row's hash
// must be its index's. It returns the blocks' leaf hashes, checked.
func (e *Export) authenticate(ctx context.Context, leaves []IndexedLeaf) (*windowTree, error) {
	org, n := e.cp.Org, e.cp.Size
	need := make(map[uint64][]byte, len(leaves))
	var blocks []uint64
	for i := range leaves {
		need[leaves[i].Index] = nil
		blocks = append(blocks, leaves[i].Index/scanBlock)
	}
	slices.Sort(blocks)
	blocks = slices.Compact(blocks)
	rows, err := e.x.db.blockRows(ctx, org, blocks, scanBlock, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	bh := newBlockHasher()
	wt := &windowTree{size: n, blocks: make(map[uint64]*blockTree, len(blocks))}
	var bt *blockTree
	bi := 0
	next := blocks[0] * scanBlock // the next index the blocks need
	var prev uint64
	havePrev := false
	var lastMs int64
	var lastInner [32]byte
	for rows.Next() {
		var idx uint64
		var ms int64
		var inner string
		if err := rows.Scan(&idx, &ms, &inner); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.log_index: %w", e.x.cfg.Database, err)
		}
		in, _ := parseHash(inner)
		switch {
		case havePrev && idx == prev:
			if ms != lastMs || in != lastInner {
				return nil, logConflict(org, n, "log_index holds two different leaves at index %d", idx)
			}
			continue
		case bi == len(blocks):
			continue
		case idx != next:
			return nil, logConflict(org, n, "log_index has no leaf at index %d", next)
		}
		h := tlog.LeafHash(ms, in)
		bh.d.Write(h)
		if _, ok := need[idx]; ok {
			need[idx] = h
		}
		if idx%scanBlock == 0 {
			bt = &blockTree{}
		}
		bt.leaves = append(bt.leaves, h)
		prev, havePrev, lastMs, lastInner = idx, true, ms, in
		next++
		if next%scanBlock == 0 || next == n {
			d := bh.digest()
			if want, ok := e.sc.blockDigest(blocks[bi]); !ok || d != want {
				return nil, logConflict(org, n, "log_index's leaves %d to %d changed since the export read them", blocks[bi]*scanBlock, next-1)
			}
			wt.blocks[blocks[bi]] = bt
			if bi++; bi < len(blocks) {
				next = blocks[bi] * scanBlock
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.log_index: %w", e.x.cfg.Database, err)
	}
	if bi < len(blocks) {
		return nil, logConflict(org, n, "log_index has no leaf at index %d", next)
	}
	for i := range leaves {
		lf := &leaves[i]
		if !bytes.Equal(lf.Hash(), need[lf.Index]) {
			return nil, logConflict(org, n, "the log_leaves row of leaf %d (event %q at %s) is not the leaf the log holds", lf.Index, clip(lf.ID), fmtMilli(lf.Time))
		}
	}
	return wt, nil
}

// windowTree holds the leaf hashes of the blocks a window read again, checked against
// the scan: the nodes of those blocks (up to level log2(scanBlock)) follow from them,
// so the window's proofs read only the nodes above from log_tree.
type windowTree struct {
	size   uint64
	blocks map[uint64]*blockTree
}

// blockTree is one block's leaf hashes and, once computed, its interior nodes.
type blockTree struct {
	leaves [][]byte
	levels [][][]byte // levels[l-1]: the nodes of level l, from the block's start
}

const blockLevels = 7 // log2(scanBlock)

// node is the hash of id if it lies within a held block (and within the log).
func (wt *windowTree) node(id compact.NodeID) ([]byte, bool) {
	if id.Level > blockLevels {
		return nil, false
	}
	first := id.Index << id.Level
	bt := wt.blocks[first/scanBlock]
	if bt == nil || (id.Index+1)<<id.Level > wt.size {
		return nil, false
	}
	off := (first % scanBlock) >> id.Level
	if id.Level == 0 {
		return bt.leaves[off], true
	}
	for len(bt.levels) < int(id.Level) {
		below := bt.leaves
		if len(bt.levels) > 0 {
			below = bt.levels[len(bt.levels)-1]
		}
		up := make([][]byte, len(below)/2)
		for i := range up {
			up[i] = tlog.HashChildren(below[2*i], below[2*i+1])
		}
		bt.levels = append(bt.levels, up)
	}
	return bt.levels[id.Level-1][off], true
}

// inclusionProofs builds the inclusion proofs of leaves at the checkpoint: nodes of
// the window's blocks from wt, the others read from log_tree in one ReadNodes call.
func (e *Export) inclusionProofs(ctx context.Context, wt *windowTree, idx []uint64) ([][][]byte, error) {
	n := e.cp.Size
	plans := make([]proof.Nodes, len(idx))
	var ids []compact.NodeID
	seen := map[compact.NodeID]bool{}
	for i, leaf := range idx {
		p, err := proof.Inclusion(leaf, n)
		if err != nil {
			return nil, fmt.Errorf("cannot plan the inclusion proof of leaf %d at size %d: %w", leaf, n, err)
		}
		plans[i] = p
		for _, id := range p.IDs {
			if _, ok := wt.node(id); !ok && !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	read := make(map[compact.NodeID][]byte, len(ids))
	if len(ids) > 0 {
		hs, err := e.x.db.ReadNodes(ctx, e.cp.Org, ids)
		if err != nil {
			return nil, err
		}
		for i, id := range ids {
			read[id] = hs[i]
		}
	}
	out := make([][][]byte, len(plans))
	for i, p := range plans {
		hs := make([][]byte, len(p.IDs))
		for j, id := range p.IDs {
			h, ok := wt.node(id)
			if !ok {
				h = read[id]
			}
			hs[j] = h
		}
		pr, err := p.Rehash(hs, tlog.HashChildren)
		if err != nil {
			return nil, fmt.Errorf("cannot assemble the inclusion proof of leaf %d: %w", idx[i], err)
		}
		out[i] = pr
	}
	return out, nil
}

// decideWindow matches the window's leaves (sorted by time, id, index) with the stored
// copies and returns its lines and gaps in (time, time_ms, id) order.
func (e *Export) decideWindow(ctx context.Context, w window, leaves []IndexedLeaf) ([]*exportRec, error) {
	rows, err := e.x.db.windowCopies(ctx, e.cp.Org, unix(w.lo), unix(w.hi))
	if err != nil {
		return nil, err
	}
	cr := &copyReader{rows: rows, db: e.x.cfg.Database}
	cr.advance()
	var recs []*exportRec
	for i := 0; i < len(leaves); {
		k := rowKey{org: leaves[i].Org, id: leaves[i].ID, sec: leaves[i].Time.Unix()}
		j := i + 1
		for j < len(leaves) && leaves[j].ID == k.id && leaves[j].Time.Unix() == k.sec {
			j++
		}
		copies := cr.collect(k)
		if cr.err != nil {
			break
		}
		recs = append(recs, e.decide(leaves[i:j], copies)...)
		i = j
	}
	rows.Close()
	if cr.err == nil {
		cr.err = rows.Err()
	}
	if cr.err != nil {
		return nil, fmt.Errorf("cannot read the events of org %q from %s.events: %w", e.cp.Org, e.x.cfg.Database, cr.err)
	}
	for _, r := range recs {
		if r.mark != MarkMissing {
			continue
		}
		expired, err := e.expired(ctx, &r.leaf)
		if err != nil {
			return nil, err
		}
		if expired {
			r.mark = MarkExpired
		}
	}
	slices.SortFunc(recs, recOrder)
	return recs, nil
}

// recOrder is the order of lines and gaps: (time, time_ms, id), and within one row
// key its gaps by leaf, then its line. Gaps go first so that a resume cursor (the last
// line) has every record of its key behind it.
func recOrder(a, b *exportRec) int {
	return cmp.Or(leafOrder(a.ms(), a.leaf.ID, b.ms(), b.leaf.ID), cmp.Compare(boolInt(a.row != nil), boolInt(b.row != nil)),
		cmp.Compare(a.leaf.Index, b.leaf.Index))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// decide is the records of one row key, its leaves in index order. Each leaf is
// matched on its own: one that no stored copy matches (verify's rule) is a gap, even
// when another leaf of its key matches a copy — ClickHouse write access can move a
// sealed copy's bookkeeping and have ingest note the moved copy again (a redelivery
// notes a record's own copy with its stored ingested_at), and the first leaf's row is
// then gone. The first leaf with a matching copy is the line (none when the lists
// leave it out); the key's other leaves are duplicates of the line's row when they
// have a matching copy of their own (the same note twice, or an earlier insert
// attempt's copy noted again) or when mergedAway excuses them.
func (e *Export) decide(leaves []IndexedLeaf, copies []store.EventRow) []*exportRec {
	stored := make([]storedCopy, len(copies))
	for ci := range copies {
		stored[ci] = copyOf(&copies[ci])
	}
	match := make([]int, len(leaves)) // the copy that matches each leaf, or -1
	for li := range leaves {
		match[li] = slices.IndexFunc(stored, func(c storedCopy) bool {
			why, _ := matchLeaf(&c, leaves[li:li+1], e.x.cfg.Margin)
			return why == ""
		})
	}
	var recs []*exportRec
	lined := false
	for li := range leaves {
		lf := &leaves[li]
		switch ci := match[li]; {
		case ci < 0 && !e.mergedAway(leaves, match, li):
			mark := MarkMissing
			if len(copies) > 0 {
				mark = MarkModified
			}
			recs = append(recs, &exportRec{leaf: *lf, mark: mark})
		case ci >= 0 && !lined:
			lined = true
			r := copies[ci]
			r.IngestedAt, r.Partition, r.Offset = lf.IngestedAt, lf.Partition, lf.Offset
			if e.req.Selection.selects(&r) {
				recs = append(recs, &exportRec{leaf: *lf, row: &r})
			}
		}
	}
	return recs
}

// mergedAway says whether leaf li, which no copy matches, is an earlier insert
// attempt's copy that a merge dropped: another leaf of its key with a matching copy
// has its content digest and Kafka record and an ingested_at at most the margin after
// its. Ingest notes each of a record's own copies again on a redelivery (an earlier
// attempt's included, until a merge keeps the last), so such a pair is legitimate; the
// margin bounds it as it bounds how much earlier than its leaf a genuine copy may be
// (verify excuses the same leaves). A sealed copy's ingested_at moved later by more
// than the margin and noted again leaves its first leaf a gap.
func (e *Export) mergedAway(leaves []IndexedLeaf, match []int, li int) bool {
	lf := &leaves[li]
	for j := range leaves {
		o := &leaves[j]
		if match[j] >= 0 && o.Digest == lf.Digest && o.Partition == lf.Partition && o.Offset == lf.Offset &&
			!o.IngestedAt.Before(lf.IngestedAt) && !o.IngestedAt.After(lf.IngestedAt.Add(e.x.cfg.Margin)) {
			return true
		}
	}
	return false
}

// expired says whether a sealed row that is gone expired: verify's rule (an honoured
// retention cut recorded after the leaf was first sealed covers its time, and no row
// of its day is left), and the offline verifier's (a cut of the header covers its time
// and was made after the row was written).
func (e *Export) expired(ctx context.Context, lf *IndexedLeaf) (bool, error) {
	if len(e.cuts.honoured) == 0 || !lf.Time.Before(e.cuts.maxBefore[0]) || !coveredOffline(e.offline, lf.Time, lf.IngestedAt) {
		return false, nil
	}
	at, err := e.sealedAt(ctx, lf.Index)
	if err != nil {
		return false, err
	}
	return e.cuts.excuse(lf.Time, at) == "", nil
}

// coveredOffline says whether one of cuts covers a row at t written at ingested: what
// the offline verifier can check of an expired gap.
func coveredOffline(cuts []chdb.Cut, t, ingested time.Time) bool {
	for _, c := range cuts {
		if t.Before(c.Before) && !ingested.After(c.At.Add(cutSkew)) {
			return true
		}
	}
	return false
}

// coverCache holds the verified checkpoints of sizes in (from, sizes[len-1]], smallest
// first, with the earliest timestamp of each size.
type coverCache struct {
	from  uint64
	sizes []uint64
	at    []time.Time
}

// sealedAt is when leaf i was first covered by a checkpoint (of size at most the
// pinned one): the timestamp of the smallest verified checkpoint larger than i.
func (e *Export) sealedAt(ctx context.Context, i uint64) (time.Time, error) {
	c := &e.covers
	if n := len(c.sizes); n > 0 && i >= c.from && i < c.sizes[n-1] {
		j := sort.Search(n, func(j int) bool { return c.sizes[j] > i })
		return c.at[j], nil
	}
	rows, err := e.x.db.checkpointsAbove(ctx, e.cp.Org, i, e.cp.Size, 256)
	if err != nil {
		return time.Time{}, err
	}
	*c = coverCache{from: i}
	for _, r := range rows {
		cp, err := e.ring.Open(r.Note)
		if err != nil || cp.Org != e.cp.Org || cp.Size != r.Size {
			continue
		}
		if n := len(c.sizes); n > 0 && c.sizes[n-1] == cp.Size {
			if cp.SignedAt.Before(c.at[n-1]) {
				c.at[n-1] = cp.SignedAt
			}
			continue
		}
		c.sizes, c.at = append(c.sizes, cp.Size), append(c.at, cp.SignedAt)
	}
	if len(c.sizes) == 0 {
		// Only forged rows above i: the pinned checkpoint covers it, later than its
		// first one did, which only makes a cut less likely to excuse it.
		c.sizes, c.at = []uint64{e.cp.Size}, []time.Time{e.cp.SignedAt}
	}
	return c.at[0], nil
}

// copyReader walks the stored copies of a window in (time, id) order.
type copyReader struct {
	rows driver.Rows
	db   string
	next store.EventRow
	has  bool
	err  error
}

func (c *copyReader) advance() {
	c.has = false
	if c.err != nil || !c.rows.Next() {
		return
	}
	var r store.EventRow
	if err := scanEvent(c.rows, &r); err != nil {
		c.err = fmt.Errorf("cannot read a row of %s.events: %w", c.db, err)
		return
	}
	c.next, c.has = r, true
}

// collect returns the copies of k, skipping those of earlier keys (rows no leaf of the
// range covers: unsealed, or written by hand).
func (c *copyReader) collect(k rowKey) []store.EventRow {
	var out []store.EventRow
	for c.has {
		switch cmp.Or(cmp.Compare(c.next.Time.Unix(), k.sec), strings.Compare(c.next.ID, k.id)) {
		case -1:
			c.advance()
		case 0:
			out = append(out, c.next)
			c.advance()
		default:
			return out
		}
	}
	return out
}

// indexList is the leaf indexes of the lines and gaps in order, as zigzag varint
// deltas (about a byte or two each: leaves come mostly in time order).
type indexList struct {
	buf  []byte
	n    uint64
	last uint64
}

func (l *indexList) add(i uint64) {
	l.buf = binary.AppendVarint(l.buf, int64(i-l.last))
	l.last = i
	l.n++
}

func (l *indexList) each(fn func(uint64) error) error {
	b, last := l.buf, uint64(0)
	for len(b) > 0 {
		d, k := binary.Varint(b)
		b = b[k:]
		last += uint64(d)
		if err := fn(last); err != nil {
			return err
		}
	}
	return nil
}

// ExportStats says what Stream wrote.
type ExportStats struct {
	Events uint64 // event lines written by this request
	Total  uint64 // event lines of the whole export (the resumed part included)
	Gaps   uint64 // gap records of the whole export
	Bytes  int64
}

// flushEvery is how many bytes Stream writes between calls of flush.
const flushEvery = 1 << 20

// out writes records, counting bytes and calling flush now and then.
type out struct {
	bw      *bufio.Writer
	flush   func() error
	n       int64
	pending int64
}

func (o *out) write(b []byte) error {
	if len(b) > MaxExportLineBytes {
		return fmt.Errorf("a record of %d bytes is longer than the export's limit of %d", len(b), MaxExportLineBytes)
	}
	if _, err := o.bw.Write(b); err != nil {
		return err
	}
	o.n += int64(len(b))
	o.pending += int64(len(b))
	if o.pending >= flushEvery {
		return o.sync()
	}
	return nil
}

func (o *out) sync() error {
	o.pending = 0
	if err := o.bw.Flush(); err != nil {
		return err
	}
	if o.flush != nil {
		return o.flush()
	}
	return nil
}

// Stream writes the export to w: the header (unless it resumes), the lines and gaps,
// the consistency and index records and the manifest. flush, when not nil, is called
// after each window and every MiB (an HTTP handler flushes and extends its write
// deadline there). On an error other than ctx's it writes an error record before
// returning the error: the file is then incomplete, and a resume continues it. An
// Export streams once.
func (e *Export) Stream(ctx context.Context, w io.Writer, flush func() error) (ExportStats, error) {
	if e.streamed {
		return ExportStats{}, errors.New("the export was streamed already: prepare it again")
	}
	e.streamed = true
	xw := newExportWriter(w, e.req.Encoding, flush)
	resumed := e.events
	err := e.stream(ctx, xw)
	st := ExportStats{Events: e.events - resumed, Total: e.events, Gaps: e.gaps, Bytes: xw.o.n}
	if err != nil && ctx.Err() == nil {
		xw.fail(err)
		st.Bytes = xw.o.n
	}
	return st, err
}

func (e *Export) stream(ctx context.Context, xw *exportWriter) error {
	if e.req.After == nil {
		if err := xw.header(e.header); err != nil {
			return err
		}
	}
	if err := e.windowsInOrder(ctx, xw); err != nil {
		return err
	}
	if first, n, ok := e.sc.unaccounted(); ok {
		return logConflict(e.cp.Org, e.cp.Size, "%d leaves of the range, the first leaf %d, have no row in log_leaves at their time: log_leaves was edited", n, first)
	}
	var cons []exportConsistency
	for _, m := range e.req.Consistency {
		rec, err := e.consistency(ctx, m)
		if err != nil {
			return err
		}
		cons = append(cons, rec)
	}
	return xw.trailer(cons, &e.index, func(index string) exportManifest {
		return signManifest(e.x.cfg.Key, e.x.cfg.Database, e.req.Selection, &e.cp, e.req.Consistency, e.events, e.gaps, index)
	})
}

// trailer writes the consistency records, the index records (of index) and the
// manifest that sign makes from their hash.
func (xw *exportWriter) trailer(cons []exportConsistency, index *indexList, sign func(indexSHA256 string) exportManifest) error {
	for _, c := range cons {
		if err := xw.object(KindConsistency, c, false); err != nil {
			return err
		}
	}
	var batch []uint64
	pos := uint64(0)
	writeIndex := func() error {
		if err := xw.object(KindIndex, exportIndex{Kind: KindIndex, First: pos, Leaves: batch}, true); err != nil {
			return err
		}
		pos += uint64(len(batch))
		batch = batch[:0]
		return nil
	}
	if err := index.each(func(i uint64) error {
		if batch = append(batch, i); len(batch) == indexPerRecord {
			return writeIndex()
		}
		return nil
	}); err != nil {
		return err
	}
	if len(batch) > 0 {
		if err := writeIndex(); err != nil {
			return err
		}
	}
	if err := xw.object(KindManifest, sign(xw.ih.sum()), false); err != nil {
		return err
	}
	return xw.o.sync()
}

// windowsInOrder writes the windows from e.start on. One goroutine reads the next
// window (ClickHouse's work, mostly) while this one proves and writes the current
// (this process's): two windows are held at most. The reader alone touches the scan's
// bitmap and the cache of covering checkpoints until it is done.
func (e *Export) windowsInOrder(ctx context.Context, xw *exportWriter) error {
	ctx, cancel := context.WithCancel(ctx)
	type result struct {
		wr  *windowRecs
		err error
	}
	next := make(chan result)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(next)
		for _, w := range e.windows[e.start:] {
			wr, err := e.read(ctx, w)
			select {
			case next <- result{wr, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	})
	defer func() {
		cancel()
		for range next { // the reader stops at its next send
		}
		wg.Wait()
	}()
	for r := range next {
		if r.err != nil {
			return r.err
		}
		if err := e.write(ctx, r.wr, xw); err != nil {
			return err
		}
		if err := xw.o.sync(); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// consistency is the consistency record from size m to the checkpoint, checked
// against the root the scan computed at m.
func (e *Export) consistency(ctx context.Context, m uint64) (exportConsistency, error) {
	org, n := e.cp.Org, e.cp.Size
	root := e.sc.roots[m]
	var pr [][]byte
	if m < n {
		var err error
		if pr, err = tlog.ConsistencyProof(ctx, e.x.db, org, m, n); err != nil {
			return exportConsistency{}, logConflict(org, n, "its consistency proof from size %d cannot be built: %v", m, err)
		}
	}
	if tlog.VerifyConsistency(m, n, pr, root, e.cp.Root) != nil {
		return exportConsistency{}, logConflict(org, n, "its consistency proof from size %d fails against the roots (log_tree edited?)", m)
	}
	return exportConsistency{Kind: KindConsistency, Size: m, Root: base64.StdEncoding.EncodeToString(root), Proof: encodeProof(pr)}, nil
}

// exportWriter writes the records of one export and hashes the index records.
type exportWriter struct {
	o   *out
	enc *encoder
	ih  *indexHash
}

func newExportWriter(w io.Writer, encoding string, flush func() error) *exportWriter {
	return &exportWriter{o: &out{bw: bufio.NewWriterSize(w, 64<<10), flush: flush}, enc: newEncoder(encoding), ih: newIndexHash()}
}

func (xw *exportWriter) header(h ExportHeader) error {
	pre, err := xw.enc.preamble()
	if err != nil {
		return err
	}
	pre = bytes.Clone(pre)
	obj, err := xw.enc.object(h)
	if err != nil {
		return err
	}
	rec, err := xw.enc.record(KindHeader, obj)
	if err != nil {
		return err
	}
	return xw.o.write(append(pre, rec...))
}

func (xw *exportWriter) event(r *store.EventRow, leaf uint64, proof string) error {
	ev := eventRecord(r, leaf, proof, xw.enc.encoding)
	rec, err := xw.enc.event(&ev)
	if err != nil {
		return fmt.Errorf("cannot encode event %q: %w", clip(r.ID), err)
	}
	if len(rec) > MaxExportLineBytes {
		return fmt.Errorf("event %q at %s is %d bytes encoded, more than the export's limit of %d per line", clip(r.ID), fmtMilli(r.Time), len(rec), MaxExportLineBytes)
	}
	return xw.o.write(rec)
}

func (xw *exportWriter) gap(lf *IndexedLeaf, mark, proof string) error {
	return xw.object(KindGap, gapRecord(lf, mark, proof), false)
}

// object writes a record that is a JSON object; hashed ones go into the index hash.
func (xw *exportWriter) object(kind string, v any, hashed bool) error {
	obj, err := xw.enc.object(v)
	if err != nil {
		return err
	}
	if hashed {
		xw.ih.add(obj)
	}
	rec, err := xw.enc.record(kind, obj)
	if err != nil {
		return err
	}
	return xw.o.write(rec)
}

// fail writes an error record (best effort: the connection may be gone).
func (xw *exportWriter) fail(cause error) {
	obj, err := xw.enc.object(exportError{Kind: KindError, Error: strings.TrimPrefix(cause.Error(), ErrExportConflict.Error()+": ")})
	if err != nil {
		return
	}
	if rec, err := xw.enc.record(KindError, obj); err == nil {
		if _, err := xw.o.bw.Write(rec); err == nil {
			xw.o.n += int64(len(rec))
		}
		_ = xw.o.sync()
	}
}
