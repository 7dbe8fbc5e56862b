package keys

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeSource is the key store of the cache tests.
type fakeSource struct {
	mu    sync.Mutex
	recs  []record
	err   error
	gate  chan struct{} // when set, load waits for it to close (or for its ctx)
	loads atomic.Int32
}

func (f *fakeSource) load(ctx context.Context) ([]record, error) {
	f.loads.Add(1)
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return append([]record(nil), f.recs...), nil
}

// add makes a key and returns its token.
func (f *fakeSource) add(id, org string, role Role) string {
	tok := newToken()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs = append(f.recs, record{Key: Key{ID: id, Org: org, Role: role, CreatedAt: time.Now().UTC()}, digest: digestHex(tok)})
	return tok
}

func (f *fakeSource) revoke(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.recs {
		if f.recs[i].ID == id {
			f.recs[i].RevokedAt = time.Now().UTC()
		}
	}
}

func (f *fakeSource) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// after is the fake clock's timer: it moves the clock on by d and fires at once.
func (c *fakeClock) after(d time.Duration) <-chan time.Time {
	c.advance(d)
	ch := make(chan time.Time, 1)
	ch <- c.now()
	return ch
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestCache(t *testing.T, src *fakeSource, clock *fakeClock, log *slog.Logger) *Cache {
	t.Helper()
	cfg := CacheConfig{source: src, Logger: log}
	if clock != nil {
		cfg.now, cfg.after = clock.now, clock.after
	}
	c, err := NewCache(cfg)
	require.NoError(t, err)
	return c
}

func TestCacheConfigValidate(t *testing.T) {
	_, err := NewCache(CacheConfig{})
	assert.ErrorContains(t, err, "no store")
	_, err = NewCache(CacheConfig{source: &fakeSource{}, Refresh: -time.Second, MinInterval: -1, LoadTimeout: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refresh interval -1s is negative")
	assert.Contains(t, err.Error(), "early-refresh interval")
	assert.Contains(t, err.Error(), "load timeout")
	c, err := NewCache(CacheConfig{source: &fakeSource{}})
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, c.cfg.Refresh)
	assert.Equal(t, time.Second, c.cfg.MinInterval)
}

func TestCacheLookup(t *testing.T) {
	src := &fakeSource{}
	active := src.add("k-active", "acme", RoleViewer)
	revoked := src.add("k-revoked", "acme", RoleViewer)
	src.revoke("k-revoked")
	platform := src.add("k-platform", PlatformOrg, RoleRouter)
	src.mu.Lock()
	src.recs = append(src.recs, record{Key: Key{ID: "k-bad-digest", Org: "acme", Role: RoleAdmin}, digest: "not hex"})
	src.mu.Unlock()

	var logs bytes.Buffer
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	c := newTestCache(t, src, clock, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	require.NoError(t, c.Load(ctx))
	require.NoError(t, c.refresh(ctx, false, false))
	assert.Equal(t, 1, strings.Count(logs.String(), "k-bad-digest"), "warned about once: %s", logs.String())

	k, ok := c.Lookup(ctx, active)
	require.True(t, ok)
	assert.Equal(t, "k-active", k.ID)
	assert.Equal(t, RoleViewer, k.Role)
	k, ok = c.Lookup(ctx, platform)
	require.True(t, ok)
	assert.True(t, k.Platform())

	_, ok = c.Lookup(ctx, revoked)
	assert.False(t, ok, "a revoked key never authenticates")
	// A token differing in one character is another token.
	_, ok = c.Lookup(ctx, active[:len(active)-1]+flip(active[len(active)-1]))
	assert.False(t, ok)
}

func flip(b byte) string {
	if b == 'A' {
		return "B"
	}
	return "A"
}

// A malformed token never costs a read of the store.
func TestCacheMalformedTokenReadsNothing(t *testing.T) {
	src := &fakeSource{}
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	c := newTestCache(t, src, clock, nil)
	require.NoError(t, c.Load(context.Background()))
	clock.advance(time.Hour)
	for _, tok := range []string{"", "dev-token", "bpk_short", strings.Repeat("x", 5000)} {
		_, ok := c.Lookup(context.Background(), tok)
		assert.False(t, ok)
	}
	assert.EqualValues(t, 1, src.loads.Load())
}

// An unknown token reads the store again, at most once per MinInterval: a key created
// after the last read works at the next allowed read.
func TestCacheEarlyRefreshRateLimited(t *testing.T) {
	src := &fakeSource{}
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	c := newTestCache(t, src, clock, nil)
	ctx := context.Background()
	require.NoError(t, c.Load(ctx))
	require.EqualValues(t, 1, src.loads.Load())

	tok := src.add("k-new", "acme", RoleIngest)
	// Within a second of the load: the lookup waits for the next read allowed (a second
	// after the load), and the key made in between works.
	clock.advance(500 * time.Millisecond)
	start := clock.now()
	k, ok := c.Lookup(ctx, tok)
	require.True(t, ok)
	assert.Equal(t, "k-new", k.ID)
	assert.EqualValues(t, 2, src.loads.Load())
	assert.Equal(t, 500*time.Millisecond, clock.now().Sub(start), "it waited for the rest of the second")

	// A flood of unknown tokens: at most one read per second, however many.
	start = clock.now()
	for range 300 {
		_, ok := c.Lookup(ctx, newToken())
		assert.False(t, ok)
	}
	reads := src.loads.Load() - 2
	assert.LessOrEqual(t, float64(reads), clock.now().Sub(start).Seconds()+1, "%d reads in %s", reads, clock.now().Sub(start))

	// A known token never reads.
	for range 100 {
		_, ok := c.Lookup(ctx, tok)
		require.True(t, ok)
	}
	assert.EqualValues(t, 2+reads, src.loads.Load())
}

// Concurrent unknown tokens share one read (single flight), and a caller that gives up
// does not fail the read for the others. The test runs in a synctest bubble:
// synctest.Wait returns once every caller is blocked, so each has joined the read in
// progress before it ends.
func TestCacheEarlyRefreshSingleFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
		c := newTestCache(t, src, clock, nil)
		require.NoError(t, c.Load(context.Background()))
		clock.advance(time.Minute)

		gate := make(chan struct{})
		src.mu.Lock()
		src.gate = gate
		src.mu.Unlock()
		tok := src.add("k-new", "acme", RoleIngest)

		// The first caller gives up while the read is blocked.
		short, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan bool)
		go func() { _, ok := c.Lookup(short, tok); gaveUp <- ok }()
		synctest.Wait()
		require.EqualValues(t, 2, src.loads.Load())
		cancel()
		assert.False(t, <-gaveUp, "Lookup returns when its context ends")

		const n = 50
		var wg sync.WaitGroup
		var found atomic.Int32
		for range n {
			wg.Go(func() {
				if _, ok := c.Lookup(context.Background(), tok); ok {
					found.Add(1)
				}
			})
		}
		synctest.Wait() // all of them wait for the read in progress
		close(gate)
		wg.Wait()
		assert.EqualValues(t, n, found.Load(), "every waiter sees the key the shared read found")
		assert.EqualValues(t, 2, src.loads.Load(), "one read for all")
	})
}

// While the store hangs, an unknown token waits earlyWait, no longer. The test runs in
// a synctest bubble: the cache's own clock (time.Now, time.After, context deadlines) is
// the bubble's, which moves on only when every goroutine in it is blocked, so the wait
// is measured exactly.
func TestCacheEarlyRefreshWaitBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		c := newTestCache(t, src, nil, nil)
		require.NoError(t, c.Load(context.Background()))
		gate := make(chan struct{})
		defer close(gate)
		src.mu.Lock()
		src.gate = gate
		src.mu.Unlock()
		time.Sleep(time.Second) // MinInterval since the load
		start := time.Now()
		_, ok := c.Lookup(context.Background(), newToken())
		assert.False(t, ok)
		assert.Equal(t, earlyWait, time.Since(start))
		assert.EqualValues(t, 2, src.loads.Load(), "the early read started and still hangs")
	})
}

// A failed read keeps the keys read before; a revocation is seen at the next read.
func TestCacheRefreshFailureKeepsServing(t *testing.T) {
	src := &fakeSource{}
	tok := src.add("k1", "acme", RoleViewer)
	var logs bytes.Buffer
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	c := newTestCache(t, src, clock, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	require.NoError(t, c.Load(ctx))

	src.setErr(errors.New("clickhouse is down"))
	for range 10 {
		clock.advance(time.Second)
		require.Error(t, c.refresh(ctx, false, false))
		_, ok := c.Lookup(ctx, tok)
		assert.True(t, ok, "old keys keep serving")
	}
	// Throttled: one warning for these 10 s of failures.
	assert.Equal(t, 1, strings.Count(logs.String(), "cannot refresh API keys"), logs.String())
	clock.advance(time.Minute)
	require.Error(t, c.refresh(ctx, false, false))
	assert.Equal(t, 2, strings.Count(logs.String(), "cannot refresh API keys"), logs.String())
	assert.Contains(t, logs.String(), "errors_not_logged=")
	assert.Contains(t, logs.String(), "clickhouse is down")

	src.setErr(nil)
	src.revoke("k1")
	require.NoError(t, c.refresh(ctx, false, false))
	assert.Contains(t, logs.String(), "API keys readable again")
	_, ok := c.Lookup(ctx, tok)
	assert.False(t, ok, "revoked at the next read")
}

func TestCacheLoadFails(t *testing.T) {
	var logs bytes.Buffer
	c := newTestCache(t, &fakeSource{err: errors.New("no such table api_keys")}, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	err := c.Load(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot load API keys: no such table api_keys")
	assert.Empty(t, logs.String(), "the first load's error is its caller's to report")
}

// Run reads the store every Refresh: a revocation takes effect within it. The test runs
// in a synctest bubble, whose clock moves on only when every goroutine in it is blocked:
// the time taken is the cache's waits alone, whatever the machine's speed.
func TestCacheRunRefreshes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		tok := src.add("k1", "acme", RoleViewer)
		c, err := NewCache(CacheConfig{source: src, Refresh: 20 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, c.Load(ctx))
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()

		_, ok := c.Lookup(ctx, tok)
		require.True(t, ok)
		src.revoke("k1")
		start := time.Now()
		require.Eventually(t, func() bool { _, ok := c.Lookup(ctx, tok); return !ok }, 3*time.Second, 5*time.Millisecond)
		// A refresh (Refresh, 20 ms) plus the one Lookup of the now unknown token, which
		// waits for the next early read allowed (MinInterval, 1 s, after that refresh).
		assert.LessOrEqual(t, time.Since(start), c.cfg.Refresh+c.cfg.MinInterval)
		cancel()
		assert.NoError(t, <-done, "Run stops with its context")
	})
}
