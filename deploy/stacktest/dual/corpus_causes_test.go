package dual_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// The cause links ingest stores and reads back (its warm start, a late trigger's
// rewrite of causes and usage) on the same simulated traffic, on 18.16 and on 26.9.
func TestIntegrationCorpusCauses(t *testing.T) {
	ctx := context.Background()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	loadSimulated(t, rec, 2000)
	st := store.New(rec, db)

	recent, err := st.RecentCauses(ctx, time.Now().Add(-3*time.Hour), 100_000)
	require.NoError(t, err)
	require.NotEmpty(t, recent, "the simulated messages have links")
	var ids []string
	for _, r := range recent {
		assert.NotEmpty(t, r.MessageID, "RecentCauses reads messages and pending links")
	}
	from, to := time.Now().Add(-3*time.Hour), time.Now().Add(time.Hour) // the simulated traffic's range
	var n uint64
	require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage FINAL WHERE link != ''").Scan(&n))
	assert.NotZero(t, n, "usage carries its chain")
	var org string
	require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT org_id FROM "+db+".usage FINAL GROUP BY org_id ORDER BY count() DESC LIMIT 1").Scan(&org))
	rows, err := rec.Conn.Query(ctx, "SELECT event_id FROM "+db+".usage FINAL WHERE org_id = ? ORDER BY time, event_id LIMIT 20", org)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	causes, err := st.CausesOfEvents(ctx, ids, from, to)
	require.NoError(t, err)
	usage, err := st.UsageOfEvents(ctx, ids, from, to)
	require.NoError(t, err)
	require.Len(t, usage, len(ids))
	require.Len(t, causes, len(ids), "every usage event has its cause row")
	byID := map[string]store.Chain{}
	for _, c := range causes {
		c.Chain.TriggerEventID = "" // usage keeps the platform's id of the trigger only
		byID[c.EventID] = c.Chain
	}
	for _, u := range usage {
		assert.Equal(t, byID[u.EventID], u.Chain, "usage %s carries the chain of its cause row", u.EventID)
	}

	// A rewrite at a higher version is what FINAL reads after.
	for i := range causes {
		causes[i].Chain.InitiatorID, causes[i].Version = "rewritten", causes[i].Version+1
	}
	require.NoError(t, st.InsertCauses(ctx, causes))
	again, err := st.CausesOfEvents(ctx, ids, from, to)
	require.NoError(t, err)
	require.Len(t, again, len(ids))
	for _, c := range again {
		assert.Equal(t, "rewritten", c.Chain.InitiatorID)
	}

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps", len(steps))
}

// A delegation chain across owners and organizations, as ingest stores it: alice (org
// A) mentions carol's coder (org B) in a shared room; the coder mentions bob's
// reviewer, who works twice; carol mentions the reviewer too. Read as org B: the
// chains, the spend across owners and the costs by initiator, on both engines.
func TestIntegrationCorpusDelegation(t *testing.T) {
	ctx := context.Background()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	st := store.New(rec, db)
	q := query.New(rec, db)
	at := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Hour)
	alice := store.Chain{InitiatorID: "alice", InitiatorType: "user", InitiatorOrg: "org-a", InitiatorOwner: "alice"}
	link := func(c store.Chain, trigger, triggerEvent string, depth uint16, how string) store.Chain {
		c.TriggerID, c.TriggerEventID, c.Depth, c.Link = trigger, triggerEvent, depth, how
		return c
	}
	carol := store.Chain{InitiatorID: "carol", InitiatorType: "user", InitiatorOrg: "org-b", InitiatorOwner: "carol"}
	causes := []store.CauseRow{
		{EventID: "ev-m-a", Time: at, Type: "message.created", OrgID: "org-a", RoomID: "shared", ActorID: "alice", ActorType: "user",
			MessageID: "m-a", Mentions: []string{"coder"}, Chain: link(alice, "", "", 0, "explicit")},
		{EventID: "ev-u1", Time: at.Add(time.Minute), Type: "usage.reported", OrgID: "org-b", RoomID: "shared", ActorID: "coder", ActorType: "agent",
			ExecutionID: "x1", Chain: link(alice, "m-a", "ev-m-a", 1, "explicit")},
		{EventID: "ev-m-c", Time: at.Add(2 * time.Minute), Type: "message.created", OrgID: "org-b", RoomID: "shared", ActorID: "coder", ActorType: "agent",
			ExecutionID: "x1", MessageID: "m-c", Mentions: []string{"reviewer"}, Chain: link(alice, "m-a", "ev-m-a", 1, "explicit")},
		{EventID: "ev-u2", Time: at.Add(3 * time.Minute), Type: "usage.reported", OrgID: "org-b", RoomID: "shared", ActorID: "reviewer", ActorType: "agent",
			ExecutionID: "x2", Chain: link(alice, "m-c", "ev-m-c", 2, "inferred")},
		{EventID: "ev-u3", Time: at.Add(4 * time.Minute), Type: "usage.reported", OrgID: "org-b", RoomID: "shared", ActorID: "reviewer", ActorType: "agent",
			ExecutionID: "x2", Chain: link(alice, "m-c", "ev-m-c", 2, "inferred")},
		{EventID: "ev-m-carol", Time: at.Add(5 * time.Minute), Type: "message.created", OrgID: "org-b", RoomID: "team", ActorID: "carol", ActorType: "user",
			MessageID: "m-carol", Mentions: []string{"reviewer"}, Chain: link(carol, "", "", 0, "explicit")},
		{EventID: "ev-u4", Time: at.Add(6 * time.Minute), Type: "usage.reported", OrgID: "org-b", RoomID: "team", ActorID: "reviewer", ActorType: "agent",
			ExecutionID: "x3", Chain: link(carol, "m-carol", "ev-m-carol", 1, "inferred")},
	}
	for i := range causes {
		causes[i].Version = 1
	}
	require.NoError(t, st.InsertCauses(ctx, causes))
	usage := func(id string, minute int, owner, agent string, micros int64, c store.Chain) store.UsageRow {
		return store.UsageRow{EventID: id, Time: at.Add(time.Duration(minute) * time.Minute), OrgID: "org-b", OwnerID: owner, AgentID: agent,
			RoomID: "shared", Model: "gpt-5-mini", InputTokens: 100, OutputTokens: 10, CostMicros: micros, Currency: "USD", Priced: true,
			CatalogVersion: "corpus", Version: 1, Chain: c}
	}
	rows := []store.UsageRow{
		usage("ev-u1", 1, "carol", "coder", 1_000, causes[1].Chain),
		usage("ev-u2", 3, "bob", "reviewer", 2_000, causes[3].Chain),
		usage("ev-u3", 4, "bob", "reviewer", 3_000, causes[4].Chain),
		usage("ev-u4", 6, "bob", "reviewer", 4_000, causes[6].Chain),
	}
	require.NoError(t, st.InsertUsage(ctx, rows))
	require.NoError(t, st.RefreshRollup(ctx, []store.HourKey{{OrgID: "org-b", Hour: at}}))

	d, err := q.Delegation(ctx, query.DelegationQuery{OrgID: "org-b", ExecutionID: "x2"})
	require.NoError(t, err)
	assert.Equal(t, "alice", d.InitiatorID)
	require.Len(t, d.Hops, 2)
	assert.Equal(t, "coder", d.Hops[0].AgentID)
	assert.True(t, d.Hops[0].Outside, "alice's message is org A's: shown by id, not followed")
	assert.Equal(t, "m-a", d.Hops[0].TriggerID)
	assert.Empty(t, d.Hops[0].SenderID, "org B's rows do not say who sent it")
	assert.Equal(t, "0.001", d.Hops[0].Cost.String())
	assert.Equal(t, query.Hop{Depth: 2, TriggerID: "m-c", TriggerEventID: "ev-m-c", SenderID: "coder", SenderType: "agent", AgentID: "reviewer",
		ExecutionID: "x2", Link: "inferred", Time: causes[3].Time, Events: 2, Cost: d.Hops[1].Cost, Currency: "USD"}, d.Hops[1])
	assert.Equal(t, "0.005", d.Hops[1].Cost.String())

	d, err = q.Delegation(ctx, query.DelegationQuery{OrgID: "org-b", MessageID: "m-c"})
	require.NoError(t, err)
	require.Len(t, d.Hops, 1)
	require.Len(t, d.Triggered, 1)
	assert.Equal(t, "reviewer", d.Triggered[0].AgentID)
	assert.Equal(t, "0.005", d.Triggered[0].Cost.String())
	assert.Equal(t, causes[3].Time, d.Triggered[0].Time, "an execution a message started begins at its first usage")

	d, err = q.Delegation(ctx, query.DelegationQuery{OrgID: "org-b", ExecutionID: "x3"})
	require.NoError(t, err)
	require.Len(t, d.Hops, 2)
	assert.Equal(t, query.Hop{Depth: 0, SenderID: "carol", SenderType: "user", Link: "explicit", Time: causes[5].Time, Cost: d.Hops[0].Cost}, d.Hops[0])
	assert.Equal(t, "carol", d.Hops[1].SenderID)
	assert.Equal(t, "0.004", d.Hops[1].Cost.String())

	_, err = q.Delegation(ctx, query.DelegationQuery{OrgID: "org-a", ExecutionID: "x2"})
	require.ErrorIs(t, err, schema.ErrNotFound, "org A does not see org B's executions")

	cross, err := q.CrossOwnerSpend(ctx, query.CrossOwnerQuery{OrgID: "org-b", From: at, To: at.Add(time.Hour), OwnerID: "bob"})
	require.NoError(t, err)
	require.Len(t, cross.CausedByOthers, 2)
	assert.Equal(t, "alice", cross.CausedByOthers[0].InitiatorOwnerID)
	assert.Equal(t, "0.005", cross.CausedByOthers[0].Cost.String())
	assert.Equal(t, "carol", cross.CausedByOthers[1].InitiatorOwnerID)
	assert.Empty(t, cross.CausedForOthers)
	cross, err = q.CrossOwnerSpend(ctx, query.CrossOwnerQuery{OrgID: "org-b", From: at, To: at.Add(time.Hour), OwnerID: "carol"})
	require.NoError(t, err)
	require.Len(t, cross.CausedForOthers, 1)
	assert.Equal(t, "bob", cross.CausedForOthers[0].OwnerID)
	assert.Equal(t, "0.004", cross.CausedForOthers[0].Cost.String())

	rep, err := q.Costs(ctx, query.CostQuery{OrgID: "org-b", From: at, To: at.Add(time.Hour), GroupBy: []string{query.DimInitiator}})
	require.NoError(t, err)
	require.Len(t, rep.Rows, 2)
	assert.Equal(t, "alice", rep.Rows[0].InitiatorID)
	assert.Equal(t, "0.006", rep.Rows[0].Cost.String())

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps", len(steps))
}
