package policy

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Limiter is a GCRA (generic cell rate algorithm) rate limiter per key. Each key holds
// one theoretical arrival time (TAT) in an atomic int64; an existing key is checked
// and updated with a compare-and-swap loop, without a mutex. Safe for concurrent use.
type Limiter struct {
	tats sync.Map // key -> *atomic.Int64 (TAT, ns since the Unix epoch)
}

// NewLimiter returns an empty limiter.
func NewLimiter() *Limiter { return &Limiter{} }

// Allow reports whether one more event for key fits in ratePerWindow events per
// window (bursts up to ratePerWindow), and if not, how long until it would. A
// ratePerWindow or window of 0 or less means unlimited.
func (l *Limiter) Allow(key string, ratePerWindow int, window time.Duration, now time.Time) (ok bool, retryAfter time.Duration) {
	if ratePerWindow <= 0 || window <= 0 {
		return true, 0
	}
	interval := int64(window) / int64(ratePerWindow) // emission interval T
	if interval <= 0 {
		return true, 0
	}
	tat := l.cell(key)
	n := now.UnixNano()
	for {
		old := tat.Load()
		base := max(old, n)
		next := base + interval
		// Allowed while the new TAT is at most one window ahead of now
		// (burst tolerance = window - T).
		if allowAt := next - int64(window); allowAt > n {
			return false, time.Duration(allowAt - n)
		}
		if tat.CompareAndSwap(old, next) {
			return true, 0
		}
	}
}

// undo gives back one event taken by Allow (used when a second limit refuses).
func (l *Limiter) undo(key string, ratePerWindow int, window time.Duration) {
	if ratePerWindow <= 0 || window <= 0 {
		return
	}
	interval := int64(window) / int64(ratePerWindow)
	v, ok := l.tats.Load(key)
	if !ok {
		return
	}
	v.(*atomic.Int64).Add(-interval)
}

func (l *Limiter) cell(key string) *atomic.Int64 {
	if v, ok := l.tats.Load(key); ok {
		return v.(*atomic.Int64)
	}
	v, _ := l.tats.LoadOrStore(key, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// Sweep drops keys whose TAT has passed: they behave exactly like new keys. Call it
// now and then to bound memory.
func (l *Limiter) Sweep(now time.Time) (removed int) {
	n := now.UnixNano()
	l.tats.Range(func(k, v any) bool {
		if v.(*atomic.Int64).Load() <= n {
			l.tats.CompareAndDelete(k, v)
			removed++
		}
		return true
	})
	return removed
}

// Run sweeps the limiter every interval until ctx ends, so that its memory follows the
// agents and rooms active in the last window, not every one ever seen.
func (l *Limiter) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.Sweep(now)
		}
	}
}

// Len is the number of keys the limiter holds.
func (l *Limiter) Len() (n int) {
	l.tats.Range(func(_, _ any) bool { n++; return true })
	return n
}

// Scope is what a spend budget counts against.
type Scope uint8

const (
	ScopeAgent Scope = iota
	ScopeOwner
	ScopeOrg
)

func (s Scope) String() string {
	switch s {
	case ScopeAgent:
		return "agent"
	case ScopeOwner:
		return "owner"
	case ScopeOrg:
		return "org"
	}
	return "unknown"
}

// SpendTracker counts tokens and cost (micro-units of the billing currency) per agent,
// owner and organization for the current UTC day. Spend of an earlier day is ignored;
// the first spend of a later day starts a new day. Safe for concurrent use; counters
// are atomics.
type SpendTracker struct {
	day atomic.Pointer[spendDay]
}

type spendDay struct {
	day      int64 // days since the Unix epoch (UTC)
	counters sync.Map
}

type spendKey struct {
	scope Scope
	id    string
}

type spend struct{ tokens, cost atomic.Int64 }

// NewSpendTracker returns an empty tracker.
func NewSpendTracker() *SpendTracker { return &SpendTracker{} }

func utcDay(t time.Time) int64 {
	s := t.Unix()
	d := s / 86400
	if s < 0 && s%86400 != 0 {
		d--
	}
	return d
}

// today returns the counters of at's day, or nil when at is before the current day.
func (s *SpendTracker) today(at time.Time) *spendDay {
	day := utcDay(at)
	for {
		cur := s.day.Load()
		if cur != nil && cur.day == day {
			return cur
		}
		if cur != nil && cur.day > day {
			return nil
		}
		// A new day: start fresh counters (a loser of the race retries and sees them).
		s.day.CompareAndSwap(cur, &spendDay{day: day})
	}
}

func (d *spendDay) counter(k spendKey) *spend {
	if v, ok := d.counters.Load(k); ok {
		return v.(*spend)
	}
	v, _ := d.counters.LoadOrStore(k, new(spend))
	return v.(*spend)
}

// Add counts spend reported at time at for the agent, its owner and its organization.
// Empty ids are skipped.
func (s *SpendTracker) Add(agent, owner, org string, tokens, costMicros int64, at time.Time) {
	d := s.today(at)
	if d == nil {
		return
	}
	for _, k := range [...]spendKey{{ScopeAgent, agent}, {ScopeOwner, owner}, {ScopeOrg, org}} {
		if k.id == "" {
			continue
		}
		c := d.counter(k)
		saturatingAdd(&c.tokens, tokens)
		saturatingAdd(&c.cost, costMicros)
	}
}

// saturatingAdd adds a non-negative n to v, stopping at math.MaxInt64: a total that
// wrapped negative would read as "nothing spent" and lift every budget for the day.
// Negative n is ignored (spend never shrinks).
func saturatingAdd(v *atomic.Int64, n int64) {
	if n <= 0 {
		return
	}
	for {
		old := v.Load()
		next := old + n
		if next < old {
			next = math.MaxInt64
		}
		if v.CompareAndSwap(old, next) {
			return
		}
	}
}

// Set replaces the spend of one agent, owner or organization for at's day; used to
// bootstrap from ClickHouse's totals of the day.
func (s *SpendTracker) Set(scope Scope, id string, tokens, costMicros int64, at time.Time) {
	d := s.today(at)
	if d == nil || id == "" {
		return
	}
	c := d.counter(spendKey{scope, id})
	c.tokens.Store(tokens)
	c.cost.Store(costMicros)
}

// Spent returns the spend of one agent, owner or organization on now's UTC day.
func (s *SpendTracker) Spent(scope Scope, id string, now time.Time) (tokens, costMicros int64) {
	d := s.day.Load()
	if d == nil || d.day != utcDay(now) {
		return 0, 0
	}
	v, ok := d.counters.Load(spendKey{scope, id})
	if !ok {
		return 0, 0
	}
	c := v.(*spend)
	return c.tokens.Load(), c.cost.Load()
}

// untilNextDay is the time from now to the next UTC midnight.
func untilNextDay(now time.Time) time.Duration {
	return time.Unix((utcDay(now)+1)*86400, 0).Sub(now)
}
