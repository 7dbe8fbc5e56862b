package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
)

// UsageFilter narrows ScanUsage. Zero values mean "any".
type UsageFilter struct {
	From, To time.Time // [From, To)
	// OrgIDs are the organizations whose usage is read ("" is the unattributed usage).
	// Ingest always names them; none reads every organization's, which only an
	// operator's reprice of a whole database does.
	OrgIDs       []string
	AgentID      string
	UnpricedOnly bool
}

// ScanUsage streams the current (FINAL) usage facts matching f to fn in chunks of up to
// chunk rows, in no particular order.
func (s *Store) ScanUsage(ctx context.Context, f UsageFilter, chunk int, fn func([]UsageRow) error) error {
	q := `SELECT ` + usageReadCols + ` FROM ` + s.db + `.usage FINAL WHERE time >= ? AND time < ?`
	to := f.To
	if to.IsZero() {
		to = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC) // within DateTime on 18.16 (2106 wraps to 0)
	}
	from := f.From
	if from.Before(time.Unix(0, 0)) {
		from = time.Unix(0, 0) // DateTime's lower bound; a zero From means "from the start"
	}
	args := []any{from.UTC(), to.UTC()}
	if len(f.OrgIDs) > 0 {
		q += " AND org_id IN (?" + strings.Repeat(", ?", len(f.OrgIDs)-1) + ")"
		for _, o := range f.OrgIDs {
			args = append(args, o)
		}
	}
	if f.AgentID != "" {
		q += " AND agent_id = ?"
		args = append(args, f.AgentID)
	}
	if f.UnpricedOnly {
		q += " AND priced = 0"
	}
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("cannot read %s.usage: %w", s.db, err)
	}
	defer rows.Close()
	buf := make([]UsageRow, 0, chunk)
	for rows.Next() {
		r, err := scanUsage(rows)
		if err != nil {
			return fmt.Errorf("cannot read %s.usage: %w", s.db, err)
		}
		buf = append(buf, r)
		if len(buf) == chunk {
			if err := fn(buf); err != nil {
				return err
			}
			buf = make([]UsageRow, 0, chunk)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read %s.usage: %w", s.db, err)
	}
	if len(buf) > 0 {
		return fn(buf)
	}
	return nil
}

// usageReadCols are the columns scanUsage reads, in its order.
const usageReadCols = `event_id, time, time_ms, org_id, owner_id, agent_id, room_id, execution_id, model,
		input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
		cost, currency, priced, catalog_version, version,
		initiator_id, initiator_type, initiator_org, initiator_owner, trigger_id, chain_depth, link`

func scanUsage(rows driver.Rows) (UsageRow, error) {
	var r UsageRow
	var tms uint16
	var cost decimal.Decimal
	var priced uint8
	if err := rows.Scan(&r.EventID, &r.Time, &tms, &r.OrgID, &r.OwnerID, &r.AgentID, &r.RoomID, &r.ExecutionID, &r.Model,
		&r.InputTokens, &r.OutputTokens, &r.CacheReadTokens, &r.CacheWriteTokens, &r.Reasoning,
		&cost, &r.Currency, &priced, &r.CatalogVersion, &r.Version,
		&r.Chain.InitiatorID, &r.Chain.InitiatorType, &r.Chain.InitiatorOrg, &r.Chain.InitiatorOwner, &r.Chain.TriggerID, &r.Chain.Depth, &r.Chain.Link); err != nil {
		return r, err
	}
	r.Time = r.Time.UTC().Add(time.Duration(tms) * time.Millisecond)
	r.CostMicros = cost.Shift(6).IntPart()
	r.Priced = priced == 1
	return r, nil
}

// ScanUsageHours streams the current (FINAL) usage facts of one organization (org ""
// is the unattributed usage) in [from, to), of one agent unless agent is "", in time
// order, to fn one hour at a time: fn gets the hour (UTC) and all its rows, or, for an
// hour with more than chunk rows, its rows in chunks of chunk. from and to are used to
// the second (the column's precision).
func (s *Store) ScanUsageHours(ctx context.Context, org, agent string, from, to time.Time, chunk int, fn func(hour time.Time, rows []UsageRow) error) error {
	if chunk <= 0 {
		chunk = 100_000
	}
	q := `SELECT ` + usageReadCols + ` FROM ` + s.db + `.usage FINAL WHERE org_id = ? AND time >= ? AND time < ?`
	args := []any{org, from.UTC().Truncate(time.Second), to.UTC().Truncate(time.Second)}
	if agent != "" {
		q += " AND agent_id = ?"
		args = append(args, agent)
	}
	q += " ORDER BY time, time_ms, event_id"
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("cannot read %s.usage of org %q from %s: %w", s.db, org, from.UTC().Format(time.RFC3339), err)
	}
	defer rows.Close()
	var buf []UsageRow
	var hour time.Time
	for rows.Next() {
		r, err := scanUsage(rows)
		if err != nil {
			return fmt.Errorf("cannot read %s.usage of org %q: %w", s.db, org, err)
		}
		h := r.Time.Truncate(time.Hour)
		if len(buf) > 0 && (!h.Equal(hour) || len(buf) == chunk) {
			if err := fn(hour, buf); err != nil {
				return err
			}
			buf = nil
		}
		hour = h
		buf = append(buf, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read %s.usage of org %q: %w", s.db, org, err)
	}
	if len(buf) > 0 {
		return fn(hour, buf)
	}
	return nil
}

// UsageOrgs lists the organizations with usage in [from, to), "" (unattributed usage)
// included. It reads without FINAL: the organization is part of the key, so every
// version of a row has the same.
func (s *Store) UsageOrgs(ctx context.Context, from, to time.Time) ([]string, error) {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT org_id FROM "+s.db+".usage WHERE time >= ? AND time < ? ORDER BY org_id",
		from.UTC().Truncate(time.Second), to.UTC().Truncate(time.Second))
	if err != nil {
		return nil, fmt.Errorf("cannot list the organizations of %s.usage from %s: %w", s.db, from.UTC().Format(time.RFC3339), err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}
