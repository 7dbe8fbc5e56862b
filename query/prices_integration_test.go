package query_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// UnpricedModels reads usage_rollup (whole days as day rows, the edges and the first
// and last days' hours as hour rows), per organization or for the platform.
func TestIntegrationUnpricedModels(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx := context.Background()
	st := store.New(conn, db)
	q := query.New(conn, db)
	base := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	var rows []store.UsageRow
	add := func(id, org, model string, at time.Duration, priced bool) {
		r := store.UsageRow{EventID: id, Time: base.Add(at), OrgID: org, AgentID: "a", Model: model, InputTokens: 10, OutputTokens: 5,
			CacheReadTokens: 2, Currency: "USD", Priced: priced, Version: 1}
		if priced {
			r.CostMicros = 100
		}
		rows = append(rows, r)
	}
	add("p1", "acme", "gpt-5", 30*time.Hour, true) // priced: not listed
	add("x1", "acme", "mystery", 27*time.Hour+10*time.Minute, false)
	add("x2", "acme", "mystery", 3*24*time.Hour+5*time.Hour, false)
	add("x3", "acme", "mystery", 5*24*time.Hour+20*time.Hour+59*time.Minute, false)
	add("u1", "acme", "unknown", 2*time.Hour, false) // on the range's first, partial day
	add("u2", "acme", "unknown", 2*time.Hour+30*time.Minute, false)
	add("g1", "globex", "other", 48*time.Hour, false)
	add("n1", "", "unknown", 50*time.Hour, false)
	require.NoError(t, st.InsertUsage(ctx, rows))
	var hours []store.HourKey
	for _, r := range rows {
		hours = append(hours, store.HourKey{OrgID: r.OrgID, Hour: r.Time.Truncate(time.Hour)})
	}
	require.NoError(t, st.RefreshRollup(ctx, hours))

	from, to := base.Add(90*time.Minute), base.Add(7*24*time.Hour) // a partial first day, whole days after
	got, truncated, err := q.UnpricedModels(ctx, "acme", from, to, 0)
	require.NoError(t, err)
	assert.False(t, truncated)
	require.Len(t, got, 2)
	assert.Equal(t, query.UnpricedModel{Model: "mystery", Events: 3, Tokens: query.Tokens{Input: 30, Output: 15, CacheRead: 6},
		FirstSeen: base.Add(27 * time.Hour), LastSeen: base.Add(5*24*time.Hour + 20*time.Hour)}, got[0], "hours, though read from whole days")
	assert.Equal(t, query.UnpricedModel{Model: "unknown", Events: 2, Tokens: query.Tokens{Input: 20, Output: 10, CacheRead: 4},
		FirstSeen: base.Add(2 * time.Hour), LastSeen: base.Add(2 * time.Hour)}, got[1])

	got, truncated, err = q.UnpricedModels(ctx, "acme", from, to, 1)
	require.NoError(t, err)
	assert.True(t, truncated)
	require.Len(t, got, 1)
	assert.Equal(t, "mystery", got[0].Model)

	// A range inside one day reads the hours only.
	got, _, err = q.UnpricedModels(ctx, "acme", base, base.Add(3*time.Hour), 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, uint64(2), got[0].Events)

	got, _, err = q.UnpricedModels(ctx, "globex", from, to, 0)
	require.NoError(t, err)
	require.Len(t, got, 1, "an organization sees its own models only")
	assert.Equal(t, "other", got[0].Model)

	got, _, err = q.UnpricedModels(ctx, query.PlatformOrg, from, to, 0)
	require.NoError(t, err)
	models := map[string]uint64{}
	for _, m := range got {
		models[m.Model] = m.Events
	}
	assert.Equal(t, map[string]uint64{"mystery": 3, "unknown": 3, "other": 1}, models, "the platform: every organization, unattributed usage included")

	// A reprice that priced the mystery model's rows: it disappears.
	for i := range rows {
		if rows[i].Model == "mystery" {
			rows[i].Priced, rows[i].CostMicros, rows[i].Version = true, 5, 2
		}
	}
	require.NoError(t, st.InsertUsage(ctx, rows))
	require.NoError(t, st.RefreshRollup(ctx, hours))
	got, _, err = q.UnpricedModels(ctx, "acme", from, to, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "unknown", got[0].Model)

	for _, c := range []struct {
		org      string
		from, to time.Time
		limit    int
		want     string
	}{
		{"", from, to, 0, "org_id: required"},
		{"acme", time.Time{}, to, 0, "from: required"},
		{"acme", to, from, 0, "to: must be after from"},
		{"acme", base, base.Add(401 * 24 * time.Hour), 0, "more than 400"},
		{"acme", from, to, -1, "limit: must be between 1 and 1000"},
		{"acme", from, to, 1001, "limit"},
	} {
		_, _, err := q.UnpricedModels(ctx, c.org, c.from, c.to, c.limit)
		assert.True(t, errors.Is(err, schema.ErrInvalid), "%+v", c)
		assert.ErrorContains(t, err, c.want)
	}
	_, _, err = q.UnpricedModels(ctx, "acme'; DROP TABLE usage; --", from, to, 0)
	assert.NoError(t, err, "an org id is a bound argument, never SQL")
}

// CostReport.Repricing names the reprice jobs overlapping the answer that have not
// repriced all of it.
func TestIntegrationCostsRepricing(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx := context.Background()
	st := store.New(conn, db)
	q := query.New(conn, db)
	base := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	job := func(id, org, state string, from, to, cursor time.Time, requested time.Duration) {
		require.NoError(t, st.InsertJob(ctx, store.JobRow{ID: id, OrgID: org, Kind: "reprice", From: from, To: to, State: state, Cursor: cursor,
			DaysTotal: uint32(to.Sub(from) / day), RequestedAt: base.Add(requested), CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1}))
	}
	job("queued-acme", "acme", "queued", base, base.Add(3*day), time.Time{}, 0)
	job("running-all", "*", "running", base.Add(5*day), base.Add(6*day), base.Add(5*day+12*time.Hour), time.Hour)
	job("done-acme", "acme", "done", base.Add(10*day), base.Add(12*day), base.Add(12*day), 2*time.Hour)
	job("queued-globex", "globex", "queued", base, base.Add(30*day), time.Time{}, 3*time.Hour)
	job("failed-acme", "acme", "failed", base.Add(20*day), base.Add(25*day), base.Add(22*day), 4*time.Hour)
	job("cancelled-acme", "acme", "cancelled", base.Add(26*day), base.Add(28*day), base.Add(28*day), 5*time.Hour) // got to its end
	job("failed-then-redone", "acme", "failed", base.Add(40*day), base.Add(45*day), base.Add(41*day), 6*time.Hour)
	job("redo", "*", "done", base.Add(39*day), base.Add(46*day), base.Add(46*day), 7*time.Hour)
	// A job's newer state replaces its older one: queued then done is done.
	require.NoError(t, st.InsertJob(ctx, store.JobRow{ID: "was-queued", OrgID: "acme", Kind: "reprice", From: base, To: base.Add(day), State: "queued",
		RequestedAt: base, CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1}))
	require.NoError(t, st.InsertJob(ctx, store.JobRow{ID: "was-queued", OrgID: "acme", Kind: "reprice", From: base, To: base.Add(day), State: "done",
		RequestedAt: base, CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1<<63 | 2}))

	ids := func(from, to time.Time) []string {
		t.Helper()
		rep, err := q.Costs(ctx, query.CostQuery{OrgID: "acme", From: from, To: to})
		require.NoError(t, err)
		out := []string{}
		for _, j := range rep.Repricing {
			out = append(out, j.ID+":"+j.State)
		}
		return out
	}
	assert.Equal(t, []string{"queued-acme:queued"}, ids(base, base.Add(day)))
	assert.Equal(t, []string{"running-all:running"}, ids(base.Add(4*day), base.Add(5*day+time.Hour)), "a job of every organization counts")
	assert.Equal(t, []string{}, ids(base.Add(3*day), base.Add(5*day)), "ranges that touch do not overlap")
	assert.Equal(t, []string{}, ids(base.Add(10*day), base.Add(12*day)), "a done job: final")
	assert.Equal(t, []string{"failed-acme:failed"}, ids(base.Add(19*day), base.Add(30*day)), "failed at its cursor; the cancelled one had finished its range")
	assert.Equal(t, []string{}, ids(base.Add(20*day), base.Add(22*day)), "the failed job repriced this part before it stopped")
	assert.Equal(t, []string{}, ids(base.Add(40*day), base.Add(45*day)), "a later done job redid the failed one's remainder")
	// A later done job of one agent does not redo an organization-wide job's remainder.
	job("failed-org-wide", "acme", "failed", base.Add(70*day), base.Add(75*day), base.Add(71*day), 8*time.Hour)
	require.NoError(t, st.InsertJob(ctx, store.JobRow{ID: "redo-one-agent", OrgID: "acme", AgentID: "a-1", Kind: "reprice", From: base.Add(69 * day),
		To: base.Add(76 * day), State: "done", Cursor: base.Add(76 * day), RequestedAt: base.Add(9 * time.Hour), CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1}))
	assert.Equal(t, []string{"failed-org-wide:failed"}, ids(base.Add(70*day), base.Add(75*day)))
	rep, err := q.Costs(ctx, query.CostQuery{OrgID: "acme", From: base, To: base.Add(60 * day)})
	require.NoError(t, err)
	var got []string
	for _, j := range rep.Repricing {
		got = append(got, j.ID)
		if j.ID == "running-all" {
			assert.True(t, j.Provisional())
			assert.Equal(t, base.Add(5*day+12*time.Hour), j.Cursor)
		}
		if j.ID == "failed-acme" {
			assert.False(t, j.Provisional())
		}
	}
	assert.Equal(t, "queued-acme running-all failed-acme", strings.Join(got, " "), "oldest request first; never another organization's")
}
