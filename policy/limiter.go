package policy

import (
	"context"
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

// Replay takes one past event that Allow allowed at time at, with the same GCRA
// arithmetic (TAT = max(TAT, at) + T) but without asking: it was allowed. Replaying a
// key's allowed events in time order from an empty limiter leaves the state taking
// them live left, so every later Allow gives the same answer. The replayed span must
// start at a moment the key was idle (its TAT behind the event): a key saturated since
// before the span carries a burst the events of the span do not show (see Restore).
func (l *Limiter) Replay(key string, ratePerWindow int, window time.Duration, at time.Time) {
	if ratePerWindow <= 0 || window <= 0 {
		return
	}
	interval := int64(window) / int64(ratePerWindow)
	if interval <= 0 {
		return
	}
	tat := l.cell(key)
	n := at.UnixNano()
	for {
		old := tat.Load()
		if tat.CompareAndSwap(old, max(old, n)+interval) {
			return
		}
	}
}

// Restore raises key's theoretical arrival time to tat, one an allowed event recorded
// right after it was taken (TAT reports it): the state that event left, whatever came
// before it. A TAT already later stays.
func (l *Limiter) Restore(key string, tat time.Time) {
	if tat.IsZero() {
		return
	}
	c := l.cell(key)
	n := tat.UnixNano()
	for {
		old := c.Load()
		if old >= n || c.CompareAndSwap(old, n) {
			return
		}
	}
}

// TAT is key's theoretical arrival time: Allow lets one more event through while it is
// less than a window (minus one interval) ahead of now. ok is false for a key the
// limiter does not hold (never taken, or swept: idle).
func (l *Limiter) TAT(key string) (tat time.Time, ok bool) {
	v, ok := l.tats.Load(key)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, v.(*atomic.Int64).Load()), true
}

// Undo gives back one event taken by Allow: the decision it counted for was not
// granted after all (its audit event could not be written).
func (l *Limiter) Undo(key string, ratePerWindow int, window time.Duration) {
	l.undo(key, ratePerWindow, window)
}

// AgentRateKey and RoomRateKey are the limiter keys of send_message's two rates: per
// agent, and per agent in one room. Engine.enforce takes the same keys
// (TestRateKeysAreTheEnginesOwn holds the two together).
func AgentRateKey(agent string) string { return "a\x00" + agent }

// RoomRateKey: see AgentRateKey.
func RoomRateKey(agent, room string) string { return "r\x00" + agent + "\x00" + room }

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
