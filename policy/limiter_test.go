package policy

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLimiterGCRA(t *testing.T) {
	l := NewLimiter()
	now := time.Unix(1_000_000, 0)
	for i := range 3 {
		ok, _ := l.Allow("k", 3, time.Second, now)
		assert.True(t, ok, "burst %d", i)
	}
	ok, retry := l.Allow("k", 3, time.Second, now)
	assert.False(t, ok)
	assert.InDelta(t, time.Second/3, retry, float64(time.Microsecond))
	ok, _ = l.Allow("k", 3, time.Second, now.Add(retry))
	assert.True(t, ok)
	ok, _ = l.Allow("other", 3, time.Second, now)
	assert.True(t, ok, "keys are independent")
	ok, _ = l.Allow("k", 0, time.Second, now)
	assert.True(t, ok, "0 is unlimited")
	assert.Equal(t, 0, l.Sweep(now))
	assert.Equal(t, 2, l.Sweep(now.Add(time.Hour)))
}

func TestLimiterConcurrentExact(t *testing.T) {
	l := NewLimiter()
	now := time.Unix(1_000_000, 0)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if ok, _ := l.Allow("k", 100, time.Minute, now); ok {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(100), allowed.Load())
}

func TestOverNeverWraps(t *testing.T) {
	for _, tc := range []struct {
		spent, add, limit int64
		want              bool
	}{
		{0, 0, 0, false},               // unlimited
		{0, math.MaxInt64, 0, false},   // unlimited, however big
		{0, 100, 100, false},           // exactly the limit
		{0, 101, 100, true},            // one over
		{50, 50, 100, false},           // fills it
		{50, 51, 100, true},            // one over
		{100, 0, 100, true},            // reached, nothing to add
		{99, 0, 100, false},            // not reached
		{1, math.MaxInt64, 100, true},  // would wrap: denied
		{99, math.MaxInt64, 100, true}, // would wrap: denied
		{math.MaxInt64, 1, 100, true},  // saturated total
		{0, math.MaxInt64, math.MaxInt64, false},
		{1, math.MaxInt64, math.MaxInt64, true},
	} {
		assert.Equal(t, tc.want, over(tc.spent, tc.add, tc.limit), "%+v", tc)
	}
}

// TestLimiterMemoryIsBounded: under churn of agents and rooms, sweeping keeps only the
// keys of the last window.
func TestLimiterMemoryIsBounded(t *testing.T) {
	l := NewLimiter()
	start := time.Unix(1_000_000, 0)
	for i := range 100_000 {
		now := start.Add(time.Duration(i) * time.Millisecond) // 1,000 new keys a second
		l.Allow(fmt.Sprintf("agent-%d", i), 10, time.Second, now)
		if i%1000 == 999 {
			l.Sweep(now)
		}
	}
	assert.LessOrEqual(t, l.Len(), 2_000, "only keys of about the last second remain")
}
