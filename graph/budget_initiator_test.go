package graph_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/query"
)

// A budget of scope INITIATOR is set and listed like the other scopes: its id follows
// from the organization, the initiator and the period; budgets shows its spend across
// the organizations the initiator's requests reached, and names the initiator from the
// organization's own directory only (a system, or another organization's person, has
// no name).
func TestInitiatorBudgets(t *testing.T) {
	op := &fakeOperator{ledger: policy.NewLedger(0)}
	q := &fakeQuerier{names: map[string]query.Party{
		"u-alice": {Kind: "user", Handle: "alice", Name: "Alice"},
		"u-bob":   {Kind: "user", Handle: "bob", Name: "Bob"},
	}}
	h := graph.NewHandler(q, opKeys, graph.WithOperator(op, "USD"))

	a := ask(t, h, "tok-a-manager", `mutation { setBudget(budget: {scope: INITIATOR, scopeId: "u-alice", period: DAY, tokens: 1000, mode: HARD}) {
		id scope scopeId period mode tokens remainingTokens updatedBy } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `{"id":"`+policy.BudgetID("org-a", policy.ScopeInitiator, "u-alice", policy.PeriodDay)+`","scope":"INITIATOR","scopeId":"u-alice",
		"period":"DAY","mode":"HARD","tokens":1000,"remainingTokens":1000,"updatedBy":"k-a-mgr"}`, string(a.Data["setBudget"]))
	a = ask(t, h, "tok-a-manager", `mutation { setBudget(budget: {scope: INITIATOR, scopeId: "webhook:github", period: MONTH, cost: "12.5", mode: SOFT}) { id } }`)
	require.Empty(t, a.Errors)
	// org-b's budget on its own person: never in org-a's answers.
	a = ask(t, h, "tok-admin", `mutation { setBudget(orgId: "org-b", budget: {scope: INITIATOR, scopeId: "u-bob", period: DAY, tokens: 5, mode: HARD}) { id } }`)
	require.Empty(t, a.Errors)

	// alice's requests spent in org-a and in org-b (a partner's agent she mentioned):
	// both count on her budget, which belongs to org-a.
	now := time.Now()
	for _, org := range []string{"org-a", "org-b"} {
		op.ledger.Spend(policy.Charge{Org: org, Agent: "agent-" + org, Initiator: "u-alice", InitiatorOrg: "org-a", Tokens: 150}, "", now, now)
	}
	a = ask(t, h, "tok-a-manager", `{ budgets { scope scopeId scopeName spentTokens remainingTokens } }`)
	require.Empty(t, a.Errors)
	assert.Equal(t, "org-a", q.namesOrg, "names come from the organization's own directory")
	var got []map[string]any
	require.NoError(t, json.Unmarshal(a.Data["budgets"], &got))
	byID := map[string]map[string]any{}
	for _, b := range got {
		byID[b["scopeId"].(string)] = b
	}
	require.Len(t, byID, 2, "%s", a.Data["budgets"])
	assert.Equal(t, map[string]any{"scope": "INITIATOR", "scopeId": "u-alice", "scopeName": "alice", "spentTokens": 300.0, "remainingTokens": 700.0}, byID["u-alice"])
	assert.Nil(t, byID["webhook:github"]["scopeName"], "a system initiator has no name")
	assert.NotContains(t, string(a.Data["budgets"]), "u-bob")

	a = ask(t, h, "tok-admin", `{ budgets(orgId: "org-b") { scopeId scopeName } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `[{"scopeId":"u-bob","scopeName":"bob"}]`, string(a.Data["budgets"]))
}

// Every hostile INITIATOR budget is refused with the field and what is wrong, and sets
// nothing.
func TestInitiatorBudgetsHostile(t *testing.T) {
	op := &fakeOperator{ledger: policy.NewLedger(0)}
	h := graph.NewHandler(&fakeQuerier{}, opKeys, graph.WithOperator(op, "USD"))
	set := func(orgID, scopeID string) string {
		org := ""
		if orgID != "" {
			org = `orgId: ` + orgID + `, `
		}
		return `mutation { setBudget(` + org + `budget: {scope: INITIATOR` + scopeID + `, period: DAY, tokens: 5, mode: HARD}) { id } }`
	}
	for name, tc := range map[string]struct{ token, q, code, msg string }{
		"no scope id":     {"tok-a-manager", set("", ""), "BAD_USER_INPUT", "scope_id: missing (the initiator the budget counts)"},
		"empty scope id":  {"tok-a-manager", set("", `, scopeId: ""`), "BAD_USER_INPUT", "scope_id: missing"},
		"long scope id":   {"tok-a-manager", set("", `, scopeId: "`+strings.Repeat("u", 257)+`"`), "BAD_USER_INPUT", "scope_id: 257 bytes long, more than 256"},
		"control char":    {"tok-a-manager", set("", `, scopeId: "u-al\u0000ice"`), "BAD_USER_INPUT", "scope_id: control character at byte 4"},
		"newline":         {"tok-a-manager", set("", `, scopeId: "u-alice\n"`), "BAD_USER_INPUT", "scope_id: control character at byte 7"},
		"other org":       {"tok-a-manager", set(`"org-b"`, `, scopeId: "u-bob"`), "FORBIDDEN", ""},
		"viewer":          {"tok-a-viewer", set("", `, scopeId: "u-alice"`), "FORBIDDEN", ""},
		"operator":        {"tok-a-operator", set("", `, scopeId: "u-alice"`), "FORBIDDEN", ""},
		"platform no org": {"tok-admin", set("", `, scopeId: "u-alice"`), "BAD_USER_INPUT", "orgId"},
		"no limit":        {"tok-a-manager", `mutation { setBudget(budget: {scope: INITIATOR, scopeId: "u-alice", period: DAY, mode: HARD}) { id } }`, "BAD_USER_INPUT", "set at least one limit"},
		"huge tokens":     {"tok-a-manager", `mutation { setBudget(budget: {scope: INITIATOR, scopeId: "u-alice", period: DAY, tokens: 9000000000000000000, mode: HARD}) { id } }`, "BAD_USER_INPUT", "is outside 0..1000000000000000"},
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
	// A scope that is not one of the enum's is refused before any resolver runs.
	for _, scope := range []string{"INITIATORS", `"initiator"`, "initiator"} {
		status, errs := post(t, h, gqlBody(`mutation { setBudget(budget: {scope: `+scope+`, scopeId: "u-alice", period: DAY, tokens: 5, mode: HARD}) { id } }`),
			http.Header{"Authorization": {"Bearer tok-a-manager"}})
		assert.Equal(t, http.StatusUnprocessableEntity, status, "scope %s: %+v", scope, errs)
	}
	assert.Empty(t, op.ledger.Budgets("org-a", time.Now()), "nothing was set")
	assert.Empty(t, op.ledger.Budgets("org-b", time.Now()), "nothing was set")
}
