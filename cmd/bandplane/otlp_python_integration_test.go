package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
)

// pyChatSummary is the line of JSON deploy/stacktest/otelpy/chat.py prints.
type pyChatSummary struct {
	Calls          int      `json:"calls"`
	ExportedSpans  int      `json:"exported_spans"`
	ExportFailures int      `json:"export_failures"`
	RejectedSpans  int      `json:"rejected_spans"`
	PartialSuccess []string `json:"partial_success"`
	Spans          []struct {
		Name       string         `json:"name"`
		Attributes map[string]any `json:"attributes"`
	} `json:"spans"`
}

// TestIntegrationOTLPFromPythonOpenInference runs a real Python runtime against a real
// `bandplane serve`: the openai client, instrumented by OpenInference, calls a fake
// model endpoint, and the OpenTelemetry Python SDK's OTLP/HTTP exporter sends the spans
// (openinference.span.kind LLM, llm.model_name, llm.token_count.*) to the receiver. The
// service is bound to a directory agent, so the calls come back through GraphQL as that
// agent's usage: the cached prompt tokens counted once, as cache reads, and the cost
// exact. The venv is deploy/local/otelpy.sh's (make test installs it).
func TestIntegrationOTLPFromPythonOpenInference(t *testing.T) {
	root := stacktest.RepoRoot()
	py, err := exec.Command(filepath.Join(root, "deploy/local/otelpy.sh"), "python").Output()
	if err != nil {
		t.Skipf("the OpenTelemetry Python SDK is not installed: run deploy/local/otelpy.sh install (make test does): %v", err)
	}
	python := strings.TrimSpace(string(py))

	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	ingestKey := s.key(t, "py-ingest", "org-py", keys.RoleIngest)
	admin := s.key(t, "py-admin", "org-py", keys.RoleAdmin)
	srv := s.serve(t)

	// A service name of this run's own, so that nothing another run bound or sent is
	// ever counted here.
	service := "py-runtime-" + strings.TrimPrefix(stacktest.Name(t), "t_")
	const (
		agent  = "agent-py"
		model  = "gpt-5.4"
		calls  = 3
		prompt = 1200 // tokens, cached ones included, as OpenAI reports them
		cached = 1000
		output = 80
	)
	hour := time.Now().UTC().Add(-2 * time.Hour).Format(time.RFC3339)
	code, ans := srv.post(platform, `{"id":"reg-`+agent+`","type":"agent.registered","time":"`+hour+`","org_id":"org-py","actor":{"id":"u-pia","type":"user"},`+
		`"subject":{"id":"`+agent+`","type":"agent"},"source":"test","data":{"handle":"pia/runtime","owner_id":"u-pia","model":"`+model+`"}}`)
	require.Equal(t, http.StatusOK, code, "%+v", ans)
	require.Eventually(t, func() bool {
		var n uint64
		_ = s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".directory FINAL WHERE id = ?", agent).Scan(&n)
		return n == 1
	}, 30*time.Second, 100*time.Millisecond, "the registration is stored")
	code, out, errOut := s.cli(t, "agents", "bind", "--org", "org-py", "--agent", agent, "--service", service, "--by", "ops")
	require.Equal(t, 0, code, "%s%s", out, errOut)

	// The binding reaches serve's directory through the stream: probe with a span of
	// no tokens until its answer no longer reports the sender unbound. The accepted
	// probe is an event of its own, so it names a model of its own.
	const probeModel = "bandplane-probe"
	probe := 0
	require.Eventually(t, func() bool {
		probe++
		td := otlpTraces(service, uint64(probe), time.Now().Add(-time.Minute), map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": probeModel, "gen_ai.usage.input_tokens": 0})
		a := postOTLP(t, srv, ingestKey, td)
		return a.code == http.StatusOK && !strings.Contains(a.resp.PartialSuccess().ErrorMessage(), "unattributed")
	}, 30*time.Second, 200*time.Millisecond, "the binding takes effect")

	// The fake model endpoint: a chat completion with OpenAI's usage block, cached
	// prompt tokens inside prompt_tokens.
	var served, badAuth atomic.Int64
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || (r.URL.Path != "/chat/completions" && r.URL.Path != "/v1/chat/completions") {
			http.Error(w, fmt.Sprintf(`{"error":{"message":"no route %s %s"}}`, r.Method, r.URL.Path), http.StatusNotFound)
			return
		}
		if r.Header.Get("Authorization") != "Bearer test" {
			badAuth.Add(1)
		}
		n := served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": fmt.Sprintf("chatcmpl-py-%d", n), "object": "chat.completion", "created": time.Now().Unix(), "model": model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": "ok"}}},
			"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output,
				"prompt_tokens_details": map[string]any{"cached_tokens": cached}},
		})
	}))
	t.Cleanup(fake.Close)

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, filepath.Join(root, "deploy/stacktest/otelpy/chat.py"))
	// The OpenTelemetry SDK reads OTEL_* (a service name, more headers, SDK disabled):
	// none of the caller's reaches the runtime under test.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "OPENAI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "BANDPLANE_OTLP_ENDPOINT="+srv.url+"/v1/traces", "BANDPLANE_OTLP_TOKEN="+ingestKey,
		"FAKE_OPENAI_BASE_URL="+fake.URL+"/v1", "SERVICE_NAME="+service, fmt.Sprintf("CALLS=%d", calls), "MODEL="+model)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	elapsed := time.Since(start)
	require.NoError(t, runErr, "chat.py failed after %s\nstdout: %s\nstderr: %s", elapsed, stdout.String(), tail(stderr.String(), 4000))
	var sum pyChatSummary
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(stdout.String())), &sum), "chat.py's summary: %s", stdout.String())
	t.Logf("chat.py ran in %s; spans as OpenInference sent them: %+v", elapsed.Round(time.Millisecond), sum.Spans)
	assert.Equal(t, int64(calls), served.Load(), "the fake model endpoint answered each call")
	assert.Zero(t, badAuth.Load(), "the openai client sent its api key")
	assert.Equal(t, calls, sum.ExportedSpans, "one span per call")
	assert.Zero(t, sum.ExportFailures)
	assert.Zero(t, sum.RejectedSpans, "partial success: %v", sum.PartialSuccess)

	// What bandplane relies on OpenInference sending; a change in the instrumentation
	// shows here first, before it shows as wrong costs.
	require.Len(t, sum.Spans, calls)
	for _, sp := range sum.Spans {
		assert.Equal(t, "LLM", sp.Attributes["openinference.span.kind"], "span %s", sp.Name)
		assert.Equal(t, model, sp.Attributes["llm.model_name"], "span %s", sp.Name)
		for attr, want := range map[string]float64{"llm.token_count.prompt": prompt, "llm.token_count.completion": output,
			"llm.token_count.prompt_details.cache_read": cached} {
			assert.Equal(t, want, sp.Attributes[attr], "span %s: %s", sp.Name, attr)
		}
	}

	// Costs through GraphQL: the bound agent's row, exact, each cached token priced once.
	u := schema.UsageData{InputTokens: prompt - cached, OutputTokens: output, CacheReadTokens: cached}
	per, priced := pricing.Default().CostAt(model, start, u)
	require.True(t, priced, "the built-in catalog prices %s", model)
	vars := map[string]any{"org": "org-py", "from": start.Add(-time.Hour).Format(time.RFC3339), "to": time.Now().Add(time.Hour).Format(time.RFC3339)}
	var got recCostReport
	ok := stacktest.Eventually(t, 30*time.Second, 250*time.Millisecond, func() bool {
		var d struct{ Costs recCostReport }
		recAsk(t, srv, admin, recCostsQuery, vars, &d)
		got = d.Costs
		for _, r := range d.Costs.Rows {
			if recStr(r.AgentID) == agent && recStr(r.Model) == model {
				return r.Events == calls
			}
		}
		return false
	})
	require.True(t, ok, "the Python runtime's usage reaches the cost rollup as %s: %+v", agent, got)
	for _, r := range got.Rows {
		if recStr(r.Model) == probeModel {
			// The probes: before the binding took effect as otlp:<service>, after it as
			// the agent; none has a token.
			assert.Zero(t, r.Tokens.Total+r.UnpricedTokens.Total, "the probe has no tokens: %+v", r)
			continue
		}
		require.Equal(t, model, recStr(r.Model), "the only other rows are the probes': %+v", r)
		require.Equal(t, agent, recStr(r.AgentID), "none of the runtime's usage lands unbound (as otlp:%s): %+v", service, r)
		assert.Equal(t, int64(calls), r.PricedEvents)
		assert.Zero(t, r.UnpricedEvents)
		assert.Equal(t, recTokensOf(calls*(prompt-cached), calls*output, calls*cached, 0, 0), r.Tokens, "tokens: uncached input, output, cache read")
		assert.Equal(t, calls*per, recMicros(t, recStr(r.Cost)), "cost in micros")
	}
	t.Logf("OpenInference usage of %s: %d calls, cost %d micros, tokens in/out/cache read %d/%d/%d",
		agent, calls, calls*per, calls*(prompt-cached), calls*output, calls*cached)
	srv.alive()
}
