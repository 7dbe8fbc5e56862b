package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// budgetBundle is the built-in policy bundle with the message rates of org lifted, so
// that only the budget can refuse the test's burst of decisions.
func budgetBundle(t *testing.T, org string) string {
	return bundleWithQuotas(t, `{"messages_per_window_agent": 100000, "messages_per_window_agent_room": 100000}`, org)
}

// bundleWithQuotas is a copy of the built-in policy bundle whose data.json gives each
// of orgs the quota (JSON) instead of the default.
func bundleWithQuotas(t *testing.T, quota string, orgs ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(stacktest.RepoRoot(), "policy", "rego")
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		if e.Name() == "data.json" {
			var doc map[string]map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(b, &doc))
			var quotas map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(doc["quotas"]["orgs"], &quotas))
			for _, org := range orgs {
				quotas[org] = json.RawMessage(quota)
			}
			doc["quotas"]["orgs"], err = json.Marshal(quotas)
			require.NoError(t, err)
			b, err = json.Marshal(doc)
			require.NoError(t, err)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644))
	}
	return dir
}

type budgetAnswer struct {
	ID, ScopeName                                string
	SpentTokens, ReservedTokens, ProjectedTokens int64
	RemainingTokens                              *int64
}

// soleBudget reads the one budget key's organization has.
func soleBudget(t *testing.T, srv *server, key string) budgetAnswer {
	t.Helper()
	a := isoAsk(t, srv, key, `{ budgets { id scopeName spentTokens reservedTokens projectedTokens remainingTokens } }`)
	require.Empty(t, a.Errors, "%s", a.raw)
	var out struct{ Budgets []budgetAnswer }
	require.NoError(t, json.Unmarshal(a.Data, &out))
	require.Len(t, out.Budgets, 1, "%s", a.raw)
	return out.Budgets[0]
}

// TestIntegrationBudgetsHoldUnderConcurrency is the test on the real stack: a
// hard budget set through GraphQL, 200 concurrent send_message decisions over HTTP each
// estimating 1/20 of its remaining room: exactly 20 are allowed; once their usage
// arrives (by execution id) the budget's spend is the actual spend and nothing stays
// reserved; the crossings of 80 % and 100 % come once each, live and in the trail.
// Then the operator mutations: a suspension denies at once and shows on policyDenied,
// a resume lifts it.
func TestIntegrationBudgetsHoldUnderConcurrency(t *testing.T) {
	s := newStack(t)
	tn := newIsoTenant("budget", isoTag())
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "platform-router", keys.PlatformOrg, keys.RoleRouter)
	manager := s.key(t, "budget-manager", tn.org, keys.RoleManager)
	operator := s.key(t, "budget-operator", tn.org, keys.RoleOperator)
	viewer := s.key(t, "budget-viewer", tn.org, keys.RoleViewer)
	other := s.key(t, "other-manager", "org-other-"+tn.tag, keys.RoleManager)
	metrics := s.key(t, "budget-metrics", keys.PlatformOrg, keys.RoleOperator)
	srv := s.serve(t, "--policy-dir", budgetBundle(t, tn.org))

	// The budget is a day's, and the seed's usage must count in it: the whole test runs
	// inside one UTC day, and the seed lies in it too, 10 minutes back or at midnight.
	stacktest.AwayFromMidnight(t, 10*time.Minute)
	seedAt := time.Now().UTC().Add(-10 * time.Minute)
	seedAt = seedAt.Add(max(0, time.Now().UTC().Truncate(24*time.Hour).Sub(seedAt)))
	isoPost(t, srv, platform, tn.seed(t, seedAt))
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return isoDecide(t, srv, router, tn.coder.ID, tn.room, 0).Allow
	}), "the policy directory never let the coder post")

	// Hostile inputs first: each refused with a code and nothing set.
	for doc, code := range map[string]string{
		`mutation { setBudget(budget: {scope: OWNER, scopeId: "` + tn.lead.ID + `", period: DAY, tokens: 5, mode: HARD}) { id } }`:              "FORBIDDEN", // viewer
		`mutation { setBudget(orgId: "org-x", budget: {scope: ORG, period: DAY, tokens: 5, mode: HARD}) { id } }`:                               "FORBIDDEN",
		`mutation { setBudget(budget: {scope: AGENT, scopeId: "agt_nobody", period: DAY, tokens: 5, mode: HARD}) { id } }`:                      "BAD_USER_INPUT",
		`mutation { setBudget(budget: {scope: AGENT, scopeId: "` + tn.coder.ID + `", period: DAY, cost: "1.0000001", mode: HARD}) { id } }`:     "BAD_USER_INPUT",
		`mutation { setBudget(budget: {scope: AGENT, scopeId: "` + tn.coder.ID + `", period: DAY, cost: "-1", mode: HARD}) { id } }`:            "BAD_USER_INPUT",
		`mutation { setBudget(budget: {scope: AGENT, scopeId: "` + tn.coder.ID + `", period: DAY, tokens: -5, mode: HARD}) { id } }`:            "BAD_USER_INPUT",
		`mutation { setBudget(budget: {scope: AGENT, scopeId: "` + tn.coder.ID + `", period: DAY, mode: HARD}) { id } }`:                        "BAD_USER_INPUT",
		`mutation { setBudget(budget: {scope: ROOM, scopeId: "` + strings.Repeat("r", 300) + `", period: DAY, tokens: 5, mode: SOFT}) { id } }`: "BAD_USER_INPUT",
		`mutation { deleteBudget(id: "bud_nope") { id } }`:                                                                                      "BAD_USER_INPUT",
		`mutation { suspendAgent(agentId: "agt_nobody") { suspended } }`:                                                                        "FORBIDDEN", // manager is no operator
	} {
		token := manager
		if strings.Contains(doc, "mode: HARD}) { id } }") && strings.Contains(doc, `scope: OWNER`) {
			token = viewer
		}
		ans := isoAsk(t, srv, token, doc)
		require.NotEmpty(t, ans.Errors, "%s: %s", doc, ans.raw)
		assert.Equal(t, code, ans.Errors[0].code(), "%s: %s", doc, ans.raw)
	}
	ans := isoAsk(t, srv, other, `{ budgets { id } }`)
	require.Empty(t, ans.Errors, "%s", ans.raw)
	assert.JSONEq(t, `{"budgets": []}`, string(ans.Data), "another organization sees none")

	// The budget: the owner's tokens per day, hard.
	ans = isoAsk(t, srv, manager, `mutation { setBudget(budget: {scope: OWNER, scopeId: "`+tn.lead.ID+`", period: DAY, tokens: 1000000, mode: HARD}) { id scopeId mode tokens } }`)
	require.Empty(t, ans.Errors, "%s", ans.raw)
	budgets := func() budgetAnswer { t.Helper(); return soleBudget(t, srv, manager) }
	// The seed's usage (two reports of the lead's agents) counts already.
	seedTokens := int64(1200 + 300 + 10 + 5 + 700 + 90 + 10 + 5)
	require.True(t, stacktest.Eventually(t, time.Minute, 200*time.Millisecond, func() bool { return budgets().SpentTokens == seedTokens }),
		"the budget never showed the seed's usage: %+v", budgets())
	// Names come from ingest's directory table, which may lag the replica a little.
	assert.True(t, stacktest.Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool { return budgets().ScopeName == tn.lead.Handle }),
		"the budget's scope is never named: %+v", budgets())
	b := budgets()
	remaining := 1_000_000 - seedTokens
	estimate := remaining / 20

	// Live crossings, as the manager sees them.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(srv.url, "http") + "/graphql"
	conn, err := wsclient.Dial(ctx, wsURL, manager)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, crossings, err := conn.Subscribe(ctx, `subscription { budgetExceeded { threshold eventId budget { id scopeId reservedTokens spentTokens } } }`, nil, 16)
	require.NoError(t, err)
	waitSubscribed(t, srv, metrics, 1)

	type granted struct{ agent, exec string }
	var mu sync.Mutex
	var allowed []granted
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		wg.Go(func() {
			agent := tn.coder.ID
			room := tn.room
			if i%2 == 1 {
				agent, room = tn.writer.ID, tn.room2
			}
			exec := fmt.Sprintf("exec-%s-%03d", tn.tag, i)
			body, _ := json.Marshal(map[string]any{"agent": agent, "room": room, "tokens": estimate, "execution_id": exec})
			<-start
			code, out := srv.do(http.MethodPost, "/v1/decisions/send_message", router, "application/json", body)
			var d isoDecision
			if !assert.Equal(t, http.StatusOK, code, "%s", out) || !assert.NoError(t, json.Unmarshal(out, &d)) {
				return
			}
			if d.Allow {
				mu.Lock()
				allowed = append(allowed, granted{agent, exec})
				mu.Unlock()
			} else if assert.NotEmpty(t, d.Reasons) {
				assert.Equal(t, policy.CodeBudgetExceeded, d.Reasons[0].Code, "%s", out)
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("200 concurrent decisions in %s: %d allowed", time.Since(began).Round(time.Millisecond), len(allowed))
	require.Len(t, allowed, 20, "exactly the budget's room (20 estimates of 1/20), never more")
	b = budgets()
	assert.Equal(t, [2]int64{seedTokens, 20 * estimate}, [2]int64{b.SpentTokens, b.ReservedTokens})
	require.NotNil(t, b.RemainingTokens)
	assert.Equal(t, remaining-20*estimate, *b.RemainingTokens)

	// Their usage arrives: actual replaces estimate.
	var actual int64
	var usage []schema.Event
	for i, g := range allowed {
		used := estimate/2 + int64(i)
		actual += used
		agent, room := tn.coder, tn.room
		if g.agent == tn.writer.ID {
			agent, room = tn.writer, tn.room2
		}
		ev := tn.event(t, schema.TypeUsageReported, room, agent, nil, schema.UsageData{InputTokens: used, Model: "gpt-5-mini"}, time.Now().UTC())
		ev.ExecutionID = g.exec
		usage = append(usage, ev)
	}
	isoPost(t, srv, platform, usage)
	require.True(t, stacktest.Eventually(t, 20*time.Second, 200*time.Millisecond, func() bool {
		b = budgets()
		return b.SpentTokens == seedTokens+actual && b.ReservedTokens == 0
	}), "after the usage: want spent %d and nothing reserved, got %+v", seedTokens+actual, b)

	// 80 % and 100 % were crossed once each by the reservations; none since.
	var thresholds []int
	var crossedIDs []string
	timeout := time.After(30 * time.Second)
	for len(thresholds) < 2 {
		select {
		case m := <-crossings:
			require.Empty(t, m.Errors, "%s", m.Data)
			var x struct {
				BudgetExceeded struct {
					Threshold int
					EventID   string
					Budget    struct{ ID, ScopeID string }
				}
			}
			require.NoError(t, json.Unmarshal(m.Data, &x))
			assert.Equal(t, b.ID, x.BudgetExceeded.Budget.ID)
			thresholds = append(thresholds, x.BudgetExceeded.Threshold)
			crossedIDs = append(crossedIDs, x.BudgetExceeded.EventID)
		case <-timeout:
			t.Fatalf("budgetExceeded delivered %v after 30 s, want 80 and 100", thresholds)
		}
	}
	assert.ElementsMatch(t, []int{80, 100}, thresholds)
	// None since: a budget set now below what the writer spent is crossed at once, on the
	// same ledger, recorded by the same loop under the same Kafka key (the organization)
	// as the first budget's crossings, so its crossings come after any the usage caused.
	ans = isoAsk(t, srv, manager, `mutation { setBudget(budget: {scope: AGENT, scopeId: "`+tn.writer.ID+`", period: DAY, tokens: 1, mode: SOFT}) { id } }`)
	require.Empty(t, ans.Errors, "%s", ans.raw)
	var marker struct{ SetBudget struct{ ID string } }
	require.NoError(t, json.Unmarshal(ans.Data, &marker))
	select {
	case m := <-crossings:
		var x struct {
			BudgetExceeded struct{ Budget struct{ ID string } }
		}
		require.NoError(t, json.Unmarshal(m.Data, &x), "%s", m.Data)
		require.Equal(t, marker.SetBudget.ID, x.BudgetExceeded.Budget.ID, "a third crossing: %s", m.Data)
	case <-time.After(30 * time.Second):
		t.Fatal("the writer's budget set below its spend was never crossed")
	}
	ans = isoAsk(t, srv, manager, `mutation { deleteBudget(id: "`+marker.SetBudget.ID+`") { id } }`)
	require.Empty(t, ans.Errors, "%s", ans.raw)
	isoWaitStored(t, s, crossedIDs) // the budget.crossed audit events are in the trail

	// Operator actions: a suspension denies at once and shows live; a resume lifts it.
	// (Its own connection: the burst's 180 denials would fill a channel nobody reads.)
	dconn, err := wsclient.Dial(ctx, wsURL, manager)
	require.NoError(t, err)
	defer func() { _ = dconn.Close() }()
	_, denials, err := dconn.Subscribe(ctx, `subscription { policyDenied { decision { agentId reasons { code } } } }`, nil, 64)
	require.NoError(t, err)
	waitSubscribed(t, srv, metrics, 2) // budgetExceeded's and this one
	for _, r := range []string{viewer, manager} {
		a := isoAsk(t, srv, r, `mutation { suspendAgent(agentId: "`+tn.coder.ID+`") { suspended } }`)
		require.NotEmpty(t, a.Errors)
		assert.Equal(t, "FORBIDDEN", a.Errors[0].code())
	}
	a := isoAsk(t, srv, operator, `mutation { suspendAgent(agentId: "`+tn.coder.ID+`", reason: "chatty") { agentId agentHandle suspended eventIds } }`)
	require.Empty(t, a.Errors, "%s", a.raw)
	var sus struct {
		SuspendAgent struct {
			AgentID, AgentHandle string
			Suspended            bool
			EventIds             []string
		}
	}
	require.NoError(t, json.Unmarshal(a.Data, &sus))
	assert.True(t, sus.SuspendAgent.Suspended)
	assert.Equal(t, tn.coder.Handle, sus.SuspendAgent.AgentHandle)
	assert.Len(t, sus.SuspendAgent.EventIds, 2, "agent.suspended and agent.control")
	d := isoDecide(t, srv, router, tn.coder.ID, tn.room, 0)
	require.False(t, d.Allow)
	assert.Equal(t, "suspended", d.Reasons[0].Code)
	seen := false
	for !seen {
		select {
		case m := <-denials:
			seen = strings.Contains(string(m.Data), tn.coder.ID) && strings.Contains(string(m.Data), `"suspended"`)
		case <-time.After(10 * time.Second):
			t.Fatal("policyDenied did not show the suspended agent's denial within 10 s")
		}
	}
	a = isoAsk(t, srv, operator, `mutation { suspendAgent(agentId: "`+tn.writer.ID+`", reason: "`+strings.Repeat("x", 2000)+`") { suspended } }`)
	require.NotEmpty(t, a.Errors)
	assert.Equal(t, "BAD_USER_INPUT", a.Errors[0].code(), "an overlong reason")
	a = isoAsk(t, srv, operator, `mutation { resumeAgent(agentId: "`+tn.coder.ID+`") { suspended } }`)
	require.Empty(t, a.Errors, "%s", a.raw)
	assert.JSONEq(t, `{"resumeAgent": {"suspended": false}}`, string(a.Data))
	assert.True(t, isoDecide(t, srv, router, tn.coder.ID, tn.room, 0).Allow, "resumed")
	isoWaitStored(t, s, sus.SuspendAgent.EventIds)

	// The CLI: set a soft month budget of the writer, seen by serve within seconds;
	// list it; delete it. A wrong scope is a flag error.
	cli := func(args ...string) (string, error) {
		args = append(args, "--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db,
			"--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic)
		out, err := exec.Command(bandplaneBinary(t), args...).CombinedOutput()
		return string(out), err
	}
	out, err := cli("budgets", "set", "--org", tn.org, "--scope", "team", "--id", "x", "--period", "day", "--tokens", "5")
	require.Error(t, err)
	assert.Contains(t, out, `scope: "team" is not one of org, owner, agent, room`)
	out, err = cli("budgets", "set", "--org", tn.org, "--scope", "agent", "--id", "agt_nobody", "--period", "day", "--tokens", "5")
	require.Error(t, err)
	assert.Contains(t, out, `is not registered in organization`)
	out, err = cli("budgets", "set", "--org", tn.org, "--scope", "agent", "--id", tn.writer.ID, "--period", "month", "--cost", "12.5", "--mode", "soft", "--by", "ops")
	require.NoError(t, err, out)
	var set policy.Budget
	require.NoError(t, json.Unmarshal([]byte(out), &set), out)
	assert.Equal(t, int64(12_500_000), set.CostMicros)
	require.True(t, stacktest.Eventually(t, 20*time.Second, 200*time.Millisecond, func() bool {
		a := isoAsk(t, srv, manager, `{ budgets { id } }`)
		return strings.Contains(string(a.Data), set.ID)
	}), "serve never applied the CLI's budget")
	require.True(t, stacktest.Eventually(t, 20*time.Second, 200*time.Millisecond, func() bool {
		out, err = cli("budgets", "list", "--org", tn.org, "--table")
		return err == nil && strings.Contains(out, set.ID)
	}), "budgets list: %s %v", out, err)
	assert.Contains(t, out, "12.50")
	out, err = cli("budgets", "delete", "--org", tn.org, "--id", set.ID)
	require.NoError(t, err, out)
	require.True(t, stacktest.Eventually(t, 20*time.Second, 200*time.Millisecond, func() bool {
		a := isoAsk(t, srv, manager, `{ budgets { id } }`)
		return !strings.Contains(string(a.Data), set.ID)
	}), "serve never applied the CLI's deletion")

	// A restart: the budget comes back from the budgets table, its spend from the usage.
	srv.stop()
	srv = s.serve(t, "--policy-dir", budgetBundle(t, tn.org))
	b2 := budgets()
	assert.Equal(t, b.ID, b2.ID)
	assert.Equal(t, [2]int64{seedTokens + actual, 0}, [2]int64{b2.SpentTokens, b2.ReservedTokens}, "restored after a restart")

	// Deleting the budget lifts it.
	a = isoAsk(t, srv, manager, `mutation { deleteBudget(id: "`+b.ID+`") { id } }`)
	require.Empty(t, a.Errors, "%s", a.raw)
	a = isoAsk(t, srv, manager, `{ budgets { id } }`)
	assert.JSONEq(t, `{"budgets": []}`, string(a.Data))
	srv.alive()
}
