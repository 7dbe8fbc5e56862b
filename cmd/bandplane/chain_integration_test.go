package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
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

// chainDecide asks send_message for agent in room with a chain (JSON) over HTTP and
// returns the status and the body.
func chainDecide(srv *server, key, agent, room string, tokens int64, exec, chain string) (int, []byte) {
	body := fmt.Sprintf(`{"agent":%q,"room":%q,"tokens":%d,"execution_id":%q,"chain":%s}`, agent, room, tokens, exec, chain)
	return srv.do(http.MethodPost, "/v1/decisions/send_message", key, "application/json", []byte(body))
}

type chainDecision struct {
	Allow   bool `json:"allow"`
	Reasons []struct {
		Code, Message string
	} `json:"reasons"`
}

// TestIntegrationInitiatorBudgetHoldsUnderConcurrency: a hard day budget on one
// person's requests (scope INITIATOR, set through GraphQL), and 200 concurrent
// send_message decisions of four agents of two organizations, all set going by that
// person, each estimating 1/20 of the budget's room: exactly 20 are allowed, whichever
// organization's agent asks; their usage (by execution id, without a chain) settles
// them, the actual replacing the estimate on the person's budget. Hostile inputs are
// refused with the field named, and an organization's own key cannot spend another's
// person's budget.
func TestIntegrationInitiatorBudgetHoldsUnderConcurrency(t *testing.T) {
	s := newStack(t)
	tag := isoTag()
	a, b := newIsoTenant("initiator", tag), newIsoTenant("partner", tag)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "platform-router", keys.PlatformOrg, keys.RoleRouter)
	bRouter := s.key(t, "partner-router", b.org, keys.RoleRouter)
	manager := s.key(t, "initiator-manager", a.org, keys.RoleManager)
	srv := s.serve(t, "--policy-dir", bundleWithQuotas(t, `{"messages_per_window_agent": 100000, "messages_per_window_agent_room": 100000}`, a.org, b.org))

	now := time.Now().UTC().Add(-10 * time.Minute)
	isoPost(t, srv, platform, append(a.seed(t, now), b.seed(t, now)...))
	for _, tn := range []*isoTenant{a, b} {
		require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
			return isoDecide(t, srv, router, tn.writer.ID, tn.room2, 0).Allow
		}), "the policy directory never let %s's writer post", tn.org)
	}
	person := a.second // the ops person of a: her requests reach a's agents and b's
	chain := fmt.Sprintf(`{"depth":2,"handoffs":1,"initiator":%q,"initiator_type":"user"}`, person.ID)

	// Hostile budgets and chains first: each refused, naming what is wrong.
	for doc, msg := range map[string]string{
		`mutation { setBudget(budget: {scope: INITIATOR, period: DAY, tokens: 5, mode: HARD}) { id } }`:                                                       "scope_id: missing",
		`mutation { setBudget(budget: {scope: INITIATOR, scopeId: "` + strings.Repeat("u", 300) + `", period: DAY, tokens: 5, mode: HARD}) { id } }`:          "scope_id: 300 bytes long",
		`mutation { setBudget(orgId: "` + b.org + `", budget: {scope: INITIATOR, scopeId: "` + b.lead.ID + `", period: DAY, tokens: 5, mode: HARD}) { id } }`: "",
	} {
		ans := isoAsk(t, srv, manager, doc)
		require.NotEmpty(t, ans.Errors, "%s: %s", doc, ans.raw)
		assert.Contains(t, ans.Errors[0].Message, msg, "%s", ans.raw)
	}
	for c, msg := range map[string]string{
		`{"depth":-1}`:                  "input.chain.depth: must be 0..1000, got -1",
		`{"depth":"3"}`:                 "input.chain.depth: must be a whole number",
		`{"depth":1,"initiator":"u-x"}`: "input.chain.initiator_type: missing",
		`{"depth":1,"admin":true}`:      "input.chain: unknown field",
		`null`:                          "input.chain: must be an object",
		`{"initiator":"u\u0001x","initiator_type":"user"}`: "control characters",
	} {
		code, out := chainDecide(srv, router, a.writer.ID, a.room2, 1, "exec-hostile", c)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", c, out)
		assert.Contains(t, string(out), msg, c)
	}
	code, out := chainDecide(srv, bRouter, b.writer.ID, b.room2, 1, "exec-foreign", chain)
	assert.Equal(t, http.StatusForbidden, code, "b's own key names a's person: %s", out)

	stacktest.AwayFromMidnight(t, 10*time.Minute)
	ans := isoAsk(t, srv, manager, `mutation { setBudget(budget: {scope: INITIATOR, scopeId: "`+person.ID+`", period: DAY, tokens: 1000000, mode: HARD}) { id scope scopeId } }`)
	require.Empty(t, ans.Errors, "%s", ans.raw)
	budget := func() budgetAnswer { t.Helper(); return soleBudget(t, srv, manager) }
	assert.True(t, stacktest.Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool { return budget().ScopeName == person.Handle }),
		"the initiator is never named from the organization's directory: %+v", budget())
	before := budget()
	require.Zero(t, before.ReservedTokens)
	estimate := *before.RemainingTokens / 20

	type granted struct {
		tn    *isoTenant
		agent schema.Party
		room  string
		exec  string
	}
	var mu sync.Mutex
	var allowed []granted
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		tn := []*isoTenant{a, b}[i%2]
		g := granted{tn: tn, agent: tn.coder, room: tn.room, exec: fmt.Sprintf("exec-%s-%03d", tag, i)}
		if i%4 >= 2 {
			g.agent, g.room = tn.writer, tn.room2
		}
		wg.Go(func() {
			<-start
			code, out := chainDecide(srv, router, g.agent.ID, g.room, estimate, g.exec, chain)
			var d chainDecision
			if !assert.Equal(t, http.StatusOK, code, "%s", out) || !assert.NoError(t, json.Unmarshal(out, &d)) {
				return
			}
			if d.Allow {
				mu.Lock()
				allowed = append(allowed, g)
				mu.Unlock()
			} else if assert.NotEmpty(t, d.Reasons) {
				assert.Equal(t, policy.CodeBudgetExceeded, d.Reasons[0].Code, "%s", out)
				assert.Contains(t, d.Reasons[0].Message, before.ID, "the deny names the initiator's budget")
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	orgs := map[string]int{}
	for _, g := range allowed {
		orgs[g.tn.org]++
	}
	t.Logf("200 concurrent decisions in %s: %d allowed (%v)", time.Since(began).Round(time.Millisecond), len(allowed), orgs)
	require.Len(t, allowed, 20, "exactly the budget's room (20 estimates of 1/20), never more")
	now2 := budget()
	assert.Equal(t, [2]int64{before.SpentTokens, 20 * estimate}, [2]int64{now2.SpentTokens, now2.ReservedTokens})

	// The usage of the allowed executions arrives, in both organizations, without a
	// chain: each settles its reservation and counts on the person's budget.
	var actual int64
	var usage []schema.Event
	for i, g := range allowed {
		used := estimate/2 + int64(i)
		actual += used
		ev := g.tn.event(t, schema.TypeUsageReported, g.room, g.agent, nil, schema.UsageData{InputTokens: used, Model: "gpt-5-mini"}, time.Now().UTC())
		ev.ExecutionID = g.exec
		usage = append(usage, ev)
	}
	isoPost(t, srv, platform, usage)
	require.True(t, stacktest.Eventually(t, time.Minute, 200*time.Millisecond, func() bool {
		b := budget()
		return b.ReservedTokens == 0 && b.SpentTokens == before.SpentTokens+actual
	}), "the usage never settled the reservations on the initiator: %+v (want spent %d)", budget(), before.SpentTokens+actual)
	// The room left lets estimates in again, up to the cap.
	d := chainDecision{}
	code, out = chainDecide(srv, router, b.coder.ID, b.room, *budget().RemainingTokens+1, "exec-over", chain)
	require.Equal(t, http.StatusOK, code, "%s", out)
	require.NoError(t, json.Unmarshal(out, &d))
	assert.False(t, d.Allow, "one token past the room is denied: %s", out)
	srv.alive()
}

// TestIntegrationLoopGuardStopsAPingPong: two agents hand a request back and forth
// without a person. The routing core sends each send_message with the chain's
// handoffs; the loop guard allows max_handoffs (6, data.json) of them and denies the
// next with code loop. The deny is audited with its reason and its chain, is listed by
// policyDecisions, arrives live on workStatusChanged as AGENT_STOPPED, and workStatus
// shows the agent "stopped: loop" until it posts again. A chain past max_chain_depth
// is denied alike.
func TestIntegrationLoopGuardStopsAPingPong(t *testing.T) {
	s := newStack(t)
	tn := newIsoTenant("loop", isoTag())
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "platform-router", keys.PlatformOrg, keys.RoleRouter)
	viewer := s.key(t, "loop-viewer", tn.org, keys.RoleViewer)
	auditor := s.key(t, "loop-compliance", tn.org, keys.RoleCompliance)
	metrics := s.key(t, "loop-metrics", keys.PlatformOrg, keys.RoleOperator)
	srv := s.serve(t)

	seed := tn.seed(t, time.Now().UTC().Add(-10*time.Minute))
	seed = append(seed, tn.event(t, schema.TypeParticipantAdded, tn.room, tn.system, &tn.writer,
		schema.ParticipantData{ParticipantID: tn.writer.ID, ParticipantType: schema.ActorAgent}, time.Now().UTC().Add(-5*time.Minute)))
	isoPost(t, srv, platform, seed)
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return isoDecide(t, srv, router, tn.writer.ID, tn.room, 0).Allow
	}), "the policy directory never let the writer post in the main room")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(srv.url, "http")+"/graphql", viewer)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, changes, err := conn.Subscribe(ctx, fmt.Sprintf(`subscription { workStatusChanged(roomId: %q) { kind roomId agentId stopped stopReason eventId } }`, tn.room), nil, 64)
	require.NoError(t, err)
	waitSubscribed(t, srv, metrics, 1)

	// The lead mentions the coder (handoffs 0); from there the two agents mention each
	// other, each message one handoff more, each posted once allowed.
	agents := []schema.Party{tn.coder, tn.writer}
	var stopped schema.Party
	var deny chainDecision
	var denyAt int
	for i := 0; i < 20; i++ {
		ag := agents[i%2]
		c := fmt.Sprintf(`{"depth":%d,"handoffs":%d,"initiator":%q,"initiator_type":"user"}`, i+1, i, tn.lead.ID)
		code, out := chainDecide(srv, router, ag.ID, tn.room, 10, fmt.Sprintf("exec-loop-%s-%d", tn.tag, i), c)
		require.Equal(t, http.StatusOK, code, "%s", out)
		var d chainDecision
		require.NoError(t, json.Unmarshal(out, &d))
		if !d.Allow {
			stopped, deny, denyAt = ag, d, i
			break
		}
		isoPost(t, srv, platform, []schema.Event{tn.event(t, schema.TypeMessageCreated, tn.room, ag, nil,
			schema.MessageData{Content: fmt.Sprintf("over to you %d", i)}, time.Now().UTC())})
	}
	require.NotEmpty(t, stopped.ID, "the loop guard never stopped the ping-pong")
	assert.Equal(t, 7, denyAt, "handoffs 0..6 are allowed, the 7th is past max_handoffs 6")
	require.Len(t, deny.Reasons, 1)
	assert.Equal(t, policy.CodeLoop, deny.Reasons[0].Code)
	assert.Equal(t, "loop: 7 handoffs in a row between the same two agents is past max_handoffs 6", deny.Reasons[0].Message)

	// Live: the stop, on the board's subscription.
	timeout := time.After(30 * time.Second)
	for live := false; !live; {
		select {
		case m, ok := <-changes:
			require.True(t, ok, "subscription ended")
			require.NoError(t, m.Err)
			require.Empty(t, m.Errors)
			var c struct {
				WorkStatusChanged struct{ Kind, RoomID, AgentID, Stopped, StopReason string }
			}
			require.NoError(t, json.Unmarshal(m.Data, &c), "%s", m.Data)
			if w := c.WorkStatusChanged; w.Kind == "AGENT_STOPPED" {
				assert.Equal(t, [3]string{tn.room, stopped.ID, "loop"}, [3]string{w.RoomID, w.AgentID, w.Stopped})
				assert.Contains(t, w.StopReason, "max_handoffs 6")
				live = true
			}
		case <-timeout:
			t.Fatal("no AGENT_STOPPED within 30 s")
		}
	}

	// Audited, and listed by policyDecisions with its reason and chain.
	type listed struct {
		AgentID, RoomID, Input string
		Allowed                bool
		Reasons                []struct{ Code, Message string }
	}
	var decisions struct {
		PolicyDecisions struct{ Decisions []listed }
	}
	// The readiness poll above was denied (not_participant) until the directory caught
	// up, and those denials are listed too: wait for the loop's own.
	loopDeny := -1
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		ans := isoAsk(t, srv, auditor, `{ policyDecisions(decision: "send_message", outcome: DENIED, agentId: "`+stopped.ID+`") { decisions { agentId roomId input allowed reasons { code message } } } }`)
		require.Empty(t, ans.Errors, "%s", ans.raw)
		require.NoError(t, json.Unmarshal(ans.Data, &decisions))
		loopDeny = slices.IndexFunc(decisions.PolicyDecisions.Decisions, func(d listed) bool {
			return len(d.Reasons) > 0 && d.Reasons[0].Code == policy.CodeLoop
		})
		return loopDeny >= 0
	}), "the loop's deny is never listed by policyDecisions: %+v", decisions.PolicyDecisions.Decisions)
	got := decisions.PolicyDecisions.Decisions[loopDeny]
	assert.Equal(t, tn.room, got.RoomID)
	assert.False(t, got.Allowed)
	assert.Equal(t, []struct{ Code, Message string }{{policy.CodeLoop, deny.Reasons[0].Message}}, got.Reasons)
	assert.Contains(t, got.Input, `"handoffs":7`)
	assert.Contains(t, got.Input, `"initiator":"`+tn.lead.ID+`"`)

	// The board: the agent stopped in the room, with the reason; the other agent not.
	type boardAgent struct {
		AgentID, StopReason string
		Stopped             *string
		StoppedSince        *time.Time
	}
	board := func() map[string]boardAgent {
		t.Helper()
		ans := isoAsk(t, srv, viewer, fmt.Sprintf(`{ workStatus(roomId: %q) { rooms { agents { agentId stopped stoppedSince stopReason } } } }`, tn.room))
		require.Empty(t, ans.Errors, "%s", ans.raw)
		var ws struct {
			WorkStatus struct {
				Rooms []struct{ Agents []boardAgent }
			}
		}
		require.NoError(t, json.Unmarshal(ans.Data, &ws))
		out := map[string]boardAgent{}
		for _, r := range ws.WorkStatus.Rooms {
			for _, g := range r.Agents {
				out[g.AgentID] = g
			}
		}
		return out
	}
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		g := board()[stopped.ID]
		return g.Stopped != nil && *g.Stopped == "loop"
	}), "workStatus never shows the agent stopped: %+v", board())
	g := board()
	assert.Contains(t, g[stopped.ID].StopReason, "max_handoffs 6")
	require.NotNil(t, g[stopped.ID].StoppedSince)
	other := agents[(denyAt+1)%2]
	assert.Nil(t, g[other.ID].Stopped, "the other agent was not denied: %+v", g[other.ID])

	// A chain too deep is a loop too.
	code, out := chainDecide(srv, router, other.ID, tn.room, 10, "exec-deep-"+tn.tag, `{"depth":13,"handoffs":0}`)
	require.Equal(t, http.StatusOK, code, "%s", out)
	var deep chainDecision
	require.NoError(t, json.Unmarshal(out, &deep))
	assert.False(t, deep.Allow)
	assert.Equal(t, []struct{ Code, Message string }{{policy.CodeLoop, "loop: chain depth 13 is past max_chain_depth 12"}}, deep.Reasons)

	// A person breaks the loop: the new chain starts at depth 1, the agent posts again,
	// and the stop is over.
	code, out = chainDecide(srv, router, stopped.ID, tn.room, 10, "exec-again-"+tn.tag, fmt.Sprintf(`{"depth":1,"handoffs":0,"initiator":%q,"initiator_type":"user"}`, tn.lead.ID))
	require.Equal(t, http.StatusOK, code, "%s", out)
	var again chainDecision
	require.NoError(t, json.Unmarshal(out, &again))
	require.True(t, again.Allow, "%s", out)
	isoPost(t, srv, platform, []schema.Event{tn.event(t, schema.TypeMessageCreated, tn.room, stopped, nil,
		schema.MessageData{Content: "back to work"}, time.Now().UTC().Add(time.Second))})
	assert.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool { return board()[stopped.ID].Stopped == nil }),
		"the stop never ends after the agent posts again: %+v", board())
	srv.alive()
}
