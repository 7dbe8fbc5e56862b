package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// recEvents is the size of the simulated workload.
const recEvents = 3000

// recUnpriced is the model serve's catalog leaves out (the tutorial's Architect and
// Reviewer Agents use it).
const recUnpriced = "gpt-5.4-mini"

// TestIntegrationReconcileWithSimulator sends a seeded workload of the simulator through
// the collector of a real `bandplane serve` (a platform ingest key), waits until ingest
// has stored all of it, and reconciles the GraphQL answers of every organization (a
// platform admin key naming orgId) with the simulator's Summary and with the lines it
// emitted: costs by agent and model (tokens of each kind, exact cost in micros, totals,
// unpriced apart: serve's catalog leaves out one model the workload uses), the same
// hour by hour (usageSeries), messages, tokens and cost per agent (chattyAgents),
// events per type (auditEvents), contact requests, their histories and outcomes
// (contactRequests), and the last status of every task (workStatus).
func TestIntegrationReconcileWithSimulator(t *testing.T) {
	began := time.Now()
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	admin := s.key(t, "platform-admin", keys.PlatformOrg, keys.RoleAdmin)
	// serve prices with the built-in catalog less one model the workload's agents use:
	// their usage is unpriced, which the answers must count apart, never as cost 0.
	srv := s.serve(t, "--catalog", recCatalogWithout(t, s.dir, recUnpriced))
	t.Logf("serve ready after %s", time.Since(began).Round(time.Millisecond))

	// Simulated time runs at the pace of a busy workspace, not of the wall clock: a dry
	// run (no I/O) says how long the workload spans, so that the real one can start
	// early enough for its last event to be in the past (the collector refuses the
	// future) yet inside every range asked below.
	cfg := simulate.DefaultConfig()
	cfg.Seed, cfg.Events = 20261201, recEvents
	cfg.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dry := recRun(t, cfg, simulate.SinkFunc(func(context.Context, [][]byte) error { return nil }))
	span := dry.last.Sub(cfg.Start)
	cfg.Start = time.Now().UTC().Add(-max(span+5*time.Minute, 2*time.Hour)).Truncate(time.Second)
	require.Less(t, span, 20*time.Hour, "the workload must fit in workStatus's 24 hours")

	sent := time.Now()
	sim := recRun(t, cfg, simulate.NewHTTPSink(srv.url, platform))
	sum := sim.sum
	require.Equal(t, recEvents, sum.Events)
	require.Equal(t, dry.sum.CostMicros, sum.CostMicros, "the same workload, shifted in time")
	t.Logf("simulated %d events from %s to %s (%s of simulated time) through the collector in %s: %d messages, %d usage reports, cost %d µ%s, %d unpriced, contact outcomes %v, %d tasks",
		sum.Events, cfg.Start.Format(time.RFC3339), sim.last.Format(time.RFC3339), span.Round(time.Second), time.Since(sent).Round(time.Millisecond),
		sum.Messages, sum.UsageEvents, sum.CostMicros, sum.Currency, sum.UnpricedEvents, sum.ContactOutcomes, len(sim.tasks))
	require.NotEmpty(t, sim.tasks, "the workload creates tasks")
	require.NotEmpty(t, sum.ContactOutcomes, "the workload resolves contact requests")

	recWaitStored(t, s, sim.ids)
	t.Logf("ingest stored all %d events %s after the first was sent", len(sim.ids), time.Since(sent).Round(time.Millisecond))

	from, to := cfg.Start.Add(-time.Hour), time.Now().UTC().Add(time.Hour)
	gq := func(doc string, vars map[string]any, out any) {
		t.Helper()
		recAsk(t, srv, admin, doc, vars, out)
	}
	vars := func(org string) map[string]any {
		return map[string]any{"org": org, "from": from.Format(time.RFC3339), "to": to.Format(time.RFC3339)}
	}

	// Costs by agent and model. The hourly rollup runs every 500 ms (serve's
	// --rollup-interval in the tests): wait until its totals count every usage event.
	var costs map[string]recCostReport
	ok := stacktest.Eventually(t, 30*time.Second, 250*time.Millisecond, func() bool {
		costs = map[string]recCostReport{}
		n := int64(0)
		for _, org := range sim.orgs {
			var d struct{ Costs recCostReport }
			gq(recCostsQuery, vars(org), &d)
			costs[org] = d.Costs
			for _, tot := range d.Costs.Totals {
				n += tot.Events
			}
		}
		return n == int64(sum.UsageEvents)
	})
	require.True(t, ok, "the costs' totals never counted the %d usage events: %+v", sum.UsageEvents, costs)
	t.Logf("costs counted every usage event %s after the first was sent", time.Since(sent).Round(time.Millisecond))

	type agentUsage struct {
		Handle, Model    string
		Events, Unpriced int64
		Tokens           recTokens
		CostMicros       int64
	}
	// The summary prices with the built-in catalog; serve knows no price for
	// recUnpriced, so those agents' usage moves from cost to unpriced.
	want, got := map[string]agentUsage{}, map[string]agentUsage{}
	wantTotal := agentUsage{Events: int64(sum.UsageEvents), Unpriced: int64(sum.UnpricedEvents), CostMicros: sum.CostMicros,
		Tokens: recTokensOf(sum.InputTokens, sum.OutputTokens, sum.CacheReadTokens, sum.CacheWriteTokens, sum.ReasoningTokens)}
	var wantUnpriced recTokens
	for handle, as := range sum.ByAgent {
		if as.UsageEvents == 0 {
			continue
		}
		u := agentUsage{Handle: handle, Model: as.Model, Events: int64(as.UsageEvents), CostMicros: as.CostMicros,
			Tokens: recTokensOf(as.InputTokens, as.OutputTokens, as.CacheReadTokens, as.CacheWriteTokens, as.ReasoningTokens)}
		if as.Model == recUnpriced {
			u.Unpriced, u.CostMicros = u.Events, 0
			wantTotal.Unpriced += u.Events
			wantTotal.CostMicros -= as.CostMicros
			wantUnpriced = wantUnpriced.plus(u.Tokens)
		}
		want[as.ID] = u
	}
	require.Positive(t, wantTotal.Unpriced, "some agent with usage has model %s", recUnpriced)
	require.Less(t, wantTotal.Unpriced, int64(sum.UsageEvents), "some agent with usage has another model")
	var total agentUsage
	var unpricedRows, unpricedList int64
	var gotUnpriced, totalUnpriced recTokens
	unpricedModels := map[string]int64{}
	for _, org := range sim.orgs {
		rep := costs[org]
		assert.False(t, rep.Truncated, "costs of %s truncated", org)
		for _, r := range rep.Rows {
			require.NotNil(t, r.AgentID, "a row grouped by agent has its agent: %+v", r)
			assert.Equal(t, sim.agentOrg[*r.AgentID], org, "agent %s's usage is in its own organization", *r.AgentID)
			if r.PricedEvents != r.Events-r.UnpricedEvents {
				t.Errorf("costs of %s, agent %s: priced %d + unpriced %d events != %d", org, *r.AgentID, r.PricedEvents, r.UnpricedEvents, r.Events)
			}
			u := got[*r.AgentID]
			if u.Model != "" {
				t.Errorf("agent %s has two rows, models %q and %q: its usage has the registered model only", *r.AgentID, u.Model, recStr(r.Model))
			}
			u.Handle, u.Model = recStr(r.AgentHandle), recStr(r.Model)
			u.Events += r.Events
			u.Unpriced += r.UnpricedEvents
			u.Tokens = u.Tokens.plus(r.Tokens)
			switch {
			case r.Cost != nil && r.PricedEvents == 0:
				t.Errorf("agent %s: cost %s without a priced event: unpriced usage counted as a cost", *r.AgentID, *r.Cost)
			case r.Cost != nil:
				u.CostMicros += recMicros(t, *r.Cost)
			case r.PricedEvents > 0:
				t.Errorf("agent %s: %d priced events and no cost", *r.AgentID, r.PricedEvents)
			}
			if r.UnpricedEvents == 0 && r.UnpricedTokens != (recTokens{}) {
				t.Errorf("agent %s: unpriced tokens %+v without an unpriced event", *r.AgentID, r.UnpricedTokens)
			}
			gotUnpriced = gotUnpriced.plus(r.UnpricedTokens)
			unpricedRows += r.UnpricedEvents
			got[*r.AgentID] = u
		}
		for _, tot := range rep.Totals {
			assert.Equal(t, sum.Currency, tot.Currency)
			total.Events += tot.Events
			total.Unpriced += tot.UnpricedEvents
			total.Tokens = total.Tokens.plus(tot.Tokens)
			total.CostMicros += recMicros(t, tot.Cost)
			if tot.PricedEvents != tot.Events-tot.UnpricedEvents {
				t.Errorf("costs' totals of %s: priced %d + unpriced %d events != %d", org, tot.PricedEvents, tot.UnpricedEvents, tot.Events)
			}
			totalUnpriced = totalUnpriced.plus(tot.UnpricedTokens)
		}
		for _, u := range rep.Unpriced {
			unpricedList += u.Events
			unpricedModels[u.Model] += u.Events
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("costs by agent and model differ from the simulator's summary (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantTotal, total); diff != "" {
		t.Errorf("costs' totals differ from the simulator's summary (-want +got):\n%s", diff)
	}
	assert.Equal(t, wantTotal.Unpriced, unpricedRows, "unpriced events of the rows")
	assert.Equal(t, wantTotal.Unpriced, unpricedList, "unpriced events of the unpriced models")
	assert.Equal(t, map[string]int64{recUnpriced: wantTotal.Unpriced}, unpricedModels, "the unpriced models")
	assert.Equal(t, wantUnpriced, gotUnpriced, "unpriced tokens of the rows")
	assert.Equal(t, wantUnpriced, totalUnpriced, "unpriced tokens of the totals")

	// The same usage hour by hour, one series per agent: the buckets add up to it.
	gotSeries := map[string]agentUsage{}
	for _, org := range sim.orgs {
		var d struct {
			UsageSeries []struct {
				Key, Name *string
				Currency  string
				Points    []struct {
					Events, UnpricedEvents int64
					Tokens                 recTokens
					Cost                   string
				}
			}
		}
		gq(recSeriesQuery, vars(org), &d)
		require.Less(t, len(d.UsageSeries), 100, "usageSeries of %s hit its limit: raise it", org)
		for _, sr := range d.UsageSeries {
			require.NotNil(t, sr.Key, "a series split by agent has its agent")
			u := agentUsage{Handle: recStr(sr.Name), Model: want[*sr.Key].Model}
			for _, pt := range sr.Points {
				u.Events += pt.Events
				u.Unpriced += pt.UnpricedEvents
				u.Tokens = u.Tokens.plus(pt.Tokens)
				u.CostMicros += recMicros(t, pt.Cost)
			}
			if u.Events > 0 {
				gotSeries[*sr.Key] = u
			}
		}
	}
	if diff := cmp.Diff(want, gotSeries); diff != "" {
		t.Errorf("usageSeries by agent differ from the simulator's summary (-want +got):\n%s", diff)
	}

	// Messages, tokens and cost per agent, over a window holding the whole run.
	type chatty struct {
		Handle     string
		Messages   int64
		Tokens     recTokens
		CostMicros int64
	}
	wantChat, gotChat := map[string]chatty{}, map[string]chatty{}
	for handle, as := range sum.ByAgent {
		if as.Messages > 0 { // the ranking lists the agents that posted
			c := chatty{Handle: handle, Messages: int64(as.Messages), CostMicros: as.CostMicros,
				Tokens: recTokensOf(as.InputTokens, as.OutputTokens, as.CacheReadTokens, as.CacheWriteTokens, as.ReasoningTokens)}
			if as.Model == recUnpriced {
				c.CostMicros = 0 // the cost of its priced usage: none
			}
			wantChat[as.ID] = c
		}
	}
	for _, org := range sim.orgs {
		var d struct {
			ChattyAgents []recChatty
		}
		gq(recChattyQuery, vars(org), &d)
		require.Less(t, len(d.ChattyAgents), 100, "chattyAgents of %s hit its limit: raise it", org)
		for _, c := range d.ChattyAgents {
			assert.Equal(t, sim.agentOrg[c.AgentID], org, "agent %s is ranked in its own organization", c.AgentID)
			gotChat[c.AgentID] = chatty{Handle: recStr(c.AgentHandle), Messages: c.Messages, Tokens: c.Tokens, CostMicros: recMicros(t, c.Cost)}
		}
	}
	if diff := cmp.Diff(wantChat, gotChat); diff != "" {
		t.Errorf("chattyAgents differ from the simulator's summary (-want +got):\n%s", diff)
	}
	chattyID := sum.ByAgent[sum.ChattyAgent].ID
	assert.Equal(t, int64(sum.ByAgent[sum.ChattyAgent].Messages), gotChat[chattyID].Messages, "the talkative agent %s", sum.ChattyAgent)

	// Events per type: the audit trails of all organizations hold every line once. A
	// first page shows the rows ingested up to 2 s ago (its watermark, query/audit.go's
	// asOfSettle): ask again until the last batches are in.
	var gotTypes map[string]int
	stacktest.Eventually(t, 15*time.Second, 250*time.Millisecond, func() bool {
		gotTypes = map[string]int{}
		for _, org := range sim.orgs {
			before := ""
			for page := 0; ; page++ {
				require.Less(t, page, 100, "auditEvents of %s never ends", org)
				v := vars(org)
				if before != "" {
					v["before"] = before
				}
				var d struct {
					AuditEvents struct {
						Events []struct {
							ID, Type, Source string
						}
						NextCursor *string
					}
				}
				gq(recAuditQuery, v, &d)
				for _, e := range d.AuditEvents.Events {
					if !schema.OwnSource(e.Source) { // serve's own: decisions, keys, seals
						gotTypes[e.Type]++
					}
				}
				if d.AuditEvents.NextCursor == nil {
					break
				}
				before = *d.AuditEvents.NextCursor
			}
		}
		return cmp.Equal(sum.ByType, gotTypes)
	})
	if diff := cmp.Diff(sum.ByType, gotTypes); diff != "" {
		t.Errorf("events per type in the audit trails differ from the simulator's summary (-want +got):\n%s", diff)
	}
	assert.Equal(t, sum.Messages, gotTypes[schema.TypeMessageCreated], "messages")

	// Contact requests: the statuses each went through, the latest, and the outcomes.
	gotReq, gotHistory := map[string]string{}, map[string][]string{}
	gotOutcomes := map[string]int{}
	for _, org := range sim.orgs {
		var d struct {
			ContactRequests struct {
				Requests []struct {
					RequestID, Status, AgentID string
					History                    []struct{ Status string }
				}
				Truncated bool
			}
		}
		gq(recContactsQuery, vars(org), &d)
		assert.False(t, d.ContactRequests.Truncated, "contactRequests of %s truncated", org)
		for _, r := range d.ContactRequests.Requests {
			assert.Equal(t, sim.agentOrg[r.AgentID], org, "request %s is in its recipient's organization", r.RequestID)
			if _, dup := gotReq[r.RequestID]; dup {
				t.Errorf("request %s is listed twice", r.RequestID)
			}
			gotReq[r.RequestID] = r.Status
			for i, h := range r.History {
				gotHistory[r.RequestID] = append(gotHistory[r.RequestID], h.Status)
				if i > 0 { // the steps after the request: its updates
					gotOutcomes[h.Status]++
				}
			}
		}
	}
	wantReq := map[string]string{}
	for id, steps := range sim.requests {
		wantReq[id] = steps[len(steps)-1]
	}
	if diff := cmp.Diff(wantReq, gotReq); diff != "" {
		t.Errorf("contact requests' statuses differ from the lines sent (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sim.requests, gotHistory); diff != "" {
		t.Errorf("contact requests' histories differ from the lines sent (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sum.ContactOutcomes, gotOutcomes); diff != "" {
		t.Errorf("contact outcomes differ from the simulator's summary (-want +got):\n%s", diff)
	}

	// Tasks: every task the simulator created shows in its room with its last status.
	gotTasks := map[string]recTask{}
	for _, org := range sim.orgs {
		var d struct {
			WorkStatus struct {
				Rooms []struct {
					RoomID string
					Tasks  []struct {
						ID, RoomID, Title, Status, AssigneeID string
					}
				}
				Truncated bool
			}
		}
		gq(recWorkQuery, map[string]any{"org": org}, &d)
		assert.False(t, d.WorkStatus.Truncated, "workStatus of %s truncated", org)
		for _, rm := range d.WorkStatus.Rooms {
			for _, tk := range rm.Tasks {
				assert.Equal(t, rm.RoomID, tk.RoomID)
				if _, dup := gotTasks[tk.ID]; dup {
					t.Errorf("task %s shows twice", tk.ID)
				}
				gotTasks[tk.ID] = recTask{Room: tk.RoomID, Title: tk.Title, Status: tk.Status, Assignee: tk.AssigneeID}
			}
		}
	}
	if diff := cmp.Diff(sim.tasks, gotTasks); diff != "" {
		t.Errorf("workStatus' tasks differ from the lines sent (-want +got):\n%s", diff)
	}
	statuses := map[string]int{}
	for _, tk := range sim.tasks {
		statuses[tk.Status]++
	}
	t.Logf("reconciled %d agents' costs (%d usage events unpriced: %s), %d agents' messages, %d types, %d contact requests, %d tasks (%v) in %s",
		len(want), wantTotal.Unpriced, recUnpriced, len(wantChat), len(sum.ByType), len(wantReq), len(sim.tasks), statuses, time.Since(began).Round(time.Millisecond))
	srv.alive()
}

// recSim is a simulator run: its summary, and what the lines it sent say.
type recSim struct {
	sum      simulate.Summary
	last     time.Time           // the latest event's time
	ids      []string            // every event id
	orgs     []string            // the organizations, sorted
	agentOrg map[string]string   // agent id → organization
	tasks    map[string]recTask  // task id → as its last event left it
	requests map[string][]string // contact request id → its statuses, in order
}

type recTask struct{ Room, Title, Status, Assignee string }

// recRun runs the simulator into sink and decodes every line it accepted, as ingest
// does (schema.Decode), for what the Summary does not list.
func recRun(t *testing.T, cfg simulate.Config, sink simulate.Sink) recSim {
	t.Helper()
	r := recSim{agentOrg: map[string]string{}, tasks: map[string]recTask{}, requests: map[string][]string{}}
	orgs := map[string]bool{}
	tap := simulate.SinkFunc(func(ctx context.Context, lines [][]byte) error {
		if err := sink.Send(ctx, lines); err != nil {
			return err
		}
		for _, l := range lines {
			ev, err := schema.Decode(l)
			if err != nil {
				return fmt.Errorf("cannot decode a line the simulator sent: %w\n%s", err, l)
			}
			r.ids = append(r.ids, ev.ID)
			if ev.Time.After(r.last) {
				r.last = ev.Time
			}
			switch {
			case ev.Type == schema.TypeAgentRegistered:
				orgs[ev.OrgID] = true
				r.agentOrg[ev.Subject.ID] = ev.OrgID
			case ev.Type == schema.TypeUserRegistered:
				orgs[ev.OrgID] = true
			case strings.HasPrefix(ev.Type, "task."):
				var d schema.TaskData
				if err := json.Unmarshal(ev.Data, &d); err != nil {
					return fmt.Errorf("cannot read task event %s: %w", ev.ID, err)
				}
				r.tasks[d.TaskID] = recTask{Room: ev.RoomID, Title: d.Title, Status: d.Status, Assignee: d.Assignee}
			case ev.Type == schema.TypeContactRequestReceived || ev.Type == schema.TypeContactRequestUpdated:
				var d schema.ContactData
				if err := json.Unmarshal(ev.Data, &d); err != nil {
					return fmt.Errorf("cannot read contact event %s: %w", ev.ID, err)
				}
				r.requests[d.RequestID] = append(r.requests[d.RequestID], d.Status)
			}
		}
		return nil
	})
	sum, err := simulate.Run(context.Background(), cfg, tap, nil)
	require.NoError(t, err)
	r.sum = sum
	for org := range orgs {
		r.orgs = append(r.orgs, org)
	}
	sort.Strings(r.orgs)
	return r
}

// recCatalogWithout writes the built-in price catalog without model into dir and
// returns the file's path.
func recCatalogWithout(t *testing.T, dir, model string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stacktest.RepoRoot(), "schema", "pricing", "catalog.json"))
	require.NoError(t, err)
	var cat map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &cat))
	var models, kept []json.RawMessage
	require.NoError(t, json.Unmarshal(cat["models"], &models))
	for _, m := range models {
		var name struct{ Model string }
		require.NoError(t, json.Unmarshal(m, &name))
		if name.Model != model {
			kept = append(kept, m)
		}
	}
	require.Len(t, kept, len(models)-1, "the built-in catalog lists %s once", model)
	cat["models"], err = json.Marshal(kept)
	require.NoError(t, err)
	cat["version"] = json.RawMessage(`"reconcile-test"`)
	out, err := json.Marshal(cat)
	require.NoError(t, err)
	path := filepath.Join(dir, "catalog.json")
	require.NoError(t, os.WriteFile(path, out, 0o600))
	return path
}

// recWaitStored waits until ClickHouse holds every event id.
func recWaitStored(t *testing.T, s *stack, ids []string) {
	t.Helper()
	var n uint64
	var err error
	ok := stacktest.Eventually(t, 40*time.Second, 250*time.Millisecond, func() bool {
		err = s.conn.QueryRow(context.Background(), "SELECT uniqExact(id) FROM "+s.db+".events WHERE has(?, id)", ids).Scan(&n)
		return err == nil && n == uint64(len(ids))
	})
	require.True(t, ok, "ClickHouse holds %d of the %d events sent (%v)", n, len(ids), err)
}

// recAsk posts a GraphQL query and decodes its data into out; any error fails.
func recAsk(t *testing.T, srv *server, token, doc string, vars map[string]any, out any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": doc, "variables": vars})
	require.NoError(t, err)
	code, b := srv.do(http.MethodPost, "/graphql", token, "application/json", body)
	var ans struct {
		Data   json.RawMessage
		Errors []json.RawMessage
	}
	require.NoError(t, json.Unmarshal(b, &ans), "%d %s", code, b)
	require.Empty(t, ans.Errors, "%s\nvariables %v", b, vars)
	require.NoError(t, json.Unmarshal(ans.Data, out), "%s", ans.Data)
}

// recMicros is an exact decimal amount in millionths; more decimals fail.
func recMicros(t *testing.T, s string) int64 {
	t.Helper()
	d, err := decimal.NewFromString(s)
	require.NoError(t, err, "cost %q", s)
	m := d.Shift(6)
	require.True(t, m.IsInteger(), "cost %q has more than 6 decimals", s)
	return m.IntPart()
}

func recStr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// recTokens is a Tokens answer; Total is the sum of the five kinds, so sums of
// recTokensOf compared with answers check the answers' totals too.
type recTokens struct {
	Input, Output, CacheRead, CacheWrite, Reasoning, Total int64
}

func recTokensOf(input, output, cacheRead, cacheWrite, reasoning int64) recTokens {
	return recTokens{input, output, cacheRead, cacheWrite, reasoning, input + output + cacheRead + cacheWrite + reasoning}
}

func (a recTokens) plus(b recTokens) recTokens {
	return recTokens{a.Input + b.Input, a.Output + b.Output, a.CacheRead + b.CacheRead, a.CacheWrite + b.CacheWrite,
		a.Reasoning + b.Reasoning, a.Total + b.Total}
}

type recCostReport struct {
	Rows []struct {
		AgentID, AgentHandle, Model          *string
		Events, PricedEvents, UnpricedEvents int64
		Tokens, UnpricedTokens               recTokens
		Cost                                 *string
		Currency                             string
	}
	Truncated bool
	Totals    []struct {
		Currency                             string
		Events, PricedEvents, UnpricedEvents int64
		Tokens, UnpricedTokens               recTokens
		Cost                                 string
	}
	Unpriced []struct {
		Model  string
		Events int64
		Tokens recTokens
	}
}

type recChatty struct {
	AgentID     string
	AgentHandle *string
	Messages    int64
	Tokens      recTokens
	Cost        string
	Currency    string
}

const recTokenFields = `{ input output cacheRead cacheWrite reasoning total }`

const recCostsQuery = `query($org: ID, $from: Time!, $to: Time!) {
  costs(orgId: $org, from: $from, to: $to, groupBy: [AGENT, MODEL], limit: 500) {
    rows { agentId agentHandle model events pricedEvents unpricedEvents tokens ` + recTokenFields + ` unpricedTokens ` + recTokenFields + ` cost currency }
    truncated
    totals { currency events pricedEvents unpricedEvents tokens ` + recTokenFields + ` unpricedTokens ` + recTokenFields + ` cost }
    unpriced { model events tokens ` + recTokenFields + ` }
  }
}`

const recSeriesQuery = `query($org: ID, $from: Time!, $to: Time!) {
  usageSeries(orgId: $org, from: $from, to: $to, interval: HOUR, split: AGENT, limit: 100) {
    key name currency points { events unpricedEvents tokens ` + recTokenFields + ` cost }
  }
}`

const recChattyQuery = `query($org: ID, $from: Time, $to: Time) {
  chattyAgents(orgId: $org, from: $from, to: $to, limit: 100) { agentId agentHandle messages tokens ` + recTokenFields + ` cost currency }
}`

const recAuditQuery = `query($org: ID, $from: Time, $to: Time, $before: String) {
  auditEvents(orgId: $org, from: $from, to: $to, limit: 5000, before: $before) { events { id type source } nextCursor }
}`

const recContactsQuery = `query($org: ID, $from: Time, $to: Time) {
  contactRequests(orgId: $org, from: $from, to: $to, limit: 1000) { requests { requestId status agentId history { status } } truncated }
}`

const recWorkQuery = `query($org: ID) {
  workStatus(orgId: $org) { rooms { roomId tasks { id roomId title status assigneeId } } truncated }
}`
