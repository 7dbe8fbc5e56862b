package trail

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema/store"
)

func serverNow(ctx context.Context, conn driver.Conn) (time.Time, error) {
	var now time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("cannot read the clickhouse clock: %w", err)
	}
	return now.UTC(), nil
}

// rowKey is an events row's key in the table's ORDER BY: (org_id, time, id), time in
// seconds. Two rows with the same key are one row to FINAL.
type rowKey struct {
	org, id string
	sec     int64
}

// eventCols are every column of events: those a row's SealDigest is computed from,
// and ingest's bookkeeping, which its leaf covers too.
const eventCols = "id, type, time, time_ms, org_id, room_id, actor_id, actor_type, actor_handle, owner_id, " +
	"subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at, kafka_partition, kafka_offset"

// scanEvent reads one events row into r (reused between rows).
func scanEvent(rows driver.Rows, r *store.EventRow) error {
	var sec time.Time
	var millis uint16
	if err := rows.Scan(&r.ID, &r.Type, &sec, &millis, &r.OrgID, &r.RoomID, &r.ActorID, &r.ActorType, &r.ActorHandle,
		&r.OwnerID, &r.SubjectID, &r.SubjectType, &r.SubjectHandle, &r.ExecutionID, &r.Source, &r.SchemaVersion,
		&r.Data, &r.IngestedAt, &r.Partition, &r.Offset); err != nil {
		return err
	}
	r.Time = sec.UTC().Add(time.Duration(millis) * time.Millisecond)
	r.IngestedAt = r.IngestedAt.UTC()
	return nil
}

func keyOf(r *store.EventRow) rowKey { return rowKey{org: r.OrgID, id: r.ID, sec: r.Time.Unix()} }

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
