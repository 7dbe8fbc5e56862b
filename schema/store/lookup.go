package store

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/ext"

	"github.com/bandplane/bandplane/schema/chdb"
)

// EventKey is the events table's replacing key (ORDER BY org_id, time, id): two rows
// with the same key collapse into one on merge. Time counts in whole seconds, as the
// time column does (the milliseconds are a separate column).
type EventKey struct {
	OrgID string
	Time  int64 // Unix seconds
	ID    string
}

// KeyOf is the replacing key of a row.
func KeyOf(r *EventRow) EventKey { return EventKey{OrgID: r.OrgID, Time: r.Time.Unix(), ID: r.ID} }

// StoredEvents returns the stored rows whose key is one of keys (more than one for a
// key while a replay has not been merged away yet), with every column.
//
// It is one query whose text does not grow with the batch (so max_query_size never
// bites): the keys travel as an external table, and `(org_id, time, id) IN` that table
// lets the primary key select only the granules that can hold them, which PREWHERE
// narrows to the matching rows before the other columns are read. Measured on 18.16
// (2 shared cores), fresh keys, the client's time included: 20,000 among 1M rows
// ~40 ms, 50,000 among 3M rows 30–50 ms (of which the server reads ~160k rows per
// 20,000 keys, 20–30 ms).
func (s *Store) StoredEvents(ctx context.Context, keys []EventKey) ([]EventRow, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	want := make(map[EventKey]bool, len(keys))
	orgs, times, ids := make([]string, 0, len(keys)), make([]uint32, 0, len(keys)), make([]string, 0, len(keys))
	for _, k := range keys {
		if !want[k] {
			want[k] = true
			orgs, times, ids = append(orgs, k.OrgID), append(times, uint32(k.Time)), append(ids, k.ID)
		}
	}
	tbl, err := ext.NewTable("_bandplane_keys", ext.Column("org_id", "String"), ext.Column("time", "UInt32"), ext.Column("id", "String"))
	if err != nil {
		return nil, fmt.Errorf("cannot build the key table for a lookup in %s.events: %w", s.db, err)
	}
	for i, col := range []any{orgs, times, ids} { // column by column: no boxing per value
		if _, err := tbl.Block().Columns[i].Append(col); err != nil {
			return nil, fmt.Errorf("cannot build the key table for a lookup in %s.events: %w", s.db, err)
		}
	}
	q := "SELECT id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle, owner_id, " +
		"subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at, kafka_partition, kafka_offset " +
		"FROM " + s.db + ".events PREWHERE id IN (SELECT id FROM _bandplane_keys) " +
		"WHERE (org_id, time, id) IN (SELECT org_id, toDateTime(time), id FROM _bandplane_keys)"
	rows, err := s.conn.Query(chdb.WithExternalTable(ctx, tbl), q)
	if err != nil {
		return nil, fmt.Errorf("cannot look up %d stored events in %s.events: %w", len(want), s.db, err)
	}
	defer rows.Close()
	var out []EventRow
	for rows.Next() {
		var r EventRow
		var tms uint16
		if err := rows.Scan(&r.ID, &r.Type, &r.Time, &tms, &r.OrgID, &r.RoomID, &r.ActorID, &r.ActorType, &r.ActorHandle, &r.OwnerID,
			&r.SubjectID, &r.SubjectType, &r.SubjectHandle, &r.ExecutionID, &r.Source, &r.SchemaVersion, &r.Data,
			&r.IngestedAt, &r.Partition, &r.Offset); err != nil {
			return nil, fmt.Errorf("cannot read stored events of %s.events: %w", s.db, err)
		}
		r.Time = r.Time.UTC().Add(time.Duration(tms) * time.Millisecond)
		r.IngestedAt = r.IngestedAt.UTC()
		if want[KeyOf(&r)] { // the ranges and the id set overlap more than the keys do
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read stored events of %s.events: %w", s.db, err)
	}
	return out, nil
}
