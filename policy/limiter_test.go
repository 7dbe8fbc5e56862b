package policy

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// probe asks both limiters the same questions and says whether every answer matched.
func probe(t *testing.T, live, replayed *Limiter, key string, rate int, window time.Duration, at []time.Time) {
	t.Helper()
	for _, now := range at {
		ok1, r1 := live.Allow(key, rate, window, now)
		ok2, r2 := replayed.Allow(key, rate, window, now)
		assert.Equal(t, ok1, ok2, "allow at %s", now)
		assert.Equal(t, r1, r2, "retry after at %s", now)
	}
}

// TestLimiterReplayIsExact: replaying the allowed events of a live run (bursts, denials
// in between, pauses longer than the window) leaves a limiter that answers every later
// question exactly as the live one.
func TestLimiterReplayIsExact(t *testing.T) {
	const rate, window = 7, 10 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 50 {
		live, replayed := NewLimiter(), NewLimiter()
		now := time.Unix(1_700_000_000, int64(rng.IntN(1e9)))
		var allowed []time.Time
		for range 200 {
			// Mostly fast (bursts into denials), sometimes a pause past the window.
			gap := time.Duration(rng.IntN(int(2 * time.Second)))
			if rng.IntN(20) == 0 {
				gap = window + time.Duration(rng.IntN(int(window)))
			}
			now = now.Add(gap)
			if ok, _ := live.Allow("k", rate, window, now); ok {
				allowed = append(allowed, now)
			}
		}
		for _, at := range allowed {
			replayed.Replay("k", rate, window, at)
		}
		lt, _ := live.TAT("k")
		rt, _ := replayed.TAT("k")
		assert.Equal(t, lt, rt, "run %d: the same theoretical arrival time", run)
		var later []time.Time
		for i := range 30 {
			later = append(later, now.Add(time.Duration(i)*window/13))
		}
		probe(t, live, replayed, "k", rate, window, later)
	}
}

// TestLimiterRestoreCarriesASaturatedSender: a sender kept at its limit for ten windows
// (the chatty agent: it retries as soon as retry_after says) has a TAT a whole window
// ahead. Replaying only the last window's events would grant it a fresh burst; the TAT
// its last event recorded restores it exactly.
func TestLimiterRestoreCarriesASaturatedSender(t *testing.T) {
	const rate, window = 5, time.Minute
	live := NewLimiter()
	start := time.Unix(1_700_000_000, 0)
	now := start
	type taken struct {
		at, tat time.Time
	}
	var allowed []taken
	for now.Before(start.Add(10 * window)) {
		ok, retry := live.Allow("k", rate, window, now)
		if ok {
			tat, _ := live.TAT("k")
			allowed = append(allowed, taken{now, tat})
			continue
		}
		now = now.Add(retry)
	}
	now = allowed[len(allowed)-1].at // right after an allowed event: the next one waits
	var span []taken
	for _, a := range allowed {
		if !a.at.Before(now.Add(-window)) {
			span = append(span, a)
		}
	}
	require.NotEmpty(t, span)

	replayOnly := NewLimiter()
	for _, a := range span {
		replayOnly.Replay("k", rate, window, a.at)
	}
	ok, _ := replayOnly.Allow("k", rate, window, now.Add(time.Millisecond))
	okLive, _ := NewLimiterFrom(t, live).Allow("k", rate, window, now.Add(time.Millisecond))
	require.False(t, okLive, "the live limiter denies: the sender is at its limit")
	assert.True(t, ok, "replaying only the last window forgets the burst carried from before it")

	restored := NewLimiter()
	for _, a := range span {
		restored.Replay("k", rate, window, a.at)
		restored.Restore("k", a.tat)
	}
	var later []time.Time
	for i := range 40 {
		later = append(later, now.Add(time.Duration(i)*window/17))
	}
	probe(t, live, restored, "k", rate, window, later)
}

// NewLimiterFrom copies l (a probe must not change the limiter it compares with).
func NewLimiterFrom(t *testing.T, l *Limiter) *Limiter {
	t.Helper()
	c := NewLimiter()
	l.tats.Range(func(k, v any) bool {
		c.Restore(k.(string), time.Unix(0, v.(*atomic.Int64).Load()))
		return true
	})
	return c
}

func TestLimiterRestoreAndUndo(t *testing.T) {
	l := NewLimiter()
	now := time.Unix(1_000_000, 0)
	_, ok := l.TAT("k")
	assert.False(t, ok)
	l.Restore("k", now.Add(time.Minute))
	l.Restore("k", now.Add(time.Second)) // an earlier TAT changes nothing
	l.Restore("k", time.Time{})
	tat, ok := l.TAT("k")
	require.True(t, ok)
	assert.Equal(t, now.Add(time.Minute), tat)
	ok, retry := l.Allow("k", 60, time.Minute, now)
	assert.False(t, ok, "a restored TAT a window ahead is a full limit")
	assert.Equal(t, time.Second, retry)
	ok, _ = l.Allow("k", 60, time.Minute, now.Add(time.Second))
	require.True(t, ok)
	l.Undo("k", 60, time.Minute)
	tat, _ = l.TAT("k")
	assert.Equal(t, now.Add(time.Minute), tat, "undo gives back what Allow took")
	l.Replay("k", 0, time.Minute, now)
	l.Replay("k", 60, 0, now)
	tat, _ = l.TAT("k")
	assert.Equal(t, now.Add(time.Minute), tat, "unlimited rates replay nothing")
}

// TestRateKeysAreTheEnginesOwn: the keys restore writes are the ones send_message takes.
func TestRateKeysAreTheEnginesOwn(t *testing.T) {
	e := exampleEngine(t)
	d, err := e.SendMessage(context.Background(), MessageInput{Agent: "a-architect", Room: webhookRoom})
	require.NoError(t, err)
	require.True(t, d.Allow, "%+v", d)
	for _, k := range []string{AgentRateKey("a-architect"), RoomRateKey("a-architect", webhookRoom)} {
		_, ok := e.Limiter().TAT(k)
		assert.True(t, ok, "%q", k)
	}
	assert.Equal(t, 2, e.Limiter().Len())
}
