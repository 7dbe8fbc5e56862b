package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
)

// benchPolicyResult is the JSON line of `bench policy`: the in-process latencies of
// policy.BenchPolicy, then the decision API over loopback HTTP.
type benchPolicyResult struct {
	policy.BenchResult
	HTTPPerS    float64 `json:"http_per_s"` // 200 answers per second
	HTTPAudit   bool    `json:"http_audit"` // each decision was audited to Kafka
	HTTPClients int     `json:"http_clients"`
	HTTPOK      int64   `json:"http_ok"`
	HTTPFailed  int64   `json:"http_failed"` // transport errors and non-200 answers
}

func runBenchPolicy(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench policy", "[flags]  (--audit needs `make up`)")
	agents := fs.Int("agents", 10_000, "agents in the benchmark directory")
	contacts := fs.Int("contacts", 50_000, "random contacts in the benchmark directory")
	n := fs.Int("n", 20_000, "decisions per in-process measurement (add_participant, send_message, bare OPA)")
	clients := fs.Int("http-clients", 0, "concurrent HTTP clients (0 = 8 without --audit, 256 with: an audited decision waits for Kafka's acknowledgement)")
	duration := fs.Duration("http-duration", 10*time.Second, "how long the HTTP phase runs")
	maxRequests := fs.Int64("http-requests", 0, "stop the HTTP phase after this many requests too (0 = no limit)")
	audit := fs.Bool("audit", false, "audit each HTTP decision to Kafka through the real producer (needs `make up`)")
	brokers := fs.String("kafka", envOr("BANDPLANE_KAFKA", "127.0.0.1:19092"), "Kafka bootstrap brokers for --audit, comma-separated (env BANDPLANE_KAFKA)")
	topic := fs.String("audit-topic", "bandplane.bench.decisions", "topic the --audit events go to (kept apart from the events topic)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *n < 1 || *duration <= 0 || *clients < 0 {
		return fmt.Errorf("need --n >= 1, --http-duration > 0 and --http-clients >= 0 (got %d, %s, %d)", *n, *duration, *clients)
	}
	if *clients == 0 {
		*clients = 8
		if *audit {
			*clients = 256
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return fmt.Errorf("cannot create --cpuprofile file: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	progress := func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench: "+format+"\n", a...) }

	progress("building a directory of %d agents and %d contacts", *agents, *contacts)
	setup, err := policy.NewBenchSetup(ctx, *agents, *contacts)
	if err != nil {
		return err
	}
	progress("in process: %d add_participant, %d send_message and %d bare OPA evaluations", *n, *n, *n)
	inproc, err := setup.Measure(ctx, *n)
	if err != nil {
		return err
	}
	res := benchPolicyResult{BenchResult: inproc, HTTPAudit: *audit, HTTPClients: *clients}

	cfg := api.Config{Engine: setup.Engine, Logger: e.log}
	if *audit {
		bs := splitBrokers(*brokers)
		if err := kafka.EnsureTopic(ctx, bs, *topic, 4); err != nil {
			return err
		}
		p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: bs, Topic: *topic})
		if err != nil {
			return fmt.Errorf("cannot create the audit producer: %w", err)
		}
		defer p.Close()
		cfg.Auditor = p // only here: a nil *kafka.Producer in the interface would not be "no audit"
	}
	a, err := api.New(cfg)
	if err != nil {
		return err
	}
	progress("HTTP: %d clients for %s (audit=%v)", *clients, *duration, *audit)
	ok, failed, elapsed, err := driveDecisions(ctx, a, setup.AddInputs(4096), *clients, *duration, *maxRequests)
	if err != nil {
		return err
	}
	res.HTTPOK, res.HTTPFailed = ok, failed
	res.HTTPPerS = float64(ok) / elapsed.Seconds()
	progress("HTTP: %d ok, %d failed in %s", ok, failed, elapsed.Round(time.Millisecond))

	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, string(b))
	return nil
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// driveDecisions serves h on a loopback listener and posts add_participant decisions
// to it from clients keep-alive connections, cycling through inputs, until duration
// has passed (or maxRequests were sent, when > 0). It counts 200 answers and failures
// and returns the time the load ran.
func driveDecisions(ctx context.Context, h http.Handler, inputs []policy.AddInput, clients int,
	duration time.Duration, maxRequests int64) (ok, failed int64, elapsed time.Duration, err error) {
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

	bodies := make([][]byte, len(inputs))
	for i, in := range inputs {
		bodies[i], _ = json.Marshal(in)
	}
	// One idle connection per client, so every request reuses a kept-alive one.
	tr := &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients,
		IdleConnTimeout: time.Minute, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := "http://" + ln.Addr().String() + "/v1/decisions/" + policy.AddParticipant

	post := func(ctx context.Context, body []byte) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body) // drain, or the connection is not reused
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}

	// Warm up: open every connection and check that the API answers.
	var wg sync.WaitGroup
	var warmFailed atomic.Int64
	for c := range clients {
		wg.Go(func() {
			for i := range 4 {
				if !post(ctx, bodies[(c*4+i)%len(bodies)]) {
					warmFailed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if f := warmFailed.Load(); f > 0 {
		return 0, 0, 0, fmt.Errorf("cannot warm up the decision API at %s: %d of %d requests failed", url, f, clients*4)
	}

	// Clients stop sending at the deadline but let their request in flight finish: a
	// cancelled request would cancel its audit write and log an error for it.
	deadline := time.Now().Add(duration)
	var okN, failedN, sent atomic.Int64
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := sent.Add(1)
				if maxRequests > 0 && i > maxRequests {
					return
				}
				if post(ctx, bodies[int(i)%len(bodies)]) {
					okN.Add(1)
				} else {
					failedN.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(start)
	if err := ctx.Err(); err != nil {
		return okN.Load(), failedN.Load(), elapsed, err
	}
	return okN.Load(), failedN.Load(), elapsed, nil
}
