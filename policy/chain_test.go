package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChainValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chain Chain
		want  []string // "" = valid
	}{
		{"a person's chain", Chain{Depth: 3, Handoffs: 2, Initiator: "u-alice", InitiatorType: "user"}, nil},
		{"figures only", Chain{Depth: 1}, nil},
		{"the bounds", Chain{Depth: MaxChainDepth, Handoffs: MaxChainHandoffs, Initiator: strings.Repeat("s", MaxInitiatorBytes), InitiatorType: "system"}, nil},
		{"negative depth", Chain{Depth: -1}, []string{"input.chain.depth: must be 0..1000, got -1"}},
		{"huge depth", Chain{Depth: 1 << 62}, []string{"input.chain.depth: must be 0..1000, got 4611686018427387904"}},
		{"negative handoffs", Chain{Handoffs: -5}, []string{"input.chain.handoffs: must be 0..1000, got -5"}},
		{"handoffs past the bound", Chain{Depth: 2000, Handoffs: 1001}, []string{
			"input.chain.depth: must be 0..1000, got 2000", "input.chain.handoffs: must be 0..1000, got 1001"}},
		{"oversize initiator", Chain{Initiator: strings.Repeat("u", MaxInitiatorBytes+1), InitiatorType: "user"},
			[]string{"input.chain.initiator: must be at most 256 bytes, got 257"}},
		{"control character", Chain{Initiator: "u-\x00alice", InitiatorType: "user"},
			[]string{"input.chain.initiator: must not hold control characters, got one at byte 2"}},
		{"invalid UTF-8", Chain{Initiator: "u-\xffalice", InitiatorType: "user"}, []string{"input.chain.initiator: must be valid UTF-8"}},
		{"unknown type", Chain{Initiator: "u-alice", InitiatorType: "robot"}, []string{`input.chain.initiator_type: must be user, agent or system, got "robot"`}},
		{"oversize type is clipped", Chain{Initiator: "u-alice", InitiatorType: strings.Repeat("x", 100)},
			[]string{`input.chain.initiator_type: must be user, agent or system, got "` + strings.Repeat("x", 32) + `…"`}},
		{"initiator without type", Chain{Initiator: "u-alice"}, []string{"input.chain.initiator_type: missing"}},
		{"type without initiator", Chain{InitiatorType: "user"}, []string{"input.chain.initiator: missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.chain.Validate()
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Len(t, strings.Split(err.Error(), "\n"), len(tc.want), "one line per problem: %v", err)
		})
	}
}

// The loop guard on the shipped data.json: max_chain_depth 12, max_handoffs 6. A message it
// denies takes nothing from the rates or the budgets.
func TestLoopGuardOnTheShippedThresholds(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	msg := func(depth, handoffs int64) Decision {
		t.Helper()
		d, err := e.SendMessage(ctx, MessageInput{Agent: "a-coder", Room: webhookRoom, Tokens: 100, ExecutionID: fmt.Sprint("x", depth, handoffs),
			Chain: &Chain{Depth: depth, Handoffs: handoffs, Initiator: "u-alice", InitiatorType: "user"}})
		require.NoError(t, err)
		return d
	}
	d := msg(13, 0)
	assert.False(t, d.Allow)
	assert.Equal(t, []Reason{{Code: CodeLoop, Message: "loop: chain depth 13 is past max_chain_depth 12"}}, d.Reasons)
	d = msg(8, 7)
	assert.False(t, d.Allow)
	assert.Equal(t, []Reason{{Code: CodeLoop, Message: "loop: 7 handoffs in a row between the same two agents is past max_handoffs 6"}}, d.Reasons)
	assert.Zero(t, d.RetryAfterMs, "a loop does not end by waiting")
	_, ok := e.Limiter().TAT(AgentRateKey("a-coder"))
	assert.False(t, ok, "a loop's deny takes no rate")
	assert.Zero(t, e.Ledger().Reservations(), "nor a reservation")

	d = msg(12, 6)
	require.True(t, d.Allow, "%+v", d)
	assert.NotEmpty(t, d.ReservationID)
	_, _, reserved, _ := e.Ledger().Spent("org-acme", ScopeInitiator, "u-alice", PeriodDay, time.Now())
	assert.Zero(t, reserved, "without an initiator budget nothing is reserved on the initiator")
}

// Whatever form the input takes, a hostile chain is the policy's invalid_input, never
// an evaluation error (builtin errors are strict), and the typed and untyped forms of
// one question get one answer.
func TestHostileChainsInEveryInputForm(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	for _, tc := range []struct{ chain, msg string }{
		{`-1`, "input.chain: must be an object"},
		{`null`, "input.chain: must be an object"},
		{`[{"depth": 1}]`, "input.chain: must be an object"},
		{`{"depth": -1}`, "input.chain.depth: must be 0..1000, got -1"},
		{`{"depth": 1e400}`, "input.chain.depth: must be 0..1000, got 1e400"},
		{`{"depth": -1e400}`, "input.chain.depth: must be 0..1000, got -1e400"},
		{`{"depth": 99999999999999999999999999999}`, "input.chain.depth: must be 0..1000, got 99999999999999999999999999999"},
		{`{"depth": 0.000001}`, "input.chain.depth: must be a whole number, got 0.000001"},
		{`{"depth": "12"}`, `input.chain.depth: must be a whole number, got "12"`},
		{`{"handoffs": [7]}`, "input.chain.handoffs: must be a whole number, got [7]"},
		{`{"depth": 2, "sudo": true}`, "input.chain: unknown field sudo"},
		{`{"initiator": "` + strings.Repeat("é", 257) + `", "initiator_type": "user"}`, "input.chain.initiator: must be a non-empty string of at most 256 characters"},
		{`{"initiator": {"id": "u-alice"}, "initiator_type": "user"}`, "input.chain.initiator: must be a non-empty string"},
		{`{"initiator": "u-alice", "initiator_type": 1}`, "input.chain.initiator_type: must be user, agent or system, got 1"},
	} {
		raw := json.RawMessage(`{"agent": "a-coder", "room": "` + webhookRoom + `", "chain": ` + tc.chain + `}`)
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&m), tc.chain)
		for _, in := range []any{raw, m} {
			d, err := e.Decide(ctx, SendMessage, in)
			require.NoError(t, err, tc.chain)
			assert.False(t, d.Allow, tc.chain)
			require.Len(t, d.Reasons, 1, "%s: %+v", tc.chain, d)
			assert.Equal(t, "invalid_input", d.Reasons[0].Code, "%s: %+v", tc.chain, d.Reasons)
			assert.Contains(t, d.Reasons[0].Message, tc.msg, tc.chain)
		}
	}
	assert.Zero(t, e.Ledger().Reservations())

	typed, err := e.SendMessage(ctx, MessageInput{Agent: "a-coder", Room: webhookRoom, Chain: &Chain{Depth: -3}})
	require.NoError(t, err)
	assert.Equal(t, []Reason{{Code: "invalid_input", Message: "input.chain.depth: must be 0..1000, got -3"}}, typed.Reasons,
		"a Go caller's invalid chain is denied by the policy too")
	chain := &Chain{Depth: 13, Handoffs: 1, Initiator: "u-alice", InitiatorType: "user"}
	typed, err = e.SendMessage(ctx, MessageInput{Agent: "a-coder", Room: webhookRoom, Chain: chain})
	require.NoError(t, err)
	b, err := json.Marshal(MessageInput{Agent: "a-coder", Room: webhookRoom, Chain: chain})
	require.NoError(t, err)
	untyped, err := e.Decide(ctx, SendMessage, json.RawMessage(b))
	require.NoError(t, err)
	assert.Equal(t, typed.Reasons, untyped.Reasons)
	assert.Equal(t, CodeLoop, typed.Reasons[0].Code)
}

func TestInitiatorOrg(t *testing.T) {
	e := exampleEngine(t)
	dir := e.Directory()
	for _, tc := range []struct {
		id, typ, agentOrg, want string
		ok                      bool
	}{
		{"u-alice", "user", "org-partner", "org-acme", true}, // a person's own organization, wherever the agent is
		{"a-coder", "agent", "org-partner", "org-acme", true},
		{"webhook:github", "system", "org-partner", "org-partner", true}, // a system's: the agent's
		{"u-alice", "agent", "org-acme", "", false},                      // not an agent
		{"a-coder", "user", "org-acme", "", false},                       // not a person
		{"u-nobody", "user", "org-acme", "", false},
		{"u-alice", "robot", "org-acme", "", false},
		{"", "user", "org-acme", "", false},
		{"webhook:github", "system", "", "", false},
	} {
		org, ok := dir.InitiatorOrg(tc.id, tc.typ, tc.agentOrg)
		assert.Equal(t, tc.ok, ok, "%+v", tc)
		assert.Equal(t, tc.want, org, "%+v", tc)
	}
}

// initiatorWorld is an engine over two organizations' agents in one room, with rates
// far above what a test sends and no daily quotas (so that only the budgets decide),
// and a hard day budget of tokens on u-alice's initiator scope.
func initiatorWorld(t *testing.T, tokens int64, now func() time.Time) *Engine {
	t.Helper()
	ctx := context.Background()
	snap := Snapshot{
		People: []Person{{ID: "u-alice", Handle: "alice", Org: "org-acme"}, {ID: "u-partner", Handle: "partner", Org: "org-partner"}},
		Rooms:  map[string][]string{"room-1": {"u-alice"}},
	}
	for i := range 10 {
		id := fmt.Sprintf("a-%d", i)
		owner, org := "u-alice", "org-acme"
		if i >= 7 { // three agents of a partner organization take delegated work
			owner, org = "u-partner", "org-partner"
		}
		snap.Agents = append(snap.Agents, Agent{ID: id, Handle: owner[2:] + "/" + id, Owner: owner, Org: org, Listed: true, RegistryAccess: true})
		snap.Rooms["room-1"] = append(snap.Rooms["room-1"], id)
	}
	dir := NewDirectory()
	require.NoError(t, dir.Load(ctx, snap))
	b := copyBundle(t)
	b["data.json"] = &fstest.MapFile{Data: []byte(`{"quotas": {"defaults": {"window_seconds": 60,
			"messages_per_window_agent": 100000, "messages_per_window_agent_room": 100000, "max_chain_depth": 12, "max_handoffs": 6},
			"orgs": {}, "agents": {}}}`)}
	e, err := New(ctx, Config{Directory: dir, Bundle: b, Now: now})
	require.NoError(t, err)
	bud := Budget{Org: "org-acme", Scope: ScopeInitiator, ScopeID: "u-alice", Period: PeriodDay, Tokens: tokens, Hard: true, UpdatedAt: now()}
	bud.Normalize()
	require.NoError(t, bud.Validate())
	e.Ledger().Set(bud, now())
	return e
}

// The initiator's budget under 200 concurrent send_message decisions of ten agents of
// two organizations, all set going by u-alice, each estimating 1/20 of the budget's
// room: exactly 20 are allowed, whichever agent or organization asks; the usage reports
// (canonical: without a chain) settle them, the actual spend replacing the estimate on
// the initiator as on the agents.
func TestInitiatorBudgetHoldsUnderConcurrentDecisions(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 10, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	e := initiatorWorld(t, 1_000_000, clock)
	e.Ledger().Spend(Charge{Initiator: "u-alice", InitiatorOrg: "org-acme", Tokens: 400_000}, "", now, now)
	const room = 600_000

	type grant struct{ agent, org, execution string }
	granted := make(chan grant, 200)
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		wg.Go(func() {
			<-start
			agent := fmt.Sprintf("a-%d", i%10)
			exec := fmt.Sprintf("x-%03d", i)
			d, err := e.SendMessage(ctx, MessageInput{Agent: agent, Room: "room-1", Tokens: room / 20, ExecutionID: exec,
				Chain: &Chain{Depth: 2, Handoffs: 1, Initiator: "u-alice", InitiatorType: "user"}})
			if err != nil {
				t.Error(err)
				return
			}
			if !d.Allow {
				denied.Add(1)
				if d.Reasons[0].Code != CodeBudgetExceeded || !strings.Contains(d.Reasons[0].Message, BudgetID("org-acme", ScopeInitiator, "u-alice", PeriodDay)) {
					t.Errorf("unexpected deny: %+v", d.Reasons)
				}
				return
			}
			allowed.Add(1)
			granted <- grant{agent, d.Org, exec}
		})
	}
	close(start)
	wg.Wait()
	close(granted)
	assert.Equal(t, int64(20), allowed.Load(), "exactly the room of the initiator's budget, never more")
	assert.Equal(t, int64(180), denied.Load())
	spent, _, reserved, _ := e.Ledger().Spent("org-acme", ScopeInitiator, "u-alice", PeriodDay, now)
	assert.Equal(t, int64(400_000), spent)
	assert.Equal(t, int64(room), reserved)

	var actual, partner int64
	orgs := map[string]bool{}
	for g := range granted {
		used := int64(10_000 + len(g.execution)) // the actual differs from the estimate
		actual += used
		orgs[g.org] = true
		if g.org == "org-partner" {
			partner += used
		}
		owner := "u-alice"
		if g.org == "org-partner" {
			owner = "u-partner"
		}
		e.Ledger().Spend(Charge{Org: g.org, Owner: owner, Agent: g.agent, Room: "room-1", Tokens: used}, g.execution, now, now)
	}
	spent, _, reserved, _ = e.Ledger().Spent("org-acme", ScopeInitiator, "u-alice", PeriodDay, now)
	assert.Equal(t, 400_000+actual, spent, "actual replaces the estimate on the initiator")
	assert.Zero(t, reserved)
	assert.Zero(t, e.Ledger().Reservations())
	p, _, _, _ := e.Ledger().Spent("org-partner", ScopeOrg, "org-partner", PeriodDay, now)
	assert.Equal(t, partner, p, "the partner organization's own counters count its agents' usage")
	if orgs["org-partner"] {
		_, _, r, _ := e.Ledger().Spent("org-partner", ScopeInitiator, "u-alice", PeriodDay, now)
		assert.Zero(t, r, "the initiator's budget is its organization's, not the agent's")
	}
}

// A decision reserves on every budget it touches or on none: a deny by the agent's own
// budget leaves the initiator's untouched, and the other way round.
func TestInitiatorReservationIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 10, 10, 0, 0, 0, time.UTC)
	e := initiatorWorld(t, 1000, func() time.Time { return now })
	agentBudget := Budget{Org: "org-partner", Scope: ScopeAgent, ScopeID: "a-8", Period: PeriodMonth, Tokens: 500, Hard: true, UpdatedAt: now}
	agentBudget.Normalize()
	e.Ledger().Set(agentBudget, now)
	chain := &Chain{Depth: 3, Initiator: "u-alice", InitiatorType: "user"}

	d, err := e.SendMessage(ctx, MessageInput{Agent: "a-8", Room: "room-1", Tokens: 600, Chain: chain})
	require.NoError(t, err)
	assert.False(t, d.Allow)
	assert.Contains(t, d.Reasons[0].Message, agentBudget.ID)
	_, _, r, _ := e.Ledger().Spent("org-acme", ScopeInitiator, "u-alice", PeriodDay, now)
	assert.Zero(t, r, "the agent's budget denied: nothing reserved on the initiator's")

	d, err = e.SendMessage(ctx, MessageInput{Agent: "a-8", Room: "room-1", Tokens: 400, Chain: chain})
	require.NoError(t, err)
	require.True(t, d.Allow, "%+v", d)
	d, err = e.SendMessage(ctx, MessageInput{Agent: "a-1", Room: "room-1", Tokens: 601, Chain: chain})
	require.NoError(t, err)
	assert.False(t, d.Allow, "400 of the initiator's 1000 are reserved by the partner's agent")
	assert.Contains(t, d.Reasons[0].Message, "400 reserved of 1000 tokens this day")
	_, _, r, _ = e.Ledger().Spent("org-acme", ScopeAgent, "a-1", PeriodDay, now)
	assert.Zero(t, r, "the initiator's budget denied: nothing reserved on the agent")

	// Without the chain the same message is the agent's alone.
	d, err = e.SendMessage(ctx, MessageInput{Agent: "a-1", Room: "room-1", Tokens: 601})
	require.NoError(t, err)
	assert.True(t, d.Allow, "%+v", d)
	// An initiator the directory does not know as that kind has no budget to reserve on.
	d, err = e.SendMessage(ctx, MessageInput{Agent: "a-1", Room: "room-1", Tokens: 601, Chain: &Chain{Depth: 1, Initiator: "u-alice", InitiatorType: "agent"}})
	require.NoError(t, err)
	assert.True(t, d.Allow, "%+v", d)
}

// loopReference is the loop guard and the chain's checks in plain Go: what the HTTP API
// refuses (Chain.Validate) the policy denies as invalid_input, and of the rest it
// denies the chains past data.json's max_chain_depth 12 or max_handoffs 6.
func loopReference(c *Chain) string {
	switch {
	case c.Validate() != nil:
		return "invalid_input"
	case c.Depth > 12 || c.Handoffs > 6:
		return CodeLoop
	}
	return ""
}

// TestLoopGuardAgreesWithTheReference holds the Rego loop guard and chain checks to
// the Go reference (and so to what the HTTP API refuses) on random chains around every
// bound, through the engine on the shipped bundle; an invalid chain's reason names a
// field Validate names too.
func TestLoopGuardAgreesWithTheReference(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	rng := rand.New(rand.NewPCG(7, 12))
	figure := func() int64 {
		return []int64{0, 1, 5, 6, 7, 11, 12, 13, 999, 1000, 1001, -1, -1 << 40, 1 << 40}[rng.IntN(14)]
	}
	n := 3000
	if testing.Short() {
		n = 500
	}
	counts := map[string]int{}
	for i := range n {
		c := &Chain{Depth: figure(), Handoffs: figure()}
		switch rng.IntN(6) {
		case 0:
		case 1:
			c.Initiator, c.InitiatorType = "u-alice", InitiatorTypes[rng.IntN(3)]
		case 2:
			c.Initiator, c.InitiatorType = strings.Repeat("x", 250+rng.IntN(10)), "system"
		case 3:
			c.Initiator = "u-alice"
		case 4:
			c.InitiatorType = "user"
		case 5:
			c.Initiator, c.InitiatorType = "u-alice", []string{"User", "", "robot", "system "}[rng.IntN(4)]
		}
		d, err := e.SendMessage(ctx, MessageInput{Agent: "a-architect", Room: webhookRoom, ExecutionID: fmt.Sprint("x", i), Chain: c})
		require.NoError(t, err)
		got := ""
		if !d.Allow {
			require.Len(t, d.Reasons, 1, "%+v: %+v", c, d)
			got = d.Reasons[0].Code
		}
		want := loopReference(c)
		if got == CodeRateLimited && want == "" {
			got = "" // allowed by the guard; the agent's rate is spent by the test's own volume
		}
		require.Equal(t, want, got, "%+v: %+v", c, d.Reasons)
		if got == "invalid_input" {
			field, _, _ := strings.Cut(d.Reasons[0].Message, ":")
			assert.Contains(t, c.Validate().Error(), field+":", "%+v", c)
		}
		counts[want]++
	}
	t.Logf("%d chains: %v", n, counts)
	for _, k := range []string{"", "invalid_input", CodeLoop} {
		assert.NotZero(t, counts[k], "the random chains reach every outcome")
	}
}
