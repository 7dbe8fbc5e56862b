package ingest_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
)

// otlpBindings binds service "checkout" of org-acme to agent-acme.
type otlpBindings struct{}

func (otlpBindings) Bound(org, kind, value string) (string, bool) {
	if org == "org-acme" && kind == "service" && value == "checkout" {
		return "agent-acme", true
	}
	return "", false
}

func newOTLPCollector(t *testing.T, prod *fakeProducer, mod func(*ingest.CollectorConfig)) *ingest.Collector {
	t.Helper()
	return newCollector(t, prod, func(c *ingest.CollectorConfig) {
		c.Bindings = otlpBindings{}
		if mod != nil {
			mod(c)
		}
	})
}

// genAITraces is one resource of service with a chat span per entry of tokens (input,
// output, cache read), span ids 1, 2, ...; at ends them.
func genAITraces(service string, at time.Time, tokens ...[3]int64) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", service)
	ss := rs.ScopeSpans().AppendEmpty()
	for i, tk := range tokens {
		s := ss.Spans().AppendEmpty()
		s.SetName("chat gpt-5")
		s.SetTraceID(pcommon.TraceID([16]byte{0xab, 1: 1, 15: byte(i)}))
		s.SetSpanID(pcommon.SpanID([8]byte{7: byte(i + 1)}))
		s.SetStartTimestamp(pcommon.NewTimestampFromTime(at.Add(-time.Second)))
		s.SetEndTimestamp(pcommon.NewTimestampFromTime(at))
		a := s.Attributes()
		a.PutStr("gen_ai.operation.name", "chat")
		a.PutStr("gen_ai.request.model", "gpt-5")
		a.PutInt("gen_ai.usage.input_tokens", tk[0])
		a.PutInt("gen_ai.usage.output_tokens", tk[1])
		a.PutInt("gen_ai.usage.cache_read.input_tokens", tk[2])
	}
	return td
}

func protoBody(t testing.TB, td ptrace.Traces) []byte {
	t.Helper()
	b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	require.NoError(t, err)
	return b
}

type otlpAnswer struct {
	code    int
	header  http.Header
	resp    ptraceotlp.ExportResponse
	status  *spb.Status // the body of a request-wide failure
	rawBody []byte
}

func postTraces(t *testing.T, h http.Handler, token, ctype, encoding string, body []byte) otlpAnswer {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(body))
	req.Header.Set("Content-Type", ctype)
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	a := otlpAnswer{code: rec.Code, header: rec.Header(), resp: ptraceotlp.NewExportResponse(), rawBody: rec.Body.Bytes()}
	json := strings.HasPrefix(ctype, "application/json")
	if rec.Code == http.StatusOK {
		if json {
			require.NoError(t, a.resp.UnmarshalJSON(rec.Body.Bytes()))
		} else {
			require.NoError(t, a.resp.UnmarshalProto(rec.Body.Bytes()))
		}
		return a
	}
	a.status = &spb.Status{}
	if json {
		require.NoError(t, protojson.Unmarshal(rec.Body.Bytes(), a.status), rec.Body.String())
	} else {
		require.NoError(t, proto.Unmarshal(rec.Body.Bytes(), a.status))
	}
	return a
}

func TestOTLPHTTPStoresGenAIUsage(t *testing.T) {
	prod := &fakeProducer{}
	h := newOTLPCollector(t, prod, nil).TracesHandler()
	td := genAITraces("checkout", now.Add(-time.Minute), [3]int64{1000, 50, 400}, [3]int64{10, 5, 0})
	a := postTraces(t, h, "acme", "application/x-protobuf", "", protoBody(t, td))
	require.Equal(t, http.StatusOK, a.code)
	assert.Equal(t, "application/x-protobuf", a.header.Get("Content-Type"))
	assert.Equal(t, int64(0), a.resp.PartialSuccess().RejectedSpans())
	assert.Empty(t, a.resp.PartialSuccess().ErrorMessage())
	require.Len(t, prod.events, 2)
	ev := prod.events[0]
	assert.Equal(t, "agent-acme", ev.Actor.ID, "the binding names the agent")
	assert.Equal(t, "org-acme", ev.OrgID)
	var u schema.UsageData
	require.NoError(t, schema.DecodeData(ev.Data, &u))
	assert.Equal(t, int64(600), u.InputTokens, "the 400 cached tokens are not priced twice")
	assert.Equal(t, int64(400), u.CacheReadTokens)

	// JSON, gzipped, the same spans: the same event ids.
	j, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalJSON()
	require.NoError(t, err)
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(j)
	require.NoError(t, zw.Close())
	a = postTraces(t, h, "acme", "application/json", "gzip", z.Bytes())
	require.Equal(t, http.StatusOK, a.code)
	assert.Equal(t, "application/json", a.header.Get("Content-Type"))
	require.Len(t, prod.events, 4)
	assert.Equal(t, prod.events[0].ID, prod.events[2].ID, "span ids make events idempotent")
}

func TestOTLPHTTPReportsUnboundSenders(t *testing.T) {
	prod := &fakeProducer{}
	h := newOTLPCollector(t, prod, nil).TracesHandler()
	a := postTraces(t, h, "acme", "application/x-protobuf", "", protoBody(t, genAITraces("billing", now, [3]int64{1, 1, 0})))
	require.Equal(t, http.StatusOK, a.code)
	assert.Equal(t, int64(0), a.resp.PartialSuccess().RejectedSpans())
	assert.Contains(t, a.resp.PartialSuccess().ErrorMessage(), "service.name=billing were stored unattributed")
	assert.Contains(t, a.resp.PartialSuccess().ErrorMessage(), "bandplane agents bind")
	require.Len(t, prod.events, 1)
	assert.Equal(t, "otlp:billing", prod.events[0].Actor.ID)
}

func TestOTLPHTTPRejectsBadSpansAndKeepsTheGoodOnes(t *testing.T) {
	prod := &fakeProducer{}
	h := newOTLPCollector(t, prod, nil).TracesHandler()
	td := genAITraces("checkout", now, [3]int64{10, 1, 0}, [3]int64{10, 1, 0}, [3]int64{10, 1, 0}, [3]int64{5, 1, 9})
	spans := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans()
	future := now.Add(2 * time.Hour)
	spans.At(1).SetStartTimestamp(pcommon.NewTimestampFromTime(future))
	spans.At(1).SetEndTimestamp(pcommon.NewTimestampFromTime(future))
	spans.At(2).Attributes().PutStr("gen_ai.agent.id", "agent-other") // another organization's
	a := postTraces(t, h, "acme", "application/x-protobuf", "", protoBody(t, td))
	require.Equal(t, http.StatusOK, a.code)
	ps := a.resp.PartialSuccess()
	assert.Equal(t, int64(3), ps.RejectedSpans())
	assert.Contains(t, ps.ErrorMessage(), "0000000000000002: time: ", "the first problem names the span")
	assert.Contains(t, ps.ErrorMessage(), "ahead of the collector's clock")
	assert.Contains(t, ps.ErrorMessage(), "3 spans were rejected in all")
	require.Len(t, prod.events, 1, "the good span lands")
	assert.Equal(t, "otlp-ab010000000000000000000000000000-0000000000000001-usage", prod.events[0].ID)
}

func TestOTLPHTTPRequestWideFailures(t *testing.T) {
	prod := &fakeProducer{}
	c := newOTLPCollector(t, prod, func(c *ingest.CollectorConfig) { c.MaxOTLPBodyBytes = 64 << 10; c.MaxLines = 3 })
	h := c.TracesHandler()
	good := protoBody(t, genAITraces("checkout", now, [3]int64{1, 1, 0}))
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write(make([]byte, 1<<20))
	require.NoError(t, zw.Close())
	deep := strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100)

	for _, tc := range []struct {
		name, token, ctype, encoding string
		body                         []byte
		code                         int
		grpc                         codes.Code
		want                         string
	}{
		{"no key", "", "application/x-protobuf", "", good, 401, codes.Unauthenticated, "missing API key"},
		{"unknown key", "nope", "application/x-protobuf", "", good, 401, codes.Unauthenticated, "unknown or revoked"},
		{"admin key", "acme-admin", "application/x-protobuf", "", good, 403, codes.PermissionDenied, "needs the ingest role"},
		{"platform key", "s3cret", "application/json", "", []byte(`{}`), 403, codes.PermissionDenied, "spans are an organization's usage"},
		{"not OTLP", "acme", "text/plain", "", good, 415, codes.InvalidArgument, "is not an OTLP encoding"},
		{"unknown encoding", "acme", "application/x-protobuf", "br", good, 415, codes.InvalidArgument, `Content-Encoding "br"`},
		{"truncated protobuf", "acme", "application/x-protobuf", "", good[:len(good)-7], 400, codes.InvalidArgument, "cannot decode the OTLP request"},
		{"too big", "acme", "application/x-protobuf", "", make([]byte, 65<<10), 413, codes.ResourceExhausted, "larger than 65536 bytes"},
		{"gzip bomb", "acme", "application/x-protobuf", "gzip", bomb.Bytes(), 413, codes.ResourceExhausted, "inflates to more than 65536"},
		{"broken gzip", "acme", "application/x-protobuf", "gzip", []byte("nope"), 400, codes.InvalidArgument, "gzip"},
		{"deep JSON", "acme", "application/json", "", []byte(deep), 400, codes.InvalidArgument, "deeper than"},
		{"too many spans", "acme", "application/x-protobuf", "", protoBody(t, genAITraces("checkout", now, [3]int64{}, [3]int64{}, [3]int64{}, [3]int64{})), 413, codes.InvalidArgument, "more than 3 (--max-lines)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := postTraces(t, h, tc.token, tc.ctype, tc.encoding, tc.body)
			require.Equal(t, tc.code, a.code, string(a.rawBody))
			assert.Equal(t, int32(tc.grpc), a.status.GetCode())
			assert.Contains(t, a.status.GetMessage(), tc.want)
			assert.Empty(t, a.header.Get("Retry-After"), "not retryable")
		})
	}
	assert.Empty(t, prod.events)
}

// A Content-Length is no promise: a body that ends before it is refused as a failed
// read, one that says more than the limit is refused at the limit, and memory is held
// for the bytes that came, not for the length said.
func TestOTLPHTTPContentLength(t *testing.T) {
	prod := &fakeProducer{}
	c := newOTLPCollector(t, prod, func(c *ingest.CollectorConfig) { c.MaxOTLPBodyBytes = 4 << 20 })
	srv := httptest.NewServer(c.TracesHandler())
	defer srv.Close()
	good := protoBody(t, genAITraces("checkout", now, [3]int64{1, 1, 0}))
	// send writes a request by hand (Go's client never sends a body shorter than its
	// length), closes its side and reads the answer.
	send := func(length int64, body []byte) (int, string) {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		defer func() { _ = conn.Close() }()
		_, err = fmt.Fprintf(conn, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nAuthorization: Bearer acme\r\nContent-Length: %d\r\n\r\n", length)
		require.NoError(t, err)
		_, _ = conn.Write(body)
		require.NoError(t, conn.(*net.TCPConn).CloseWrite())
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, msg := send(int64(len(good))+100, good)
	assert.Equal(t, 400, code)
	assert.Contains(t, msg, "cannot read the request body: unexpected EOF")
	code, msg = send(1<<40, make([]byte, 4<<20+1))
	assert.Equal(t, 413, code)
	assert.Contains(t, msg, "larger than 4194304 bytes")
	assert.Empty(t, prod.events)
	code, _ = send(int64(len(good)), good)
	assert.Equal(t, 200, code, "the length said, and sent, is read whole")

	// Saying the limit and sending one byte costs a small buffer, not the limit.
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("x"))
	req.ContentLength = 4 << 20
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer acme")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rec := httptest.NewRecorder()
	c.TracesHandler().ServeHTTP(rec, req)
	runtime.ReadMemStats(&after)
	assert.Equal(t, 400, rec.Code)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated for a one-byte body")
}

func TestOTLPHTTPKafkaFailureIsRetryable(t *testing.T) {
	prod := &fakeProducer{err: errors.New("brokers down")}
	h := newOTLPCollector(t, prod, nil).TracesHandler()
	a := postTraces(t, h, "acme", "application/x-protobuf", "", protoBody(t, genAITraces("checkout", now, [3]int64{1, 1, 0})))
	assert.Equal(t, http.StatusServiceUnavailable, a.code)
	assert.Equal(t, "1", a.header.Get("Retry-After"))
	assert.Equal(t, int32(codes.Unavailable), a.status.GetCode())
}

func TestOTLPHTTPOrganizationsWaitForTheDirectory(t *testing.T) {
	h := newOTLPCollector(t, &fakeProducer{}, func(c *ingest.CollectorConfig) { c.RegistrationsReady = func() bool { return false } }).TracesHandler()
	a := postTraces(t, h, "acme", "application/x-protobuf", "", protoBody(t, genAITraces("checkout", now, [3]int64{1, 1, 0})))
	assert.Equal(t, http.StatusServiceUnavailable, a.code)
	assert.Equal(t, "1", a.header.Get("Retry-After"))
}

func TestOTLPHTTPMethod(t *testing.T) {
	h := newOTLPCollector(t, &fakeProducer{}, nil).TracesHandler()
	req := httptest.NewRequest(http.MethodGet, "/v1/traces", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
	assert.Equal(t, http.MethodPost, rec.Header().Get("Allow"))
}

func serveGRPC(t *testing.T, c *ingest.Collector) ptraceotlp.GRPCClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := c.GRPCServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return serveGRPCClient(t, ln.Addr().String())
}

func TestOTLPGRPC(t *testing.T) {
	prod := &fakeProducer{}
	client := serveGRPC(t, newOTLPCollector(t, prod, func(c *ingest.CollectorConfig) { c.MaxOTLPBodyBytes = 64 << 10 }))
	ctx := context.Background()
	withKey := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	td := genAITraces("checkout", now, [3]int64{100, 10, 0}, [3]int64{1, 1, 5})
	resp, err := client.Export(withKey("acme"), ptraceotlp.NewExportRequestFromTraces(td))
	require.NoError(t, err)
	assert.Equal(t, int64(1), resp.PartialSuccess().RejectedSpans())
	assert.Contains(t, resp.PartialSuccess().ErrorMessage(), "fewer than the 5 cached")
	require.Len(t, prod.events, 1)
	assert.Equal(t, "agent-acme", prod.events[0].Actor.ID)

	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  ptraceotlp.ExportRequest
		code codes.Code
		want string
	}{
		{"no key", ctx, ptraceotlp.NewExportRequestFromTraces(td), codes.Unauthenticated, "missing API key"},
		{"unknown key", withKey("nope"), ptraceotlp.NewExportRequestFromTraces(td), codes.Unauthenticated, "unknown or revoked"},
		{"platform key", withKey("s3cret"), ptraceotlp.NewExportRequestFromTraces(td), codes.PermissionDenied, "organization's usage"},
		{"too big", withKey("acme"), bigRequest(70 << 10), codes.ResourceExhausted, "larger than max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Export(tc.ctx, tc.req)
			require.Error(t, err)
			st, _ := status.FromError(err)
			assert.Equal(t, tc.code, st.Code(), st.Message())
			assert.Contains(t, st.Message(), tc.want)
		})
	}
	// The shares taken for refused and finished streams are back: a key may still send.
	for range 5 {
		_, err := client.Export(withKey("acme"), ptraceotlp.NewExportRequestFromTraces(genAITraces("checkout", now, [3]int64{1, 1, 0})))
		require.NoError(t, err)
	}
}

func bigRequest(n int) ptraceotlp.ExportRequest {
	td := genAITraces("checkout", now, [3]int64{1, 1, 0})
	td.ResourceSpans().At(0).Resource().Attributes().PutStr("padding", strings.Repeat("x", n))
	return ptraceotlp.NewExportRequestFromTraces(td)
}

// rawGRPC opens an OTLP/gRPC stream to addr by hand, with headers a gRPC client would
// not send (a deadline already passed) or a body that never comes, and returns the
// stream's grpc-status once the server ends it.
func rawGRPC(t *testing.T, addr, timeout string, body io.Reader) string {
	t.Helper()
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true) // gRPC's h2c, with prior knowledge
	tr := &http.Transport{Protocols: &protocols}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/opentelemetry.proto.collector.trace.v1.TraceService/Export", body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	req.Header.Set("Authorization", "Bearer acme")
	if timeout != "" {
		req.Header.Set("Grpc-Timeout", timeout)
	}
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	if s := resp.Header.Get("Grpc-Status"); s != "" {
		return s
	}
	return resp.Trailer.Get("Grpc-Status")
}

// A stream gRPC ends before any handler runs (its deadline passed on arrival) gives its
// uploads share back: it would otherwise lock the key out for good.
func TestOTLPGRPCEarlyAbortGivesTheShareBack(t *testing.T) {
	c := newOTLPCollector(t, &fakeProducer{}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := c.GRPCServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	for range 3 { // more than the key's share of 2
		assert.Equal(t, strconv.Itoa(int(codes.DeadlineExceeded)), rawGRPC(t, ln.Addr().String(), "1n", http.NoBody))
	}
	client := serveGRPCClient(t, ln.Addr().String())
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer acme")
	require.Eventually(t, func() bool {
		_, err := client.Export(ctx, ptraceotlp.NewExportRequestFromTraces(genAITraces("checkout", now, [3]int64{1, 1, 0})))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the key may send again")
}

// A stream that never sends its message holds the key's share at most
// OTLPStreamTimeout, as an HTTP body holds it at most --read-timeout.
func TestOTLPGRPCSilentStreamTimesOut(t *testing.T) {
	c := newOTLPCollector(t, &fakeProducer{}, func(c *ingest.CollectorConfig) { c.OTLPStreamTimeout = 300 * time.Millisecond })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := c.GRPCServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	var wg sync.WaitGroup
	for range 2 {
		pr, pw := io.Pipe()
		t.Cleanup(func() { _ = pw.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.Equal(t, strconv.Itoa(int(codes.DeadlineExceeded)), rawGRPC(t, ln.Addr().String(), "", pr))
		}()
	}
	wg.Wait() // both streams ended by the server's own deadline
	client := serveGRPCClient(t, ln.Addr().String())
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer acme")
	require.Eventually(t, func() bool {
		_, err := client.Export(ctx, ptraceotlp.NewExportRequestFromTraces(genAITraces("checkout", now, [3]int64{1, 1, 0})))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the key may send again")
}

func serveGRPCClient(t *testing.T, addr string) ptraceotlp.GRPCClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return ptraceotlp.NewGRPCClient(cc)
}

func TestOTLPLimitsMustMeanSomething(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*ingest.CollectorConfig)
		want string
	}{
		{func(c *ingest.CollectorConfig) { c.MaxOTLPBodyBytes = -1 }, "--otlp-max-body must be > 0"},
		{func(c *ingest.CollectorConfig) { c.OTLPStreamTimeout = -time.Second }, "the OTLP/gRPC timeouts must be > 0"},
		{func(c *ingest.CollectorConfig) { c.OTLPIdleTimeout = -time.Second }, "the OTLP/gRPC timeouts must be > 0"},
	} {
		cfg := ingest.CollectorConfig{Producer: &fakeProducer{}, Auth: collectorKeys}
		tc.mod(&cfg)
		_, err := ingest.NewCollector(cfg)
		assert.ErrorContains(t, err, tc.want)
	}
}
