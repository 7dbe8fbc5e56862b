// Package otlp maps OpenTelemetry GenAI spans to canonical events: a chat, completion
// or embeddings span becomes a usage.reported event, a tool span an event.tool_call and
// its event.tool_result. The mapping is Table, one row per canonical field listing the
// attributes that set it, in the order they are tried; ingest/README.md shows the same
// table, and a test holds the two together.
//
// It knows the current GenAI semantic conventions, their deprecated names,
// OpenInference and OpenLLMetry (Traceloop). It is pure: the collector
// (ingest/collector_otlp.go) decodes the request with the Collector's pdata, calls Map,
// and holds every event it returns to the collector's rules.
//
// It may import the standard library, third-party modules and schema/ packages only
// (deploy/layers).
package otlp

// Field is a canonical field that span attributes set.
type Field int

const (
	FieldOperation Field = iota
	FieldProvider
	FieldResponseModel
	FieldRequestModel
	FieldInputTokens
	FieldOutputTokens
	FieldCacheReadTokens
	FieldCacheWriteTokens
	FieldAgentID
	FieldAgentName
	FieldConversation
	FieldToolName
	FieldToolCallID
	FieldToolArguments
	FieldToolResult
	FieldErrorType
	FieldInputMessages
	FieldOutputMessages
	numFields
)

// Row is one line of the mapping: where the value lands and the attributes that set
// it, the first one present winning.
type Row struct {
	Field      Field
	Target     string   // where the value lands in the canonical event
	Attributes []string // tried in order; the first present wins
}

// Table is the mapping. Span attributes are read first; FieldAgentID is also read from
// the resource (see Map for the identity rules).
var Table = [numFields]Row{
	{FieldOperation, "the events (see operations)", []string{"gen_ai.operation.name", "openinference.span.kind", "llm.request.type", "traceloop.span.kind"}},
	{FieldProvider, "data.otlp.provider", []string{"gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system"}},
	{FieldResponseModel, "data.model (preferred)", []string{"gen_ai.response.model", "llm.response.model"}},
	{FieldRequestModel, "data.model (else)", []string{"gen_ai.request.model", "llm.request.model", "llm.model_name"}},
	{FieldInputTokens, "data.input_tokens (minus both cache counts)", []string{"gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.usage.prompt_tokens", "llm.token_count.prompt"}},
	{FieldOutputTokens, "data.output_tokens", []string{"gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.usage.completion_tokens", "llm.token_count.completion"}},
	{FieldCacheReadTokens, "data.cache_read_tokens", []string{"gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens", "llm.token_count.prompt_details.cache_read"}},
	{FieldCacheWriteTokens, "data.cache_write_tokens", []string{"gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_creation_input_tokens", "llm.token_count.prompt_details.cache_write"}},
	{FieldAgentID, "actor, through a binding", []string{"gen_ai.agent.id"}},
	{FieldAgentName, "data.otlp.agent_name", []string{"gen_ai.agent.name", "traceloop.entity.name"}},
	{FieldConversation, "room_id", []string{"gen_ai.conversation.id", "session.id"}},
	{FieldToolName, "data.tool_name", []string{"gen_ai.tool.name", "tool.name"}},
	{FieldToolCallID, "data.tool_call_id", []string{"gen_ai.tool.call.id", "tool_call.id"}},
	{FieldToolArguments, "data.arguments (content)", []string{"gen_ai.tool.call.arguments", "tool.parameters"}},
	{FieldToolResult, "data.output (content)", []string{"gen_ai.tool.call.result"}},
	{FieldErrorType, "data.is_error, data.otlp.error_type", []string{"error.type"}},
	{FieldInputMessages, "data.otlp.input_messages (content)", []string{"gen_ai.input.messages", "llm.input_messages"}},
	{FieldOutputMessages, "data.otlp.output_messages (content)", []string{"gen_ai.output.messages", "llm.output_messages"}},
}

// Operations (gen_ai.operation.name values).
const (
	OpChat            = "chat"
	OpTextCompletion  = "text_completion"
	OpGenerateContent = "generate_content"
	OpEmbeddings      = "embeddings"
	OpInvokeAgent     = "invoke_agent"
	OpCreateAgent     = "create_agent"
	OpExecuteTool     = "execute_tool"
)

// operations maps each convention's operation value to a GenAI operation. The GenAI
// names map to themselves; OpenInference's span kinds are upper case; OpenLLMetry's
// llm.request.type and traceloop.span.kind lower case. Values not listed (a chain, a
// workflow, a retriever) are no GenAI operation bandplane records.
var operations = map[string]string{
	OpChat: OpChat, OpTextCompletion: OpTextCompletion, OpGenerateContent: OpGenerateContent, OpEmbeddings: OpEmbeddings,
	OpInvokeAgent: OpInvokeAgent, OpCreateAgent: OpCreateAgent, OpExecuteTool: OpExecuteTool,
	// OpenInference (openinference.span.kind)
	"LLM": OpChat, "EMBEDDING": OpEmbeddings, "TOOL": OpExecuteTool, "AGENT": OpInvokeAgent,
	// OpenLLMetry (llm.request.type, traceloop.span.kind)
	"completion": OpTextCompletion, "embedding": OpEmbeddings, "tool": OpExecuteTool, "agent": OpInvokeAgent,
}

// usageOps are the operations that report usage: the model calls. invoke_agent and
// create_agent spans carry the sum of their children's tokens in some runtimes, so
// counting them too would count the calls twice.
func usageOp(op string) bool {
	switch op {
	case OpChat, OpTextCompletion, OpGenerateContent, OpEmbeddings:
		return true
	}
	return false
}

// Resource attributes read for the sender's identity.
const (
	attrServiceName = "service.name"
	attrAgentID     = "gen_ai.agent.id"
)

// byAttribute is Table inverted: attribute → field.
var byAttribute = func() map[string]Field {
	m := make(map[string]Field)
	for _, r := range Table {
		for _, a := range r.Attributes {
			m[a] = r.Field
		}
	}
	return m
}()

// rank is the position of an attribute in its row: a lower rank wins.
var rank = func() map[string]int {
	m := make(map[string]int)
	for _, r := range Table {
		for i, a := range r.Attributes {
			m[a] = i
		}
	}
	return m
}()
