package otlp_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/bandplane/bandplane/ingest/otlp"
	"github.com/bandplane/bandplane/schema"
)

// dir binds service "checkout" and agent key "planner" in org-acme; agent-other is
// registered in org-other.
type dir struct{}

func (dir) Bound(org, kind, value string) (string, bool) {
	switch {
	case org == "org-acme" && kind == otlp.BindService && value == "checkout":
		return "agent-checkout", true
	case org == "org-acme" && kind == otlp.BindAgent && value == "planner":
		return "agent-planner", true
	}
	return "", false
}

func (dir) OrgOf(id string) (string, bool) {
	switch id {
	case "agent-checkout", "agent-planner":
		return "org-acme", true
	case "agent-other":
		return "org-other", true
	case "otlp:squatter":
		return "org-acme", true
	}
	return "", false
}

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// traces builds one resource with the given attributes and one span per attribute map.
func traces(res map[string]any, spans ...map[string]any) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	if err := rs.Resource().Attributes().FromRaw(res); err != nil {
		panic(err)
	}
	ss := rs.ScopeSpans().AppendEmpty()
	for i, a := range spans {
		s := ss.Spans().AppendEmpty()
		s.SetTraceID(pcommon.TraceID([16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}))
		s.SetSpanID(pcommon.SpanID([8]byte{0, 0, 0, 0, 0, 0, 0, byte(i + 1)}))
		s.SetParentSpanID(pcommon.SpanID([8]byte{9, 9, 9, 9, 9, 9, 9, 9}))
		s.SetName("chat claude")
		s.SetStartTimestamp(pcommon.NewTimestampFromTime(t0))
		s.SetEndTimestamp(pcommon.NewTimestampFromTime(t0.Add(1500 * time.Millisecond)))
		if err := s.Attributes().FromRaw(a); err != nil {
			panic(err)
		}
	}
	return td
}

func one(t *testing.T, r otlp.Result) otlp.Span {
	t.Helper()
	require.Len(t, r.Spans, 1)
	return r.Spans[0]
}

func usage(t *testing.T, ev schema.Event) schema.UsageData {
	t.Helper()
	require.Equal(t, schema.TypeUsageReported, ev.Type)
	require.NoError(t, ev.Validate())
	var u schema.UsageData
	require.NoError(t, json.Unmarshal(ev.Data, &u))
	return u
}

var acme = otlp.Config{Org: "org-acme", Directory: dir{}}

func TestMapsAGenAIChatSpanToUsage(t *testing.T) {
	r := otlp.Map(traces(map[string]any{"service.name": "checkout"}, map[string]any{
		"gen_ai.operation.name":                    "chat",
		"gen_ai.provider.name":                     "anthropic",
		"gen_ai.request.model":                     "claude-sonnet-4",
		"gen_ai.response.model":                    "claude-sonnet-4-20250514",
		"gen_ai.usage.input_tokens":                1000,
		"gen_ai.usage.output_tokens":               200,
		"gen_ai.usage.cache_read.input_tokens":     600,
		"gen_ai.usage.cache_creation.input_tokens": 100,
		"gen_ai.conversation.id":                   "conv-1",
		"gen_ai.input.messages":                    `[{"role":"user"}]`,
	}), acme)
	sp := one(t, r)
	require.NoError(t, sp.Problem)
	assert.Empty(t, sp.Unbound)
	require.Len(t, sp.Events, 1)
	ev := sp.Events[0]
	assert.Equal(t, "otlp-0102030405060708090a0b0c0d0e0f10-0000000000000001-usage", ev.ID)
	assert.Equal(t, schema.Party{ID: "agent-checkout", Type: schema.ActorAgent}, ev.Actor)
	assert.Equal(t, "org-acme", ev.OrgID)
	assert.Equal(t, "conv-1", ev.RoomID)
	assert.Equal(t, "otlp-0102030405060708090a0b0c0d0e0f10-0909090909090909", ev.ExecutionID)
	assert.Equal(t, otlp.Source, ev.Source)
	assert.Equal(t, t0.Add(1500*time.Millisecond), ev.Time, "usage is reported when the call ends")
	u := usage(t, ev)
	// 1000 input tokens include the 700 cached ones: each kind is priced once.
	assert.Equal(t, schema.UsageData{InputTokens: 300, OutputTokens: 200, CacheReadTokens: 600, CacheWriteTokens: 100,
		Model: "claude-sonnet-4-20250514"}, u)
	assert.Equal(t, u.InputTokens+u.CacheReadTokens+u.CacheWriteTokens, int64(1000), "no token is counted twice")
	var extra struct {
		Trigger struct{ Source string } `json:"trigger"`
		OTLP    map[string]any          `json:"otlp"`
	}
	require.NoError(t, json.Unmarshal(ev.Data, &extra))
	assert.Equal(t, "otlp:checkout", extra.Trigger.Source)
	assert.Equal(t, "anthropic", extra.OTLP["provider"])
	assert.Equal(t, "chat", extra.OTLP["operation"])
	assert.NotContains(t, extra.OTLP, "input_messages", "content is dropped unless the flag allows it")
	assert.Equal(t, "chat claude", extra.OTLP["span_name"], "a name other than the conventional one is kept")
	for _, k := range []string{"trace_id", "span_id", "parent_span_id"} {
		assert.NotContains(t, extra.OTLP, k, "the id and execution_id hold it")
	}

	withContent := acme
	withContent.Content = true
	sp = one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1,
		"gen_ai.input.messages": `[{"role":"user"}]`, "gen_ai.output.messages": []any{map[string]any{"role": "assistant"}},
	}), withContent))
	require.NoError(t, sp.Problem)
	require.NoError(t, json.Unmarshal(sp.Events[0].Data, &extra))
	assert.Equal(t, `[{"role":"user"}]`, extra.OTLP["input_messages"])
	assert.Equal(t, []any{map[string]any{"role": "assistant"}}, extra.OTLP["output_messages"])
}

func TestMapsTheOtherConventions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		attrs map[string]any
		want  schema.UsageData
	}{
		{"deprecated gen_ai names", map[string]any{"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-5",
			"gen_ai.usage.prompt_tokens": 50, "gen_ai.usage.completion_tokens": 7},
			schema.UsageData{InputTokens: 50, OutputTokens: 7, Model: "gpt-5"}},
		{"OpenInference", map[string]any{"openinference.span.kind": "LLM", "llm.model_name": "gpt-5-mini", "llm.provider": "openai",
			"llm.token_count.prompt": 120, "llm.token_count.completion": 30, "llm.token_count.prompt_details.cache_read": 100},
			schema.UsageData{InputTokens: 20, OutputTokens: 30, CacheReadTokens: 100, Model: "gpt-5-mini"}},
		{"OpenLLMetry", map[string]any{"llm.request.type": "chat", "gen_ai.request.model": "claude-haiku", "gen_ai.usage.prompt_tokens": "90",
			"gen_ai.usage.completion_tokens": 10.0, "gen_ai.usage.cache_read_input_tokens": 40, "gen_ai.usage.cache_creation_input_tokens": 20},
			schema.UsageData{InputTokens: 30, OutputTokens: 10, CacheReadTokens: 40, CacheWriteTokens: 20, Model: "claude-haiku"}},
		{"the current name wins over the deprecated one", map[string]any{"gen_ai.operation.name": "text_completion",
			"gen_ai.usage.prompt_tokens": 999, "gen_ai.usage.input_tokens": 5},
			schema.UsageData{InputTokens: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, tc.attrs), acme))
			require.NoError(t, sp.Problem)
			assert.Equal(t, tc.want, usage(t, sp.Events[0]))
		})
	}
}

func TestMapsAToolSpanToACallAndItsResult(t *testing.T) {
	td := traces(map[string]any{"service.name": "checkout"}, map[string]any{
		"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "call-7",
		"gen_ai.tool.call.arguments": `{"q":"x"}`, "error.type": "timeout",
	})
	sp := one(t, otlp.Map(td, acme))
	require.NoError(t, sp.Problem)
	require.Len(t, sp.Events, 2)
	call, result := sp.Events[0], sp.Events[1]
	require.NoError(t, call.Validate())
	require.NoError(t, result.Validate())
	assert.Equal(t, schema.TypeToolCall, call.Type)
	assert.Equal(t, t0, call.Time)
	assert.Equal(t, schema.TypeToolResult, result.Type)
	assert.Equal(t, t0.Add(1500*time.Millisecond), result.Time)
	var c schema.ToolCallData
	require.NoError(t, json.Unmarshal(call.Data, &c))
	assert.Equal(t, schema.ToolCallData{ToolName: "search", ToolCallID: "call-7"}, c, "arguments are content: dropped by default")
	var res schema.ToolResultData
	require.NoError(t, json.Unmarshal(result.Data, &res))
	assert.True(t, res.IsError)

	// OpenInference's tool span, failing by its status.
	td = traces(map[string]any{"service.name": "checkout"}, map[string]any{"openinference.span.kind": "TOOL", "tool.name": "fetch"})
	td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Status().SetCode(ptrace.StatusCodeError)
	sp = one(t, otlp.Map(td, acme))
	require.NoError(t, sp.Problem)
	require.NoError(t, json.Unmarshal(sp.Events[1].Data, &res))
	assert.Equal(t, "fetch", res.ToolName)
	assert.True(t, res.IsError)
}

func TestSkipsWhatIsNotAGenAICall(t *testing.T) {
	r := otlp.Map(traces(map[string]any{"service.name": "checkout"},
		map[string]any{"http.method": "GET"},
		map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.usage.input_tokens": 500},
		map[string]any{"gen_ai.operation.name": "chat"},
		map[string]any{"openinference.span.kind": "CHAIN"},
	), acme)
	assert.Equal(t, 4, r.Total)
	assert.Equal(t, 4, r.Skipped, "agent spans sum their calls' tokens: counting them would count twice")
	assert.Empty(t, r.Spans)
}

func TestIdentityNeedsABinding(t *testing.T) {
	chat := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 3}
	with := func(m map[string]any, kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	t.Run("bound gen_ai.agent.id on the span wins", func(t *testing.T) {
		sp := one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, with(chat, "gen_ai.agent.id", "planner")), acme))
		assert.Equal(t, "agent-planner", sp.Events[0].Actor.ID)
	})
	t.Run("a name the sender chooses is not a binding", func(t *testing.T) {
		sp := one(t, otlp.Map(traces(map[string]any{"service.name": "agent-checkout"}, with(chat, "gen_ai.agent.id", "agent-checkout")), acme))
		require.NoError(t, sp.Problem)
		assert.Equal(t, "otlp:agent-checkout", sp.Events[0].Actor.ID, "stored unattributed, never mis-attributed")
		assert.Equal(t, "gen_ai.agent.id=agent-checkout", sp.Unbound)
	})
	t.Run("unbound service", func(t *testing.T) {
		sp := one(t, otlp.Map(traces(map[string]any{}, chat), acme))
		assert.Equal(t, "otlp:unknown_service", sp.Events[0].Actor.ID)
		assert.Equal(t, "service.name=unknown_service", sp.Unbound)
	})
	t.Run("another organization's agent is refused", func(t *testing.T) {
		sp := one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, with(chat, "gen_ai.agent.id", "agent-other")), acme))
		require.Error(t, sp.Problem)
		assert.Contains(t, sp.Problem.Error(), `span gen_ai.agent.id: "agent-other" is an agent of another organization`)
		assert.Empty(t, sp.Events)
	})
	t.Run("an unbound name that is a registered id is refused", func(t *testing.T) {
		sp := one(t, otlp.Map(traces(map[string]any{"service.name": "squatter"}, chat), acme))
		require.ErrorIs(t, sp.Problem, schema.ErrInvalid)
		assert.Contains(t, sp.Problem.Error(), "bandplane agents bind")
	})
	t.Run("binding is per organization", func(t *testing.T) {
		sp := one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, chat), otlp.Config{Org: "org-other", Directory: dir{}}))
		assert.Equal(t, "otlp:checkout", sp.Events[0].Actor.ID)
	})
}

func TestRefusesHostileSpans(t *testing.T) {
	many := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1}
	for i := range otlp.MaxAttributes {
		many["x."+strings.Repeat("a", i%7)+string(rune('a'+i%26))+strings.Repeat("z", i/26)] = i
	}
	deep := any("leaf")
	for range otlp.MaxContentDepth + 1 {
		deep = []any{deep}
	}
	content := acme
	content.Content = true
	for _, tc := range []struct {
		name  string
		res   map[string]any
		attrs map[string]any
		cfg   otlp.Config
		want  string
	}{
		{"too many attributes", nil, many, acme, "attributes, more than the 1024"},
		{"cached more than input", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10,
			"gen_ai.usage.cache_read.input_tokens": 11}, acme, "gen_ai.usage.input_tokens: 10 input tokens are fewer than the 11 cached"},
		{"negative tokens", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": -1}, acme, "gen_ai.usage.output_tokens: negative"},
		{"tokens above the cap", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": int64(schema.MaxTokens) + 1}, acme, "above the cap"},
		{"fractional tokens", nil, map[string]any{"gen_ai.operation.name": "chat", "llm.token_count.prompt": 1.5}, acme, "not a whole number"},
		{"tokens as a map", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": map[string]any{}}, acme, "must be an integer, got Map"},
		{"invalid UTF-8 model", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.request.model": "gpt\xff"}, acme,
			"gen_ai.request.model: invalid UTF-8 at byte 3"},
		{"long conversation id", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.conversation.id": strings.Repeat("c", 257)}, acme,
			"gen_ai.conversation.id: 257 bytes is longer than the limit of 256"},
		{"control character in a tool name", nil, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "a\x00b"}, acme,
			"gen_ai.tool.name: control character 0x00 at byte 1"},
		{"tool span without its tool", nil, map[string]any{"gen_ai.operation.name": "execute_tool"}, acme, "gen_ai.tool.name: missing"},
		{"deep content", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.input.messages": deep}, content,
			"gen_ai.input.messages: nested deeper than 32 levels"},
		{"invalid UTF-8 content", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.output.messages": "\xc3"}, content,
			"gen_ai.output.messages: a string is not valid UTF-8"},
		{"content larger than an event", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.input.messages": strings.Repeat("a", 2<<20)}, content,
			"gen_ai.input.messages: more than 1044480 bytes as JSON"},
		{"content that escaping makes larger than an event", nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1, "gen_ai.output.messages": strings.Repeat("\x00", 300_000)}, content,
			"gen_ai.output.messages: more than 1044480 bytes as JSON"},
		{"invalid UTF-8 service", map[string]any{"service.name": "\xff"}, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1}, acme,
			"resource service.name: invalid UTF-8 at byte 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := one(t, otlp.Map(traces(tc.res, tc.attrs), tc.cfg))
			require.Error(t, sp.Problem)
			assert.Contains(t, sp.Problem.Error(), tc.want)
			assert.Contains(t, sp.Problem.Error(), "span 0102030405060708090a0b0c0d0e0f10/0000000000000001", "the problem names the span")
			assert.Empty(t, sp.Events)
		})
	}

	t.Run("missing ids and times", func(t *testing.T) {
		td := traces(nil, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1})
		s := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
		s.SetEndTimestamp(0)
		assert.Contains(t, one(t, otlp.Map(td, acme)).Problem.Error(), "end_time_unix_nano must both be set")
		s.SetEndTimestamp(s.StartTimestamp() - 1)
		assert.Contains(t, one(t, otlp.Map(td, acme)).Problem.Error(), "end_time_unix_nano is before start_time_unix_nano")
		s.SetSpanID(pcommon.NewSpanIDEmpty())
		assert.Contains(t, one(t, otlp.Map(td, acme)).Problem.Error(), "trace_id and span_id must both be set")
	})
}

func TestEventIDsAreStableAcrossRequests(t *testing.T) {
	a := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1}
	x := one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, a), acme))
	y := one(t, otlp.Map(traces(map[string]any{"service.name": "checkout"}, a), acme))
	assert.Equal(t, x.Events, y.Events, "a span sent twice is one event")
}

// TestTheREADMEShowsTheTable holds ingest/README.md's mapping table to Table.
func TestTheREADMEShowsTheTable(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	readme := string(b)
	for _, r := range otlp.Table {
		line := "| " + r.Target + " | `" + strings.Join(r.Attributes, "`, `") + "` |"
		assert.True(t, strings.Contains(readme, line), "ingest/README.md's OTLP mapping table lacks the row\n%s", line)
	}
}

// The conventional span name ("<operation> <data.model>", "execute_tool <tool>") is
// not stored: the event rebuilds it exactly. Any other name is, and a span without a
// name to keep stores "", so that absent means conventional only.
func TestConventionalSpanNameIsNotRepeated(t *testing.T) {
	chat := func(request, response string) map[string]any {
		a := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1}
		if request != "" {
			a["gen_ai.request.model"] = request
		}
		if response != "" {
			a["gen_ai.response.model"] = response
		}
		return a
	}
	tool := map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}
	for _, tc := range []struct {
		name  string
		attrs map[string]any
		want  any // the stored span_name; nil: absent
	}{
		{"chat claude", chat("claude", ""), nil},
		{"chat claude", chat("", "claude"), nil},
		{"chat gpt-4o", chat("gpt-4o", "gpt-4o-2024-08-06"), "chat gpt-4o"}, // the request model is kept through the name
		{"chat claude", chat("gpt-5", ""), "chat claude"},
		{"", chat("claude", ""), ""},
		{"chat \xff", chat("claude", ""), ""},
		{"execute_tool search", tool, nil},
		{"planner step", tool, "planner step"},
	} {
		td := traces(map[string]any{"service.name": "checkout"}, tc.attrs)
		td.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).SetName(tc.name)
		sp := one(t, otlp.Map(td, acme))
		require.NoError(t, sp.Problem)
		for _, ev := range sp.Events {
			var d struct {
				OTLP map[string]any `json:"otlp"`
			}
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			if tc.want == nil {
				assert.NotContains(t, d.OTLP, "span_name", "%q %v", tc.name, tc.attrs)
			} else {
				assert.Equal(t, tc.want, d.OTLP["span_name"], "%q %v", tc.name, tc.attrs)
			}
		}
	}
}
