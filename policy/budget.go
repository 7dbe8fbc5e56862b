package policy

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/shopspring/decimal"
)

// BudgetScope is what a budget counts: the spend of one organization, one owner, one
// agent or one room, always within one organization, or everything one initiator set
// going, across agents, owners and organizations.
type BudgetScope string

const (
	ScopeOrg   BudgetScope = "org"
	ScopeOwner BudgetScope = "owner"
	ScopeAgent BudgetScope = "agent"
	ScopeRoom  BudgetScope = "room"
	// ScopeInitiator counts the usage of every execution a person (an agent acting on
	// its own, a system outside chat) set going through a chain of mentions, whichever
	// agent, owner or organization ran it. The budget belongs to the initiator's
	// organization (a system initiator's: the organization whose agents it sets going).
	ScopeInitiator BudgetScope = "initiator"
)

// BudgetScopes lists the scopes in the order a decision checks them.
var BudgetScopes = []BudgetScope{ScopeOrg, ScopeOwner, ScopeAgent, ScopeRoom, ScopeInitiator}

// Period is the stretch of time a budget's spend is counted over: a UTC day or a UTC
// calendar month.
type Period string

const (
	PeriodDay   Period = "day"
	PeriodMonth Period = "month"
)

// Periods lists the periods.
var Periods = []Period{PeriodDay, PeriodMonth}

// PeriodStart is the start of the period that holds t (UTC).
func PeriodStart(p Period, t time.Time) time.Time {
	t = t.UTC()
	if p == PeriodMonth {
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// PeriodEnd is the start of the period after the one that holds t.
func PeriodEnd(p Period, t time.Time) time.Time {
	s := PeriodStart(p, t)
	if p == PeriodMonth {
		return s.AddDate(0, 1, 0)
	}
	return s.AddDate(0, 0, 1)
}

// Budget limits the spend of one scope over one period. A decision that would pass a
// hard budget (spend plus reservations plus its estimate) is denied; a soft budget only
// alerts (budget.crossed at 80 % and 100 %).
type Budget struct {
	ID      string      `json:"id"`
	Org     string      `json:"org"`
	Scope   BudgetScope `json:"scope"`
	ScopeID string      `json:"scope_id"`
	Period  Period      `json:"period"`
	// Tokens and CostMicros (micro-units of the billing currency) are the limits; 0 is
	// no limit on that measure. At least one is set.
	Tokens     int64 `json:"tokens,omitempty"`
	CostMicros int64 `json:"cost_micros,omitempty"`
	Hard       bool  `json:"hard"`
	// UpdatedAt orders the changes of one budget: an older change never replaces a newer.
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// BudgetID is the id of the budget of scope id within org over period: one budget per
// (organization, scope, id, period), so setting it again replaces it.
func BudgetID(org string, scope BudgetScope, id string, period Period) string {
	h := sha256.New()
	for _, s := range []string{org, string(scope), id, string(period)} {
		_, _ = fmt.Fprintf(h, "%d:%s", len(s), s) // a hash never fails a write
	}
	return "bud_" + hex.EncodeToString(h.Sum(nil))[:20]
}

// MaxBudget is the largest token or cost-micros limit a budget may have: 10^15
// (a billion currency units of cost), far above any spend, far below int64 overflow.
const MaxBudget = 1_000_000_000_000_000

// MaxBudgetIDBytes bounds the ids a budget names (as event ids).
const MaxBudgetIDBytes = 256

// Validate reports every problem of b, each naming its field.
func (b *Budget) Validate() error {
	var errs []error
	if b.Org == "" {
		errs = append(errs, errors.New("org: missing"))
	}
	if !slices.Contains(BudgetScopes, b.Scope) {
		errs = append(errs, fmt.Errorf("scope: %q is not one of org, owner, agent, room, initiator", b.Scope))
	}
	if b.Scope == ScopeOrg && b.ScopeID != "" && b.ScopeID != b.Org {
		errs = append(errs, fmt.Errorf("scope_id: an org budget counts its own organization %q, not %q", b.Org, b.ScopeID))
	}
	if b.Scope != ScopeOrg && b.ScopeID == "" {
		errs = append(errs, fmt.Errorf("scope_id: missing (the %s the budget counts)", b.Scope))
	}
	for _, f := range [][2]string{{"org", b.Org}, {"scope_id", b.ScopeID}} {
		if err := checkBudgetID(f[1]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f[0], err))
		}
	}
	if !slices.Contains(Periods, b.Period) {
		errs = append(errs, fmt.Errorf("period: %q is not day or month", b.Period))
	}
	if b.Tokens == 0 && b.CostMicros == 0 {
		errs = append(errs, errors.New("tokens, cost_micros: set at least one limit"))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"tokens", b.Tokens}, {"cost_micros", b.CostMicros}} {
		if f.v < 0 || f.v > MaxBudget {
			errs = append(errs, fmt.Errorf("%s: %d is outside 0..%d", f.name, f.v, int64(MaxBudget)))
		}
	}
	return errors.Join(errs...)
}

// ParseCostMicros reads a cost limit written as a decimal amount of the billing
// currency (at most 6 decimals, at most MaxBudget micro-units) into micro-units.
func ParseCostMicros(s string) (int64, error) {
	if len(s) > 32 {
		return 0, fmt.Errorf("%d characters long, more than 32", len(s))
	}
	d, err := decimal.NewFromString(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	if d.IsNegative() {
		return 0, fmt.Errorf("%q is negative", s)
	}
	if !d.Equal(d.Truncate(6)) {
		return 0, fmt.Errorf("%q has more than 6 decimals", s)
	}
	if m := d.Shift(6); m.GreaterThan(decimal.NewFromInt(MaxBudget)) {
		return 0, fmt.Errorf("%q is above the largest budget, %s", s, decimal.New(MaxBudget, -6).String())
	}
	return d.Shift(6).IntPart(), nil
}

func checkBudgetID(v string) error {
	if len(v) > MaxBudgetIDBytes {
		return fmt.Errorf("%d bytes long, more than %d", len(v), MaxBudgetIDBytes)
	}
	if !utf8.ValidString(v) {
		return errors.New("not valid UTF-8")
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] == 0x7f {
			return fmt.Errorf("control character at byte %d", i)
		}
	}
	return nil
}

// Normalize fills what Validate lets a caller leave out: an org budget's scope id is its
// organization, and the id follows from the rest.
func (b *Budget) Normalize() {
	if b.Scope == ScopeOrg && b.ScopeID == "" {
		b.ScopeID = b.Org
	}
	b.ID = BudgetID(b.Org, b.Scope, b.ScopeID, b.Period)
}

// Charge names what a spend or an estimate counts against: the organization, owner,
// agent and room (empty ones are skipped), the initiator of the chain the execution
// belongs to with the organization its budgets belong to (Directory.InitiatorOrg; both
// or neither), and the amounts.
type Charge struct {
	Org, Owner, Agent, Room string
	Initiator, InitiatorOrg string
	Tokens, CostMicros      int64
}

func (c *Charge) scopes() [5]scopeKey {
	initiator := scopeKey{c.InitiatorOrg, ScopeInitiator, c.Initiator}
	if c.InitiatorOrg == "" {
		initiator.id = ""
	}
	return [5]scopeKey{
		{c.Org, ScopeOrg, c.Org},
		{c.Org, ScopeOwner, c.Owner},
		{c.Org, ScopeAgent, c.Agent},
		{c.Org, ScopeRoom, c.Room},
		initiator,
	}
}

// Crossing is spend (actual plus reserved) of a budget reaching 80 % or 100 % of one of
// its limits in the current period. Each threshold is reported once per period (and
// again when the budget's limits change).
type Crossing struct {
	Budget         Budget    `json:"budget"`
	Threshold      int       `json:"threshold"` // 80 | 100
	PeriodStart    time.Time `json:"period_start"`
	SpentTokens    int64     `json:"spent_tokens"`
	SpentCost      int64     `json:"spent_cost_micros"`
	ReservedTokens int64     `json:"reserved_tokens"`
	ReservedCost   int64     `json:"reserved_cost_micros"`
	At             time.Time `json:"at"`
}

// BudgetStatus is a budget with its spend in the current period.
type BudgetStatus struct {
	Budget
	PeriodStart, PeriodEnd       time.Time
	SpentTokens, SpentCost       int64
	ReservedTokens, ReservedCost int64
	// ProjectedTokens and ProjectedCost are the spend at the end of the period if it goes
	// on at the rate of the period so far (measured over at least one hour).
	ProjectedTokens, ProjectedCost int64
}

// MaxBudgetsPerOrg bounds the budgets of one organization (every policy process holds
// them all, and the budgets query lists them).
const MaxBudgetsPerOrg = 1000

// MaxReservationsPerAgent bounds the unsettled reservations of one agent: beyond it a
// reserving decision is denied until usage reports or expiry release some, so a
// runaway caller cannot grow the ledger without bound.
const MaxReservationsPerAgent = 1000

// DefaultReservationTTL is how long an estimate stays reserved when no usage report of
// its execution settles it.
const DefaultReservationTTL = 10 * time.Minute

// Ledger keeps the spend and the reservations of every organization, owner, agent and
// room for the current UTC day and month, and the budgets set on them. Safe for
// concurrent use.
//
// One counter per (organization, scope, id, period) holds spent and reserved amounts
// under its own mutex. A decision locks the counters of its scopes in one fixed order
// (their creation sequence), checks every hard limit against spent + reserved + its
// estimate and reserves the estimate on all of them before unlocking: N decisions
// racing for the last room of a budget cannot all pass, whatever their number. Usage
// adds to spent before it releases the reservation it settles, so a check in between
// sees too much, never too little.
type Ledger struct {
	ttl time.Duration

	seq      atomic.Uint64
	counters sync.Map // counterKey -> *counter

	mu      sync.RWMutex
	budgets map[string]*budgetEntry // id ->
	index   map[scopeKey][]*budgetEntry

	resMu        sync.Mutex
	reservations map[string]*reservation // id ->
	byExecution  map[string]*reservation // agent \x00 execution ->
	byAgent      map[string][]*reservation
	perAgent     map[string]int

	crossings chan Crossing
	quiet     atomic.Bool
	dropped   atomic.Uint64

	rooms      atomic.Int64         // room counters held
	initiators atomic.Int64         // initiator counters held
	untracked  atomic.Uint64        // room and initiator spend not counted past their caps
	deleted    map[string]time.Time // budget id -> deleted at (an hour), guarded by mu
}

// MaxRoomCounters bounds the rooms whose spend is counted without a budget on them
// (each room costs a day and a month counter; room ids come from clients).
const MaxRoomCounters = 200_000

// MaxInitiatorCounters bounds the initiators whose spend is counted without a budget on
// them: initiators are people and agents, but also systems, whose ids come from the
// routing core's chains and the platform's events.
const MaxInitiatorCounters = 200_000

type scopeKey struct {
	org   string
	scope BudgetScope
	id    string
}

type counterKey struct {
	scopeKey
	period Period
}

type counter struct {
	seq    uint64
	period Period

	mu                         sync.Mutex
	dead                       bool  // swept: a holder of the pointer looks it up again
	start                      int64 // current period start, Unix seconds
	spentT, spentC, resT, resC int64
	budgets                    []*budgetEntry
}

type budgetEntry struct {
	b     Budget
	c     *counter
	level int // guarded by c.mu: 0, 80 or 100 in c.start's period
}

// reservation is one decision's estimate, reserved on the counters of its scopes.
type reservation struct {
	id, agent, execution string
	// initiator is the chain's initiator the decision named (its organization and id),
	// which the usage report that settles the reservation is charged to as well.
	initiatorOrg, initiator string
	tokens, cost            int64
	expires                 time.Time
	counters                []*counter
	starts                  []int64
}

// NewLedger returns an empty ledger; ttl <= 0 means DefaultReservationTTL.
func NewLedger(ttl time.Duration) *Ledger {
	if ttl <= 0 {
		ttl = DefaultReservationTTL
	}
	return &Ledger{ttl: ttl, budgets: map[string]*budgetEntry{}, index: map[scopeKey][]*budgetEntry{},
		reservations: map[string]*reservation{}, byExecution: map[string]*reservation{}, byAgent: map[string][]*reservation{},
		perAgent: map[string]int{}, deleted: map[string]time.Time{},
		crossings: make(chan Crossing, 1024)}
}

// TTL is how long an unsettled reservation lasts.
func (l *Ledger) TTL() time.Duration { return l.ttl }

// Crossings delivers budget crossings. When nobody reads fast enough, crossings beyond
// a buffer of 1024 are dropped and counted (Dropped): a decision never waits for them.
func (l *Ledger) Crossings() <-chan Crossing { return l.crossings }

// Dropped is the number of crossings dropped because the channel was full.
func (l *Ledger) Dropped() uint64 { return l.dropped.Load() }

// Quiet switches crossing reports off (while bootstrapping: the crossings of restored
// spend were reported when they happened) or back on.
func (l *Ledger) Quiet(on bool) { l.quiet.Store(on) }

func (l *Ledger) counter(k counterKey) *counter {
	if v, ok := l.counters.Load(k); ok {
		return v.(*counter)
	}
	if k.scope == ScopeRoom && l.rooms.Load() >= MaxRoomCounters ||
		k.scope == ScopeInitiator && l.initiators.Load() >= MaxInitiatorCounters {
		// Room and system initiator ids are the clients': past the cap, new ones are
		// not counted (one with a budget always is: Set creates its counter).
		l.untracked.Add(1)
		return nil
	}
	return l.mustCounter(k)
}

// mustCounter is counter without the cap (for a budget's own counter).
func (l *Ledger) mustCounter(k counterKey) *counter {
	if v, ok := l.counters.Load(k); ok {
		return v.(*counter)
	}
	v, loaded := l.counters.LoadOrStore(k, &counter{seq: l.seq.Add(1), period: k.period})
	if !loaded {
		l.held(k.scope, 1)
	}
	return v.(*counter)
}

// held counts the capped scopes' counters as they come and go.
func (l *Ledger) held(scope BudgetScope, n int64) {
	switch scope {
	case ScopeRoom:
		l.rooms.Add(n)
	case ScopeInitiator:
		l.initiators.Add(n)
	}
}

// Sweep forgets the counters of periods that are over, without a budget or a
// reservation: their spend can no longer count. It returns how many it removed.
func (l *Ledger) Sweep(now time.Time) (removed int) {
	l.mu.RLock() // not while a budget is being attached to a counter (Set)
	l.counters.Range(func(k, v any) bool {
		c := v.(*counter)
		c.mu.Lock()
		idle := c.start < PeriodStart(c.period, now).Unix() && len(c.budgets) == 0 && c.resT == 0 && c.resC == 0
		if idle {
			c.dead = true
		}
		c.mu.Unlock()
		if idle && l.counters.CompareAndDelete(k, v) {
			removed++
			l.held(k.(counterKey).scope, -1)
		}
		return true
	})
	l.mu.RUnlock()
	l.mu.Lock()
	for id, at := range l.deleted {
		if now.Sub(at) > time.Hour {
			delete(l.deleted, id)
		}
	}
	l.mu.Unlock()
	return removed
}

// Untracked is how often a room's or an initiator's spend was not counted because
// MaxRoomCounters rooms (MaxInitiatorCounters initiators) already were.
func (l *Ledger) Untracked() uint64 { return l.untracked.Load() }

// roll moves c to the period starting at start when that is later than c's; it reports
// whether start is c's period now (false: start is an earlier period, which is over).
// c.mu is held.
func (c *counter) roll(start int64) bool {
	if start > c.start {
		c.start, c.spentT, c.spentC, c.resT, c.resC = start, 0, 0, 0, 0
		for _, e := range c.budgets {
			e.level = 0
		}
	}
	return start == c.start
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Set adds or replaces a budget (b must be valid; see Validate and Normalize). A change
// older than the one in force is ignored (replays, two writers); it reports whether b
// is now in force.
func (l *Ledger) Set(b Budget, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	old, ok := l.budgets[b.ID]
	if ok && old.b.UpdatedAt.After(b.UpdatedAt) {
		return false
	}
	if at, gone := l.deleted[b.ID]; gone && !b.UpdatedAt.After(at) {
		return false // a replay of a change the deletion came after
	}
	delete(l.deleted, b.ID)
	sk := scopeKey{b.Org, b.Scope, b.ScopeID}
	c := l.mustCounter(counterKey{sk, b.Period})
	for { // a counter swept meanwhile is replaced by a fresh one
		c.mu.Lock()
		dead := c.dead
		c.mu.Unlock()
		if !dead {
			break
		}
		c = l.mustCounter(counterKey{sk, b.Period})
	}
	e := &budgetEntry{b: b, c: c}
	level := 0
	if ok {
		c.mu.Lock()
		if old.b.Tokens == b.Tokens && old.b.CostMicros == b.CostMicros {
			level = old.level // the same limits again (a replica re-applying it): no new crossing
		}
		c.mu.Unlock()
		l.detach(old)
	}
	l.budgets[b.ID] = e
	l.index[sk] = append(l.index[sk], e)
	c.mu.Lock()
	c.roll(PeriodStart(b.Period, now).Unix())
	e.level = level
	c.budgets = append(c.budgets, e)
	l.check(c, now)
	c.mu.Unlock()
	return true
}

// Delete removes a budget; a deletion older than the budget's last change is ignored.
func (l *Ledger) Delete(id string, at time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.budgets[id]
	if !ok || e.b.UpdatedAt.After(at) {
		return false
	}
	l.detach(e)
	delete(l.budgets, id)
	l.deleted[id] = at
	return true
}

// detach unlinks e from the index and its counter; l.mu is held.
func (l *Ledger) detach(e *budgetEntry) {
	sk := scopeKey{e.b.Org, e.b.Scope, e.b.ScopeID}
	l.index[sk] = slices.DeleteFunc(l.index[sk], func(x *budgetEntry) bool { return x == e })
	if len(l.index[sk]) == 0 {
		delete(l.index, sk)
	}
	e.c.mu.Lock()
	e.c.budgets = slices.DeleteFunc(e.c.budgets, func(x *budgetEntry) bool { return x == e })
	e.c.mu.Unlock()
}

// Count is the number of budgets of org.
func (l *Ledger) Count(org string) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := 0
	for _, e := range l.budgets {
		if e.b.Org == org {
			n++
		}
	}
	return n
}

// Budget returns the budget with id.
func (l *Ledger) Budget(id string) (Budget, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	e, ok := l.budgets[id]
	if !ok {
		return Budget{}, false
	}
	return e.b, true
}

// Budgets returns the budgets of org with their spend in the period holding now,
// ordered by scope, scope id and period.
func (l *Ledger) Budgets(org string, now time.Time) []BudgetStatus {
	l.mu.RLock()
	var entries []*budgetEntry
	for _, e := range l.budgets {
		if e.b.Org == org {
			entries = append(entries, e)
		}
	}
	l.mu.RUnlock()
	out := make([]BudgetStatus, 0, len(entries))
	for _, e := range entries {
		s := BudgetStatus{Budget: e.b, PeriodStart: PeriodStart(e.b.Period, now), PeriodEnd: PeriodEnd(e.b.Period, now)}
		e.c.mu.Lock()
		if e.c.start == s.PeriodStart.Unix() {
			s.SpentTokens, s.SpentCost, s.ReservedTokens, s.ReservedCost = e.c.spentT, e.c.spentC, e.c.resT, e.c.resC
		}
		e.c.mu.Unlock()
		elapsed := max(now.Sub(s.PeriodStart), time.Hour)
		whole := s.PeriodEnd.Sub(s.PeriodStart)
		project := func(spent int64) int64 {
			p := float64(spent) * float64(whole) / float64(elapsed)
			if p > math.MaxInt64/2 {
				return math.MaxInt64 / 2
			}
			return max(spent, int64(p))
		}
		s.ProjectedTokens, s.ProjectedCost = project(s.SpentTokens), project(s.SpentCost)
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b BudgetStatus) int {
		for _, c := range [][2]string{{string(a.Scope), string(b.Scope)}, {a.ScopeID, b.ScopeID}, {string(a.Period), string(b.Period)}} {
			if c[0] != c[1] {
				if c[0] < c[1] {
					return -1
				}
				return 1
			}
		}
		return 0
	})
	return out
}

// limit is one limit a decision is checked against.
type limit struct {
	c            *counter
	tokens, cost int64
	hard         bool
	what         string // for the deny message: "budget bud_… (agent a-1, day)" or "quota …"
}

// DefaultLimits are the limits of the policy data (data.json quotas) that apply where
// no budget of the same scope and period is set: per UTC day, hard.
type DefaultLimits struct {
	AgentTokens, OwnerTokens, OrgTokens int64
	AgentCost, OwnerCost, OrgCost       int64
}

// BudgetDenial says which limit refused an estimate.
type BudgetDenial struct {
	Message    string
	RetryAfter time.Duration
}

// Reservation is what a granted estimate holds until usage settles it or it expires.
type Reservation struct {
	ID      string
	Expires time.Time
}

// Reserve checks the charge's estimate against every hard limit of its scopes (the
// budgets set on the organization, owner, agent, room and initiator, for the day and
// the month, and the defaults where no day budget is set) and, when all pass, reserves
// it on every scope that has a limit, until a usage report of execution (or, without
// one, the agent's next usage report) settles it or the TTL passes. The reservation
// remembers the charge's initiator: the usage that settles it counts against the
// initiator's budgets too. A zero estimate reserves
// nothing; it is denied only by a limit already reached. id names the reservation
// (the decision id).
func (l *Ledger) Reserve(id string, ch Charge, execution string, def DefaultLimits, now time.Time) (*Reservation, *BudgetDenial) {
	for {
		r, deny, swept := l.reserve(id, ch, execution, def, now)
		if !swept {
			return r, deny
		}
	}
}

// reserve is Reserve once; swept says a counter it locked had just been swept (try
// again: the next lookup makes a fresh one).
func (l *Ledger) reserve(id string, ch Charge, execution string, def DefaultLimits, now time.Time) (*Reservation, *BudgetDenial, bool) {
	var lims [16]limit
	n := 0
	l.mu.RLock()
	for _, sk := range ch.scopes() {
		if sk.id == "" {
			continue
		}
		for _, e := range l.index[sk] {
			if n == len(lims) {
				break
			}
			lims[n] = limit{c: e.c, tokens: e.b.Tokens, cost: e.b.CostMicros, hard: e.b.Hard, what: e.b.ID}
			n++
		}
		if n == len(lims) {
			continue
		}
		var t, c int64
		switch sk.scope {
		case ScopeAgent:
			t, c = def.AgentTokens, def.AgentCost
		case ScopeOwner:
			t, c = def.OwnerTokens, def.OwnerCost
		case ScopeOrg:
			t, c = def.OrgTokens, def.OrgCost
		}
		if t > 0 || c > 0 {
			lims[n] = limit{c: l.mustCounter(counterKey{sk, PeriodDay}), tokens: t, cost: c, hard: true,
				what: "the daily quota of " + string(sk.scope) + " " + sk.id}
			n++
		}
	}
	l.mu.RUnlock()
	if n == 0 {
		return nil, nil, false
	}
	// The distinct counters, locked in creation order (no deadlock between decisions).
	var cs [16]*counter
	m := 0
	for _, lm := range lims[:n] {
		if !slices.Contains(cs[:m], lm.c) {
			cs[m] = lm.c
			m++
		}
	}
	slices.SortFunc(cs[:m], func(a, b *counter) int { return cmp.Compare(a.seq, b.seq) })
	swept := false
	for _, c := range cs[:m] {
		c.mu.Lock()
		swept = swept || c.dead
		c.roll(PeriodStart(c.period, now).Unix())
	}
	unlock := func() {
		for _, c := range cs[:m] {
			c.mu.Unlock()
		}
	}
	if swept {
		unlock()
		return nil, nil, true
	}
	for _, lm := range lims[:n] {
		if !lm.hard {
			continue
		}
		c := lm.c
		if over(satAdd(c.spentT, c.resT), ch.Tokens, lm.tokens) {
			unlock()
			return nil, l.denial(lm, "tokens", c.spentT, c.resT, lm.tokens, now), false
		}
		if over(satAdd(c.spentC, c.resC), ch.CostMicros, lm.cost) {
			unlock()
			return nil, l.denial(lm, "cost micros", c.spentC, c.resC, lm.cost, now), false
		}
	}
	if ch.Tokens <= 0 && ch.CostMicros <= 0 {
		unlock()
		return nil, nil, false
	}
	// Taken before reserving (given back if it is not kept), so that decisions of one
	// agent on disjoint counters cannot pass the cap together.
	l.resMu.Lock()
	held := l.perAgent[ch.Agent]
	if held < MaxReservationsPerAgent {
		l.perAgent[ch.Agent]++
	}
	l.resMu.Unlock()
	if held >= MaxReservationsPerAgent {
		unlock()
		return nil, &BudgetDenial{RetryAfter: time.Second, Message: fmt.Sprintf(
			"agent %s holds %d unsettled reservations, the most it may: wait for their usage reports (by execution_id) or their expiry", ch.Agent, held)}, false
	}
	r := &reservation{id: id, agent: ch.Agent, execution: execution, tokens: max(ch.Tokens, 0), cost: max(ch.CostMicros, 0),
		expires: now.Add(l.ttl), counters: make([]*counter, m), starts: make([]int64, m)}
	if ch.InitiatorOrg != "" && ch.Initiator != "" {
		r.initiatorOrg, r.initiator = ch.InitiatorOrg, ch.Initiator
	}
	for i, c := range cs[:m] {
		c.resT, c.resC = satAdd(c.resT, r.tokens), satAdd(c.resC, r.cost)
		r.counters[i], r.starts[i] = c, c.start
		l.check(c, now)
	}
	unlock()
	l.resMu.Lock()
	l.reservations[id] = r
	if execution != "" {
		if old := l.byExecution[ch.Agent+"\x00"+execution]; old != nil {
			// A second decision of one execution: the usage report settles both.
			l.byAgent[ch.Agent] = append(l.byAgent[ch.Agent], r)
		} else {
			l.byExecution[ch.Agent+"\x00"+execution] = r
		}
	} else {
		l.byAgent[ch.Agent] = append(l.byAgent[ch.Agent], r)
	}
	l.resMu.Unlock()
	return &Reservation{ID: id, Expires: r.expires}, nil, false
}

func (l *Ledger) denial(lm limit, measure string, spent, reserved, max int64, now time.Time) *BudgetDenial {
	return &BudgetDenial{
		Message: fmt.Sprintf("%s: %d spent and %d reserved of %d %s this %s",
			lm.what, spent, reserved, max, measure, lm.c.period),
		RetryAfter: PeriodEnd(lm.c.period, now).Sub(now),
	}
}

// Release gives back a reservation that will not be used (the decision it belongs to
// was turned into a deny after all). Releasing twice, or after settlement, does nothing.
func (l *Ledger) Release(id string, now time.Time) {
	l.resMu.Lock()
	r := l.take(l.reservations[id])
	l.resMu.Unlock()
	l.release(r, now)
}

// take unlinks r from every index; l.resMu is held. It returns r, or nil if r is nil.
func (l *Ledger) take(r *reservation) *reservation {
	if r == nil {
		return nil
	}
	delete(l.reservations, r.id)
	if l.perAgent[r.agent]--; l.perAgent[r.agent] <= 0 {
		delete(l.perAgent, r.agent)
	}
	if r.execution != "" && l.byExecution[r.agent+"\x00"+r.execution] == r {
		delete(l.byExecution, r.agent+"\x00"+r.execution)
	}
	if q := l.byAgent[r.agent]; len(q) > 0 {
		q = slices.DeleteFunc(q, func(x *reservation) bool { return x == r })
		if len(q) == 0 {
			delete(l.byAgent, r.agent)
		} else {
			l.byAgent[r.agent] = q
		}
	}
	return r
}

func (l *Ledger) release(r *reservation, now time.Time) {
	if r == nil {
		return
	}
	for i, c := range r.counters {
		c.mu.Lock()
		if c.start == r.starts[i] {
			c.resT, c.resC = max(0, c.resT-r.tokens), max(0, c.resC-r.cost)
			l.check(c, now)
		}
		c.mu.Unlock()
	}
}

// Spend counts usage reported at time at against the day and month of each of its
// scopes, then settles the reservation it answers: the one of its execution, or
// without one (or none reserved under it) the agent's oldest reservation without an
// execution. A charge that names no initiator counts against the initiator of the
// reservation it settles, if that named one. Usage of a period already over counts
// nowhere.
func (l *Ledger) Spend(ch Charge, execution string, at, now time.Time) {
	if at.After(now) {
		// Usage stamped ahead of this clock (a sender's clock, the collector's allowed
		// skew) counts now: it must never move a counter into a period not begun, which
		// would forget the current one's spend.
		at = now
	}
	// The reservations it settles are taken first and released only after the spend
	// is added: a check in between sees too much, never too little.
	settled := l.settle(ch.Agent, execution)
	if ch.InitiatorOrg == "" || ch.Initiator == "" {
		for _, r := range settled {
			if r.initiator != "" {
				ch.Initiator, ch.InitiatorOrg = r.initiator, r.initiatorOrg
				break
			}
		}
	}
	for _, sk := range ch.scopes() {
		if sk.id == "" {
			continue
		}
		for _, p := range Periods {
			for {
				c := l.counter(counterKey{sk, p})
				if c == nil {
					break
				}
				c.mu.Lock()
				if c.dead { // swept meanwhile: a fresh one
					c.mu.Unlock()
					continue
				}
				if c.roll(PeriodStart(p, at).Unix()) {
					c.spentT, c.spentC = satAdd(c.spentT, max(ch.Tokens, 0)), satAdd(c.spentC, max(ch.CostMicros, 0))
					l.check(c, now)
				}
				c.mu.Unlock()
				break
			}
		}
	}
	for _, r := range settled {
		l.release(r, now)
	}
}

// settle unlinks the reservations a usage report of agent and execution settles (see
// Spend) and returns them, not released yet.
func (l *Ledger) settle(agent, execution string) []*reservation {
	if agent == "" {
		return nil
	}
	var settled []*reservation
	l.resMu.Lock()
	defer l.resMu.Unlock()
	if execution != "" {
		if r := l.byExecution[agent+"\x00"+execution]; r != nil {
			settled = append(settled, l.take(r))
			for _, o := range slices.Clone(l.byAgent[agent]) {
				if o.execution == execution {
					settled = append(settled, l.take(o))
				}
			}
		}
	}
	if len(settled) == 0 && execution == "" {
		for _, o := range l.byAgent[agent] {
			if o.execution == "" {
				settled = append(settled, l.take(o))
				break
			}
		}
	}
	return settled
}

// HardBudget returns a hard budget of the scope, if one is set (for either period).
func (l *Ledger) HardBudget(org string, scope BudgetScope, id string) (Budget, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, e := range l.index[scopeKey{org, scope, id}] {
		if e.b.Hard {
			return e.b, true
		}
	}
	return Budget{}, false
}

// Expire releases the reservations whose time has passed; it returns how many.
func (l *Ledger) Expire(now time.Time) int {
	var gone []*reservation
	l.resMu.Lock()
	for _, r := range l.reservations {
		if !r.expires.After(now) {
			gone = append(gone, r)
		}
	}
	for _, r := range gone {
		l.take(r)
	}
	l.resMu.Unlock()
	for _, r := range gone {
		l.release(r, now)
	}
	return len(gone)
}

// Reservations is the number of reservations held.
func (l *Ledger) Reservations() int {
	l.resMu.Lock()
	defer l.resMu.Unlock()
	return len(l.reservations)
}

// Spent returns the spend and reservations of one scope in the period holding now.
func (l *Ledger) Spent(org string, scope BudgetScope, id string, p Period, now time.Time) (spentTokens, spentCost, resTokens, resCost int64) {
	v, ok := l.counters.Load(counterKey{scopeKey{org, scope, id}, p})
	if !ok {
		return 0, 0, 0, 0
	}
	c := v.(*counter)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.start != PeriodStart(p, now).Unix() {
		return 0, 0, 0, 0
	}
	return c.spentT, c.spentC, c.resT, c.resC
}

// check reports the crossings of c's budgets; c.mu is held.
func (l *Ledger) check(c *counter, now time.Time) {
	for _, e := range c.budgets {
		level := 0
		for _, f := range [][2]int64{{satAdd(c.spentT, c.resT), e.b.Tokens}, {satAdd(c.spentC, c.resC), e.b.CostMicros}} {
			used, lim := f[0], f[1]
			switch {
			case lim <= 0:
			case used >= lim:
				level = 100
			case used >= lim-lim/5 && level < 80: // 80 %, without overflow
				level = 80
			}
		}
		if level <= e.level {
			continue // each threshold is reported once per period (roll resets the levels)
		}
		for _, t := range []int{80, 100} {
			if e.level < t && level >= t {
				l.report(Crossing{Budget: e.b, Threshold: t, PeriodStart: time.Unix(c.start, 0).UTC(),
					SpentTokens: c.spentT, SpentCost: c.spentC, ReservedTokens: c.resT, ReservedCost: c.resC, At: now.UTC()})
			}
		}
		e.level = level
	}
}

func (l *Ledger) report(x Crossing) {
	if l.quiet.Load() {
		return
	}
	select {
	case l.crossings <- x:
	default:
		l.dropped.Add(1)
	}
}

// Run expires reservations every interval until ctx ends.
func (l *Ledger) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var swept time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.Expire(now)
			if now.Sub(swept) >= time.Minute {
				l.Sweep(now)
				swept = now
			}
		}
	}
}
