package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
)

// otelErrors collects what the OpenTelemetry SDK reports through its global error
// handler: the exporters report a partial success there.
type otelErrors struct {
	mu   sync.Mutex
	errs []string
}

func (o *otelErrors) Handle(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err.Error())
}

func (o *otelErrors) all() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.errs...)
}

// genAICall is one model call an agent runtime reports.
type genAICall struct {
	model                             string
	input, output, cacheRead, cacheWr int64
}

// TestIntegrationOTLPReceivers points the OpenTelemetry Go SDK's own OTLP exporters
// (HTTP and gRPC) at a real `bandplane serve`: GenAI chat spans of a service bound to a
// directory agent come back through GraphQL as that agent's usage, priced exactly, the
// cached tokens counted once. A hostile request beside them (a 100k-attribute span, a
// deep AnyValue, invalid UTF-8, a future time, another organization's agent) is
// answered with partial-success errors while its good span lands, a truncated protobuf
// with 400, and the process stays up.
func TestIntegrationOTLPReceivers(t *testing.T) {
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	ingestKey := s.key(t, "otel-ingest", "org-otel", keys.RoleIngest)
	admin := s.key(t, "otel-admin", "org-otel", keys.RoleAdmin)
	grpcAddr := freePort(t)
	srv := s.serve(t, "--otlp-grpc-listen", grpcAddr, "--otlp-content")

	hour := time.Now().UTC().Add(-2 * time.Hour).Format(time.RFC3339)
	reg := func(org, owner, agent, handle string) string {
		return `{"id":"reg-` + agent + `","type":"agent.registered","time":"` + hour + `","org_id":"` + org + `","actor":{"id":"` + owner +
			`","type":"user"},"subject":{"id":"` + agent + `","type":"agent"},"source":"test","data":{"handle":"` + handle + `","owner_id":"` + owner + `","model":"gpt-5.4"}}`
	}
	code, ans := srv.post(platform, reg("org-otel", "u-ola", "agent-otel", "ola/checkout"), reg("org-foreign", "u-fay", "agent-foreign", "fay/spy"))
	require.Equal(t, http.StatusOK, code, "%+v", ans)
	require.Eventually(t, func() bool {
		var n uint64
		_ = s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".directory FINAL WHERE id IN ('agent-otel', 'agent-foreign')").Scan(&n)
		return n == 2
	}, 30*time.Second, 100*time.Millisecond, "the registrations are stored")
	code, out, errOut := s.cli(t, "agents", "bind", "--org", "org-otel", "--agent", "agent-otel", "--service", "checkout", "--by", "ops")
	require.Equal(t, 0, code, "%s%s", out, errOut)

	// The binding reaches serve's directory through the stream: probe with a span of
	// no tokens until its answer no longer reports the sender unbound.
	probe := 0
	require.Eventually(t, func() bool {
		probe++
		td := otlpTraces("checkout", uint64(probe), time.Now().Add(-time.Minute), map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-5.4", "gen_ai.usage.input_tokens": 0})
		a := postOTLP(t, srv, ingestKey, td)
		return a.code == http.StatusOK && !strings.Contains(a.resp.PartialSuccess().ErrorMessage(), "unattributed")
	}, 30*time.Second, 200*time.Millisecond, "the binding takes effect")

	errs := &otelErrors{}
	otel.SetErrorHandler(errs)
	const model = "claude-sonnet-4-5"
	viaHTTP := []genAICall{{model, 12_000, 800, 9_000, 1_000}, {model, 3_000, 150, 0, 0}, {model, 40_000, 2_000, 38_000, 0}}
	viaGRPC := []genAICall{{model, 7_777, 333, 1_111, 2_222}, {model, 100, 10, 0, 100}}
	ctx := context.Background()
	httpExp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(strings.TrimPrefix(srv.url, "http://")), otlptracehttp.WithInsecure(),
		otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer " + ingestKey}))
	require.NoError(t, err)
	grpcExp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(grpcAddr), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithHeaders(map[string]string{"authorization": "Bearer " + ingestKey}))
	require.NoError(t, err)
	at := time.Now().Add(-10 * time.Minute)
	for _, run := range []struct {
		exp   sdktrace.SpanExporter
		calls []genAICall
	}{{httpExp, viaHTTP}, {grpcExp, viaGRPC}} {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(run.exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "checkout"))))
		tr := tp.Tracer("agent-runtime")
		rctx, root := tr.Start(ctx, "invoke_agent checkout", trace.WithTimestamp(at),
			trace.WithAttributes(attribute.String("gen_ai.operation.name", "invoke_agent"), attribute.Int64("gen_ai.usage.input_tokens", 999_999)))
		for i, c := range run.calls {
			_, sp := tr.Start(rctx, "chat "+c.model, trace.WithTimestamp(at.Add(time.Duration(i)*time.Second)), trace.WithAttributes(
				attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "anthropic"),
				attribute.String("gen_ai.request.model", c.model), attribute.String("gen_ai.conversation.id", "conv-otel"),
				attribute.Int64("gen_ai.usage.input_tokens", c.input), attribute.Int64("gen_ai.usage.output_tokens", c.output),
				attribute.Int64("gen_ai.usage.cache_read.input_tokens", c.cacheRead),
				attribute.Int64("gen_ai.usage.cache_creation.input_tokens", c.cacheWr)))
			sp.End(trace.WithTimestamp(at.Add(time.Duration(i)*time.Second + 800*time.Millisecond)))
		}
		_, tool := tr.Start(rctx, "execute_tool search", trace.WithTimestamp(at), trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("gen_ai.tool.name", "search"),
			attribute.String("gen_ai.tool.call.id", "call-1")))
		tool.End(trace.WithTimestamp(at.Add(time.Second)))
		root.End(trace.WithTimestamp(at.Add(10 * time.Second)))
		require.NoError(t, tp.ForceFlush(ctx))
		require.NoError(t, tp.Shutdown(ctx))
	}
	assert.Empty(t, errs.all(), "the exporters got no error and no partial success")

	// The hostile request: one good span among five bad ones.
	good := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.usage.input_tokens": 500, "gen_ai.usage.output_tokens": 50}
	huge := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1}
	for i := range 100_000 {
		huge[fmt.Sprintf("x.%d", i)] = i
	}
	deep := any("leaf")
	for range 40 { // inside pdata's recursion limit, beyond the receiver's content depth
		deep = []any{deep}
	}
	hostile := otlpTraces("checkout", 1000, at, good,
		huge,
		map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.input.messages": deep},
		map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.request.model": "bad\xffmodel"},
		map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.agent.id": "agent-foreign"},
		map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1},
	)
	spans := hostile.ResourceSpans().At(0).ScopeSpans().At(0).Spans()
	future := time.Now().Add(3 * time.Hour)
	spans.At(5).SetStartTimestamp(pcommon.NewTimestampFromTime(future))
	spans.At(5).SetEndTimestamp(pcommon.NewTimestampFromTime(future))
	a := postOTLP(t, srv, ingestKey, hostile)
	require.Equal(t, http.StatusOK, a.code)
	assert.Equal(t, int64(5), a.resp.PartialSuccess().RejectedSpans(), a.resp.PartialSuccess().ErrorMessage())
	assert.Contains(t, a.resp.PartialSuccess().ErrorMessage(), "100002 attributes, more than the 1024")
	b, err := ptraceotlp.NewExportRequestFromTraces(otlpTraces("checkout", 2000, at, good)).MarshalProto()
	require.NoError(t, err)
	code, body := srv.do(http.MethodPost, "/v1/traces", ingestKey, "application/x-protobuf", b[:len(b)-5])
	assert.Equal(t, http.StatusBadRequest, code, "a truncated protobuf: %q", body)
	srv.alive()

	// Costs through GraphQL: exact, each cached token priced once.
	cat := pricing.Default()
	var want struct {
		micros                        int64
		input, output, cacheR, cacheW int64
	}
	for _, c := range append(append(append([]genAICall(nil), viaHTTP...), viaGRPC...), genAICall{model, 500, 50, 0, 0}) {
		u := schema.UsageData{InputTokens: c.input - c.cacheRead - c.cacheWr, OutputTokens: c.output, CacheReadTokens: c.cacheRead, CacheWriteTokens: c.cacheWr}
		m, priced := cat.CostAt(c.model, at, u)
		require.True(t, priced, "the built-in catalog prices %s", c.model)
		want.micros += m
		want.input += u.InputTokens
		want.output, want.cacheR, want.cacheW = want.output+c.output, want.cacheR+c.cacheRead, want.cacheW+c.cacheWr
	}
	vars := map[string]any{"org": "org-otel", "from": at.Add(-time.Hour).Format(time.RFC3339), "to": time.Now().Add(time.Hour).Format(time.RFC3339)}
	var got recCostReport
	ok := stacktest.Eventually(t, 30*time.Second, 250*time.Millisecond, func() bool {
		var d struct{ Costs recCostReport }
		recAsk(t, srv, admin, recCostsQuery, vars, &d)
		for _, r := range d.Costs.Rows {
			if recStr(r.AgentID) == "agent-otel" && recStr(r.Model) == model {
				got = d.Costs
				return r.Events == int64(len(viaHTTP)+len(viaGRPC)+1)
			}
		}
		return false
	})
	require.True(t, ok, "the OTLP usage reaches the cost rollup: %+v", got)
	for _, r := range got.Rows {
		if recStr(r.AgentID) != "agent-otel" || recStr(r.Model) != model {
			continue
		}
		assert.Equal(t, want.micros, recMicros(t, recStr(r.Cost)), "cost in micros")
		assert.Equal(t, want.input, r.Tokens.Input, "uncached input tokens")
		assert.Equal(t, want.output, r.Tokens.Output)
		assert.Equal(t, want.cacheR, r.Tokens.CacheRead)
		assert.Equal(t, want.cacheW, r.Tokens.CacheWrite)
	}
	t.Logf("OTLP usage of agent-otel: %d calls, cost %d micros, tokens in/out/cache read/cache write %d/%d/%d/%d",
		len(viaHTTP)+len(viaGRPC)+1, want.micros, want.input, want.output, want.cacheR, want.cacheW)

	// The tool spans became calls and results; nothing of the agent spans was counted.
	var tools uint64
	require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM "+s.db+".events FINAL WHERE source = 'otlp' AND type IN ('event.tool_call', 'event.tool_result')").Scan(&tools))
	assert.Equal(t, uint64(4), tools)
	var unbound uint64
	require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM "+s.db+".events FINAL WHERE source = 'otlp' AND actor_id = 'agent-foreign'").Scan(&unbound))
	assert.Zero(t, unbound, "another organization's agent is never written as")
	srv.alive()
}

// otlpTraces is one resource of service with a span per attribute map, in trace
// (seed, 0, ...), span ids seed+i, ending at end.
func otlpTraces(service string, seed uint64, end time.Time, spans ...map[string]any) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", service)
	ss := rs.ScopeSpans().AppendEmpty()
	for i, attrs := range spans {
		s := ss.Spans().AppendEmpty()
		id := seed + uint64(i) + 1
		s.SetTraceID(pcommon.TraceID([16]byte{0xfe, 8: byte(seed >> 8), 9: byte(seed), 15: 1}))
		s.SetSpanID(pcommon.SpanID([8]byte{0, 0, 0, 0, byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}))
		s.SetName("chat")
		s.SetStartTimestamp(pcommon.NewTimestampFromTime(end.Add(-time.Second)))
		s.SetEndTimestamp(pcommon.NewTimestampFromTime(end))
		if err := s.Attributes().FromRaw(attrs); err != nil {
			panic(err)
		}
	}
	return td
}

type otlpAnswer struct {
	code int
	resp ptraceotlp.ExportResponse
}

func postOTLP(t *testing.T, srv *server, token string, td ptrace.Traces) otlpAnswer {
	t.Helper()
	b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	require.NoError(t, err)
	code, body := srv.do(http.MethodPost, "/v1/traces", token, "application/x-protobuf", b)
	a := otlpAnswer{code: code, resp: ptraceotlp.NewExportResponse()}
	if code == http.StatusOK {
		require.NoError(t, a.resp.UnmarshalProto(body))
	}
	return a
}
