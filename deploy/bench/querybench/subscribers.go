package querybench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/graph/wsclient"
)

// SubscriberSpec is what the benchmark asks of its subscribers' process, as the first
// line of that process's stdin (JSON): the key's token stays off its command line,
// which every user of the machine can read.
type SubscriberSpec struct {
	URL         string `json:"url"` // the GraphQL endpoint, ws://
	Token       string `json:"token"`
	Org         string `json:"org"`
	Subscribers int    `json:"subscribers"`
	Dials       int    `json:"dials"`  // dialled at once
	Buffer      int    `json:"buffer"` // messages of each subscription the client holds
	// CPUProfile is a file to write the process's CPU profile to, if any.
	CPUProfile string `json:"cpu_profile,omitempty"`
}

func (s SubscriberSpec) validate() error {
	var errs []error
	if !strings.HasPrefix(s.URL, "ws://") && !strings.HasPrefix(s.URL, "wss://") {
		errs = append(errs, fmt.Errorf("url %q is not ws:// or wss://", s.URL))
	}
	if s.Subscribers < 1 || s.Subscribers >= maxSubscribers {
		errs = append(errs, fmt.Errorf("subscribers must be in [1, %d), got %d", maxSubscribers, s.Subscribers))
	}
	if s.Dials < 1 {
		errs = append(errs, fmt.Errorf("dials must be >= 1, got %d", s.Dials))
	}
	if s.Buffer < 1 {
		errs = append(errs, fmt.Errorf("buffer must be >= 1, got %d", s.Buffer))
	}
	return errors.Join(errs...)
}

// subscriberFiles is what the subscribers' process opens besides its connections.
const subscriberFiles = 64

// RunSubscribers is the subscribers' process of `bandplane bench query`, which runs
// its own binary for it: the server's CPU is then its own. It reads a SubscriberSpec
// line from stdin, dials that many WebSocket connections, each subscribed to
// workStatusChanged of the org, and reports on stdout in records (records.go): every
// change each subscriber reads, a subscription that ends, and once all have
// subscribed, a ready record. It ends when stdin closes or ctx is done, closing its
// connections first.
func RunSubscribers(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("no subscriber spec on stdin: %w", err)
	}
	var spec SubscriberSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("cannot decode the subscriber spec: %w", err)
	}
	if err := spec.validate(); err != nil {
		return fmt.Errorf("invalid subscriber spec: %w", err)
	}
	if err := raiseFileLimit(spec.Subscribers+subscriberFiles, "the subscribers' process"); err != nil {
		return err
	}
	if spec.CPUProfile != "" {
		f, err := os.Create(spec.CPUProfile)
		if err != nil {
			return fmt.Errorf("cannot create the subscribers' CPU profile: %w", err)
		}
		defer f.Close() //nolint:errcheck // StopCPUProfile has written it
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cannot start the subscribers' CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, in)
		stop() // the benchmark is done, or gone
	}()
	c := &subscribers{out: newRecordWriter(stdout, stop)}
	err = c.run(ctx, spec, stderr)
	if werr := c.out.close(); err == nil && werr != nil {
		err = fmt.Errorf("cannot write the records: %w", werr)
	}
	return err
}

type subscribers struct {
	out     *recordWriter
	conns   []*wsclient.Conn
	readers sync.WaitGroup
	// closing is set when the run ends (stdin closes, a signal): the ends that follow
	// are this process's own doing.
	closing atomic.Bool
}

func (c *subscribers) run(ctx context.Context, spec SubscriberSpec, stderr io.Writer) error {
	start := time.Now()
	c.conns = make([]*wsclient.Conn, spec.Subscribers)
	defer c.closeAll()
	var (
		dials    sync.WaitGroup
		failed   atomic.Pointer[error]
		done     atomic.Int64
		retried  atomic.Int64
		sem      = make(chan struct{}, spec.Dials)
		finished = make(chan struct{})
	)
	var ticker sync.WaitGroup
	ticker.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-finished:
				return
			case <-t.C:
				fmt.Fprintf(stderr, "%d of %d subscribed after %s\n", done.Load(), spec.Subscribers, time.Since(start).Round(time.Second))
			}
		}
	})
	for i := range spec.Subscribers {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil || failed.Load() != nil {
			break
		}
		dials.Go(func() {
			defer func() { <-sem }()
			conn, ch, retries, err := dialSubscriber(ctx, spec)
			retried.Add(int64(retries))
			if err != nil {
				err = fmt.Errorf("subscriber %d: %w", i, err)
				failed.CompareAndSwap(nil, &err)
				return
			}
			c.conns[i] = conn
			done.Add(1)
			c.readers.Go(func() { c.read(i, ch) })
		})
	}
	dials.Wait()
	close(finished)
	ticker.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("stopped after %d of %d subscribed", done.Load(), spec.Subscribers)
	}
	took := time.Since(start)
	fmt.Fprintf(stderr, "%d subscribed in %s (%d upgrades retried after 503)\n", spec.Subscribers, took.Round(time.Millisecond), retried.Load())
	c.out.write(record{kind: recReady, sub: spec.Subscribers, at: int64(took)})
	c.out.flush()
	<-ctx.Done()
	return nil
}

// dialSubscriber connects one subscriber and subscribes it. An upgrade answered 503
// (the server's bound on upgrades waiting for their init) is tried again after a
// pause, doubling up to the server's Retry-After of 5 s; retries says how often.
func dialSubscriber(ctx context.Context, spec SubscriberSpec) (conn *wsclient.Conn, ch <-chan wsclient.Message, retries int, err error) {
	pause := 50 * time.Millisecond
	giveUp := time.Now().Add(2 * time.Minute)
	for {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		conn, err = wsclient.Dial(dctx, spec.URL, spec.Token)
		if err == nil {
			_, ch, err = conn.Subscribe(dctx, workSubscription, map[string]any{"org": spec.Org}, spec.Buffer)
			cancel()
			if err != nil {
				_ = conn.Close() // the subscribe error is the one reported
				return nil, nil, retries, err
			}
			return conn, ch, retries, nil
		}
		cancel()
		if !upgradeRefused(err) || time.Now().Add(pause).After(giveUp) {
			return nil, nil, retries, err
		}
		retries++
		select {
		case <-ctx.Done():
			return nil, nil, retries, ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// upgradeRefused says whether a dial failed on a 503 answer to the upgrade, which
// wsclient reports in its message only.
func upgradeRefused(err error) bool {
	return strings.Contains(err.Error(), "(HTTP 503)")
}

// read reports subscriber i's messages until its subscription ends. The message's data
// is scanned for the title, not decoded (titleOf): at 10,000 subscribers this
// process reads as many messages as the server writes.
func (c *subscribers) read(i int, ch <-chan wsclient.Message) {
	ended := false
	for m := range ch {
		now := time.Now().UnixNano()
		if m.Err != nil || len(m.Errors) > 0 {
			if !ended && !c.closing.Load() {
				ended = true
				code := uint32(endBroken)
				if len(m.Errors) > 0 && m.Errors[0].Code() == "SLOW_SUBSCRIBER" {
					code = endSlow
				}
				c.out.write(record{kind: recEnded, sub: i, val: code, at: now})
			}
			continue
		}
		seq, _, ok := titleOf(m.Data)
		if !ok || seq > math.MaxUint32 {
			continue
		}
		c.out.write(record{kind: recMessage, sub: i, val: uint32(seq), at: now})
	}
}

// closeAll closes every connection, a few at a time (each waits for the server's
// close frame), and waits for the readers.
func (c *subscribers) closeAll() {
	c.closing.Store(true)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, conn := range c.conns {
		if conn == nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = conn.Close() // the connection is done with either way
		})
	}
	wg.Wait()
	c.readers.Wait()
}

// recordWriter buffers the records of every subscriber for one pipe, flushing at
// least every flushEvery.
type recordWriter struct {
	mu     sync.Mutex
	w      *bufio.Writer
	err    error
	failed func() // called once on the first write error: the reader is gone
	stop   chan struct{}
	done   chan struct{}
}

const flushEvery = 20 * time.Millisecond

func newRecordWriter(w io.Writer, failed func()) *recordWriter {
	rw := &recordWriter{w: bufio.NewWriterSize(w, 64<<10), failed: failed, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(rw.done)
		t := time.NewTicker(flushEvery)
		defer t.Stop()
		for {
			select {
			case <-rw.stop:
				return
			case <-t.C:
				rw.flush()
			}
		}
	}()
	return rw
}

func (rw *recordWriter) write(r record) {
	var b [recordSize]byte
	r.put(&b)
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.err == nil {
		_, rw.err = rw.w.Write(b[:])
		rw.check()
	}
}

func (rw *recordWriter) flush() {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.err == nil && rw.w.Buffered() > 0 {
		rw.err = rw.w.Flush()
		rw.check()
	}
}

// check reports the first write error; the caller holds mu.
func (rw *recordWriter) check() {
	if rw.err != nil && rw.failed != nil {
		rw.failed()
		rw.failed = nil
	}
}

// close stops the flusher and flushes what is left.
func (rw *recordWriter) close() error {
	close(rw.stop)
	<-rw.done
	rw.flush()
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.err
}
