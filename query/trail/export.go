package trail

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// ExportFormat names the format of a compliance export — a selection of one
// organization's trail, as NDJSON or CSV, that proves itself offline against a
// checkpoint of the organization's log signed with the audit key — and is the label
// of its manifest's signature. The package doc covers the log; this covers exports
// (README.md here, "Compliance export").
//
// # What an export holds
//
// An export is pinned to one signed checkpoint of the organization's log, of size N:
// by default the newest stored checkpoint the key ring opens, or the one of size
// as_of. The default is refused when the checkpoints topic (ExportConfig.Published)
// holds a larger checkpoint of the log, or one the log does not extend: ClickHouse was
// rolled back. Its lines are the leaves of that log whose time lies in the selection's
// range [from, to) (milliseconds). Each leaf is matched with the stored copies of its
// row key (org, time in seconds, id) on its own: a copy matches it when it has the
// leaf's content digest and Kafka record and an ingested_at not after the leaf's and
// within the margin before it (verify's rule). For each row key, the line is the copy
// that matches its smallest leaf with a matching copy, written with that leaf's
// bookkeeping, so that the line is the leaf and nothing else; the types, actors and
// rooms lists apply to that content. Another leaf of the key is a duplicate of the
// line's row when it has a matching copy of its own, or when a leaf with a matching
// copy has its content digest and Kafka record and an ingested_at at most the margin
// after its (an earlier insert attempt's copy, noted again, that a merge dropped). Any
// other leaf no stored copy matches is a gap, even when another leaf of its key has a
// line: "modified" (a copy with other content or bookkeeping is stored), "missing"
// (none is), or "expired" (gone under a retention cut signed with the audit key, which
// the header carries). Lines and gaps are in (time, time_ms, id) order; the records of
// one row key are its gaps in leaf order, then its line.
//
// Before it writes a byte, the server reads the organization's whole log_index up to
// N and recomputes the checkpoint's root; it refuses (ErrExportConflict) a log that
// does not give it. It then checks every log_leaves row it uses against that scan and
// every proof it writes against the root, and at the end that every leaf of the range
// was a line, left out by the lists, a duplicate of a line's row, or a gap; if not, it
// stops with an error record instead of a manifest.
//
// # Records
//
// Every record names its kind. NDJSON: one JSON object a line. CSV: a row of column
// names first (ExportColumns), then event rows with those columns, and every other
// record as two fields, its kind and its JSON object (the same object as in NDJSON).
//
//   - header: format, encoding, database, the selection, the checkpoint size N, the
//     consistency sizes asked for, the checkpoint note, every key rotation record (so
//     that a verifier anchored at the first or the current key follows a rotation),
//     and the retention cuts that may excuse an expired gap;
//   - event: every column SealDigest covers, exactly (id, type, time with
//     milliseconds, org_id, room_id, actor_id, actor_type as stored, actor_handle,
//     owner_id, subject_id, subject_type, subject_handle, execution_id, source,
//     schema_version, data), then ingested_at, kafka_partition, kafka_offset, leaf (its
//     index) and proof (its RFC 6962 inclusion proof at N: the 32-byte hashes
//     concatenated, standard base64). A value that is not valid UTF-8, or (CSV only)
//     holds a carriage return, which CSV readers fold, is written in standard base64
//     and named in base64 (a list in NDJSON, space-separated in CSV);
//   - gap: a leaf of the range whose row is not exported: its index, id, time, content
//     digest, bookkeeping, mark and inclusion proof;
//   - consistency: for each size M the client holds a checkpoint of, the root at M and
//     the consistency proof from M to N;
//   - index: the leaf indexes of the lines and gaps in file order, in records of at
//     most indexPerRecord;
//   - manifest: the selection, N and its root, the numbers of events and gaps, the
//     SHA-256 of the index records, the key id, what the export proves and what it does
//     not, and an Ed25519 signature with the audit key over ManifestContent;
//   - error: the server stopped (the file is incomplete; `--resume` continues it).
//
// Nothing in the file depends on when it was made: an export of the same selection,
// format and checkpoint is the same bytes, and a resumed one ends like an
// uninterrupted one.
const ExportFormat = "bandplane.export.v2"

// ExportProves and ExportDoesNotProve are the manifest's fixed statements, signed with
// it.
const (
	ExportProves = "each line and gap is a leaf of the organization's log at the signed checkpoint, unaltered (its inclusion proof); " +
		"the server read every leaf up to the checkpoint and signs that each leaf of the range is a line, left out by the lists, a duplicate copy of a line's row, or a gap"
	ExportDoesNotProve = "the offline verifier cannot prove without the log that no other leaf of the range exists (that is the signer's word; " +
		"bandplane audit verify checks it against ClickHouse), nor what the holder of the audit key signs"
)

// Encodings of an export.
const (
	EncodingNDJSON = "ndjson"
	EncodingCSV    = "csv"
)

// Record kinds.
const (
	KindHeader      = "header"
	KindEvent       = "event"
	KindGap         = "gap"
	KindConsistency = "consistency"
	KindIndex       = "index"
	KindManifest    = "manifest"
	KindError       = "error"
)

// Marks of a gap.
const (
	MarkMissing  = "missing"
	MarkModified = "modified"
	MarkExpired  = "expired"
)

// Bounds of an export request and of an export file.
const (
	// MaxSelectionValues bounds each of types, actors and rooms.
	MaxSelectionValues = 100
	// MaxExportSpan bounds to − from: the events retention (400 days) and a day.
	MaxExportSpan = 401 * 24 * time.Hour
	// MaxExportLineBytes bounds one record as encoded. An event is at most
	// kafka.MaxEventBytes (1 MiB); JSON escapes can grow a string six-fold.
	MaxExportLineBytes = 8 << 20
	// MaxConsistency bounds the consistency sizes of one request.
	MaxConsistency = 8
	// maxCursorBytes bounds an after cursor.
	maxCursorBytes = 2048
	// indexPerRecord is how many leaf indexes one index record lists (about 1 MB).
	indexPerRecord = 50_000
	// maxProofHashes bounds a proof: a tree of 2^64 leaves needs 64.
	maxProofHashes = 64
	// maxHeaderRotations and maxHeaderCuts bound what a header carries.
	maxHeaderRotations = 1000
	maxHeaderCuts      = 10_000
)

// ExportColumns are the CSV export's columns: every record kind is in the first one;
// event rows fill them all, other records hold their JSON object in the second.
var ExportColumns = []string{"kind", "id", "type", "time", "org_id", "room_id", "actor_id", "actor_type", "actor_handle",
	"owner_id", "subject_id", "subject_type", "subject_handle", "execution_id", "source", "schema_version", "data",
	"ingested_at", "kafka_partition", "kafka_offset", "leaf", "proof", "base64"}

// Selection says which events an export holds.
type Selection struct {
	Org      string
	From, To time.Time // [From, To), millisecond precision, UTC
	Types    []string  // sorted and distinct; empty: every type
	Actors   []string
	Rooms    []string
}

// Normalize truncates the range to milliseconds and sorts and dedupes the lists (nil
// lists become empty), so that equal selections encode alike.
func (s *Selection) Normalize() {
	s.From, s.To = s.From.UTC().Truncate(time.Millisecond), s.To.UTC().Truncate(time.Millisecond)
	for _, l := range []*[]string{&s.Types, &s.Actors, &s.Rooms} {
		v := slices.Clone(*l)
		if v == nil {
			v = []string{}
		}
		slices.Sort(v)
		*l = slices.Compact(v)
	}
}

// Validate reports every problem of a normalized selection, each naming its parameter.
func (s *Selection) Validate() error {
	var errs []error
	if err := checkExportID("org", s.Org); err != nil {
		errs = append(errs, err)
	} else if strings.Contains(s.Org, "*") {
		errs = append(errs, errors.New("org: '*' is not an organization (an export holds one organization)"))
	}
	switch {
	case s.From.IsZero():
		errs = append(errs, errors.New("from: required (RFC 3339 or YYYY-MM-DD)"))
	case s.To.IsZero():
		errs = append(errs, errors.New("to: required (RFC 3339 or YYYY-MM-DD)"))
	case !s.To.After(s.From):
		errs = append(errs, fmt.Errorf("to: must be after from (from %s, to %s)", fmtMilli(s.From), fmtMilli(s.To)))
	case s.To.Sub(s.From) > MaxExportSpan:
		errs = append(errs, fmt.Errorf("to: the range %s to %s spans more than %d days; export it in parts", fmtMilli(s.From), fmtMilli(s.To), MaxExportSpan/(24*time.Hour)))
	}
	for _, b := range []struct {
		t    time.Time
		name string
	}{{s.From, "from"}, {s.To, "to"}} {
		if !b.t.IsZero() && (b.t.Before(schema.MinTime) || b.t.After(schema.MaxTime.Add(time.Millisecond))) {
			errs = append(errs, fmt.Errorf("%s: %s is outside the times the trail can hold (%s to %s)", b.name, fmtMilli(b.t),
				schema.MinTime.Format(time.DateOnly), schema.MaxTime.Format(time.DateOnly)))
		}
	}
	for _, l := range []struct {
		name string
		vals []string
		max  int
	}{{"types", s.Types, schema.MaxTypeBytes}, {"actors", s.Actors, schema.MaxIDBytes}, {"rooms", s.Rooms, schema.MaxIDBytes}} {
		if len(l.vals) > MaxSelectionValues {
			errs = append(errs, fmt.Errorf("%s: %d values; at most %d", l.name, len(l.vals), MaxSelectionValues))
			continue
		}
		for _, v := range l.vals {
			if err := checkValue(l.name, v, l.max); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// selects says whether the lists select a row's content (the range is checked apart).
func (s *Selection) selects(r *store.EventRow) bool {
	return (len(s.Types) == 0 || slices.Contains(s.Types, r.Type)) &&
		(len(s.Actors) == 0 || slices.Contains(s.Actors, r.ActorID)) &&
		(len(s.Rooms) == 0 || slices.Contains(s.Rooms, r.RoomID))
}

// inRange says whether t lies in [From, To).
func (s *Selection) inRange(t time.Time) bool { return !t.Before(s.From) && t.Before(s.To) }

func checkExportID(name, v string) error {
	if v == "" {
		return fmt.Errorf("%s: required", name)
	}
	return checkValue(name, v, schema.MaxIDBytes)
}

// checkValue refuses what no stored id, type or organization can be: empty, too long,
// not UTF-8, or holding a control character. The value is quoted only when short.
func checkValue(name, v string, maxBytes int) error {
	show := func() string {
		if len(v) > 64 || !utf8.ValidString(v) {
			return fmt.Sprintf("a value of %d bytes", len(v))
		}
		return strconv.Quote(v)
	}
	switch {
	case v == "":
		return fmt.Errorf("%s: an empty value", name)
	case len(v) > maxBytes:
		return fmt.Errorf("%s: %s is longer than %d bytes", name, show(), maxBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("%s: %s is not valid UTF-8", name, show())
	}
	for i, r := range v {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s: %s has a control character at byte %d", name, show(), i)
		}
	}
	return nil
}

// ExportRequest is one GET /v1/audit/export.
type ExportRequest struct {
	Selection Selection
	Encoding  string // EncodingNDJSON or EncodingCSV
	// AsOf is the size of the checkpoint to pin the export to; 0: the newest, checked
	// against the checkpoints topic's (ExportConfig.Published).
	AsOf uint64
	// Consistency are the sizes of checkpoints the client holds (sorted, distinct): the
	// trailer proves the pinned log extends each.
	Consistency []uint64
	After       *Cursor // resume after this event (AsOf is then required)
}

// exportParams are the query parameters of the export, the lists repeatable.
var exportParams = map[string]bool{"org": false, "from": false, "to": false, "types": true, "actors": true, "rooms": true,
	"format": false, "as_of": false, "consistency": true, "after": false}

// parseSize reads a log size: a canonical decimal of at least 1.
func parseSize(name, v string) (uint64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != v {
		return 0, fmt.Errorf("%s: want a log size (a whole number, as in an export's header or a checkpoint), got %q", name, clip(v))
	}
	if n == 0 {
		return 0, fmt.Errorf("%s: 0 is not the size of a checkpoint (a checkpoint covers at least one leaf)", name)
	}
	return n, nil
}

// ParseExportRequest reads the query parameters of an export. The organization may be
// missing (an organization's key exports its own); everything else is checked, every
// problem named by parameter. Lists are comma-separated, repeated, or both.
func ParseExportRequest(q url.Values) (ExportRequest, error) {
	var errs []error
	var req ExportRequest
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range q {
			if !yield(k) {
				return
			}
		}
	}) {
		list, known := exportParams[k]
		if !known {
			shown := k
			if len(shown) > 64 || !utf8.ValidString(shown) {
				shown = fmt.Sprintf("of %d bytes", len(k))
			} else {
				shown = strconv.Quote(shown)
			}
			errs = append(errs, fmt.Errorf("unknown parameter %s (known: actors, after, as_of, consistency, format, from, org, rooms, to, types)", shown))
			continue
		}
		if !list && len(q[k]) > 1 {
			errs = append(errs, fmt.Errorf("%s: given %d times; give it once", k, len(q[k])))
		}
	}
	one := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	req.Selection.Org = one("org")
	if _, ok := q["org"]; ok && req.Selection.Org == "" {
		errs = append(errs, errors.New("org: empty"))
	}
	var err error
	if v := one("from"); v != "" {
		if req.Selection.From, err = parseExportTime(v); err != nil {
			errs = append(errs, fmt.Errorf("from: %w", err))
		}
	}
	if v := one("to"); v != "" {
		if req.Selection.To, err = parseExportTime(v); err != nil {
			errs = append(errs, fmt.Errorf("to: %w", err))
		}
	}
	split := func(name string, max int) []string {
		var vals []string
		sent := 0
		for _, raw := range q[name] {
			for v := range strings.SplitSeq(raw, ",") {
				if sent++; sent <= max {
					vals = append(vals, v)
				}
			}
		}
		if sent > max {
			errs = append(errs, fmt.Errorf("%s: %d values; at most %d", name, sent, max))
		}
		return vals
	}
	req.Selection.Types = split("types", MaxSelectionValues)
	req.Selection.Actors = split("actors", MaxSelectionValues)
	req.Selection.Rooms = split("rooms", MaxSelectionValues)
	switch f := one("format"); f {
	case "", EncodingNDJSON:
		req.Encoding = EncodingNDJSON
	case EncodingCSV:
		req.Encoding = EncodingCSV
	default:
		if len(f) > 32 {
			f = f[:32] + "…"
		}
		errs = append(errs, fmt.Errorf("format: %q is not ndjson or csv", f))
	}
	if v, ok := q["as_of"]; ok {
		if req.AsOf, err = parseSize("as_of", v[0]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, v := range split("consistency", MaxConsistency) {
		n, err := parseSize("consistency", v)
		if err != nil {
			errs = append(errs, err)
			break
		}
		req.Consistency = append(req.Consistency, n)
	}
	req.Consistency = normSizes(req.Consistency)
	if v := one("after"); v != "" {
		c, err := DecodeCursor(v)
		if err != nil {
			errs = append(errs, err)
		} else {
			req.After = &c
		}
		if _, ok := q["as_of"]; !ok {
			errs = append(errs, errors.New("after: needs as_of, the size of the export it continues"))
		}
	}
	req.Selection.Normalize()
	if req.Selection.Org == "" {
		// The organization comes from the key; everything else is checked now.
		req.Selection.Org = "-"
		err = req.Selection.Validate()
		req.Selection.Org = ""
	} else {
		err = req.Selection.Validate()
	}
	if err != nil {
		errs = append(errs, err)
	}
	return req, errors.Join(errs...)
}

// normSizes sorts and dedupes sizes (nil stays nil).
func normSizes(v []uint64) []uint64 {
	if len(v) == 0 {
		return nil
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return slices.Compact(v)
}

// Values are the query parameters of the request (what the CLI sends).
func (r *ExportRequest) Values() url.Values {
	q := url.Values{}
	s := r.Selection
	if s.Org != "" {
		q.Set("org", s.Org)
	}
	q.Set("from", fmtMilli(s.From))
	q.Set("to", fmtMilli(s.To))
	for _, l := range []struct {
		name string
		vals []string
	}{{"types", s.Types}, {"actors", s.Actors}, {"rooms", s.Rooms}} {
		for _, v := range l.vals {
			q.Add(l.name, v)
		}
	}
	q.Set("format", r.Encoding)
	if r.AsOf > 0 {
		q.Set("as_of", strconv.FormatUint(r.AsOf, 10))
	}
	for _, m := range r.Consistency {
		q.Add("consistency", strconv.FormatUint(m, 10))
	}
	if r.After != nil {
		q.Set("after", r.After.String())
	}
	return q
}

// parseExportTime reads RFC 3339 (any fraction, taken at milliseconds) or YYYY-MM-DD.
func parseExportTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor YYYY-MM-DD", clip(s))
	}
	return t, nil
}

const milliLayout = "2006-01-02T15:04:05.000Z07:00"

func fmtMilli(t time.Time) string { return t.UTC().Format(milliLayout) }
func fmtSec(t time.Time) string   { return t.UTC().Format(time.RFC3339) }

// parseMilli reads a time fmtMilli writes, and only that.
func parseMilli(s string) (time.Time, bool) {
	if len(s) != len("2006-01-02T15:04:05.000Z") || s[19] != '.' || s[23] != 'Z' {
		return time.Time{}, false
	}
	ms, ok := digitsOf(s[20:23])
	if !ok {
		return time.Time{}, false
	}
	t, ok := parseDateTime(s[:19])
	return t.Add(time.Duration(ms) * time.Millisecond), ok
}

// parseSec reads a time fmtSec writes, and only that.
func parseSec(s string) (time.Time, bool) {
	if len(s) != len("2006-01-02T15:04:05Z") || s[19] != 'Z' {
		return time.Time{}, false
	}
	return parseDateTime(s[:19])
}

// parseDateTime reads "2006-01-02T15:04:05" in UTC, refusing a date or time that does
// not exist (time.Date would carry it over).
func parseDateTime(s string) (time.Time, bool) {
	if s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	var v [6]int
	for i, r := range [6][2]int{{0, 4}, {5, 7}, {8, 10}, {11, 13}, {14, 16}, {17, 19}} {
		n, ok := digitsOf(s[r[0]:r[1]])
		if !ok {
			return time.Time{}, false
		}
		v[i] = n
	}
	t := time.Date(v[0], time.Month(v[1]), v[2], v[3], v[4], v[5], 0, time.UTC)
	if t.Year() != v[0] || int(t.Month()) != v[1] || t.Day() != v[2] || t.Hour() != v[3] || t.Minute() != v[4] || t.Second() != v[5] {
		return time.Time{}, false
	}
	return t, true
}

func digitsOf(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

// encodeProof is a proof as an export writes it: the hashes concatenated, standard
// base64.
func encodeProof(pr [][]byte) string {
	b := make([]byte, 0, len(pr)*sha256.Size)
	for _, h := range pr {
		b = append(b, h...)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// decodeProof reads a proof back, refusing what encodeProof would not write.
func decodeProof(s string) ([][]byte, error) {
	if len(s) > base64.StdEncoding.EncodedLen(maxProofHashes*sha256.Size) {
		return nil, fmt.Errorf("the proof is %d characters, more than %d hashes", len(s), maxProofHashes)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%sha256.Size != 0 || base64.StdEncoding.EncodeToString(b) != s {
		return nil, errors.New("the proof is not standard base64 of whole 32-byte hashes")
	}
	out := make([][]byte, len(b)/sha256.Size)
	for i := range out {
		out[i] = b[i*sha256.Size : (i+1)*sha256.Size]
	}
	return out, nil
}

// exportCut is a retention cut as a header carries it.
type exportCut struct {
	Table      string `json:"table"`
	Before     string `json:"before"`
	At         string `json:"at"`
	Partitions uint64 `json:"partitions"`
	KeyID      string `json:"key_id"`
	Signature  string `json:"signature"`
}

func cutRecord(c *chdb.Cut) exportCut {
	return exportCut{Table: c.Table, Before: fmtSec(c.Before), At: fmtSec(c.At), Partitions: c.Partitions, KeyID: c.KeyID, Signature: c.Signature}
}

func (c *exportCut) cut() (chdb.Cut, bool) {
	before, ok1 := parseSec(c.Before)
	at, ok2 := parseSec(c.At)
	return chdb.Cut{Table: c.Table, Before: before, At: at, Partitions: c.Partitions, KeyID: c.KeyID, Signature: c.Signature}, ok1 && ok2
}

// ExportHeader is the first record of an export.
type ExportHeader struct {
	Kind        string      `json:"kind"`
	Format      string      `json:"format"`
	Encoding    string      `json:"encoding"`
	Database    string      `json:"database"`
	Org         string      `json:"org"`
	From        string      `json:"from"`
	To          string      `json:"to"`
	Types       []string    `json:"types"`
	Actors      []string    `json:"actors"`
	Rooms       []string    `json:"rooms"`
	Size        uint64      `json:"size"`
	Consistency []uint64    `json:"consistency"`
	Checkpoint  string      `json:"checkpoint"`
	Rotations   []string    `json:"rotations"`
	Cuts        []exportCut `json:"cuts"`
}

// Request is the request that continues the export of this header after cursor c.
func (h *ExportHeader) Request(c *Cursor) (ExportRequest, error) {
	s, err := h.selection()
	if err != nil {
		return ExportRequest{}, err
	}
	return ExportRequest{Selection: s, Encoding: h.Encoding, AsOf: h.Size, Consistency: normSizes(h.Consistency), After: c}, nil
}

// selection reads the header's selection back, refusing anything an export server
// would not have written.
func (h *ExportHeader) selection() (Selection, error) {
	if h.Kind != KindHeader || h.Format != ExportFormat {
		return Selection{}, fmt.Errorf("not a %s header (kind %q, format %q)", ExportFormat, clip(h.Kind), clip(h.Format))
	}
	if h.Encoding != EncodingNDJSON && h.Encoding != EncodingCSV {
		return Selection{}, fmt.Errorf("unknown encoding %q", clip(h.Encoding))
	}
	from, ok1 := parseMilli(h.From)
	to, ok2 := parseMilli(h.To)
	if !ok1 || !ok2 {
		return Selection{}, fmt.Errorf("from %q or to %q is not in the export's time format", clip(h.From), clip(h.To))
	}
	if h.Size == 0 {
		return Selection{}, errors.New("size 0: no checkpoint")
	}
	if len(h.Consistency) > MaxConsistency || !slices.Equal(normSizes(h.Consistency), nonNilSizes(h.Consistency)) {
		return Selection{}, fmt.Errorf("consistency: at most %d sizes, sorted and distinct", MaxConsistency)
	}
	for _, m := range h.Consistency {
		if m == 0 || m > h.Size {
			return Selection{}, fmt.Errorf("consistency: size %d is not in 1 to %d", m, h.Size)
		}
	}
	if len(h.Checkpoint) > tlog.MaxNoteBytes || len(h.Rotations) > maxHeaderRotations || len(h.Cuts) > maxHeaderCuts {
		return Selection{}, errors.New("the checkpoint, rotations or cuts are larger than an export writes")
	}
	s := Selection{Org: h.Org, From: from, To: to, Types: h.Types, Actors: h.Actors, Rooms: h.Rooms}
	s.Normalize()
	if !slices.Equal(s.Types, nonNil(h.Types)) || !slices.Equal(s.Actors, nonNil(h.Actors)) || !slices.Equal(s.Rooms, nonNil(h.Rooms)) {
		return Selection{}, errors.New("the selection's lists are not sorted and distinct")
	}
	if err := s.Validate(); err != nil {
		return Selection{}, err
	}
	return s, nil
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

func nonNilSizes(v []uint64) []uint64 {
	if len(v) == 0 {
		return nil
	}
	return v
}

// binding is what a cursor is bound to: the encoding, the selection, the checkpoint
// note (so its size and root) and the consistency sizes.
func binding(s Selection, encoding string, checkpoint string, consistency []uint64) [8]byte {
	h := sha256.New()
	store.WriteField(h, "bandplane.export-cursor.v2")
	store.WriteField(h, encoding)
	h.Write(selectionBytes(nil, s))
	store.WriteField(h, checkpoint)
	var n [8]byte
	for _, m := range consistency {
		binary.BigEndian.PutUint64(n[:], m)
		h.Write(n[:])
	}
	var out [8]byte
	copy(out[:], h.Sum(nil))
	return out
}

// selectionBytes appends the selection, length-prefixed (the manifest's signed content
// and the cursor's binding).
func selectionBytes(b []byte, s Selection) []byte {
	b = appendString(b, s.Org)
	b = binary.BigEndian.AppendUint64(b, uint64(s.From.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(s.To.UnixMilli()))
	for _, l := range [][]string{s.Types, s.Actors, s.Rooms} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(l)))
		for _, v := range l {
			b = appendString(b, v)
		}
	}
	return b
}

// Cursor is where a resumed export continues: after the event at Time with ID, the
// Events-th event line of the export (Events 0: after the header).
type Cursor struct {
	Bind   [8]byte
	Events uint64
	Time   time.Time // millisecond precision
	ID     string
}

// NewCursor is the cursor after the events-th event line (id at t) of the export with
// header h.
func NewCursor(h *ExportHeader, events uint64, t time.Time, id string) (Cursor, error) {
	s, err := h.selection()
	if err != nil {
		return Cursor{}, err
	}
	c := Cursor{Bind: binding(s, h.Encoding, h.Checkpoint, normSizes(h.Consistency)), Events: events}
	if events > 0 {
		c.Time, c.ID = t.UTC().Truncate(time.Millisecond), id
	}
	return c, nil
}

// String encodes the cursor: base64url of "x2:<binding hex>:<events>:<unix ms>:<id>".
func (c Cursor) String() string {
	ms := int64(0)
	if !c.Time.IsZero() {
		ms = c.Time.UnixMilli()
	}
	return base64.RawURLEncoding.EncodeToString([]byte("x2:" + hex.EncodeToString(c.Bind[:]) + ":" +
		strconv.FormatUint(c.Events, 10) + ":" + strconv.FormatInt(ms, 10) + ":" + c.ID))
}

// DecodeCursor reads an after cursor.
func DecodeCursor(s string) (Cursor, error) {
	bad := fmt.Errorf("after: malformed cursor %q (the CLI makes it from the file's last event: `bandplane audit export --resume`)", clip(s))
	if len(s) > maxCursorBytes {
		return Cursor{}, fmt.Errorf("after: the cursor is %d bytes, more than %d", len(s), maxCursorBytes)
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, bad
	}
	parts := strings.SplitN(string(raw), ":", 5)
	if len(parts) != 5 || parts[0] != "x2" {
		return Cursor{}, bad
	}
	var c Cursor
	if b, err := hex.DecodeString(parts[1]); err != nil || len(b) != len(c.Bind) {
		return Cursor{}, bad
	} else {
		copy(c.Bind[:], b)
	}
	if c.Events, err = strconv.ParseUint(parts[2], 10, 64); err != nil || strconv.FormatUint(c.Events, 10) != parts[2] {
		return Cursor{}, bad
	}
	ms, err := strconv.ParseInt(parts[3], 10, 64)
	if err != nil || ms < 0 || ms > schema.MaxTime.UnixMilli() {
		return Cursor{}, bad
	}
	c.Time, c.ID = time.UnixMilli(ms).UTC(), parts[4]
	switch {
	case c.Events == 0 && (ms != 0 || c.ID != ""):
		return Cursor{}, bad
	case c.Events == 0:
		c.Time = time.Time{}
	default:
		if err := checkExportID("after", c.ID); err != nil {
			return Cursor{}, fmt.Errorf("after: the cursor's event id: %w", err)
		}
	}
	return c, nil
}

// exportEvent is an event record. Field order is the encoding (NDJSON is checked to be
// canonical: re-encoded, a line must give itself back).
type exportEvent struct {
	Kind           string   `json:"kind"`
	ID             string   `json:"id"`
	Type           string   `json:"type"`
	Time           string   `json:"time"`
	OrgID          string   `json:"org_id"`
	RoomID         string   `json:"room_id"`
	ActorID        string   `json:"actor_id"`
	ActorType      string   `json:"actor_type"`
	ActorHandle    string   `json:"actor_handle"`
	OwnerID        string   `json:"owner_id"`
	SubjectID      string   `json:"subject_id"`
	SubjectType    string   `json:"subject_type"`
	SubjectHandle  string   `json:"subject_handle"`
	ExecutionID    string   `json:"execution_id"`
	Source         string   `json:"source"`
	SchemaVersion  uint16   `json:"schema_version"`
	Data           string   `json:"data"`
	IngestedAt     string   `json:"ingested_at"`
	KafkaPartition int32    `json:"kafka_partition"`
	KafkaOffset    int64    `json:"kafka_offset"`
	Leaf           uint64   `json:"leaf"`
	Proof          string   `json:"proof"`
	Base64         []string `json:"base64,omitempty"`
}

// fields are the event's string fields with their column names, in column order.
func (e *exportEvent) fields() [14]struct {
	name string
	v    *string
} {
	return [14]struct {
		name string
		v    *string
	}{{"id", &e.ID}, {"type", &e.Type}, {"org_id", &e.OrgID}, {"room_id", &e.RoomID}, {"actor_id", &e.ActorID},
		{"actor_type", &e.ActorType}, {"actor_handle", &e.ActorHandle}, {"owner_id", &e.OwnerID}, {"subject_id", &e.SubjectID},
		{"subject_type", &e.SubjectType}, {"subject_handle", &e.SubjectHandle}, {"execution_id", &e.ExecutionID},
		{"source", &e.Source}, {"data", &e.Data}}
}

// needsBase64 says whether an encoding cannot carry v exactly.
func needsBase64(v, encoding string) bool {
	return !utf8.ValidString(v) || encoding == EncodingCSV && strings.IndexByte(v, '\r') >= 0
}

// eventRecord encodes a sealed row (its bookkeeping the leaf's) at leaf with its proof,
// base64 for the values the encoding cannot carry exactly.
func eventRecord(r *store.EventRow, leaf uint64, proof string, encoding string) exportEvent {
	e := exportEvent{Kind: KindEvent, ID: r.ID, Type: r.Type, Time: fmtMilli(r.Time), OrgID: r.OrgID, RoomID: r.RoomID,
		ActorID: r.ActorID, ActorType: store.StoredActorType(r.ActorType), ActorHandle: r.ActorHandle, OwnerID: r.OwnerID,
		SubjectID: r.SubjectID, SubjectType: r.SubjectType, SubjectHandle: r.SubjectHandle, ExecutionID: r.ExecutionID,
		Source: r.Source, SchemaVersion: r.SchemaVersion, Data: r.Data, IngestedAt: fmtSec(r.IngestedAt),
		KafkaPartition: r.Partition, KafkaOffset: r.Offset, Leaf: leaf, Proof: proof}
	for _, f := range e.fields() {
		if needsBase64(*f.v, encoding) {
			*f.v = base64.StdEncoding.EncodeToString([]byte(*f.v))
			e.Base64 = append(e.Base64, f.name)
		}
	}
	return e
}

// row decodes an event record back into the row it was made of (e is a copy: the
// record keeps its base64).
func (e exportEvent) row() (store.EventRow, error) {
	if e.Kind != KindEvent {
		return store.EventRow{}, fmt.Errorf("kind %q is not event", clip(e.Kind))
	}
	fields := e.fields()
	if err := decodeBase64Fields(e.Base64, fields[:]); err != nil {
		return store.EventRow{}, err
	}
	t, ok := parseMilli(e.Time)
	if !ok {
		return store.EventRow{}, fmt.Errorf("time %q is not RFC 3339 with milliseconds in UTC", clip(e.Time))
	}
	at, ok := parseSec(e.IngestedAt)
	if !ok {
		return store.EventRow{}, fmt.Errorf("ingested_at %q is not RFC 3339 in whole seconds, UTC", clip(e.IngestedAt))
	}
	if e.ID == "" {
		return store.EventRow{}, errors.New("no id")
	}
	return store.EventRow{ID: e.ID, Type: e.Type, Time: t, OrgID: e.OrgID, RoomID: e.RoomID, ActorID: e.ActorID,
		ActorType: e.ActorType, ActorHandle: e.ActorHandle, OwnerID: e.OwnerID, SubjectID: e.SubjectID,
		SubjectType: e.SubjectType, SubjectHandle: e.SubjectHandle, ExecutionID: e.ExecutionID, Source: e.Source,
		SchemaVersion: e.SchemaVersion, Data: e.Data, IngestedAt: at, Partition: e.KafkaPartition, Offset: e.KafkaOffset}, nil
}

// decodeBase64Fields decodes in place the fields names lists.
func decodeBase64Fields(names []string, fields []struct {
	name string
	v    *string
}) error {
	if len(names) == 0 {
		return nil
	}
	if len(names) > len(fields) {
		return fmt.Errorf("base64 names %d fields, more than the record has", len(names))
	}
	done := 0
	for i, name := range names {
		if slices.Contains(names[:i], name) {
			return errors.New("base64 names a field twice")
		}
		for _, f := range fields {
			if f.name != name {
				continue
			}
			b, err := base64.StdEncoding.DecodeString(*f.v)
			if err != nil {
				return fmt.Errorf("field %s is not base64, though base64 names it", f.name)
			}
			*f.v = string(b)
			done++
		}
	}
	if done != len(names) {
		return fmt.Errorf("base64 names unknown fields (%q)", clip(strings.Join(names, " ")))
	}
	return nil
}

// sameEvent says whether two event records are the same, field by field.
func sameEvent(a, b *exportEvent) bool {
	as, bs := a.strings(), b.strings()
	for i := range as {
		if *as[i] != *bs[i] {
			return false
		}
	}
	return a.SchemaVersion == b.SchemaVersion && a.Data == b.Data && a.IngestedAt == b.IngestedAt && a.KafkaPartition == b.KafkaPartition &&
		a.KafkaOffset == b.KafkaOffset && a.Leaf == b.Leaf && a.Proof == b.Proof && slices.Equal(a.Base64, b.Base64)
}

// csvFields is the event's CSV row.
func (e *exportEvent) csvFields() []string {
	return []string{KindEvent, e.ID, e.Type, e.Time, e.OrgID, e.RoomID, e.ActorID, e.ActorType, e.ActorHandle, e.OwnerID,
		e.SubjectID, e.SubjectType, e.SubjectHandle, e.ExecutionID, e.Source, strconv.FormatUint(uint64(e.SchemaVersion), 10),
		e.Data, e.IngestedAt, strconv.FormatInt(int64(e.KafkaPartition), 10), strconv.FormatInt(e.KafkaOffset, 10),
		strconv.FormatUint(e.Leaf, 10), e.Proof, strings.Join(e.Base64, " ")}
}

func eventFromCSV(f []string) (exportEvent, error) {
	if len(f) != len(ExportColumns) {
		return exportEvent{}, fmt.Errorf("an event row has %d fields, want %d", len(f), len(ExportColumns))
	}
	v, err := strconv.ParseUint(f[15], 10, 16)
	if err != nil || strconv.FormatUint(v, 10) != f[15] {
		return exportEvent{}, fmt.Errorf("schema_version %q is not a number up to 65535", clip(f[15]))
	}
	part, err := strconv.ParseInt(f[18], 10, 32)
	if err != nil || strconv.FormatInt(part, 10) != f[18] {
		return exportEvent{}, fmt.Errorf("kafka_partition %q is not a 32-bit number", clip(f[18]))
	}
	off, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil || strconv.FormatInt(off, 10) != f[19] {
		return exportEvent{}, fmt.Errorf("kafka_offset %q is not a 64-bit number", clip(f[19]))
	}
	leaf, err := strconv.ParseUint(f[20], 10, 64)
	if err != nil || strconv.FormatUint(leaf, 10) != f[20] {
		return exportEvent{}, fmt.Errorf("leaf %q is not a leaf index", clip(f[20]))
	}
	e := exportEvent{Kind: f[0], ID: f[1], Type: f[2], Time: f[3], OrgID: f[4], RoomID: f[5], ActorID: f[6], ActorType: f[7],
		ActorHandle: f[8], OwnerID: f[9], SubjectID: f[10], SubjectType: f[11], SubjectHandle: f[12], ExecutionID: f[13],
		Source: f[14], SchemaVersion: uint16(v), Data: f[16], IngestedAt: f[17], KafkaPartition: int32(part), KafkaOffset: off,
		Leaf: leaf, Proof: f[21]}
	if f[22] != "" {
		e.Base64 = strings.Split(f[22], " ")
	}
	return e, nil
}

// exportGap is a gap record: a leaf of the range whose row is not exported.
type exportGap struct {
	Kind           string   `json:"kind"`
	Leaf           uint64   `json:"leaf"`
	ID             string   `json:"id"`
	Time           string   `json:"time"`
	Digest         string   `json:"digest"`
	IngestedAt     string   `json:"ingested_at"`
	KafkaPartition int32    `json:"kafka_partition"`
	KafkaOffset    int64    `json:"kafka_offset"`
	Mark           string   `json:"mark"`
	Proof          string   `json:"proof"`
	Base64         []string `json:"base64,omitempty"`
}

func gapRecord(lf *IndexedLeaf, mark, proof string) exportGap {
	g := exportGap{Kind: KindGap, Leaf: lf.Index, ID: lf.ID, Time: fmtMilli(lf.Time), Digest: hex.EncodeToString(lf.Digest[:]),
		IngestedAt: fmtSec(lf.IngestedAt), KafkaPartition: lf.Partition, KafkaOffset: lf.Offset, Mark: mark, Proof: proof}
	if !utf8.ValidString(g.ID) {
		g.ID, g.Base64 = base64.StdEncoding.EncodeToString([]byte(g.ID)), []string{"id"}
	}
	return g
}

// leaf reads the leaf of a gap record of org back.
func (g exportGap) leaf(org string) (tlog.Leaf, error) {
	id := g.ID
	if err := decodeBase64Fields(g.Base64, []struct {
		name string
		v    *string
	}{{"id", &id}}); err != nil {
		return tlog.Leaf{}, err
	}
	t, ok := parseMilli(g.Time)
	at, ok2 := parseSec(g.IngestedAt)
	d, ok3 := parseHash(g.Digest)
	switch {
	case !ok:
		return tlog.Leaf{}, fmt.Errorf("time %q is not RFC 3339 with milliseconds in UTC", clip(g.Time))
	case !ok2:
		return tlog.Leaf{}, fmt.Errorf("ingested_at %q is not RFC 3339 in whole seconds, UTC", clip(g.IngestedAt))
	case !ok3 || hex.EncodeToString(d[:]) != g.Digest:
		return tlog.Leaf{}, fmt.Errorf("digest %q is not 64 lowercase hex digits", clip(g.Digest))
	case id == "":
		return tlog.Leaf{}, errors.New("no id")
	}
	return tlog.Leaf{Org: org, ID: id, Time: t, Digest: store.Digest(d), IngestedAt: at, Partition: g.KafkaPartition, Offset: g.KafkaOffset}, nil
}

// exportConsistency is a consistency record: the log at the export's checkpoint
// extends the log at Size, whose root is Root.
type exportConsistency struct {
	Kind  string `json:"kind"`
	Size  uint64 `json:"size"`
	Root  string `json:"root"`
	Proof string `json:"proof"`
}

// exportIndex is an index record: the leaf indexes of the lines and gaps from the
// First-th one on, in file order.
type exportIndex struct {
	Kind   string   `json:"kind"`
	First  uint64   `json:"first"`
	Leaves []uint64 `json:"leaves"`
}

// exportManifest is the last record.
type exportManifest struct {
	Kind         string   `json:"kind"`
	Format       string   `json:"format"`
	Database     string   `json:"database"`
	Org          string   `json:"org"`
	From         string   `json:"from"`
	To           string   `json:"to"`
	Types        []string `json:"types"`
	Actors       []string `json:"actors"`
	Rooms        []string `json:"rooms"`
	Size         uint64   `json:"size"`
	Root         string   `json:"root"`
	Consistency  []uint64 `json:"consistency"`
	Events       uint64   `json:"events"`
	Gaps         uint64   `json:"gaps"`
	IndexSHA256  string   `json:"index_sha256"`
	KeyID        string   `json:"key_id"`
	Proves       string   `json:"proves"`
	DoesNotProve string   `json:"does_not_prove"`
	Signature    string   `json:"signature"`
}

// ManifestContent is what the manifest's signature covers: under the label
// bandplane.export.v2, the database, the selection (organization, from and to in Unix
// milliseconds, each list counted and length-prefixed), the checkpoint's size and
// root, the consistency sizes, the numbers of events and gaps, the index hash, the key
// id and the two statements. Part of the export format.
func ManifestContent(db string, s Selection, size uint64, root []byte, consistency []uint64, events, gaps uint64, indexSHA256, keyID string) []byte {
	b := make([]byte, 0, 1024)
	b = appendString(b, ExportFormat)
	b = appendString(b, db)
	b = selectionBytes(b, s)
	b = binary.BigEndian.AppendUint64(b, size)
	b = appendString(b, string(root))
	b = binary.BigEndian.AppendUint32(b, uint32(len(consistency)))
	for _, m := range consistency {
		b = binary.BigEndian.AppendUint64(b, m)
	}
	b = binary.BigEndian.AppendUint64(b, events)
	b = binary.BigEndian.AppendUint64(b, gaps)
	b = appendString(b, indexSHA256)
	b = appendString(b, keyID)
	b = appendString(b, ExportProves)
	return appendString(b, ExportDoesNotProve)
}

func signManifest(key ed25519.PrivateKey, db string, s Selection, cp *tlog.Checkpoint, consistency []uint64, events, gaps uint64, index string) exportManifest {
	id := tlog.KeyID(key.Public().(ed25519.PublicKey))
	sig := ed25519.Sign(key, ManifestContent(db, s, cp.Size, cp.Root, consistency, events, gaps, index, id))
	if consistency == nil {
		consistency = []uint64{}
	}
	return exportManifest{Kind: KindManifest, Format: ExportFormat, Database: db, Org: s.Org, From: fmtMilli(s.From), To: fmtMilli(s.To),
		Types: s.Types, Actors: s.Actors, Rooms: s.Rooms, Size: cp.Size, Root: base64.StdEncoding.EncodeToString(cp.Root),
		Consistency: consistency, Events: events, Gaps: gaps, IndexSHA256: index, KeyID: id,
		Proves: ExportProves, DoesNotProve: ExportDoesNotProve, Signature: hex.EncodeToString(sig)}
}

// exportError is an error record: the server stopped before the end.
type exportError struct {
	Kind  string `json:"kind"`
	Error string `json:"error"`
}

// encoder writes records in one encoding. Records are JSON objects encoded
// deterministically (no HTML escaping): the index hash is over those bytes.
type encoder struct {
	encoding string
	line     []byte
	buf      bytes.Buffer
	js       *json.Encoder
	csvBuf   bytes.Buffer
	csv      *csv.Writer
}

func newEncoder(encoding string) *encoder {
	e := &encoder{encoding: encoding}
	e.js = json.NewEncoder(&e.buf)
	e.js.SetEscapeHTML(false)
	e.csv = csv.NewWriter(&e.csvBuf)
	return e
}

// object returns the JSON of v, without a newline (valid until the next call).
func (e *encoder) object(v any) ([]byte, error) {
	e.buf.Reset()
	if err := e.js.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(e.buf.Bytes(), []byte("\n")), nil
}

// record returns the bytes of one record whose JSON object is obj, newline included
// (valid until the next call).
func (e *encoder) record(kind string, obj []byte) ([]byte, error) {
	if e.encoding == EncodingNDJSON {
		return append(obj, '\n'), nil
	}
	return e.row([]string{kind, string(obj)})
}

func (e *encoder) row(fields []string) ([]byte, error) {
	e.csvBuf.Reset()
	if err := e.csv.Write(fields); err != nil {
		return nil, err
	}
	e.csv.Flush()
	if err := e.csv.Error(); err != nil {
		return nil, err
	}
	return e.csvBuf.Bytes(), nil
}

// event returns the bytes of an event record (valid until the next call).
func (e *encoder) event(ev *exportEvent) ([]byte, error) {
	if e.encoding == EncodingNDJSON {
		e.line = append(appendEventJSON(e.line[:0], ev), '\n')
		return e.line, nil
	}
	return e.row(ev.csvFields())
}

// preamble is what comes before the header: the column row in CSV.
func (e *encoder) preamble() ([]byte, error) {
	if e.encoding == EncodingCSV {
		return e.row(ExportColumns)
	}
	return nil, nil
}

// indexHash hashes the index records: each object length-prefixed, under a label.
type indexHash struct {
	h hash.Hash
}

func newIndexHash() *indexHash {
	ih := &indexHash{h: sha256.New()}
	ih.h.Write(appendString(nil, "bandplane.export-index.v2"))
	return ih
}

func (ih *indexHash) add(obj []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(obj)))
	ih.h.Write(n[:])
	ih.h.Write(obj)
}

func (ih *indexHash) sum() string { return hex.EncodeToString(ih.h.Sum(nil)) }

// recordKinds are every kind a scanner recognises, by the first bytes of a record.
var recordKinds = []string{KindEvent, KindGap, KindIndex, KindConsistency, KindHeader, KindManifest, KindError}

// recordKind is the kind of a record from its first bytes (what a scanner of a file
// being written or resumed needs), "" when it is none of the kinds.
func recordKind(encoding string, prefix []byte) string {
	for _, k := range recordKinds {
		if encoding == EncodingNDJSON && bytes.HasPrefix(prefix, []byte(`{"kind":"`+k+`"`)) ||
			encoding == EncodingCSV && bytes.HasPrefix(prefix, []byte(k+",")) {
			return k
		}
	}
	if encoding == EncodingCSV && bytes.HasPrefix(prefix, []byte("kind,")) {
		return "columns"
	}
	return ""
}

// leafOrder orders lines and gaps: time in milliseconds, then id.
func leafOrder(ms1 int64, id1 string, ms2 int64, id2 string) int {
	if ms1 != ms2 {
		if ms1 < ms2 {
			return -1
		}
		return 1
	}
	return strings.Compare(id1, id2)
}
