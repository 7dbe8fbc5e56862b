package share

import (
	"sync"
	"time"
)

// Rate divides a throughput (bytes a second read from ClickHouse) between groups: each
// group has a bucket of Burst that fills at PerSecond. Work is charged once it is done,
// since its size is known only then (a read's result bytes), so a bucket may go below
// zero; a group whose bucket is empty is refused new work until it has refilled
// (Wait). Where a Pool bounds how much a group holds at once, a Rate bounds how much it
// takes over time: a loop that stays within every Pool still gets its share only.
type Rate struct {
	perSecond, burst float64
	now              func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	level float64 // may be negative: charged past what it held
	at    time.Time
}

// maxBuckets bounds the buckets a Rate keeps before it drops the full ones (a full
// bucket and a missing one are the same).
const maxBuckets = 4096

// NewRate returns a rate of perSecond for each group, holding at most burst; now is
// its clock (nil: time.Now).
func NewRate(perSecond, burst int64, now func() time.Time) *Rate {
	if now == nil {
		now = time.Now
	}
	return &Rate{perSecond: float64(perSecond), burst: float64(burst), now: now, buckets: map[string]*bucket{}}
}

// levelLocked refills group's bucket up to now and returns it (nil: full, not kept).
func (r *Rate) levelLocked(group string, now time.Time) *bucket {
	b := r.buckets[group]
	if b == nil {
		return nil
	}
	b.level = min(r.burst, b.level+now.Sub(b.at).Seconds()*r.perSecond)
	b.at = now
	return b
}

// Charge takes n from group's bucket.
func (r *Rate) Charge(group string, n int64) {
	if n <= 0 {
		return
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.levelLocked(group, now)
	if b == nil {
		if len(r.buckets) >= maxBuckets {
			r.dropFullLocked(now)
		}
		b = &bucket{level: r.burst, at: now}
		r.buckets[group] = b
	}
	b.level -= float64(n)
}

// dropFullLocked forgets the buckets that have refilled.
func (r *Rate) dropFullLocked(now time.Time) {
	for g := range r.buckets {
		if b := r.levelLocked(g, now); b.level >= r.burst {
			delete(r.buckets, g)
		}
	}
}

// Wait is how long group must wait before its bucket holds anything again (0: it may
// start work now).
func (r *Rate) Wait(group string) time.Duration {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.levelLocked(group, now)
	if b == nil || b.level > 0 {
		return 0
	}
	if r.perSecond <= 0 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration((-b.level/r.perSecond)*float64(time.Second)) + time.Millisecond
}
