package query_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// compliance is one test's database, with merges stopped so that every insert stays a
// part of its own: a replay is a second row when the queries run, as after a crash
// before ClickHouse merged.
type compliance struct {
	t   *testing.T
	ctx context.Context
	st  *store.Store
	q   *query.Querier
	// now is q's clock, moved by the test only: the defaults q applies (a first page's
	// watermark, the last 30 days, the last hour) start from the instant the test's
	// expectations start from.
	now time.Time
}

func newCompliance(t *testing.T) *compliance {
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	for _, table := range []string{"events", "usage", "usage_hourly"} {
		require.NoError(t, conn.Exec(ctx, "SYSTEM STOP MERGES "+db+"."+table))
	}
	c := &compliance{t: t, ctx: ctx, st: store.New(conn, db), q: query.New(conn, db),
		now: time.Date(2025, 3, 20, 12, 34, 56, 789_000_000, time.UTC)}
	query.SetClock(c.q, func() time.Time { return c.now })
	return c
}

// insert writes rows in one batch (one part per day).
func (c *compliance) insert(rows ...store.EventRow) {
	c.t.Helper()
	require.NoError(c.t, c.st.BatchInsert(c.ctx, &store.Batch{Events: rows}))
}

// row is an event of org by an agent, ingested long ago unless changed.
func row(org, id, typ string, at time.Time, actor string) store.EventRow {
	return store.EventRow{ID: id, Type: typ, Time: at, OrgID: org, ActorID: actor, ActorType: "agent",
		Source: "test", SchemaVersion: 1, Data: "{}", IngestedAt: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func ids(events []query.Event) []string {
	out := []string{}
	for _, e := range events {
		out = append(out, e.ID)
	}
	return out
}

// listAudit pages through q to the end and returns the ids of each page.
func (c *compliance) listAudit(q query.AuditQuery) [][]string {
	c.t.Helper()
	var pages [][]string
	for {
		page, err := c.q.AuditEvents(c.ctx, q)
		require.NoError(c.t, err)
		pages = append(pages, ids(page.Events))
		if page.NextCursor == "" {
			return pages
		}
		require.Less(c.t, len(pages), 50, "pagination does not end")
		q.Before = page.NextCursor
	}
}

func decided(t *testing.T, d api.DecidedData) string {
	b, err := json.Marshal(d)
	require.NoError(t, err)
	return string(b)
}

func decisionRow(t *testing.T, org, id string, at time.Time, agent, room string, d api.DecidedData) store.EventRow {
	r := row(org, id, "policy.decided", at, agent)
	r.RoomID, r.Source, r.Data = room, api.SourcePolicy, decided(t, d)
	return r
}

func TestIntegrationAuditStableCursor(t *testing.T) {
	c := newCompliance(t)
	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	at := func(i int) time.Time {
		return base.Add(time.Duration(i)*time.Second + time.Duration(i*10)*time.Millisecond)
	}
	var a, b []store.EventRow
	for i := range 10 {
		r := row("org-a", fmt.Sprintf("e%02d", i), "message.created", at(i), "a1")
		r.Data = `{"org":"a"}`
		switch i {
		case 2, 5:
			r = decisionRow(t, "org-a", r.ID, at(i), "a1", "r1", api.DecidedData{Decision: "send_message", Allow: false,
				Reasons: []policy.Reason{{Code: "rate_limited", Message: "slow down"}}, PolicyRevision: "rev"})
		case 4:
			r = decisionRow(t, "org-a", r.ID, at(i), "a1", "r1", api.DecidedData{Decision: "peer_visible", Allow: true, PolicyRevision: "rev",
				Input: json.RawMessage(`{"agent":"a1","allow":false}`)}) // a nested "allow" is not the outcome
		case 7:
			r.Type, r.SubjectID, r.SubjectType = "participant.added", "a9", "agent"
		}
		a = append(a, r)
		// org-b holds the very same keys (time, time_ms, id): they must not leak into
		// org-a's pages through the key subquery.
		o := row("org-b", r.ID, "message.created", at(i), "b1")
		o.Data = `{"org":"b"}`
		b = append(b, o)
	}
	c.insert(append(append([]store.EventRow{}, a...), b...)...)
	c.insert(a[3], a[7], a[8]) // replays, in a part of their own

	want := [][]string{{"e09", "e08", "e07"}, {"e06", "e05", "e04"}, {"e03", "e02", "e01"}, {"e00"}}
	q := query.AuditQuery{OrgID: "org-a", Limit: 3}
	require.Equal(t, want, c.listAudit(q))

	// Page one; then a newer event and a late one, older than page one's last event, arrive.
	page1, err := c.q.AuditEvents(c.ctx, q)
	require.NoError(t, err)
	require.Equal(t, want[0], ids(page1.Events))
	newer := row("org-a", "new", "message.created", base.Add(time.Hour), "a1")
	late := row("org-a", "late", "message.created", at(5).Add(500*time.Millisecond), "a1") // between e05 and e06
	lateReplay := a[4]                                                                     // e04 again, stamped now
	for _, r := range []*store.EventRow{&newer, &late, &lateReplay} {
		r.IngestedAt = c.now
	}
	c.insert(newer, late, lateReplay)

	rest := query.AuditQuery{OrgID: "org-a", Limit: 3, Before: page1.NextCursor}
	got := append([][]string{ids(page1.Events)}, c.listAudit(rest)...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pages after new arrivals (-want +got):\n%s", diff)
	}

	// The rows of a page are org-a's own, one per event, as stored.
	page2, err := c.q.AuditEvents(c.ctx, rest)
	require.NoError(t, err)
	for _, e := range page2.Events {
		assert.Equal(t, "org-a", e.OrgID)
		assert.NotEqual(t, `{"org":"b"}`, e.Data)
		assert.True(t, e.IngestedAt.Before(time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)), "the copy ingested before the listing: %s", e.IngestedAt)
	}

	// A listing started afresh sees the arrivals once the watermark (now less two
	// seconds, in whole seconds) passes them, and not before.
	afresh := func() []string {
		t.Helper()
		page, err := c.q.AuditEvents(c.ctx, query.AuditQuery{OrgID: "org-a", Limit: 20})
		require.NoError(t, err)
		return ids(page.Events)
	}
	require.Equal(t, []string{"e09", "e08", "e07", "e06", "e05", "e04", "e03", "e02", "e01", "e00"}, afresh(), "arrivals within the settle time")
	c.now = c.now.Add(2 * time.Second)
	require.Equal(t, []string{"new", "e09", "e08", "e07", "e06", "late", "e05", "e04", "e03", "e02", "e01", "e00"}, afresh(), "arrivals past the watermark")

	// Filters: outcome, subject, and outcome with types that hold no decision.
	require.Equal(t, [][]string{{"e05", "e02"}}, c.listAudit(query.AuditQuery{OrgID: "org-a", Outcome: "denied"}))
	require.Equal(t, [][]string{{"e04"}}, c.listAudit(query.AuditQuery{OrgID: "org-a", Outcome: "allowed"}))
	require.Equal(t, [][]string{{"e05"}, {"e02"}}, c.listAudit(query.AuditQuery{OrgID: "org-a", Outcome: "denied", Limit: 1}))
	require.Equal(t, [][]string{{"e07"}}, c.listAudit(query.AuditQuery{OrgID: "org-a", SubjectID: "a9"}))
	require.Equal(t, [][]string{{}}, c.listAudit(query.AuditQuery{OrgID: "org-a", Outcome: "denied", Types: []string{"message.created"}}))
	require.Equal(t, [][]string{{}}, c.listAudit(query.AuditQuery{OrgID: "org-b", Outcome: "denied"}))

	// org-b sees its own ten, never org-a's.
	page, err := c.q.AuditEvents(c.ctx, query.AuditQuery{OrgID: "org-b", Limit: 100})
	require.NoError(t, err)
	require.Len(t, page.Events, 10)
	for _, e := range page.Events {
		require.Equal(t, `{"org":"b"}`, e.Data)
	}
	// org-a's cursor used for org-b: still only org-b's rows.
	page, err = c.q.AuditEvents(c.ctx, query.AuditQuery{OrgID: "org-b", Limit: 100, Before: page1.NextCursor})
	require.NoError(t, err)
	require.Equal(t, []string{"e06", "e05", "e04", "e03", "e02", "e01", "e00"}, ids(page.Events))
	require.Equal(t, "org-b", page.Events[0].OrgID)

	// Hostile cursors are the caller's mistake, named.
	for _, before := range []string{"garbage!", base64.RawURLEncoding.EncodeToString([]byte("v1:1740823200007:e05")),
		base64.RawURLEncoding.EncodeToString([]byte("v2:1:2")), base64.RawURLEncoding.EncodeToString([]byte("v2:x:1:e05"))} {
		_, err := c.q.AuditEvents(c.ctx, query.AuditQuery{OrgID: "org-a", Before: before})
		require.True(t, errors.Is(err, schema.ErrInvalid), "%q: %v", before, err)
		require.Contains(t, err.Error(), "before: ")
	}
	_, err = c.q.AuditEvents(c.ctx, query.AuditQuery{OrgID: "org-a", Outcome: "maybe"})
	require.True(t, errors.Is(err, schema.ErrInvalid), "%v", err)
}

func TestIntegrationDecisions(t *testing.T) {
	c := newCompliance(t)
	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	dd := func(name string, allow bool, reasons ...policy.Reason) api.DecidedData {
		return api.DecidedData{Decision: name, Allow: allow, Reasons: reasons, PolicyRevision: "rev-1",
			InputDigest: "digest-" + name, Input: json.RawMessage(`{"agent":"x"}`), RequestedBy: "key-1"}
	}
	rate := policy.Reason{Code: "rate_limited", Message: "agent a1 may post 12 messages per 1m0s in this room"}
	d2data := dd("send_message", false, rate)
	d2data.RetryAfterMs = 1500
	d2 := decisionRow(t, "org-a", "d2", at(2).Add(250*time.Millisecond), "a1", "r1", d2data)
	rows := []store.EventRow{
		decisionRow(t, "org-a", "d1", at(1), "a1", "r1", dd("send_message", true)),
		d2,
		decisionRow(t, "org-a", "d3", at(3), "a2", "r2", dd("add_participant", false, policy.Reason{Code: "not_peer", Message: "no"})),
		decisionRow(t, "org-a", "d4", at(4), "a1", "", dd("contact_request", true)),
		decisionRow(t, "org-a", "d5", at(5), "a2", "", dd("peer_visible", true)),
		row("org-a", "m1", "message.created", at(6), "a1"),
		decisionRow(t, "org-b", "d6", at(2), "a1", "r1", dd("send_message", false, rate)), // same agent id, other org
	}
	c.insert(rows...)
	c.insert(d2) // a replay

	list := func(q query.DecisionQuery) [][]string {
		t.Helper()
		var pages [][]string
		for {
			page, err := c.q.PolicyDecisions(c.ctx, q)
			require.NoError(t, err)
			p := []string{}
			for _, d := range page.Decisions {
				p = append(p, d.ID)
			}
			pages = append(pages, p)
			if page.NextCursor == "" {
				return pages
			}
			require.Less(t, len(pages), 20)
			q.Before = page.NextCursor
		}
	}
	org := query.DecisionQuery{OrgID: "org-a"}
	require.Equal(t, [][]string{{"d5", "d4", "d3", "d2", "d1"}}, list(org))

	page, err := c.q.PolicyDecisions(c.ctx, query.DecisionQuery{OrgID: "org-a", Decision: "send_message", Outcome: "denied"})
	require.NoError(t, err)
	require.Empty(t, page.NextCursor)
	want := []query.PolicyDecision{{ID: "d2", Time: at(2).Add(250 * time.Millisecond), Decision: "send_message", Allowed: false,
		Reasons:  []query.Reason{{Code: "rate_limited", Message: "agent a1 may post 12 messages per 1m0s in this room"}},
		Revision: "rev-1", InputDigest: "digest-send_message", Input: `{"agent":"x"}`, RetryAfterMs: 1500,
		AgentID: "a1", RoomID: "r1", RequestedBy: "key-1"}}
	if diff := cmp.Diff(want, page.Decisions); diff != "" {
		t.Errorf("denied send_message (-want +got):\n%s", diff)
	}

	f := func(q query.DecisionQuery, want ...[]string) {
		t.Helper()
		q.OrgID = "org-a"
		if diff := cmp.Diff(want, list(q)); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", q, diff)
		}
	}
	f(query.DecisionQuery{Decision: "send_message"}, []string{"d2", "d1"})
	f(query.DecisionQuery{Outcome: "allowed"}, []string{"d5", "d4", "d1"})
	f(query.DecisionQuery{Outcome: "denied"}, []string{"d3", "d2"})
	f(query.DecisionQuery{AgentID: "a2"}, []string{"d5", "d3"})
	f(query.DecisionQuery{AgentID: "a2", Decision: "send_message"}, []string{})
	f(query.DecisionQuery{Limit: 2}, []string{"d5", "d4"}, []string{"d3", "d2"}, []string{"d1"})
	f(query.DecisionQuery{From: at(2), To: at(4)}, []string{"d3", "d2"})
	f(query.DecisionQuery{From: at(2).Add(251 * time.Millisecond), To: at(4)}, []string{"d3"})

	page, err = c.q.PolicyDecisions(c.ctx, query.DecisionQuery{OrgID: "org-b"})
	require.NoError(t, err)
	require.Len(t, page.Decisions, 1)
	require.Equal(t, "d6", page.Decisions[0].ID)

	for _, bad := range []query.DecisionQuery{
		{OrgID: "org-a", Decision: "send"},
		{OrgID: "org-a", Outcome: "true"},
		{OrgID: "org-a", Limit: query.MaxDecisionLimit + 1},
		{OrgID: "org-a", Before: base64.RawURLEncoding.EncodeToString([]byte("v1:1:d1"))},
		{OrgID: "org-a", From: at(4), To: at(2)},
		{Decision: "send_message"},
	} {
		_, err := c.q.PolicyDecisions(c.ctx, bad)
		require.True(t, errors.Is(err, schema.ErrInvalid), "%+v: %v", bad, err)
	}
}

// contactRow is a request event as the platform's frames map: on the recipient's
// channel, so the recipient agent is the actor.
func contactRow(org, id, typ string, at time.Time, agent, data string) store.EventRow {
	r := row(org, id, "contact.request_"+typ, at, agent)
	r.Source, r.Data = "band", data
	return r
}

func TestIntegrationContactRequests(t *testing.T) {
	c := newCompliance(t)
	now := c.now
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	r1approved := contactRow("org-a", "e2", "updated", ago(time.Hour), "a1", `{"status":"approved","request_id":"r1","from_handle":"alice"}`)
	c.insert(
		contactRow("org-a", "e1", "received", ago(2*time.Hour), "a1", `{"status":"pending","request_id":"r1","from_handle":"alice","message":"Code review"}`),
		r1approved,
		contactRow("org-a", "e3", "received", ago(3*time.Hour), "a1", `{"status":"pending","request_id":"r2","from_handle":"bob/bot"}`),
		contactRow("org-a", "e4", "updated", ago(90*time.Minute), "a1", `{"status":"cancelled","request_id":"r2","from_handle":"bob/bot"}`),
		contactRow("org-a", "e5", "received", ago(30*time.Minute), "a2", `{"status":"pending","request_id":"r3","from_handle":"carol"}`),
		contactRow("org-a", "e6", "received", ago(40*24*time.Hour), "a1", `{"status":"pending","request_id":"r4","from_handle":"dan"}`),
		contactRow("org-a", "e7", "updated", ago(39*24*time.Hour), "a1", `{"status":"rejected","request_id":"r4","from_handle":"dan"}`),
		row("org-a", "m1", "message.created", ago(time.Minute), "a1"),
		contactRow("org-b", "e8", "received", ago(time.Hour), "a1", `{"status":"pending","request_id":"r5","from_handle":"eve"}`),
		contactRow("org-b", "e9", "updated", ago(10*time.Minute), "a1", `{"status":"approved","request_id":"r1","from_handle":"eve"}`), // org-b's own r1
	)
	c.insert(r1approved) // a replay

	list := func(q query.ContactQuery) ([]string, bool) {
		t.Helper()
		page, err := c.q.ContactRequests(c.ctx, q)
		require.NoError(t, err)
		out := []string{}
		for _, r := range page.Requests {
			out = append(out, r.RequestID+":"+r.Status)
		}
		return out, page.Truncated
	}

	page, err := c.q.ContactRequests(c.ctx, query.ContactQuery{OrgID: "org-a"})
	require.NoError(t, err)
	require.False(t, page.Truncated)
	want := []query.ContactRequest{
		{RequestID: "r3", Status: "pending", FromHandle: "carol", AgentID: "a2", FirstSeen: ago(30 * time.Minute), LastChanged: ago(30 * time.Minute),
			History: []query.ContactStep{{Status: "pending", Time: ago(30 * time.Minute), ActorID: "a2", EventID: "e5"}}},
		{RequestID: "r1", Status: "approved", FromHandle: "alice", Message: "Code review", AgentID: "a1",
			FirstSeen: ago(2 * time.Hour), LastChanged: ago(time.Hour), DecidedBy: "a1",
			History: []query.ContactStep{{Status: "pending", Time: ago(2 * time.Hour), ActorID: "a1", EventID: "e1"},
				{Status: "approved", Time: ago(time.Hour), ActorID: "a1", EventID: "e2"}}},
		{RequestID: "r2", Status: "cancelled", FromHandle: "bob/bot", AgentID: "a1",
			FirstSeen: ago(3 * time.Hour), LastChanged: ago(90 * time.Minute), DecidedBy: "bob/bot",
			History: []query.ContactStep{{Status: "pending", Time: ago(3 * time.Hour), ActorID: "a1", EventID: "e3"},
				{Status: "cancelled", Time: ago(90 * time.Minute), ActorID: "a1", EventID: "e4"}}},
	}
	if diff := cmp.Diff(want, page.Requests); diff != "" {
		t.Errorf("last 30 days (-want +got):\n%s", diff)
	}

	f := func(q query.ContactQuery, wantTruncated bool, want ...string) {
		t.Helper()
		q.OrgID = "org-a"
		got, truncated := list(q)
		if want == nil {
			want = []string{}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", q, diff)
		}
		assert.Equal(t, wantTruncated, truncated, "%+v: truncated", q)
	}
	f(query.ContactQuery{Status: "approved"}, false, "r1:approved")
	f(query.ContactQuery{Status: "pending"}, false, "r3:pending")
	f(query.ContactQuery{Status: "rejected"}, false)
	f(query.ContactQuery{AgentID: "a2"}, false, "r3:pending")
	f(query.ContactQuery{Limit: 2}, true, "r3:pending", "r1:approved")
	f(query.ContactQuery{Limit: 3}, false, "r3:pending", "r1:approved", "r2:cancelled")
	f(query.ContactQuery{From: ago(41 * 24 * time.Hour), To: ago(38 * 24 * time.Hour)}, false, "r4:rejected")
	// Only the range's events: r1's approval alone, r2 still pending within it.
	f(query.ContactQuery{From: ago(3 * time.Hour), To: ago(100 * time.Minute)}, false, "r1:pending", "r2:pending")

	got, truncated := list(query.ContactQuery{OrgID: "org-b"})
	require.Equal(t, []string{"r1:approved", "r5:pending"}, got)
	require.False(t, truncated)

	for _, bad := range []query.ContactQuery{
		{OrgID: "org-a", Status: "accepted"},
		{OrgID: "org-a", Limit: query.MaxContactLimit + 1},
		{OrgID: "org-a", Limit: -1},
		{OrgID: "org-a", From: now, To: ago(time.Hour)},
		{OrgID: "org-a", From: now.Add(time.Hour)}, // To defaults to now
		{Status: "pending"},
	} {
		_, err := c.q.ContactRequests(c.ctx, bad)
		require.True(t, errors.Is(err, schema.ErrInvalid), "%+v: %v", bad, err)
	}
}

// A range with more request events than one query reads is cut to the newest ones,
// and says so, even when the requests fit the limit.
func TestIntegrationContactRequestsRowBound(t *testing.T) {
	c := newCompliance(t)
	base := c.now.Add(-24 * time.Hour).Truncate(time.Second)
	const n = query.MaxContactLimit*20 + 1
	rows := make([]store.EventRow, 0, n+1)
	rows = append(rows, contactRow("org-a", "first", "received", base, "a1", `{"status":"pending","request_id":"big"}`))
	for i := 1; i < n; i++ {
		rows = append(rows, contactRow("org-a", fmt.Sprintf("u%05d", i), "updated", base.Add(time.Duration(i)*time.Millisecond), "a1",
			`{"status":"pending","request_id":"big"}`))
	}
	rows = append(rows, contactRow("org-b", "other", "received", base, "a1", `{"status":"pending","request_id":"b"}`))
	c.insert(rows...)
	page, err := c.q.ContactRequests(c.ctx, query.ContactQuery{OrgID: "org-a"})
	require.NoError(t, err)
	require.True(t, page.Truncated)
	require.Len(t, page.Requests, 1)
	require.Len(t, page.Requests[0].History, n-1, "the newest events, the oldest left out")
	require.Equal(t, "u00001", page.Requests[0].History[0].EventID)
}

func TestIntegrationChattyAgents(t *testing.T) {
	c := newCompliance(t)
	now := c.now
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	var rows []store.EventRow
	n := 0
	msgs := func(org, agent, owner string, count int, at time.Time) []store.EventRow {
		var out []store.EventRow
		for range count {
			n++
			r := row(org, fmt.Sprintf("m%03d", n), "message.created", at.Add(time.Duration(n)*time.Millisecond), agent)
			r.OwnerID, r.RoomID = owner, "r1"
			out = append(out, r)
		}
		return out
	}
	a1msgs := msgs("org-a", "a1", "o1", 4, ago(30*time.Minute))
	rows = append(rows, a1msgs...)
	rows = append(rows, msgs("org-a", "a2", "o2", 2, ago(20*time.Minute))...)
	rows = append(rows, msgs("org-a", "a3", "o1", 2, ago(10*time.Minute))...)
	user := msgs("org-a", "u1", "", 5, ago(5*time.Minute))
	for i := range user {
		user[i].ActorType = "user"
	}
	rows = append(rows, user...)
	rows = append(rows, msgs("org-a", "a4", "o1", 6, ago(2*time.Hour))...) // before the last hour
	rows = append(rows, msgs("org-b", "a9", "o9", 10, ago(30*time.Minute))...)
	rows = append(rows, msgs("org-b", "a1", "o1", 10, ago(30*time.Minute))...) // org-b's a1 must not add to org-a's

	deny := func(org, id string, at time.Time, agent, name, code string) store.EventRow {
		return decisionRow(t, org, id, at, agent, "r1", api.DecidedData{Decision: name, Allow: false,
			Reasons: []policy.Reason{{Code: code, Message: code}}, PolicyRevision: "rev"})
	}
	rateLimited := deny("org-a", "d1", ago(25*time.Minute), "a1", "send_message", "rate_limited")
	rows = append(rows,
		rateLimited,
		deny("org-a", "d2", ago(24*time.Minute), "a1", "send_message", "budget_exceeded"),
		deny("org-a", "d3", ago(23*time.Minute), "a1", "add_participant", "not_peer"),
		deny("org-a", "d4", ago(22*time.Minute), "a1", "add_participant", "rate_limited"), // not send_message: not a throttle
		decisionRow(t, "org-a", "d5", ago(21*time.Minute), "a1", "r1", api.DecidedData{Decision: "send_message", Allow: true, PolicyRevision: "rev"}),
		deny("org-a", "d6", ago(20*time.Minute), "a2", "send_message", "suspended"),
		deny("org-a", "d7", ago(2*time.Hour), "a1", "send_message", "rate_limited"), // before the last hour
		deny("org-b", "d8", ago(20*time.Minute), "a1", "send_message", "rate_limited"),
		deny("org-b", "d9", ago(19*time.Minute), "a1", "send_message", "rate_limited"),
	)
	// Operator actions: the agent is the subject, the operator's key the actor.
	op := func(org, id, typ string, at time.Time, agent string) store.EventRow {
		r := row(org, id, typ, at, "key-op")
		r.ActorType, r.SubjectID, r.SubjectType, r.Source = "system", agent, "agent", api.SourcePolicy
		return r
	}
	day := 24 * time.Hour
	rows = append(rows,
		op("org-a", "s1", "agent.suspended", ago(5*day), "a1"),
		op("org-a", "s2", "agent.resumed", ago(4*day), "a1"),
		op("org-a", "s3", "agent.suspended", ago(3*day), "a2"),
		op("org-a", "s4", "agent.resumed", ago(2*day), "a2"),
		op("org-a", "s5", "agent.suspended", ago(day), "a2"),
		op("org-b", "s6", "agent.suspended", ago(time.Hour), "a1"),
	)
	c.insert(rows...)
	c.insert(a1msgs[0], rateLimited) // replays

	usage := func(org, id, agent string, at time.Time, in, out uint64, micros int64) store.UsageRow {
		return store.UsageRow{EventID: id, Time: at, OrgID: org, OwnerID: "o1", AgentID: agent, RoomID: "r1", Model: "m1",
			InputTokens: in, OutputTokens: out, CostMicros: micros, Currency: "USD", Priced: true, Version: 1}
	}
	u1 := usage("org-a", "u1", "a1", ago(30*time.Minute), 100, 50, 1234)
	us := []store.UsageRow{u1, usage("org-a", "u2", "a2", ago(20*time.Minute), 10, 5, 20),
		usage("org-a", "u3", "a1", ago(3*time.Hour), 7, 7, 7), // outside the hours of the last hour
		usage("org-b", "u4", "a1", ago(30*time.Minute), 1000, 1000, 9_000_000)}
	require.NoError(t, c.st.InsertUsage(c.ctx, us))
	require.NoError(t, c.st.InsertUsage(c.ctx, []store.UsageRow{u1})) // a replay
	var hours []store.HourKey
	for _, u := range us {
		hours = append(hours, store.HourKey{OrgID: u.OrgID, Hour: u.Time.Truncate(time.Hour)})
	}
	require.NoError(t, c.st.RefreshRollup(c.ctx, hours))

	got, err := c.q.ChattyAgents(c.ctx, query.ChattyQuery{OrgID: "org-a"})
	require.NoError(t, err)
	type agentRow struct {
		Agent, Owner      string
		Messages          uint64
		Tokens            query.Tokens
		Cost, Currency    string
		Throttled, Denied uint64
		Suspended         bool
	}
	flat := func(as []query.ChattyAgent) []agentRow {
		out := []agentRow{}
		for _, a := range as {
			out = append(out, agentRow{a.AgentID, a.OwnerID, a.Messages, a.Tokens, a.Cost.StringFixed(6), a.Currency, a.Throttled, a.Denied, a.Suspended})
		}
		return out
	}
	want := []agentRow{
		{"a1", "o1", 4, query.Tokens{Input: 100, Output: 50}, "0.001234", "USD", 2, 4, false},
		{"a2", "o2", 2, query.Tokens{Input: 10, Output: 5}, "0.000020", "USD", 0, 1, true},
		{"a3", "o1", 2, query.Tokens{}, "0.000000", "", 0, 0, false},
	}
	if diff := cmp.Diff(want, flat(got)); diff != "" {
		t.Errorf("last hour (-want +got):\n%s", diff)
	}

	got, err = c.q.ChattyAgents(c.ctx, query.ChattyQuery{OrgID: "org-a", Limit: 1})
	require.NoError(t, err)
	require.Equal(t, want[:1], flat(got))

	got, err = c.q.ChattyAgents(c.ctx, query.ChattyQuery{OrgID: "org-a", From: ago(3 * time.Hour), To: ago(90 * time.Minute)})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "a4", got[0].AgentID)
	require.Equal(t, uint64(6), got[0].Messages)

	got, err = c.q.ChattyAgents(c.ctx, query.ChattyQuery{OrgID: "org-a", From: ago(10 * day), To: ago(9 * day)})
	require.NoError(t, err)
	require.Equal(t, []query.ChattyAgent{}, got)

	got, err = c.q.ChattyAgents(c.ctx, query.ChattyQuery{OrgID: "org-b"})
	require.NoError(t, err)
	require.Equal(t, []agentRow{
		{"a1", "o1", 10, query.Tokens{Input: 1000, Output: 1000}, "9.000000", "USD", 2, 2, true},
		{"a9", "o9", 10, query.Tokens{}, "0.000000", "", 0, 0, false},
	}, flat(got))

	for _, bad := range []query.ChattyQuery{
		{OrgID: "org-a", Limit: query.MaxChattyLimit + 1},
		{OrgID: "org-a", Limit: -1},
		{OrgID: "org-a", From: now, To: ago(time.Hour)},
		{OrgID: "org-a", From: now.Add(time.Hour)}, // To defaults to now
		{},
	} {
		_, err := c.q.ChattyAgents(c.ctx, bad)
		require.True(t, errors.Is(err, schema.ErrInvalid), "%+v: %v", bad, err)
	}
}
