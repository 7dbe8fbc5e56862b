package query

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Audit page sizes.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 10000
)

// AuditQuery asks for the audit trail of one organization, newest first. Zero values
// mean "any"; the range is [From, To) at millisecond precision.
type AuditQuery struct {
	OrgID    string
	From, To time.Time
	RoomID   string
	ActorID  string
	Types    []string // event types, e.g. "message.posted"; empty: all
	Limit    int      // 0: DefaultAuditLimit
	Before   string   // cursor from a previous page's NextCursor; empty: the newest
}

// Validate reports every problem of the query at once, each naming its field.
func (q AuditQuery) Validate() error {
	var errs []error
	if q.OrgID == "" {
		errs = append(errs, fieldErr("org_id", "required"))
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.To.After(q.From) {
		errs = append(errs, fieldErr("to", "must be after from (from %s, to %s)", q.From.UTC().Format(time.RFC3339Nano), q.To.UTC().Format(time.RFC3339Nano)))
	}
	for i, t := range q.Types {
		if t == "" {
			errs = append(errs, fieldErr("types", "entry %d is empty", i))
		}
	}
	if q.Limit < 0 || q.Limit > MaxAuditLimit {
		errs = append(errs, fieldErr("limit", "must be between 1 and %d, got %d", MaxAuditLimit, q.Limit))
	}
	if q.Before != "" {
		if _, err := decodeCursor(q.Before); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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

// cursor is the sort key (time, time_ms, id) of the last event of a page. The table is
// ordered by it, so the next page is every row strictly below it: keyset pagination
// stays correct while new events arrive, unlike OFFSET.
type cursor struct {
	sec int64
	ms  uint16
	id  string
}

func cursorOf(e Event) cursor {
	return cursor{sec: e.Time.Unix(), ms: uint16(e.Time.Nanosecond() / 1e6), id: e.ID}
}

// The encoding is opaque to clients; "v1" leaves room to change it.
func (c cursor) String() string {
	ms := c.sec*1000 + int64(c.ms)
	return base64.RawURLEncoding.EncodeToString([]byte("v1:" + strconv.FormatInt(ms, 10) + ":" + c.id))
}

func decodeCursor(s string) (cursor, error) {
	bad := fieldErr("before", "malformed cursor %q (pass a nextCursor unchanged)", s)
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, bad
	}
	parts := strings.SplitN(string(raw), ":", 3)
	if len(parts) != 3 || parts[0] != "v1" || parts[2] == "" {
		return cursor{}, bad
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || ms < 0 {
		return cursor{}, bad
	}
	return cursor{sec: ms / 1000, ms: uint16(ms % 1000), id: parts[2]}, nil
}

// auditSQL builds the SELECT of a validated AuditQuery.
type auditSQL struct {
	db string
	q  AuditQuery
}

func msOf(t time.Time) uint16 { return uint16(t.Nanosecond() / 1e6) }

func (s auditSQL) toSQL() (string, []any) {
	q := s.q
	w := &where{}
	w.add("org_id = ?", q.OrgID)
	// Each bound is a plain condition on time (which the primary key can use) plus the
	// exact comparison on (time, time_ms[, id]).
	if !q.From.IsZero() {
		sec := q.From.UTC().Truncate(time.Second)
		w.add("time >= ?", sec)
		w.add("(time > ? OR time_ms >= ?)", sec, msOf(q.From))
	}
	if !q.To.IsZero() {
		sec := q.To.UTC().Truncate(time.Second)
		w.add("time <= ?", sec)
		w.add("(time < ? OR time_ms < ?)", sec, msOf(q.To))
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
	if q.ActorID != "" {
		w.add("actor_id = ?", q.ActorID)
	}
	if len(q.Types) > 0 {
		w.add("has(?, type)", q.Types)
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultAuditLimit
	}
	// One row more than the page tells whether another page follows.
	sql := "SELECT id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle," +
		" owner_id, subject_id, subject_type, subject_handle, execution_id, source, schema_version, data," +
		" ingested_at, kafka_partition, kafka_offset" +
		" FROM " + s.db + ".events FINAL" +
		" WHERE " + w.String() +
		" ORDER BY time DESC, time_ms DESC, id DESC" +
		fmt.Sprintf(" LIMIT %d", limit+1)
	return sql, w.args
}

// AuditEvents returns one page of q.OrgID's audit trail, newest first.
func (qr *Querier) AuditEvents(ctx context.Context, q AuditQuery) (AuditPage, error) {
	if err := q.Validate(); err != nil {
		return AuditPage{}, err
	}
	sql, args := auditSQL{db: qr.db, q: q}.toSQL()
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return AuditPage{}, queryErr(ctx, err, fmt.Sprintf("cannot query audit events of org %q from %s.events", q.OrgID, qr.db))
	}
	defer rows.Close()
	limit := q.Limit
	if limit == 0 {
		limit = DefaultAuditLimit
	}
	page := AuditPage{Events: make([]Event, 0, min(limit, 1024))}
	more := false
	for rows.Next() {
		if len(page.Events) == limit {
			more = true
			break
		}
		var e Event
		var ms uint16
		if err := rows.Scan(&e.ID, &e.Type, &e.Time, &ms, &e.OrgID, &e.RoomID, &e.ActorID, &e.ActorType, &e.ActorHandle,
			&e.OwnerID, &e.SubjectID, &e.SubjectType, &e.SubjectHandle, &e.ExecutionID, &e.Source, &e.SchemaVersion, &e.Data,
			&e.IngestedAt, &e.KafkaPartition, &e.KafkaOffset); err != nil {
			return AuditPage{}, fmt.Errorf("cannot read audit events of org %q from %s.events: %w", q.OrgID, qr.db, err)
		}
		e.Time = e.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		e.IngestedAt = e.IngestedAt.UTC()
		page.Events = append(page.Events, e)
	}
	if err := rows.Err(); err != nil {
		return AuditPage{}, queryErr(ctx, err, fmt.Sprintf("cannot read audit events of org %q from %s.events", q.OrgID, qr.db))
	}
	if more {
		page.NextCursor = cursorOf(page.Events[len(page.Events)-1]).String()
	}
	return page, nil
}
