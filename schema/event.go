// Package schema owns bandplane's event contract: the canonical, versioned event
// envelope, its per-type data, the mapping from the platform's own frames, validation,
// and the kinds of error every surface reports (errors.go). The ClickHouse tables the
// events land in are schema/chdb's migrations.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package schema

import (
	"encoding/json"
	"time"
)

// Version is the schema_version this build writes. Decoders accept any version up to it.
const Version = 1

// ActorType is the kind of party that acted or was acted upon.
type ActorType string

const (
	ActorAgent  ActorType = "agent"
	ActorUser   ActorType = "user"
	ActorSystem ActorType = "system"
)

// Party is the actor of an event, or its subject (the other party, where there is one).
type Party struct {
	ID     string    `json:"id"`
	Type   ActorType `json:"type,omitempty"`
	Handle string    `json:"handle,omitempty"` // without the leading '@'
}

// Event is the canonical envelope. Every event in Kafka and in the audit trail has this
// shape; Data holds the per-type fields (see the *Data types) and any unknown extra
// fields, kept as they came.
type Event struct {
	ID            string          `json:"id"`
	Type          string          `json:"type"`
	Time          time.Time       `json:"time"` // UTC, RFC 3339
	OrgID         string          `json:"org_id,omitempty"`
	RoomID        string          `json:"room_id,omitempty"`
	Actor         Party           `json:"actor"`
	Subject       *Party          `json:"subject,omitempty"`
	ExecutionID   string          `json:"execution_id,omitempty"`
	Source        string          `json:"source"`
	SchemaVersion int             `json:"schema_version"`
	Data          json.RawMessage `json:"data,omitempty"`
}

// Key is the Kafka partition key: the room, so that a room's events stay in order, or the
// organization for events that belong to no room. Platform frames outside rooms carry
// no organization (ingest enriches it later), so they fall back to the actor, then the
// subject, which keeps each agent's contact and control events in order.
func (e *Event) Key() string {
	switch {
	case e.RoomID != "":
		return e.RoomID
	case e.OrgID != "":
		return e.OrgID
	case e.Actor.ID != "":
		return e.Actor.ID
	case e.Subject != nil:
		return e.Subject.ID
	}
	return ""
}

// Event types. Platform frames map `<noun>_<verb>` to `<noun>.<verb>`; see band.go.
const (
	TypeMessageCreated         = "message.created"
	TypeMessageUpdated         = "message.updated"
	TypeMessageDeleted         = "message.deleted"
	TypeToolCall               = "event.tool_call"
	TypeToolResult             = "event.tool_result"
	TypeThought                = "event.thought"
	TypeError                  = "event.error"
	TypeTask                   = "event.task"
	TypeAttention              = "event.attention"
	TypeUsageReported          = "usage.reported"
	TypeParticipantAdded       = "participant.added"
	TypeParticipantRemoved     = "participant.removed"
	TypeRoomAdded              = "room.added"
	TypeRoomRemoved            = "room.removed"
	TypeRoomDeleted            = "room.deleted"
	TypeContactAdded           = "contact.added"
	TypeContactRemoved         = "contact.removed"
	TypeContactRequestReceived = "contact.request_received"
	TypeContactRequestUpdated  = "contact.request_updated"
	TypeAgentControl           = "agent.control"
	TypeTaskCreated            = "task.created"
	TypeTaskUpdated            = "task.updated"
	TypeTaskDeleted            = "task.deleted"
	TypeUserRegistered         = "user.registered"
	TypeAgentRegistered        = "agent.registered"
	TypeAgentUpdated           = "agent.updated"
	TypePolicyDecided          = "policy.decided"
	// A hot reload the replay gate refused (policy/api.GateRefusal as data):
	// bandplane's own, like every policy.* type.
	TypePolicyReloadRefused = "policy.reload_refused"
	// An operator's suspension of an agent and its lifting (bandplane's own; see
	// OwnType). Only these change the operator's suspension; agent.updated never does.
	TypeAgentSuspended = "agent.suspended"
	TypeAgentResumed   = "agent.resumed"
	TypeKeyCreated     = "key.created"
	TypeKeyRevoked     = "key.revoked"
	TypeAuditSealed    = "audit.sealed"
	// A manager's budget (policy.Budget as data), its removal, and spend crossing 80 %
	// or 100 % of it (policy.Crossing as data): bandplane's own, from the policy side.
	TypeBudgetSet     = "budget.set"
	TypeBudgetDeleted = "budget.deleted"
	TypeBudgetCrossed = "budget.crossed"
	// An operator's binding of a sender's identity (an OpenTelemetry service.name or
	// gen_ai.agent.id) to a directory agent, and its removal (bandplane's own; see
	// OwnType, BindingData). Spans are attributed to an agent only through one.
	TypeAgentBound   = "agent.bound"
	TypeAgentUnbound = "agent.unbound"
)

// Mention is one @mention of a message.
type Mention struct {
	ID     string `json:"id"`
	Handle string `json:"handle"` // without '@'
}

// MessageData is the data of message.* events and of the non-text room events
// (event.thought, event.error, event.task, event.attention).
type MessageData struct {
	Content     string    `json:"content"`
	MessageType string    `json:"message_type,omitempty"`
	Mentions    []Mention `json:"mentions,omitempty"`
	ThreadID    string    `json:"thread_id,omitempty"`
	// MessageID is the platform's id of the message (a frame's payload.id); the event's
	// own id is derived from the whole frame, so an edit gets a new event id.
	MessageID string `json:"message_id,omitempty"`
	// Extra holds the payload fields the mapping does not know, as they came.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// ToolCallData is the data of event.tool_call.
type ToolCallData struct {
	ToolName   string          `json:"tool_name"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Arguments  json.RawMessage `json:"arguments,omitempty"`
	MessageID  string          `json:"message_id,omitempty"`
	Extra      json.RawMessage `json:"extra,omitempty"`
}

// ToolResultData is the data of event.tool_result.
type ToolResultData struct {
	ToolName   string          `json:"tool_name,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	IsError    bool            `json:"is_error"`
	Output     json.RawMessage `json:"output,omitempty"`
	MessageID  string          `json:"message_id,omitempty"`
	Extra      json.RawMessage `json:"extra,omitempty"`
}

// UsageData is the data of usage.reported. ReasoningTokens and Model are set only when
// the sender knows them; the model is otherwise taken from the agent's registration.
type UsageData struct {
	InputTokens      int64  `json:"input_tokens"`
	OutputTokens     int64  `json:"output_tokens"`
	CacheReadTokens  int64  `json:"cache_read_tokens"`
	CacheWriteTokens int64  `json:"cache_write_tokens"`
	ReasoningTokens  *int64 `json:"reasoning_tokens,omitempty"`
	Model            string `json:"model,omitempty"`
	MessageID        string `json:"message_id,omitempty"`
	// Extra holds the payload fields the mapping does not know, as they came.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// ContactData is the data of contact.* events.
type ContactData struct {
	Status     string `json:"status,omitempty"` // pending | approved | rejected | cancelled
	RequestID  string `json:"request_id,omitempty"`
	FromHandle string `json:"from_handle,omitempty"`
	ToHandle   string `json:"to_handle,omitempty"`
	Handle     string `json:"handle,omitempty"` // the contact, for contact.added/removed
	Message    string `json:"message,omitempty"`
	// IsRemote is set when the platform says (is_remote, or its legacy alias is_external).
	IsRemote *bool `json:"is_remote,omitempty"`
	// Extra holds the payload fields the mapping does not know, as they came.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// AgentData is the data of agent.registered and agent.updated, sent by the routing core
// in canonical form (the platform's frames carry no owner, organization or model). The
// agent is the event's subject; the organization is the envelope's org_id.
type AgentData struct {
	Handle                 string `json:"handle"` // owner/slug
	Name                   string `json:"name,omitempty"`
	OwnerID                string `json:"owner_id"`
	Model                  string `json:"model,omitempty"`
	Description            string `json:"description,omitempty"`
	PersonalRegistryAccess bool   `json:"personal_registry_access"`
	SharedWithOrg          bool   `json:"shared_with_org"`
	Global                 bool   `json:"global"`
	Listed                 bool   `json:"listed"`
	Suspended              bool   `json:"suspended"`
}

// UserData is the data of user.registered; the person is the event's subject.
type UserData struct {
	Handle string `json:"handle"`
	Name   string `json:"name,omitempty"`
}

// TaskData is the data of task.* events.
type TaskData struct {
	TaskID   string `json:"task_id"`
	Title    string `json:"title,omitempty"`
	Status   string `json:"status,omitempty"`
	Assignee string `json:"assignee_id,omitempty"`
	// Extra holds the payload fields the mapping does not know, as they came.
	Extra json.RawMessage `json:"extra,omitempty"`
}

// ParticipantData is the data of participant.added and participant.removed; the
// participant is also the event's subject.
type ParticipantData struct {
	ParticipantID   string    `json:"participant_id"`
	Name            string    `json:"name,omitempty"`
	ParticipantType ActorType `json:"participant_type,omitempty"`
	Handle          string    `json:"handle,omitempty"` // without '@'
	// IsRemote is set when the platform says (is_remote, or its legacy alias is_external).
	IsRemote *bool           `json:"is_remote,omitempty"`
	Extra    json.RawMessage `json:"extra,omitempty"`
}

// RoomData is the data of room.added, room.removed and room.deleted; the room is the
// envelope's room_id.
type RoomData struct {
	Title  string          `json:"title,omitempty"`
	TaskID string          `json:"task_id,omitempty"`
	Status string          `json:"status,omitempty"`
	Extra  json.RawMessage `json:"extra,omitempty"`
}

// AgentControlData is the data of agent.control; the controlled agent is the actor.
type AgentControlData struct {
	Action string          `json:"action,omitempty"`
	Extra  json.RawMessage `json:"extra,omitempty"`
}

// UnboundSenderPrefix starts the actor id of the events of an OpenTelemetry sender no
// binding names ("otlp:<service.name>"): unattributed, they count against their
// organization only. The OTLP receiver refuses a sender whose id would be a registered
// party's.
const UnboundSenderPrefix = "otlp:"

// Kinds of binding: which identity of an OpenTelemetry sender a binding names.
const (
	BindingService = "service" // the resource attribute service.name
	BindingAgent   = "agent"   // the span attribute gen_ai.agent.id
)

// BindingData is the data of agent.bound and agent.unbound: an identity a sender
// chooses for itself (Kind, Value) in the event's organization, and the directory
// agent an operator says it stands for (the event's subject too). The sender's choice
// alone never names an agent: only a binding does. An unbinding may leave AgentID
// empty.
type BindingData struct {
	Kind    string `json:"kind"`
	Value   string `json:"value"`
	AgentID string `json:"agent_id"`
}

// Validate checks b as the data of an agent.bound: the kind is BindingService or
// BindingAgent, the value and the agent id are present and within the limits of an id
// (MaxIDBytes of valid UTF-8 without control characters). The error is a *FieldError
// naming the member (data.kind, data.value, data.agent_id).
func (b BindingData) Validate() error { return b.ValidateFor(TypeAgentBound) }

// ValidateFor checks b as the data of an event of type typ, agent.bound or
// agent.unbound: an unbinding may leave the agent id empty.
func (b BindingData) ValidateFor(typ string) error {
	if fe := b.check(typ); fe != nil {
		return fe
	}
	return nil
}

func (b BindingData) check(typ string) *FieldError {
	switch b.Kind {
	case BindingService, BindingAgent:
	case "":
		return fieldErr("data.kind", "missing (want %s or %s)", BindingAgent, BindingService)
	default:
		return fieldErr("data.kind", "unknown kind %s (want %s or %s)", quoteShort(b.Kind), BindingAgent, BindingService)
	}
	if b.Value == "" {
		return fieldErr("data.value", "missing")
	}
	if fe := checkID("data.value", b.Value); fe != nil {
		return fe
	}
	switch typ {
	case TypeAgentBound:
		if b.AgentID == "" {
			return fieldErr("data.agent_id", "missing")
		}
	case TypeAgentUnbound:
	default:
		return fieldErr("type", "%s is not %s or %s", quoteShort(typ), TypeAgentBound, TypeAgentUnbound)
	}
	return checkID("data.agent_id", b.AgentID)
}
