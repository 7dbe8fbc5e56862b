package otlp

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	fastjson "github.com/segmentio/encoding/json"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
)

// Source is the source of every event Map makes.
const Source = "otlp"

// Bounds of what one span may carry, beyond the collector's body and event limits.
const (
	// MaxAttributes bounds the attributes of one span and of one resource (the
	// OpenTelemetry SDKs' default attribute count limit is 128; runtimes that record
	// content stay far below this).
	MaxAttributes = 1024
	// MaxTextBytes bounds every name, model, provider and id read from an attribute:
	// schema.MaxIDBytes, the limit of the fields they land in.
	MaxTextBytes = schema.MaxIDBytes
	// MaxContentDepth bounds the nesting of a content attribute (an AnyValue map or
	// list) stored under data: it lands at level 4 of the event (data.otlp.x), far
	// inside schema.MaxDepth.
	MaxContentDepth = 32
	// MaxContentBytes bounds one content attribute as JSON: what one Kafka message
	// carries. Encoding stops as soon as it is passed, so no attribute costs more than
	// that (escaping can make JSON six times its string).
	MaxContentBytes = kafka.MaxEventBytes
)

// The kinds of binding (schema.BindingData.Kind): a gen_ai.agent.id value, or a
// resource's service.name.
const (
	BindAgent   = schema.BindingAgent
	BindService = schema.BindingService
)

// Directory answers who a span's sender is. *directory.Directory implements it.
type Directory interface {
	// Bound is the agent an operator bound a sender identity of org to (kind BindAgent
	// or BindService), if it is a registered agent of org.
	Bound(org, kind, value string) (agentID string, ok bool)
	// OrgOf is the organization an agent or person is registered in.
	OrgOf(id string) (org string, known bool)
}

// Config is what Map needs beyond the spans.
type Config struct {
	Org       string    // the key's organization: every event is its
	Directory Directory // nil: no sender is bound
	// Content stores prompts, completions, tool arguments and results (gen_ai.input.messages
	// and the like). Off, they are dropped: they are often personal data.
	Content bool
}

// Span is what one GenAI span maps to: its events, or the problem that refuses it.
type Span struct {
	Ref     string // "<trace id>/<span id>", for messages
	Name    string
	Events  []schema.Event
	Problem error
	// Unbound is the sender identity that no binding matched ("service.name=checkout"),
	// when the events are stored unattributed.
	Unbound string
}

// Result is what Map makes of a request.
type Result struct {
	Spans []Span // the GenAI spans: mapped, or refused with a problem
	Total int    // spans in the request
	// Skipped counts the spans that record nothing bandplane keeps: no GenAI operation
	// (an HTTP call, a chain, a retriever), an agent span (its calls are their own
	// spans), or a model call without token counts.
	Skipped int
}

// Map maps the GenAI spans of td to canonical events of cfg.Org. The events are not
// yet held to the collector's rules (its time window, the writer's rights, the event
// size); their ids are derived from the span ids, so a span sent twice is one event.
//
// Identity: the actor is the agent an explicit binding names (Directory.Bound), tried
// for the span's gen_ai.agent.id, the resource's gen_ai.agent.id, then the resource's
// service.name. Without one the events are stored unattributed, as the agent
// "otlp:<service.name>", and Span.Unbound says so; a gen_ai.agent.id that names an
// agent registered in another organization refuses the span.
func Map(td ptrace.Traces, cfg Config) Result {
	var out Result
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		res := readResource(rs.Resource())
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			spans := sss.At(j).Spans()
			for k := 0; k < spans.Len(); k++ {
				out.Total++
				sp, ok := mapSpan(spans.At(k), &res, &cfg)
				if !ok {
					out.Skipped++
					continue
				}
				out.Spans = append(out.Spans, sp)
			}
		}
	}
	return out
}

// resource is what Map reads of a resource.
type resource struct {
	service string // service.name, "unknown_service" when absent (as the SDKs default)
	agentID string // gen_ai.agent.id
	problem string // why every span of the resource is refused
}

func readResource(r pcommon.Resource) resource {
	res := resource{service: "unknown_service"}
	attrs := r.Attributes()
	if n := attrs.Len(); n > MaxAttributes {
		res.problem = fmt.Sprintf("resource: %d attributes, more than the %d a resource may have", n, MaxAttributes)
		return res
	}
	if v, ok := attrs.Get(attrServiceName); ok {
		s, p := text(v)
		if p != "" {
			res.problem = "resource " + attrServiceName + ": " + p
			return res
		}
		if s != "" {
			res.service = s
		}
	}
	if v, ok := attrs.Get(attrAgentID); ok {
		s, p := text(v)
		if p != "" {
			res.problem = "resource " + attrAgentID + ": " + p
			return res
		}
		res.agentID = s
	}
	return res
}

// attrs are a span's attributes that Table names, the first of each row present.
type attrs struct {
	v    [numFields]pcommon.Value
	name [numFields]string
	has  [numFields]bool
}

func (a *attrs) read(m pcommon.Map) {
	m.Range(func(k string, v pcommon.Value) bool {
		f, ok := byAttribute[k]
		if !ok {
			return true
		}
		// The first of a row's attributes in Table order wins; of one attribute sent
		// twice, the first occurrence (as pdata's Get reads it).
		if a.has[f] && rank[a.name[f]] <= rank[k] {
			return true
		}
		a.v[f], a.name[f], a.has[f] = v, k, true
		return true
	})
}

// spanProblem refuses a span, naming it and the attribute at fault.
type spanProblem struct {
	ref, name, reason string
}

func (p *spanProblem) Error() string {
	return fmt.Sprintf("span %s (%s): %s", p.ref, quote(p.name), p.reason)
}

func (p *spanProblem) Is(target error) bool { return target == schema.ErrInvalid }

// mapSpan maps one span; ok is false for a span that records nothing (Result.Skipped).
func mapSpan(s ptrace.Span, res *resource, cfg *Config) (sp Span, ok bool) {
	trace, spanID := s.TraceID().String(), s.SpanID().String()
	ref := trace + "/" + spanID
	name := s.Name()
	if !utf8.ValidString(name) || len(name) > MaxTextBytes {
		name = "" // named by its ids alone
	}
	sp = Span{Ref: ref, Name: name}
	refuse := func(format string, args ...any) (Span, bool) {
		sp.Problem = &spanProblem{ref: ref, name: name, reason: fmt.Sprintf(format, args...)}
		sp.Events = nil
		return sp, true
	}
	m := s.Attributes()
	if n := m.Len(); n > MaxAttributes {
		return refuse("%d attributes, more than the %d a span may have", n, MaxAttributes)
	}
	var a attrs
	a.read(m)
	op, known := a.operation()
	if !known {
		return sp, false
	}
	if op == OpInvokeAgent || op == OpCreateAgent {
		return sp, false
	}
	if res.problem != "" {
		return refuse("%s", res.problem)
	}
	if s.TraceID().IsEmpty() || s.SpanID().IsEmpty() {
		return refuse("trace_id and span_id must both be set: they are the events' ids")
	}
	start, end := s.StartTimestamp(), s.EndTimestamp()
	if start == 0 || end == 0 {
		return refuse("start_time_unix_nano and end_time_unix_nano must both be set")
	}
	if end < start {
		return refuse("end_time_unix_nano is before start_time_unix_nano")
	}
	if end > math.MaxInt64 {
		return refuse("end_time_unix_nano %d is outside the times an event may have", uint64(end))
	}

	var texts [numFields]string
	for _, f := range [...]Field{FieldProvider, FieldResponseModel, FieldRequestModel, FieldAgentID, FieldAgentName,
		FieldConversation, FieldToolName, FieldToolCallID, FieldErrorType} {
		if !a.has[f] {
			continue
		}
		t, p := text(a.v[f])
		if p != "" {
			return refuse("%s: %s", a.name[f], p)
		}
		texts[f] = t
	}

	actor, unbound, problem := identify(texts[FieldAgentID], res, cfg)
	if problem != "" {
		return refuse("%s", problem)
	}
	sp.Unbound = unbound

	execution := "otlp-" + trace
	if parent := s.ParentSpanID(); !parent.IsEmpty() {
		execution += "-" + parent.String()
	}
	block := block{Service: res.service, Operation: op, Provider: texts[FieldProvider], AgentName: texts[FieldAgentName],
		ErrorType: texts[FieldErrorType]}
	base := schema.Event{OrgID: cfg.Org, RoomID: texts[FieldConversation], Actor: actor, ExecutionID: execution,
		Source: Source, SchemaVersion: schema.Version}
	trig := trigger{Source: "otlp:" + res.service}
	if len(trig.Source) > MaxTextBytes {
		trig.Source = trig.Source[:MaxTextBytes]
	}
	// event is one of the span's events: its id the span's and its kind, its data the
	// type's with where it came from (spanData).
	event := func(kind, typ string, at pcommon.Timestamp, data any) schema.Event {
		ev := base
		ev.ID, ev.Type, ev.Time, ev.Data = "otlp-"+trace+"-"+spanID+"-"+kind, typ, eventTime(at), mustJSON(data)
		return ev
	}

	if usageOp(op) {
		var u schema.UsageData
		counted := false
		for _, c := range [...]struct {
			f   Field
			dst *int64
		}{{FieldInputTokens, &u.InputTokens}, {FieldOutputTokens, &u.OutputTokens},
			{FieldCacheReadTokens, &u.CacheReadTokens}, {FieldCacheWriteTokens, &u.CacheWriteTokens}} {
			if !a.has[c.f] {
				continue
			}
			n, p := tokens(a.v[c.f])
			if p != "" {
				return refuse("%s: %s", a.name[c.f], p)
			}
			*c.dst, counted = n, true
		}
		if !counted {
			return sp, false
		}
		// The conventions count cached tokens inside the input tokens; bandplane's
		// input_tokens are the uncached ones, each kind priced once.
		if cached := u.CacheReadTokens + u.CacheWriteTokens; u.InputTokens < cached {
			return refuse("%s: %d input tokens are fewer than the %d cached ones they include (cache read %d, cache write %d)",
				a.name[FieldInputTokens], u.InputTokens, cached, u.CacheReadTokens, u.CacheWriteTokens)
		} else {
			u.InputTokens -= cached
		}
		u.Model = texts[FieldResponseModel]
		if u.Model == "" {
			u.Model = texts[FieldRequestModel]
		}
		block.SpanName = spanName(name, op+" "+u.Model)
		if cfg.Content {
			var p string
			if block.InputMessages, p = a.content(FieldInputMessages); p != "" {
				return refuse("%s", p)
			}
			if block.OutputMessages, p = a.content(FieldOutputMessages); p != "" {
				return refuse("%s", p)
			}
		}
		sp.Events = []schema.Event{event("usage", schema.TypeUsageReported, end,
			struct {
				schema.UsageData
				spanData
			}{u, spanData{trig, block}})}
		return sp, true
	}

	// execute_tool: the call when it starts, its result when it ends.
	tool := texts[FieldToolName]
	if tool == "" {
		return refuse("%s: missing: a tool span names its tool", Table[FieldToolName].Attributes[0])
	}
	block.SpanName = spanName(name, op+" "+tool)
	call := schema.ToolCallData{ToolName: tool, ToolCallID: texts[FieldToolCallID]}
	result := schema.ToolResultData{ToolName: tool, ToolCallID: call.ToolCallID,
		IsError: texts[FieldErrorType] != "" || s.Status().Code() == ptrace.StatusCodeError}
	if cfg.Content {
		var p string
		if call.Arguments, p = a.content(FieldToolArguments); p != "" {
			return refuse("%s", p)
		}
		if result.Output, p = a.content(FieldToolResult); p != "" {
			return refuse("%s", p)
		}
	}
	sp.Events = []schema.Event{
		event("tool_call", schema.TypeToolCall, start, struct {
			schema.ToolCallData
			spanData
		}{call, spanData{trig, block}}),
		event("tool_result", schema.TypeToolResult, end, struct {
			schema.ToolResultData
			spanData
		}{result, spanData{trig, block}}),
	}
	return sp, true
}

// operation is the span's GenAI operation; known is false when it has none bandplane
// records.
func (a *attrs) operation() (op string, known bool) {
	if !a.has[FieldOperation] || a.v[FieldOperation].Type() != pcommon.ValueTypeStr {
		return "", false
	}
	op, known = operations[a.v[FieldOperation].Str()]
	return op, known
}

// identify is the span's actor: a bound agent, or the unattributed sender.
func identify(spanAgent string, res *resource, cfg *Config) (actor schema.Party, unbound, problem string) {
	for _, c := range [...]struct {
		where, kind, value string
	}{{"span", BindAgent, spanAgent}, {"resource", BindAgent, res.agentID}, {"resource", BindService, res.service}} {
		if c.value == "" || cfg.Directory == nil {
			continue
		}
		if c.kind == BindAgent {
			// A sender may not even name another organization's agent.
			if org, known := cfg.Directory.OrgOf(c.value); known && org != cfg.Org {
				return actor, "", fmt.Sprintf("%s %s: %s is an agent of another organization than the key's (%s)",
					c.where, attrAgentID, quote(c.value), quote(cfg.Org))
			}
		}
		if id, ok := cfg.Directory.Bound(cfg.Org, c.kind, c.value); ok {
			return schema.Party{ID: id, Type: schema.ActorAgent}, "", ""
		}
	}
	id := schema.UnboundSenderPrefix + res.service
	if len(id) > MaxTextBytes {
		return actor, "", fmt.Sprintf("resource %s: %d bytes is longer than the %d an unbound sender's name may have",
			attrServiceName, len(res.service), MaxTextBytes-len(schema.UnboundSenderPrefix))
	}
	if cfg.Directory != nil {
		if _, known := cfg.Directory.OrgOf(id); known {
			return actor, "", fmt.Sprintf("resource %s: the unbound sender %s is the id of a registered party; bind the service (bandplane agents bind)", attrServiceName, quote(id))
		}
	}
	unbound = attrServiceName + "=" + res.service
	if spanAgent != "" {
		unbound = attrAgentID + "=" + spanAgent
	} else if res.agentID != "" {
		unbound = attrAgentID + "=" + res.agentID
	}
	return schema.Party{ID: id, Type: schema.ActorAgent}, unbound, ""
}

// trigger is the explicit trigger of an OTLP event (schema/cause, rule 2): the
// sending service, outside chat.
type trigger struct {
	Source string `json:"source"`
}

// block is data.otlp: where the event came from. The trace, span and parent span ids
// are not repeated in it: the event's id and execution_id hold them.
type block struct {
	Service        string          `json:"service"`
	Operation      string          `json:"operation"`
	Provider       string          `json:"provider,omitempty"`
	AgentName      string          `json:"agent_name,omitempty"`
	SpanName       *string         `json:"span_name,omitempty"` // see spanName
	ErrorType      string          `json:"error_type,omitempty"`
	InputMessages  json.RawMessage `json:"input_messages,omitempty"`
	OutputMessages json.RawMessage `json:"output_messages,omitempty"`
}

// spanData is what every event's data of a span carries besides its type's fields.
type spanData struct {
	Trigger trigger `json:"trigger"`
	OTLP    block   `json:"otlp"`
}

// spanName is data.otlp.span_name: absent when the span's name is the conventional one
// (conventional: "<operation> <data.model>", "execute_tool <data.tool_name>"), which
// the event rebuilds exactly; "" when the span had no name to keep (empty, not UTF-8,
// or too long); else the name.
func spanName(name, conventional string) *string {
	if name == conventional {
		return nil
	}
	return &name
}

func mustJSON(v any) json.RawMessage {
	b, err := fastjson.Marshal(v)
	if err != nil {
		// Only strings checked for UTF-8, numbers and raw JSON Map built itself.
		panic(fmt.Sprintf("otlp: cannot encode event data: %v", err))
	}
	return b
}

// eventTime is a span timestamp as an event time: UTC, to the millisecond the trail
// stores.
func eventTime(t pcommon.Timestamp) time.Time {
	return t.AsTime().UTC().Truncate(time.Millisecond)
}

// text reads a name or id attribute: a string (or an integer, which some runtimes send
// for ids) of at most MaxTextBytes of valid UTF-8 without control characters. The
// problem is "" when it is fine.
func text(v pcommon.Value) (string, string) {
	var s string
	switch v.Type() {
	case pcommon.ValueTypeStr:
		s = v.Str()
	case pcommon.ValueTypeInt:
		s = strconv.FormatInt(v.Int(), 10)
	default:
		return "", "must be a string, got " + v.Type().String()
	}
	if len(s) > MaxTextBytes {
		return "", fmt.Sprintf("%d bytes is longer than the limit of %d", len(s), MaxTextBytes)
	}
	if p := schema.IDProblem(s); p != "" {
		return "", p
	}
	return s, ""
}

// tokens reads a token count: an integer, an integral double, or a string of digits
// (runtimes send all three), in [0, schema.MaxTokens].
func tokens(v pcommon.Value) (int64, string) {
	var n int64
	switch v.Type() {
	case pcommon.ValueTypeInt:
		n = v.Int()
	case pcommon.ValueTypeDouble:
		d := v.Double()
		if d != math.Trunc(d) || math.IsInf(d, 0) || d < -1 || d > schema.MaxTokens+1 {
			return 0, fmt.Sprintf("%v is not a whole number of tokens in [0, %d]", d, schema.MaxTokens)
		}
		n = int64(d)
	case pcommon.ValueTypeStr:
		var err error
		if n, err = strconv.ParseInt(v.Str(), 10, 64); err != nil {
			return 0, fmt.Sprintf("%s is not a whole number of tokens", quote(v.Str()))
		}
	default:
		return 0, "must be an integer, got " + v.Type().String()
	}
	if n < 0 {
		return 0, fmt.Sprintf("negative token count %d", n)
	}
	if n > schema.MaxTokens {
		return 0, fmt.Sprintf("%d is above the cap of %d tokens", n, schema.MaxTokens)
	}
	return n, ""
}

// content is a content attribute as JSON (nil when absent): a string stays a JSON
// string (runtimes send messages JSON-encoded), a map or list becomes JSON, bounded to
// MaxContentDepth levels. The problem names the attribute.
func (a *attrs) content(f Field) (json.RawMessage, string) {
	if !a.has[f] {
		return nil, ""
	}
	var b []byte
	b, p := appendValue(b, a.v[f], 1)
	if p == "" && len(b) > MaxContentBytes {
		p = fmt.Sprintf("more than %d bytes as JSON, more than one event may carry", MaxContentBytes)
	}
	if p != "" {
		return nil, a.name[f] + ": " + p
	}
	return b, ""
}

func appendValue(b []byte, v pcommon.Value, depth int) ([]byte, string) {
	if depth > MaxContentDepth {
		return nil, fmt.Sprintf("nested deeper than %d levels", MaxContentDepth)
	}
	if len(b) > MaxContentBytes {
		return nil, fmt.Sprintf("more than %d bytes as JSON, more than one event may carry", MaxContentBytes)
	}
	switch v.Type() {
	case pcommon.ValueTypeStr:
		s := v.Str()
		if len(b)+len(s) > MaxContentBytes {
			return nil, fmt.Sprintf("more than %d bytes as JSON, more than one event may carry", MaxContentBytes)
		}
		if !utf8.ValidString(s) {
			return nil, "a string is not valid UTF-8"
		}
		return appendString(b, s), ""
	case pcommon.ValueTypeInt:
		return strconv.AppendInt(b, v.Int(), 10), ""
	case pcommon.ValueTypeDouble:
		d := v.Double()
		if math.IsNaN(d) || math.IsInf(d, 0) {
			return append(b, "null"...), ""
		}
		return strconv.AppendFloat(b, d, 'g', -1, 64), ""
	case pcommon.ValueTypeBool:
		return strconv.AppendBool(b, v.Bool()), ""
	case pcommon.ValueTypeMap:
		b = append(b, '{')
		var p string
		first := true
		seen := make(map[string]struct{}, v.Map().Len())
		v.Map().Range(func(k string, e pcommon.Value) bool {
			if _, dup := seen[k]; dup {
				return true // JSON objects have unique keys: the first wins, as in Get
			}
			seen[k] = struct{}{}
			if !utf8.ValidString(k) {
				p = "a key is not valid UTF-8"
				return false
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendString(b, k)
			b = append(b, ':')
			b, p = appendValue(b, e, depth+1)
			return p == ""
		})
		if p != "" {
			return nil, p
		}
		return append(b, '}'), ""
	case pcommon.ValueTypeSlice:
		b = append(b, '[')
		sl := v.Slice()
		for i := 0; i < sl.Len(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			var p string
			if b, p = appendValue(b, sl.At(i), depth+1); p != "" {
				return nil, p
			}
		}
		return append(b, ']'), ""
	case pcommon.ValueTypeBytes:
		if len(b)+2*v.Bytes().Len() > MaxContentBytes {
			return nil, fmt.Sprintf("more than %d bytes as JSON, more than one event may carry", MaxContentBytes)
		}
		return appendString(b, fmt.Sprintf("%x", v.Bytes().AsRaw())), ""
	default:
		return append(b, "null"...), ""
	}
}

// appendString appends s, valid UTF-8, as a JSON string.
func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

// quote quotes s for a message, cut to 64 bytes.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strconv.Quote(s)
}
