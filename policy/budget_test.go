package policy

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var day0 = time.Date(2026, 3, 10, 10, 0, 0, 0, time.UTC)

func budget(t *testing.T, scope BudgetScope, id string, p Period, tokens, cost int64, hard bool) Budget {
	t.Helper()
	b := Budget{Org: "org-a", Scope: scope, ScopeID: id, Period: p, Tokens: tokens, CostMicros: cost, Hard: hard, UpdatedAt: day0}
	b.Normalize()
	require.NoError(t, b.Validate())
	return b
}

func TestLedgerCountsDayAndMonth(t *testing.T) {
	l := NewLedger(0)
	ch := Charge{Org: "org-a", Owner: "u", Agent: "a", Room: "r", Tokens: 100, CostMicros: 5}
	l.Spend(ch, "", day0, day0)
	l.Spend(ch, "", day0.Add(time.Hour), day0)
	l.Spend(ch, "", day0.AddDate(0, 0, -1), day0) // yesterday: this month, not today
	tok, cost, _, _ := l.Spent("org-a", ScopeRoom, "r", PeriodDay, day0)
	assert.Equal(t, [2]int64{200, 10}, [2]int64{tok, cost})
	tok, _, _, _ = l.Spent("org-a", ScopeAgent, "a", PeriodDay, day0)
	assert.Equal(t, int64(200), tok, "yesterday's late report is not today's spend")
	next := day0.AddDate(0, 0, 1)
	tok, _, _, _ = l.Spent("org-a", ScopeAgent, "a", PeriodDay, next)
	assert.Zero(t, tok, "a new day reads zero")
	tok, _, _, _ = l.Spent("org-b", ScopeAgent, "a", PeriodDay, day0)
	assert.Zero(t, tok, "counters are per organization")
	l.Spend(ch, "", next, next)
	tok, _, _, _ = l.Spent("org-a", ScopeAgent, "a", PeriodDay, next)
	assert.Equal(t, int64(100), tok)
	tok, _, _, _ = l.Spent("org-a", ScopeOrg, "org-a", PeriodMonth, next)
	assert.Equal(t, int64(400), tok, "the month keeps every day of it")
	assert.Equal(t, time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC), PeriodEnd(PeriodMonth, day0))
	assert.Equal(t, 14*time.Hour, PeriodEnd(PeriodDay, day0).Sub(day0))
}

func TestLedgerSaturates(t *testing.T) {
	l := NewLedger(0)
	ch := Charge{Org: "g", Tokens: math.MaxInt64, CostMicros: math.MaxInt64}
	l.Spend(ch, "", day0, day0)
	l.Spend(ch, "", day0, day0)
	l.Spend(Charge{Org: "g", Tokens: -5, CostMicros: -5}, "", day0, day0) // never shrinks
	tok, cost, _, _ := l.Spent("g", ScopeOrg, "g", PeriodDay, day0)
	assert.Equal(t, [2]int64{math.MaxInt64, math.MaxInt64}, [2]int64{tok, cost}, "a total stops at the top instead of wrapping")
}

// The test: 200 concurrent decisions, each estimating 1/20 of a hard budget's
// remaining room, allow at most 20; after their usage arrives, the counters equal the
// actual spend.
func TestLedgerHoldsUnderConcurrency(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeOwner, "u", PeriodDay, 1_000_000, 0, true), day0)
	l.Spend(Charge{Org: "org-a", Owner: "u", Tokens: 400_000}, "", day0, day0)
	remaining := int64(600_000)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	granted := make(chan string, 200)
	for i := range 200 {
		wg.Go(func() {
			<-start
			agent := "a" + string(rune('a'+i%7))
			exec := "x" + strings.Repeat("-", i%3) + string(rune('A'+i))
			_, deny := l.Reserve("d"+exec, Charge{Org: "org-a", Owner: "u", Agent: agent, Tokens: remaining / 20}, exec, DefaultLimits{}, day0)
			if deny == nil {
				allowed.Add(1)
				granted <- agent + "|" + exec
			}
		})
	}
	close(start)
	wg.Wait()
	close(granted)
	assert.Equal(t, int64(20), allowed.Load(), "exactly the room of the budget, never more")
	_, _, res, _ := l.Spent("org-a", ScopeOwner, "u", PeriodDay, day0)
	assert.Equal(t, remaining, res)
	var actual int64
	for g := range granted {
		agent, exec, _ := strings.Cut(g, "|")
		used := int64(len(exec) * 1000) // the actual usage differs from the estimate
		actual += used
		l.Spend(Charge{Org: "org-a", Owner: "u", Agent: agent, Tokens: used}, exec, day0, day0)
	}
	spent, _, res, _ := l.Spent("org-a", ScopeOwner, "u", PeriodDay, day0)
	assert.Equal(t, 400_000+actual, spent, "actual replaces the estimate")
	assert.Zero(t, res)
	assert.Zero(t, l.Reservations())
}

func TestLedgerReservationExpires(t *testing.T) {
	l := NewLedger(time.Minute)
	l.Set(budget(t, ScopeAgent, "a", PeriodMonth, 100, 0, true), day0)
	r, deny := l.Reserve("d1", Charge{Org: "org-a", Agent: "a", Tokens: 100}, "", DefaultLimits{}, day0)
	require.Nil(t, deny)
	assert.Equal(t, day0.Add(time.Minute), r.Expires)
	_, deny = l.Reserve("d2", Charge{Org: "org-a", Agent: "a", Tokens: 1}, "", DefaultLimits{}, day0)
	require.NotNil(t, deny, "the whole budget is reserved")
	assert.Contains(t, deny.Message, "0 spent and 100 reserved of 100 tokens this month")
	assert.Equal(t, time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Sub(day0), deny.RetryAfter)
	assert.Zero(t, l.Expire(day0.Add(59*time.Second)))
	assert.Equal(t, 1, l.Expire(day0.Add(time.Minute)))
	_, deny = l.Reserve("d3", Charge{Org: "org-a", Agent: "a", Tokens: 1}, "", DefaultLimits{}, day0.Add(time.Minute))
	assert.Nil(t, deny, "an expired reservation gives its room back")
	// Without an execution id, the agent's next usage report settles its oldest reservation.
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 3}, "", day0, day0)
	spent, _, res, _ := l.Spent("org-a", ScopeAgent, "a", PeriodMonth, day0)
	assert.Equal(t, [2]int64{3, 0}, [2]int64{spent, res})
	l.Release("d3", day0) // already settled: nothing happens
	l.Release("nope", day0)
	_, _, res, _ = l.Spent("org-a", ScopeAgent, "a", PeriodMonth, day0)
	assert.Zero(t, res)
}

func TestLedgerReleaseGivesBack(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeRoom, "r", PeriodDay, 0, 1000, true), day0)
	_, deny := l.Reserve("d1", Charge{Org: "org-a", Room: "r", CostMicros: 1000}, "x", DefaultLimits{}, day0)
	require.Nil(t, deny)
	_, deny = l.Reserve("d2", Charge{Org: "org-a", Room: "r", CostMicros: 1}, "y", DefaultLimits{}, day0)
	require.NotNil(t, deny)
	l.Release("d1", day0)
	_, deny = l.Reserve("d3", Charge{Org: "org-a", Room: "r", CostMicros: 1000}, "z", DefaultLimits{}, day0)
	assert.Nil(t, deny)
}

func TestLedgerSoftBudgetAlertsOnly(t *testing.T) {
	l := NewLedger(0)
	b := budget(t, ScopeOrg, "", PeriodDay, 1000, 0, false)
	l.Set(b, day0)
	for i := range 3 {
		_, deny := l.Reserve("d"+string(rune('0'+i)), Charge{Org: "org-a", Tokens: 600}, "", DefaultLimits{}, day0)
		assert.Nil(t, deny, "a soft budget never denies")
	}
	var got []int
	for len(l.Crossings()) > 0 {
		x := <-l.Crossings()
		assert.Equal(t, b.ID, x.Budget.ID)
		got = append(got, x.Threshold)
	}
	assert.Equal(t, []int{80, 100}, got, "each crossing once")
}

func TestLedgerCrossingsOncePerCrossing(t *testing.T) {
	l := NewLedger(time.Minute)
	b := budget(t, ScopeAgent, "a", PeriodDay, 100, 0, true)
	l.Set(b, day0)
	thresholds := func() (out []int) {
		for len(l.Crossings()) > 0 {
			out = append(out, (<-l.Crossings()).Threshold)
		}
		return out
	}
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 79}, "", day0, day0)
	assert.Empty(t, thresholds())
	_, deny := l.Reserve("d1", Charge{Org: "org-a", Agent: "a", Tokens: 1}, "", DefaultLimits{}, day0)
	require.Nil(t, deny)
	assert.Equal(t, []int{80}, thresholds(), "actual plus reserved crosses 80 %")
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 5}, "", day0, day0) // settles d1: 84
	assert.Empty(t, thresholds(), "no second report while above 80 %")
	_, deny = l.Reserve("d2", Charge{Org: "org-a", Agent: "a", Tokens: 16}, "", DefaultLimits{}, day0)
	require.Nil(t, deny)
	assert.Equal(t, []int{100}, thresholds())
	l.Expire(day0.Add(time.Minute)) // back to 84, then up again: reported once per day only
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 50}, "", day0, day0)
	assert.Empty(t, thresholds())
	l.Set(b, day0) // the same budget again (a replica re-applying it): no new crossing
	assert.Empty(t, thresholds())
	changed := b
	changed.Tokens, changed.UpdatedAt = 120, day0.Add(time.Second)
	l.Set(changed, day0) // new limits: 134 of 120 crosses both again
	assert.Equal(t, []int{80, 100}, thresholds())
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 1}, "", day0.AddDate(0, 0, 1), day0.AddDate(0, 0, 1))
	assert.Empty(t, thresholds(), "a new day starts below every threshold")
	l.Quiet(true)
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 500}, "", day0.AddDate(0, 0, 1), day0.AddDate(0, 0, 1))
	assert.Empty(t, thresholds(), "quiet while bootstrapping")
}

func TestLedgerDefaultsAlwaysApply(t *testing.T) {
	l := NewLedger(0)
	def := DefaultLimits{AgentTokens: 30}
	_, deny := l.Reserve("d1", Charge{Org: "org-a", Agent: "a", Tokens: 31}, "", def, day0)
	require.NotNil(t, deny)
	assert.Contains(t, deny.Message, "the daily quota of agent a")
	l.Set(budget(t, ScopeAgent, "a", PeriodDay, 1_000_000, 0, false), day0)
	_, deny = l.Reserve("d2", Charge{Org: "org-a", Agent: "a", Tokens: 31}, "", def, day0)
	assert.NotNil(t, deny, "a budget only tightens what the policy data allows: a manager cannot lift the platform's quota")
	l.Set(budget(t, ScopeAgent, "a", PeriodMonth, 20, 0, true), day0)
	_, deny = l.Reserve("d3", Charge{Org: "org-a", Agent: "a", Tokens: 11}, "", def, day0)
	require.Nil(t, deny)
	_, deny = l.Reserve("d4", Charge{Org: "org-a", Agent: "a", Tokens: 11}, "", def, day0)
	require.NotNil(t, deny, "the month budget counts too")
	assert.Contains(t, deny.Message, "this month")
}

func TestLedgerFutureUsageCountsNow(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeOrg, "", PeriodDay, 1000, 0, true), day0)
	l.Spend(Charge{Org: "org-a", Tokens: 900}, "", day0, day0)
	late := day0.Add(14*time.Hour - time.Minute)                                  // 23:59
	l.Spend(Charge{Org: "org-a", Tokens: 50}, "", late.Add(30*time.Minute), late) // stamped tomorrow 00:29
	spent, _, _, _ := l.Spent("org-a", ScopeOrg, "org-a", PeriodDay, late)
	assert.Equal(t, int64(950), spent, "usage ahead of the clock counts today and never resets today's spend")
	_, deny := l.Reserve("d", Charge{Org: "org-a", Tokens: 100}, "", DefaultLimits{}, late)
	assert.NotNil(t, deny)
}

func TestLedgerSettlesOnlyItsOwnExecution(t *testing.T) {
	l := NewLedger(0)
	l.Set(budget(t, ScopeAgent, "a", PeriodDay, 1000, 0, true), day0)
	_, deny := l.Reserve("d1", Charge{Org: "org-a", Agent: "a", Tokens: 500}, "", DefaultLimits{}, day0)
	require.Nil(t, deny)
	l.Spend(Charge{Org: "org-a", Agent: "a", Tokens: 10}, "exec-elsewhere", day0, day0)
	_, _, res, _ := l.Spent("org-a", ScopeAgent, "a", PeriodDay, day0)
	assert.Equal(t, int64(500), res, "usage of another execution does not release this reservation")
}

func TestLedgerSweepsEndedPeriodsAndRemembersDeletions(t *testing.T) {
	l := NewLedger(0)
	b := budget(t, ScopeAgent, "a", PeriodDay, 1000, 0, true)
	l.Set(b, day0)
	l.Spend(Charge{Org: "org-a", Owner: "u", Agent: "a", Room: "r", Tokens: 5}, "", day0, day0)
	next := day0.AddDate(0, 0, 1)
	removed := l.Sweep(next)
	assert.Equal(t, 3, removed, "yesterday's day counters of org, owner and room; not the agent's (it has a budget), nor the month's")
	assert.True(t, l.Delete(b.ID, day0.Add(time.Minute)))
	assert.False(t, l.Set(b, day0), "a replay of the budget's set after its deletion does not bring it back")
	newer := b
	newer.UpdatedAt = day0.Add(2 * time.Minute)
	assert.True(t, l.Set(newer, day0), "a later set does")
}

func TestLedgerSetAndDeleteFollowTime(t *testing.T) {
	l := NewLedger(0)
	b := budget(t, ScopeAgent, "a", PeriodDay, 10, 0, true)
	require.True(t, l.Set(b, day0))
	older := b
	older.Tokens, older.UpdatedAt = 99, day0.Add(-time.Second)
	assert.False(t, l.Set(older, day0), "a replay of an older change")
	got, ok := l.Budget(b.ID)
	require.True(t, ok)
	assert.Equal(t, int64(10), got.Tokens)
	newer := b
	newer.Tokens, newer.UpdatedAt = 20, day0.Add(time.Second)
	assert.True(t, l.Set(newer, day0))
	assert.Len(t, l.Budgets("org-a", day0), 1, "setting again replaces")
	assert.Empty(t, l.Budgets("org-b", day0), "another organization sees none")
	assert.False(t, l.Delete(b.ID, day0), "a deletion older than the last change")
	assert.True(t, l.Delete(b.ID, day0.Add(2*time.Second)))
	assert.Empty(t, l.Budgets("org-a", day0))
	_, deny := l.Reserve("d", Charge{Org: "org-a", Agent: "a", Tokens: 1000}, "", DefaultLimits{}, day0)
	assert.Nil(t, deny)
}

func TestLedgerBudgetsProject(t *testing.T) {
	l := NewLedger(0)
	b := budget(t, ScopeOrg, "", PeriodDay, 1_000_000, 0, true)
	l.Set(b, day0)
	l.Spend(Charge{Org: "org-a", Tokens: 1000}, "", day0, day0) // 10 h into the day
	st := l.Budgets("org-a", day0)
	require.Len(t, st, 1)
	assert.Equal(t, int64(1000), st[0].SpentTokens)
	assert.Equal(t, int64(2400), st[0].ProjectedTokens, "1000 in 10 h is 2400 in 24 h")
	early := time.Date(2026, 3, 11, 0, 1, 0, 0, time.UTC)
	l.Spend(Charge{Org: "org-a", Tokens: 10}, "", early, early)
	st = l.Budgets("org-a", early)
	assert.Equal(t, int64(240), st[0].ProjectedTokens, "the rate is measured over at least an hour")
}

func TestBudgetValidate(t *testing.T) {
	ok := Budget{Org: "org-a", Scope: ScopeAgent, ScopeID: "a", Period: PeriodDay, Tokens: 1}
	require.NoError(t, ok.Validate())
	org := Budget{Org: "org-a", Scope: ScopeOrg, Period: PeriodMonth, CostMicros: 5}
	org.Normalize()
	assert.Equal(t, "org-a", org.ScopeID)
	assert.Equal(t, BudgetID("org-a", ScopeOrg, "org-a", PeriodMonth), org.ID)
	assert.NotEqual(t, BudgetID("org-a", ScopeOrg, "org-a", PeriodMonth), BudgetID("org-a", ScopeOrg, "org-a", PeriodDay))
	assert.NotEqual(t, BudgetID("ab", ScopeAgent, "c", PeriodDay), BudgetID("a", ScopeAgent, "bc", PeriodDay), "ids are length-prefixed")
	for name, tc := range map[string]struct {
		b    Budget
		want string
	}{
		"no org":        {Budget{Scope: ScopeAgent, ScopeID: "a", Period: PeriodDay, Tokens: 1}, "org: missing"},
		"bad scope":     {Budget{Org: "o", Scope: "team", ScopeID: "a", Period: PeriodDay, Tokens: 1}, `scope: "team"`},
		"no scope id":   {Budget{Org: "o", Scope: ScopeRoom, Period: PeriodDay, Tokens: 1}, "scope_id: missing"},
		"foreign org":   {Budget{Org: "o", Scope: ScopeOrg, ScopeID: "other", Period: PeriodDay, Tokens: 1}, "counts its own organization"},
		"bad period":    {Budget{Org: "o", Scope: ScopeAgent, ScopeID: "a", Period: "week", Tokens: 1}, `period: "week"`},
		"no limit":      {Budget{Org: "o", Scope: ScopeAgent, ScopeID: "a", Period: PeriodDay}, "set at least one limit"},
		"negative":      {Budget{Org: "o", Scope: ScopeAgent, ScopeID: "a", Period: PeriodDay, Tokens: -1}, "tokens: -1 is outside"},
		"huge":          {Budget{Org: "o", Scope: ScopeAgent, ScopeID: "a", Period: PeriodDay, CostMicros: math.MaxInt64}, "cost_micros:"},
		"long id":       {Budget{Org: "o", Scope: ScopeAgent, ScopeID: strings.Repeat("x", 300), Period: PeriodDay, Tokens: 1}, "scope_id: 300 bytes"},
		"control char":  {Budget{Org: "o", Scope: ScopeAgent, ScopeID: "a\nb", Period: PeriodDay, Tokens: 1}, "scope_id: control character at byte 1"},
		"invalid UTF-8": {Budget{Org: "o\xff", Scope: ScopeAgent, ScopeID: "a", Period: PeriodDay, Tokens: 1}, "org: not valid UTF-8"},
	} {
		err := tc.b.Validate()
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), tc.want, name)
		}
	}
}

func TestLedgerBoundsReservationsPerAgent(t *testing.T) {
	l := NewLedger(time.Minute)
	ch := Charge{Org: "org-a", Agent: "a", Tokens: 1}
	def := DefaultLimits{AgentTokens: math.MaxInt64 / 2}
	for i := range MaxReservationsPerAgent {
		_, deny := l.Reserve(fmt.Sprint("d", i), ch, "", def, day0)
		require.Nil(t, deny)
	}
	_, deny := l.Reserve("one-more", ch, "", def, day0)
	require.NotNil(t, deny)
	assert.Contains(t, deny.Message, "holds 1000 unsettled reservations")
	_, deny = l.Reserve("other", Charge{Org: "org-a", Agent: "b", Tokens: 1}, "", def, day0)
	assert.Nil(t, deny, "per agent")
	l.Spend(ch, "", day0, day0) // settles one
	_, deny = l.Reserve("again", ch, "", def, day0)
	assert.Nil(t, deny)
	assert.Equal(t, MaxReservationsPerAgent+1, l.Reservations())
	l.Expire(day0.Add(time.Minute))
	assert.Zero(t, l.Reservations())
}
