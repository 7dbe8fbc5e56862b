package dual_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/store"
)

// The cost reads of usage_rollup (whole days and edge hours without FINAL) equal a
// direct aggregate of usage FINAL, the raw facts, for every grouping and range shape:
// on simulated traffic with three days of usage before it, after a late event lands on
// a day rolled up already and a reprice moves an event to another agent and model,
// and after a replay of a day's usage. Each pair is compared in the recorded run on
// 18.16; the replay then compares every one of those reads on 18.16 and on 26.9, so
// the two agree on both engines.
func TestIntegrationCorpusDailyRollupIsExact(t *testing.T) {
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	loadSimulated(t, rec, 1500)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := &corpusDaily{t: t, ctx: ctx, rec: rec, db: db, q: query.New(rec, db), st: store.New(rec, db)}
	var first, last time.Time
	require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT any(org_id), min(time), max(time) FROM "+db+".usage WHERE org_id != ''").
		Scan(&d.org, &first, &last))
	require.NotEmpty(t, d.org, "the simulation's usage")
	d.day0, d.end = first.UTC().Truncate(24*time.Hour), last.UTC().Add(time.Minute)

	d.history()
	d.check("loaded")
	d.lateEvents()
	d.check("after a late event and a reprice that re-attributes a day")
	d.replay()
	d.check("after a replay")

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d cost reads compared with usage FINAL; %d steps replayed on %s", d.compared, len(steps), other.Name())
}

type corpusDaily struct {
	t        *testing.T
	ctx      context.Context
	rec      *dual.Recorder
	db       string
	q        *query.Querier
	st       *store.Store
	org      string
	day0     time.Time // the simulation's first day
	end      time.Time // after its last usage
	rows     []store.UsageRow
	compared int
}

// Groups of the usage added before the simulation: two owners, their agents, two
// rooms, a priced model in USD, one in EUR, and one without a price.
var dailyModels = []struct {
	name, currency string
	micros         int64
}{{"gpt-5-mini", "USD", 1_250}, {"eu-model", "EUR", 3_000}, {"daily-mystery", "USD", 0}}

// history adds usage on the three days before the simulation, on hours that are a
// range's edges (the first and last of a day) and inside it, and rolls it up.
func (d *corpusDaily) history() {
	var hours []store.HourKey
	n := 0
	for day := 3; day >= 1; day-- {
		for _, h := range []int{0, 1, 5, 11, 17, 22, 23} {
			for i := range 3 + h%4 {
				m := dailyModels[(n+day)%len(dailyModels)]
				at := d.day0.Add(-time.Duration(day)*24*time.Hour + time.Duration(h)*time.Hour + time.Duration(i*7)*time.Minute)
				d.rows = append(d.rows, store.UsageRow{EventID: fmt.Sprintf("daily-%d-%d-%d", day, h, i), Time: at, OrgID: d.org,
					OwnerID: fmt.Sprintf("daily-owner-%d", n%2), AgentID: fmt.Sprintf("daily-agent-%d", n%3), RoomID: fmt.Sprintf("daily-room-%d", n%2),
					Model: m.name, InputTokens: uint64(100 + n), OutputTokens: uint64(10 + n%7), CacheReadTokens: uint64(n % 5),
					CacheWriteTokens: uint64(n % 3), Reasoning: uint64(n % 11), CostMicros: m.micros * int64(1+n%4), Currency: m.currency,
					Priced: m.micros > 0, CatalogVersion: "corpus", Version: 1, Chain: dailyChain(n)})
				hours = append(hours, store.HourKey{OrgID: d.org, Hour: at.Truncate(time.Hour)})
				n++
			}
		}
	}
	require.NoError(d.t, d.st.InsertUsage(d.ctx, d.rows))
	require.NoError(d.t, d.st.RefreshRollup(d.ctx, hours))
}

// dailyChain is the n-th history row's chain: three initiators (two people, one of
// whom is another owner's, and a schedule), at depths 0 to 2.
func dailyChain(n int) store.Chain {
	switch n % 3 {
	case 0:
		return store.Chain{InitiatorID: "daily-person-0", InitiatorType: "user", InitiatorOwner: "daily-person-0", Depth: uint16(n % 2), Link: "inferred"}
	case 1:
		return store.Chain{InitiatorID: "daily-person-1", InitiatorType: "user", InitiatorOwner: "daily-person-1", Depth: uint16(1 + n%2), Link: "explicit"}
	}
	return store.Chain{InitiatorID: "schedule", InitiatorType: "system", Depth: 1, Link: "explicit"}
}

// lateEvents writes, after their days were rolled up, a new event on the second day
// before the simulation, and the first event of the third day again with a higher
// version: re-attributed to another owner and agent and repriced onto another model,
// so that its old group must leave the hour and the day.
func (d *corpusDaily) lateEvents() {
	late := d.rows[0]
	late.EventID, late.Time = "daily-late", d.day0.Add(-2*24*time.Hour+13*time.Hour+30*time.Minute)
	moved := d.rows[0]
	moved.OwnerID, moved.AgentID, moved.Model, moved.Currency = "daily-owner-late", "daily-agent-late", "gpt-5-mini", "USD"
	moved.CostMicros, moved.Priced, moved.Version = 77_000, true, 2
	// and re-linked, as a late trigger does, to another initiator and depth
	moved.Chain = store.Chain{InitiatorID: "daily-person-late", InitiatorType: "user", InitiatorOwner: "daily-person-late", Depth: 3, Link: "explicit"}
	require.NoError(d.t, d.st.InsertUsage(d.ctx, []store.UsageRow{late, moved}))
	require.NoError(d.t, d.st.RefreshRollup(d.ctx, []store.HourKey{{OrgID: d.org, Hour: late.Time.Truncate(time.Hour)},
		{OrgID: d.org, Hour: moved.Time.Truncate(time.Hour)}}))
}

// replay stores the last day's usage again, as a redelivered batch (same rows, same
// versions, another part), and rebuilds its hours again: nothing may change.
func (d *corpusDaily) replay() {
	var again []store.UsageRow
	var hours []store.HourKey
	for _, r := range d.rows[1:] {
		if r.Time.Truncate(24 * time.Hour).Equal(d.day0.Add(-24 * time.Hour)) {
			again = append(again, r)
			hours = append(hours, store.HourKey{OrgID: d.org, Hour: r.Time.Truncate(time.Hour)})
		}
	}
	require.NotEmpty(d.t, again)
	require.NoError(d.t, d.st.BatchInsert(d.ctx, &store.Batch{Usage: again}))
	require.NoError(d.t, d.st.RefreshRollup(d.ctx, hours))
}

// check compares the cost reads of every range shape and grouping with usage FINAL.
func (d *corpusDaily) check(when string) {
	day := 24 * time.Hour
	ranges := []struct {
		name     string
		from, to time.Time
	}{
		{"whole days and edge hours", d.day0.Add(-3*day + 5*time.Hour + 17*time.Minute), d.end},
		{"whole days", d.day0.Add(-3 * day), d.day0},
		{"a whole day and an edge", d.day0.Add(-3 * day), d.day0.Add(-day + 13*time.Hour)},
		{"two partial days", d.day0.Add(-2*day + 20*time.Hour), d.day0.Add(-day + 4*time.Hour)},
		{"hours of one day", d.day0.Add(-2*day + 3*time.Hour), d.day0.Add(-2*day + 15*time.Hour)},
	}
	groupings := [][]string{nil, {query.DimDay}, {query.DimHour}, {query.DimAgent, query.DimModel}, {query.DimOwner, query.DimRoom},
		{query.DimModel}, {query.DimDay, query.DimOwner, query.DimAgent, query.DimRoom, query.DimModel},
		{query.DimInitiator}, {query.DimInitiatorOwner, query.DimChainDepth}, {query.DimDay, query.DimInitiator, query.DimModel}, {query.DimOwner, query.DimInitiatorOwner}}
	filter := query.CostFilter{AgentIDs: []string{"daily-agent-1", "daily-agent-late"}, Models: []string{"gpt-5-mini", "daily-mystery"}}
	byInitiator := query.CostFilter{InitiatorIDs: []string{"daily-person-1", "daily-person-late", "schedule"}, ChainDepths: []int{1, 3},
		InitiatorOwnerIDs: []string{"daily-person-1", "daily-person-late"}}
	for _, r := range ranges {
		for _, g := range groupings {
			d.compare(when, r.name, query.CostQuery{OrgID: d.org, From: r.from, To: r.to, GroupBy: g, Limit: query.MaxCostLimit})
		}
		d.compare(when, r.name+", filtered", query.CostQuery{OrgID: d.org, From: r.from, To: r.to, Filter: filter,
			GroupBy: []string{query.DimAgent, query.DimModel}, Limit: query.MaxCostLimit})
		d.compare(when, r.name+", filtered by initiator", query.CostQuery{OrgID: d.org, From: r.from, To: r.to, Filter: byInitiator,
			GroupBy: []string{query.DimInitiator, query.DimChainDepth}, Limit: query.MaxCostLimit})
		d.compareSeries(when, r.name, r.from, r.to)
		d.compareUnpriced(when, r.name, r.from, r.to)
	}
}

// rawDims are the cost dimensions over usage.
var rawDims = map[string]string{query.DimOwner: "owner_id", query.DimAgent: "agent_id", query.DimRoom: "room_id",
	query.DimModel: "model", query.DimHour: "toStartOfHour(time) AS raw_hour", query.DimDay: "toStartOfDay(time) AS raw_day",
	query.DimInitiator: "initiator_id", query.DimInitiatorOwner: "initiator_owner", query.DimChainDepth: "chain_depth"}

// direct sums usage FINAL of [from, to) widened to whole hours, as Costs does, grouped by
// dims and currency, with f's conditions. Through the Recorder: the replay compares it
// on both engines.
func (d *corpusDaily) direct(from, to time.Time, dims []string, f query.CostFilter) []query.CostRow {
	var keys, group []string
	for _, dim := range dims {
		keys = append(keys, rawDims[dim])
		e, _, _ := strings.Cut(rawDims[dim], " AS ")
		group = append(group, e)
	}
	conds, args := "org_id = ? AND time >= ? AND time < ?", []any{d.org, from.UTC().Truncate(time.Hour), ceilToHour(to)}
	for _, l := range []struct {
		col  string
		vals []string
	}{{"agent_id", f.AgentIDs}, {"model", f.Models}, {"initiator_id", f.InitiatorIDs}, {"initiator_owner", f.InitiatorOwnerIDs}} {
		if len(l.vals) > 0 {
			conds += " AND has(?, " + l.col + ")"
			args = append(args, l.vals)
		}
	}
	if len(f.ChainDepths) > 0 {
		depths := make([]string, len(f.ChainDepths))
		for i, depth := range f.ChainDepths {
			depths[i] = fmt.Sprint(depth)
		}
		conds += " AND chain_depth IN (" + strings.Join(depths, ", ") + ")"
	}
	sql := "SELECT " + strings.Join(append(keys, "currency"), ", ") + ", count(), countIf(priced = 0)," +
		" sum(input_tokens), sum(output_tokens), sum(cache_read_tokens), sum(cache_write_tokens), sum(reasoning_tokens)," +
		" sumIf(input_tokens, priced = 0), sumIf(output_tokens, priced = 0), sumIf(cache_read_tokens, priced = 0)," +
		" sumIf(cache_write_tokens, priced = 0), sumIf(reasoning_tokens, priced = 0), sum(cost)" +
		" FROM " + d.db + ".usage FINAL WHERE " + conds + " GROUP BY " + strings.Join(append(group, "currency"), ", ")
	rows, err := d.rec.Query(d.ctx, sql, args...)
	require.NoError(d.t, err)
	defer rows.Close()
	var out []query.CostRow
	for rows.Next() {
		var r query.CostRow
		var dest []any
		for _, dim := range dims {
			switch dim {
			case query.DimOwner:
				dest = append(dest, &r.OwnerID)
			case query.DimAgent:
				dest = append(dest, &r.AgentID)
			case query.DimRoom:
				dest = append(dest, &r.RoomID)
			case query.DimModel:
				dest = append(dest, &r.Model)
			case query.DimHour:
				dest = append(dest, &r.Hour)
			case query.DimDay:
				dest = append(dest, &r.Day)
			case query.DimInitiator:
				dest = append(dest, &r.InitiatorID)
			case query.DimInitiatorOwner:
				dest = append(dest, &r.InitiatorOwnerID)
			case query.DimChainDepth:
				dest = append(dest, &r.ChainDepth)
			}
		}
		t, u := &r.Tokens, &r.UnpricedTokens
		dest = append(dest, &r.Currency, &r.Events, &r.UnpricedEvents, &t.Input, &t.Output, &t.CacheRead, &t.CacheWrite, &t.Reasoning,
			&u.Input, &u.Output, &u.CacheRead, &u.CacheWrite, &u.Reasoning, &r.Cost)
		require.NoError(d.t, rows.Scan(dest...))
		out = append(out, r)
	}
	require.NoError(d.t, rows.Err())
	return out
}

func ceilToHour(t time.Time) time.Time {
	t = t.UTC()
	if h := t.Truncate(time.Hour); !h.Equal(t) {
		return h.Add(time.Hour)
	}
	return t
}

// costLines renders rows as sorted lines, one per group, every sum included.
func costLines(rows []query.CostRow) []string {
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		hour, day := "", ""
		if !r.Hour.IsZero() {
			hour = r.Hour.UTC().Format(time.RFC3339)
		}
		if !r.Day.IsZero() {
			day = r.Day.UTC().Format(time.RFC3339)
		}
		out = append(out, fmt.Sprintf("%s|%s|%s|%s|%s|%s|%d|%s|%s|%s events=%d unpriced=%d tokens=%+v unpriced_tokens=%+v cost=%s",
			r.OwnerID, r.AgentID, r.RoomID, r.Model, r.InitiatorID, r.InitiatorOwnerID, r.ChainDepth, hour, day, r.Currency, r.Events, r.UnpricedEvents, r.Tokens, r.UnpricedTokens,
			r.Cost.StringFixed(6)))
	}
	slices.Sort(out)
	return out
}

func (d *corpusDaily) compare(when, shape string, q query.CostQuery) {
	d.t.Helper()
	rep, err := d.q.Costs(d.ctx, q)
	require.NoError(d.t, err)
	require.False(d.t, rep.Truncated)
	want := d.direct(q.From, q.To, q.GroupBy, q.Filter)
	require.NotEmpty(d.t, want, "%s, %s by %v: usage to compare", when, shape, q.GroupBy)
	assert.Equal(d.t, costLines(want), costLines(rep.Rows), "%s, %s by %v", when, shape, q.GroupBy)
	totals := map[string]query.CostRow{}
	for _, r := range want {
		tot := totals[r.Currency]
		tot.Currency, tot.Events, tot.UnpricedEvents = r.Currency, tot.Events+r.Events, tot.UnpricedEvents+r.UnpricedEvents
		tot.Tokens, tot.UnpricedTokens, tot.Cost = tot.Tokens.Add(r.Tokens), tot.UnpricedTokens.Add(r.UnpricedTokens), tot.Cost.Add(r.Cost)
		totals[r.Currency] = tot
	}
	var wantTotals []query.CostRow
	for _, tot := range totals {
		wantTotals = append(wantTotals, tot)
	}
	assert.Equal(d.t, costLines(wantTotals), costLines(rep.Totals), "%s, %s by %v: totals", when, shape, q.GroupBy)
	d.compared++
}

// compareSeries checks the daily and hourly series of the range, split by model, by
// initiator and by chain depth, against usage FINAL per bucket and split value.
func (d *corpusDaily) compareSeries(when, shape string, from, to time.Time) {
	d.t.Helper()
	for _, split := range []string{query.DimModel, query.DimInitiator, query.DimChainDepth} {
		for _, interval := range []string{query.DimDay, query.DimHour} {
			d.compareSplit(when, shape, from, to, interval, split)
		}
	}
}

func (d *corpusDaily) compareSplit(when, shape string, from, to time.Time, interval, split string) {
	d.t.Helper()
	series, err := d.q.UsageSeries(d.ctx, query.SeriesQuery{OrgID: d.org, From: from, To: to, Interval: interval, Split: split, Limit: query.MaxSeriesLimit})
	require.NoError(d.t, err)
	var got []string
	for _, s := range series {
		for _, p := range s.Points {
			if p.Events > 0 {
				got = append(got, fmt.Sprintf("%s %s %s events=%d unpriced=%d tokens=%+v cost=%s", s.Key, s.Currency,
					p.Time.UTC().Format(time.RFC3339), p.Events, p.UnpricedEvents, p.Tokens, p.Cost.StringFixed(6)))
			}
		}
	}
	slices.Sort(got)
	var want []string
	for _, r := range d.direct(from, to, []string{interval, split}, query.CostFilter{}) {
		at := r.Hour
		if interval == query.DimDay {
			at = r.Day
		}
		key := map[string]string{query.DimModel: r.Model, query.DimInitiator: r.InitiatorID, query.DimChainDepth: fmt.Sprint(r.ChainDepth)}[split]
		// A daily bucket sums the hours of its day that the range holds.
		want = append(want, fmt.Sprintf("%s %s %s events=%d unpriced=%d tokens=%+v cost=%s", key, r.Currency,
			at.UTC().Format(time.RFC3339), r.Events, r.UnpricedEvents, r.Tokens, r.Cost.StringFixed(6)))
	}
	slices.Sort(want)
	assert.Equal(d.t, want, got, "%s, %s: series by %s split by %s", when, shape, interval, split)
}

// compareUnpriced checks UnpricedModels of the range against usage FINAL: events and
// tokens per model, and the first and last hour with unpriced usage.
func (d *corpusDaily) compareUnpriced(when, shape string, from, to time.Time) {
	d.t.Helper()
	models, truncated, err := d.q.UnpricedModels(d.ctx, d.org, from, to, 0)
	require.NoError(d.t, err)
	require.False(d.t, truncated)
	var got []string
	for _, m := range models {
		got = append(got, fmt.Sprintf("%s events=%d tokens=%+v first=%s last=%s", m.Model, m.Events, m.Tokens,
			m.FirstSeen.Format(time.RFC3339), m.LastSeen.Format(time.RFC3339)))
	}
	slices.Sort(got)
	byHour := d.direct(from, to, []string{query.DimHour, query.DimModel}, query.CostFilter{})
	type seen struct {
		events      uint64
		tokens      query.Tokens
		first, last time.Time
	}
	per := map[string]*seen{}
	for _, r := range byHour {
		if r.UnpricedEvents == 0 {
			continue
		}
		s := per[r.Model]
		if s == nil {
			s = &seen{first: r.Hour, last: r.Hour}
			per[r.Model] = s
		}
		s.events += r.UnpricedEvents
		s.tokens = s.tokens.Add(r.UnpricedTokens)
		if r.Hour.Before(s.first) {
			s.first = r.Hour
		}
		if r.Hour.After(s.last) {
			s.last = r.Hour
		}
	}
	var want []string
	for m, s := range per {
		want = append(want, fmt.Sprintf("%s events=%d tokens=%+v first=%s last=%s", m, s.events, s.tokens,
			s.first.UTC().Format(time.RFC3339), s.last.UTC().Format(time.RFC3339)))
	}
	slices.Sort(want)
	assert.Equal(d.t, want, got, "%s, %s: unpriced models", when, shape)
}
