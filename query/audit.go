package query

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
)

// Audit page sizes.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 10000
)

// Outcomes of a policy decision an AuditQuery or a DecisionQuery can keep.
const (
	outcomeAllowed = "allowed"
	outcomeDenied  = "denied"
)

// asOfSettle is how far behind the clock the watermark of a first page is. Ingest stamps
// ingested_at just before it sends a batch, so a row stamped in the last moments may
// still be on its way when the first page is read; a later page that included it would
// show a row the first page could not. A batch that takes longer than this to land can
// still appear on a later page (it belongs to the snapshot, page one just missed it).
const asOfSettle = 2 * time.Second

// AuditQuery asks for the audit trail of one organization, newest first. Zero values
// mean "any"; the range is [From, To) at millisecond precision.
//
// A first page (empty Before) is read as of a watermark: the rows ingested up to a
// couple of seconds ago (ingested_at, second precision). Its NextCursor carries the
// watermark, and every later page applies it again, so paging stays stable while events
// keep arriving, including late events whose times fall on pages already read or still
// to come: they show up in a query started afresh, never in the middle of a listing.
type AuditQuery struct {
	OrgID     string
	From, To  time.Time
	RoomID    string
	ActorID   string
	SubjectID string
	Types     []string // event types, e.g. "message.posted"; empty: all
	// Outcome keeps only policy.decided events whose data says allow: true ("allowed")
	// or false ("denied"); "" keeps every event. With Types, both apply.
	Outcome string
	Limit   int    // 0: DefaultAuditLimit
	Before  string // cursor from a previous page's NextCursor; empty: the newest
}

// Validate reports every problem of the query at once, each naming its field.
func (q AuditQuery) Validate() error {
	var errs []error
	errs = checkOrg(errs, q.OrgID)
	errs = checkRange(errs, q.From, q.To)
	if len(q.Types) > MaxAuditTypes {
		errs = append(errs, fieldErr("types", "%d types; at most %d", len(q.Types), MaxAuditTypes))
	}
	for i, t := range q.Types {
		if t == "" || len(t) > 128 {
			errs = append(errs, fieldErr("types", "entry %d must be 1 to 128 bytes, got %d", i, len(t)))
		}
	}
	errs = checkID(errs, "room_id", q.RoomID)
	errs = checkID(errs, "actor_id", q.ActorID)
	errs = checkID(errs, "subject_id", q.SubjectID)
	errs = checkOutcome(errs, q.Outcome)
	errs = checkLimit(errs, q.Limit, MaxAuditLimit)
	errs = checkCursor(errs, q.Before)
	return errors.Join(errs...)
}

// The checks the queries of this package share, each appending its problem to errs.

// MaxAuditTypes bounds the types of one audit search.
const MaxAuditTypes = 64

// checkID refuses an id filter longer than any stored id (schema.MaxIDBytes).
func checkID(errs []error, field, id string) []error {
	if len(id) > 256 {
		errs = append(errs, fieldErr(field, "longer than 256 bytes (%d), so it matches nothing", len(id)))
	}
	return errs
}

func checkOrg(errs []error, org string) []error {
	if org == "" {
		errs = append(errs, fieldErr("org_id", "required"))
	}
	return errs
}

func checkRange(errs []error, from, to time.Time) []error {
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		errs = append(errs, fieldErr("to", "must be after from (from %s, to %s)", from.UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano)))
	}
	return errs
}

func checkLimit(errs []error, limit, maxLimit int) []error {
	if limit < 0 || limit > maxLimit {
		errs = append(errs, fieldErr("limit", "must be between 1 and %d, got %d", maxLimit, limit))
	}
	return errs
}

func checkOutcome(errs []error, outcome string) []error {
	switch outcome {
	case "", outcomeAllowed, outcomeDenied:
		return errs
	}
	return append(errs, fieldErr("outcome", "unknown outcome %q (want allowed, denied or nothing)", outcome))
}

func checkCursor(errs []error, before string) []error {
	if before != "" {
		if _, err := decodeCursor(before); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Event is one audit-trail row: the event envelope, its payload as the JSON string it
// was stored as, and where ingest read it from.
type Event struct {
	ID, Type                                 string
	Time                                     time.Time // UTC, millisecond precision
	OrgID, RoomID                            string
	ActorID, ActorType, ActorHandle, OwnerID string
	SubjectID, SubjectType, SubjectHandle    string
	ExecutionID, Source                      string
	SchemaVersion                            uint16
	Data                                     string // JSON
	IngestedAt                               time.Time
	KafkaPartition                           int32
	KafkaOffset                              int64
}

// AuditPage is one page of events; NextCursor is empty on the last page.
type AuditPage struct {
	Events     []Event
	NextCursor string
}

// cursor is the sort key (time, time_ms, id) of the last event of a page, and the
// watermark of the listing (asOf, Unix seconds of ingested_at). The table is ordered by
// the key, so the next page is every row strictly below it: keyset pagination stays
// correct while new events arrive, unlike OFFSET; the watermark keeps out the rows
// ingested since the first page, whatever their time.
type cursor struct {
	asOf int64
	sec  int64
	ms   uint16
	id   string
}

func cursorOf(e Event) cursor {
	return cursor{sec: e.Time.Unix(), ms: uint16(e.Time.Nanosecond() / 1e6), id: e.ID}
}

// The encoding is opaque to clients: "v2:<as-of s>:<time ms>:<id>" in base64 (the id,
// which may hold colons, last). v1 (no watermark) is refused with its own message.
func (c cursor) String() string {
	ms := c.sec*1000 + int64(c.ms)
	return base64.RawURLEncoding.EncodeToString([]byte("v2:" + strconv.FormatInt(c.asOf, 10) + ":" + strconv.FormatInt(ms, 10) + ":" + c.id))
}

func decodeCursor(s string) (cursor, error) {
	bad := fieldErr("before", "malformed cursor %q (pass a nextCursor unchanged)", s)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, bad
	}
	if strings.HasPrefix(string(raw), "v1:") {
		return cursor{}, fieldErr("before", "cursor %q is from an older version of bandplane (v1); start again from the first page", s)
	}
	parts := strings.SplitN(string(raw), ":", 4)
	if len(parts) != 4 || parts[0] != "v2" || parts[3] == "" {
		return cursor{}, bad
	}
	asOf, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || asOf < 0 {
		return cursor{}, bad
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || ms < 0 {
		return cursor{}, bad
	}
	return cursor{asOf: asOf, sec: ms / 1000, ms: uint16(ms % 1000), id: parts[3]}, nil
}

func msOf(t time.Time) uint16 { return uint16(t.Nanosecond() / 1e6) }

// addRange adds [from, to) at millisecond precision (a zero bound is open). Each bound
// is a plain condition on time, which the primary key can use, plus the exact
// comparison on (time, time_ms).
func addRange(w *where, from, to time.Time) {
	if !from.IsZero() {
		sec := from.UTC().Truncate(time.Second)
		w.add("time >= ?", sec)
		w.add("(time > ? OR time_ms >= ?)", sec, msOf(from))
	}
	if !to.IsZero() {
		sec := to.UTC().Truncate(time.Second)
		w.add("time <= ?", sec)
		w.add("(time < ? OR time_ms < ?)", sec, msOf(to))
	}
}

const auditCols = "id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle," +
	" owner_id, subject_id, subject_type, subject_handle, execution_id, source, schema_version, data," +
	" ingested_at, kafka_partition, kafka_offset"

// newestFirst sorts by the table's key, newest first, and keeps one row per event: a
// replayed event is a second row with the same key until a merge collapses it.
const newestFirst = " ORDER BY time DESC, time_ms DESC, id DESC LIMIT 1 BY (time, time_ms, id)"

// auditSQL builds the SELECT of a validated AuditQuery.
//
// It reads without FINAL: FINAL merges every row in range, however small the page,
// while sorting the rows in range by key and collapsing replays with LIMIT 1 BY gives
// the same page. That sort would still read every column of every row in range, so a
// subquery picks the page's keys reading only the key columns (and those the filters
// need), and the outer query reads the other columns of those rows only. Measured on
// 18.16 (10M events over 30 days, 3 organizations, 40 parts, 2 cores shared with other
// work; the newest 101 of one organization's 3.3M): FINAL 4.1–4.4 s; one query with
// LIMIT 1 BY over every column 0.8–2.5 s; this query 0.18–0.20 s over 30 days, 35–57 ms
// over a day, 0.4–0.55 s for denied send_message decisions (visitParam reads data).
// LIMIT 1 BY (time, time_ms, id) works on 18.16 and current releases (26.9), like
// LIMIT 1 BY time, time_ms, id, and costs the same. Even so the cost grows with the
// rows in range, so auditPage runs this query window by window, newest first (win):
// the same query with one more range.
type auditSQL struct {
	db string
	q  AuditQuery // validated, or built by this package (Limit may then pass MaxAuditLimit)
	// decision keeps policy decisions of one name only (DecisionQuery.Decision).
	decision string
	// asOf is the watermark: rows ingested at or before it; zero reads every row.
	asOf time.Time
	// win restricts the query to one window of a walk-back (auditPage), on top of the
	// query's own range and cursor; the zero span adds nothing.
	win span
	// rows is how many rows the query reads; 0: the page and one more.
	rows int
	// whole reads the page in one query, without walking back (tests compare the two).
	whole bool
}

func (s auditSQL) limit() int {
	if s.q.Limit == 0 {
		return DefaultAuditLimit
	}
	return s.q.Limit
}

// take is the LIMIT of the query: by default the page and one row more, which tells
// whether another page follows.
func (s auditSQL) take() int {
	if s.rows > 0 {
		return s.rows
	}
	return s.limit() + 1
}

// span is [from, to) at millisecond precision; a zero bound is open.
type span struct{ from, to time.Time }

// walkBack are the widths of the windows a newest-first page reads, each ending at the
// page's upper bound (upper): the newest hour first, then the day, then the week, then
// the rest of the range. The cost of a query grows with the rows in its range, not
// with the page (design.md, "Reading at scale on 18.16"): on a busy organization the
// page fills within the newest windows, and a page that does not fill them reads the
// same rows as one query would, in a few more queries. Measured on the 10M events
// above, 100 message.created of the busiest room: one query 0.38–0.51 s, walked back
// (the hour and the day) 55–80 ms; of a room with 350 messages in 30 days (all four
// windows) 0.49 s in one query, 0.53 s walked back.
var walkBack = []time.Duration{time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}

// unixEpoch is the oldest time a DateTime holds: a window cannot start before it.
var unixEpoch = time.Unix(0, 0).UTC()

// walkBackSpans returns the windows of a page whose rows are below upper (or, for the
// first window, anywhere above it) and at or after from (zero: open), newest first.
// Each window starts where walkBack says and ends where the previous one starts (half
// open, at the same millisecond, so that no row falls in two windows or in none). The
// first is open above: it also holds rows timed after upper (a clock ahead of ours).
// The last is open below: it runs down to the query's own From, or without bound. A
// window that would start at or before from (or before 1970) is the last one.
func walkBackSpans(upper, from time.Time) []span {
	upper = upper.UTC().Truncate(time.Millisecond)
	floor := from
	if floor.IsZero() || floor.Before(unixEpoch) {
		floor = unixEpoch
	}
	var out []span
	var prev time.Time
	for _, d := range walkBack {
		start := upper.Add(-d)
		if !start.After(floor) {
			break
		}
		out = append(out, span{from: start, to: prev})
		prev = start
	}
	return append(out, span{to: prev})
}

// upper is where the walk-back of s starts: the earliest of now, To and the cursor's
// position. Any upper gives the same rows (the windows cover the range whatever it
// is); the nearer it is to the page's newest row, the fewer rows the first window reads.
func (s auditSQL) upper(now time.Time) time.Time {
	u := now
	if !s.q.To.IsZero() && s.q.To.Before(u) {
		u = s.q.To
	}
	if s.q.Before != "" {
		c, _ := decodeCursor(s.q.Before) // validated
		if at := time.Unix(c.sec, int64(c.ms)*1e6).UTC(); at.Before(u) {
			u = at
		}
	}
	return u
}

// spans are the windows auditPage reads, one after the other, newest first.
func (s auditSQL) spans(now time.Time) []span {
	if s.whole {
		return []span{{}}
	}
	return walkBackSpans(s.upper(now), s.q.From)
}

func (s auditSQL) where() *where {
	q := s.q
	w := &where{}
	w.add("org_id = ?", q.OrgID)
	addRange(w, q.From, q.To)
	addRange(w, s.win.from, s.win.to)
	if !s.asOf.IsZero() {
		w.add("ingested_at <= ?", s.asOf.UTC().Truncate(time.Second))
	}
	if q.Before != "" {
		c, _ := decodeCursor(q.Before) // Validate checked it
		sec := time.Unix(c.sec, 0).UTC()
		w.add("time <= ?", sec)
		w.add("(time < ? OR time_ms < ? OR (time_ms = ? AND id < ?))", sec, c.ms, c.ms, c.id)
	}
	if q.RoomID != "" {
		w.add("room_id = ?", q.RoomID)
	}
	switch {
	case q.ActorID != "" && q.ActorID == q.SubjectID:
		// The same id as actor and subject: everything that party did or underwent.
		w.add("(actor_id = ? OR subject_id = ?)", q.ActorID, q.SubjectID)
	default:
		if q.ActorID != "" {
			w.add("actor_id = ?", q.ActorID)
		}
		if q.SubjectID != "" {
			w.add("subject_id = ?", q.SubjectID)
		}
	}
	if len(q.Types) > 0 {
		w.add("has(?, type)", q.Types)
	}
	if q.Outcome != "" || s.decision != "" {
		w.add("type = ?", schema.TypePolicyDecided)
	}
	// visitParam* read the first "allow" and "decision" keys of the JSON, at any depth:
	// policy/api writes its DecidedData compactly, "decision" and "allow" first, so
	// these are the top-level ones (TestDecidedDataLayout).
	switch q.Outcome {
	case outcomeAllowed:
		w.add("visitParamExtractBool(data, 'allow') = 1")
	case outcomeDenied:
		w.add("visitParamExtractBool(data, 'allow') = 0")
	}
	if s.decision != "" {
		w.add("visitParamExtractString(data, 'decision') = ?", s.decision)
	}
	return w
}

func (s auditSQL) toSQL() (string, []any) {
	w := s.where()
	from := " FROM " + s.db + ".events WHERE " + w.String()
	limit := fmt.Sprintf(" LIMIT %d", s.take())
	keys := "SELECT time, time_ms, id" + from + newestFirst + limit
	sql := "SELECT " + auditCols + from + " AND (time, time_ms, id) IN (" + keys + ")" + newestFirst + limit
	args := make([]any, 0, 2*len(w.args))
	return sql, append(append(args, w.args...), w.args...)
}

// AuditEvents returns one page of q.OrgID's audit trail, newest first.
func (qr *Querier) AuditEvents(ctx context.Context, q AuditQuery) (AuditPage, error) {
	if err := q.Validate(); err != nil {
		return AuditPage{}, err
	}
	return qr.auditPage(ctx, auditSQL{db: qr.db, q: q, asOf: asOfOf(q.Before, qr.now())})
}

// asOfOf is the watermark of a listing: the cursor's, or for a first page now less
// asOfSettle, in whole seconds like ingested_at.
func asOfOf(before string, now time.Time) time.Time {
	if before != "" {
		c, _ := decodeCursor(before) // validated
		return time.Unix(c.asOf, 0).UTC()
	}
	return now.Add(-asOfSettle).UTC().Truncate(time.Second)
}

// auditPage runs s (its query validated) and reads one page: the newest window first,
// then the next older one while the page and the row after it are not all read. The
// windows are disjoint ranges of (time, time_ms), newest first, and a replay has the
// key of the row it repeats, so the rows read are those of the single query, in its
// order, replays collapsed the same way.
func (qr *Querier) auditPage(ctx context.Context, s auditSQL) (AuditPage, error) {
	limit := s.limit()
	events := make([]Event, 0, min(limit+1, 1024))
	for _, win := range s.spans(qr.now()) {
		w := s
		w.win, w.rows = win, limit+1-len(events)
		var err error
		if events, err = qr.readAudit(ctx, w, events); err != nil {
			return AuditPage{}, err
		}
		if len(events) > limit {
			break
		}
	}
	page := AuditPage{Events: events}
	if len(events) > limit {
		page.Events = events[:limit]
		c := cursorOf(page.Events[limit-1])
		if !s.asOf.IsZero() {
			c.asOf = s.asOf.Unix()
		}
		page.NextCursor = c.String()
	}
	return page, nil
}

// readAudit runs s and appends its rows to events.
func (qr *Querier) readAudit(ctx context.Context, s auditSQL, events []Event) ([]Event, error) {
	q := s.q
	sql, args := s.toSQL()
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot query audit events of org %q from %s.events", q.OrgID, qr.db))
	}
	defer rows.Close()
	for rows.Next() {
		var e Event
		var ms uint16
		if err := rows.Scan(&e.ID, &e.Type, &e.Time, &ms, &e.OrgID, &e.RoomID, &e.ActorID, &e.ActorType, &e.ActorHandle,
			&e.OwnerID, &e.SubjectID, &e.SubjectType, &e.SubjectHandle, &e.ExecutionID, &e.Source, &e.SchemaVersion, &e.Data,
			&e.IngestedAt, &e.KafkaPartition, &e.KafkaOffset); err != nil {
			return nil, fmt.Errorf("cannot read audit events of org %q from %s.events: %w", q.OrgID, qr.db, err)
		}
		e.Time = e.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		e.IngestedAt = e.IngestedAt.UTC()
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read audit events of org %q from %s.events", q.OrgID, qr.db))
	}
	return events, nil
}
