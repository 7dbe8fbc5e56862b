package query

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shopspring/decimal"
)

// Usage series, for charts: usage per hour or day, one series per value of a split
// dimension (the top ones by cost), every bucket present.

// Series bounds.
const (
	DefaultSeriesLimit = 20
	MaxSeriesLimit     = 100
	MaxSeriesBuckets   = 2000
)

// SeriesQuery asks for usage of OrgID over [From, To) (widened to whole buckets) in
// buckets of Interval (DimHour or DimDay), split by Split (a dimension other than
// hour and day, or "": one series).
type SeriesQuery struct {
	OrgID    string
	From, To time.Time
	Interval string
	Split    string
	Filter   CostFilter
	Limit    int // series; 0: DefaultSeriesLimit
}

// Point is one bucket of a series.
type Point struct {
	Time           time.Time
	Events         uint64
	UnpricedEvents uint64
	Tokens         Tokens
	Cost           decimal.Decimal
}

// Series is the usage of one value of the split dimension in one currency.
type Series struct {
	Key      string // "" without split
	Currency string
	Points   []Point
}

func (q *SeriesQuery) bucket() time.Duration {
	if q.Interval == DimDay {
		return 24 * time.Hour
	}
	return time.Hour
}

// Validate reports every problem of the query at once.
func (q SeriesQuery) Validate() error {
	errs := checkOrg(nil, q.OrgID)
	if q.Interval != DimHour && q.Interval != DimDay {
		errs = append(errs, fieldErr("interval", "must be hour or day, got %q", q.Interval))
	}
	switch q.Split {
	case "", DimOwner, DimAgent, DimRoom, DimModel, DimInitiator, DimInitiatorOwner, DimChainDepth:
	default:
		errs = append(errs, fieldErr("split", "must be owner, agent, room, model, initiator, initiator_owner or chain_depth, got %q", q.Split))
	}
	if q.From.IsZero() || q.To.IsZero() || !q.To.After(q.From) {
		errs = append(errs, fieldErr("to", "from and to are required, to after from"))
	} else if n := q.To.Sub(q.From) / q.bucket(); n > MaxSeriesBuckets {
		errs = append(errs, fieldErr("interval", "%d buckets between from and to; at most %d (use a wider interval or a shorter range)", n, MaxSeriesBuckets))
	}
	errs = checkLimit(errs, q.Limit, MaxSeriesLimit)
	errs = append(errs, q.Filter.validate()...)
	cq := seriesSQL{q: q}.costs().q
	errs = append(errs, cq.tableErrs("split")...)
	return errors.Join(errs...)
}

type seriesSQL struct {
	db string
	q  SeriesQuery
}

func (s seriesSQL) costs() costsSQL {
	q := CostQuery{OrgID: s.q.OrgID, From: s.q.From, To: s.q.To, Filter: s.q.Filter}
	if s.q.Split != "" {
		q.GroupBy = []string{s.q.Split} // which rollup holds the split
	}
	return costsSQL{db: s.db, q: q}
}

// top ranks the split dimension's values by cost, then events.
func (s seriesSQL) top() (string, []any) {
	src, args := s.costs().from(false, nil)
	col := seriesKey(s.q.Split)
	return "SELECT " + col + " AS k, sum(cost) AS total_cost, sum(events) AS total_events FROM " + src +
		" GROUP BY k HAVING total_events > 0 ORDER BY total_cost DESC, total_events DESC, k LIMIT ?", append(args, s.limit())
}

func (s seriesSQL) limit() int {
	if s.q.Limit == 0 {
		return DefaultSeriesLimit
	}
	return s.q.Limit
}

// points sums per key, bucket and currency; keys restricts the split to the top ones.
func (s seriesSQL) points(keys []string) (string, []any) {
	key := "''"
	var extra func(*where)
	if s.q.Split != "" {
		key = seriesKey(s.q.Split)
		extra = func(w *where) { w.add("has(?, "+key+")", keys) }
	}
	src, args := s.costs().from(s.q.Interval == DimHour, extra)
	b := costDims[s.q.Interval]
	return "SELECT " + key + " AS k, " + b + " AS bucket, currency, " + sums + " FROM " + src +
		" GROUP BY k, bucket, currency HAVING total_events > 0 ORDER BY k, currency, bucket", args
}

// seriesKey is a split dimension's expression as a series key: text, whatever the
// column's type.
func seriesKey(dim string) string {
	if dim == DimChainDepth {
		return "toString(chain_depth)"
	}
	return costDims[dim]
}

// UsageSeries returns the series of q, each with every bucket of the range.
func (qr *Querier) UsageSeries(ctx context.Context, q SeriesQuery) ([]Series, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	s := seriesSQL{db: qr.db, q: q}
	var keys []string
	if q.Split != "" {
		sql, args := s.top()
		rows, err := qr.conn.Query(ctx, sql, args...)
		if err != nil {
			return nil, queryErr(ctx, err, fmt.Sprintf("cannot rank the usage of org %q in %s.usage_rollup", q.OrgID, qr.db))
		}
		for rows.Next() {
			var k string
			var cost decimal.Decimal
			var events uint64
			if err := rows.Scan(&k, &cost, &events); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cannot rank the usage of org %q: %w", q.OrgID, err)
			}
			keys = append(keys, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, queryErr(ctx, err, fmt.Sprintf("cannot rank the usage of org %q", q.OrgID))
		}
		if len(keys) == 0 {
			return []Series{}, nil
		}
	}
	sql, args := s.points(keys)
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the usage series of org %q in %s.usage_rollup", q.OrgID, qr.db))
	}
	defer rows.Close()
	type sk struct{ key, currency string }
	got := map[sk]map[time.Time]Point{}
	var order []sk
	for rows.Next() {
		var k, currency string
		var p Point
		var u Tokens
		t := &p.Tokens
		if err := rows.Scan(&k, &p.Time, &currency, &p.Events, &p.UnpricedEvents, &t.Input, &t.Output, &t.CacheRead, &t.CacheWrite, &t.Reasoning,
			&u.Input, &u.Output, &u.CacheRead, &u.CacheWrite, &u.Reasoning, &p.Cost); err != nil {
			return nil, fmt.Errorf("cannot read the usage series of org %q: %w", q.OrgID, err)
		}
		p.Time = p.Time.UTC()
		key := sk{k, currency}
		if got[key] == nil {
			got[key] = map[time.Time]Point{}
			order = append(order, key)
		}
		got[key][p.Time] = p
	}
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the usage series of org %q", q.OrgID))
	}
	rank := map[string]int{}
	for i, k := range keys {
		rank[k] = i
	}
	// Series in rank order (the top query's), buckets from the range's first to last.
	out := make([]Series, 0, len(order))
	step := q.bucket()
	first := q.From.UTC().Truncate(step)
	for _, key := range order {
		ser := Series{Key: key.key, Currency: key.currency}
		for t := first; t.Before(q.To); t = t.Add(step) {
			p, ok := got[key][t]
			if !ok {
				p = Point{Time: t, Cost: decimal.Zero}
			}
			ser.Points = append(ser.Points, p)
		}
		out = append(out, ser)
	}
	slices.SortStableFunc(out, func(a, b Series) int { return cmp.Compare(rank[a.Key], rank[b.Key]) })
	return out, nil
}
