package loadbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The hostile load of the attack phase.
const (
	// idleUpgrades clients each keep one WebSocket upgrade waiting without ever sending
	// connection_init: one refused (503) tries again a second later, one the server
	// ends (its init timeout) at once.
	idleUpgrades = 300
	// trickleBodies clients of org-h's one ingest key each post a body announced as
	// trickleLength bytes and send trickleBytes of it a second; refused (429), they
	// try again after the server's Retry-After of a second.
	trickleBodies = 16
	trickleLength = 1 << 20
	trickleBytes  = 4
	// keylessRate requests a second without any key, over keylessConns keep-alive
	// connections: POST /v1/events, POST /graphql, GET /graphql.
	keylessRate  = 1000
	keylessConns = 8
	// trickleHeldAfter: a body the server has not answered after this long is being
	// read.
	trickleHeldAfter = 2 * time.Second
)

// hostileAddr is the hostile clients' own source address: the server counts pending
// upgrades per remote address, and the legitimate clients' is 127.0.0.1.
var hostileAddr = &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}

// HostileSpec is what the benchmark asks of its hostile process (RunHostile), as the
// first line of that process's stdin (JSON): the keys' tokens stay off its command
// line, which every user of the machine can read.
type HostileSpec struct {
	Addr        string   `json:"addr"` // serve's host:port
	Kinds       []string `json:"kinds"`
	AuditLoops  int      `json:"audit_loops"`
	IngestToken string   `json:"ingest_token"` // org-h's ingest key: the slow bodies
	AuditToken  string   `json:"audit_token"`  // org-h's compliance key: the large pages
}

func (s HostileSpec) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(s.Addr); err != nil {
		errs = append(errs, fmt.Errorf("addr %q is not host:port: %w", s.Addr, err))
	}
	for _, k := range s.Kinds {
		if !slices.Contains(HostileKinds, k) {
			errs = append(errs, fmt.Errorf("unknown hostile client %q", k))
		}
	}
	if s.AuditLoops < 1 || s.AuditLoops > maxAuditLoops {
		errs = append(errs, fmt.Errorf("audit_loops must be 1 to %d, got %d", maxAuditLoops, s.AuditLoops))
	}
	return errors.Join(errs...)
}

// RunHostile is the hostile process of `bandplane bench load`, which runs its own
// binary for it: the hostile clients then share no Go scheduler, heap or garbage
// collector with the legitimate ones, whose latencies the benchmark measures from its
// own process. It reads a HostileSpec line from stdin, runs the hostile clients until
// stdin closes or ctx ends, and writes their HostileStats as one JSON line on stdout.
func RunHostile(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("no hostile spec on stdin: %w", err)
	}
	var spec HostileSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("cannot decode the hostile spec: %w", err)
	}
	if err := spec.validate(); err != nil {
		return fmt.Errorf("invalid hostile spec: %w", err)
	}
	if err := raiseFileLimit(2*idleUpgrades + 256); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, in)
		stop() // the benchmark is done, or gone
	}()
	h := startHostile(ctx, spec)
	<-ctx.Done()
	b, err := json.Marshal(h.stop())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

// hostile is the running hostile clients of one attack phase.
type hostile struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	start  time.Time
	dialer *net.Dialer
	addr   string // the server's host:port
	url    string

	idleUpgrades, idleRefused, idleClosed atomic.Int64
	trickleHeld, trickleRefused           atomic.Int64
	auditPages, auditRefused, auditBytes  atomic.Int64
	keylessSent, keylessErrors            atomic.Int64
}

// startHostile starts the hostile clients of spec; stop ends them and says what they
// did.
func startHostile(ctx context.Context, spec HostileSpec) *hostile {
	ctx, cancel := context.WithCancel(ctx)
	h := &hostile{cancel: cancel, start: time.Now(), addr: spec.Addr, url: "http://" + spec.Addr,
		dialer: &net.Dialer{LocalAddr: hostileAddr, Timeout: 5 * time.Second}}
	for _, k := range spec.Kinds {
		switch k {
		case HostileIdle:
			for range idleUpgrades {
				h.wg.Go(func() { h.idle(ctx) })
			}
		case HostileTrickle:
			for range trickleBodies {
				h.wg.Go(func() { h.trickle(ctx, spec.IngestToken) })
			}
		case HostileAudit:
			c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: h.dialer.DialContext,
				MaxIdleConnsPerHost: spec.AuditLoops, DisableCompression: true}}
			for range spec.AuditLoops {
				h.wg.Go(func() { h.audit(ctx, c, spec.AuditToken) })
			}
		case HostileKeyless:
			for i := range keylessConns {
				h.wg.Go(func() { h.keyless(ctx, i) })
			}
		}
	}
	return h
}

func (h *hostile) stop() HostileStats {
	h.cancel()
	h.wg.Wait()
	secs := time.Since(h.start).Seconds()
	st := HostileStats{IdleUpgrades: h.idleUpgrades.Load(), IdleRefused: h.idleRefused.Load(), IdleClosed: h.idleClosed.Load(),
		TrickleHeld: h.trickleHeld.Load(), TrickleRefuse: h.trickleRefused.Load(),
		AuditPages: h.auditPages.Load(), AuditRefused: h.auditRefused.Load(), AuditMiB: round(float64(h.auditBytes.Load())/(1<<20), 1),
		KeylessSent: h.keylessSent.Load(), KeylessErrors: h.keylessErrors.Load()}
	if secs > 0 {
		st.KeylessPerS = round(float64(st.KeylessSent)/secs, 1)
	}
	return st
}

// dial connects from the hostile address; the connection closes when ctx ends.
func (h *hostile) dial(ctx context.Context) (net.Conn, func(), error) {
	c, err := h.dialer.DialContext(ctx, "tcp", h.addr)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	return c, func() { stop(); _ = c.Close() }, nil
}

// idle keeps one upgrade waiting for its init, again and again.
func (h *hostile) idle(ctx context.Context) {
	var key [16]byte
	for ctx.Err() == nil {
		c, done, err := h.dial(ctx)
		if err != nil {
			_ = sleep(ctx, time.Second)
			continue
		}
		_, _ = rand.Read(key[:])
		req := fmt.Sprintf("GET /graphql HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: graphql-transport-ws\r\n\r\n", h.addr, base64.StdEncoding.EncodeToString(key[:]))
		upgraded := false
		if _, err := io.WriteString(c, req); err == nil {
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, nil); err == nil {
				_ = resp.Body.Close() // a 101 or an error's short body: nothing to read
				if resp.StatusCode == http.StatusSwitchingProtocols {
					upgraded = true
					h.idleUpgrades.Add(1)
					// Hold it until the server ends it (its init timeout: a close frame, or
					// the connection closed), then upgrade again at once.
					var b [1]byte
					_, _ = io.ReadFull(br, b[:])
					if ctx.Err() == nil {
						h.idleClosed.Add(1)
					}
				} else {
					h.idleRefused.Add(1)
				}
			}
		}
		done()
		if !upgraded {
			_ = sleep(ctx, time.Second)
		}
	}
}

// trickle posts one slow body after another.
func (h *hostile) trickle(ctx context.Context, token string) {
	chunk := bytes.Repeat([]byte(" "), trickleBytes)
	for ctx.Err() == nil {
		c, done, err := h.dial(ctx)
		if err != nil {
			_ = sleep(ctx, time.Second)
			continue
		}
		head := fmt.Sprintf("POST /v1/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n",
			h.addr, token, trickleLength)
		if _, err := io.WriteString(c, head); err != nil {
			done()
			_ = sleep(ctx, time.Second)
			continue
		}
		answered := make(chan int, 1)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answered <- 0
				return
			}
			_ = resp.Body.Close() // the status is what counts
			answered <- resp.StatusCode
		}()
		started, held := time.Now(), false
		t := time.NewTicker(time.Second)
	body:
		for {
			select {
			case code := <-answered:
				if code == http.StatusTooManyRequests {
					h.trickleRefused.Add(1)
				}
				break body
			case <-t.C:
				if _, err := c.Write(chunk); err != nil {
					break body
				}
				if !held && time.Since(started) >= trickleHeldAfter {
					held = true
					h.trickleHeld.Add(1)
				}
			case <-ctx.Done():
				break body
			}
		}
		t.Stop()
		done()
		_ = sleep(ctx, time.Second)
	}
}

// audit asks for org-h's largest events in a loop, without a pause.
func (h *hostile) audit(ctx context.Context, c *http.Client, token string) {
	body, _ := json.Marshal(map[string]any{"query": hostileAuditQuery, "variables": map[string]any{"limit": auditLimit}})
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/graphql", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				h.auditRefused.Add(1)
				_ = sleep(ctx, 100*time.Millisecond)
			}
			continue
		}
		var errs errorsKey
		n, err := io.Copy(&errs, resp.Body)
		_ = resp.Body.Close() // read to the end
		h.auditBytes.Add(n)
		if err != nil || resp.StatusCode != http.StatusOK || errs.found {
			if ctx.Err() == nil {
				h.auditRefused.Add(1)
			}
			continue
		}
		h.auditPages.Add(1)
	}
}

// errorsKey looks for a GraphQL error list in an answer as it streams by, without
// holding it: a hostile page is 14 MiB, and this process measures the legitimate
// clients too. The contents are letters and spaces, so an error list is the only
// "errors" key.
type errorsKey struct {
	tail  []byte
	found bool
}

var errorsPattern = []byte(`"errors":[`)

func (e *errorsKey) Write(p []byte) (int, error) {
	if e.found {
		return len(p), nil
	}
	// The pattern may straddle two writes: look at the end of the last one too.
	if len(e.tail) > 0 {
		joined := append(e.tail, p[:min(len(p), len(errorsPattern)-1)]...)
		e.found = bytes.Contains(joined, errorsPattern)
	}
	e.found = e.found || bytes.Contains(p, errorsPattern)
	// Keep the last len(pattern)-1 bytes written, however short the writes.
	n := len(errorsPattern) - 1
	if len(p) >= n {
		e.tail = append(e.tail[:0], p[len(p)-n:]...)
	} else {
		e.tail = append(e.tail, p...)
		e.tail = e.tail[max(len(e.tail)-n, 0):]
	}
	return len(p), nil
}

// keylessRequests are the requests without a key, sent in turn.
func keylessRequests(addr string) [][]byte {
	events := `{"id":"x","type":"message.created","time":"2026-01-01T00:00:00Z","actor":{"id":"a"},"source":"x","schema_version":1}`
	gql := `{"query":"{ auditEvents(limit: 100) { events { id data } } }"}`
	get := "/graphql?query=" + url.QueryEscape("{ agents { id } }")
	return [][]byte{
		fmt.Appendf(nil, "POST /v1/events HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s", addr, len(events), events),
		fmt.Appendf(nil, "POST /graphql HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(gql), gql),
		fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\n\r\n", get, addr),
	}
}

// keyless sends its share of keylessRate on one keep-alive connection, dialled
// again when it breaks; a tick that finds the last answer not read yet is skipped.
func (h *hostile) keyless(ctx context.Context, i int) {
	reqs := keylessRequests(h.addr)
	t := time.NewTicker(time.Second * keylessConns / keylessRate)
	defer t.Stop()
	var c net.Conn
	var done func()
	var br *bufio.Reader
	defer func() {
		if done != nil {
			done()
		}
	}()
	for n := i; ctx.Err() == nil; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c == nil {
			var err error
			if c, done, err = h.dial(ctx); err != nil {
				h.keylessErrors.Add(1)
				c = nil
				continue
			}
			br = bufio.NewReader(c)
		}
		h.keylessSent.Add(1)
		failed, closing := true, false
		if _, err := c.Write(reqs[n%len(reqs)]); err == nil {
			if resp, err := http.ReadResponse(br, nil); err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close() // read to the end
				failed, closing = err != nil, resp.Close
			}
		}
		if failed && ctx.Err() == nil {
			h.keylessErrors.Add(1)
		}
		if failed || closing {
			done()
			c, done = nil, nil
		}
	}
}
