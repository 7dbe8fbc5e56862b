package api_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

var acmeManager = keys.Key{ID: "k-mgr", Org: "org-acme", Role: keys.RoleManager}

func TestSetBudgetIsRecordedThenInForce(t *testing.T) {
	aud := &fakeAuditor{}
	a, eng := newAPI(t, aud, nil)
	ctx := context.Background()
	b, err := a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeAgent, ScopeID: "a-coder", Period: policy.PeriodDay, Tokens: 1000, Hard: true})
	require.NoError(t, err)
	assert.Equal(t, "k-mgr", b.UpdatedBy)
	evs := aud.eventsOf(schema.TypeBudgetSet)
	require.Len(t, evs, 1)
	assert.Equal(t, "org-acme", evs[0].OrgID)
	assert.True(t, schema.OwnSource(evs[0].Source))
	_, ok := eng.Ledger().Budget(b.ID)
	assert.True(t, ok)

	// Estimates past it are denied; the audited deny releases nothing it did not take.
	d, err := a.Decide(ctx, policy.SendMessage, &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 600, ExecutionID: "x1"})
	require.NoError(t, err)
	require.True(t, d.Allow, "%+v", d)
	assert.NotEmpty(t, d.ReservationID)
	d, err = a.Decide(ctx, policy.SendMessage, &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 600})
	require.NoError(t, err)
	assert.False(t, d.Allow)
	assert.Equal(t, policy.CodeBudgetExceeded, d.Reasons[0].Code)

	// Another organization's agent, or an unknown one, is not found alike.
	for _, id := range []string{"a-partner-reviewer", "a-nobody"} {
		_, err = a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeAgent, ScopeID: id, Period: policy.PeriodDay, Tokens: 1})
		assert.ErrorIs(t, err, schema.ErrNotFound, id)
	}
	_, err = a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-partner", Scope: policy.ScopeOrg, Period: policy.PeriodDay, Tokens: 1})
	assert.ErrorIs(t, err, schema.ErrForbidden)
	_, err = a.SetBudget(ctx, acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeOrg, Period: "week", Tokens: 1})
	assert.ErrorIs(t, err, schema.ErrInvalid)

	_, err = a.DeleteBudget(ctx, keys.Key{ID: "k-p", Org: "org-partner", Role: keys.RoleManager}, "org-acme", b.ID)
	assert.ErrorIs(t, err, schema.ErrForbidden)
	_, err = a.DeleteBudget(ctx, acmeManager, "org-acme", b.ID)
	require.NoError(t, err)
	assert.Len(t, aud.eventsOf(schema.TypeBudgetDeleted), 1)
	_, err = a.DeleteBudget(ctx, acmeManager, "org-acme", b.ID)
	assert.ErrorIs(t, err, schema.ErrNotFound)
}

func TestSetBudgetThatCannotBeRecordedIsNotSet(t *testing.T) {
	a, eng := newAPI(t, &fakeAuditor{err: errors.New("kafka down")}, nil)
	_, err := a.SetBudget(context.Background(), acmeManager, policy.Budget{Org: "org-acme", Scope: policy.ScopeOrg, Period: policy.PeriodDay, Tokens: 1, Hard: true})
	assert.ErrorIs(t, err, schema.ErrUnavailable)
	assert.Contains(t, err.Error(), "the budget is not set")
	assert.Zero(t, eng.Ledger().Count("org-acme"))
}

func TestBudgetsPerOrganizationAreBounded(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	ctx := context.Background()
	room := func(i int) policy.Budget {
		return policy.Budget{Org: "org-acme", Scope: policy.ScopeRoom, ScopeID: fmt.Sprint("room-", i), Period: policy.PeriodDay, Tokens: 5}
	}
	for i := range policy.MaxBudgetsPerOrg {
		_, err := a.SetBudget(ctx, acmeManager, room(i))
		require.NoError(t, err)
	}
	_, err := a.SetBudget(ctx, acmeManager, room(policy.MaxBudgetsPerOrg))
	assert.ErrorIs(t, err, schema.ErrInvalid)
	assert.Contains(t, err.Error(), "has 1000 budgets")
	_, err = a.SetBudget(ctx, acmeManager, room(7))
	assert.NoError(t, err, "changing one in force is always possible")
}

func TestSetSuspendedRefusesForeignAgentsAndBadReasons(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	ctx := context.Background()
	op := keys.Key{ID: "k-op", Org: "org-acme", Role: keys.RoleOperator}
	_, _, err := a.SetSuspended(ctx, op, "a-partner-reviewer", true, "")
	assert.ErrorIs(t, err, schema.ErrNotFound)
	_, _, err = a.SetSuspended(ctx, op, "a-coder", true, "bad \xff")
	assert.ErrorIs(t, err, schema.ErrInvalid)
	ag, evs, err := a.SetSuspended(ctx, op, "a-coder", true, "loops")
	require.NoError(t, err)
	assert.True(t, ag.IsSuspended())
	assert.Len(t, evs, 2)
}
