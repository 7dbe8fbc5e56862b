package ingest

import "time"

// expiring is a set of keys, each of which expires horizon after it was last marked:
// the consumer's memory of parties and agents, bounded under churn. Not safe for
// concurrent use.
type expiring struct {
	horizon   time.Duration
	m         map[string]time.Time
	lastSweep time.Time
}

func newExpiring(horizon time.Duration) *expiring {
	return &expiring{horizon: horizon, m: map[string]time.Time{}}
}

// mark adds k, or moves its expiry later, as seen at time at.
func (e *expiring) mark(k string, at time.Time) {
	if cur, ok := e.m[k]; !ok || at.After(cur) {
		e.m[k] = at
	}
}

// has says whether k was marked within the horizon before now.
func (e *expiring) has(k string, now time.Time) bool {
	at, ok := e.m[k]
	return ok && now.Sub(at) < e.horizon
}

func (e *expiring) remove(k string) { delete(e.m, k) }

func (e *expiring) len() int { return len(e.m) }

// sweep deletes the expired keys, at most once every horizon/8 (ok says it ran, n how
// many it deleted): the set then never holds more than the keys marked in the last
// 9/8 of the horizon, and a sweep's cost, one pass over the set, is spread thin.
func (e *expiring) sweep(now time.Time) (n int, ok bool) {
	if now.Sub(e.lastSweep) < e.horizon/8 {
		return 0, false
	}
	e.lastSweep = now
	for k, at := range e.m {
		if now.Sub(at) >= e.horizon {
			delete(e.m, k)
			n++
		}
	}
	return n, true
}
