package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// initiatorCharge is a charge of agent a of org-b set going by person u of org-a.
func initiatorCharge(tokens int64) Charge {
	return Charge{Org: "org-b", Owner: "u-b", Agent: "a", Room: "r", Initiator: "u", InitiatorOrg: "org-a", Tokens: tokens}
}

func initiatorSpent(l *Ledger, p Period, now time.Time) (spent, reserved int64) {
	spent, _, reserved, _ = l.Spent("org-a", ScopeInitiator, "u", p, now)
	return spent, reserved
}

// The usage report that settles a reservation counts against the reservation's
// initiator when it names none itself (the canonical usage.reported carries no chain),
// once when it does, and never when it settles nothing.
func TestLedgerSettlementChargesTheInitiator(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeInitiator, "u", PeriodMonth, 1000, 0, true), day0)
	_, deny := l.Reserve("d1", initiatorCharge(300), "x1", DefaultLimits{}, day0)
	require.Nil(t, deny)
	spent, reserved := initiatorSpent(l, PeriodMonth, day0)
	assert.Equal(t, [2]int64{0, 300}, [2]int64{spent, reserved})

	noChain := initiatorCharge(120)
	noChain.Initiator, noChain.InitiatorOrg = "", ""
	l.Spend(noChain, "x1", day0, day0)
	spent, reserved = initiatorSpent(l, PeriodMonth, day0)
	assert.Equal(t, [2]int64{120, 0}, [2]int64{spent, reserved}, "actual replaces the estimate on the initiator")
	tok, _, _, _ := l.Spent("org-a", ScopeInitiator, "u", PeriodDay, day0)
	assert.Equal(t, int64(120), tok, "day and month")

	// A report naming the initiator itself counts once, reservation or not.
	_, deny = l.Reserve("d2", initiatorCharge(300), "x2", DefaultLimits{}, day0)
	require.Nil(t, deny)
	l.Spend(initiatorCharge(50), "x2", day0, day0)
	spent, reserved = initiatorSpent(l, PeriodMonth, day0)
	assert.Equal(t, [2]int64{170, 0}, [2]int64{spent, reserved})

	// Usage of an execution nobody reserved for here counts only where it says.
	l.Spend(noChain, "x-unknown", day0, day0)
	spent, _ = initiatorSpent(l, PeriodMonth, day0)
	assert.Equal(t, int64(170), spent)

	// A released or expired reservation gives the initiator's room back.
	_, deny = l.Reserve("d3", initiatorCharge(800), "x3", DefaultLimits{}, day0)
	require.Nil(t, deny)
	_, deny = l.Reserve("d4", initiatorCharge(100), "x4", DefaultLimits{}, day0)
	require.NotNil(t, deny, "170 spent and 800 reserved of 1000")
	l.Release("d3", day0)
	_, reserved = initiatorSpent(l, PeriodMonth, day0)
	assert.Zero(t, reserved)
	_, deny = l.Reserve("d5", initiatorCharge(800), "x5", DefaultLimits{}, day0)
	require.Nil(t, deny)
	assert.Equal(t, 1, l.Expire(day0.Add(DefaultReservationTTL)))
	_, reserved = initiatorSpent(l, PeriodMonth, day0)
	assert.Zero(t, reserved)
	assert.Zero(t, l.Reservations())
}

// An initiator's budget is its organization's: it counts the work the initiator set
// going in any organization, and only an initiator of that organization.
func TestLedgerInitiatorBudgetIsTheInitiatorsOrganizations(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeInitiator, "u", PeriodDay, 1000, 0, true), day0)
	_, deny := l.Reserve("d1", initiatorCharge(1000), "x1", DefaultLimits{}, day0)
	require.Nil(t, deny)
	other := initiatorCharge(1)
	other.InitiatorOrg = "org-b" // a system initiator named u in the agent's organization
	_, deny = l.Reserve("d2", other, "x2", DefaultLimits{}, day0)
	assert.Nil(t, deny, "another organization's initiator u has no budget")
	_, deny = l.Reserve("d3", initiatorCharge(1), "x3", DefaultLimits{}, day0)
	require.NotNil(t, deny)
	assert.Contains(t, deny.Message, BudgetID("org-a", ScopeInitiator, "u", PeriodDay)+": 0 spent and 1000 reserved of 1000 tokens this day")
	assert.Equal(t, PeriodEnd(PeriodDay, day0).Sub(day0), deny.RetryAfter)

	b, ok := l.HardBudget("org-a", ScopeInitiator, "u")
	assert.True(t, ok)
	assert.Equal(t, BudgetID("org-a", ScopeInitiator, "u", PeriodDay), b.ID)
	_, ok = l.HardBudget("org-b", ScopeInitiator, "u")
	assert.False(t, ok)
	l.Set(budget(t, ScopeInitiator, "soft", PeriodDay, 10, 0, false), day0)
	_, ok = l.HardBudget("org-a", ScopeInitiator, "soft")
	assert.False(t, ok, "a soft budget only alerts")
	statuses := l.Budgets("org-a", day0)
	require.Len(t, statuses, 2)
	assert.Equal(t, ScopeInitiator, statuses[0].Scope)
	assert.Equal(t, int64(1000), statuses[0].ReservedTokens+statuses[1].ReservedTokens,
		"the initiator's organization sees what another organization's agent reserved on it")
}

// Crossings of an initiator's budget are reported like any budget's, with the
// initiator's organization.
func TestLedgerInitiatorCrossing(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeInitiator, "u", PeriodDay, 1000, 0, false), day0)
	l.Spend(initiatorCharge(850), "", day0, day0)
	select {
	case x := <-l.Crossings():
		assert.Equal(t, 80, x.Threshold)
		assert.Equal(t, "org-a", x.Budget.Org)
		assert.Equal(t, ScopeInitiator, x.Budget.Scope)
	default:
		t.Fatal("no crossing reported")
	}
}

func TestBudgetValidateInitiator(t *testing.T) {
	b := Budget{Org: "org-a", Scope: ScopeInitiator, Period: PeriodDay, Tokens: 1}
	assert.ErrorContains(t, b.Validate(), "scope_id: missing (the initiator the budget counts)")
	b.Scope = "initiators"
	assert.ErrorContains(t, b.Validate(), `scope: "initiators" is not one of org, owner, agent, room, initiator`)
}
