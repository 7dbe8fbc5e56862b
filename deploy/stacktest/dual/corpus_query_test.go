package dual_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/work"
)

// Every read of query/ (costs with each grouping and range shape, totals and unpriced
// usage, reprice jobs, series, unpriced models, audit pages with each filter and
// cursor, decisions, contact requests, chatty agents, agents, rooms, names, work status
// and the live hub's tasks in progress) on simulated traffic loaded through the real
// pipeline, plus the few rows the simulator does not produce (unpriced and non-USD
// usage on the days before, reprice jobs, policy decisions, operator actions, an open
// tool call, a request waiting for a person, a stuck task, a closed room), on 18.16 and
// on 26.9.
func TestIntegrationCorpusQuery(t *testing.T) {
	began := time.Now()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	sum := loadSimulated(t, rec, 2000)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := newCorpusQuery(ctx, t, rec, db, sum)
	c.insertExtras()
	loaded := time.Now()

	c.costs()
	c.series()
	c.unpricedModels()
	c.audit()
	c.decisions()
	c.contacts()
	c.chatty()
	c.directory()
	c.work()
	queried := time.Now()

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps; load %s, queries %s, replay %s", len(steps), loaded.Sub(began).Round(time.Millisecond),
		queried.Sub(loaded).Round(time.Millisecond), time.Since(queried).Round(time.Millisecond))
}

// corpusQuery is the scenario: the organization of the simulation's chattiest agent,
// with realistic arguments taken from its data.
type corpusQuery struct {
	t    *testing.T
	ctx  context.Context
	conn driver.Conn // not recorded: only to find the data's extent
	db   string
	q    *query.Querier
	st   *store.Store

	orgs        []string
	org         string      // the chattiest agent's organization
	agent       query.Agent // the chattiest agent
	otherAgent  string      // an agent of another organization
	user        string      // the agent's owner, a person of org
	room        string      // the room where the agent spent the most
	first, last time.Time   // org's first and last simulated event
	day0        time.Time   // the day of first
	now         time.Time   // the scenario's clock: after every event of org
	ingestedAt  time.Time   // of the rows inserted directly

	decided, denied, throttled int       // policy decisions of the agent inserted
	decidedAt                  time.Time // the clock they were inserted by: each is minutes before it
}

const (
	mystery      = "mystery-model" // unpriced, in org
	otherMystery = "other-unpriced-model"
	corpusRoom   = "corpus-closed-room"
	corpusTask   = "corpus-task"
	corpusAsk    = "corpus-attention"
	corpusCall   = "corpus-open-call"
	// trickyText holds TSV's escapes, its NULL marker (\N) as text, quotes and UTF-8.
	trickyText = "line one\nline\ttwo, it's \"quoted\", back\\slash, not NULL: \\N, ünïcødé ✓"
	// hostile is a filter value that must stay a bound argument.
	hostile = `x' OR 1 = 1 OR '\` + "\\"
)

func newCorpusQuery(ctx context.Context, t *testing.T, rec *dual.Recorder, db string, sum simulate.Summary) *corpusQuery {
	t.Helper()
	c := &corpusQuery{t: t, ctx: ctx, conn: rec.Conn, db: db, q: query.New(rec, db), st: store.New(rec, db)}
	c.orgs = c.rawStrings("SELECT DISTINCT org_id FROM " + db + ".events WHERE org_id != '' ORDER BY org_id")
	require.Len(t, c.orgs, 3, "the simulation's organizations")
	chatty := sum.ByAgent[sum.ChattyAgent].ID
	require.NotEmpty(t, chatty, "the chattiest agent %q", sum.ChattyAgent)
	for _, org := range c.orgs {
		agents, err := c.q.Agents(ctx, query.AgentQuery{OrgID: org})
		require.NoError(t, err)
		require.NotEmpty(t, agents, "agents of %s", org)
		for _, a := range agents {
			if a.ID == chatty {
				c.org, c.agent = org, a
			}
		}
		if c.otherAgent == "" && !slices.ContainsFunc(agents, func(a query.Agent) bool { return a.ID == chatty }) {
			c.otherAgent = agents[0].ID
		}
	}
	require.NotEmpty(t, c.org, "the chattiest agent %s is in no organization's directory", chatty)
	c.user = c.agent.OwnerID
	require.NotEmpty(t, c.user)

	var first, last, ingested time.Time
	require.NoError(t, c.conn.QueryRow(ctx, "SELECT min(time), max(time), max(ingested_at) FROM "+db+".events WHERE org_id = ?", c.org).
		Scan(&first, &last, &ingested))
	c.first, c.last, c.day0 = first.UTC(), last.UTC(), first.UTC().Truncate(24*time.Hour)
	c.now = c.last.Add(30 * time.Minute)
	// A first audit page reads the rows ingested up to two seconds ago (ingested_at holds
	// whole seconds): the clock must be three past the newest.
	require.Eventually(t, func() bool { return !time.Now().Before(ingested.Add(3 * time.Second)) }, 10*time.Second, 10*time.Millisecond)
	c.ingestedAt = time.Now().UTC().Add(-time.Minute).Truncate(time.Second)

	rep, err := c.q.Costs(ctx, query.CostQuery{OrgID: c.org, From: c.first, To: c.last.Add(time.Second), GroupBy: []string{query.DimRoom},
		Filter: query.CostFilter{AgentIDs: []string{c.agent.ID}}})
	require.NoError(t, err)
	require.NotEmpty(t, rep.Rows, "the chattiest agent's usage")
	c.room = rep.Rows[0].RoomID
	t.Logf("org %s, agent %s (%s), owner %s, room %s, events %s … %s", c.org, c.agent.ID, c.agent.Handle, c.user, c.room,
		c.first.Format(time.RFC3339), c.last.Format(time.RFC3339))
	return c
}

func (c *corpusQuery) rawStrings(sql string, args ...any) []string {
	c.t.Helper()
	rows, err := c.conn.Query(c.ctx, sql, args...)
	require.NoError(c.t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(c.t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(c.t, rows.Err())
	return out
}

// event is an event of org as ingest stores it, ingested a minute before the test's
// queries.
func (c *corpusQuery) event(id, typ string, at time.Time, room, actor, actorType string, data any) store.EventRow {
	b, err := json.Marshal(data)
	require.NoError(c.t, err)
	return store.EventRow{ID: id, Type: typ, Time: at, OrgID: c.org, RoomID: room, ActorID: actor, ActorType: actorType,
		OwnerID: c.user, Source: "corpus", SchemaVersion: 1, Data: string(b), IngestedAt: c.ingestedAt}
}

// insertExtras adds, through the store and so through the Recorder, what the
// simulation lacks.
func (c *corpusQuery) insertExtras() {
	t, ctx := c.t, c.ctx
	day := 24 * time.Hour

	// Usage on the two days before the simulation (an edge hour and a whole day of a
	// range reaching back), unpriced and in another currency, and unpriced usage on the
	// simulation's first day and in another organization.
	usage := func(id string, at time.Time, model, currency string, micros int64, priced bool) store.UsageRow {
		return store.UsageRow{EventID: id, Time: at, OrgID: c.org, OwnerID: c.user, AgentID: c.agent.ID, RoomID: c.room, Model: model,
			InputTokens: 1000, OutputTokens: 200, CacheReadTokens: 30, CacheWriteTokens: 4, Reasoning: 5,
			CostMicros: micros, Currency: currency, Priced: priced, CatalogVersion: "corpus", Version: 1}
	}
	extra := []store.UsageRow{
		usage("corpus-u1", c.day0.Add(-2*day+20*time.Hour+30*time.Minute), mystery, "USD", 0, false),
		usage("corpus-u2", c.day0.Add(-day+5*time.Hour+123*time.Millisecond), mystery, "USD", 0, false),
		usage("corpus-u3", c.day0.Add(-day+6*time.Hour), "gpt-5-mini", "EUR", 1_250_000, true),
		usage("corpus-u4", c.first.Add(10*time.Minute), mystery, "USD", 0, false),
	}
	elsewhere := usage("corpus-u5", c.day0.Add(-day+7*time.Hour), otherMystery, "USD", 0, false)
	elsewhere.OrgID, elsewhere.AgentID = c.otherOrg(), c.otherAgent
	extra = append(extra, elsewhere)
	require.NoError(t, c.st.InsertUsage(ctx, extra))
	var hours []store.HourKey
	for _, u := range extra {
		hours = append(hours, store.HourKey{OrgID: u.OrgID, Hour: u.Time.Truncate(time.Hour)})
	}
	require.NoError(t, c.st.RefreshRollup(ctx, hours))

	// Reprice jobs: unfinished, failed inside the ranges read, done, and far away.
	job := func(id, org, state string, from, to, cursor time.Time, requested time.Duration) {
		require.NoError(t, c.st.InsertJob(ctx, store.JobRow{ID: id, OrgID: org, Kind: "reprice", From: from, To: to, State: state,
			Cursor: cursor, DaysTotal: uint32(to.Sub(from) / day), RequestedBy: "corpus", RequestedAt: c.first.Add(requested),
			CostBefore: decimal.Zero, CostAfter: decimal.Zero, Version: 1}))
	}
	job("job-queued", c.org, "queued", c.day0.Add(-day), c.day0.Add(day), time.Time{}, 0)
	job("job-running", query.PlatformOrg, "running", c.day0, c.day0.Add(day), c.day0.Add(12*time.Hour), time.Hour)
	job("job-failed", c.org, "failed", c.day0.Add(-3*day), c.day0, c.day0.Add(-2*day), 2*time.Hour)
	job("job-done", c.org, "done", c.day0.Add(-day), c.day0, c.day0, 3*time.Hour)
	job("job-cancelled", c.org, "cancelled", c.day0.Add(-10*day), c.day0.Add(-8*day), c.day0.Add(-9*day), 4*time.Hour)

	// Policy decisions about the agent within the last hour, and operator actions.
	now := time.Now().UTC().Truncate(time.Millisecond)
	c.decidedAt = now
	decision := func(id string, ago time.Duration, name string, allow bool, code string) store.EventRow {
		d := api.DecidedData{Decision: name, Allow: allow, PolicyRevision: "corpus-rev", InputDigest: "00",
			Input: json.RawMessage(`{"agent_id":"` + c.agent.ID + `"}`)}
		if code != "" {
			d.Reasons = []policy.Reason{{Code: code, Message: "corpus " + code}}
			d.RetryAfterMs = 1500
		}
		r := c.event(id, schema.TypePolicyDecided, now.Add(-ago), c.room, c.agent.ID, "agent", d)
		r.Source = api.SourcePolicy
		c.decided++
		if !allow {
			c.denied++
			if name == "send_message" && (code == "rate_limited" || code == "budget_exceeded") {
				c.throttled++
			}
		}
		return r
	}
	operator := func(id, typ string, ago time.Duration) store.EventRow {
		r := c.event(id, typ, now.Add(-ago), "", "key-operator", "system", api.OperatorData{Reason: "corpus", KeyName: "operator"})
		r.SubjectID, r.SubjectType, r.Source = c.agent.ID, "agent", api.SourcePolicy
		return r
	}
	events := []store.EventRow{
		decision("corpus-d1", 20*time.Minute, "send_message", false, "rate_limited"),
		decision("corpus-d2", 19*time.Minute, "send_message", false, "budget_exceeded"),
		decision("corpus-d3", 18*time.Minute+250*time.Millisecond, "send_message", true, ""),
		decision("corpus-d4", 17*time.Minute, "add_participant", false, "not_peer"),
		decision("corpus-d5", 16*time.Minute, "peer_visible", true, ""),
		decision("corpus-d6", 15*time.Minute, "contact_request", false, "already_contacts"),
		operator("corpus-s1", schema.TypeAgentSuspended, 3*time.Hour),
		operator("corpus-s2", schema.TypeAgentResumed, 2*time.Hour),
		operator("corpus-s3", schema.TypeAgentSuspended, 10*time.Minute),
	}

	// Work after the simulation's last event: a tool call without a result, a room
	// added and deleted, a task in progress nobody touches, a request for the owner's
	// attention nobody answers.
	after := func(d time.Duration) time.Time { return c.last.Add(d) }
	events = append(events,
		c.event("corpus-call", schema.TypeToolCall, after(2*time.Minute), c.room, c.agent.ID, "agent",
			schema.ToolCallData{ToolName: "deploy", ToolCallID: corpusCall}),
		c.event("corpus-room-added", schema.TypeRoomAdded, after(3*time.Minute), corpusRoom, c.agent.ID, "agent",
			schema.RoomData{Title: "Corpus Room"}),
		c.event("corpus-room-deleted", schema.TypeRoomDeleted, after(4*time.Minute), corpusRoom, c.user, "user", schema.RoomData{}),
		c.event("corpus-task-created", schema.TypeTaskCreated, after(5*time.Minute), c.room, c.user, "user",
			schema.TaskData{TaskID: corpusTask, Title: "Ship the corpus", Status: "open", Assignee: c.agent.ID}),
		c.event("corpus-task-updated", schema.TypeTaskUpdated, after(6*time.Minute+500*time.Millisecond), c.room, c.user, "user",
			schema.TaskData{TaskID: corpusTask, Title: "Ship the corpus", Status: "in_progress", Assignee: c.agent.ID}),
		// After its task's update, which would have closed it.
		c.event(corpusAsk, schema.TypeAttention, after(7*time.Minute), c.room, c.agent.ID, "agent",
			schema.MessageData{Content: "@owner may I deploy?", Mentions: []schema.Mention{{ID: c.agent.ID}, {ID: c.user, Handle: "owner"}}}),
		// Text that every layer has to carry unchanged.
		c.event("corpus-message", schema.TypeMessageCreated, after(8*time.Minute), c.room, c.agent.ID, "agent",
			schema.MessageData{Content: trickyText}),
	)
	require.NoError(t, c.st.BatchInsert(ctx, &store.Batch{Events: events}))
	// A replay of some of them, in another part.
	require.NoError(t, c.st.BatchInsert(ctx, &store.Batch{Events: events[:2]}))
}

func (c *corpusQuery) otherOrg() string {
	for _, o := range c.orgs {
		if o != c.org {
			return o
		}
	}
	c.t.Fatal("one organization only")
	return ""
}

// Range shapes of cost reads.
func (c *corpusQuery) hourlyRange() (time.Time, time.Time) {
	from := c.first.Truncate(time.Hour).Add(7 * time.Minute)
	return from, from.Add(3 * time.Hour)
}

// dailyRange starts on a partial day (an edge hour with usage) two days before the
// simulation and ends on a partial hour after it: whole days from usage_daily.
func (c *corpusQuery) dailyRange() (time.Time, time.Time) {
	return c.day0.Add(-28*time.Hour + 15*time.Minute), c.last.Add(77 * time.Minute)
}

func (c *corpusQuery) wholeDays() (time.Time, time.Time) {
	return c.day0.Add(-24 * time.Hour), c.day0.Add(48 * time.Hour)
}

func eventsByCurrency(rows []query.CostRow) map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range rows {
		out[r.Currency] += r.Events
	}
	return out
}

func (c *corpusQuery) costs() {
	t, ctx := c.t, c.ctx
	from, to := c.dailyRange()
	daily := query.CostQuery{OrgID: c.org, From: from, To: to}
	rep, err := c.q.Costs(ctx, daily)
	require.NoError(t, err)
	require.Len(t, rep.Rows, 2, "one row per currency: %+v", rep.Rows)
	total := eventsByCurrency(rep.Rows)
	require.Equal(t, uint64(1), total["EUR"])
	require.Greater(t, total["USD"], uint64(50))
	require.Len(t, rep.Unpriced, 1)
	assert.Equal(t, mystery, rep.Unpriced[0].Model)
	assert.Equal(t, uint64(3), rep.Unpriced[0].UnpricedEvents)
	var jobs []string
	for _, j := range rep.Repricing {
		jobs = append(jobs, j.ID+":"+j.State)
	}
	assert.Equal(t, []string{"job-queued:queued", "job-running:running", "job-failed:failed"}, jobs)

	// Every grouping over the range reaching back through the daily rollup sums to the
	// same; by hour it reads the hourly rollup only.
	for _, groupBy := range [][]string{{query.DimHour}, {query.DimDay}, {query.DimOwner}, {query.DimAgent}, {query.DimRoom},
		{query.DimModel}, {query.DimModel, query.DimAgent}, {query.DimDay, query.DimOwner, query.DimRoom, query.DimModel, query.DimAgent}} {
		q := daily
		q.GroupBy = groupBy
		rep, err := c.q.Costs(ctx, q)
		require.NoError(t, err, "%v", groupBy)
		require.False(t, rep.Truncated, "%v", groupBy)
		assert.Equal(t, total, eventsByCurrency(rep.Rows), "grouped by %v", groupBy)
		assert.Equal(t, total, eventsByCurrency(rep.Totals), "totals grouped by %v", groupBy)
		require.Len(t, rep.Unpriced, 1, "%v", groupBy)
		if slices.Contains(groupBy, query.DimDay) {
			days := map[time.Time]bool{}
			for _, r := range rep.Rows {
				days[r.Day] = true
			}
			assert.GreaterOrEqual(t, len(days), 3, "the edge day, the whole day before and the simulation's")
		}
	}

	// Cut: the totals and the unpriced usage are read apart.
	cut := daily
	cut.GroupBy, cut.Limit = []string{query.DimAgent, query.DimModel}, 2
	rep, err = c.q.Costs(ctx, cut)
	require.NoError(t, err)
	require.True(t, rep.Truncated)
	require.Len(t, rep.Rows, 2)
	assert.Equal(t, total, eventsByCurrency(rep.Totals))
	require.Len(t, rep.Unpriced, 1)

	// Inside a few hours (hourly rollup only), with filters.
	hFrom, hTo := c.hourlyRange()
	for _, q := range []query.CostQuery{
		{OrgID: c.org, From: hFrom, To: hTo},
		{OrgID: c.org, From: hFrom, To: hTo, GroupBy: []string{query.DimDay, query.DimRoom}},
		{OrgID: c.org, From: hFrom, To: hTo, GroupBy: []string{query.DimHour, query.DimModel},
			Filter: query.CostFilter{AgentIDs: []string{c.agent.ID}, RoomIDs: []string{c.room}}},
	} {
		rep, err := c.q.Costs(ctx, q)
		require.NoError(t, err)
		assert.NotEmpty(t, rep.Rows, "%+v", q)
	}
	// Whole days only, filtered by owner and model.
	wFrom, wTo := c.wholeDays()
	rep, err = c.q.Costs(ctx, query.CostQuery{OrgID: c.org, From: wFrom, To: wTo, GroupBy: []string{query.DimOwner, query.DimModel},
		Filter: query.CostFilter{OwnerIDs: []string{c.user}, Models: []string{mystery, "gpt-5-mini"}}})
	require.NoError(t, err)
	require.NotEmpty(t, rep.Rows)
	for _, r := range rep.Rows {
		assert.Equal(t, c.user, r.OwnerID)
	}
	rep, err = c.q.Costs(ctx, query.CostQuery{OrgID: c.org, From: from, To: to, GroupBy: []string{query.DimAgent},
		Filter: query.CostFilter{AgentIDs: []string{hostile}, Models: []string{hostile, mystery}}})
	require.NoError(t, err)
	assert.Empty(t, rep.Rows)
	// Nothing long before; the other organizations.
	rep, err = c.q.Costs(ctx, query.CostQuery{OrgID: c.org, From: c.day0.Add(-400 * 24 * time.Hour), To: c.day0.Add(-300 * 24 * time.Hour)})
	require.NoError(t, err)
	assert.Empty(t, rep.Rows)
	for _, org := range c.orgs {
		if org == c.org {
			continue
		}
		rep, err := c.q.Costs(ctx, query.CostQuery{OrgID: org, From: from, To: to, GroupBy: []string{query.DimAgent}})
		require.NoError(t, err)
		assert.NotEmpty(t, rep.Rows, org)
	}
}

func (c *corpusQuery) series() {
	t, ctx := c.t, c.ctx
	from, to := c.dailyRange()
	hFrom, hTo := c.hourlyRange()
	wFrom, wTo := c.wholeDays()
	for _, q := range []query.SeriesQuery{
		{OrgID: c.org, From: hFrom, To: hTo, Interval: query.DimHour, Split: query.DimAgent, Limit: 3},
		{OrgID: c.org, From: from, To: to, Interval: query.DimDay, Split: query.DimModel},
		{OrgID: c.org, From: from, To: to, Interval: query.DimDay},
		{OrgID: c.org, From: from, To: to, Interval: query.DimHour, Split: query.DimOwner, Filter: query.CostFilter{Models: []string{mystery, "gpt-5-mini"}}},
		{OrgID: c.org, From: wFrom, To: wTo, Interval: query.DimDay, Split: query.DimRoom, Filter: query.CostFilter{AgentIDs: []string{c.agent.ID}}},
	} {
		series, err := c.q.UsageSeries(ctx, q)
		require.NoError(t, err, "%+v", q)
		require.NotEmpty(t, series, "%+v", q)
		if q.Limit > 0 {
			assert.LessOrEqual(t, len(series), q.Limit)
		}
		var events uint64
		for _, s := range series {
			require.Len(t, s.Points, len(series[0].Points), "every series has every bucket")
			for _, p := range s.Points {
				events += p.Events
			}
		}
		assert.NotZero(t, events, "%+v", q)
	}
	series, err := c.q.UsageSeries(ctx, query.SeriesQuery{OrgID: c.org, From: c.day0.Add(-400 * 24 * time.Hour), To: c.day0.Add(-399 * 24 * time.Hour),
		Interval: query.DimHour, Split: query.DimModel})
	require.NoError(t, err)
	assert.Empty(t, series)
}

func (c *corpusQuery) unpricedModels() {
	t, ctx := c.t, c.ctx
	from, to := c.dailyRange()
	got, truncated, err := c.q.UnpricedModels(ctx, c.org, from, to, 0)
	require.NoError(t, err)
	assert.False(t, truncated)
	require.Len(t, got, 1)
	assert.Equal(t, query.UnpricedModel{Model: mystery, Events: 3, Tokens: query.Tokens{Input: 3000, Output: 600, CacheRead: 90, CacheWrite: 12, Reasoning: 15},
		FirstSeen: c.day0.Add(-28 * time.Hour), LastSeen: c.first.Add(10 * time.Minute).Truncate(time.Hour)}, got[0],
		"the hours of the first and last day, though read from whole days")

	hFrom, hTo := c.hourlyRange()
	got, _, err = c.q.UnpricedModels(ctx, c.org, hFrom, hTo, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, uint64(1), got[0].Events)

	got, truncated, err = c.q.UnpricedModels(ctx, query.PlatformOrg, from, to, 0)
	require.NoError(t, err)
	assert.False(t, truncated)
	var models []string
	for _, m := range got {
		models = append(models, m.Model)
	}
	assert.Equal(t, []string{mystery, otherMystery}, models)
	got, truncated, err = c.q.UnpricedModels(ctx, query.PlatformOrg, from, to, 1)
	require.NoError(t, err)
	assert.True(t, truncated)
	require.Len(t, got, 1)
}

func eventIDs(events []query.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

func (c *corpusQuery) audit() {
	t, ctx := c.t, c.ctx
	page := func(q query.AuditQuery) query.AuditPage {
		t.Helper()
		p, err := c.q.AuditEvents(ctx, q)
		require.NoError(t, err, "%+v", q)
		return p
	}
	// Pages of 50 (the newest window fills them), then one page of everything (every
	// window of the walk back).
	p1 := page(query.AuditQuery{OrgID: c.org, Limit: 50})
	require.Len(t, p1.Events, 50)
	require.NotEmpty(t, p1.NextCursor)
	p2 := page(query.AuditQuery{OrgID: c.org, Limit: 50, Before: p1.NextCursor})
	require.NotEmpty(t, p2.Events)
	assert.True(t, p2.Events[0].Time.Before(p1.Events[49].Time) || p2.Events[0].Time.Equal(p1.Events[49].Time))
	assert.NotContains(t, eventIDs(p2.Events), p1.Events[49].ID)
	all := page(query.AuditQuery{OrgID: c.org, Limit: 5000})
	assert.Empty(t, all.NextCursor)
	assert.Greater(t, len(all.Events), 600)
	assert.Equal(t, eventIDs(all.Events[:100]), append(eventIDs(p1.Events), eventIDs(p2.Events)...), "pages are the listing's")

	// Each filter.
	from := c.first.Add(30*time.Minute + 123*time.Millisecond)
	for _, q := range []query.AuditQuery{
		{OrgID: c.org, RoomID: c.room, Limit: 20},
		{OrgID: c.org, ActorID: c.agent.ID, Limit: 20},
		{OrgID: c.org, SubjectID: c.agent.ID},
		{OrgID: c.org, ActorID: c.agent.ID, SubjectID: c.agent.ID, Limit: 1000},
		{OrgID: c.org, Types: []string{schema.TypeMessageCreated, schema.TypeToolCall}, Limit: 30},
		{OrgID: c.org, Outcome: "denied"},
		{OrgID: c.org, Outcome: "allowed", Types: []string{schema.TypePolicyDecided}},
		{OrgID: c.org, From: from, To: from.Add(time.Hour + 456*time.Millisecond), Limit: 40},
		{OrgID: c.org, From: from, RoomID: c.room, ActorID: c.agent.ID, Types: []string{schema.TypeMessageCreated}, Limit: 10},
	} {
		p := page(q)
		require.NotEmpty(t, p.Events, "%+v", q)
		for _, e := range p.Events {
			if q.RoomID != "" {
				assert.Equal(t, q.RoomID, e.RoomID)
			}
			if q.ActorID != "" && q.SubjectID == "" {
				assert.Equal(t, q.ActorID, e.ActorID)
			}
			if !q.From.IsZero() {
				assert.False(t, e.Time.Before(q.From), "%s before %s", e.Time, q.From)
			}
		}
		if q.Limit > 0 && p.NextCursor != "" {
			next := q
			next.Before = p.NextCursor
			assert.NotEmpty(t, page(next).Events, "the next page of %+v", q)
		}
	}
	ops := page(query.AuditQuery{OrgID: c.org, SubjectID: c.agent.ID, Types: []string{schema.TypeAgentSuspended, schema.TypeAgentResumed}})
	assert.Equal(t, []string{"corpus-s3", "corpus-s2", "corpus-s1"}, eventIDs(ops.Events), "the operator's actions")
	assert.Len(t, page(query.AuditQuery{OrgID: c.org, Outcome: "denied"}).Events, c.denied)
	assert.Empty(t, page(query.AuditQuery{OrgID: c.org, RoomID: "no-such-room"}).Events)
	assert.Empty(t, page(query.AuditQuery{OrgID: c.org, RoomID: hostile, ActorID: hostile, Types: []string{hostile}}).Events)
	msg := page(query.AuditQuery{OrgID: c.org, ActorID: c.agent.ID, Types: []string{schema.TypeMessageCreated}, Limit: 1})
	require.Len(t, msg.Events, 1)
	assert.Equal(t, "corpus-message", msg.Events[0].ID)
	var md schema.MessageData
	require.NoError(t, json.Unmarshal([]byte(msg.Events[0].Data), &md))
	assert.Equal(t, trickyText, md.Content)
}

func (c *corpusQuery) decisions() {
	t, ctx := c.t, c.ctx
	all, err := c.q.PolicyDecisions(ctx, query.DecisionQuery{OrgID: c.org})
	require.NoError(t, err)
	require.Len(t, all.Decisions, c.decided)
	assert.Equal(t, "corpus-d6", all.Decisions[0].ID, "newest first")
	assert.Equal(t, c.agent.ID, all.Decisions[0].AgentID)

	sm, err := c.q.PolicyDecisions(ctx, query.DecisionQuery{OrgID: c.org, Decision: "send_message", Outcome: "denied", AgentID: c.agent.ID})
	require.NoError(t, err)
	require.Len(t, sm.Decisions, 2)
	for _, d := range sm.Decisions {
		assert.False(t, d.Allowed)
		assert.Equal(t, "send_message", d.Decision)
		assert.Equal(t, int64(1500), d.RetryAfterMs)
	}
	allowed, err := c.q.PolicyDecisions(ctx, query.DecisionQuery{OrgID: c.org, Outcome: "allowed",
		From: c.decidedAt.Add(-time.Hour), To: c.decidedAt})
	require.NoError(t, err)
	require.Len(t, allowed.Decisions, 2)

	var ids []string
	q := query.DecisionQuery{OrgID: c.org, Limit: 2}
	for range 10 {
		p, err := c.q.PolicyDecisions(ctx, q)
		require.NoError(t, err)
		for _, d := range p.Decisions {
			ids = append(ids, d.ID)
		}
		if p.NextCursor == "" {
			break
		}
		q.Before = p.NextCursor
	}
	assert.Equal(t, []string{"corpus-d6", "corpus-d5", "corpus-d4", "corpus-d3", "corpus-d2", "corpus-d1"}, ids)
}

func (c *corpusQuery) contacts() {
	t, ctx := c.t, c.ctx
	from, to := c.first.Add(-time.Minute), c.last.Add(time.Minute)
	var total int
	for _, org := range c.orgs {
		p, err := c.q.ContactRequests(ctx, query.ContactQuery{OrgID: org, From: from, To: to})
		require.NoError(t, err)
		total += len(p.Requests)
		for _, r := range p.Requests {
			require.NotEmpty(t, r.History, "%+v", r)
		}
		if len(p.Requests) == 0 {
			continue
		}
		r := p.Requests[0]
		mine, err := c.q.ContactRequests(ctx, query.ContactQuery{OrgID: org, From: from, To: to, AgentID: r.AgentID, Status: r.Status})
		require.NoError(t, err)
		assert.NotEmpty(t, mine.Requests, "the requests of %s that are %s", r.AgentID, r.Status)
		one, err := c.q.ContactRequests(ctx, query.ContactQuery{OrgID: org, From: from, To: to, Limit: 1})
		require.NoError(t, err)
		require.Len(t, one.Requests, 1)
		assert.Equal(t, len(p.Requests) > 1, one.Truncated)
	}
	assert.Positive(t, total, "the simulation's contact requests")
	_, err := c.q.ContactRequests(ctx, query.ContactQuery{OrgID: c.org, Status: "approved"}) // the last 30 days
	require.NoError(t, err)
}

func (c *corpusQuery) chatty() {
	t, ctx := c.t, c.ctx
	got, err := c.q.ChattyAgents(ctx, query.ChattyQuery{OrgID: c.org, From: c.first, To: c.last.Add(time.Second)})
	require.NoError(t, err)
	require.NotEmpty(t, got)
	top := got[0]
	assert.Equal(t, c.agent.ID, top.AgentID, "the chattiest agent first")
	assert.Equal(t, c.user, top.OwnerID)
	assert.Greater(t, top.Messages, uint64(50))
	assert.NotZero(t, top.Tokens.Total())
	assert.Equal(t, "USD", top.Currency)
	assert.Equal(t, uint64(c.throttled), top.Throttled)
	assert.Equal(t, uint64(c.denied), top.Denied)
	assert.True(t, top.Suspended, "suspended, resumed, suspended again")

	one, err := c.q.ChattyAgents(ctx, query.ChattyQuery{OrgID: c.org, From: c.first, To: c.last.Add(time.Second), Limit: 1})
	require.NoError(t, err)
	require.Len(t, one, 1)
	for _, org := range c.orgs {
		_, err := c.q.ChattyAgents(ctx, query.ChattyQuery{OrgID: org}) // the last hour
		require.NoError(t, err)
	}
}

func (c *corpusQuery) directory() {
	t, ctx := c.t, c.ctx
	agents, err := c.q.Agents(ctx, query.AgentQuery{OrgID: c.org, Now: c.now})
	require.NoError(t, err)
	i := slices.IndexFunc(agents, func(a query.Agent) bool { return a.ID == c.agent.ID })
	require.GreaterOrEqual(t, i, 0)
	a := agents[i]
	require.NotEmpty(t, a.OpenToolCalls)
	assert.Equal(t, corpusCall, a.OpenToolCalls[len(a.OpenToolCalls)-1].ID)
	few, err := c.q.Agents(ctx, query.AgentQuery{OrgID: c.org, Limit: 3, Now: c.now})
	require.NoError(t, err)
	assert.Len(t, few, 3)
	var results uint64
	for _, a := range agents {
		results += a.ToolResults
	}
	assert.Positive(t, results, "the organization's tool results")

	for _, org := range c.orgs {
		rooms, err := c.q.Rooms(ctx, query.RoomQuery{OrgID: org, Now: c.now})
		require.NoError(t, err)
		require.NotEmpty(t, rooms, org)
		if org != c.org {
			continue
		}
		i := slices.IndexFunc(rooms, func(r query.Room) bool { return r.ID == corpusRoom })
		require.GreaterOrEqual(t, i, 0)
		assert.Equal(t, "Corpus Room", rooms[i].Name)
		assert.True(t, rooms[i].Closed)
		j := slices.IndexFunc(rooms, func(r query.Room) bool { return r.ID == c.room })
		require.GreaterOrEqual(t, j, 0)
		assert.Positive(t, rooms[j].OpenTasks)
		assert.Positive(t, rooms[j].StuckTasks)
		assert.Positive(t, rooms[j].OpenAttention)
	}
	few2, err := c.q.Rooms(ctx, query.RoomQuery{OrgID: c.org, Limit: 1, Now: c.now, StuckAfter: time.Hour})
	require.NoError(t, err)
	assert.Len(t, few2, 1)

	names, err := c.q.RoomNames(ctx, c.org, []string{c.room, corpusRoom, "no-such-room"})
	require.NoError(t, err)
	assert.Equal(t, "Corpus Room", names[corpusRoom])
	assert.NotEmpty(t, names[c.room])
	assert.NotContains(t, names, "no-such-room")

	parties, err := c.q.Names(ctx, c.org, []string{c.agent.ID, c.user, c.otherAgent, "nobody", c.agent.ID, ""})
	require.NoError(t, err)
	assert.Equal(t, query.Party{Kind: "agent", Handle: c.agent.Handle, Name: c.agent.Name}, parties[c.agent.ID])
	assert.Equal(t, "user", parties[c.user].Kind)
	assert.Len(t, parties, 2, "never another organization's agent")
	parties, err = c.q.Names(ctx, hostile, []string{hostile, c.agent.ID})
	require.NoError(t, err)
	assert.Empty(t, parties)
}

func (c *corpusQuery) work() {
	t, ctx := c.t, c.ctx
	ws, err := c.q.WorkStatus(ctx, query.WorkQuery{OrgID: c.org, Now: c.now})
	require.NoError(t, err)
	require.NotEmpty(t, ws.Rooms)
	i := slices.IndexFunc(ws.Rooms, func(r query.RoomWork) bool { return r.RoomID == c.room })
	require.GreaterOrEqual(t, i, 0, "the agent's room has work")
	r := ws.Rooms[i]
	j := slices.IndexFunc(r.Tasks, func(tk work.Task) bool { return tk.ID == corpusTask })
	require.GreaterOrEqual(t, j, 0)
	assert.True(t, r.Tasks[j].Stuck, "%+v", r.Tasks[j])
	k := slices.IndexFunc(r.Attention, func(a work.Attention) bool { return a.ID == corpusAsk })
	require.GreaterOrEqual(t, k, 0, "%+v", r.Attention)
	assert.Equal(t, c.user, r.Attention[k].AddressedTo, "waits for the owner, the first person it mentions")
	l := slices.IndexFunc(r.Agents, func(a query.ActiveAgent) bool { return a.AgentID == c.agent.ID })
	require.GreaterOrEqual(t, l, 0)
	assert.Equal(t, trickyText, r.Agents[l].LastMessage)

	one, err := c.q.WorkStatus(ctx, query.WorkQuery{OrgID: c.org, RoomID: c.room, Now: c.now, StuckAfter: 24 * time.Hour})
	require.NoError(t, err)
	require.Len(t, one.Rooms, 1)
	for _, tk := range one.Rooms[0].Tasks {
		assert.False(t, tk.Stuck, "%+v", tk)
	}
	for _, org := range c.orgs {
		_, err := c.q.WorkStatus(ctx, query.WorkQuery{OrgID: org}) // now
		require.NoError(t, err)
	}

	tasks, err := c.q.TasksInProgress(ctx, c.now, work.DefaultStuckAfter, 100)
	require.NoError(t, err)
	m := slices.IndexFunc(tasks, func(o query.OrgTask) bool { return o.OrgID == c.org && o.Task.ID == corpusTask })
	require.GreaterOrEqual(t, m, 0)
	assert.True(t, tasks[m].Task.Stuck)
	orgs := map[string]bool{}
	for _, o := range tasks {
		orgs[o.OrgID] = true
	}
	assert.GreaterOrEqual(t, len(orgs), 2, "every organization's tasks in progress: %v", orgs)
	// The loop guard denied the agent after its last message in the room: the board
	// shows it stopped there.
	d := api.DecidedData{Decision: "send_message", Allow: false, PolicyRevision: "corpus-rev", InputDigest: "00",
		Input:   json.RawMessage(`{"agent_id":"` + c.agent.ID + `"}`),
		Reasons: []policy.Reason{{Code: policy.CodeLoop, Message: "loop: 7 handoffs in a row between the same two agents is past max_handoffs 6"}}}
	stop := c.event("corpus-stop", schema.TypePolicyDecided, c.now.Add(-time.Minute), c.room, c.agent.ID, "agent", d)
	stop.Source = api.SourcePolicy
	require.NoError(t, c.st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{stop}}))

	stopped, err := c.q.WorkStatus(ctx, query.WorkQuery{OrgID: c.org, RoomID: c.room, Now: c.now})
	require.NoError(t, err)
	require.Len(t, stopped.Rooms, 1)
	a := slices.IndexFunc(stopped.Rooms[0].Agents, func(a query.ActiveAgent) bool { return a.AgentID == c.agent.ID })
	require.GreaterOrEqual(t, a, 0)
	assert.Equal(t, work.StopLoop, stopped.Rooms[0].Agents[a].Stop.Kind, "%+v", stopped.Rooms[0].Agents[a])
}
