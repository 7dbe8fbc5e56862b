package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema"
)

const room = "room-webhook-retries"

func message(chain string) string {
	return `{"agent":"a-coder","room":"` + room + `","tokens":10,"execution_id":"x-1","chain":` + chain + `}`
}

// Each field of input.chain is bounded, and the answer names the field and what it got.
func TestChainInputIsCheckedFieldByField(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	for _, tc := range []struct{ name, chain, want string }{
		{"negative depth", `{"depth":-1}`, "input.chain.depth: must be 0..1000, got -1"},
		{"huge depth", `{"depth":1000000}`, "input.chain.depth: must be 0..1000, got 1000000"},
		{"depth past int64", `{"depth":99999999999999999999}`, "input.chain.depth: must be a whole number, got number 99999999999999999999"},
		{"fractional depth", `{"depth":2.5}`, "input.chain.depth: must be a whole number, got number 2.5"},
		{"exponent depth", `{"depth":1e3}`, "input.chain.depth: must be a whole number, got number 1e3"},
		{"depth as a string", `{"depth":"3"}`, "input.chain.depth: must be a whole number, got string"},
		{"negative handoffs", `{"depth":3,"handoffs":-1}`, "input.chain.handoffs: must be 0..1000, got -1"},
		{"handoffs as a bool", `{"handoffs":true}`, "input.chain.handoffs: must be a whole number, got bool"},
		{"initiator as a number", `{"initiator":7,"initiator_type":"user"}`, "input.chain.initiator: must be a string, got number"},
		{"oversize initiator", `{"initiator":"` + strings.Repeat("u", 257) + `","initiator_type":"user"}`, "input.chain.initiator: must be at most 256 bytes, got 257"},
		{"control character", `{"initiator":"u\u0007","initiator_type":"user"}`, "input.chain.initiator: must not hold control characters"},
		{"unknown type", `{"initiator":"u-alice","initiator_type":"root"}`, `input.chain.initiator_type: must be user, agent or system, got "root"`},
		{"initiator without type", `{"initiator":"u-alice"}`, "input.chain.initiator_type: missing"},
		{"type without initiator", `{"initiator_type":"user"}`, "input.chain.initiator: missing"},
		{"unknown field", `{"depth":1,"hops":2}`, `input.chain: unknown field "hops" (known: depth, handoffs, initiator, initiator_type)`},
		{"not an object", `[1,2]`, "input.chain: must be an object, got [1,2]"},
		{"a string", `"deep"`, `input.chain: must be an object, got "deep"`},
		{"null", `null`, "input.chain: must be an object, got null"},
		{"nested too deep", strings.Repeat(`{"depth":`, 40) + "1" + strings.Repeat("}", 40), "input.chain.depth: must be a whole number, got object"},
		{"duplicate key", `{"depth":1,"depth":13}`, "duplicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := call(t, a, "POST", "/v1/decisions/send_message", "t", message(tc.chain))
			assert.Equal(t, http.StatusBadRequest, code, "%v", out)
			assert.Contains(t, out["error"], tc.want)
		})
	}
	// Every problem at once.
	code, out := call(t, a, "POST", "/v1/decisions/send_message", "t", message(`{"depth":-1,"handoffs":5000,"initiator_type":"robot"}`))
	assert.Equal(t, http.StatusBadRequest, code)
	for _, w := range []string{"input.chain.depth", "input.chain.handoffs", "input.chain.initiator: missing", "input.chain.initiator_type: must be"} {
		assert.Contains(t, out["error"], w)
	}
	// A top-level type error names its field too.
	code, out = call(t, a, "POST", "/v1/decisions/send_message", "t", `{"agent":"a-coder","room":"r","tokens":"many"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, out["error"], "input.tokens: must be a whole number, got string")
}

// The chain is part of the input the decision records, so policyDecisions shows it, and
// its digest covers it; a loop's deny is audited like any deny.
func TestTheChainIsInTheAuditedInput(t *testing.T) {
	aud := &fakeAuditor{}
	a, _ := newAPI(t, aud, nil)
	code, d := call(t, a, "POST", "/v1/decisions/send_message", "t", message(`{"depth":13,"handoffs":2,"initiator":"u-alice","initiator_type":"user"}`))
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, false, d["allow"])
	reasons := d["reasons"].([]any)
	require.Len(t, reasons, 1)
	assert.Equal(t, policy.CodeLoop, reasons[0].(map[string]any)["code"])
	assert.Equal(t, "loop: chain depth 13 is past max_chain_depth 12", reasons[0].(map[string]any)["message"])

	evs := aud.eventsOf(schema.TypePolicyDecided)
	require.Len(t, evs, 1)
	var data api.DecidedData
	require.NoError(t, json.Unmarshal(evs[0].Data, &data))
	assert.False(t, data.Allow)
	assert.Equal(t, policy.CodeLoop, data.Reasons[0].Code)
	assert.JSONEq(t, `{"agent":"a-coder","room":"`+room+`","tokens":10,"execution_id":"x-1",
		"chain":{"depth":13,"initiator":"u-alice","initiator_type":"user","handoffs":2}}`, string(data.Input))
	sum := sha256.Sum256(data.Input)
	assert.Equal(t, hex.EncodeToString(sum[:]), data.InputDigest)
	assert.NoError(t, evs[0].Validate())
	assert.True(t, strings.HasPrefix(string(evs[0].Data), `{"decision":"send_message","allow":false,"reasons":[{"code":"loop"`), "%s", evs[0].Data)

	// Without a chain the recorded input is what it was.
	code, _ = call(t, a, "POST", "/v1/decisions/send_message", "t", `{"agent":"a-coder","room":"`+room+`"}`)
	require.Equal(t, http.StatusOK, code)
	evs = aud.eventsOf(schema.TypePolicyDecided)
	require.NoError(t, json.Unmarshal(evs[1].Data, &data))
	assert.JSONEq(t, `{"agent":"a-coder","room":"`+room+`"}`, string(data.Input))
}

// An organization's key names as initiator only its own people and agents: the
// decision reserves on the initiator's budgets, which another organization's key must
// not spend. The answer is the same for another organization's person and for nobody.
func TestAnOrganizationsKeyNamesOnlyItsOwnInitiators(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	chain := func(id, typ string) string {
		return message(`{"depth":2,"initiator":"` + id + `","initiator_type":"` + typ + `"}`)
	}
	codeP, foreign := call(t, a, "POST", "/v1/decisions/send_message", "acme-route", chain("u-partner", "user"))
	codeN, nobody := call(t, a, "POST", "/v1/decisions/send_message", "acme-route", chain("u-nobody", "user"))
	assert.Equal(t, http.StatusForbidden, codeP)
	assert.Equal(t, http.StatusForbidden, codeN)
	assert.Contains(t, foreign["error"], "may name as input.chain.initiator only people and agents registered in its organization")
	assert.Equal(t, strings.ReplaceAll(foreign["error"].(string), "u-partner", "X"), strings.ReplaceAll(nobody["error"].(string), "u-nobody", "X"))
	code, _ := call(t, a, "POST", "/v1/decisions/send_message", "acme-route", chain("a-partner-reviewer", "agent"))
	assert.Equal(t, http.StatusForbidden, code)

	for _, tc := range []struct{ token, id, typ string }{
		{"acme-route", "u-alice", "user"},
		{"acme-route", "a-architect", "agent"},
		{"acme-route", "schedule", "system"}, // a system's budgets are the agent's organization's
		{"t", "u-partner", "user"},           // the platform's key names anyone
	} {
		code, d := call(t, a, "POST", "/v1/decisions/send_message", tc.token, chain(tc.id, tc.typ))
		assert.Equal(t, http.StatusOK, code, "%+v: %v", tc, d)
		assert.Equal(t, true, d["allow"], "%+v: %v", tc, d)
	}
}

// With several replicas a hard budget of an initiator whose organization another
// replica owns cannot be reserved on here: the decision is refused, audited, and takes
// nothing. Without such a budget, or with a soft one, it is decided as usual; the
// owner of the initiator's organization reserves on it.
func TestAnInitiatorsHardBudgetHeldElsewhereRefuses(t *testing.T) {
	ctx := context.Background()
	p := newPair(t)
	// An agent of an organization the other replica owns, in the room.
	owner, err := shard.New(shard.Config{Peers: testPeers, Self: p.ownerURL})
	require.NoError(t, err)
	var agent string
	for _, id := range []string{"a-partner-reviewer", "a-search"} {
		if ag, _ := p.otherEng.Directory().Agent(id); !owner.Owns(ag.Org) {
			agent = id
			break
		}
	}
	require.NotEmpty(t, agent, "the test directory has an organization the other replica owns")
	for _, eng := range []*policy.Engine{p.ownerEng, p.otherEng} {
		require.NoError(t, eng.Directory().JoinRoom(ctx, room, agent))
	}
	body := `{"agent":"` + agent + `","room":"` + room + `","tokens":10,"execution_id":"x-1","chain":{"depth":2,"handoffs":1,"initiator":"u-alice","initiator_type":"user"}}`

	rec := send(t, p.other, "t", body)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var d policy.Decision
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	require.True(t, d.Allow, "no initiator budget: decided as usual: %+v", d)

	set := func(hard bool) policy.Budget {
		b := policy.Budget{Org: "org-acme", Scope: policy.ScopeInitiator, ScopeID: "u-alice", Period: policy.PeriodDay, Tokens: 1_000_000, Hard: hard, UpdatedAt: time.Now()}
		b.Normalize()
		for _, eng := range []*policy.Engine{p.ownerEng, p.otherEng} { // every replica follows the budgets
			eng.Ledger().Set(b, time.Now())
		}
		return b
	}
	set(false)
	rec = send(t, p.other, "t", strings.Replace(body, "x-1", "x-2", 1))
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	assert.True(t, d.Allow, "a soft budget only alerts: %+v", d)

	b := set(true)
	reservations := p.otherEng.Ledger().Reservations()
	rec = send(t, p.other, "t", strings.Replace(body, "x-1", "x-3", 1))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	d = policy.Decision{}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	assert.False(t, d.Allow)
	require.Len(t, d.Reasons, 1)
	assert.Equal(t, policy.CodeInitiatorBudgetElsewhere, d.Reasons[0].Code)
	for _, w := range []string{"u-alice", b.ID, "org-acme", p.ownerURL, agent} {
		assert.Contains(t, d.Reasons[0].Message, w)
	}
	assert.Empty(t, d.ReservationID)
	assert.Equal(t, reservations, p.otherEng.Ledger().Reservations(), "what it reserved is given back")
	evs := p.otherAud.eventsOf(schema.TypePolicyDecided)
	var data api.DecidedData
	require.NoError(t, json.Unmarshal(evs[len(evs)-1].Data, &data))
	assert.Equal(t, policy.CodeInitiatorBudgetElsewhere, data.Reasons[0].Code, "the refusal is audited")
	assert.Nil(t, data.Taken)

	// The owner of org-acme decides its own agents' messages with u-alice's budget.
	rec = send(t, p.owner, "t", `{"agent":"a-coder","room":"`+room+`","tokens":10,"execution_id":"x-4","chain":{"depth":1,"initiator":"u-alice","initiator_type":"user"}}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	d = policy.Decision{}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	assert.True(t, d.Allow, "%+v", d)
	_, _, reserved, _ := p.ownerEng.Ledger().Spent("org-acme", policy.ScopeInitiator, "u-alice", policy.PeriodDay, time.Now())
	assert.Equal(t, int64(10), reserved)
}

// An initiator's budget is set, audited and deleted like any budget: budget.set names
// the initiator as its subject, and a send_message set going by the initiator is then
// checked against it, whichever of the organization's agents asks. An initiator is
// not looked up (a system's source is as good an id as a person's), so an id of
// another organization is no oracle: it is accepted and counts nothing of theirs.
func TestInitiatorBudgetIsAuditedAndInForce(t *testing.T) {
	aud := &fakeAuditor{}
	a, eng := newAPI(t, aud, nil)
	ctx := context.Background()
	b, err := a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeInitiator, ScopeID: "u-alice", Period: policy.PeriodDay, Tokens: 1000, Hard: true})
	require.NoError(t, err)
	evs := aud.eventsOf(schema.TypeBudgetSet)
	require.Len(t, evs, 1)
	assert.Equal(t, "org-acme", evs[0].OrgID)
	assert.Equal(t, &schema.Party{ID: "u-alice", Type: schema.ActorUser}, evs[0].Subject)
	var data policy.Budget
	require.NoError(t, json.Unmarshal(evs[0].Data, &data))
	assert.Equal(t, policy.ScopeInitiator, data.Scope)

	chain := &policy.Chain{Depth: 2, Handoffs: 1, Initiator: "u-alice", InitiatorType: "user"}
	d, err := a.Decide(ctx, policy.SendMessage, &policy.MessageInput{Agent: "a-coder", Room: room, Tokens: 600, ExecutionID: "x1", Chain: chain})
	require.NoError(t, err)
	require.True(t, d.Allow, "%+v", d)
	d, err = a.Decide(ctx, policy.SendMessage, &policy.MessageInput{Agent: "a-architect", Room: room, Tokens: 600, Chain: chain})
	require.NoError(t, err)
	assert.False(t, d.Allow)
	assert.Equal(t, policy.CodeBudgetExceeded, d.Reasons[0].Code)
	assert.Contains(t, d.Reasons[0].Message, b.ID)
	d, err = a.Decide(ctx, policy.SendMessage, &policy.MessageInput{Agent: "a-architect", Room: room, Tokens: 600})
	require.NoError(t, err)
	assert.True(t, d.Allow, "without the chain the initiator's budget is not in scope: %+v", d)

	other, err := a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeInitiator, ScopeID: "u-partner", Period: policy.PeriodDay, Tokens: 1, Hard: true})
	require.NoError(t, err, "another organization's person is not looked up")
	_, err = a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-partner", Scope: policy.ScopeInitiator, ScopeID: "u-partner", Period: policy.PeriodDay, Tokens: 1})
	assert.ErrorIs(t, err, schema.ErrForbidden)
	for _, bad := range []string{"", strings.Repeat("u", 257), "u-\x00alice"} {
		_, err = a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeInitiator, ScopeID: bad, Period: policy.PeriodDay, Tokens: 1})
		assert.ErrorIs(t, err, schema.ErrInvalid, "%q", bad)
	}
	_, err = a.DeleteBudget(ctx, acmeManager, "org-acme", other.ID)
	require.NoError(t, err)
	_, err = a.DeleteBudget(ctx, acmeManager, "org-acme", b.ID)
	require.NoError(t, err)
	assert.Len(t, aud.eventsOf(schema.TypeBudgetDeleted), 2)
	_, ok := eng.Ledger().Budget(b.ID)
	assert.False(t, ok)
}
