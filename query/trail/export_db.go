package trail

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema/chdb"
)

// The reads of the log's tables that the export needs (logdb.go holds the sealer's
// and verify's). Nothing they return is trusted: the exporter checks it against the
// scan of the index and the pinned checkpoint.

// checkpointsAt reads org's checkpoint rows of exactly size, in note order (the
// exporter takes the first that verifies, so that the same size always pins the same
// note).
func (l logDB) checkpointsAt(ctx context.Context, org string, size uint64, limit int) ([]storedCheckpoint, error) {
	rows, err := l.conn.Query(ctx, "SELECT org_id, size, note FROM "+l.db+".checkpoints WHERE org_id = ? AND size = ? ORDER BY note LIMIT ?",
		org, size, uint64(limit))
	if err != nil {
		return nil, fmt.Errorf("cannot read the checkpoints of org %q of size %d from %s.checkpoints: %w", org, size, l.db, err)
	}
	return scanCheckpoints(rows, l.db)
}

// checkpointsAbove reads org's checkpoint rows of sizes in (above, upTo], smallest
// first, at most limit.
func (l logDB) checkpointsAbove(ctx context.Context, org string, above, upTo uint64, limit int) ([]storedCheckpoint, error) {
	rows, err := l.conn.Query(ctx, "SELECT org_id, size, note FROM "+l.db+".checkpoints WHERE org_id = ? AND size > ? AND size <= ? ORDER BY size, note LIMIT ?",
		org, above, upTo, uint64(limit))
	if err != nil {
		return nil, fmt.Errorf("cannot read the checkpoints of org %q above size %d from %s.checkpoints: %w", org, above, l.db, err)
	}
	return scanCheckpoints(rows, l.db)
}

func scanCheckpoints(rows driver.Rows, db string) ([]storedCheckpoint, error) {
	defer rows.Close()
	var out []storedCheckpoint
	for rows.Next() {
		var c storedCheckpoint
		var note string
		if err := rows.Scan(&c.Org, &c.Size, &note); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.checkpoints: %w", db, err)
		}
		c.Note = []byte(note)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.checkpoints: %w", db, err)
	}
	return out, nil
}

// indexRows streams org's log_index rows with lo <= idx < hi in index order (a leaf's
// rows are consecutive).
func (l logDB) indexRows(ctx context.Context, org string, lo, hi uint64) (driver.Rows, error) {
	rows, err := l.conn.Query(ctx, "SELECT idx, time_ms, inner FROM "+l.db+".log_index WHERE org_id = ? AND idx >= ? AND idx < ? ORDER BY idx", org, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("cannot read leaves %d to %d of org %q from %s.log_index: %w", lo, hi, org, l.db, err)
	}
	return rows, nil
}

// indexRow is a row of log_index: a leaf's index, event time in milliseconds and inner
// digest; ok is false when the stored digest is not one.
type indexRow struct {
	idx   uint64
	ms    int64
	inner [32]byte
	ok    bool
}

// scanIndexRow reads the current row of a query of idx, time_ms, inner from log_index.
func scanIndexRow(rows driver.Rows, db string) (indexRow, error) {
	var r indexRow
	var inner string
	if err := rows.Scan(&r.idx, &r.ms, &inner); err != nil {
		return r, fmt.Errorf("cannot read a row of %s.log_index: %w", db, err)
	}
	r.inner, r.ok = parseHash(inner)
	return r, nil
}

// blockRows streams org's log_index rows of the blocks of blockSize leaves whose
// numbers blocks holds (sorted), below size, in index order.
func (l logDB) blockRows(ctx context.Context, org string, blocks []uint64, blockSize, size uint64) (driver.Rows, error) {
	tbl, err := ext.NewTable("_bandplane_blocks", ext.Column("b", "UInt64"))
	if err != nil {
		return nil, err
	}
	if _, err := tbl.Block().Columns[0].Append(blocks); err != nil {
		return nil, err
	}
	lo, hi := blocks[0]*blockSize, min(size, (blocks[len(blocks)-1]+1)*blockSize)
	rows, err := l.conn.Query(chdb.WithExternalTable(ctx, tbl), "SELECT idx, time_ms, inner FROM "+l.db+
		".log_index WHERE org_id = ? AND idx >= ? AND idx < ? AND intDiv(idx, ?) IN (SELECT b FROM _bandplane_blocks) ORDER BY idx",
		org, lo, hi, blockSize)
	if err != nil {
		return nil, fmt.Errorf("cannot read %d blocks of org %q's leaves from %s.log_index: %w", len(blocks), org, l.db, err)
	}
	return rows, nil
}

// windowLeaves reads org's log_leaves rows with an event time in [lo, hi) and an index
// below size, in the events table's order (time, id), then by index.
func (l logDB) windowLeaves(ctx context.Context, org string, lo, hi time.Time, size uint64) ([]IndexedLeaf, error) {
	rows, err := l.conn.Query(ctx, "SELECT "+leafCols+" FROM "+l.db+".log_leaves WHERE org_id = ? AND time >= ? AND time < ? AND idx < ? ORDER BY time, id, idx",
		org, lo, hi, size)
	if err != nil {
		return nil, fmt.Errorf("cannot read the leaves of org %q in [%s, %s) from %s.log_leaves: %w", org, fmtSec(lo), fmtSec(hi), l.db, err)
	}
	out, err := readLeaves(rows, l.db)
	if err != nil {
		return nil, fmt.Errorf("cannot read the leaves of org %q from %s.log_leaves: %w", org, l.db, err)
	}
	return out, nil
}

// copyBlock bounds the event rows ClickHouse sends in one block, which the driver
// holds whole: events are at most about 1 MiB each.
const copyBlock = 256

// windowCopies streams every stored copy of org's rows with an event time in [lo, hi),
// in the table's order (time, id): no FINAL, since the export matches each copy with
// the leaves of its key.
func (l logDB) windowCopies(ctx context.Context, org string, lo, hi time.Time) (driver.Rows, error) {
	qctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_block_size": copyBlock}))
	rows, err := l.conn.Query(qctx, "SELECT "+eventCols+" FROM "+l.db+".events WHERE org_id = ? AND time >= ? AND time < ? ORDER BY time, id",
		org, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("cannot read the events of org %q in [%s, %s) from %s.events: %w", org, fmtSec(lo), fmtSec(hi), l.db, err)
	}
	return rows, nil
}

// histBucket is one bucket of the export's plan: rows (stored copies and leaves) and
// about how many bytes they hold, from bucket lo to hi (Unix seconds, hi exclusive).
type histBucket struct {
	lo, hi int64
	rows   uint64
	bytes  uint64
}

// rowOverhead is about how many bytes a row holds besides its data.
const rowOverhead = 256

// histogram counts org's stored copies and its leaves below size in [lo, hi), in
// buckets of width seconds.
func (l logDB) histogram(ctx context.Context, org string, lo, hi, width int64, size uint64) ([]histBucket, error) {
	byBucket := map[int64]*histBucket{}
	for _, q := range []struct {
		table, sql string
		args       []any
	}{
		{"events", "SELECT intDiv(toUInt32(time), ?) AS b, count(), sum(length(data)) FROM " + l.db + ".events WHERE org_id = ? AND time >= ? AND time < ? GROUP BY b",
			[]any{uint32(width), org, unix(lo), unix(hi)}},
		{"log_leaves", "SELECT intDiv(toUInt32(time), ?) AS b, count(), toUInt64(0) FROM " + l.db + ".log_leaves WHERE org_id = ? AND time >= ? AND time < ? AND idx < ? GROUP BY b",
			[]any{uint32(width), org, unix(lo), unix(hi), size}},
	} {
		rows, err := l.conn.Query(ctx, q.sql, q.args...)
		if err != nil {
			return nil, fmt.Errorf("cannot count the rows of org %q in %s.%s: %w", org, l.db, q.table, err)
		}
		for rows.Next() {
			var b uint32
			var n, bytes uint64
			if err := rows.Scan(&b, &n, &bytes); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cannot read the histogram of org %q in %s.%s: %w", org, l.db, q.table, err)
			}
			hb := byBucket[int64(b)]
			if hb == nil {
				hb = &histBucket{lo: max(lo, int64(b)*width), hi: min(hi, (int64(b)+1)*width)}
				byBucket[int64(b)] = hb
			}
			hb.rows += n
			hb.bytes += bytes + n*rowOverhead
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("cannot read the histogram of org %q in %s.%s: %w", org, l.db, q.table, err)
		}
	}
	out := make([]histBucket, 0, len(byBucket))
	for _, b := range byBucket {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b histBucket) int { return cmp.Compare(a.lo, b.lo) })
	return out, nil
}

func unix(s int64) time.Time { return time.Unix(s, 0).UTC() }
