package keys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// loader reads every key with its digest; Store implements it, tests fake it. It
// blocks on ClickHouse.
type loader interface {
	load(ctx context.Context) ([]record, error)
}

// CacheConfig configures a Cache.
type CacheConfig struct {
	Store *Store
	// Refresh is how often every key is read again (default 5 s): a revocation takes
	// effect within Refresh plus one ClickHouse read.
	Refresh time.Duration
	// MinInterval is the least time between the start of a read and an early one, made
	// for a token the cache does not know (default 1 s): a key created while serve runs
	// works within about MinInterval, and a flood of unknown tokens costs at most one
	// read per MinInterval.
	MinInterval time.Duration
	// LoadTimeout bounds one read of the store (default 10 s).
	LoadTimeout time.Duration
	Logger      *slog.Logger

	source loader                               // tests: instead of Store
	now    func() time.Time                     // tests: the clock of MinInterval and of log throttling
	after  func(time.Duration) <-chan time.Time // tests: how a Lookup waits for the next early read
}

func (c CacheConfig) Validate() error {
	var errs []error
	if c.Store == nil && c.source == nil {
		errs = append(errs, errors.New("key cache has no store"))
	}
	if c.Refresh < 0 {
		errs = append(errs, fmt.Errorf("key refresh interval %s is negative", c.Refresh))
	}
	if c.MinInterval < 0 {
		errs = append(errs, fmt.Errorf("key early-refresh interval %s is negative", c.MinInterval))
	}
	if c.LoadTimeout < 0 {
		errs = append(errs, fmt.Errorf("key load timeout %s is negative", c.LoadTimeout))
	}
	return errors.Join(errs...)
}

// Cache holds the active keys by the SHA-256 of their tokens, so that authenticating a
// request is one digest and one map lookup: no comparison of the token itself, hence no
// timing oracle on it.
type Cache struct {
	cfg  CacheConfig
	src  loader
	log  *slog.Logger
	keys atomic.Pointer[map[[32]byte]Key]

	mu        sync.Mutex
	flight    *flight   // the read in progress, nil when none
	lastStart time.Time // start of the latest read
	failing   bool      // the latest read failed
	lastLog   time.Time // when a read error was last logged
	dropped   int       // read errors not logged since

	badDigest map[string]bool // keys with a malformed digest, warned about once (flights run one at a time)
	revoked   map[string]bool // ids Forget dropped: never held again in this process
}

// maxForgotten bounds what Forget remembers; past it, a read that started before a
// revocation was stored may hold the key until the next read.
const maxForgotten = 100_000

// flight is one read of the store that every caller arriving meanwhile waits for.
type flight struct {
	done  chan struct{}
	err   error
	quiet bool // the first Load: its caller reports the error
}

// errTooSoon is an early refresh refused by MinInterval.
var errTooSoon = errors.New("key store was read less than the early-refresh interval ago")

const (
	logEvery  = time.Minute
	earlyWait = 2 * time.Second // longest a Lookup waits for an early read
)

func NewCache(cfg CacheConfig) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = time.Second
	}
	if cfg.LoadTimeout == 0 {
		cfg.LoadTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.after == nil {
		cfg.after = time.After
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	c := &Cache{cfg: cfg, src: cfg.source, log: cfg.Logger.With("component", "keys"), badDigest: map[string]bool{}, revoked: map[string]bool{}}
	if c.src == nil {
		c.src = cfg.Store
	}
	empty := map[[32]byte]Key{}
	c.keys.Store(&empty)
	return c, nil
}

// Load reads the keys for the first time; serve does not start without them.
func (c *Cache) Load(ctx context.Context) error {
	if err := c.refresh(ctx, false, true); err != nil {
		return fmt.Errorf("cannot load API keys: %w", err)
	}
	return nil
}

// Run reads the keys again every Refresh until ctx ends. A failed read is logged
// (at most once a minute) and the keys read before keep serving.
func (c *Cache) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_ = c.refresh(ctx, false, false)
		}
	}
}

// Lookup returns the active key whose token this is. A well-formed token the cache
// does not know triggers an early read of the store, shared with any read in progress
// and at most one per MinInterval; Lookup waits for it (or for ctx).
func (c *Cache) Lookup(ctx context.Context, token string) (Key, bool) {
	if !wellFormed(token) {
		return Key{}, false
	}
	d := digest(token)
	if k, ok := (*c.keys.Load())[d]; ok {
		return k, true
	}
	// Bounded: while the store is slow, an unknown token costs its request earlyWait,
	// not LoadTimeout (the read itself goes on for whoever comes next).
	wctx, cancel := context.WithTimeout(ctx, earlyWait)
	defer cancel()
	// Within MinInterval of the last read, wait for the next one that may start rather
	// than refuse: a key created a moment after a periodic read works at once, and a
	// flood of unknown tokens still costs at most one read per MinInterval.
	if wait := c.untilEarly(); wait > 0 {
		select {
		case <-c.cfg.after(wait):
		case <-wctx.Done():
			return Key{}, false
		}
	}
	if c.refresh(wctx, true, false) != nil {
		return Key{}, false
	}
	k, ok := (*c.keys.Load())[d]
	return k, ok
}

// Held returns the active key whose token this is from the keys the cache holds,
// never reading the store: what a check repeated for every open subscription uses.
func (c *Cache) Held(token string) (Key, bool) {
	if !wellFormed(token) {
		return Key{}, false
	}
	k, ok := (*c.keys.Load())[digest(token)]
	return k, ok
}

// Forget drops key id at once, ahead of the next read of the store (serve calls it for
// each key.revoked event). A revocation is final, so a read that started before it was
// stored does not bring the key back either.
func (c *Cache) Forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.revoked) < maxForgotten {
		c.revoked[id] = true
	}
	c.dropRevokedLocked(*c.keys.Load())
}

// dropRevokedLocked holds keys without those Forget dropped (keys itself is not
// changed: Lookup may be reading it).
func (c *Cache) dropRevokedLocked(keys map[[32]byte]Key) {
	var kept map[[32]byte]Key
	for d, k := range keys {
		if c.revoked[k.ID] {
			if kept == nil {
				kept = maps.Clone(keys)
			}
			delete(kept, d)
		}
	}
	if kept == nil {
		kept = keys
	}
	c.keys.Store(&kept)
}

// untilEarly is how long until an early refresh may start (0: now, or one is in
// flight to join); refresh decides again.
func (c *Cache) untilEarly() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flight != nil {
		return 0
	}
	return max(0, c.cfg.MinInterval-c.cfg.now().Sub(c.lastStart))
}

// refresh joins the read in progress or starts one, and waits for it or for ctx. An
// early refresh starts none within MinInterval of the last start.
func (c *Cache) refresh(ctx context.Context, early, quiet bool) error {
	c.mu.Lock()
	f := c.flight
	if f == nil {
		if early && c.cfg.now().Sub(c.lastStart) < c.cfg.MinInterval {
			c.mu.Unlock()
			return errTooSoon
		}
		f = &flight{done: make(chan struct{}), quiet: quiet}
		c.flight, c.lastStart = f, c.cfg.now()
		// The read is the flight's, not its starter's: a request that gives up must
		// not fail the read for the others waiting on it.
		go c.fly(context.WithoutCancel(ctx), f)
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Cache) fly(ctx context.Context, f *flight) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.LoadTimeout)
	defer cancel()
	recs, err := c.src.load(ctx)
	var keys map[[32]byte]Key
	if err == nil {
		keys = make(map[[32]byte]Key, len(recs))
		for _, r := range recs {
			if !r.Active() {
				continue
			}
			d, ok := digestBytes(r.digest)
			if !ok {
				if !c.badDigest[r.ID] {
					c.log.Warn("skipping API key with a malformed token digest (a row not written by bandplane keys?)", "key_id", r.ID)
					c.badDigest[r.ID] = true
				}
				continue
			}
			keys[d] = r.Key
		}
	}
	c.mu.Lock()
	if err == nil {
		c.dropRevokedLocked(keys)
	}
	c.flight = nil
	f.err = err
	c.noteLocked(err, f.quiet)
	c.mu.Unlock()
	close(f.done)
}

// noteLocked logs a failed read, throttled to one line per logEvery, and the recovery.
func (c *Cache) noteLocked(err error, quiet bool) {
	now := c.cfg.now()
	switch {
	case err == nil:
		if c.failing {
			c.log.Info("API keys readable again", "errors_not_logged", c.dropped)
		}
		c.failing, c.dropped = false, 0
	case quiet:
	case !c.failing || now.Sub(c.lastLog) >= logEvery:
		c.log.Warn("cannot refresh API keys; the keys read before keep serving", "err", err, "errors_not_logged", c.dropped)
		c.failing, c.lastLog, c.dropped = true, now, 0
	default:
		c.dropped++
	}
}
