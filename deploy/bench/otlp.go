package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/keys"
)

// The OTLP phase compares the two ways into bandplane over HTTP, side by side: the
// native collector (POST /v1/events, canonical usage events as NDJSON) and the OTLP
// receiver (POST /v1/traces, GenAI chat spans as protobuf), each carrying the same
// usage reports through a collector, Kafka and the pipeline to queryable usage rows.
// Each pass has its own collector, topic and database; bodies are encoded beforehand,
// outside the timer; the same clients send the same number of requests.

const (
	otlpOrg     = "bench-otlp"
	otlpToken   = "bench-otlp-token"
	otlpAgents  = 20
	otlpClients = 4
	otlpRounds  = 2
)

// OTLPResult is the OTLP phase's part of the result line.
type OTLPResult struct {
	Reports           int     `json:"otlp_reports"` // of each way, all rounds
	Batch             int     `json:"otlp_batch"`
	NativeReportsPerS float64 `json:"otlp_native_reports_per_s"`
	OTLPSpansPerS     float64 `json:"otlp_spans_per_s"`
	OTLPRatio         float64 `json:"otlp_ratio"`
	NativeSeconds     float64 `json:"otlp_native_s"`
	OTLPSeconds       float64 `json:"otlp_s"`
}

// benchDirectory registers agent-bench-k in the bench organization and binds service
// svc-k to it.
type benchDirectory struct{}

func (benchDirectory) OrgOf(id string) (string, bool) {
	if len(id) > len("agent-bench-") && id[:len("agent-bench-")] == "agent-bench-" {
		return otlpOrg, true
	}
	return "", false
}

func (benchDirectory) Bound(org, kind, value string) (string, bool) {
	if org == otlpOrg && kind == "service" && len(value) > 4 && value[:4] == "svc-" {
		return "agent-bench-" + value[4:], true
	}
	return "", false
}

type benchKeys struct{}

func (benchKeys) Lookup(_ context.Context, token string) (keys.Key, bool) {
	if token != otlpToken {
		return keys.Key{}, false
	}
	return keys.Key{ID: "k-bench-otlp", Org: otlpOrg, Role: keys.RoleIngest}, true
}

// otlpBodies are the request bodies of both passes: reports usage reports in batches
// of batch, ending before end.
func otlpBodies(reports, batch int, end time.Time) (native, spans [][]byte, err error) {
	step := time.Hour / time.Duration(reports)
	start := end.Add(-time.Hour)
	for i := 0; i < reports; i += batch {
		var nd bytes.Buffer
		td := ptrace.NewTraces()
		scopes := map[string]ptrace.ScopeSpans{}
		for j := i; j < min(i+batch, reports); j++ {
			at := start.Add(time.Duration(j) * step).UTC()
			// Eight calls make one agent step (an execution, the spans of one parent),
			// each step an agent's.
			agent := strconv.Itoa(j / 8 % otlpAgents)
			in, out, cached := int64(1000+j%500), int64(100+j%50), int64(j%400)
			fmt.Fprintf(&nd, `{"id":"bench-native-%d","type":"usage.reported","time":%q,"org_id":%q,"room_id":"conv-%d","actor":{"id":"agent-bench-%s","type":"agent"},"execution_id":"exec-%d","source":"bench","data":{"model":"claude-sonnet-4-5","input_tokens":%d,"output_tokens":%d,"cache_read_tokens":%d,"cache_write_tokens":0}}`+"\n",
				j, at.Format(time.RFC3339Nano), otlpOrg, j%200, agent, j/8, in-cached, out, cached)
			// An exporter sends the spans of one service under one resource.
			ss, ok := scopes[agent]
			if !ok {
				rs := td.ResourceSpans().AppendEmpty()
				rs.Resource().Attributes().PutStr("service.name", "svc-"+agent)
				ss = rs.ScopeSpans().AppendEmpty()
				scopes[agent] = ss
			}
			s := ss.Spans().AppendEmpty()
			s.SetTraceID(pcommon.TraceID([16]byte{0xbe, 0x0c, 4: byte(j >> 24), 5: byte(j >> 16), 6: byte(j >> 8), 7: byte(j / 8)}))
			s.SetSpanID(pcommon.SpanID([8]byte{0x5b, 4: byte(j >> 24), 5: byte(j >> 16), 6: byte(j >> 8), 7: byte(j)}))
			s.SetParentSpanID(pcommon.SpanID([8]byte{0xaa, 7: byte(j / 8)}))
			s.SetName("chat claude-sonnet-4-5")
			s.SetStartTimestamp(pcommon.NewTimestampFromTime(at.Add(-time.Second)))
			s.SetEndTimestamp(pcommon.NewTimestampFromTime(at))
			a := s.Attributes()
			a.PutStr("gen_ai.operation.name", "chat")
			a.PutStr("gen_ai.provider.name", "anthropic")
			a.PutStr("gen_ai.request.model", "claude-sonnet-4-5")
			a.PutStr("gen_ai.conversation.id", "conv-"+strconv.Itoa(j%200))
			a.PutInt("gen_ai.usage.input_tokens", in)
			a.PutInt("gen_ai.usage.output_tokens", out)
			a.PutInt("gen_ai.usage.cache_read.input_tokens", cached)
		}
		b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		if err != nil {
			return nil, nil, err
		}
		native, spans = append(native, nd.Bytes()), append(spans, b)
	}
	return native, spans, nil
}

// runOTLP runs the native pass, then the OTLP pass, and returns their rates.
func runOTLP(ctx context.Context, cfg Config, conn driver.Conn, stamp string) (*OTLPResult, error) {
	res := &OTLPResult{Reports: cfg.OTLPReports, Batch: cfg.OTLPBatch}
	native, spans, err := otlpBodies(cfg.OTLPReports, cfg.OTLPBatch, time.Now())
	if err != nil {
		return res, fmt.Errorf("cannot encode the OTLP workload: %w", err)
	}
	passes := []struct {
		name, path, ctype string
		bodies            [][]byte
		secs              *float64
	}{
		{"native collector", "/v1/events", "application/x-ndjson", native, &res.NativeSeconds},
		{"otlp receiver", "/v1/traces", "application/x-protobuf", spans, &res.OTLPSeconds},
	}
	// Interleaved rounds: what the machine does meanwhile (merges of the pass before,
	// other load) falls on both ways alike.
	for round := 1; round <= otlpRounds; round++ {
		for _, pass := range passes {
			// Labelled, so that a --cpuprofile tells the two ways apart
			// (go tool pprof -tagfocus pass=/v1/traces).
			var secs float64
			pprof.Do(ctx, pprof.Labels("pass", pass.path), func(ctx context.Context) {
				secs, err = runPass(ctx, cfg, conn, fmt.Sprintf("%s_o%s%d", stamp, pass.path[4:6], round), pass.path, pass.ctype, pass.bodies)
			})
			if err != nil {
				return res, fmt.Errorf("%s: %w", pass.name, err)
			}
			*pass.secs += secs
			cfg.Progress("otlp: round %d, %s: %d usage reports queryable in %.2f s (%.0f/s)", round, pass.name, cfg.OTLPReports, secs, float64(cfg.OTLPReports)/secs)
		}
	}
	res.Reports = cfg.OTLPReports * otlpRounds
	res.NativeReportsPerS = float64(res.Reports) / res.NativeSeconds
	res.OTLPSpansPerS = float64(res.Reports) / res.OTLPSeconds
	res.OTLPRatio = res.OTLPSpansPerS / res.NativeReportsPerS
	return res, nil
}

// runPass runs one pass on a pipeline of its own.
func runPass(ctx context.Context, cfg Config, conn driver.Conn, name, path, ctype string, bodies [][]byte) (float64, error) {
	p, err := newPipeline(ctx, cfg, conn, name)
	if err != nil {
		return 0, err
	}
	defer p.close()
	return p.throughCollector(ctx, path, ctype, bodies, uint64(cfg.OTLPReports))
}

// throughCollector serves a collector on loopback that produces to the pipeline's
// topic, posts bodies with otlpClients clients, and returns the seconds from the first
// post until n usage rows are queryable.
func (p *pipeline) throughCollector(ctx context.Context, path, ctype string, bodies [][]byte, n uint64) (float64, error) {
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: p.producer, Auth: benchKeys{},
		Registrations: benchDirectory{}, Bindings: benchDirectory{}, MaxLines: 1 << 20, Logger: p.cfg.Logger,
		MaxUploadsPerKey: otlpClients, MaxUploadsPerOrg: otlpClients})
	if err != nil {
		return 0, err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/events", c)
	mux.Handle("/v1/traces", c.TracesHandler())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	url := "http://" + ln.Addr().String() + path
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: otlpClients}, Timeout: 60 * time.Second}

	start := time.Now()
	next := make(chan []byte)
	posted := make(chan error, 1)
	var wg sync.WaitGroup
	var once sync.Once
	for range otlpClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range next {
				if err := post(ctx, client, url, ctype, b); err != nil {
					once.Do(func() { posted <- err })
					return
				}
			}
		}()
	}
	go func() {
		defer close(next)
		for _, b := range bodies {
			select {
			case next <- b:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); once.Do(func() { posted <- nil }) }()
	if err := p.waitUsage(ctx, n, posted); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds(), nil
}

func post(ctx context.Context, client *http.Client, url, ctype string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+otlpToken)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, b)
	}
	if ctype == "application/x-protobuf" {
		r := ptraceotlp.NewExportResponse()
		if err := r.UnmarshalProto(b); err != nil {
			return err
		}
		if ps := r.PartialSuccess(); ps.RejectedSpans() > 0 || ps.ErrorMessage() != "" {
			return fmt.Errorf("POST %s: %d spans rejected: %s", url, ps.RejectedSpans(), ps.ErrorMessage())
		}
	} else if bytes.Contains(b, []byte(`"rejected":`)) && !bytes.Contains(b, []byte(`"rejected":0`)) {
		return fmt.Errorf("POST %s: lines rejected: %s", url, b)
	}
	return nil
}

// waitUsage polls until the usage table holds n rows and every post has succeeded.
func (p *pipeline) waitUsage(ctx context.Context, n uint64, posted <-chan error) error {
	last, lastChange := uint64(0), time.Now()
	posting := true
	for {
		if posting {
			select {
			case err := <-posted:
				if err != nil {
					return err
				}
				posting = false
			default:
			}
		}
		var got uint64
		if err := p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".usage").Scan(&got); err != nil {
			return fmt.Errorf("cannot count %s.usage: %w", p.db, err)
		}
		if got >= n && !posting {
			return nil
		}
		if got != last {
			last, lastChange = got, time.Now()
		} else if time.Since(lastChange) > 60*time.Second {
			return fmt.Errorf("stalled at %d of %d usage rows for 60s", got, n)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}
