package graph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// fakeOperator keeps budgets in a real ledger and records what it was asked; agents
// "a-1" (org-a) and "b-1" (org-b) exist.
type fakeOperator struct {
	ledger *policy.Ledger
	gotBy  keys.Key
	fail   error
}

var fakeAgents = map[string]policy.Agent{"a-1": {ID: "a-1", Org: "org-a", Handle: "alice/one"}, "b-1": {ID: "b-1", Org: "org-b", Handle: "bob/one"}}

func (f *fakeOperator) SetBudget(_ context.Context, by keys.Key, b policy.Budget) (policy.Budget, error) {
	f.gotBy = by
	if f.fail != nil {
		return policy.Budget{}, f.fail
	}
	if !by.MayActOn(b.Org) {
		return policy.Budget{}, fmt.Errorf("%w: not yours", schema.ErrForbidden)
	}
	b.Normalize()
	b.UpdatedAt, b.UpdatedBy = time.Now(), by.ID
	if err := b.Validate(); err != nil {
		return policy.Budget{}, fmt.Errorf("%w: %w", schema.ErrInvalid, err)
	}
	if a, ok := fakeAgents[b.ScopeID]; b.Scope == policy.ScopeAgent && (!ok || a.Org != b.Org) {
		return policy.Budget{}, fmt.Errorf("%w: agent %q is not registered in organization %s", schema.ErrNotFound, b.ScopeID, b.Org)
	}
	f.ledger.Set(b, time.Now())
	return b, nil
}

func (f *fakeOperator) DeleteBudget(_ context.Context, by keys.Key, org, id string) (policy.Budget, error) {
	b, ok := f.ledger.Budget(id)
	if !ok || b.Org != org {
		return policy.Budget{}, fmt.Errorf("%w: no budget %q", schema.ErrNotFound, id)
	}
	f.ledger.Delete(id, time.Now())
	return b, nil
}

func (f *fakeOperator) Budgets(org string) []policy.BudgetStatus {
	return f.ledger.Budgets(org, time.Now())
}

func (f *fakeOperator) SetSuspended(_ context.Context, by keys.Key, id string, suspended bool, reason string) (policy.Agent, []string, error) {
	f.gotBy = by
	a, ok := fakeAgents[id]
	if !ok || !by.MayActOn(a.Org) {
		return policy.Agent{}, nil, fmt.Errorf("%w: agent %q is not in the directory of this key's organization", schema.ErrNotFound, id)
	}
	if f.fail != nil {
		return policy.Agent{}, nil, f.fail
	}
	a.OperatorSuspended = suspended
	return a, []string{"ev-1"}, nil
}

var opKeys = fakeKeys{
	"tok-a-manager":  {ID: "k-a-mgr", Org: "org-a", Role: keys.RoleManager},
	"tok-a-operator": {ID: "k-a-op", Org: "org-a", Role: keys.RoleOperator},
	"tok-a-viewer":   {ID: "k-a-view", Org: "org-a", Role: keys.RoleViewer},
	"tok-admin":      {ID: "k-admin", Org: keys.PlatformOrg, Role: keys.RoleAdmin},
}

type opAnswer struct {
	Data   map[string]json.RawMessage
	Errors []gqlError
}

func ask(t *testing.T, h http.Handler, token, q string) opAnswer {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(gqlBody(q)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var a opAnswer
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a), rec.Body.String())
	return a
}

func code(a opAnswer) string {
	if len(a.Errors) == 0 {
		return ""
	}
	c, _ := a.Errors[0].Extensions["code"].(string)
	return c
}

func TestBudgetMutations(t *testing.T) {
	op := &fakeOperator{ledger: policy.NewLedger(0)}
	h := graph.NewHandler(&fakeQuerier{}, opKeys, graph.WithOperator(op, "USD"))

	a := ask(t, h, "tok-a-manager", `mutation { setBudget(budget: {scope: AGENT, scopeId: "a-1", period: MONTH, tokens: 1000, cost: "25.5", mode: HARD}) {
		id scope scopeId period mode tokens cost currency spentTokens remainingTokens remainingCost projectedCost updatedBy } }`)
	require.Empty(t, a.Errors)
	var b map[string]any
	require.NoError(t, json.Unmarshal(a.Data["setBudget"], &b))
	assert.Equal(t, policy.BudgetID("org-a", policy.ScopeAgent, "a-1", policy.PeriodMonth), b["id"])
	assert.Equal(t, "25.500000", b["cost"])
	assert.Equal(t, "25.500000", b["remainingCost"])
	assert.Equal(t, "USD", b["currency"])
	assert.Equal(t, "k-a-mgr", b["updatedBy"])
	assert.EqualValues(t, 1000, b["remainingTokens"])

	a = ask(t, h, "tok-a-manager", `{ budgets { id scopeId } }`)
	require.Empty(t, a.Errors)
	assert.Contains(t, string(a.Data["budgets"]), `"scopeId":"a-1"`)

	for name, tc := range map[string]struct{ token, q, code, msg string }{
		"viewer":            {"tok-a-viewer", `mutation { setBudget(budget: {scope: ORG, period: DAY, tokens: 5, mode: HARD}) { id } }`, "FORBIDDEN", "this field needs one of manager, admin"},
		"operator":          {"tok-a-operator", `mutation { setBudget(budget: {scope: ORG, period: DAY, tokens: 5, mode: HARD}) { id } }`, "FORBIDDEN", ""},
		"other org":         {"tok-a-manager", `mutation { setBudget(orgId: "org-b", budget: {scope: ORG, period: DAY, tokens: 5, mode: HARD}) { id } }`, "FORBIDDEN", ""},
		"platform no orgId": {"tok-admin", `mutation { setBudget(budget: {scope: ORG, period: DAY, tokens: 5, mode: HARD}) { id } }`, "BAD_USER_INPUT", "orgId"},
		"foreign agent":     {"tok-a-manager", `mutation { setBudget(budget: {scope: AGENT, scopeId: "b-1", period: DAY, tokens: 5, mode: HARD}) { id } }`, "BAD_USER_INPUT", "not registered in organization org-a"},
		"cost decimals":     {"tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, cost: "0.0000001", mode: HARD}) { id } }`, "BAD_USER_INPUT", "budget.cost: \"0.0000001\" has more than 6 decimals"},
		"cost text":         {"tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, cost: "1e3x", mode: HARD}) { id } }`, "BAD_USER_INPUT", "is not a decimal number"},
		"cost long":         {"tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, cost: "` + strings.Repeat("9", 40) + `", mode: HARD}) { id } }`, "BAD_USER_INPUT", "more than 32"},
		"cost huge":         {"tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, cost: "` + strings.Repeat("9", 20) + `", mode: HARD}) { id } }`, "BAD_USER_INPUT", "above the largest budget"},
		"negative tokens":   {"tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, tokens: -1, mode: HARD}) { id } }`, "BAD_USER_INPUT", "tokens: -1 is outside"},
		"no limit":          {"tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, mode: SOFT}) { id } }`, "BAD_USER_INPUT", "set at least one limit"},
		"no scope id":       {"tok-a-manager", `mutation { setBudget(budget: {scope: ROOM, period: DAY, tokens: 5, mode: SOFT}) { id } }`, "BAD_USER_INPUT", "scope_id: missing"},
		"long delete id":    {"tok-a-manager", `mutation { deleteBudget(id: "` + strings.Repeat("x", 300) + `") { id } }`, "BAD_USER_INPUT", "longer than 256 bytes"},
		"unknown delete":    {"tok-a-manager", `mutation { deleteBudget(id: "bud_nope") { id } }`, "BAD_USER_INPUT", "no budget"},
		"budgets viewer":    {"tok-a-viewer", `{ budgets { id } }`, "FORBIDDEN", ""},
	} {
		a := ask(t, h, tc.token, tc.q)
		assert.Equal(t, tc.code, code(a), "%s: %+v", name, a.Errors)
		if tc.msg != "" && len(a.Errors) > 0 {
			assert.Contains(t, a.Errors[0].Message, tc.msg, name)
		}
		for field, v := range a.Data {
			assert.Equal(t, "null", string(v), "%s: %s has data", name, field)
		}
	}

	// The trail could not be written: UNAVAILABLE, the message says so.
	op.fail = fmt.Errorf("%w: cannot record the change in the audit trail: kafka down; the budget is not set", schema.ErrUnavailable)
	a = ask(t, h, "tok-a-manager", `mutation { setBudget(budget: {scope: ORG, period: DAY, tokens: 5, mode: HARD}) { id } }`)
	assert.Equal(t, "UNAVAILABLE", code(a))
	assert.Contains(t, a.Errors[0].Message, "the budget is not set")
	op.fail = nil

	a = ask(t, h, "tok-a-manager", `mutation { deleteBudget(id: "`+policy.BudgetID("org-a", policy.ScopeAgent, "a-1", policy.PeriodMonth)+`") { id scopeId } }`)
	require.Empty(t, a.Errors)
	a = ask(t, h, "tok-a-manager", `{ budgets { id } }`)
	assert.JSONEq(t, `[]`, string(a.Data["budgets"]))

	// Without the policy side: UNAVAILABLE.
	off := graph.NewHandler(&fakeQuerier{}, opKeys)
	a = ask(t, off, "tok-a-manager", `{ budgets { id } }`)
	assert.Equal(t, "UNAVAILABLE", code(a))
}

func TestSuspendMutations(t *testing.T) {
	op := &fakeOperator{ledger: policy.NewLedger(0)}
	h := graph.NewHandler(&fakeQuerier{}, opKeys, graph.WithOperator(op, "USD"))
	a := ask(t, h, "tok-a-operator", `mutation { suspendAgent(agentId: "a-1", reason: "loops") { agentId agentHandle suspended eventIds } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `{"agentId":"a-1","agentHandle":"alice/one","suspended":true,"eventIds":["ev-1"]}`, string(a.Data["suspendAgent"]))
	a = ask(t, h, "tok-a-operator", `mutation { resumeAgent(agentId: "a-1") { suspended } }`)
	assert.JSONEq(t, `{"suspended":false}`, string(a.Data["resumeAgent"]))

	a = ask(t, h, "tok-a-operator", `mutation { suspendAgent(agentId: "b-1") { suspended } }`)
	assert.Equal(t, "BAD_USER_INPUT", code(a), "another organization's agent reads as unknown")
	assert.Contains(t, []string{"", "null"}, string(a.Data["suspendAgent"]), "no data")
	a = ask(t, h, "tok-a-manager", `mutation { suspendAgent(agentId: "a-1") { suspended } }`)
	assert.Equal(t, "FORBIDDEN", code(a))

	// A platform admin acts on the organization it names, and only there.
	a = ask(t, h, "tok-admin", `mutation { suspendAgent(orgId: "org-b", agentId: "b-1") { suspended } }`)
	require.Empty(t, a.Errors)
	assert.Equal(t, "org-b", op.gotBy.Org)
	assert.Equal(t, "k-admin", op.gotBy.ID)
	a = ask(t, h, "tok-admin", `mutation { suspendAgent(orgId: "org-b", agentId: "a-1") { suspended } }`)
	assert.Equal(t, "BAD_USER_INPUT", code(a))
}
