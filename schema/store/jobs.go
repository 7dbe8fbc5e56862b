package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/shopspring/decimal"
)

// JobRow is one state of a background job (jobs, migration 006); the newest Version
// is the job's state. Zero times are stored as 1970-01-01 and read back as zero.
type JobRow struct {
	ID, OrgID, Kind, AgentID                        string
	From, To                                        time.Time
	State                                           string
	CatalogVersion                                  uint64
	Cursor                                          time.Time
	DaysDone, DaysTotal                             uint32
	RowsScanned, RowsChanged, StillUnpriced         uint64
	CostBefore, CostAfter                           decimal.Decimal
	RequestedBy                                     string
	RequestedAt, StartedAt, FinishedAt, HeartbeatAt time.Time
	Runner, Error                                   string
	Version                                         uint64
}

const jobCols = "id, org_id, kind, agent_id, range_from, range_to, state, catalog_version, cursor, days_done, days_total," +
	" rows_scanned, rows_changed, still_unpriced, cost_before, cost_after, requested_by, requested_at, started_at," +
	" finished_at, heartbeat_at, runner, error, version"

var epoch = time.Unix(0, 0).UTC()

func orEpoch(t time.Time) time.Time {
	if t.IsZero() || t.Before(epoch) {
		return epoch
	}
	return t.UTC()
}

func fromEpoch(t time.Time) time.Time {
	if t.Unix() <= 0 {
		return time.Time{}
	}
	return t.UTC()
}

// InsertJob writes one state of a job.
func (s *Store) InsertJob(ctx context.Context, r JobRow) error {
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+".jobs ("+jobCols+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.jobs: %w", s.db, err)
	}
	defer batch.Abort()
	cb, ca := r.CostBefore, r.CostAfter
	if err := batch.Append(r.ID, r.OrgID, r.Kind, r.AgentID, orEpoch(r.From), orEpoch(r.To), r.State, r.CatalogVersion,
		orEpoch(r.Cursor), r.DaysDone, r.DaysTotal, r.RowsScanned, r.RowsChanged, r.StillUnpriced, cb, ca,
		r.RequestedBy, orEpoch(r.RequestedAt), orEpoch(r.StartedAt), orEpoch(r.FinishedAt), orEpoch(r.HeartbeatAt),
		r.Runner, r.Error, r.Version); err != nil {
		return fmt.Errorf("cannot append job %s to %s.jobs: %w", r.ID, s.db, err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("cannot insert job %s into %s.jobs: %w", r.ID, s.db, err)
	}
	return nil
}

// JobFilter selects jobs; zero fields select any.
type JobFilter struct {
	Kind   string
	ID     string
	Orgs   []string // any of these organizations ('*' is a job of every organization)
	States []string
	Limit  int // 0: no limit
}

// Jobs reads the current state of the jobs f selects, newest request first.
func (s *Store) Jobs(ctx context.Context, f JobFilter) ([]JobRow, error) {
	var conds []string
	var args []any
	if f.Kind != "" {
		conds, args = append(conds, "kind = ?"), append(args, f.Kind)
	}
	if f.ID != "" {
		conds, args = append(conds, "id = ?"), append(args, f.ID)
	}
	if len(f.Orgs) > 0 {
		conds, args = append(conds, "has(?, org_id)"), append(args, f.Orgs)
	}
	q := "SELECT " + jobCols + " FROM " + s.db + ".jobs FINAL"
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	// The state is a non-key column: filtered after FINAL, never before it.
	if len(f.States) > 0 {
		q = "SELECT * FROM (" + q + ") AS j WHERE has(?, state)"
		args = append(args, f.States)
	}
	q += " ORDER BY requested_at DESC, id DESC"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.jobs: %w", s.db, err)
	}
	defer rows.Close()
	var out []JobRow
	for rows.Next() {
		var r JobRow
		if err := rows.Scan(&r.ID, &r.OrgID, &r.Kind, &r.AgentID, &r.From, &r.To, &r.State, &r.CatalogVersion, &r.Cursor,
			&r.DaysDone, &r.DaysTotal, &r.RowsScanned, &r.RowsChanged, &r.StillUnpriced, &r.CostBefore, &r.CostAfter,
			&r.RequestedBy, &r.RequestedAt, &r.StartedAt, &r.FinishedAt, &r.HeartbeatAt, &r.Runner, &r.Error, &r.Version); err != nil {
			return nil, fmt.Errorf("cannot read %s.jobs: %w", s.db, err)
		}
		r.From, r.To, r.Cursor = fromEpoch(r.From), fromEpoch(r.To), fromEpoch(r.Cursor)
		r.RequestedAt, r.StartedAt, r.FinishedAt, r.HeartbeatAt = fromEpoch(r.RequestedAt), fromEpoch(r.StartedAt), fromEpoch(r.FinishedAt), fromEpoch(r.HeartbeatAt)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.jobs: %w", s.db, err)
	}
	return out, nil
}
