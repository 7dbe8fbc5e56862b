package store

import (
	"context"
	"fmt"
	"time"

	"github.com/shopspring/decimal"
)

// UsageFilter narrows ScanUsage. Zero values mean "any".
type UsageFilter struct {
	From, To     time.Time // [From, To)
	AgentID      string
	UnpricedOnly bool
}

// ScanUsage streams the current (FINAL) usage facts matching f to fn in chunks of up to
// chunk rows, in no particular order.
func (s *Store) ScanUsage(ctx context.Context, f UsageFilter, chunk int, fn func([]UsageRow) error) error {
	q := `SELECT event_id, time, time_ms, org_id, owner_id, agent_id, room_id, execution_id, model,
		input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
		cost, currency, priced, catalog_version, version
		FROM ` + s.db + `.usage FINAL WHERE time >= ? AND time < ?`
	to := f.To
	if to.IsZero() {
		to = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC) // within DateTime on 18.16 (2106 wraps to 0)
	}
	from := f.From
	if from.Before(time.Unix(0, 0)) {
		from = time.Unix(0, 0) // DateTime's lower bound; a zero From means "from the start"
	}
	args := []any{from.UTC(), to.UTC()}
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
		var r UsageRow
		var tms uint16
		var cost decimal.Decimal
		var priced uint8
		if err := rows.Scan(&r.EventID, &r.Time, &tms, &r.OrgID, &r.OwnerID, &r.AgentID, &r.RoomID, &r.ExecutionID, &r.Model,
			&r.InputTokens, &r.OutputTokens, &r.CacheReadTokens, &r.CacheWriteTokens, &r.Reasoning,
			&cost, &r.Currency, &priced, &r.CatalogVersion, &r.Version); err != nil {
			return fmt.Errorf("cannot read %s.usage: %w", s.db, err)
		}
		r.Time = r.Time.UTC().Add(time.Duration(tms) * time.Millisecond)
		r.CostMicros = cost.Shift(6).IntPart()
		r.Priced = priced == 1
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
