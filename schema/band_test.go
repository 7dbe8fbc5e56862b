package schema

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// received is the time given to frames that carry none.
var received = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var uuidV8 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// want is what a test checks of a decoded event; empty fields are not checked, except
// that Actor is checked whenever ActorID or ActorType is set.
type want struct {
	Type      string
	Time      string // RFC 3339
	RoomID    string
	ActorID   string
	ActorType ActorType
	Subject   *Party
	NoSubject bool
	Data      map[string]any // key fields of data, compared as JSON
	NoData    []string       // keys data must not have
}

func check(t *testing.T, e Event, w want) {
	t.Helper()
	assert.Equal(t, w.Type, e.Type, "type")
	assert.Equal(t, SourceBand, e.Source, "source")
	assert.Equal(t, Version, e.SchemaVersion, "schema_version")
	assert.Regexp(t, uuidV8, e.ID, "id")
	assert.Equal(t, time.UTC, e.Time.Location(), "time zone")
	if w.Time != "" {
		assert.Equal(t, w.Time, e.Time.Format(time.RFC3339Nano), "time")
	}
	assert.Equal(t, w.RoomID, e.RoomID, "room_id")
	assert.Equal(t, w.ActorID, e.Actor.ID, "actor.id")
	assert.Equal(t, w.ActorType, e.Actor.Type, "actor.type")
	if w.Subject != nil {
		if assert.NotNil(t, e.Subject, "subject") {
			assert.Equal(t, *w.Subject, *e.Subject, "subject")
		}
	}
	if w.NoSubject {
		assert.Nil(t, e.Subject, "subject")
	}
	data := dataMap(t, e)
	for k, v := range w.Data {
		wantJSON, err := json.Marshal(v)
		require.NoError(t, err)
		got, ok := data[k]
		if !assert.True(t, ok, "data.%s missing in %s", k, e.Data) {
			continue
		}
		gotJSON, err := json.Marshal(got)
		require.NoError(t, err)
		assert.JSONEq(t, string(wantJSON), string(gotJSON), "data.%s", k)
	}
	for _, k := range w.NoData {
		assert.NotContains(t, data, k, "data.%s", k)
	}
	// What Decode returns is valid and survives a round trip through its JSON.
	require.NoError(t, e.Validate())
	b, err := json.Marshal(e)
	require.NoError(t, err)
	again, err := Decode(b)
	require.NoError(t, err, "%s", b)
	assert.Equal(t, e, again, "round trip")
}

func dataMap(t *testing.T, e Event) map[string]any {
	t.Helper()
	if len(e.Data) == 0 {
		return map[string]any{}
	}
	var m map[string]any
	require.NoError(t, json.Unmarshal(e.Data, &m), "%s", e.Data)
	return m
}

func readLines(t testing.TB, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // read only
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := bytes.TrimSpace(sc.Bytes()); len(l) > 0 {
			lines = append(lines, append([]byte(nil), l...))
		}
	}
	require.NoError(t, sc.Err())
	return lines
}

// TestDecodeSampleFrames decodes every line of the platform's sample frames.
func TestDecodeSampleFrames(t *testing.T) {
	lines := readLines(t, "testdata/band/frames.ndjson")
	wants := []want{
		{ // message_created
			Type: TypeMessageCreated, Time: "2025-11-17T11:20:10.284136Z", RoomID: "room-123",
			ActorID: "user-456", ActorType: ActorUser, NoSubject: true,
			Data: map[string]any{
				"content": "@TestBot hi", "message_type": "text", "message_id": "msg-123",
				"mentions": []Mention{{ID: "agent-123", Handle: "testbot"}},
				"extra":    map[string]any{"metadata": map[string]any{"status": "sent"}},
			},
			NoData: []string{"thread_id"},
		},
		{ // room_added
			Type: TypeRoomAdded, Time: "2025-11-17T09:05:35.642172Z", RoomID: "room-123",
			ActorID: "agent-123", ActorType: ActorAgent, NoSubject: true,
			Data:   map[string]any{"title": "Test Room"},
			NoData: []string{"task_id", "extra"},
		},
		{ // participant_added: no timestamp of its own
			Type: TypeParticipantAdded, Time: "2026-03-01T12:00:00Z", RoomID: "room-123",
			Subject: &Party{ID: "p-123", Type: ActorAgent},
			Data: map[string]any{
				"participant_id": "p-123", "name": "Test Agent", "participant_type": "agent", "is_remote": true,
			},
			NoData: []string{"is_external", "extra"},
		},
		{ // contact_added
			Type: TypeContactAdded, Time: "2026-02-09T10:35:00Z",
			ActorID: "agent-123", ActorType: ActorAgent,
			Subject: &Party{ID: "contact-456", Type: ActorAgent, Handle: "bob/weather-bot"},
			Data: map[string]any{
				"handle": "bob/weather-bot", "is_remote": true,
				"extra": map[string]any{"name": "Weather Bot", "description": "Provides weather forecasts"},
			},
		},
		{ // contact_request_received
			Type: TypeContactRequestReceived, Time: "2026-02-09T10:30:00Z",
			ActorID: "agent-123", ActorType: ActorAgent, NoSubject: true,
			Data: map[string]any{
				"status": "pending", "request_id": "req-123", "from_handle": "john_doe", "message": "Hi there!",
				"extra": map[string]any{"from_name": "John Doe"},
			},
		},
		{ // event_created tool_call
			Type: TypeToolCall, Time: "2026-02-09T10:31:00Z", RoomID: "room-123",
			ActorID: "agent-123", ActorType: ActorAgent,
			Data: map[string]any{
				"tool_name": "search_docs", "tool_call_id": "call-1", "message_id": "evt-200",
				"arguments": map[string]any{"query": "retry backoff"},
			},
			NoData: []string{"extra"},
		},
		{ // event_created task with band_usage
			Type: TypeUsageReported, Time: "2026-02-09T10:31:05Z", RoomID: "room-123",
			ActorID: "agent-123", ActorType: ActorAgent,
			Data: map[string]any{
				"input_tokens": 1200, "output_tokens": 340, "cache_read_tokens": 0, "cache_write_tokens": 0,
				"message_id": "evt-201",
				"extra":      map[string]any{"content": "Token usage: input=1200 output=340"},
			},
			NoData: []string{"reasoning_tokens", "model"},
		},
	}
	require.Len(t, lines, len(wants), "a want for every sample frame")
	ids := map[string]int{}
	for i, line := range lines {
		t.Run(wants[i].Type, func(t *testing.T) {
			e, err := DecodeAt(line, received)
			require.NoError(t, err, "%s", line)
			check(t, e, wants[i])
			if j, dup := ids[e.ID]; dup {
				t.Errorf("line %d has the id of line %d", i+1, j+1)
			}
			ids[e.ID] = i
		})
	}
}

// TestDecodeSampleFramesGolden compares the whole canonical output of the sample frames
// with testdata/band/frames.golden.ndjson (go test -run Golden -update rewrites it).
func TestDecodeSampleFramesGolden(t *testing.T) {
	var out bytes.Buffer
	for _, line := range readLines(t, "testdata/band/frames.ndjson") {
		e, err := DecodeAt(line, received)
		require.NoError(t, err)
		b, err := json.Marshal(e)
		require.NoError(t, err)
		out.Write(b)
		out.WriteByte('\n')
	}
	golden := filepath.Join("testdata", "band", "frames.golden.ndjson")
	if *update {
		require.NoError(t, os.WriteFile(golden, out.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), out.String())
}

func frame(topic, event, payload string) []byte {
	return []byte(`{"topic":"` + topic + `","event":"` + event + `","payload":` + payload + `}`)
}

// TestDecodeCatalogue covers the platform's event catalogue beyond the sample.
func TestDecodeCatalogue(t *testing.T) {
	msg := func(extra string) string {
		return `{"id":"msg-1","content":"hello","message_type":"text","metadata":{"mentions":[]},` +
			`"sender_id":"user-1","sender_type":"User","chat_room_id":"room-1",` +
			`"inserted_at":"2026-02-09T10:00:00Z","updated_at":"2026-02-09T10:05:00Z"` + extra + `}`
	}
	evt := func(mt, content, metadata string) string {
		return `{"id":"evt-1","content":` + content + `,"message_type":"` + mt + `","metadata":` + metadata +
			`,"sender_id":"agent-1","sender_type":"Agent","chat_room_id":"room-1","inserted_at":"2026-02-09T10:31:00.5+02:00"}`
	}
	tests := []struct {
		name  string
		frame []byte
		want  want
	}{
		{
			name:  "message_created with thread, zone-less time and unknown fields",
			frame: frame("chat_room:room-1", "message_created", `{"id":"msg-2","content":"hi @alice","message_type":"text","metadata":{"mentions":[{"id":"u-2","username":"@Alice"}],"status":"sent","color":"red"},"sender_id":"agent-1","sender_type":"Agent","chat_room_id":"room-1","thread_id":"msg-1","inserted_at":"2026-02-09T10:00:00.123456","updated_at":"2026-02-09T10:00:00.123456","priority":3,"sender_name":"Bot"}`),
			want: want{
				Type: TypeMessageCreated, Time: "2026-02-09T10:00:00.123456Z", RoomID: "room-1",
				ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{
					"thread_id": "msg-1", "mentions": []Mention{{ID: "u-2", Handle: "Alice"}},
					"extra": map[string]any{"priority": 3, "sender_name": "Bot", "metadata": map[string]any{"status": "sent", "color": "red"}},
				},
			},
		},
		{
			name:  "message_created takes the room from the topic when the payload has none",
			frame: frame("chat_room:room-9", "message_created", `{"id":"m","content":"x","message_type":"text","sender_id":"u","sender_type":"User","inserted_at":"2026-02-09T10:00:00Z"}`),
			want:  want{Type: TypeMessageCreated, RoomID: "room-9", ActorID: "u", ActorType: ActorUser},
		},
		{
			name:  "message_updated is timed by updated_at",
			frame: frame("chat_room:room-1", "message_updated", msg("")),
			want: want{
				Type: TypeMessageUpdated, Time: "2026-02-09T10:05:00Z", RoomID: "room-1",
				ActorID: "user-1", ActorType: ActorUser,
				Data: map[string]any{"content": "hello", "message_id": "msg-1", "extra": map[string]any{"inserted_at": "2026-02-09T10:00:00Z"}},
			},
		},
		{
			name:  "message_deleted",
			frame: frame("chat_room:room-1", "message_deleted", `{"id":"msg-1","chat_room_id":"room-1","deleted_at":"2026-02-09T11:00:00Z"}`),
			want:  want{Type: TypeMessageDeleted, Time: "2026-02-09T11:00:00Z", RoomID: "room-1", Data: map[string]any{"message_id": "msg-1"}},
		},
		{
			name:  "system message",
			frame: frame("chat_room:room-1", "message_created", `{"id":"m","content":"Alice joined","message_type":"system","sender_id":"sys","sender_type":"System","inserted_at":"2026-02-09T10:00:00Z"}`),
			want:  want{Type: TypeMessageCreated, RoomID: "room-1", ActorID: "sys", ActorType: ActorSystem, Data: map[string]any{"message_type": "system"}},
		},
		{
			name: "tool_call from metadata.function with string arguments",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `"Calling search"`,
				`{"function":{"name":"search","arguments":"{\"q\": \"a<b\", \"n\": 2}"},"tool_call_id":"call-7"}`)),
			want: want{
				Type: TypeToolCall, Time: "2026-02-09T08:31:00.5Z", RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{
					"tool_name": "search", "tool_call_id": "call-7", "arguments": map[string]any{"q": "a<b", "n": 2},
					"extra": map[string]any{"content": "Calling search"}, "message_id": "evt-1",
				},
			},
		},
		{
			name: "tool_call from metadata.function with object arguments",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `""`,
				`{"function":{"name":"search","arguments":{"q":"x"},"id":"call-8"}}`)),
			want: want{
				Type: TypeToolCall, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "search", "tool_call_id": "call-8", "arguments": map[string]any{"q": "x"}},
			},
		},
		{
			name: "tool_call in the OpenAI shape: the id is metadata.id",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `""`,
				`{"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}`)),
			want: want{
				Type: TypeToolCall, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "get_weather", "tool_call_id": "call_abc123", "arguments": map[string]any{"city": "Paris"}},
			},
		},
		{
			name: "tool_call: metadata.id is not the call's id outside the OpenAI shape",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `""`,
				`{"id":"meta-1","function":{"name":"search"}}`)),
			want: want{
				Type: TypeToolCall, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "search", "extra": map[string]any{"content": "", "metadata": map[string]any{"id": "meta-1"}}},
			},
		},
		{
			name: "tool_call: an explicit tool_call_id wins over the OpenAI metadata.id",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `""`,
				`{"id":"call_x","type":"function","tool_call_id":"call_y","function":{"name":"search"}}`)),
			want: want{
				Type: TypeToolCall, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "search", "tool_call_id": "call_y", "extra": map[string]any{"content": "", "metadata": map[string]any{"id": "call_x"}}},
			},
		},
		{
			name: "tool_call with arguments that are not JSON keeps them as a string",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `""`,
				`{"function":{"name":"shell","arguments":"ls -la"}}`)),
			want: want{
				Type: TypeToolCall, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "shell", "arguments": "ls -la"},
			},
		},
		{
			name:  "tool_call content JSON wins over metadata.function, extra content keys kept",
			frame: frame("chat_room:room-1", "event_created", evt("tool_call", `"{\"name\":\"a\",\"args\":{},\"tool_call_id\":\"c1\",\"server\":\"mcp\"}"`, `{"function":{"name":"b"}}`)),
			want: want{
				Type: TypeToolCall, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{
					"tool_name": "a", "tool_call_id": "c1", "arguments": map[string]any{},
					"extra": map[string]any{"content": map[string]any{"server": "mcp"}},
				},
			},
		},
		{
			name:  "tool_result from content JSON",
			frame: frame("chat_room:room-1", "event_created", evt("tool_result", `"{\"name\":\"search_docs\",\"output\":{\"hits\":3},\"tool_call_id\":\"call-1\",\"is_error\":false}"`, `{}`)),
			want: want{
				Type: TypeToolResult, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "search_docs", "tool_call_id": "call-1", "is_error": false, "output": map[string]any{"hits": 3}},
			},
		},
		{
			name:  "tool_result error with text content and metadata",
			frame: frame("chat_room:room-1", "event_created", evt("tool_result", `"connection refused"`, `{"tool_call_id":"call-2","tool_name":"fetch","is_error":true}`)),
			want: want{
				Type: TypeToolResult, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "fetch", "tool_call_id": "call-2", "is_error": true, "output": "connection refused"},
			},
		},
		{
			name:  "tool_result with result alias",
			frame: frame("chat_room:room-1", "event_created", evt("tool_result", `"{\"name\":\"f\",\"result\":\"ok\",\"tool_call_id\":\"c\",\"is_error\":true}"`, `{}`)),
			want: want{
				Type: TypeToolResult, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"tool_name": "f", "is_error": true, "output": "ok"},
			},
		},
		{
			name:  "thought",
			frame: frame("chat_room:room-1", "event_created", evt("thought", `"thinking about it"`, `{}`)),
			want: want{Type: TypeThought, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"content": "thinking about it", "message_type": "thought"}},
		},
		{
			name:  "error",
			frame: frame("chat_room:room-1", "event_created", evt("error", `"rate limited"`, `{}`)),
			want: want{Type: TypeError, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"content": "rate limited", "message_type": "error"}},
		},
		{
			name:  "task without band_usage",
			frame: frame("chat_room:room-1", "event_created", evt("task", `"step 2 of 3"`, `{"progress":0.66}`)),
			want: want{Type: TypeTask, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"content": "step 2 of 3", "extra": map[string]any{"metadata": map[string]any{"progress": 0.66}}}},
		},
		{
			name:  "attention",
			frame: frame("chat_room:room-1", "event_created", evt("attention", `"needs approval"`, `{"mentions":[{"id":"u-1","handle":"@alice"}]}`)),
			want: want{Type: TypeAttention, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"content": "needs approval", "mentions": []Mention{{ID: "u-1", Handle: "alice"}}}},
		},
		{
			name:  "other event_created message types map generically",
			frame: frame("chat_room:room-1", "event_created", evt("guidelines", `"be nice"`, `{}`)),
			want:  want{Type: "event.guidelines", RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent},
		},
		{
			name: "usage with reasoning tokens and model",
			frame: frame("chat_room:room-1", "event_created", evt("task", `"usage"`,
				`{"band_usage":{"input_tokens":10,"output_tokens":20,"cache_read_tokens":5,"cache_write_tokens":1,"reasoning_tokens":7,"model":"gpt-5.4-mini","cost_usd":0.01}}`)),
			want: want{
				Type: TypeUsageReported, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{
					"input_tokens": 10, "output_tokens": 20, "cache_read_tokens": 5, "cache_write_tokens": 1,
					"reasoning_tokens": 7, "model": "gpt-5.4-mini",
					"extra": map[string]any{"content": "usage", "metadata": map[string]any{"band_usage": map[string]any{"cost_usd": 0.01}}},
				},
			},
		},
		{
			name: "usage with missing counts is zero",
			frame: frame("chat_room:room-1", "event_created", evt("task", `""`,
				`{"band_usage":{"input_tokens":10,"output_tokens":2.0}}`)),
			want: want{
				Type: TypeUsageReported, RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"input_tokens": 10, "output_tokens": 2, "cache_read_tokens": 0, "cache_write_tokens": 0},
			},
		},
		{
			name:  "participant_added with is_external only and an @handle",
			frame: frame("room_participants:room-1", "participant_added", `{"id":"u-2","name":"Alice","type":"User","handle":"@alice","is_external":false,"role":"member"}`),
			want: want{
				Type: TypeParticipantAdded, RoomID: "room-1",
				Subject: &Party{ID: "u-2", Type: ActorUser, Handle: "alice"},
				Data: map[string]any{
					"participant_id": "u-2", "participant_type": "user", "handle": "alice", "is_remote": false,
					"extra": map[string]any{"role": "member"},
				},
			},
		},
		{
			name:  "participant_added with an agent handle",
			frame: frame("room_participants:room-1", "participant_added", `{"id":"a-2","name":"Reviewer","type":"Agent","handle":"partner/reviewer-agent","is_remote":true,"description":"reviews"}`),
			want: want{
				Type: TypeParticipantAdded, RoomID: "room-1",
				Subject: &Party{ID: "a-2", Type: ActorAgent, Handle: "partner/reviewer-agent"},
				Data:    map[string]any{"is_remote": true, "extra": map[string]any{"description": "reviews"}},
			},
		},
		{
			name:  "participant_removed",
			frame: frame("room_participants:room-1", "participant_removed", `{"id":"u-2","type":"User"}`),
			want: want{
				Type: TypeParticipantRemoved, RoomID: "room-1", Time: "2026-03-01T12:00:00Z",
				Subject: &Party{ID: "u-2", Type: ActorUser},
				Data:    map[string]any{"participant_id": "u-2"},
			},
		},
		{
			name:  "room_deleted on room_participants",
			frame: frame("room_participants:room-1", "room_deleted", `{"id":"room-1","deleted_at":"2026-02-10T00:00:00Z"}`),
			want:  want{Type: TypeRoomDeleted, RoomID: "room-1", Time: "2026-02-10T00:00:00Z", NoData: []string{"extra"}},
		},
		{
			name:  "room_added with owner",
			frame: frame("agent_rooms:agent-1", "room_added", `{"id":"room-2","title":"Webhook Retries","owner":{"id":"u-1","name":"Al","type":"User"},"status":"active","type":"direct","participant_role":"member","inserted_at":"2026-02-09T09:00:00Z"}`),
			want: want{
				Type: TypeRoomAdded, RoomID: "room-2", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{
					"title": "Webhook Retries", "status": "active",
					"extra": map[string]any{"owner": map[string]any{"id": "u-1", "name": "Al", "type": "User"}, "type": "direct", "participant_role": "member"},
				},
			},
		},
		{
			name:  "room_removed",
			frame: frame("agent_rooms:agent-1", "room_removed", `{"id":"room-2","status":"removed","title":"Webhook Retries","removed_at":"2026-02-11T08:00:00Z"}`),
			want: want{
				Type: TypeRoomRemoved, RoomID: "room-2", Time: "2026-02-11T08:00:00Z", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"title": "Webhook Retries", "status": "removed"},
			},
		},
		{
			name:  "room_added on user_rooms",
			frame: frame("user_rooms:user-1", "room_added", `{"id":"room-3","title":"T","inserted_at":"2026-02-09T09:00:00Z"}`),
			want:  want{Type: TypeRoomAdded, RoomID: "room-3", ActorID: "user-1", ActorType: ActorUser},
		},
		{
			name:  "contact_request_received with @ handles",
			frame: frame("agent_contacts:agent-1", "contact_request_received", `{"id":"req-9","from_handle":"@alice/architect-agent","from_name":"Architect","to_handle":"@partner/reviewer-agent","status":"pending","inserted_at":"2026-02-09T10:30:00Z"}`),
			want: want{
				Type: TypeContactRequestReceived, ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"request_id": "req-9", "from_handle": "alice/architect-agent", "to_handle": "partner/reviewer-agent", "status": "pending"},
			},
		},
		{
			name:  "contact_request_updated",
			frame: frame("agent_contacts:agent-1", "contact_request_updated", `{"id":"req-9","status":"approved","updated_at":"2026-02-09T11:00:00Z"}`),
			want: want{
				Type: TypeContactRequestUpdated, Time: "2026-02-09T11:00:00Z", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"request_id": "req-9", "status": "approved"},
			},
		},
		{
			name:  "contact_added with is_external only",
			frame: frame("agent_contacts:agent-1", "contact_added", `{"id":"u-3","handle":"@carol","name":"Carol","type":"User","is_external":true,"inserted_at":"2026-02-09T10:35:00Z"}`),
			want: want{
				Type: TypeContactAdded, ActorID: "agent-1", ActorType: ActorAgent,
				Subject: &Party{ID: "u-3", Type: ActorUser, Handle: "carol"},
				Data:    map[string]any{"handle": "carol", "is_remote": true},
			},
		},
		{
			name:  "contact_removed",
			frame: frame("agent_contacts:agent-1", "contact_removed", `{"id":"u-3"}`),
			want: want{
				Type: TypeContactRemoved, ActorID: "agent-1", ActorType: ActorAgent,
				Subject: &Party{ID: "u-3"},
			},
		},
		{
			name:  "agent.control",
			frame: frame("agent_control:agent-1", "agent.control", `{"action":"stop","reason":"budget","inserted_at":"2026-02-09T12:00:00Z"}`),
			want: want{
				Type: TypeAgentControl, Time: "2026-02-09T12:00:00Z", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"action": "stop", "extra": map[string]any{"reason": "budget"}},
			},
		},
		{
			name:  "task_created",
			frame: frame("tasks:user-1", "task_created", `{"id":"task-1","title":"Review","status":"open","assignee_id":"agent-1","chat_room_id":"room-1","inserted_at":"2026-02-09T12:00:00Z"}`),
			want: want{
				Type: TypeTaskCreated, RoomID: "room-1", ActorID: "user-1", ActorType: ActorUser,
				Data: map[string]any{"task_id": "task-1", "title": "Review", "status": "open", "assignee_id": "agent-1"},
			},
		},
		{
			name:  "task_updated",
			frame: frame("tasks:user-1", "task_updated", `{"id":"task-1","status":"done","inserted_at":"2026-02-09T12:00:00Z","updated_at":"2026-02-09T13:00:00Z"}`),
			want: want{
				Type: TypeTaskUpdated, Time: "2026-02-09T13:00:00Z", ActorID: "user-1", ActorType: ActorUser,
				Data: map[string]any{"task_id": "task-1", "status": "done"},
			},
		},
		{
			name:  "task_deleted",
			frame: frame("tasks:user-1", "task_deleted", `{"id":"task-1"}`),
			want:  want{Type: TypeTaskDeleted, ActorID: "user-1", ActorType: ActorUser, Data: map[string]any{"task_id": "task-1"}},
		},
		{
			name:  "unknown event of a known topic maps by the rule and keeps the payload",
			frame: frame("agent_rooms:agent-1", "room_archived_soon", `{"id":"room-1","when":"later"}`),
			want: want{
				Type: "room.archived_soon", RoomID: "room-1", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"extra": map[string]any{"when": "later"}},
			},
		},
		{
			name:  "unknown noun of a known topic",
			frame: frame("agent_contacts:agent-1", "badge_granted", `{"id":"b-1","badge":"gold"}`),
			want: want{
				Type: "badge.granted", ActorID: "agent-1", ActorType: ActorAgent,
				Data: map[string]any{"extra": map[string]any{"id": "b-1", "badge": "gold"}},
			},
		},
		{
			name:  "frame-level received_at is the time of a frame without one",
			frame: []byte(`{"topic":"room_participants:room-1","event":"participant_added","payload":{"id":"u-9","name":"N","type":"User"},"received_at":"2026-02-09T10:00:00.000001+01:00"}`),
			want: want{
				Type: TypeParticipantAdded, Time: "2026-02-09T09:00:00.000001Z", RoomID: "room-1",
				Subject: &Party{ID: "u-9", Type: ActorUser},
			},
		},
		{
			name:  "frame with white space and keys in another order",
			frame: []byte("  {\n \"payload\" : {\"inserted_at\":\"2026-02-09T10:00:00Z\", \"sender_type\":\"User\",\"sender_id\":\"u\",\"message_type\":\"text\",\"content\":\"x\",\"id\":\"m\"},\n \"event\":\"message_created\", \"topic\":\"chat_room:r\" }\n"),
			want:  want{Type: TypeMessageCreated, RoomID: "r", ActorID: "u", ActorType: ActorUser},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := DecodeAt(tt.frame, received)
			require.NoError(t, err, "%s", tt.frame)
			check(t, e, tt.want)
		})
	}
}

func TestFrameTypeMapping(t *testing.T) {
	for event, typ := range map[string]string{
		"message_created":          TypeMessageCreated,
		"message_updated":          TypeMessageUpdated,
		"message_deleted":          TypeMessageDeleted,
		"room_added":               TypeRoomAdded,
		"room_removed":             TypeRoomRemoved,
		"room_deleted":             TypeRoomDeleted,
		"participant_added":        TypeParticipantAdded,
		"participant_removed":      TypeParticipantRemoved,
		"contact_request_received": TypeContactRequestReceived,
		"contact_request_updated":  TypeContactRequestUpdated,
		"contact_added":            TypeContactAdded,
		"contact_removed":          TypeContactRemoved,
		"task_created":             TypeTaskCreated,
		"task_updated":             TypeTaskUpdated,
		"task_deleted":             TypeTaskDeleted,
		"agent.control":            TypeAgentControl,
		"widget_spun_up":           "widget.spun_up",
	} {
		got, err := frameType(event, &payload{m: map[string]any{}})
		if assert.Nil(t, err, event) {
			assert.Equal(t, typ, got, event)
		}
	}
	for mt, typ := range map[string]string{
		"tool_call": TypeToolCall, "tool_result": TypeToolResult, "thought": TypeThought,
		"error": TypeError, "task": TypeTask, "attention": TypeAttention,
	} {
		got, err := frameType("event_created", &payload{m: map[string]any{"message_type": mt}})
		if assert.Nil(t, err, mt) {
			assert.Equal(t, typ, got, mt)
		}
	}
	got, err := frameType("event_created", &payload{m: map[string]any{
		"message_type": "task", "metadata": map[string]any{"band_usage": map[string]any{}},
	}})
	assert.Nil(t, err)
	assert.Equal(t, TypeUsageReported, got)
}

// TestFrameIDDeterministic: the same frame, however serialized, has the same id; any
// other event has another.
func TestFrameIDDeterministic(t *testing.T) {
	created := `{"topic":"chat_room:room-1","event":"message_created","payload":{"id":"msg-1","content":"hello","message_type":"text","metadata":{"mentions":[{"id":"a","handle":"bot"}]},"sender_id":"u","sender_type":"User","chat_room_id":"room-1","inserted_at":"2026-02-09T10:00:00Z","updated_at":"2026-02-09T10:00:00Z"}}`
	reordered := "{ \"payload\": {\"updated_at\":\"2026-02-09T10:00:00Z\",\"inserted_at\":\"2026-02-09T10:00:00Z\",\n \"chat_room_id\":\"room-1\",\"sender_type\":\"User\",\"sender_id\":\"u\",\"metadata\":{\"mentions\":[{\"handle\":\"bot\",\"id\":\"a\"}]},\"message_type\":\"text\",\"content\":\"hello\",\"id\":\"msg-1\"},\n\t\"event\" : \"message_created\", \"topic\":\"chat_room:room-1\"}"
	escaped := strings.Replace(created, `"hello"`, `"hel\u006co"`, 1)
	updated := strings.Replace(created, `"message_created"`, `"message_updated"`, 1)
	edited := strings.Replace(created, `"hello"`, `"hello!"`, 1)
	otherRoom := strings.Replace(created, `chat_room:room-1`, `chat_room:room-2`, 1)

	id := func(s string) string {
		t.Helper()
		e, err := DecodeAt([]byte(s), received)
		require.NoError(t, err, s)
		return e.ID
	}
	base := id(created)
	assert.Regexp(t, uuidV8, base)
	assert.Equal(t, base, id(created), "decoding twice")
	assert.Equal(t, base, id(reordered), "other key order and white space")
	assert.Equal(t, base, id(escaped), "other string escapes")
	// Decoding at another time does not change the id.
	e, err := DecodeAt([]byte(created), received.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, base, e.ID)

	seen := map[string]string{base: "created"}
	for name, s := range map[string]string{"updated": updated, "edited": edited, "other room": otherRoom} {
		got := id(s)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s has the id of %s", name, prev)
		}
		seen[got] = name
	}
	// The sample frames all have distinct ids, stable across runs (see the golden file).
	for _, line := range readLines(t, "testdata/band/frames.ndjson") {
		got := id(string(line))
		_, dup := seen[got]
		assert.False(t, dup, "duplicate id %s", got)
		seen[got] = string(line)
	}
}

// TestFrameIDScopedByWriter: a frame's id is its writer's. The same writer sending the
// same frame again gets the same id; another writer (an organization's key, or another
// organization's) never gets the id of the platform's frame; Decode and DecodeAt are
// the platform's scope.
func TestFrameIDScopedByWriter(t *testing.T) {
	frames := readLines(t, "testdata/band/frames.ndjson")
	id := func(line []byte, writer string) string {
		t.Helper()
		e, err := DecodeFrom(line, received, writer)
		require.NoError(t, err, "%s", line)
		assert.Regexp(t, uuidV8, e.ID)
		return e.ID
	}
	writers := []string{PlatformWriter, "org-acme", "org-other", ""}
	owner := map[string]string{} // id → the writer and line that got it
	for i, line := range frames {
		for _, w := range writers {
			got := id(line, w)
			assert.Equal(t, got, id(line, w), "line %d from %q again", i+1, w)
			if prev, dup := owner[got]; dup {
				t.Errorf("line %d from %q has the id of %s", i+1, w, prev)
			}
			owner[got] = fmt.Sprintf("line %d from %q", i+1, w)
		}
		d, err := Decode(line)
		require.NoError(t, err)
		assert.Equal(t, id(line, PlatformWriter), d.ID, "Decode is the platform's scope")
		at, err := DecodeAt(line, received)
		require.NoError(t, err)
		assert.Equal(t, id(line, PlatformWriter), at.ID, "DecodeAt is the platform's scope")
	}

	// The scope changes the id only: the organization's copy is the same event otherwise.
	plat, err := DecodeFrom(frames[0], received, PlatformWriter)
	require.NoError(t, err)
	org, err := DecodeFrom(frames[0], received, "org-acme")
	require.NoError(t, err)
	assert.NotEqual(t, plat.ID, org.ID)
	org.ID = plat.ID
	assert.Equal(t, plat, org)

	// The platform's scope is the frame alone: its ids are the golden file's.
	golden := readLines(t, "testdata/band/frames.golden.ndjson")
	require.Len(t, golden, len(frames))
	for i, line := range frames {
		var g Event
		require.NoError(t, json.Unmarshal(golden[i], &g))
		assert.Equal(t, g.ID, id(line, PlatformWriter), "line %d", i+1)
	}
}

// TestDecodeFromRefusesFrameIDsInAnOrganizationsCanonicalEvents: an organization that
// names a frame's id in a canonical event (the platform's, worked out from the frame it
// is about to send) would take it as surely as by posting the frame first.
func TestDecodeFromRefusesFrameIDsInAnOrganizationsCanonicalEvents(t *testing.T) {
	frames := readLines(t, "testdata/band/frames.ndjson")
	plat, err := DecodeFrom(frames[0], received, PlatformWriter)
	require.NoError(t, err)
	copied, err := json.Marshal(plat)
	require.NoError(t, err)

	again, err := DecodeFrom(copied, received, PlatformWriter)
	require.NoError(t, err, "the platform (and ingest reading Kafka) may")
	assert.Equal(t, plat.ID, again.ID)

	_, err = DecodeFrom(copied, received, "org-acme")
	var fe *FieldError
	require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
	assert.Equal(t, "id", fe.Field)
	assert.Contains(t, fe.Reason, "has the form of a frame's id")
	assert.Contains(t, fe.Reason, plat.ID)

	for _, id := range []string{NewID(), "evt-1", strings.ToUpper(plat.ID)} {
		line := strings.Replace(string(copied), plat.ID, id, 1)
		e, err := DecodeFrom([]byte(line), received, "org-acme")
		if assert.NoError(t, err, id) {
			assert.Equal(t, id, e.ID)
		}
	}
}

func TestIsFrameID(t *testing.T) {
	for id, want := range map[string]bool{
		"3ba7e9dc-b023-88a6-9f64-80f34307b6fa":  true,
		"3ba7e9dc-b023-88a6-bf64-80f34307b6fa":  true,
		"3ba7e9dc-b023-48a6-9f64-80f34307b6fa":  false, // version 4
		"3ba7e9dc-b023-88a6-cf64-80f34307b6fa":  false, // not the RFC 9562 variant
		"3BA7E9DC-B023-88A6-9F64-80F34307B6FA":  false, // frameID writes lowercase
		"3ba7e9dc-b023-88a6-9f64-80f34307b6f":   false,
		"3ba7e9dc-b023-88a6-9f64-80f34307b6fa0": false,
		"3ba7e9dcxb023-88a6-9f64-80f34307b6fa":  false,
		"3ba7e9dc-b023-88a6-9f64-80f34307b6fg":  false,
		"":                                      false,
	} {
		assert.Equal(t, want, isFrameID(id), id)
	}
	for range 100 {
		e, err := DecodeFrom(frame("chat_room:r", "message_created", `{"id":"`+NewID()+`","content":"x","sender_id":"u","inserted_at":"2026-02-09T10:00:00Z"}`), received, "org-acme")
		require.NoError(t, err)
		assert.True(t, isFrameID(e.ID), e.ID)
	}
}

// TestCanonicalKeepsID: a canonical event keeps the id it was given, whoever sends it
// (the writer scopes frame ids only).
func TestCanonicalKeepsID(t *testing.T) {
	line := []byte(`{"id":"evt-xyz","type":"message.created","time":"2026-02-09T10:00:00Z","actor":{"id":"u"},"source":"core"}`)
	e, err := Decode(line)
	require.NoError(t, err)
	assert.Equal(t, "evt-xyz", e.ID)
	e, err = DecodeFrom(line, received, "org-acme")
	require.NoError(t, err)
	assert.Equal(t, "evt-xyz", e.ID)
}

func TestDecodeFrameErrors(t *testing.T) {
	msgPayload := `{"id":"m","content":"x","message_type":"text","sender_id":"u","sender_type":"User","inserted_at":"2026-02-09T10:00:00Z"}`
	tests := []struct {
		name, line, field, reason string
	}{
		{"unknown topic", string(frame("foo:bar", "message_created", msgPayload)), "topic", `unknown topic "foo:bar"`},
		{"topic without colon", string(frame("chat_room", "message_created", msgPayload)), "topic", `malformed topic "chat_room" (want <channel>:<id>)`},
		{"topic without id", string(frame("chat_room:", "message_created", msgPayload)), "topic", `malformed topic "chat_room:" (want chat_room:<id>)`},
		{"empty topic", string(frame("", "message_created", msgPayload)), "topic", `malformed topic "" (want <channel>:<id>)`},
		{"topic not a string", `{"topic":7,"event":"message_created","payload":{}}`, "topic", "expected string, got number"},
		{"missing event", `{"topic":"chat_room:r","payload":{}}`, "event", "missing"},
		{"event without a verb", string(frame("chat_room:r", "ping", `{}`)), "event", `cannot map "ping" to a noun.verb type`},
		{"event in upper case", string(frame("chat_room:r", "Message_Created", `{}`)), "event", `cannot map "Message_Created" to a noun.verb type`},
		{"missing payload", `{"topic":"chat_room:r","event":"message_created"}`, "payload", "missing"},
		{"payload not an object", `{"topic":"chat_room:r","event":"message_created","payload":[1]}`, "payload", "must be a JSON object, got an array"},
		{"event_created without message_type", string(frame("chat_room:r", "event_created", `{"id":"e","content":"x","sender_id":"u","inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.message_type", "missing (event_created needs it)"},
		{"missing sender", string(frame("chat_room:r", "message_created", `{"id":"m","content":"x","message_type":"text","inserted_at":"2026-02-09T10:00:00Z"}`)), "actor.id", "missing sender"},
		{"bad sender type", string(frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","sender_type":"Robot","inserted_at":"2026-02-09T10:00:00Z"}`)), "actor.type", `unknown actor type "robot" (want agent, user or system)`},
		{"sender not a string", string(frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":{"id":"u"},"inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.sender_id", "expected string, got object"},
		{"bad timestamp", string(frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","inserted_at":"yesterday"}`)), "payload.inserted_at", `cannot parse "yesterday" as RFC 3339`},
		{"negative tokens", string(frame("chat_room:r", "event_created", `{"id":"e","content":"","message_type":"task","metadata":{"band_usage":{"input_tokens":-5,"output_tokens":1}},"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.metadata.band_usage.input_tokens", "negative token count -5"},
		{"fractional tokens", string(frame("chat_room:r", "event_created", `{"id":"e","content":"","message_type":"task","metadata":{"band_usage":{"input_tokens":1.5}},"sender_id":"a","inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.metadata.band_usage.input_tokens", "expected integer, got 1.5"},
		{"tokens as a string", string(frame("chat_room:r", "event_created", `{"id":"e","content":"","message_type":"task","metadata":{"band_usage":{"output_tokens":"12"}},"sender_id":"a","inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.metadata.band_usage.output_tokens", "expected integer, got string"},
		{"bad from_handle", string(frame("agent_contacts:a", "contact_request_received", `{"id":"r","from_handle":"john doe","status":"pending","inserted_at":"2026-02-09T10:00:00Z"}`)), "data.from_handle", `invalid handle "john doe"`},
		{"bad agent handle", string(frame("agent_contacts:a", "contact_added", `{"id":"c","handle":"@bob/-bot","type":"Agent","inserted_at":"2026-02-09T10:00:00Z"}`)), "subject.handle", `invalid handle "bob/-bot"`},
		{"bad mention handle", string(frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","metadata":{"mentions":[{"id":"a","handle":"a/b/c"}]},"inserted_at":"2026-02-09T10:00:00Z"}`)), "data.mentions[0].handle", `invalid handle "a/b/c"`},
		{"mentions not a list", string(frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","metadata":{"mentions":"a"},"inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.metadata.mentions", "expected array, got string"},
		{"bad participant type", string(frame("room_participants:r", "participant_added", `{"id":"p","name":"n","type":"Bot"}`)), "subject.type", `unknown actor type "bot" (want agent, user or system)`},
		{"is_remote not a boolean", string(frame("room_participants:r", "participant_added", `{"id":"p","type":"Agent","is_remote":"yes"}`)), "payload.is_remote", "expected boolean, got string"},
		{"OpenAI tool call id not a string", string(frame("chat_room:r", "event_created", `{"id":"e","content":"","message_type":"tool_call","metadata":{"id":{"x":1},"type":"function","function":{"name":"s"}},"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:00:00Z"}`)), "payload.metadata.id", "expected string, got object"},
		{"OpenAI tool call id too long", string(frame("chat_room:r", "event_created", `{"id":"e","content":"","message_type":"tool_call","metadata":{"id":"`+strings.Repeat("c", MaxIDBytes+1)+`","type":"function","function":{"name":"s"}},"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:00:00Z"}`)), "data.tool_call_id", "257 bytes is longer than the limit of 256"},
		{"bad received_at", `{"topic":"room_participants:r","event":"participant_added","payload":{"id":"p"},"received_at":"soon"}`, "received_at", `cannot parse "soon" as RFC 3339`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeAt([]byte(tt.line), received)
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
			assert.Equal(t, tt.field, fe.Field)
			assert.Equal(t, tt.reason, fe.Reason)
			assert.Equal(t, tt.field+": "+tt.reason, err.Error())
		})
	}
}
