package schema

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// arrays is a JSON value of nested arrays, depth levels deep.
func arrays(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}

func toolCallFrame(content, metadata string) []byte {
	return frame("chat_room:r", "event_created", `{"id":"evt-1","content":`+content+`,"message_type":"tool_call","metadata":`+metadata+
		`,"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:31:00Z"}`)
}

func toolResultFrame(content string) []byte {
	return frame("chat_room:r", "event_created", `{"id":"evt-2","content":`+content+`,"message_type":"tool_result","metadata":{},"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:31:00Z"}`)
}

func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestFrameEmbeddedJSON: JSON found inside a string is interpreted only when it passes
// the guard and fits where it lands; otherwise it stays a string.
func TestFrameEmbeddedJSON(t *testing.T) {
	// data.arguments sits at level 3: 62 levels fit, 63 do not.
	fits, tooDeep := arrays(MaxDepth-2), arrays(MaxDepth-1)
	tests := []struct {
		name      string
		frame     []byte
		key       string // data member to look at
		embedded  bool   // interpreted as JSON (else kept as the string)
		wantValue string // the string kept, when not embedded
	}{
		{"arguments that fit", toolCallFrame(`""`, `{"function":{"name":"f","arguments":`+jsonString(fits)+`}}`), "arguments", true, ""},
		{"arguments too deep", toolCallFrame(`""`, `{"function":{"name":"f","arguments":`+jsonString(tooDeep)+`}}`), "arguments", false, tooDeep},
		{"arguments with a duplicate key", toolCallFrame(`""`, `{"function":{"name":"f","arguments":"{\"a\":1,\"a\":2}"}}`), "arguments", false, `{"a":1,"a":2}`},
		{"arguments with a case duplicate", toolCallFrame(`""`, `{"function":{"name":"f","arguments":"{\"a\":1,\"A\":2}"}}`), "arguments", false, `{"a":1,"A":2}`},
		{"arguments with a lone surrogate", toolCallFrame(`""`, `{"function":{"name":"f","arguments":"{\"a\":\"\\ud800\"}"}}`), "arguments", false, `{"a":"\ud800"}`},
		{"arguments that are not JSON", toolCallFrame(`""`, `{"function":{"name":"f","arguments":"{not json"}}`), "arguments", false, `{not json`},
		{"content args that fit", toolCallFrame(jsonString(`{"name":"f","args":`+jsonString(fits)+`}`), `{}`), "arguments", true, ""},
		{"content args too deep", toolCallFrame(jsonString(`{"name":"f","args":`+jsonString(tooDeep)+`}`), `{}`), "arguments", false, tooDeep},
		// The whole content object must fit where its leftovers land (data.extra.content).
		{"content args as JSON that fit", toolCallFrame(jsonString(`{"name":"f","args":`+arrays(MaxDepth-4)+`}`), `{}`), "arguments", true, ""},
		{"content too deep stays a string", toolCallFrame(jsonString(`{"name":"f","args":`+arrays(MaxDepth-3)+`}`), `{}`), "extra", true, ""},
		{"tool_result content that fits", toolResultFrame(jsonString(`{"name":"f","output":1,"more":` + arrays(MaxDepth-4) + `}`)), "output", true, ""},
		{"tool_result content too deep to stay in extra", toolResultFrame(jsonString(`{"name":"f","output":1,"more":` + arrays(MaxDepth-3) + `}`)), "output", false, `{"name":"f","output":1,"more":` + arrays(MaxDepth-3) + `}`},
		{"tool_result content with a duplicate", toolResultFrame(jsonString(`{"name":"f","output":1,"output":2}`)), "output", false, `{"name":"f","output":1,"output":2}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := DecodeAt(tt.frame, received)
			require.NoError(t, err, "%s", tt.frame)
			var data map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(e.Data, &data))
			v, ok := data[tt.key]
			require.True(t, ok, "data.%s in %s", tt.key, e.Data)
			if tt.embedded {
				assert.NotEqual(t, byte('"'), v[0], "data.%s embedded as JSON: %s", tt.key, v)
			} else {
				var s string
				require.NoError(t, json.Unmarshal(v, &s), "data.%s kept as a string: %s", tt.key, v)
				assert.Equal(t, tt.wantValue, s)
			}
			roundTrip(t, e)
		})
	}
}

func TestFrameContentTooDeepStaysAString(t *testing.T) {
	content := `{"name":"f","args":` + arrays(MaxDepth-3) + `}`
	e, err := DecodeAt(toolCallFrame(jsonString(content), `{}`), received)
	require.NoError(t, err)
	var d ToolCallData
	require.NoError(t, json.Unmarshal(e.Data, &d))
	assert.Empty(t, d.ToolName, "content not interpreted")
	assert.Nil(t, d.Arguments)
	var extra map[string]any
	require.NoError(t, json.Unmarshal(d.Extra, &extra))
	assert.Equal(t, content, extra["content"])
	roundTrip(t, e)
}

// roundTrip: the canonical event decodes again, under the same rules, to itself.
func roundTrip(t *testing.T, e Event) {
	t.Helper()
	b, err := json.Marshal(e)
	require.NoError(t, err)
	again, err := Decode(b)
	require.NoError(t, err, "%.300s", b)
	assert.True(t, sameEvent(e, again), "round trip:\n%.300s\n%+v", b, again)
}

// TestFrameDepthOnceMapped: payload fields left over move a level down, under
// data.extra; a frame that would map beyond MaxDepth is refused naming payload.
func TestFrameDepthOnceMapped(t *testing.T) {
	// The frame is level 1, payload 2, payload.deep 3: its arrays reach level 2+n.
	withDeep := func(n int) []byte {
		return frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","inserted_at":"2026-02-09T10:00:00Z","deep":`+arrays(n)+`}`)
	}
	// Canonical: envelope 1, data 2, extra 3, deep 4: n arrays reach level 3+n.
	e, err := DecodeAt(withDeep(MaxDepth-3), received)
	require.NoError(t, err)
	roundTrip(t, e)

	_, err = DecodeAt(withDeep(MaxDepth-2), received) // a frame of depth 64
	var fe *FieldError
	require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
	assert.Equal(t, "payload", fe.Field)
	assert.True(t, strings.HasPrefix(fe.Reason, "too deeply nested once mapped to the canonical event (its fields move a level down, under data.extra): data.extra.deep[0]"), fe.Reason)
	assert.True(t, strings.HasSuffix(fe.Reason, ": nested deeper than 64 levels (at offset 109)"), fe.Reason)

	_, err = DecodeAt(withDeep(MaxDepth-1), received) // depth 65: the guard refuses the line
	require.True(t, errors.As(err, &fe))
	assert.Equal(t, "payload.deep"+strings.Repeat("[0]", MaxDepth-2), fe.Field)

	// metadata leftovers too (payload.metadata → data.extra.metadata).
	md := frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","inserted_at":"2026-02-09T10:00:00Z","metadata":{"mentions":[],"x":`+arrays(MaxDepth-3)+`}}`)
	_, err = DecodeAt(md, received)
	require.True(t, errors.As(err, &fe), "got %v", err)
	assert.Equal(t, "payload", fe.Field)
}

// TestFramesRoundTrip: for every sample frame, every frame of the catalogue tests and
// the hostile ones here, whatever Decode accepts decodes again, from its canonical JSON,
// to the same event.
func TestFramesRoundTrip(t *testing.T) {
	lines := readLines(t, "testdata/band/frames.ndjson")
	lines = append(lines,
		withString(`{"a":"\u2028<&>"}`), withString("{\"a\":\"\u00e9\"}"), withString(`[1,{"b":[]}]`),
		toolCallFrame(jsonString(`{"name":"f","args":{"q":"x"},"extra":{"deep":`+arrays(MaxDepth-4)+`}}`), `{}`),
		toolCallFrame(`""`, `{"function":{"name":"f","arguments":`+jsonString(" \n"+arrays(MaxDepth-2)+"\t")+`}}`),
		toolResultFrame(jsonString(`{"output":"{\"nested\":\"json\"}","is_error":true}`)),
		frame("chat_room:r", "event_created", `{"id":"e","message_type":"task","metadata":{"band_usage":{"input_tokens":1000000000,"output_tokens":1.0e3,"model":"m"},"x":`+arrays(MaxDepth-5)+`},"sender_id":"a","sender_type":"Agent","inserted_at":"2105-12-31T23:59:59.999Z"}`),
		frame("room_participants:r", "participant_added", `{"id":"`+strings.Repeat("p", MaxIDBytes)+`","handle":"@`+strings.Repeat("h", MaxHandleBytes)+`","type":"User"}`),
		frame("agent_contacts:a", "contact_request_received", `{"id":"r","from_handle":"@x","inserted_at":"1970-01-01T00:00:00Z","deep":{"\u00e9":{"\ud83d\ude00":[]}}}`),
	)
	for _, l := range lines {
		e, err := DecodeAt(l, received)
		require.NoError(t, err, "%.300s", l)
		roundTrip(t, e)
	}
}

func withString(args string) []byte {
	return toolCallFrame(`""`, `{"function":{"name":"f","arguments":`+jsonString(args)+`}}`)
}
