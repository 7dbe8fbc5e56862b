package query

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shopspring/decimal"
)

// Cost dimensions a CostQuery can group by.
const (
	DimOwner = "owner"
	DimAgent = "agent"
	DimRoom  = "room"
	DimModel = "model"
	DimHour  = "hour"
	DimDay   = "day"
)

// costDims maps a dimension to its expression over usage_hourly. The rollup's grain is
// the hour, so a day is the start of the day its hours fall in (UTC, the column's zone).
var costDims = map[string]string{
	DimOwner: "owner_id",
	DimAgent: "agent_id",
	DimRoom:  "room_id",
	DimModel: "model",
	DimHour:  "hour",
	DimDay:   "toStartOfDay(hour)",
}

// Cost limits: an attribution table is for people, not for export.
const (
	DefaultCostLimit = 1000
	MaxCostLimit     = 10000
)

// CostQuery asks for token usage and cost of one organization, summed over
// [From, To) and grouped by the dimensions in GroupBy (none: one row per currency).
// The rollup is hourly, so the range is widened to whole hours: From is rounded down
// and To up to the hour.
type CostQuery struct {
	OrgID    string
	From, To time.Time
	GroupBy  []string // subset of owner, agent, room, model, hour, day
	Limit    int      // 0: DefaultCostLimit
}

// Validate reports every problem of the query at once, each naming its field.
func (q CostQuery) Validate() error {
	var errs []error
	if q.OrgID == "" {
		errs = append(errs, fieldErr("org_id", "required"))
	}
	if q.From.IsZero() {
		errs = append(errs, fieldErr("from", "required"))
	}
	if q.To.IsZero() {
		errs = append(errs, fieldErr("to", "required"))
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.To.After(q.From) {
		errs = append(errs, fieldErr("to", "must be after from (from %s, to %s)", q.From.UTC().Format(time.RFC3339), q.To.UTC().Format(time.RFC3339)))
	}
	seen := map[string]bool{}
	for _, d := range q.GroupBy {
		switch {
		case costDims[d] == "":
			errs = append(errs, fieldErr("group_by", "unknown dimension %q (want one of owner, agent, room, model, hour, day)", d))
		case seen[d]:
			errs = append(errs, fieldErr("group_by", "dimension %q given twice", d))
		}
		seen[d] = true
	}
	if q.Limit < 0 || q.Limit > MaxCostLimit {
		errs = append(errs, fieldErr("limit", "must be between 1 and %d, got %d", MaxCostLimit, q.Limit))
	}
	return errors.Join(errs...)
}

// CostRow is one group. Only the fields of the grouped dimensions are set; Currency is
// always a key, since amounts in different currencies cannot be added.
type CostRow struct {
	OwnerID, AgentID, RoomID, Model string
	Hour, Day                       time.Time // UTC
	Events, UnpricedEvents          uint64
	InputTokens, OutputTokens       uint64
	CacheReadTokens                 uint64
	CacheWriteTokens                uint64
	ReasoningTokens                 uint64
	Cost                            decimal.Decimal // exact, 6 decimals in the table
	Currency                        string
}

// costsSQL builds the SELECT of a validated CostQuery.
type costsSQL struct {
	db string
	q  CostQuery
}

func ceilHour(t time.Time) time.Time {
	t = t.UTC()
	if h := t.Truncate(time.Hour); !h.Equal(t) {
		return h.Add(time.Hour)
	}
	return t
}

func (s costsSQL) toSQL() (string, []any) {
	var keys []string
	for _, d := range s.q.GroupBy {
		keys = append(keys, costDims[d])
	}
	w := &where{}
	w.add("org_id = ?", s.q.OrgID)
	w.add("hour >= ?", s.q.From.UTC().Truncate(time.Hour))
	w.add("hour < ?", ceilHour(s.q.To))

	// Time buckets read oldest first; within a bucket (or without one) the most
	// expensive group comes first. The remaining keys make the order total.
	var order []string
	for _, d := range s.q.GroupBy {
		if d == DimHour || d == DimDay {
			order = append(order, costDims[d])
		}
	}
	order = append(order, "total_cost DESC")
	for _, d := range s.q.GroupBy {
		if d != DimHour && d != DimDay {
			order = append(order, costDims[d])
		}
	}
	order = append(order, "currency")

	limit := s.q.Limit
	if limit == 0 {
		limit = DefaultCostLimit
	}

	var b strings.Builder
	b.WriteString("SELECT ")
	for _, k := range keys {
		b.WriteString(k + ", ")
	}
	// Aggregates get names unlike the columns: a ClickHouse alias equal to a column
	// name would capture the column inside sum() and every other expression.
	b.WriteString("currency, sum(events) AS total_events, sum(unpriced_events) AS total_unpriced," +
		" sum(input_tokens) AS total_input, sum(output_tokens) AS total_output," +
		" sum(cache_read_tokens) AS total_cache_read, sum(cache_write_tokens) AS total_cache_write," +
		" sum(reasoning_tokens) AS total_reasoning, sum(cost) AS total_cost")
	b.WriteString(" FROM " + s.db + ".usage_hourly FINAL")
	b.WriteString(" WHERE " + w.String())
	b.WriteString(" GROUP BY " + strings.Join(append(keys, "currency"), ", "))
	// A rebuild overwrites a group that lost all its events with zeros; those are
	// dropped after the sum. A condition on events evaluated before FINAL picks the
	// latest version (PREWHERE: 18.16 does not move WHERE there under FINAL, but
	// explicit PREWHERE and some releases' optimizer do) would let an older non-zero
	// version through; HAVING on the sum is correct everywhere.
	b.WriteString(" HAVING total_events > 0")
	b.WriteString(" ORDER BY " + strings.Join(order, ", "))
	fmt.Fprintf(&b, " LIMIT %d", limit)
	return b.String(), w.args
}

// Costs sums usage of q.OrgID from the hourly rollup.
func (qr *Querier) Costs(ctx context.Context, q CostQuery) ([]CostRow, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	sql, args := costsSQL{db: qr.db, q: q}.toSQL()
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot query costs of org %q from %s.usage_hourly", q.OrgID, qr.db))
	}
	defer rows.Close()
	out := []CostRow{}
	for rows.Next() {
		var r CostRow
		dest := make([]any, 0, len(q.GroupBy)+9)
		for _, d := range q.GroupBy {
			switch d {
			case DimOwner:
				dest = append(dest, &r.OwnerID)
			case DimAgent:
				dest = append(dest, &r.AgentID)
			case DimRoom:
				dest = append(dest, &r.RoomID)
			case DimModel:
				dest = append(dest, &r.Model)
			case DimHour:
				dest = append(dest, &r.Hour)
			case DimDay:
				dest = append(dest, &r.Day)
			}
		}
		dest = append(dest, &r.Currency, &r.Events, &r.UnpricedEvents, &r.InputTokens, &r.OutputTokens,
			&r.CacheReadTokens, &r.CacheWriteTokens, &r.ReasoningTokens, &r.Cost)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("cannot read costs of org %q from %s.usage_hourly: %w", q.OrgID, qr.db, err)
		}
		if !r.Hour.IsZero() {
			r.Hour = r.Hour.UTC()
		}
		if !r.Day.IsZero() {
			r.Day = r.Day.UTC()
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read costs of org %q from %s.usage_hourly", q.OrgID, qr.db))
	}
	return out, nil
}
