package replay

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema"
)

// ClickHouse is the Source of a bandplane database: its events table. It trusts what
// the table holds; `bandplane audit verify` says whether the trail is intact.
type ClickHouse struct {
	Conn     driver.Conn
	Database string
}

// recordTypes are the types whose records change what the policies decide from.
var recordTypes = append(slices.Clone(schema.GovernanceTypes),
	schema.TypeBudgetSet, schema.TypeBudgetDeleted, schema.TypeUsageReported, schema.TypePolicyDecided)

const eventCols = `id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle,
	subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, kafka_partition, kafka_offset`

// ofOrg is the condition that keeps the rows of org, with its arguments: none for ""
// (every organization's). It is left out rather than made true so that ClickHouse
// reads one organization's rows by the table's key.
func ofOrg(org string) (string, []any) {
	if org == "" {
		return "", nil
	}
	return " AND org_id = ?", []any{org}
}

func (c ClickHouse) Partitions(ctx context.Context, org string) ([]int, error) {
	cond, args := ofOrg(org)
	rows, err := c.Conn.Query(ctx, "SELECT DISTINCT kafka_partition FROM "+c.Database+".events WHERE 1"+cond+" ORDER BY kafka_partition", args...)
	if err != nil {
		return nil, fmt.Errorf("cannot list the partitions of %s.events: %w", c.Database, err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var p int32
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		out = append(out, int(p))
	}
	return out, rows.Err()
}

// Records streams the partition's records of the policy side's types in offset order,
// whatever their time: a decision's position is an offset, and a record below it may
// carry any time its sender gave it. The replay reads only as far as the positions
// ask. Copies of one record (the table is deduplicated only on merge) share its offset
// and come once.
func (c ClickHouse) Records(ctx context.Context, partition int, org string) (Cursor, error) {
	cond, args := ofOrg(org)
	rows, err := c.Conn.Query(ctx, `SELECT `+eventCols+` FROM `+c.Database+`.events
		WHERE kafka_partition = ? AND has(?, type)`+cond+` ORDER BY kafka_offset`,
		append([]any{int32(partition), recordTypes}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot read partition %d of %s.events: %w", partition, c.Database, err)
	}
	return &rowCursor{rows: rows, to: schema.MaxTime.Add(time.Millisecond)}, nil
}

// Decisions streams the decisions with from ≤ time < to in the order they were made:
// by time, and within a millisecond by the recorded nanosecond.
func (c ClickHouse) Decisions(ctx context.Context, from, to time.Time, org string) (Cursor, error) {
	cond, args := ofOrg(org)
	rows, err := c.Conn.Query(ctx, `SELECT `+eventCols+` FROM `+c.Database+`.events
		WHERE type = ? AND time >= ? AND time < ?`+cond+` ORDER BY time, time_ms, kafka_partition, kafka_offset`,
		append([]any{schema.TypePolicyDecided, from.UTC().Truncate(time.Second), to.UTC().Truncate(time.Second).Add(time.Second)}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot read the decisions of %s.events: %w", c.Database, err)
	}
	return &decisionCursor{rows: &rowCursor{rows: rows, from: from, to: to}}, nil
}

type rowCursor struct {
	rows     driver.Rows
	from, to time.Time
	last     *Record
}

func (c *rowCursor) Next() (Record, bool, error) {
	for c.rows.Next() {
		var r Record
		ev := &r.Event
		var ms uint16
		var actorType, subjectID, subjectType, subjectHandle, data string
		var version uint16
		var p int32
		if err := c.rows.Scan(&ev.ID, &ev.Type, &ev.Time, &ms, &ev.OrgID, &ev.RoomID, &ev.Actor.ID, &actorType, &ev.Actor.Handle,
			&subjectID, &subjectType, &subjectHandle, &ev.ExecutionID, &ev.Source, &version, &data,
			&p, &r.Offset); err != nil {
			return Record{}, false, err
		}
		ev.SchemaVersion, ev.Data = int(version), json.RawMessage(data)
		ev.Time = ev.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		if ev.Time.Before(c.from) || !ev.Time.Before(c.to) {
			continue // the query's bounds are whole seconds
		}
		ev.Actor.Type = schema.ActorType(actorType)
		if subjectID != "" {
			ev.Subject = &schema.Party{ID: subjectID, Type: schema.ActorType(subjectType), Handle: subjectHandle}
		}
		r.Partition = int(p)
		if c.last != nil && c.last.Partition == r.Partition && c.last.Offset == r.Offset {
			continue // another copy of the same record
		}
		c.last = &r
		return r, true, nil
	}
	return Record{}, false, c.rows.Err()
}

func (c *rowCursor) Close() error { return c.rows.Close() }

// decisionCursor orders the decisions of one millisecond by their recorded time.
type decisionCursor struct {
	rows  *rowCursor
	batch []Record
	next  *Record // read ahead: the first of the following millisecond
	done  bool
}

func (c *decisionCursor) Next() (Record, bool, error) {
	if len(c.batch) == 0 {
		if err := c.fill(); err != nil {
			return Record{}, false, err
		}
		if len(c.batch) == 0 {
			return Record{}, false, nil
		}
	}
	r := c.batch[0]
	c.batch = c.batch[1:]
	return r, true, nil
}

func (c *decisionCursor) fill() error {
	if c.next != nil {
		c.batch = append(c.batch[:0], *c.next)
		c.next = nil
	}
	for !c.done {
		r, ok, err := c.rows.Next()
		if err != nil {
			return err
		}
		if !ok {
			c.done = true
			break
		}
		if len(c.batch) > 0 && !r.Event.Time.Equal(c.batch[0].Event.Time) {
			c.next = &r
			break
		}
		c.batch = append(c.batch, r)
	}
	if len(c.batch) > 1 {
		// Each decision's time is decoded once, not at every comparison.
		keyed := make([]timedRecord, len(c.batch))
		for i := range c.batch {
			keyed[i] = timedRecord{c.batch[i], decidedAt(&c.batch[i])}
		}
		slices.SortStableFunc(keyed, func(a, b timedRecord) int { return a.at.Compare(b.at) })
		for i := range keyed {
			c.batch[i] = keyed[i].r
		}
	}
	return nil
}

// timedRecord is a decision with its recorded decided_at.
type timedRecord struct {
	r  Record
	at time.Time
}

// decidedAt is a decision's recorded decided_at: the order of the decisions of one
// millisecond (zero when the decision has none, or data that does not decode).
func decidedAt(r *Record) time.Time {
	var d struct {
		DecidedAt time.Time `json:"decided_at"`
	}
	_ = json.Unmarshal(r.Event.Data, &d)
	return d.DecidedAt
}

func (c *decisionCursor) Close() error { return c.rows.Close() }

// Digest is the sha256 of every regular file of a bundle, sorted by name: name,
// length and content of each (the policy revision covers the .rego and data.json
// files only).
func Digest(fsys fs.FS) (string, error) {
	var names []string
	if err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			names = append(names, p)
		}
		return nil
	}); err != nil {
		return "", fmt.Errorf("cannot list the bundle: %w", err)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", fmt.Errorf("cannot read the bundle's %s: %w", n, err)
		}
		var l [8]byte
		h.Write([]byte(n))
		binary.BigEndian.PutUint64(l[:], uint64(len(b)))
		h.Write(l[:])
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
