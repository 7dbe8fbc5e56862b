package simulate

import (
	"encoding/json"
	"time"
)

// The platform's frames, field for field as in schema/testdata/band/frames.ndjson.

type frame struct {
	Topic   string `json:"topic"`
	Event   string `json:"event"`
	Payload any    `json:"payload"`
}

// messagePayload is the payload of message_created, message_updated and event_created.
type messagePayload struct {
	ID          string          `json:"id"`
	Content     string          `json:"content"`
	MessageType string          `json:"message_type"`
	Metadata    any             `json:"metadata"`
	SenderID    string          `json:"sender_id"`
	SenderType  string          `json:"sender_type"`
	ChatRoomID  string          `json:"chat_room_id"`
	ThreadID    json.RawMessage `json:"thread_id,omitempty"` // null on messages, absent on events
	InsertedAt  string          `json:"inserted_at"`
	UpdatedAt   string          `json:"updated_at"`
}

type mentionJSON struct {
	ID     string `json:"id"`
	Handle string `json:"handle"`
	Name   string `json:"name"`
}

type messageMetadata struct {
	Mentions []mentionJSON `json:"mentions"`
	Status   string        `json:"status,omitempty"`
	triggerMetadata
}

type eventMetadata struct {
	Mentions []mentionJSON `json:"mentions,omitempty"`
	triggerMetadata
}

// triggerMetadata names the trigger of the execution a frame belongs to: the message
// that started it (its platform id), or the system outside chat that did. The decoder
// keeps metadata it does not map under data.extra.metadata, where the cause tracker
// reads it.
type triggerMetadata struct {
	TriggerMessageID string `json:"trigger_message_id,omitempty"`
	TriggerSource    string `json:"trigger_source,omitempty"`
}

// metadata is an event frame's metadata, given the trigger it names. Every type
// defines withTrigger itself: the one promoted from triggerMetadata would drop the
// rest of the metadata.
type metadata interface{ withTrigger(triggerMetadata) any }

func (m triggerMetadata) withTrigger(t triggerMetadata) any  { return t }
func (m eventMetadata) withTrigger(t triggerMetadata) any    { m.triggerMetadata = t; return m }
func (m functionMetadata) withTrigger(t triggerMetadata) any { m.triggerMetadata = t; return m }
func (m usageMetadata) withTrigger(t triggerMetadata) any    { m.triggerMetadata = t; return m }

type functionMetadata struct {
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON-encoded, as OpenAI-style senders put it
	} `json:"function"`
	ToolCallID string `json:"tool_call_id,omitempty"`
	triggerMetadata
}

type usageMetadata struct {
	BandUsage bandUsage `json:"band_usage"`
	triggerMetadata
}

type bandUsage struct {
	InputTokens      int64  `json:"input_tokens"`
	OutputTokens     int64  `json:"output_tokens"`
	CacheReadTokens  int64  `json:"cache_read_tokens"`
	CacheWriteTokens int64  `json:"cache_write_tokens"`
	ReasoningTokens  *int64 `json:"reasoning_tokens,omitempty"`
}

type toolCallContent struct {
	Name       string          `json:"name"`
	Args       json.RawMessage `json:"args"`
	ToolCallID string          `json:"tool_call_id"`
}

type toolResultContent struct {
	Name       string          `json:"name"`
	Output     json.RawMessage `json:"output"`
	ToolCallID string          `json:"tool_call_id"`
	IsError    bool            `json:"is_error,omitempty"`
}

type roomPayload struct {
	ID         string          `json:"id"`
	Title      string          `json:"title"`
	TaskID     json.RawMessage `json:"task_id"`
	InsertedAt string          `json:"inserted_at"`
	UpdatedAt  string          `json:"updated_at"`
}

type participantPayload struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Handle     string `json:"handle,omitempty"`
	Type       string `json:"type"`
	IsRemote   bool   `json:"is_remote"`
	IsExternal *bool  `json:"is_external,omitempty"`
	// When the participant joined (participant_added) or left (participant_removed).
	// The sample frames carry no time; bandplane derives a frame's event id from its
	// content, so without it a participant re-added to a room would repeat an id, and
	// the event would get the time it was decoded rather than the simulated one.
	InsertedAt string `json:"inserted_at,omitempty"`
	RemovedAt  string `json:"removed_at,omitempty"`
}

type contactPayload struct {
	ID          string `json:"id"`
	Handle      string `json:"handle"`
	Name        string `json:"name"`
	Type        string `json:"type"`
	Description string `json:"description,omitempty"`
	IsRemote    bool   `json:"is_remote"`
	IsExternal  *bool  `json:"is_external,omitempty"`
	InsertedAt  string `json:"inserted_at"`
}

type contactRequestPayload struct {
	ID         string `json:"id"`
	FromHandle string `json:"from_handle"`
	FromName   string `json:"from_name"`
	ToHandle   string `json:"to_handle,omitempty"`
	Message    string `json:"message,omitempty"`
	Status     string `json:"status"`
	InsertedAt string `json:"inserted_at"`
	UpdatedAt  string `json:"updated_at,omitempty"`
}

type taskPayload struct {
	ID         string `json:"id"`
	Title      string `json:"title"`
	Status     string `json:"status"`
	AssigneeID string `json:"assignee_id,omitempty"`
	ChatRoomID string `json:"chat_room_id,omitempty"`
	InsertedAt string `json:"inserted_at"`
	UpdatedAt  string `json:"updated_at"`
}

var jsonNull = json.RawMessage("null")

// stamp formats a platform timestamp: microseconds, UTC, with a Z, or without a zone
// (a variation seen in the wild, meaning UTC) when zoneless.
func stamp(t time.Time, zoneless bool) string {
	if zoneless {
		return t.UTC().Format("2006-01-02T15:04:05.000000")
	}
	return t.UTC().Format("2006-01-02T15:04:05.000000Z")
}
