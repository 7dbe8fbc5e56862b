package seal

import (
	"bufio"
	"cmp"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/ingest/store"
)

// Defaults of ExportConfig.
const (
	DefaultExportWindowRows   = 20_000
	DefaultExportGroupEntries = 200_000
)

// ErrExportConflict is wrapped by Prepare when the trail cannot give the export asked
// for: nothing sealed yet, an as_of no seal has, a cursor of another export (HTTP 409).
var ErrExportConflict = errors.New("the export conflicts with the trail")

// ExportConfig configures an Exporter.
type ExportConfig struct {
	Conn     driver.Conn
	Database string
	Key      ed25519.PrivateKey // signs the manifests (the audit key)
	Logger   *slog.Logger
	// WindowRows is about how many rows one query of the stream reads (the rows are
	// written as they come: memory does not grow with it).
	WindowRows int
	// GroupEntries is about how many seal entries one step of the proof reads; a seal
	// is read whole (MaxSealEntries at most), so memory holds one seal's entries and
	// the row keys of one group.
	GroupEntries int
}

func (c *ExportConfig) Validate() error {
	var errs []error
	if c.Conn == nil {
		errs = append(errs, errors.New("export: no clickhouse connection"))
	}
	if !identRe.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("export: database %q is not a plain identifier", c.Database))
	}
	if len(c.Key) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("export: no Ed25519 private key (--audit-key)"))
	}
	if c.WindowRows < 0 || c.GroupEntries < 0 {
		errs = append(errs, fmt.Errorf("export: window rows (%d) and group entries (%d) must not be negative", c.WindowRows, c.GroupEntries))
	}
	return errors.Join(errs...)
}

// Exporter streams compliance exports of one database (ExportFormat's doc).
type Exporter struct {
	cfg   ExportConfig
	pub   ed25519.PublicKey
	keyID string
	log   *slog.Logger
}

func NewExporter(cfg ExportConfig) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.WindowRows == 0 {
		cfg.WindowRows = DefaultExportWindowRows
	}
	if cfg.GroupEntries == 0 {
		cfg.GroupEntries = DefaultExportGroupEntries
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pub := cfg.Key.Public().(ed25519.PublicKey)
	return &Exporter{cfg: cfg, pub: pub, keyID: KeyID(pub), log: log.With("component", "audit_export")}, nil
}

// Export is one prepared export: the watermark is pinned and the reads are planned.
type Export struct {
	x        *Exporter
	req      ExportRequest
	header   ExportHeader
	asOf     time.Time // W: rows ingested before it
	sealedBy time.Time // S: seals made at or before it
	windows  []window
	expected uint64
	pred     predicate
}

// window is [lo, hi) of event time in Unix seconds.
type window struct{ lo, hi int64 }

// Header is the export's header (also when it is not written: a resumed export).
func (e *Export) Header() ExportHeader { return e.header }

// AsOf is the export's watermark W.
func (e *Export) AsOf() time.Time { return e.asOf }

// Expected is about how many event lines the whole export has (the resumed part
// included): counted before the rows are deduplicated and matched with seals.
func (e *Export) Expected() uint64 { return e.expected }

// Prepare checks the request against the trail, pins the watermark and plans the
// reads. A request the trail cannot serve is an error wrapping ErrExportConflict.
func (x *Exporter) Prepare(ctx context.Context, req ExportRequest) (*Export, error) {
	req.Selection.Normalize()
	if err := req.Selection.Validate(); err != nil {
		return nil, err
	}
	if req.Encoding != EncodingNDJSON && req.Encoding != EncodingCSV {
		return nil, fmt.Errorf("format: %q is not ndjson or csv", req.Encoding)
	}
	if req.After != nil && req.AsOf.IsZero() {
		return nil, errors.New("after: needs as_of")
	}
	sel := req.Selection
	asOf, sealedBy, err := x.watermark(ctx, req.AsOf)
	if err != nil {
		return nil, err
	}
	var n uint64
	if err := x.cfg.Conn.QueryRow(ctx, "SELECT count() FROM "+x.cfg.Database+".seals WHERE org_id = ? AND sealed_at <= ?",
		sel.Org, sealedBy).Scan(&n); err != nil {
		return nil, fmt.Errorf("cannot read the seals of org %q from %s.seals: %w", sel.Org, x.cfg.Database, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: nothing of organization %q is sealed as of %s: is serve running with --audit-key? (`bandplane audit seal` seals now)",
			ErrExportConflict, sel.Org, fmtSec(asOf))
	}
	e := &Export{x: x, req: req, header: newHeader(sel, req.Encoding, asOf, x.keyID), asOf: asOf, sealedBy: sealedBy,
		pred: newPredicate(sel, asOf)}
	lo := sel.From.Unix()
	if c := req.After; c != nil {
		if c.Bind != binding(sel, req.Encoding, asOf) {
			return nil, fmt.Errorf("%w: the cursor belongs to another export (its selection, format or as_of differ from this request's): resume with the file's own header", ErrExportConflict)
		}
		if c.Events > 0 {
			if c.Time.Before(sel.From) || !c.Time.Before(sel.To) {
				return nil, fmt.Errorf("%w: the cursor's event at %s is outside the selection's range", ErrExportConflict, fmtMilli(c.Time))
			}
			if err := e.checkCursor(ctx, c); err != nil {
				return nil, err
			}
			lo = c.Time.Unix()
		}
	}
	hi := e.pred.toSec + 1 // exclusive; the predicate cuts at the millisecond
	if e.windows, e.expected, err = e.plan(ctx, lo, hi, 0); err != nil {
		return nil, err
	}
	if c := req.After; c != nil {
		e.expected += c.Events
	}
	return e, nil
}

// watermark picks W, the through of a seal that verifies with the key (the latest, or
// asOf), and S, the earliest sealed_at of the verifying seals with that through.
func (x *Exporter) watermark(ctx context.Context, asOf time.Time) (time.Time, time.Time, error) {
	db := x.cfg.Database
	first := func(q string, args ...any) (*Seal, error) {
		rows, err := x.cfg.Conn.Query(ctx, "SELECT "+sealCols+" FROM "+db+".seals "+q, args...)
		if err != nil {
			return nil, fmt.Errorf("cannot read %s.seals: %w", db, err)
		}
		defer rows.Close()
		for rows.Next() {
			s, err := scanSeal(rows)
			if err != nil {
				return nil, fmt.Errorf("cannot read a row of %s.seals: %w", db, err)
			}
			if s.checkSignature(x.pub, x.keyID) == "" {
				return &s, nil
			}
		}
		return nil, rows.Err()
	}
	w := asOf
	if w.IsZero() {
		// Forged or foreign seals are skipped; a hundred of them in a row is a trail
		// that needs verify, not an export.
		s, err := first("ORDER BY through DESC, sealed_at ASC LIMIT 100")
		if err != nil {
			return time.Time{}, time.Time{}, err
		}
		if s == nil {
			return time.Time{}, time.Time{}, fmt.Errorf("%w: nothing is sealed with the audit key %s yet: is serve running with --audit-key? (`bandplane audit seal` seals now)", ErrExportConflict, x.keyID)
		}
		w = s.Through
	}
	s, err := first("WHERE through = ? ORDER BY sealed_at ASC LIMIT 100", w.UTC())
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	if s == nil {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: as_of %s is not the through of any seal signed with the audit key %s (take as_of from an export's header)", ErrExportConflict, fmtSec(w), x.keyID)
	}
	return w.UTC(), s.SealedAt, nil
}

// predicate is the SQL condition every read of the export shares (without org_id):
// the range at millisecond precision, the watermark, and the lists.
type predicate struct {
	sql            string
	args           []any
	fromSec, toSec int64 // the seconds the range touches, both included
}

func newPredicate(s Selection, asOf time.Time) predicate {
	var conds []string
	var args []any
	fromSec, toSec := s.From.Truncate(time.Second), s.To.Truncate(time.Second)
	conds, args = append(conds, "time >= ?"), append(args, fromSec)
	if ms := msOf(s.From); ms > 0 {
		conds, args = append(conds, "(time > ? OR time_ms >= ?)"), append(args, fromSec, ms)
	}
	last := toSec
	if ms := msOf(s.To); ms > 0 {
		conds, args = append(conds, "time <= ?", "(time < ? OR time_ms < ?)"), append(args, toSec, toSec, ms)
	} else {
		conds, args = append(conds, "time < ?"), append(args, toSec)
		last = toSec.Add(-time.Second)
	}
	conds, args = append(conds, "ingested_at < ?"), append(args, asOf.UTC())
	for _, l := range []struct {
		col  string
		vals []string
	}{{"type", s.Types}, {"actor_id", s.Actors}, {"room_id", s.Rooms}} {
		if len(l.vals) > 0 {
			// A bound []string is an array literal, which IN refuses on 18.16.
			conds, args = append(conds, "has(?, "+l.col+")"), append(args, l.vals)
		}
	}
	return predicate{sql: "(" + strings.Join(conds, " AND ") + ")", args: args, fromSec: fromSec.Unix(), toSec: last.Unix()}
}

func msOf(t time.Time) uint16 { return uint16(t.Nanosecond() / 1e6) }

func unix(s int64) time.Time { return time.Unix(s, 0).UTC() }

// sealedIn is the condition that a row key is in a seal made at or before S whose
// time span meets [lo, hi) (Unix seconds, hi exclusive): "only what is sealed".
func (e *Export) sealedIn(lo, hi int64) (string, []any) {
	db := e.x.cfg.Database
	return `(time, id) IN (SELECT time, id FROM ` + db + `.seal_entries WHERE org_id = ?
			AND (seq, seal) IN (SELECT seq, hash FROM ` + db + `.seals WHERE org_id = ? AND sealed_at <= ? AND first_time < ? AND last_time >= ?)
			AND time >= ? AND time < ?)`,
		[]any{e.req.Selection.Org, e.req.Selection.Org, e.sealedBy, unix(hi), unix(lo), unix(lo), unix(hi)}
}

// checkCursor checks that the file a resume continues holds exactly the export's
// events up to the cursor: as many, and the last one the cursor's.
func (e *Export) checkCursor(ctx context.Context, c *Cursor) error {
	db, org := e.x.cfg.Database, e.req.Selection.Org
	lo, hi := e.pred.fromSec, c.Time.Unix()+1
	sealed, sargs := e.sealedIn(lo, hi)
	// The row of a key is its copy with the smallest time_ms, as the stream picks it.
	q := `SELECT count(), countIf(time = ? AND ms = ? AND id = ?) FROM (
		SELECT time, id, min(time_ms) AS ms FROM ` + db + `.events
		WHERE org_id = ? AND time >= ? AND time < ? AND ` + e.pred.sql + ` AND ` + sealed + `
		GROUP BY time, id)
		WHERE time < ? OR (time = ? AND (ms < ? OR (ms = ? AND id <= ?)))`
	sec, ms := c.Time.Truncate(time.Second), msOf(c.Time)
	args := []any{sec, ms, c.ID, org, unix(lo), unix(hi)}
	args = append(append(args, e.pred.args...), sargs...)
	args = append(args, sec, sec, ms, ms, c.ID)
	var n, last uint64
	if err := e.x.cfg.Conn.QueryRow(ctx, q, args...).Scan(&n, &last); err != nil {
		return fmt.Errorf("cannot count the exported events of org %q up to the cursor in %s.events: %w", org, db, err)
	}
	if n != c.Events || last != 1 {
		return fmt.Errorf("%w: the file holds %d events up to event %q at %s, but the export as of %s has %d up to there, the last one %s: the file is not this export's, or the trail changed (start a new export)",
			ErrExportConflict, c.Events, clip(c.ID), fmtMilli(c.Time), fmtSec(e.asOf), n, map[bool]string{true: "that event", false: "another event"}[last == 1])
	}
	return nil
}

// planBuckets bounds the buckets of one histogram query.
const planBuckets = 100_000

// plan splits [lo, hi) into windows of about WindowRows rows (the rows of the
// selection ingested before W, duplicates and unsealed rows included), refining a
// bucket that holds more down to single seconds. The windows are contiguous.
func (e *Export) plan(ctx context.Context, lo, hi int64, depth int) ([]window, uint64, error) {
	if lo >= hi {
		return nil, 0, nil
	}
	width := max(1, (hi-lo+planBuckets-1)/planBuckets)
	db, org := e.x.cfg.Database, e.req.Selection.Org
	args := append([]any{uint32(width), org, unix(lo), unix(hi)}, e.pred.args...)
	rows, err := e.x.cfg.Conn.Query(ctx, `SELECT intDiv(toUInt32(time), ?) AS b, count() FROM `+db+`.events
		WHERE org_id = ? AND time >= ? AND time < ? AND `+e.pred.sql+` GROUP BY b ORDER BY b`, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot count the events of org %q in %s.events: %w", org, db, err)
	}
	type bucket struct {
		lo, hi int64
		n      uint64
	}
	var bs []bucket
	for rows.Next() {
		var b uint32
		var n uint64
		if err := rows.Scan(&b, &n); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("cannot read the event histogram of org %q: %w", org, err)
		}
		bs = append(bs, bucket{lo: max(lo, int64(b)*width), hi: min(hi, (int64(b)+1)*width), n: n})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var out []window
	var total, cur uint64
	open := false
	for _, b := range bs {
		total += b.n
		if b.n > uint64(e.x.cfg.WindowRows) && b.hi-b.lo > 1 && depth < 3 {
			sub, _, err := e.plan(ctx, b.lo, b.hi, depth+1)
			if err != nil {
				return nil, 0, err
			}
			out, open = append(out, sub...), false
			continue
		}
		if open && cur+b.n <= uint64(e.x.cfg.WindowRows) {
			out[len(out)-1].hi = b.hi
			cur += b.n
			continue
		}
		out, cur, open = append(out, window{lo: b.lo, hi: b.hi}), b.n, true
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
	}
	return out, total, nil
}

// ExportStats says what Stream wrote.
type ExportStats struct {
	Events  uint64 // event lines written by this request
	Total   uint64 // event lines of the whole export (the resumed part included)
	Seals   uint64
	Entries uint64
	Bytes   int64
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

// Stream writes the export to w: the header (unless it resumes), the events, the
// proof and the manifest. flush, when not nil, is called after each step and every
// MiB (an HTTP handler flushes and extends its write deadline there). On an error
// other than ctx's it writes an error record before returning the error: the file
// is then incomplete, and a resume continues it.
func (e *Export) Stream(ctx context.Context, w io.Writer, flush func() error) (ExportStats, error) {
	xw := newExportWriter(w, e.req.Encoding, flush)
	err := e.stream(ctx, xw)
	xw.st.Bytes = xw.o.n
	if err != nil && ctx.Err() == nil {
		xw.fail(err)
	}
	return xw.st, err
}

func (e *Export) stream(ctx context.Context, xw *exportWriter) error {
	if e.req.After == nil {
		if err := xw.header(e.header); err != nil {
			return err
		}
	} else {
		xw.st.Total = e.req.After.Events
	}
	for i, w := range e.windows {
		var after *Cursor
		if i == 0 && e.req.After != nil && e.req.After.Events > 0 {
			after = e.req.After
		}
		if err := e.window(ctx, xw, w, after); err != nil {
			return err
		}
		if err := xw.o.sync(); err != nil {
			return err
		}
	}
	if err := e.proof(ctx, xw); err != nil {
		return err
	}
	return xw.manifest(e.x.cfg.Key, e.req.Selection, e.asOf)
}

// exportWriter writes the records of one export, counting them and hashing the proof.
type exportWriter struct {
	o   *out
	enc *encoder
	ph  *proofHash
	st  ExportStats
}

func newExportWriter(w io.Writer, encoding string, flush func() error) *exportWriter {
	return &exportWriter{o: &out{bw: bufio.NewWriterSize(w, 64<<10), flush: flush}, enc: newEncoder(encoding), ph: newProofHash()}
}

func (xw *exportWriter) header(h ExportHeader) error {
	pre, err := xw.enc.preamble()
	if err != nil {
		return err
	}
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

func (xw *exportWriter) event(r *store.EventRow) error {
	ev := eventRecord(r, xw.enc.encoding)
	rec, err := xw.enc.event(&ev)
	if err != nil {
		return fmt.Errorf("cannot encode event %q: %w", clip(r.ID), err)
	}
	if len(rec) > MaxExportLineBytes {
		return fmt.Errorf("event %q at %s is %d bytes encoded, more than the export's limit of %d per line (a row edited in ClickHouse?)",
			clip(r.ID), fmtMilli(r.Time), len(rec), MaxExportLineBytes)
	}
	if err := xw.o.write(rec); err != nil {
		return err
	}
	xw.st.Events++
	xw.st.Total++
	return nil
}

// seal writes a seal and its entries (in Root's order) with their marks.
func (xw *exportWriter) seal(s *Seal, entries []proofEntry, marks []string) error {
	sr := sealRecord(s)
	if err := xw.proofRecord(KindSeal, &sr); err != nil {
		return err
	}
	xw.st.Seals++
	for i, pe := range entries {
		if err := xw.proofRecord(KindEntry, exportEntry{Kind: KindEntry, ID: pe.id, Time: fmtMilli(pe.t), Digest: pe.digest, Mark: marks[i]}); err != nil {
			return err
		}
		xw.st.Entries++
	}
	return nil
}

func (xw *exportWriter) proofRecord(kind string, v any) error {
	obj, err := xw.enc.object(v)
	if err != nil {
		return err
	}
	xw.ph.add(obj)
	rec, err := xw.enc.record(kind, obj)
	if err != nil {
		return err
	}
	return xw.o.write(rec)
}

func (xw *exportWriter) manifest(key ed25519.PrivateKey, sel Selection, asOf time.Time) error {
	m := signManifest(key, sel, asOf, xw.st.Total, xw.st.Seals, xw.st.Entries, xw.ph.sum())
	obj, err := xw.enc.object(m)
	if err != nil {
		return err
	}
	rec, err := xw.enc.record(KindManifest, obj)
	if err != nil {
		return err
	}
	if err := xw.o.write(rec); err != nil {
		return err
	}
	return xw.o.sync()
}

// fail writes an error record (best effort: the connection may be gone).
func (xw *exportWriter) fail(cause error) {
	obj, err := xw.enc.object(exportError{Kind: KindError, Error: cause.Error()})
	if err != nil {
		return
	}
	if rec, err := xw.enc.record(KindError, obj); err == nil {
		_, _ = xw.o.bw.Write(rec)
		_ = xw.o.sync()
	}
}

// exportOrder is the stream's order, and the choice among the copies of a row key
// (LIMIT 1 BY keeps the first): the smallest time_ms, then the newest copy, then a
// hash of the content, so that the same copy is chosen every time.
const exportOrder = ` ORDER BY time, time_ms, id, ingested_at DESC, cityHash64(type, room_id, actor_id, actor_type, actor_handle,
	owner_id, subject_id, subject_type, subject_handle, execution_id, source, schema_version, data) LIMIT 1 BY time, id`

// rowBlock bounds the rows ClickHouse sends in one block, which the driver holds
// whole: events are at most about 1 MiB each.
const rowBlock = 256

// window writes the events of one window, after the cursor when one is given.
func (e *Export) window(ctx context.Context, xw *exportWriter, w window, after *Cursor) error {
	db, org := e.x.cfg.Database, e.req.Selection.Org
	sealed, sargs := e.sealedIn(w.lo, w.hi)
	args := append([]any{org, unix(w.lo), unix(w.hi)}, e.pred.args...)
	args = append(args, sargs...)
	qctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_block_size": rowBlock}))
	rows, err := e.x.cfg.Conn.Query(qctx, "SELECT "+eventCols+" FROM "+db+".events WHERE org_id = ? AND time >= ? AND time < ? AND "+
		e.pred.sql+" AND "+sealed+exportOrder, args...)
	if err != nil {
		return fmt.Errorf("cannot read the events of org %q in [%s, %s) from %s.events: %w", org, fmtSec(unix(w.lo)), fmtSec(unix(w.hi)), db, err)
	}
	defer rows.Close()
	var r store.EventRow
	for rows.Next() {
		if err := scanEvent(rows, &r); err != nil {
			return fmt.Errorf("cannot read a row of %s.events: %w", db, err)
		}
		if after != nil {
			if compareKey(r.Time, r.ID, after.Time, after.ID) <= 0 {
				continue
			}
			after = nil
		}
		if err := xw.event(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read the events of org %q from %s.events: %w", org, db, err)
	}
	return nil
}

// compareKey orders events as the export does: time (ms), then id.
func compareKey(t1 time.Time, id1 string, t2 time.Time, id2 string) int {
	return cmp.Or(cmp.Compare(t1.UnixMilli(), t2.UnixMilli()), strings.Compare(id1, id2))
}

// sealPage is how many seals one read of the proof lists.
const sealPage = 1000

// proof writes every seal made at or before S whose span meets the range and that has
// an entry exported, missing or expired, each followed by its entries.
func (e *Export) proof(ctx context.Context, xw *exportWriter) error {
	db, org := e.x.cfg.Database, e.req.Selection.Org
	cuts, err := loadCuts(ctx, e.x.cfg.Conn, db, e.x.pub, e.x.keyID)
	if err != nil {
		return err
	}
	var lastSeq uint64
	lastHash, started := "", false
	for {
		q := "SELECT " + sealCols + " FROM " + db + ".seals FINAL WHERE org_id = ? AND sealed_at <= ? AND first_time <= ? AND last_time >= ?"
		args := []any{org, e.sealedBy, unix(e.pred.toSec), unix(e.pred.fromSec)}
		if started {
			q += " AND (seq > ? OR (seq = ? AND hash > ?))"
			args = append(args, lastSeq, lastSeq, lastHash)
		}
		rows, err := e.x.cfg.Conn.Query(ctx, q+" ORDER BY seq, hash LIMIT "+fmt.Sprint(sealPage), args...)
		if err != nil {
			return fmt.Errorf("cannot read the seals of org %q from %s.seals: %w", org, db, err)
		}
		var page []Seal
		for rows.Next() {
			s, err := scanSeal(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("cannot read a row of %s.seals: %w", db, err)
			}
			page = append(page, s)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("cannot read the seals of org %q from %s.seals: %w", org, db, err)
		}
		for i := 0; i < len(page); {
			j, n := i, uint64(0)
			for j < len(page) && (j == i || n+page[j].Events <= uint64(e.x.cfg.GroupEntries)) {
				n += page[j].Events
				j++
			}
			if err := e.group(ctx, xw, &cuts, page[i:j]); err != nil {
				return err
			}
			if err := xw.o.sync(); err != nil {
				return err
			}
			i = j
		}
		if len(page) < sealPage {
			return nil
		}
		lastSeq, lastHash, started = page[len(page)-1].Seq, page[len(page)-1].Hash, true
	}
}

type proofEntry struct {
	id     string
	t      time.Time
	digest string
}

// group writes the proof of a stretch of seals (by seq): it reads which of their
// entries' rows are exported or still stored, then their entries, one seal at a time.
func (e *Export) group(ctx context.Context, xw *exportWriter, cuts *cuts, seals []Seal) error {
	db, org := e.x.cfg.Database, e.req.Selection.Org
	lo, hi := seals[0].Seq, seals[len(seals)-1].Seq
	spanLo, spanHi := seals[0].FirstTime.Unix(), seals[0].LastTime.Unix()
	members := map[sealRef]*Seal{}
	for i := range seals {
		s := &seals[i]
		spanLo, spanHi = min(spanLo, s.FirstTime.Unix()), max(spanHi, s.LastTime.Unix())
		members[sealRef{s.Seq, s.Hash}] = s
	}
	spanLo, spanHi = max(spanLo, e.pred.fromSec), min(spanHi, e.pred.toSec)

	// The row keys of the group's entries in the range: stored (a key is there) and
	// exported (a copy satisfies the predicate: the stream wrote that key's row).
	exported := map[rowKey]bool{}
	if spanLo <= spanHi {
		args := append([]any{}, e.pred.args...)
		args = append(args, org, unix(spanLo), unix(spanHi), org, lo, hi, org, e.sealedBy, unix(e.pred.fromSec), unix(e.pred.toSec))
		rows, err := e.x.cfg.Conn.Query(ctx, `SELECT time, id, max(`+e.pred.sql+`) FROM `+db+`.events
			WHERE org_id = ? AND time >= ? AND time <= ?
			AND (time, id) IN (SELECT time, id FROM `+db+`.seal_entries WHERE org_id = ? AND seq >= ? AND seq <= ?
				AND (seq, seal) IN (SELECT seq, hash FROM `+db+`.seals WHERE org_id = ? AND sealed_at <= ?)
				AND time >= ? AND time <= ?)
			GROUP BY time, id`, args...)
		if err != nil {
			return fmt.Errorf("cannot read the rows of org %q seals %d to %d from %s.events: %w", org, lo, hi, db, err)
		}
		for rows.Next() {
			var t time.Time
			var k rowKey
			var sel uint8
			if err := rows.Scan(&t, &k.id, &sel); err != nil {
				rows.Close()
				return fmt.Errorf("cannot read a row of %s.events: %w", db, err)
			}
			k.org, k.sec = org, t.Unix()
			exported[k] = sel == 1
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("cannot read the rows of org %q from %s.events: %w", org, db, err)
		}
	}

	rows, err := e.x.cfg.Conn.Query(ctx, `SELECT seq, seal, id, time, time_ms, digest FROM `+db+`.seal_entries FINAL
		WHERE org_id = ? AND seq >= ? AND seq <= ? ORDER BY seq, seal, id, time, time_ms`, org, lo, hi)
	if err != nil {
		return fmt.Errorf("cannot read the entries of org %q seals %d to %d from %s.seal_entries: %w", org, lo, hi, db, err)
	}
	defer rows.Close()
	var cur sealRef
	var entries []proofEntry
	next := 0 // the group's seals before it are written (or left out)
	// upTo writes the group's seals before ref that have no stored entry: a seal that
	// covers events of the range but lost its entries is in the proof, so that the
	// verifier names it. The seals and the entries come in (seq, hash) order.
	upTo := func(ref sealRef) error {
		for ; next < len(seals) && cmp.Or(cmp.Compare(seals[next].Seq, ref.seq), strings.Compare(seals[next].Hash, ref.hash)) < 0; next++ {
			if s := &seals[next]; members[sealRef{s.Seq, s.Hash}] != nil {
				delete(members, sealRef{s.Seq, s.Hash})
				if err := e.writeSeal(xw, cuts, s, nil, exported); err != nil {
					return err
				}
			}
		}
		return nil
	}
	finish := func() error {
		s := members[cur]
		if s == nil {
			return nil
		}
		delete(members, cur) // written once, even if its rows came twice
		return e.writeSeal(xw, cuts, s, entries, exported)
	}
	for rows.Next() {
		var ref sealRef
		var pe proofEntry
		var millis uint16
		if err := rows.Scan(&ref.seq, &ref.hash, &pe.id, &pe.t, &millis, &pe.digest); err != nil {
			return fmt.Errorf("cannot read a row of %s.seal_entries: %w", db, err)
		}
		if ref != cur {
			if err := finish(); err != nil {
				return err
			}
			if err := upTo(ref); err != nil {
				return err
			}
			cur, entries = ref, entries[:0]
		}
		if members[ref] == nil {
			continue
		}
		if len(entries) >= MaxSealEntries {
			return fmt.Errorf("seal %s has more than %d entries, more than an export carries", members[ref].ID(), MaxSealEntries)
		}
		pe.t = pe.t.UTC().Add(time.Duration(millis) * time.Millisecond)
		entries = append(entries, pe)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read the entries of org %q from %s.seal_entries: %w", org, db, err)
	}
	if err := finish(); err != nil {
		return err
	}
	return upTo(sealRef{seq: ^uint64(0)})
}

// writeSeal marks a seal's entries and writes it with them when one is exported,
// missing or expired.
func (e *Export) writeSeal(xw *exportWriter, cuts *cuts, s *Seal, entries []proofEntry, exported map[rowKey]bool) error {
	marks, include := markEntries(e.req.Selection, s, entries, exported, cuts)
	if !include && uint64(len(entries)) == s.Events {
		return nil
	}
	if uint64(len(entries)) != s.Events {
		e.x.log.Warn("a seal of the exported range has lost entries (audit verify names it)", "seal", s.ID(), "entries", len(entries), "events", s.Events)
	}
	if missing := countOf(marks, MarkMissing); missing > 0 {
		e.x.log.Warn("sealed events of the exported range are gone from the trail (audit verify names them)", "seal", s.ID(), "missing", missing)
	}
	return xw.seal(s, entries, marks)
}

// markEntries sorts a seal's entries in Root's order and marks each (ExportFormat's
// doc, "Records"); include says whether the seal belongs in the proof. exported holds
// the row keys of the entries in the range that are stored, true when the export has
// their row. cuts may be nil (no retention cut honoured).
func markEntries(sel Selection, s *Seal, entries []proofEntry, exported map[rowKey]bool, cuts *cuts) ([]string, bool) {
	slices.SortFunc(entries, func(a, b proofEntry) int {
		return cmp.Or(strings.Compare(a.id, b.id), a.t.Compare(b.t))
	})
	marks := make([]string, len(entries))
	include := false
	for i, pe := range entries {
		k := rowKey{org: sel.Org, id: pe.id, sec: pe.t.Unix()}
		exp, stored := exported[k]
		switch {
		case stored && exp:
			marks[i] = MarkExported
		case !stored && !pe.t.Before(sel.From) && pe.t.Before(sel.To):
			marks[i] = MarkMissing
			if cuts != nil && cuts.excuse(pe.t, s) == "" {
				marks[i] = MarkExpired
			}
		default:
			marks[i] = MarkOther
		}
		include = include || marks[i] != MarkOther
	}
	return marks, include
}

func countOf(v []string, s string) int {
	n := 0
	for _, x := range v {
		if x == s {
			n++
		}
	}
	return n
}
