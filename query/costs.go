package query

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/schema/store"
)

// Cost dimensions a CostQuery can group by.
const (
	DimOwner = "owner"
	DimAgent = "agent"
	DimRoom  = "room"
	DimModel = "model"
	DimHour  = "hour"
	DimDay   = "day"
	// Who set the spend going (schema/cause): the person or system at the root of the
	// delegation chain, its accountable person (for an agent acting on its own, the
	// agent's owner), and the chain's depth (0: the initiator's own spend).
	DimInitiator      = "initiator"
	DimInitiatorOwner = "initiator_owner"
	DimChainDepth     = "chain_depth"
)

// costDims maps a dimension to its expression over a cost read's rows (latestRollup:
// the bucket is read as hour). A day is the start of the day its hours fall in (UTC,
// the column's zone), and a day row's bucket is its day's start.
var costDims = map[string]string{
	DimOwner: "owner_id",
	DimAgent: "agent_id",
	DimRoom:  "room_id",
	DimModel: "model",
	DimHour:  "hour",
	DimDay:   "toStartOfDay(hour)",

	DimInitiator:      "initiator_id",
	DimInitiatorOwner: "initiator_owner",
	DimChainDepth:     "chain_depth",
}

// dimNames lists the dimensions for errors.
const dimNames = "owner, agent, room, model, hour, day, initiator, initiator_owner, chain_depth"

// Cost limits: an attribution table is for people, not for export.
const (
	DefaultCostLimit = 1000
	MaxCostLimit     = 10000
)

// CostQuery asks for token usage and cost of one organization, summed over
// [From, To) and grouped by the dimensions in GroupBy (none: one row per currency).
// The rollup's finest grain is the hour, so the range is widened to whole hours: From
// is rounded down and To up to the hour.
type CostQuery struct {
	OrgID    string
	From, To time.Time
	GroupBy  []string // subset of the Dim* dimensions
	Filter   CostFilter
	Limit    int // 0: DefaultCostLimit
}

// CostFilter keeps usage of any of the given owners, agents, rooms, models, initiators,
// initiators' owners and chain depths (an empty list: any).
type CostFilter struct {
	OwnerIDs, AgentIDs, RoomIDs, Models []string
	InitiatorIDs, InitiatorOwnerIDs     []string
	ChainDepths                         []int
	// CrossOwner keeps only the usage of agents whose owner is not the initiator's
	// accountable person: spend one owner's requests caused on another owner's agents
	// (a system initiator, which has no accountable person, is not another owner).
	CrossOwner bool
}

// MaxChainDepth is the deepest chain a filter may ask for (the column is a UInt16).
const MaxChainDepth = 1<<16 - 1

// MaxFilterValues bounds each list of a CostFilter.
const MaxFilterValues = 100

func (f CostFilter) validate() []error {
	var errs []error
	for _, l := range []struct {
		field string
		vals  []string
	}{{"filter.owner_ids", f.OwnerIDs}, {"filter.agent_ids", f.AgentIDs}, {"filter.room_ids", f.RoomIDs}, {"filter.models", f.Models},
		{"filter.initiator_ids", f.InitiatorIDs}, {"filter.initiator_owner_ids", f.InitiatorOwnerIDs}} {
		if len(l.vals) > MaxFilterValues {
			errs = append(errs, fieldErr(l.field, "%d values; at most %d", len(l.vals), MaxFilterValues))
			continue
		}
		for i, v := range l.vals {
			if v == "" || len(v) > 256 {
				errs = append(errs, fieldErr(l.field, "value %d must be 1 to 256 bytes, got %d", i, len(v)))
			}
		}
	}
	if len(f.ChainDepths) > MaxFilterValues {
		errs = append(errs, fieldErr("filter.chain_depths", "%d values; at most %d", len(f.ChainDepths), MaxFilterValues))
	} else {
		for i, d := range f.ChainDepths {
			if d < 0 || d > MaxChainDepth {
				errs = append(errs, fieldErr("filter.chain_depths", "value %d must be 0 to %d, got %d", i, MaxChainDepth, d))
			}
		}
	}
	return errs
}

// add appends the filter's conditions to w.
func (f CostFilter) add(w *where) {
	for _, l := range []struct {
		col  string
		vals []string
	}{{"owner_id", f.OwnerIDs}, {"agent_id", f.AgentIDs}, {"room_id", f.RoomIDs}, {"model", f.Models},
		{"initiator_id", f.InitiatorIDs}, {"initiator_owner", f.InitiatorOwnerIDs}} {
		if len(l.vals) > 0 {
			w.add("has(?, "+l.col+")", l.vals)
		}
	}
	if f.CrossOwner {
		w.add("owner_id != initiator_owner AND initiator_owner != ''")
	}
	if len(f.ChainDepths) > 0 {
		depths := make([]uint16, len(f.ChainDepths))
		for i, d := range f.ChainDepths {
			depths[i] = uint16(d) // validated
		}
		w.add("has(?, chain_depth)", depths)
	}
}

// Validate reports every problem of the query at once, each naming its field.
func (q CostQuery) Validate() error {
	errs := checkOrg(nil, q.OrgID)
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
			errs = append(errs, fieldErr("group_by", "unknown dimension %q (want one of %s)", d, dimNames))
		case seen[d]:
			errs = append(errs, fieldErr("group_by", "dimension %q given twice", d))
		}
		seen[d] = true
	}
	errs = append(errs, q.tableErrs("group_by")...)
	if q.Limit < 0 || q.Limit > MaxCostLimit {
		errs = append(errs, fieldErr("limit", "must be between 1 and %d, got %d", MaxCostLimit, q.Limit))
	}
	errs = append(errs, q.Filter.validate()...)
	return errors.Join(errs...)
}

// CostRow is one group. Only the fields of the grouped dimensions are set; Currency is
// always a key, since amounts in different currencies cannot be added.
type CostRow struct {
	OwnerID, AgentID, RoomID, Model string
	InitiatorID, InitiatorOwnerID   string
	ChainDepth                      uint16
	Hour, Day                       time.Time // UTC
	Events, UnpricedEvents          uint64
	Tokens                          Tokens          // of every event
	UnpricedTokens                  Tokens          // of the unpriced events
	Cost                            decimal.Decimal // of the priced events; exact, 6 decimals in the table
	Currency                        string
}

// CostReport is the answer to a CostQuery: the rows (at most Limit; Truncated when
// there were more), the totals of everything the range and filter select (one per
// currency) and the unpriced usage by model.
type CostReport struct {
	Rows      []CostRow
	Truncated bool
	Totals    []CostRow // only Currency and the sums are set
	Unpriced  []CostRow // only Model and the sums are set
	// Repricing lists the reprice jobs overlapping the range (widened to whole hours)
	// that have not repriced all of it: while one is queued or running the figures are
	// provisional (some days at the new prices, the rest at the old; each hour wholly at
	// one or the other); a failed or cancelled one left the days from its cursor on at
	// their old prices. Empty when the figures are final.
	Repricing []RepriceJob
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

// rollupTable is a rollup a cost read takes its rows from (schema/store): the cost
// rollup, grouped by owner, agent, room and model, or the initiator rollup, grouped by
// owner, model and who set the spend going.
type rollupTable struct {
	name, group string
	dims        []string // the dimensions it has, besides hour and day
}

var (
	costRollup      = rollupTable{"usage_rollup", store.RollupGroup, []string{DimOwner, DimAgent, DimRoom, DimModel}}
	initiatorRollup = rollupTable{"initiator_rollup", store.InitiatorGroup,
		[]string{DimOwner, DimModel, DimInitiator, DimInitiatorOwner, DimChainDepth}}
)

// table is the rollup that q reads: the initiator rollup when it groups or filters by
// who set the spend going, else the cost rollup.
func (q *CostQuery) table() rollupTable {
	f := &q.Filter
	if len(f.InitiatorIDs) > 0 || len(f.InitiatorOwnerIDs) > 0 || len(f.ChainDepths) > 0 || f.CrossOwner {
		return initiatorRollup
	}
	for _, d := range q.GroupBy {
		if d == DimInitiator || d == DimInitiatorOwner || d == DimChainDepth {
			return initiatorRollup
		}
	}
	return costRollup
}

// tableErrs refuses what the rollup q reads does not hold: the initiator rollup keeps
// owner and model, not agent and room. field names the grouping (group_by, split).
func (q *CostQuery) tableErrs(field string) []error {
	t := q.table()
	if t.name != initiatorRollup.name {
		return nil
	}
	var errs []error
	for _, d := range q.GroupBy {
		if d != DimHour && d != DimDay && !slices.Contains(t.dims, d) {
			errs = append(errs, fieldErr(field, "%s cannot be combined with initiator, initiator_owner, chain_depth or a filter on them: "+
				"spend by initiator is kept by owner and model only (delegation gives an execution's agents)", d))
		}
	}
	if len(q.Filter.AgentIDs) > 0 || len(q.Filter.RoomIDs) > 0 {
		errs = append(errs, fieldErr("filter", "agent_ids and room_ids cannot be combined with initiator, initiator_owner, chain_depth or a filter on them"))
	}
	return errs
}

// readCols are the columns a cost read takes from t, after the bucket (read as hour,
// so that costDims apply to hours and days alike).
func (t rollupTable) readCols() string { return t.group + ", " + readSums }

const readSums = "currency, events, unpriced_events, input_tokens, output_tokens," +
	" cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens, unpriced_output_tokens," +
	" unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost"

// latestRollup is a subquery (alias rollup) over usage_rollup: each group's newest row
// among those w selects, with bucket read as hour and then cols. Every reprice or
// replay rewrites a group with a higher version, so its newest row is its current one,
// whether or not a merge has collapsed the older ones yet. w must select by key columns
// only (org_id, grain, bucket and the dimensions), which every version of a group
// shares: a condition on a value would pick among the versions instead.
//
// A read of one organization sorts what it selects (ORDER BY version DESC LIMIT 1 BY
// the key): its cost grows with those rows, and the parts of the table read in
// parallel. FINAL (bulk) merges every selected part in key order in one stream, with
// buffers per part, but holds no more than a block of rows at a time: for a read over
// every organization, whose rows would not fit a sort.
func latestRollup(db string, t rollupTable, cols string, w *where, bulk bool) string {
	if bulk {
		return "(SELECT bucket AS hour, " + cols + " FROM " + db + "." + t.name + " FINAL WHERE " + w.String() + ") AS rollup"
	}
	return "(SELECT bucket AS hour, " + cols + " FROM " + db + "." + t.name + " WHERE " + w.String() +
		" ORDER BY version DESC LIMIT 1 BY grain, bucket, " + t.group + ") AS rollup"
}

// rollupRange adds to w the rows of usage_rollup that [from, to) (whole hours) covers:
// the hours of the range, by the hour (hourly, or a range without a whole day);
// otherwise the whole days and only the hours at either edge, so that a month reads
// some 14 times fewer rows.
func rollupRange(w *where, from, to time.Time, hourly bool) {
	firstDay, lastDay := from.Truncate(24*time.Hour), to.Truncate(24*time.Hour)
	if firstDay.Before(from) {
		firstDay = firstDay.Add(24 * time.Hour)
	}
	if hourly || !firstDay.Before(lastDay) {
		w.add("grain = 'hour' AND bucket >= ? AND bucket < ?", from, to)
		return
	}
	w.add("((grain = 'day' AND bucket >= ? AND bucket < ?) OR (grain = 'hour' AND ((bucket >= ? AND bucket < ?) OR (bucket >= ? AND bucket < ?))))",
		firstDay, lastDay, from, firstDay, lastDay, to)
}

// from is the FROM clause of a cost read, with its arguments: the organization, the
// filter and extra (conditions on key columns), over [From, To) widened to whole
// hours, from usage_rollup (rollupRange, latestRollup).
func (s costsSQL) from(hourly bool, extra func(*where)) (string, []any) {
	w := &where{}
	w.add("org_id = ?", s.q.OrgID)
	s.q.Filter.add(w)
	if extra != nil {
		extra(w)
	}
	rollupRange(w, s.q.From.UTC().Truncate(time.Hour), ceilHour(s.q.To), hourly)
	t := s.q.table()
	return latestRollup(s.db, t, t.readCols(), w, false), w.args
}

// byHour says whether the read groups by the hour (only the hour rows have it).
func (s costsSQL) byHour() bool { return slices.Contains(s.q.GroupBy, DimHour) }

// sums are the aggregates every cost read selects, after its keys (costRow scans them).
const sums = "sum(events) AS total_events, sum(unpriced_events) AS total_unpriced," +
	" sum(input_tokens) AS total_input, sum(output_tokens) AS total_output," +
	" sum(cache_read_tokens) AS total_cache_read, sum(cache_write_tokens) AS total_cache_write," +
	" sum(reasoning_tokens) AS total_reasoning," +
	" sum(unpriced_input_tokens) AS total_u_input, sum(unpriced_output_tokens) AS total_u_output," +
	" sum(unpriced_cache_read_tokens) AS total_u_cache_read, sum(unpriced_cache_write_tokens) AS total_u_cache_write," +
	" sum(unpriced_reasoning_tokens) AS total_u_reasoning, sum(cost) AS total_cost"

// totalsSQL sums the whole selection per currency.
func (s costsSQL) totalsSQL() (string, []any) {
	src, args := s.from(false, nil)
	return "SELECT currency, " + sums + " FROM " + src +
		" GROUP BY currency HAVING total_events > 0 ORDER BY currency", args
}

// unpricedSQL sums the unpriced usage of the selection per model.
func (s costsSQL) unpricedSQL() (string, []any) {
	// The grouping is not the selection's: without a filter on who set it going, the
	// unpriced usage by model is read from the cost rollup, whose rows are fewer.
	s.q.GroupBy = nil
	src, args := s.from(false, nil)
	return "SELECT model, " + sums + " FROM " + src +
		" GROUP BY model HAVING total_unpriced > 0 ORDER BY total_unpriced DESC, model LIMIT " + fmt.Sprint(MaxUnpricedModels), args
}

// MaxUnpricedModels bounds the models a CostReport lists as unpriced.
const MaxUnpricedModels = 100

func (s costsSQL) toSQL() (string, []any) {
	var keys []string
	for _, d := range s.q.GroupBy {
		keys = append(keys, costDims[d])
	}
	src, args := s.from(s.byHour(), nil)

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
	b.WriteString("currency, " + sums)
	b.WriteString(" FROM " + src)
	b.WriteString(" GROUP BY " + strings.Join(append(keys, "currency"), ", "))
	// A rebuild overwrites a group that lost all its events with zeros; those are
	// dropped after the sum. A condition on events inside the subquery, before each
	// group's newest row is picked, would let an older non-zero version through;
	// HAVING on the sum is correct everywhere.
	b.WriteString(" HAVING total_events > 0")
	b.WriteString(" ORDER BY " + strings.Join(order, ", "))
	fmt.Fprintf(&b, " LIMIT %d", limit+1) // one more tells Truncated
	return b.String(), args
}

// Costs sums usage of q.OrgID from the rollup (usage_rollup): the groups, their totals
// and the unpriced usage by model.
func (qr *Querier) Costs(ctx context.Context, q CostQuery) (CostReport, error) {
	if err := q.Validate(); err != nil {
		return CostReport{}, err
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultCostLimit
	}
	// The reprice jobs of the range are read while the rows are (a round trip less);
	// they are read when the rows start, so a job that was running then is listed.
	type jobs struct {
		list []RepriceJob
		err  error
	}
	jobsc := make(chan jobs, 1)
	go func() {
		list, err := qr.repricing(ctx, q.OrgID, q.From.UTC().Truncate(time.Hour), ceilHour(q.To))
		jobsc <- jobs{list, err}
	}()
	s := costsSQL{db: qr.db, q: q}
	sql, args := s.toSQL()
	rows, err := qr.costRows(ctx, q, sql, args, q.GroupBy, true)
	if err != nil {
		return CostReport{}, err // the buffered channel lets the jobs read end
	}
	rep := CostReport{Rows: rows}
	if len(rep.Rows) > limit {
		rep.Rows, rep.Truncated = rep.Rows[:limit], true
	}
	// Rows that are all the groups sum to the totals, and, grouped by model, to the
	// unpriced usage by model: no second read then.
	if rep.Truncated {
		sql, args = s.totalsSQL()
		if rep.Totals, err = qr.costRows(ctx, q, sql, args, nil, true); err != nil {
			return CostReport{}, err
		}
	} else {
		rep.Totals = sumBy(rep.Rows, func(r *CostRow) (string, CostRow) { return r.Currency, CostRow{Currency: r.Currency} })
		slices.SortFunc(rep.Totals, func(a, b CostRow) int { return strings.Compare(a.Currency, b.Currency) })
	}
	if rep.Truncated || !slices.Contains(q.GroupBy, DimModel) {
		sql, args = s.unpricedSQL()
		if rep.Unpriced, err = qr.costRows(ctx, q, sql, args, []string{DimModel}, false); err != nil {
			return CostReport{}, err
		}
	} else {
		rep.Unpriced = sumBy(rep.Rows, func(r *CostRow) (string, CostRow) { return r.Model, CostRow{Model: r.Model} })
		rep.Unpriced = slices.DeleteFunc(rep.Unpriced, func(r CostRow) bool { return r.UnpricedEvents == 0 })
		slices.SortStableFunc(rep.Unpriced, func(a, b CostRow) int {
			if a.UnpricedEvents != b.UnpricedEvents {
				return cmp.Compare(b.UnpricedEvents, a.UnpricedEvents)
			}
			return strings.Compare(a.Model, b.Model)
		})
		rep.Unpriced = rep.Unpriced[:min(len(rep.Unpriced), MaxUnpricedModels)]
	}
	j := <-jobsc
	if j.err != nil {
		return CostReport{}, j.err
	}
	rep.Repricing = j.list
	return rep, nil
}

// sumBy sums rows per the key group gives each (and the row of only its key fields),
// in the order the keys first appear; totalsSQL and unpricedSQL sum the same way.
func sumBy(rows []CostRow, group func(*CostRow) (string, CostRow)) []CostRow {
	out := []CostRow{}
	at := map[string]int{}
	for i := range rows {
		r := &rows[i]
		k, proto := group(r)
		j, ok := at[k]
		if !ok {
			j, at[k] = len(out), len(out)
			proto.Cost = decimal.Zero
			out = append(out, proto)
		}
		o := &out[j]
		o.Events += r.Events
		o.UnpricedEvents += r.UnpricedEvents
		o.Tokens = o.Tokens.Add(r.Tokens)
		o.UnpricedTokens = o.UnpricedTokens.Add(r.UnpricedTokens)
		o.Cost = o.Cost.Add(r.Cost)
	}
	return out
}

// costRows runs a cost read whose columns are the keys of dims, then currency when
// the read has it, then sums.
func (qr *Querier) costRows(ctx context.Context, q CostQuery, sql string, args []any, dims []string, currency bool) ([]CostRow, error) {
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot query costs of org %q from %s.usage_rollup", q.OrgID, qr.db))
	}
	defer rows.Close()
	out := []CostRow{}
	for rows.Next() {
		var r CostRow
		dest := make([]any, 0, len(dims)+14)
		for _, d := range dims {
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
			case DimInitiator:
				dest = append(dest, &r.InitiatorID)
			case DimInitiatorOwner:
				dest = append(dest, &r.InitiatorOwnerID)
			case DimChainDepth:
				dest = append(dest, &r.ChainDepth)
			}
		}
		if currency {
			dest = append(dest, &r.Currency)
		}
		t, u := &r.Tokens, &r.UnpricedTokens
		dest = append(dest, &r.Events, &r.UnpricedEvents, &t.Input, &t.Output, &t.CacheRead, &t.CacheWrite, &t.Reasoning,
			&u.Input, &u.Output, &u.CacheRead, &u.CacheWrite, &u.Reasoning, &r.Cost)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("cannot read costs of org %q from %s.usage_rollup: %w", q.OrgID, qr.db, err)
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
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read costs of org %q from %s.usage_rollup", q.OrgID, qr.db))
	}
	return out, nil
}
