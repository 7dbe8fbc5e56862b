package graph

import (
	"context"
	"errors"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/shopspring/decimal"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// Operator is what the budget and operator mutations act through: the policy side of
// the process (*api.API). Its errors match schema.ErrInvalid, schema.ErrNotFound,
// schema.ErrForbidden or schema.ErrUnavailable.
type Operator interface {
	SetBudget(ctx context.Context, by keys.Key, b policy.Budget) (policy.Budget, error)
	DeleteBudget(ctx context.Context, by keys.Key, org, id string) (policy.Budget, error)
	Budgets(org string) []policy.BudgetStatus
	SetSuspended(ctx context.Context, by keys.Key, id string, suspended bool, reason string) (policy.Agent, []string, error)
}

var _ Operator = (*api.API)(nil)

// WithOperator serves the budget and operator fields through op (nil: they answer
// UNAVAILABLE, as in a process run with --no-policy).
func WithOperator(op Operator, currency string) Option {
	return func(c *config) { c.operator, c.currency = op, currency }
}

// operators may suspend and resume agents.
var operators = []keys.Role{keys.RoleOperator, keys.RoleAdmin}

// errUnavailable is a field whose part of the process does not run here.
func unavailable(ctx context.Context, what string) error {
	return &gqlerror.Error{Message: what + " is not running in this process", Path: graphql.GetPath(ctx),
		Extensions: map[string]any{"code": "UNAVAILABLE"}}
}

// operatorError maps the policy side's errors to the API's codes: a wrong or foreign
// id is the caller's mistake (the same answer for both: no existence oracle).
func (r *Resolver) operatorError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, schema.ErrInvalid), errors.Is(err, schema.ErrNotFound):
		return r.fail(ctx, &schema.FieldError{Reason: err.Error()})
	case errors.Is(err, schema.ErrUnavailable):
		r.log.WarnContext(ctx, "operator action refused", "err", err)
		return &gqlerror.Error{Message: strings.ReplaceAll(err.Error(), "\n", "; "), Path: graphql.GetPath(ctx),
			Extensions: map[string]any{"code": "UNAVAILABLE"}}
	}
	return r.fail(ctx, err)
}

var budgetScopes = map[model.BudgetScope]policy.BudgetScope{
	model.BudgetScopeOrg: policy.ScopeOrg, model.BudgetScopeOwner: policy.ScopeOwner,
	model.BudgetScopeAgent: policy.ScopeAgent, model.BudgetScopeRoom: policy.ScopeRoom,
	model.BudgetScopeInitiator: policy.ScopeInitiator,
}

var budgetPeriods = map[model.BudgetPeriod]policy.Period{model.BudgetPeriodDay: policy.PeriodDay, model.BudgetPeriodMonth: policy.PeriodMonth}

// budgetOf reads a BudgetInput for org.
func budgetOf(org string, in model.BudgetInput) (policy.Budget, error) {
	b := policy.Budget{Org: org, Scope: budgetScopes[in.Scope], ScopeID: deref(in.ScopeID), Period: budgetPeriods[in.Period],
		Tokens: deref(in.Tokens), Hard: in.Mode == model.BudgetModeHard}
	if in.Cost != nil {
		micros, err := policy.ParseCostMicros(*in.Cost)
		if err != nil {
			return b, &schema.FieldError{Field: "budget.cost", Reason: err.Error()}
		}
		b.CostMicros = micros
	}
	return b, nil
}

func micros(n int64) string { return decimal.New(n, -6).StringFixed(6) }

var scopeModels = map[policy.BudgetScope]model.BudgetScope{
	policy.ScopeOrg: model.BudgetScopeOrg, policy.ScopeOwner: model.BudgetScopeOwner,
	policy.ScopeAgent: model.BudgetScopeAgent, policy.ScopeRoom: model.BudgetScopeRoom,
	policy.ScopeInitiator: model.BudgetScopeInitiator,
}

// budgetModel is a budget with its spend; n names its scope (nil: no names).
func (r *Resolver) budgetModel(s policy.BudgetStatus, n *names) model.Budget {
	m := budgetModel(s, r.currency)
	if n != nil {
		switch s.Scope {
		case policy.ScopeRoom:
			m.ScopeName = n.room(s.ScopeID)
		case policy.ScopeOwner, policy.ScopeAgent, policy.ScopeInitiator:
			// An initiator the organization's directory does not know (a system, or
			// another organization's person) has no name here.
			n.party(s.ScopeID, &m.ScopeName, nil)
		}
	}
	return m
}

// budgetModel is a budget with its spend, costs in currency.
func budgetModel(s policy.BudgetStatus, currency string) model.Budget {
	period := model.BudgetPeriodDay
	if s.Period == policy.PeriodMonth {
		period = model.BudgetPeriodMonth
	}
	mode := model.BudgetModeSoft
	if s.Hard {
		mode = model.BudgetModeHard
	}
	m := model.Budget{ID: s.ID, Scope: scopeModels[s.Scope], ScopeID: s.ScopeID, Period: period, Mode: mode,
		Currency: currency, UpdatedAt: s.UpdatedAt, UpdatedBy: optString(s.UpdatedBy),
		PeriodStart: s.PeriodStart, PeriodEnd: s.PeriodEnd,
		SpentTokens: s.SpentTokens, SpentCost: micros(s.SpentCost), ReservedTokens: s.ReservedTokens, ReservedCost: micros(s.ReservedCost),
		ProjectedTokens: s.ProjectedTokens, ProjectedCost: micros(s.ProjectedCost)}
	if s.Tokens > 0 {
		t, rem := s.Tokens, max(0, s.Tokens-s.SpentTokens-s.ReservedTokens)
		m.Tokens, m.RemainingTokens = &t, &rem
	}
	if s.CostMicros > 0 {
		c, rem := micros(s.CostMicros), micros(max(0, s.CostMicros-s.SpentCost-s.ReservedCost))
		m.Cost, m.RemainingCost = &c, &rem
	}
	return m
}

// budgetNames looks up the names of the budgets' scopes.
func (r *Resolver) budgetNames(ctx context.Context, org string, bs []policy.BudgetStatus) (names, error) {
	var ids, rooms []string
	for _, b := range bs {
		if b.Scope == policy.ScopeRoom {
			rooms = append(rooms, b.ScopeID)
		} else if b.Scope != policy.ScopeOrg {
			ids = append(ids, b.ScopeID)
		}
	}
	return r.lookupNames(ctx, org, ids, rooms)
}

// statusOf is a budget as just set, with its spend now.
func (r *Resolver) statusOf(org string, b policy.Budget) policy.BudgetStatus {
	for _, s := range r.operator.Budgets(org) {
		if s.ID == b.ID {
			return s
		}
	}
	return policy.BudgetStatus{Budget: b}
}

func (r *Resolver) setSuspended(ctx context.Context, orgID *string, agentID string, reason *string, suspended bool) (*model.AgentControlResult, error) {
	k, _, err := r.authorize(ctx, orgID, operators)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	if r.operator == nil {
		return nil, unavailable(ctx, "the policy side (decisions, budgets, suspensions)")
	}
	org := k.Org
	if orgID != nil && *orgID != "" {
		org = *orgID
	}
	// A platform key acts on the organization it names: the agent must be in it.
	by := k
	by.Org = org
	ag, events, err := r.operator.SetSuspended(ctx, by, agentID, suspended, deref(reason))
	if err != nil {
		return nil, r.operatorError(ctx, err)
	}
	return &model.AgentControlResult{AgentID: ag.ID, AgentHandle: optString(ag.Handle), Suspended: ag.IsSuspended(), EventIds: events}, nil
}
