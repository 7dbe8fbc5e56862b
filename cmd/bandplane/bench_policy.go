package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/policybench"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

// benchPolicyResult is the JSON line of `bench policy`: the in-process latencies of
// policybench.Run, then the decision API over loopback HTTP, without audit and, with
// --audit, in the same run, with each decision audited to Kafka.
type benchPolicyResult struct {
	policybench.Result
	HTTPPerS    float64     `json:"http_per_s"` // = HTTP.PerS
	HTTP        httpResult  `json:"http"`
	HTTPAudited *httpResult `json:"http_audited,omitempty"`
	// The replay of a simulated day of decisions on the same directory (policy replay).
	*policybench.ReplayResult
}

// httpResult is one HTTP phase: add_participant decisions answered 200 per second.
type httpResult struct {
	PerS    float64 `json:"per_s"`
	Clients int     `json:"clients"`
	OK      int64   `json:"ok"`
	Failed  int64   `json:"failed"` // transport errors and non-200 answers
}

func runBenchPolicy(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench policy", "[flags]  (--audit needs `make up`)")
	agents := fs.Int("agents", 10_000, "agents in the benchmark directory")
	contacts := fs.Int("contacts", 50_000, "random contacts in the benchmark directory")
	n := fs.Int("n", 20_000, "decisions per in-process measurement (add_participant, send_message, bare OPA)")
	clients := fs.Int("http-clients", 8, "concurrent HTTP clients without audit")
	auditClients := fs.Int("http-audit-clients", 256, "concurrent HTTP clients with --audit (an audited decision waits for Kafka's acknowledgement)")
	duration := fs.Duration("http-duration", 10*time.Second, "how long each measured HTTP phase runs")
	warmup := fs.Duration("http-warmup", 2*time.Second, "how long the same HTTP load runs, unmeasured, before each phase")
	maxRequests := fs.Int64("http-requests", 0, "end each HTTP phase after about this many answers too (0 = no limit)")
	audit := fs.Bool("audit", false, "also measure HTTP with each decision audited to Kafka through the real producer (needs `make up`)")
	brokers := fs.String("kafka", envOr("BANDPLANE_KAFKA", "127.0.0.1:19092"), "Kafka bootstrap brokers for --audit, comma-separated (env BANDPLANE_KAFKA)")
	topic := fs.String("audit-topic", "bandplane.bench.decisions", "topic the --audit events go to (kept apart from the events topic)")
	replayN := fs.Int("replay-decisions", 200_000, "decisions of the simulated day the replay phase makes and replays (0: no replay phase)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *n < 1 || *duration <= 0 || *warmup < 0 || *clients < 1 || *auditClients < 1 {
		return fmt.Errorf("need --n >= 1, --http-duration > 0, --http-warmup >= 0, --http-clients >= 1 and --http-audit-clients >= 1 (got %d, %s, %s, %d, %d)",
			*n, *duration, *warmup, *clients, *auditClients)
	}
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	progress := func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench: "+format+"\n", a...) }

	// Check the broker first: a missing stack should fail in a second, not after the
	// in-process phase.
	var auditor *kafka.Producer
	if *audit {
		bs := splitBrokers(*brokers)
		if err := kafka.EnsureTopic(ctx, bs, *topic, 4); err != nil {
			return err
		}
		p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: bs, Topic: *topic, BatchSize: kafka.AuditBatchSize})
		if err != nil {
			return fmt.Errorf("cannot create the audit producer: %w", err)
		}
		defer func() { _ = p.Close() }()
		auditor = p
	}

	progress("building a directory of %d agents and %d contacts", *agents, *contacts)
	setup, err := policybench.NewSetup(ctx, *agents, *contacts)
	if err != nil {
		return err
	}
	progress("in process: %d add_participant, %d send_message and %d bare OPA evaluations", *n, *n, *n)
	inproc, err := setup.Measure(ctx, *n)
	if err != nil {
		return err
	}
	res := benchPolicyResult{Result: inproc}
	inputs := setup.AddInputs(4096)

	phase := func(cfg api.Config, clients int, what string) (httpResult, error) {
		a, err := api.New(cfg)
		if err != nil {
			return httpResult{}, err
		}
		progress("HTTP %s: %d clients, %s warm-up, %s measured", what, clients, *warmup, *duration)
		ok, failed, elapsed, err := driveDecisions(ctx, a, inputs, clients, *warmup, *duration, *maxRequests)
		if err != nil {
			return httpResult{}, err
		}
		progress("HTTP %s: %d ok, %d failed in %s", what, ok, failed, elapsed.Round(time.Millisecond))
		return httpResult{PerS: float64(ok) / elapsed.Seconds(), Clients: clients, OK: ok, Failed: failed}, nil
	}
	if res.HTTP, err = phase(api.Config{Engine: setup.Engine, Auth: benchKeys, Logger: e.log}, *clients, "without audit"); err != nil {
		return err
	}
	res.HTTPPerS = res.HTTP.PerS
	if auditor != nil {
		r, err := phase(api.Config{Engine: setup.Engine, Auth: benchKeys, Logger: e.log, Auditor: auditor}, *auditClients, "audited to "+*topic)
		if err != nil {
			return err
		}
		res.HTTPAudited = &r
	}

	if *replayN > 0 {
		progress("replay: a simulated day of %d decisions on the same directory, made live, then replayed", *replayN)
		r, err := setup.Replay(ctx, *replayN)
		if err != nil {
			return err
		}
		progress("replay: %d decisions in %.1f s (%.0f/s), %d flips", r.Decisions, r.Seconds, r.DecisionsPerS, r.Flips)
		res.ReplayResult = &r
	}

	if err := printJSON(e.stdout, res); err != nil {
		return err
	}
	return nil
}

// benchKeys is the key store of the HTTP phases: one platform router key, looked up
// like serve's (a map from the token's SHA-256), so each request pays for the
// authentication it pays for in production.
var benchKeys = staticKeys{sha256.Sum256([]byte(benchToken)): {ID: "bench-router", Org: keys.PlatformOrg, Role: keys.RoleRouter}}

const benchToken = "bpk_bench-router-token"

type staticKeys map[[sha256.Size]byte]keys.Key

func (s staticKeys) Lookup(_ context.Context, token string) (keys.Key, bool) {
	k, ok := s[sha256.Sum256([]byte(token))]
	return k, ok
}

// driveDecisions serves h on a loopback listener and posts add_participant decisions
// to it from clients keep-alive connections, cycling through inputs: for warmup, then,
// measured, until duration has passed (or maxRequests were answered, when > 0). It
// counts 200 answers and failures and returns the time the measured load ran.
//
// The server is the real API behind net/http. The load generator shares the machine's
// two cores with it (and with Kafka under --audit), so, like wrk, it is lean: each
// client writes pre-built HTTP/1.1 requests on its own connection and reads each answer
// with http.ReadResponse, without the http.Client transport machinery (its client side
// took about 30% of the CPU samples of an audited bench run).
func driveDecisions(ctx context.Context, h http.Handler, inputs []policy.AddInput, clients int,
	warmup, duration time.Duration, maxRequests int64) (ok, failed int64, elapsed time.Duration, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("cannot listen on loopback: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = fmt.Errorf("cannot serve the decision API: %w", serr)
		}
	}()

	addr := ln.Addr().String()
	path := "/v1/decisions/" + policy.AddParticipant
	requests := make([][]byte, len(inputs))
	for i, in := range inputs {
		body, _ := json.Marshal(in)
		requests[i] = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			path, addr, benchToken, len(body), body)
	}
	conns := make([]*benchConn, clients)
	for c := range conns {
		if conns[c], err = dialBench(ctx, addr); err != nil {
			for _, bc := range conns[:c] {
				_ = bc.Close()
			}
			return 0, 0, 0, err
		}
	}
	defer func() {
		for _, bc := range conns {
			_ = bc.Close()
		}
	}()

	// run drives the load until the deadline (or maxRequests, when > 0). Clients stop
	// sending at the deadline but let their request in flight finish: a cancelled
	// request would cancel its audit write and log an error for it.
	var sent atomic.Int64
	run := func(deadline time.Time, maxRequests int64) (ok, failed int64, firstErr error) {
		var okN, failedN atomic.Int64
		var first atomic.Value
		var wg sync.WaitGroup
		for _, bc := range conns {
			wg.Go(func() {
				for ctx.Err() == nil && time.Now().Before(deadline) {
					if maxRequests > 0 && okN.Load()+failedN.Load() >= maxRequests {
						return
					}
					if err := bc.post(requests[int(sent.Add(1))%len(requests)]); err != nil {
						failedN.Add(1)
						first.CompareAndSwap(nil, err)
						if bc.broken {
							return // the connection is gone; its failure is counted
						}
					} else {
						okN.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if e, ok := first.Load().(error); ok {
			firstErr = e
		}
		return okN.Load(), failedN.Load(), firstErr
	}

	// Warm up (Go and the broker's JIT, connections, batches), and check that the API
	// answers at all.
	if _, wf, ferr := run(time.Now().Add(warmup), 0); wf > 0 {
		return 0, 0, 0, fmt.Errorf("cannot warm up the decision API at %s%s: %d requests failed, first: %w", addr, path, wf, ferr)
	}
	start := time.Now()
	ok, failed, _ = run(start.Add(duration), maxRequests)
	elapsed = time.Since(start)
	return ok, failed, elapsed, ctx.Err()
}

// benchConn is one keep-alive HTTP/1.1 connection of the load generator.
type benchConn struct {
	net.Conn
	r      *bufio.Reader
	broken bool
}

func dialBench(ctx context.Context, addr string) (*benchConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot connect the load generator to %s: %w", addr, err)
	}
	return &benchConn{Conn: c, r: bufio.NewReaderSize(c, 4096)}, nil
}

// post writes one request and reads its answer; anything but 200 is an error. After a
// transport error the connection is marked broken.
func (c *benchConn) post(req []byte) error {
	if _, err := c.Write(req); err != nil {
		c.broken = true
		return err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		c.broken = true
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		c.broken = true
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("decision API answered %s", resp.Status)
	}
	return nil
}
