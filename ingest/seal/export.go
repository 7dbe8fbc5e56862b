package seal

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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
)

// ExportFormat names the format of a compliance export — a selection of one
// organization's trail, as NDJSON or CSV, that proves itself offline with the audit
// key's public half — and is the label of its manifest's signature. The package doc
// covers seals; this covers exports (README, "Compliance export").
//
// # What an export holds
//
// An export is pinned to a watermark W, the through of a seal that verifies with the
// audit key (by default the latest one of the trail, see below), and to S, the
// earliest sealed_at of such a seal: every row ingested before W was sealed by a seal
// made at or before S. It holds the rows of the selection (organization, [from, to)
// at millisecond precision, types, actors, rooms) that were ingested before W and that
// a seal made at or before S covers: only what is sealed. Rows are read without FINAL:
// of the copies of one row key (org, time, id) ingested before W, the one with the
// smallest time_ms (then the newest, then a hash of its content: a fixed choice) is the
// row, so a copy stored again later (a retried insert) changes nothing as of W. Lines
// are in the order (time, time_ms, id).
//
// W is the trail's watermark, not the organization's head: the sealer's seal that
// claims through T is written once every organization of its chunk is sealed (package
// doc, "What a run seals"), so every organization's rows ingested before T are sealed,
// while an organization's own head may claim less (its seal is not the last of the
// chunk) and would hold back its newest sealed rows.
//
// # Records
//
// Every record names its kind. NDJSON: one JSON object a line. CSV: a row of column
// names first (ExportColumns), then event rows with those columns, and every other
// record as two fields, its kind and its JSON object (the same object as in NDJSON).
//
//   - header: format, encoding, the selection, as_of (W) and the audit key's id;
//   - event: every column SealDigest covers, exactly: id, type, time (RFC 3339 with
//     milliseconds), org_id, room_id, actor_id, actor_type (as stored), actor_handle,
//     owner_id, subject_id, subject_type, subject_handle, execution_id, source,
//     schema_version, data (the stored string). A value that is not valid UTF-8, or
//     (CSV only) holds a carriage return, which CSV readers fold, is written in
//     standard base64 and named in base64 (a list in NDJSON, space-separated in CSV);
//   - seal: a seal that covers an exported event, whole (its signed fields, hash and
//     signature), followed by all its entries in Root's order, each an entry record:
//     id, time (ms), digest and mark: "exported" (the event is a line of the export),
//     "other" (not selected, or outside the range), "missing" (sealed inside the range
//     but its row is gone from the trail: the export cannot tell whether it was
//     selected) or "expired" (gone under a retention cut signed with the audit key,
//     see the package doc, "Retention"). A seal is included when one of its entries
//     is exported, missing or expired, or when the entries stored under it do not
//     add up to its count (entries deleted in ClickHouse would otherwise take their
//     rows out of the export unseen);
//   - manifest: the selection and W again, the numbers of events, seals and entries,
//     the SHA-256 of the proof records (each seal and entry object, length-prefixed,
//     in order: the same bytes in NDJSON and CSV), the key id, and an Ed25519
//     signature with the audit key over ManifestContent (label bandplane.export.v1,
//     apart from the seals' and the cuts' labels);
//   - error: the server stopped (the file is incomplete; `--resume` continues it).
//
// # Why boolean marks, not line numbers
//
// A flat root forces a seal's proof to be all its entries, so the proof is grouped by
// seal while the lines are in time order: any check joins them by row key. Line
// numbers in the marks would make the server rank every entry against the ordered
// selection (memory in the number of lines, and on resume the lines it does not send),
// and the verifier would still have to match by key, since a dropped line shifts every
// line after it. So a mark says only whether the entry is a line; the verifier joins
// lines and exported marks by (id, time in seconds) — the row key — and computes the
// line a dropped event belonged at. The marks cannot be flipped: the manifest signs
// their hash. The trailer does not depend on the lines before a resume cursor, so a
// resumed export ends exactly like an uninterrupted one.
//
// # What the verifier detects
//
// VerifyExport (no database) checks the header against the manifest, the manifest's
// signature, counts and proof hash, every seal's signature, hash, entries, root and
// first/last times, the links between included seals of consecutive seq, that every
// line is canonical, in order, in the selection, and matches by digest an entry marked
// exported (else "changed", or "added" when no seal marks it), and that every exported
// mark has its line ("dropped", named with the line it belonged at). It reports
// missing marks (a sealed row deleted in the trail) and seals whose entries are not
// all there as problems too. Every bound of a record is checked before it is held:
// a line of more than MaxExportLineBytes is refused, at most ExportVerifyOptions'
// ChunkLines lines are held at once (a larger file is joined in stretches of row
// keys, reading it again), and at most MaxExportProblems problems are listed.
//
// What it cannot detect: whatever the holder of the audit key signs (the server that
// exports vouches for the marks, i.e. which sealed events match the selection — the
// same key signs the seals, so its custody is the root of trust either way); a sealed
// row edited in ClickHouse so that it no longer matches the selection (marked "other":
// `bandplane audit verify` against the database finds it); a row that landed after
// the seal run that should have sealed it (a slow insert, sealed by a later run: not
// in the export as of W, in an export as of a later W); seals removed together with
// their rows before the export (as for verify, compare the chain head with the topic).
const ExportFormat = "bandplane.export.v1"

// Encodings of an export.
const (
	EncodingNDJSON = "ndjson"
	EncodingCSV    = "csv"
)

// Record kinds.
const (
	KindHeader   = "header"
	KindEvent    = "event"
	KindSeal     = "seal"
	KindEntry    = "entry"
	KindManifest = "manifest"
	KindError    = "error"
)

// Marks of an entry.
const (
	MarkExported = "exported"
	MarkOther    = "other"
	MarkMissing  = "missing"
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
	// MaxSealEntries bounds the entries of one seal an export carries (the sealer
	// makes at most DefaultMaxEntries).
	MaxSealEntries = 1_000_000
	// maxCursorBytes bounds an after cursor.
	maxCursorBytes = 2048
)

// ExportColumns are the CSV export's columns: every record kind is in the first one;
// event rows fill them all, other records hold their JSON object in the second.
var ExportColumns = []string{"kind", "id", "type", "time", "org_id", "room_id", "actor_id", "actor_type", "actor_handle",
	"owner_id", "subject_id", "subject_type", "subject_handle", "execution_id", "source", "schema_version", "data", "base64"}

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
	Encoding  string    // EncodingNDJSON or EncodingCSV
	AsOf      time.Time // zero: the latest watermark
	After     *Cursor   // resume after this event (AsOf is then required)
}

// exportParams are the query parameters of the export, the lists repeatable.
var exportParams = map[string]bool{"org": false, "from": false, "to": false, "types": true, "actors": true, "rooms": true,
	"format": false, "as_of": false, "after": false}

// ParseExportRequest reads the query parameters of an export. The organization may be
// missing (an organization's key exports its own); everything else is checked, every
// problem named by parameter. Lists are comma-separated, repeated, or both.
func ParseExportRequest(q url.Values) (ExportRequest, error) {
	var errs []error
	var req ExportRequest
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range q {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range names {
		list, known := exportParams[k]
		if !known {
			shown := k
			if len(shown) > 64 || !utf8.ValidString(shown) {
				shown = fmt.Sprintf("of %d bytes", len(k))
			} else {
				shown = strconv.Quote(shown)
			}
			errs = append(errs, fmt.Errorf("unknown parameter %s (known: as_of, actors, after, format, from, org, rooms, to, types)", shown))
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
	for _, l := range []struct {
		name string
		dst  *[]string
	}{{"types", &req.Selection.Types}, {"actors", &req.Selection.Actors}, {"rooms", &req.Selection.Rooms}} {
		var vals []string
		sent := 0
		for _, raw := range q[l.name] {
			for v := range strings.SplitSeq(raw, ",") {
				if sent++; sent <= MaxSelectionValues {
					vals = append(vals, v)
				}
			}
		}
		if sent > MaxSelectionValues {
			errs = append(errs, fmt.Errorf("%s: %d values; at most %d", l.name, sent, MaxSelectionValues))
		}
		*l.dst = vals
	}
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
	if v := one("as_of"); v != "" {
		if req.AsOf, err = time.Parse(time.RFC3339, v); err != nil || req.AsOf.Nanosecond() != 0 {
			errs = append(errs, fmt.Errorf("as_of: want the as_of of an export's header (RFC 3339, whole seconds), got %q", clip(v)))
		}
		req.AsOf = req.AsOf.UTC()
	}
	if v := one("after"); v != "" {
		c, err := DecodeCursor(v)
		if err != nil {
			errs = append(errs, err)
		} else {
			req.After = &c
		}
		if _, ok := q["as_of"]; !ok {
			errs = append(errs, errors.New("after: needs as_of, the as_of of the export it continues"))
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
	if !r.AsOf.IsZero() {
		q.Set("as_of", r.AsOf.UTC().Format(time.RFC3339))
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

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

const milliLayout = "2006-01-02T15:04:05.000Z07:00"

func fmtMilli(t time.Time) string { return t.UTC().Format(milliLayout) }
func fmtSec(t time.Time) string   { return t.UTC().Format(time.RFC3339) }

func parseMilli(s string) (time.Time, bool) {
	t, err := time.Parse(milliLayout, s)
	if err != nil || fmtMilli(t) != s {
		return time.Time{}, false
	}
	return t.UTC(), true
}

func parseSec(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil || fmtSec(t) != s {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// ExportHeader is the first record of an export.
type ExportHeader struct {
	Kind     string   `json:"kind"`
	Format   string   `json:"format"`
	Encoding string   `json:"encoding"`
	Org      string   `json:"org"`
	From     string   `json:"from"`
	To       string   `json:"to"`
	Types    []string `json:"types"`
	Actors   []string `json:"actors"`
	Rooms    []string `json:"rooms"`
	AsOf     string   `json:"as_of"`
	KeyID    string   `json:"key_id"`
}

func newHeader(s Selection, encoding string, asOf time.Time, keyID string) ExportHeader {
	return ExportHeader{Kind: KindHeader, Format: ExportFormat, Encoding: encoding, Org: s.Org, From: fmtMilli(s.From), To: fmtMilli(s.To),
		Types: s.Types, Actors: s.Actors, Rooms: s.Rooms, AsOf: fmtSec(asOf), KeyID: keyID}
}

// Request is the request that continues the export of this header after cursor c.
func (h *ExportHeader) Request(c *Cursor) (ExportRequest, error) {
	s, asOf, err := h.selection()
	if err != nil {
		return ExportRequest{}, err
	}
	return ExportRequest{Selection: s, Encoding: h.Encoding, AsOf: asOf, After: c}, nil
}

// selection reads the header's selection and watermark back, refusing anything an
// export server would not have written.
func (h *ExportHeader) selection() (Selection, time.Time, error) {
	if h.Kind != KindHeader || h.Format != ExportFormat {
		return Selection{}, time.Time{}, fmt.Errorf("not a %s header (kind %q, format %q)", ExportFormat, clip(h.Kind), clip(h.Format))
	}
	if h.Encoding != EncodingNDJSON && h.Encoding != EncodingCSV {
		return Selection{}, time.Time{}, fmt.Errorf("unknown encoding %q", clip(h.Encoding))
	}
	from, ok1 := parseMilli(h.From)
	to, ok2 := parseMilli(h.To)
	asOf, ok3 := parseSec(h.AsOf)
	if !ok1 || !ok2 || !ok3 {
		return Selection{}, time.Time{}, fmt.Errorf("from %q, to %q or as_of %q is not in the export's time format", clip(h.From), clip(h.To), clip(h.AsOf))
	}
	s := Selection{Org: h.Org, From: from, To: to, Types: h.Types, Actors: h.Actors, Rooms: h.Rooms}
	s.Normalize()
	if !slices.Equal(s.Types, nonNil(h.Types)) || !slices.Equal(s.Actors, nonNil(h.Actors)) || !slices.Equal(s.Rooms, nonNil(h.Rooms)) {
		return Selection{}, time.Time{}, errors.New("the selection's lists are not sorted and distinct")
	}
	if err := s.Validate(); err != nil {
		return Selection{}, time.Time{}, err
	}
	return s, asOf, nil
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

// binding is what a cursor is bound to: the selection, the watermark and the encoding.
func binding(s Selection, encoding string, asOf time.Time) [8]byte {
	h := sha256.New()
	store.WriteField(h, "bandplane.export-cursor.v1")
	store.WriteField(h, encoding)
	h.Write(selectionBytes(nil, s, asOf))
	var out [8]byte
	copy(out[:], h.Sum(nil))
	return out
}

// selectionBytes appends the selection and watermark, length-prefixed (the manifest's
// signed content and the cursor's binding).
func selectionBytes(b []byte, s Selection, asOf time.Time) []byte {
	b = appendString(b, s.Org)
	b = binary.BigEndian.AppendUint64(b, uint64(s.From.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(s.To.UnixMilli()))
	for _, l := range [][]string{s.Types, s.Actors, s.Rooms} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(l)))
		for _, v := range l {
			b = appendString(b, v)
		}
	}
	return binary.BigEndian.AppendUint64(b, uint64(asOf.Unix()))
}

// Cursor is where a resumed export continues: after the event at Time with ID, the
// Events-th line of the export (Events 0: after the header).
type Cursor struct {
	Bind   [8]byte
	Events uint64
	Time   time.Time // millisecond precision
	ID     string
}

// NewCursor is the cursor after the events-th event line (id at t) of the export with
// header h.
func NewCursor(h *ExportHeader, events uint64, t time.Time, id string) (Cursor, error) {
	s, asOf, err := h.selection()
	if err != nil {
		return Cursor{}, err
	}
	c := Cursor{Bind: binding(s, h.Encoding, asOf), Events: events}
	if events > 0 {
		c.Time, c.ID = t.UTC().Truncate(time.Millisecond), id
	}
	return c, nil
}

// String encodes the cursor: base64url of "x1:<binding hex>:<events>:<unix ms>:<id>".
func (c Cursor) String() string {
	ms := int64(0)
	if !c.Time.IsZero() {
		ms = c.Time.UnixMilli()
	}
	return base64.RawURLEncoding.EncodeToString([]byte("x1:" + hex.EncodeToString(c.Bind[:]) + ":" +
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
	if len(parts) != 5 || parts[0] != "x1" {
		return Cursor{}, bad
	}
	var c Cursor
	if b, err := hex.DecodeString(parts[1]); err != nil || len(b) != len(c.Bind) {
		return Cursor{}, bad
	} else {
		copy(c.Bind[:], b)
	}
	if c.Events, err = strconv.ParseUint(parts[2], 10, 64); err != nil {
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
	case c.Events > 0:
		if err := checkExportID("after", c.ID); err != nil {
			return Cursor{}, fmt.Errorf("after: the cursor's event id: %w", err)
		}
	}
	return c, nil
}

// exportEvent is an event record. Field order is the encoding (NDJSON is checked to be
// canonical: re-encoded, a line must give itself back).
type exportEvent struct {
	Kind          string   `json:"kind"`
	ID            string   `json:"id"`
	Type          string   `json:"type"`
	Time          string   `json:"time"`
	OrgID         string   `json:"org_id"`
	RoomID        string   `json:"room_id"`
	ActorID       string   `json:"actor_id"`
	ActorType     string   `json:"actor_type"`
	ActorHandle   string   `json:"actor_handle"`
	OwnerID       string   `json:"owner_id"`
	SubjectID     string   `json:"subject_id"`
	SubjectType   string   `json:"subject_type"`
	SubjectHandle string   `json:"subject_handle"`
	ExecutionID   string   `json:"execution_id"`
	Source        string   `json:"source"`
	SchemaVersion uint16   `json:"schema_version"`
	Data          string   `json:"data"`
	Base64        []string `json:"base64,omitempty"`
}

// fields are the event's string fields with their column names, in column order.
func (e *exportEvent) fields() []struct {
	name string
	v    *string
} {
	return []struct {
		name string
		v    *string
	}{{"id", &e.ID}, {"type", &e.Type}, {"org_id", &e.OrgID}, {"room_id", &e.RoomID}, {"actor_id", &e.ActorID},
		{"actor_type", &e.ActorType}, {"actor_handle", &e.ActorHandle}, {"owner_id", &e.OwnerID}, {"subject_id", &e.SubjectID},
		{"subject_type", &e.SubjectType}, {"subject_handle", &e.SubjectHandle}, {"execution_id", &e.ExecutionID},
		{"source", &e.Source}, {"data", &e.Data}}
}

// eventRecord encodes a row, base64 for the values the encoding cannot carry exactly.
func eventRecord(r *store.EventRow, encoding string) exportEvent {
	e := exportEvent{Kind: KindEvent, ID: r.ID, Type: r.Type, Time: fmtMilli(r.Time), OrgID: r.OrgID, RoomID: r.RoomID,
		ActorID: r.ActorID, ActorType: store.StoredActorType(r.ActorType), ActorHandle: r.ActorHandle, OwnerID: r.OwnerID,
		SubjectID: r.SubjectID, SubjectType: r.SubjectType, SubjectHandle: r.SubjectHandle, ExecutionID: r.ExecutionID,
		Source: r.Source, SchemaVersion: r.SchemaVersion, Data: r.Data}
	for _, f := range e.fields() {
		if !utf8.ValidString(*f.v) || encoding == EncodingCSV && strings.ContainsRune(*f.v, '\r') {
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
	decoded := map[string]bool{}
	for _, name := range e.Base64 {
		decoded[name] = true
	}
	if len(decoded) != len(e.Base64) {
		return store.EventRow{}, errors.New("base64 names a field twice")
	}
	for _, f := range e.fields() {
		if !decoded[f.name] {
			continue
		}
		delete(decoded, f.name)
		b, err := base64.StdEncoding.DecodeString(*f.v)
		if err != nil {
			return store.EventRow{}, fmt.Errorf("field %s is not base64, though base64 names it", f.name)
		}
		*f.v = string(b)
	}
	if len(decoded) > 0 {
		return store.EventRow{}, fmt.Errorf("base64 names unknown fields %q", slices.Sorted(func(yield func(string) bool) {
			for k := range decoded {
				if !yield(k) {
					return
				}
			}
		}))
	}
	t, ok := parseMilli(e.Time)
	if !ok {
		return store.EventRow{}, fmt.Errorf("time %q is not RFC 3339 with milliseconds in UTC", clip(e.Time))
	}
	if e.ID == "" {
		return store.EventRow{}, errors.New("no id")
	}
	return store.EventRow{ID: e.ID, Type: e.Type, Time: t, OrgID: e.OrgID, RoomID: e.RoomID, ActorID: e.ActorID,
		ActorType: e.ActorType, ActorHandle: e.ActorHandle, OwnerID: e.OwnerID, SubjectID: e.SubjectID,
		SubjectType: e.SubjectType, SubjectHandle: e.SubjectHandle, ExecutionID: e.ExecutionID, Source: e.Source,
		SchemaVersion: e.SchemaVersion, Data: e.Data}, nil
}

// csvFields is the event's CSV row.
func (e *exportEvent) csvFields() []string {
	return []string{KindEvent, e.ID, e.Type, e.Time, e.OrgID, e.RoomID, e.ActorID, e.ActorType, e.ActorHandle, e.OwnerID,
		e.SubjectID, e.SubjectType, e.SubjectHandle, e.ExecutionID, e.Source, strconv.FormatUint(uint64(e.SchemaVersion), 10),
		e.Data, strings.Join(e.Base64, " ")}
}

func eventFromCSV(f []string) (exportEvent, error) {
	if len(f) != len(ExportColumns) {
		return exportEvent{}, fmt.Errorf("an event row has %d fields, want %d", len(f), len(ExportColumns))
	}
	v, err := strconv.ParseUint(f[15], 10, 16)
	if err != nil || strconv.FormatUint(v, 10) != f[15] {
		return exportEvent{}, fmt.Errorf("schema_version %q is not a number up to 65535", clip(f[15]))
	}
	e := exportEvent{Kind: f[0], ID: f[1], Type: f[2], Time: f[3], OrgID: f[4], RoomID: f[5], ActorID: f[6], ActorType: f[7],
		ActorHandle: f[8], OwnerID: f[9], SubjectID: f[10], SubjectType: f[11], SubjectHandle: f[12], ExecutionID: f[13],
		Source: f[14], SchemaVersion: uint16(v), Data: f[16]}
	if f[17] != "" {
		e.Base64 = strings.Split(f[17], " ")
	}
	return e, nil
}

// exportSeal is a seal record.
type exportSeal struct {
	Kind      string `json:"kind"`
	OrgID     string `json:"org_id"`
	Seq       uint64 `json:"seq"`
	SealedAt  string `json:"sealed_at"`
	Through   string `json:"through"`
	Events    uint64 `json:"events"`
	FirstTime string `json:"first_time"`
	LastTime  string `json:"last_time"`
	Root      string `json:"root"`
	Prev      string `json:"prev"`
	Hash      string `json:"hash"`
	KeyID     string `json:"key_id"`
	Signature string `json:"signature"`
}

func sealRecord(s *Seal) exportSeal {
	return exportSeal{Kind: KindSeal, OrgID: s.OrgID, Seq: s.Seq, SealedAt: fmtSec(s.SealedAt), Through: fmtSec(s.Through),
		Events: s.Events, FirstTime: fmtSec(s.FirstTime), LastTime: fmtSec(s.LastTime), Root: s.Root, Prev: s.Prev,
		Hash: s.Hash, KeyID: s.KeyID, Signature: s.Signature}
}

func (r *exportSeal) seal() (Seal, error) {
	var ts [4]time.Time
	for i, v := range []string{r.SealedAt, r.Through, r.FirstTime, r.LastTime} {
		t, ok := parseSec(v)
		if !ok {
			return Seal{}, fmt.Errorf("time %q is not RFC 3339 in whole seconds, UTC", clip(v))
		}
		ts[i] = t
	}
	return Seal{OrgID: r.OrgID, Seq: r.Seq, SealedAt: ts[0], Through: ts[1], Events: r.Events, FirstTime: ts[2], LastTime: ts[3],
		Root: r.Root, Prev: r.Prev, Hash: r.Hash, KeyID: r.KeyID, Signature: r.Signature}, nil
}

// exportEntry is an entry record. Digest is kept as stored (a corrupt one is the
// verifier's to report).
type exportEntry struct {
	Kind   string `json:"kind"`
	ID     string `json:"id"`
	Time   string `json:"time"`
	Digest string `json:"digest"`
	Mark   string `json:"mark"`
}

// exportManifest is the last record.
type exportManifest struct {
	Kind        string   `json:"kind"`
	Format      string   `json:"format"`
	Org         string   `json:"org"`
	From        string   `json:"from"`
	To          string   `json:"to"`
	Types       []string `json:"types"`
	Actors      []string `json:"actors"`
	Rooms       []string `json:"rooms"`
	AsOf        string   `json:"as_of"`
	Events      uint64   `json:"events"`
	Seals       uint64   `json:"seals"`
	Entries     uint64   `json:"entries"`
	ProofSHA256 string   `json:"proof_sha256"`
	KeyID       string   `json:"key_id"`
	Signature   string   `json:"signature"`
}

// ManifestContent is what the manifest's signature covers: under the label
// bandplane.export.v1, the selection (organization, from and to in Unix milliseconds,
// each list counted and length-prefixed), as_of (Unix seconds), the numbers of
// events, seals and entries, the proof hash and the key id. Part of the export format.
func ManifestContent(s Selection, asOf time.Time, events, seals, entries uint64, proofSHA256, keyID string) []byte {
	b := make([]byte, 0, 256)
	b = appendString(b, ExportFormat)
	b = selectionBytes(b, s, asOf)
	b = binary.BigEndian.AppendUint64(b, events)
	b = binary.BigEndian.AppendUint64(b, seals)
	b = binary.BigEndian.AppendUint64(b, entries)
	b = appendString(b, proofSHA256)
	return appendString(b, keyID)
}

func signManifest(key ed25519.PrivateKey, s Selection, asOf time.Time, events, seals, entries uint64, proof string) exportManifest {
	id := KeyID(key.Public().(ed25519.PublicKey))
	sig := ed25519.Sign(key, ManifestContent(s, asOf, events, seals, entries, proof, id))
	return exportManifest{Kind: KindManifest, Format: ExportFormat, Org: s.Org, From: fmtMilli(s.From), To: fmtMilli(s.To),
		Types: s.Types, Actors: s.Actors, Rooms: s.Rooms, AsOf: fmtSec(asOf), Events: events, Seals: seals, Entries: entries,
		ProofSHA256: proof, KeyID: id, Signature: hex.EncodeToString(sig)}
}

// exportError is an error record: the server stopped before the end.
type exportError struct {
	Kind  string `json:"kind"`
	Error string `json:"error"`
}

// encoder writes records in one encoding. Records are JSON objects encoded
// deterministically (no HTML escaping): the proof hash is over those bytes.
type encoder struct {
	encoding string
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

// record returns the bytes of one record whose JSON object is obj, newline included.
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

// event returns the bytes of an event record.
func (e *encoder) event(ev *exportEvent) ([]byte, error) {
	if e.encoding == EncodingNDJSON {
		obj, err := e.object(ev)
		if err != nil {
			return nil, err
		}
		return append(obj, '\n'), nil
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

// proofHash hashes the proof records: each object length-prefixed.
type proofHash struct {
	h interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
	}
}

func newProofHash() *proofHash {
	p := &proofHash{h: sha256.New()}
	var lbl [4]byte
	binary.BigEndian.PutUint32(lbl[:], uint32(len("bandplane.export-proof.v1")))
	p.h.Write(lbl[:])
	p.h.Write([]byte("bandplane.export-proof.v1"))
	return p
}

func (p *proofHash) add(obj []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(obj)))
	p.h.Write(n[:])
	p.h.Write(obj)
}

func (p *proofHash) sum() string { return hex.EncodeToString(p.h.Sum(nil)) }

// recordKind is the kind of a record from its first bytes (what a scanner of a file
// being written or resumed needs), "" when it is none of the kinds.
func recordKind(encoding string, prefix []byte) string {
	for _, k := range []string{KindEvent, KindEntry, KindSeal, KindHeader, KindManifest, KindError} {
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
