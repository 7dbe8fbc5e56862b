package query_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

func TestIntegrationCostsAndAudit(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Keep every insert in its own part, so a replay is still a separate row when the
	// queries run and only FINAL can collapse it.
	for _, table := range []string{"events", "usage", "usage_hourly", "usage_rollup"} {
		require.NoError(t, conn.Exec(ctx, "SYSTEM STOP MERGES "+db+"."+table))
	}
	st := store.New(conn, db)
	q := query.New(conn, db)

	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	usage := func(id string, at time.Duration, owner, agent, room, model string, in, out uint64, micros int64, priced bool, version uint64) store.UsageRow {
		return store.UsageRow{EventID: id, Time: base.Add(at), OrgID: "org-a", OwnerID: owner, AgentID: agent, RoomID: room,
			Model: model, InputTokens: in, OutputTokens: out, CostMicros: micros, Currency: "USD", Priced: priced, Version: version}
	}
	u1 := usage("u1", 5*time.Minute, "o1", "a1", "r1", "m1", 100, 50, 1234, true, 1)
	u2 := usage("u2", 40*time.Minute, "o1", "a2", "r1", "m2", 200, 20, 2_000_000, true, 1)
	u2.CacheReadTokens, u2.CacheWriteTokens, u2.Reasoning = 5, 6, 7
	u3 := usage("u3", 70*time.Minute, "o2", "a3", "r2", "unknown", 10, 10, 0, false, 1)
	u4 := usage("u4", 23*time.Hour, "o1", "a1", "r1", "m1", 1, 0, 1, true, 1)
	other := usage("ub", 5*time.Minute, "o9", "a9", "r9", "m1", 1000, 1000, 9_000_000, true, 1)
	other.OrgID = "org-b"

	ev := func(id, typ string, at time.Duration, room, actor string) store.EventRow {
		return store.EventRow{ID: id, Type: typ, Time: base.Add(at), OrgID: "org-a", RoomID: room, ActorID: actor,
			ActorType: "agent", Data: `{"id":"` + id + `"}`, SchemaVersion: 1, IngestedAt: base.Add(time.Hour)}
	}
	events := []store.EventRow{
		ev("e1", "message.posted", 0, "r1", "a1"),
		ev("e2", "tool.called", time.Second+100*time.Millisecond, "r1", "a2"),
		ev("e3", "message.posted", time.Second+100*time.Millisecond, "r2", "a1"), // same (time, time_ms) as e2: id breaks the tie
		ev("e4", "usage.reported", time.Second+900*time.Millisecond, "r1", "a1"),
		ev("e5", "message.posted", time.Hour, "r1", "a3"),
	}
	eb := ev("eb", "message.posted", time.Second, "r9", "a9")
	eb.OrgID = "org-b"

	batch := &store.Batch{Events: append(append([]store.EventRow{}, events...), eb), Usage: []store.UsageRow{u1, u2, u3, u4, other}}
	require.NoError(t, st.BatchInsert(ctx, batch))
	// A replay: Kafka redelivers u1 and e2 after a crash, in a later batch (another part).
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{events[1]}, Usage: []store.UsageRow{u1}}))
	hours := []store.HourKey{{OrgID: "org-a", Hour: base}, {OrgID: "org-a", Hour: base.Add(time.Hour)},
		{OrgID: "org-a", Hour: base.Add(23 * time.Hour)}, {OrgID: "org-b", Hour: base}}
	require.NoError(t, st.RefreshRollup(ctx, hours))
	// The rollup is rebuilt again after the replay, as the consumer would: it must not add.
	require.NoError(t, st.RefreshRollup(ctx, hours))

	day := query.CostQuery{OrgID: "org-a", From: base, To: base.Add(24 * time.Hour)}
	total := func() query.CostRow {
		t.Helper()
		rep, err := q.Costs(ctx, day)
		require.NoError(t, err)
		require.Len(t, rep.Rows, 1)
		require.False(t, rep.Truncated)
		require.Len(t, rep.Totals, 1)
		require.True(t, rep.Totals[0].Cost.Equal(rep.Rows[0].Cost), "totals equal the single row")
		return rep.Rows[0]
	}
	got := total()
	want := query.CostRow{Events: 4, UnpricedEvents: 1, Tokens: query.Tokens{Input: 311, Output: 80, CacheRead: 5,
		CacheWrite: 6, Reasoning: 7}, UnpricedTokens: query.Tokens{Input: 10, Output: 10}, Currency: "USD"}
	require.Equal(t, "2.001235", got.Cost.StringFixed(6))
	got.Cost = want.Cost
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("total before reprice (-want +got):\n%s", diff)
	}
	before, err := q.Costs(ctx, day)
	require.NoError(t, err)
	require.Len(t, before.Unpriced, 1)
	require.Equal(t, "unknown", before.Unpriced[0].Model)
	require.Equal(t, uint64(1), before.Unpriced[0].UnpricedEvents)
	require.Equal(t, query.Tokens{Input: 10, Output: 10}, before.Unpriced[0].UnpricedTokens)
	// Grouped by model and not cut, the totals and the unpriced usage come from the
	// rows, without another read: the same as the reads give.
	derived := day
	derived.GroupBy = []string{"model", "agent"}
	fromRows, err := q.Costs(ctx, derived)
	require.NoError(t, err)
	require.Equal(t, before.Unpriced, fromRows.Unpriced)
	require.Len(t, fromRows.Totals, 1)
	require.Equal(t, before.Totals[0].Cost.StringFixed(6), fromRows.Totals[0].Cost.StringFixed(6))
	require.Equal(t, before.Totals[0].Tokens, fromRows.Totals[0].Tokens)
	require.Equal(t, before.Totals[0].UnpricedEvents, fromRows.Totals[0].UnpricedEvents)

	// Reprice u3 onto a real model: its group (model "unknown") is overwritten with zeros
	// by the rebuild and must disappear, not linger as a stale version.
	u3p := usage("u3", 70*time.Minute, "o2", "a3", "r2", "m3", 10, 10, 500, true, 2)
	require.NoError(t, st.InsertUsage(ctx, []store.UsageRow{u3p}))
	require.NoError(t, st.RefreshRollup(ctx, []store.HourKey{{OrgID: "org-a", Hour: base.Add(time.Hour)}}))
	rep, err := q.Costs(ctx, day)
	require.NoError(t, err)
	require.Equal(t, []query.CostRow{}, rep.Unpriced, "no unpriced usage is left after the reprice")
	got = total()
	require.Equal(t, "2.001735", got.Cost.StringFixed(6))
	require.Equal(t, uint64(4), got.Events)
	require.Equal(t, uint64(0), got.UnpricedEvents)

	type keyed struct {
		Key    string
		Events uint64
		Cost   string
	}
	costs := func(cq query.CostQuery, key func(query.CostRow) string) []keyed {
		t.Helper()
		rep, err := q.Costs(ctx, cq)
		require.NoError(t, err)
		out := []keyed{}
		for _, r := range rep.Rows {
			out = append(out, keyed{key(r), r.Events, r.Cost.StringFixed(6)})
		}
		return out
	}
	check := func(name string, want, got []keyed) {
		t.Helper()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	byModel := day
	byModel.GroupBy = []string{"model"}
	check("by model", []keyed{{"m2", 1, "2.000000"}, {"m1", 2, "0.001235"}, {"m3", 1, "0.000500"}},
		costs(byModel, func(r query.CostRow) string { return r.Model }))

	byDay := day
	byDay.To = base.Add(48 * time.Hour)
	byDay.GroupBy = []string{"day"}
	check("by day", []keyed{{"2025-03-01T00:00:00Z", 3, "2.001734"}, {"2025-03-02T00:00:00Z", 1, "0.000001"}},
		costs(byDay, func(r query.CostRow) string { return r.Day.Format(time.RFC3339) }))

	byHourAgent := day
	byHourAgent.GroupBy = []string{"hour", "owner", "agent"}
	byHourAgent.Limit = 3
	check("by hour, owner, agent", []keyed{
		{"2025-03-01T10:00:00Z o1 a2", 1, "2.000000"},
		{"2025-03-01T10:00:00Z o1 a1", 1, "0.001234"},
		{"2025-03-01T11:00:00Z o2 a3", 1, "0.000500"},
	}, costs(byHourAgent, func(r query.CostRow) string { return r.Hour.Format(time.RFC3339) + " " + r.OwnerID + " " + r.AgentID }))

	// [10:30, 11:01) widens to the hours 10:00 and 11:00.
	partial := query.CostQuery{OrgID: "org-a", From: base.Add(30 * time.Minute), To: base.Add(61 * time.Minute), GroupBy: []string{"room"}}
	check("widened range by room", []keyed{{"r1", 2, "2.001234"}, {"r2", 1, "0.000500"}},
		costs(partial, func(r query.CostRow) string { return r.RoomID }))

	otherOrg := day
	otherOrg.OrgID = "org-b"
	check("org-b only sees its own", []keyed{{"", 1, "9.000000"}}, costs(otherOrg, func(query.CostRow) string { return "" }))

	// A range of whole days reads the daily rollup: the same sums as the hours'.
	threeDays := query.CostQuery{OrgID: "org-a", From: base.Add(-10 * time.Hour), To: base.Add(62 * time.Hour)}
	viaDays, err := q.Costs(ctx, threeDays)
	require.NoError(t, err)
	threeDays.GroupBy = []string{"hour"}
	viaHours, err := q.Costs(ctx, threeDays)
	require.NoError(t, err)
	var hourly query.CostRow
	for _, r := range viaHours.Rows {
		hourly.Events += r.Events
		hourly.UnpricedEvents += r.UnpricedEvents
		hourly.Tokens = hourly.Tokens.Add(r.Tokens)
		hourly.Cost = hourly.Cost.Add(r.Cost)
	}
	require.Len(t, viaDays.Rows, 1)
	require.Equal(t, hourly.Events, viaDays.Rows[0].Events)
	require.Equal(t, hourly.Tokens, viaDays.Rows[0].Tokens)
	require.Equal(t, hourly.Cost.StringFixed(6), viaDays.Rows[0].Cost.StringFixed(6), "the repriced group is zero in the days too")
	var dailyRows uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage_rollup FINAL WHERE grain = 'day' AND org_id = 'org-a' AND events > 0").Scan(&dailyRows))
	require.NotZero(t, dailyRows)
	stale, err := st.StaleDays(ctx, base.Add(-48*time.Hour))
	require.NoError(t, err)
	require.Empty(t, stale, "every day was rebuilt after its hours")
	// A stop between the hours and the days (here: usage_rollup lost, days and hours):
	// found, and rebuilt with the hours.
	stacktest.Truncate(t, conn, db, "usage_rollup")
	stale, err = st.StaleDays(ctx, base.Add(-48*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.DayKey{{OrgID: "org-a", Day: base.Truncate(24 * time.Hour)}, {OrgID: "org-a", Day: base.Truncate(24 * time.Hour).Add(24 * time.Hour)},
		{OrgID: "org-b", Day: base.Truncate(24 * time.Hour)}}, stale)
	for _, d := range stale {
		require.NoError(t, st.RefreshDays(ctx, d.OrgID, []time.Time{d.Day}))
	}
	again, err := q.Costs(ctx, query.CostQuery{OrgID: "org-a", From: base.Add(-10 * time.Hour), To: base.Add(62 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, viaDays.Rows[0].Cost.StringFixed(6), again.Rows[0].Cost.StringFixed(6))

	// A row cap says so, and the totals still cover everything.
	capped := byModel
	capped.Limit = 1
	rep, err = q.Costs(ctx, capped)
	require.NoError(t, err)
	require.Len(t, rep.Rows, 1)
	require.True(t, rep.Truncated, "3 models, limit 1")
	require.Equal(t, "2.001735", rep.Totals[0].Cost.StringFixed(6))
	rep, err = q.Costs(ctx, byModel)
	require.NoError(t, err)
	require.False(t, rep.Truncated)

	// Filters: some agents, some models.
	filtered := byModel
	filtered.Filter = query.CostFilter{AgentIDs: []string{"a1", "a3"}}
	check("filtered by agent", []keyed{{"m1", 2, "0.001235"}, {"m3", 1, "0.000500"}},
		costs(filtered, func(r query.CostRow) string { return r.Model }))

	// Series: per hour, split by agent, every bucket present.
	series, err := q.UsageSeries(ctx, query.SeriesQuery{OrgID: "org-a", From: base, To: base.Add(3 * time.Hour), Interval: "hour", Split: "agent"})
	require.NoError(t, err)
	require.Len(t, series, 3)
	require.Equal(t, "a2", series[0].Key, "the most expensive first")
	for _, s := range series {
		require.Len(t, s.Points, 3, "%s", s.Key)
	}
	require.Equal(t, uint64(1), series[0].Points[0].Events)
	require.Equal(t, uint64(0), series[0].Points[1].Events)
	_, err = q.UsageSeries(ctx, query.SeriesQuery{OrgID: "org-a", From: base, To: base.Add(10000 * time.Hour), Interval: "hour"})
	require.True(t, errors.Is(err, schema.ErrInvalid), "too many buckets: %v", err)

	_, err = q.Costs(ctx, query.CostQuery{OrgID: "org-a", From: base, To: base, GroupBy: []string{"foo"}})
	require.True(t, errors.Is(err, schema.ErrInvalid), "%v", err)

	// Audit: page two at a time through org-a, newest first, replayed e2 once.
	var ids []string
	var pages int
	aq := query.AuditQuery{OrgID: "org-a", Limit: 2}
	for {
		page, err := q.AuditEvents(ctx, aq)
		require.NoError(t, err)
		pages++
		for _, e := range page.Events {
			ids = append(ids, e.ID)
		}
		if page.NextCursor == "" {
			break
		}
		require.Less(t, pages, 10, "pagination does not end")
		aq.Before = page.NextCursor
	}
	if diff := cmp.Diff([]string{"e5", "e4", "e3", "e2", "e1"}, ids); diff != "" {
		t.Errorf("audit ids (-want +got):\n%s", diff)
	}
	require.Equal(t, 3, pages)

	page, err := q.AuditEvents(ctx, query.AuditQuery{OrgID: "org-a"})
	require.NoError(t, err)
	require.Len(t, page.Events, 5, "the replayed e2 is listed once")
	require.Empty(t, page.NextCursor)

	page, err = q.AuditEvents(ctx, query.AuditQuery{OrgID: "org-a", Types: []string{"message.posted"}, RoomID: "r1"})
	require.NoError(t, err)
	require.Empty(t, page.NextCursor)
	require.Len(t, page.Events, 2)
	first := page.Events[0]
	want5 := query.Event{ID: "e5", Type: "message.posted", Time: base.Add(time.Hour), OrgID: "org-a", RoomID: "r1",
		ActorID: "a3", ActorType: "agent", SchemaVersion: 1, Data: `{"id":"e5"}`, IngestedAt: base.Add(time.Hour)}
	if diff := cmp.Diff(want5, first); diff != "" {
		t.Errorf("newest message in r1 (-want +got):\n%s", diff)
	}
	require.Equal(t, "e1", page.Events[1].ID)

	// Millisecond bounds: [e2/e3's 10:00:01.100, e4's 10:00:01.900) holds e3 and e2 only.
	page, err = q.AuditEvents(ctx, query.AuditQuery{OrgID: "org-a", From: base.Add(1100 * time.Millisecond),
		To: base.Add(1900 * time.Millisecond), ActorID: "a2"})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
	require.Equal(t, "e2", page.Events[0].ID)
	require.Equal(t, base.Add(1100*time.Millisecond), page.Events[0].Time)
	page, err = q.AuditEvents(ctx, query.AuditQuery{OrgID: "org-a", From: base.Add(1100 * time.Millisecond), To: base.Add(1900 * time.Millisecond)})
	require.NoError(t, err)
	require.Len(t, page.Events, 2)

	page, err = q.AuditEvents(ctx, query.AuditQuery{OrgID: "org-b"})
	require.NoError(t, err)
	require.Len(t, page.Events, 1)
	require.Equal(t, "eb", page.Events[0].ID)
}
