package schema

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// line is a canonical event with the fields of base replaced by kv (nil deletes).
func line(base map[string]any, kv ...any) []byte {
	m := map[string]any{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(m, kv[i].(string))
		} else {
			m[kv[i].(string)] = kv[i+1]
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

var baseEvent = map[string]any{
	"id": "e-1", "type": "message.created", "time": "2026-02-09T10:31:00Z",
	"actor": map[string]any{"id": "u-1", "type": "user"}, "source": "band",
}

func TestLimits(t *testing.T) {
	id := func(n int) string { return strings.Repeat("i", n) }
	h := func(n int) string { return strings.Repeat("h", n) } // a person's handle
	agentHandle := func(n int) string { return "o/" + strings.Repeat("a", n-2) }
	typ := func(n int) string { return "t." + strings.Repeat("v", n-2) }
	over := func(n, limit int) string {
		return strconv.Itoa(n) + " bytes is longer than the limit of " + strconv.Itoa(limit)
	}
	agent := func(data map[string]any) []byte {
		d := map[string]any{"owner_id": "u-1", "handle": "u/a"}
		for k, v := range data {
			d[k] = v
		}
		return line(baseEvent, "type", TypeAgentRegistered, "subject", map[string]any{"id": "a-1", "type": "agent"}, "data", d)
	}
	typed := func(typ string, data map[string]any) []byte {
		return line(baseEvent, "type", typ, "data", data)
	}
	mention := func(m map[string]any) []byte {
		return line(baseEvent, "data", map[string]any{"content": "x", "mentions": []any{map[string]any{"id": "m-0"}, m}})
	}
	mentions := func(n int, escaped bool) []byte {
		ms := make([]any, n)
		for i := range ms {
			ms[i] = map[string]any{"id": "m-" + strconv.Itoa(i)}
		}
		b := line(baseEvent, "data", map[string]any{"content": "x", "mentions": ms})
		if escaped { // the decoder's path, not the byte scan's
			b = []byte(strings.Replace(string(b), `"id":"m-0"`, `"id":"m\u002d0"`, 1))
		}
		return b
	}
	tests := []struct {
		name string
		line []byte
		want string // "" when accepted
	}{
		{"mentions at the cap", mentions(MaxMentions, false), ""},
		{"mentions over the cap", mentions(MaxMentions+1, false), "data.mentions: more than 256 mentions"},
		{"mentions at the cap, escaped", mentions(MaxMentions, true), ""},
		{"mentions over the cap, escaped", mentions(MaxMentions+1, true), "data.mentions: more than 256 mentions"},
		{"id at the cap", line(baseEvent, "id", id(MaxIDBytes)), ""},
		{"id over the cap", line(baseEvent, "id", id(MaxIDBytes+1)), "id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"org_id at the cap", line(baseEvent, "org_id", id(MaxIDBytes)), ""},
		{"org_id over the cap", line(baseEvent, "org_id", id(MaxIDBytes+1)), "org_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"room_id at the cap", line(baseEvent, "room_id", id(MaxIDBytes)), ""},
		{"room_id over the cap", line(baseEvent, "room_id", id(MaxIDBytes+1)), "room_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"execution_id at the cap", line(baseEvent, "execution_id", id(MaxIDBytes)), ""},
		{"execution_id over the cap", line(baseEvent, "execution_id", id(MaxIDBytes+1)), "execution_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"actor.id at the cap", line(baseEvent, "actor", map[string]any{"id": id(MaxIDBytes)}), ""},
		{"actor.id over the cap", line(baseEvent, "actor", map[string]any{"id": id(MaxIDBytes + 1)}), "actor.id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"subject.id at the cap", line(baseEvent, "subject", map[string]any{"id": id(MaxIDBytes)}), ""},
		{"subject.id over the cap", line(baseEvent, "subject", map[string]any{"id": id(MaxIDBytes + 1)}), "subject.id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"multi-byte id at the cap", line(baseEvent, "id", strings.Repeat("é", MaxIDBytes/2)), ""},
		{"multi-byte id over the cap", line(baseEvent, "id", strings.Repeat("é", MaxIDBytes/2)+"x"), "id: " + over(MaxIDBytes+1, MaxIDBytes)},

		{"id with a newline", line(baseEvent, "id", "e\n1"), "id: control character 0x0a at byte 1"},
		{"id with NUL", line(baseEvent, "id", "\x00"), "id: control character 0x00 at byte 0"},
		{"id with DEL", line(baseEvent, "id", "e\x7f"), "id: control character 0x7f at byte 1"},
		{"id with a C1 control", line(baseEvent, "id", "é\u0085"), "id: control character U+0085 at byte 2"},
		{"org_id with a tab", line(baseEvent, "org_id", "o\t"), "org_id: control character 0x09 at byte 1"},
		{"actor.id with a carriage return", line(baseEvent, "actor", map[string]any{"id": "a\r"}), "actor.id: control character 0x0d at byte 1"},
		{"subject.id with ESC", line(baseEvent, "subject", map[string]any{"id": "\x1b[31m"}), "subject.id: control character 0x1b at byte 0"},
		{"room_id with a control", line(baseEvent, "room_id", "r\x01"), "room_id: control character 0x01 at byte 1"},
		{"execution_id with a control", line(baseEvent, "execution_id", "x\x02"), "execution_id: control character 0x02 at byte 1"},
		{"unicode id", line(baseEvent, "id", "évènement-日本-😀"), ""},

		{"org_id * is reserved", line(baseEvent, "org_id", "*"), `org_id: "*" is reserved (it means the platform in API keys)`},
		{"org_id ** is not", line(baseEvent, "org_id", "**"), ""},

		{"handle at the cap", line(baseEvent, "actor", map[string]any{"id": "u", "handle": h(MaxHandleBytes)}), ""},
		{"handle over the cap", line(baseEvent, "actor", map[string]any{"id": "u", "handle": h(MaxHandleBytes + 1)}), "actor.handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"handle with @ over the cap after the @", line(baseEvent, "actor", map[string]any{"id": "u", "handle": "@" + h(MaxHandleBytes)}), ""},
		{"subject handle over the cap", line(baseEvent, "subject", map[string]any{"id": "u", "handle": agentHandle(MaxHandleBytes + 1)}), "subject.handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"type at the cap", line(baseEvent, "type", typ(MaxTypeBytes)), ""},
		{"type over the cap", line(baseEvent, "type", typ(MaxTypeBytes+1)), "type: " + over(MaxTypeBytes+1, MaxTypeBytes)},
		{"source at the cap", line(baseEvent, "source", id(MaxSourceBytes)), ""},
		{"source over the cap", line(baseEvent, "source", id(MaxSourceBytes+1)), "source: " + over(MaxSourceBytes+1, MaxSourceBytes)},
		{"source with a control", line(baseEvent, "source", "core\n"), "source: control character 0x0a at byte 4"},

		{"agent owner_id at the cap", agent(map[string]any{"owner_id": id(MaxIDBytes)}), ""},
		{"agent owner_id over the cap", agent(map[string]any{"owner_id": id(MaxIDBytes + 1)}), "data.owner_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"agent owner_id with a control", agent(map[string]any{"owner_id": "u\x00"}), "data.owner_id: control character 0x00 at byte 1"},
		{"agent handle at the cap", agent(map[string]any{"handle": agentHandle(MaxHandleBytes)}), ""},
		{"agent handle over the cap", agent(map[string]any{"handle": agentHandle(MaxHandleBytes + 1)}), "data.handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"agent model over the cap", agent(map[string]any{"model": id(MaxIDBytes + 1)}), "data.model: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"user handle over the cap", line(baseEvent, "type", TypeUserRegistered, "subject", map[string]any{"id": "u"}, "data", map[string]any{"handle": h(MaxHandleBytes + 1)}), "data.handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"task_id at the cap", typed(TypeTaskCreated, map[string]any{"task_id": id(MaxIDBytes)}), ""},
		{"task_id over the cap", typed(TypeTaskCreated, map[string]any{"task_id": id(MaxIDBytes + 1)}), "data.task_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"assignee_id over the cap", typed(TypeTaskUpdated, map[string]any{"task_id": "t", "assignee_id": id(MaxIDBytes + 1)}), "data.assignee_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"assignee_id with a control", typed(TypeTaskUpdated, map[string]any{"task_id": "t", "assignee_id": "a\x7f"}), "data.assignee_id: control character 0x7f at byte 1"},
		{"request_id at the cap", typed(TypeContactRequestReceived, map[string]any{"request_id": id(MaxIDBytes)}), ""},
		{"request_id over the cap", typed(TypeContactRequestReceived, map[string]any{"request_id": id(MaxIDBytes + 1)}), "data.request_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"contact handle over the cap", typed(TypeContactAdded, map[string]any{"handle": h(MaxHandleBytes + 1)}), "data.handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"participant_id at the cap", typed(TypeParticipantAdded, map[string]any{"participant_id": id(MaxIDBytes)}), ""},
		{"participant_id over the cap", typed(TypeParticipantAdded, map[string]any{"participant_id": id(MaxIDBytes + 1)}), "data.participant_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"participant handle over the cap", typed(TypeParticipantRemoved, map[string]any{"participant_id": "p", "handle": h(MaxHandleBytes + 1)}), "data.handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"participant handle malformed", typed(TypeParticipantRemoved, map[string]any{"participant_id": "p", "handle": "a b"}), `data.handle: invalid handle "a b"`},
		{"mention id at the cap", mention(map[string]any{"id": id(MaxIDBytes)}), ""},
		{"mention id over the cap", mention(map[string]any{"id": id(MaxIDBytes + 1)}), "data.mentions[1].id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"mention id with a control", mention(map[string]any{"id": "\n"}), "data.mentions[1].id: control character 0x0a at byte 0"},
		{"mention handle over the cap", mention(map[string]any{"id": "m", "handle": h(MaxHandleBytes + 1)}), "data.mentions[1].handle: " + over(MaxHandleBytes+1, MaxHandleBytes)},
		{"message_id at the cap", typed(TypeMessageCreated, map[string]any{"message_id": id(MaxIDBytes)}), ""},
		{"message_id over the cap", typed(TypeMessageUpdated, map[string]any{"message_id": id(MaxIDBytes + 1)}), "data.message_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"message_id escaped, over the cap once unescaped", []byte(strings.Replace(string(typed(TypeMessageCreated, map[string]any{"message_id": "x"})), `"x"`, `"`+strings.Repeat(`\u00e9`, MaxIDBytes/2+1)+`"`, 1)), "data.message_id: " + over(MaxIDBytes+2, MaxIDBytes)},
		{"message_id with an escaped control", []byte(strings.Replace(string(typed(TypeMessageCreated, map[string]any{"message_id": "x"})), `"x"`, `"a\u0000"`, 1)), "data.message_id: control character 0x00 at byte 1"},
		{"message_id under another case and escaped", []byte(strings.Replace(string(typed(TypeMessageCreated, map[string]any{"message_id": "x"})), `"message_id":"x"`, `"MESSAGE\u005fID":"a\n"`, 1)), `data.message_id: control character 0x0a at byte 1`},
		{"message_id not a string", typed(TypeMessageCreated, map[string]any{"message_id": 5}), "data.message_id: expected string, got number"},
		{"message_id null", []byte(strings.Replace(string(typed(TypeMessageCreated, map[string]any{"message_id": "x"})), `"x"`, `null`, 1)), ""},
		{"thread_id over the cap", typed(TypeMessageCreated, map[string]any{"thread_id": id(MaxIDBytes + 1)}), "data.thread_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"tool_call_id with a control", typed(TypeToolCall, map[string]any{"tool_name": "f", "tool_call_id": "c\x1f"}), "data.tool_call_id: control character 0x1f at byte 1"},
		{"usage message_id over the cap", typed(TypeUsageReported, map[string]any{"message_id": id(MaxIDBytes + 1)}), "data.message_id: " + over(MaxIDBytes+1, MaxIDBytes)},
		{"usage model with a control", typed(TypeUsageReported, map[string]any{"model": "gpt\n"}), "data.model: control character 0x0a at byte 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := Decode(tt.line)
			if tt.want == "" {
				require.NoError(t, err)
				require.NoError(t, e.Validate())
				return
			}
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
}

func TestTokenLimits(t *testing.T) {
	usage := func(v string) []byte {
		return []byte(`{"id":"e","type":"usage.reported","time":"2026-02-09T10:31:00Z","actor":{"id":"a"},"source":"s","data":{"input_tokens":` + v + `}}`)
	}
	usageFrame := func(key, v string) []byte {
		return frame("chat_room:r", "event_created", `{"id":"e","content":"","message_type":"task","metadata":{"band_usage":{"`+key+`":`+v+`}},"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:00:00Z"}`)
	}
	for _, tc := range []struct {
		name string
		line []byte
		want string // "" when accepted
		n    int64  // the count accepted
	}{
		{"at the cap", usage("1000000000"), "", MaxTokens},
		{"zero", usage("0"), "", 0},
		{"cap+1", usage("1000000001"), "data.input_tokens: 1000000001 is above the cap of 1000000000 tokens", 0},
		{"9e18 written out", usage("9000000000000000000"), "data.input_tokens: 9000000000000000000 is above the cap of 1000000000 tokens", 0},
		{"9e18", usage("9e18"), "data.input_tokens: expected integer, got number 9e18", 0},
		{"beyond int64", usage("99999999999999999999"), "data.input_tokens: expected integer, got number 99999999999999999999", 0},
		{"-1", usage("-1"), "data.input_tokens: negative token count -1", 0},
		{"1.5", usage("1.5"), "data.input_tokens: expected integer, got number 1.5", 0},
		{"1200.0 (canonical is strict)", usage("1200.0"), "data.input_tokens: expected integer, got number 1200.0", 0},
		{"a string", usage(`"12"`), "data.input_tokens: expected integer, got string", 0},

		{"frame at the cap", usageFrame("input_tokens", "1000000000"), "", MaxTokens},
		{"frame cap+1", usageFrame("input_tokens", "1000000001"), "payload.metadata.band_usage.input_tokens: 1000000001 is above the cap of 1000000000 tokens", 0},
		{"frame 9e18", usageFrame("output_tokens", "9e18"), "payload.metadata.band_usage.output_tokens: 9e18 is above the cap of 1000000000 tokens", 0},
		{"frame MaxInt64", usageFrame("cache_read_tokens", "9223372036854775807"), "payload.metadata.band_usage.cache_read_tokens: 9223372036854775807 is above the cap of 1000000000 tokens", 0},
		{"frame huge exponent", usageFrame("cache_write_tokens", "1e999999999999999999999"), "payload.metadata.band_usage.cache_write_tokens: 1e999999999999999999999 is above the cap of 1000000000 tokens", 0},
		{"frame a very long number", usageFrame("input_tokens", strings.Repeat("9", 100)), "payload.metadata.band_usage.input_tokens: " + strings.Repeat("9", 32) + "… (100 digits) is above the cap of 1000000000 tokens", 0},
		{"frame -1", usageFrame("reasoning_tokens", "-1"), "payload.metadata.band_usage.reasoning_tokens: negative token count -1", 0},
		{"frame -1e30", usageFrame("input_tokens", "-1e30"), "payload.metadata.band_usage.input_tokens: negative token count -1e30", 0},
		{"frame 1.5", usageFrame("input_tokens", "1.5"), "payload.metadata.band_usage.input_tokens: expected integer, got 1.5", 0},
		{"frame 1e-3", usageFrame("input_tokens", "1e-3"), "payload.metadata.band_usage.input_tokens: expected integer, got 1e-3", 0},
		{"frame 1000000000.0000000001 (no float rounding)", usageFrame("input_tokens", "1000000000.0000000001"), "payload.metadata.band_usage.input_tokens: expected integer, got 1000000000.0000000001", 0},
		{"frame a string", usageFrame("input_tokens", `"12"`), "payload.metadata.band_usage.input_tokens: expected integer, got string", 0},
		{"frame 1200.0 is 1200", usageFrame("input_tokens", "1200.0"), "", 1200},
		{"frame 1.2e3 is 1200", usageFrame("input_tokens", "1.2e3"), "", 1200},
		{"frame 1E9 is the cap", usageFrame("input_tokens", "1E9"), "", MaxTokens},
		{"frame 10e8 is the cap", usageFrame("input_tokens", "10e8"), "", MaxTokens},
		{"frame 0.1e10 is the cap", usageFrame("input_tokens", "0.1e10"), "", MaxTokens},
		{"frame -0 is 0", usageFrame("input_tokens", "-0"), "", 0},
		{"frame 0.0e-5 is 0", usageFrame("input_tokens", "0.0e-5"), "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := DecodeAt(tc.line, received)
			if tc.want != "" {
				var fe *FieldError
				require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
				assert.Equal(t, tc.want, err.Error())
				return
			}
			require.NoError(t, err)
			var u UsageData
			require.NoError(t, DecodeData(e.Data, &u))
			assert.Equal(t, tc.n, u.InputTokens+u.OutputTokens+u.CacheReadTokens+u.CacheWriteTokens)
		})
	}
}

func TestTimeLimits(t *testing.T) {
	canonical := func(ts string) []byte { return line(baseEvent, "time", ts) }
	frameAt := func(key, ts string) []byte {
		return frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","`+key+`":"`+ts+`"}`)
	}
	outside := func(ts string) string {
		return ts + " is outside [1970-01-01T00:00:00Z, 2105-12-31T23:59:59.999Z]"
	}
	for _, tc := range []struct {
		name string
		line []byte
		want string
	}{
		{"the first second of 1970", canonical("1970-01-01T00:00:00Z"), ""},
		{"a nanosecond before", canonical("1969-12-31T23:59:59.999999999Z"), "time: " + outside("1969-12-31T23:59:59.999999999Z")},
		{"1970 in another zone, before in UTC", canonical("1970-01-01T00:30:00+01:00"), "time: " + outside("1969-12-31T23:30:00Z")},
		{"the last millisecond of 2105", canonical("2105-12-31T23:59:59.999Z"), ""},
		{"a millisecond after", canonical("2106-01-01T00:00:00Z"), "time: " + outside("2106-01-01T00:00:00Z")},
		{"year 9999", canonical("9999-12-31T23:59:59Z"), "time: " + outside("9999-12-31T23:59:59Z")},
		{"1971 is within DateTime", canonical("1971-06-01T00:00:00Z"), ""},
		{"frame inserted_at in 9999", frameAt("inserted_at", "9999-01-01T00:00:00Z"), "payload.inserted_at: " + outside("9999-01-01T00:00:00Z")},
		{"frame created_at before 1970", frameAt("created_at", "1969-07-20T20:17:40Z"), "payload.created_at: " + outside("1969-07-20T20:17:40Z")},
		{"frame at the upper bound", frameAt("inserted_at", "2105-12-31T23:59:59.999"), ""},
		{"frame received_at out of range", []byte(`{"topic":"room_participants:r","event":"participant_added","payload":{"id":"p"},"received_at":"2200-01-01T00:00:00Z"}`), "received_at: " + outside("2200-01-01T00:00:00Z")},
		{"frame time out of range", []byte(`{"topic":"room_participants:r","event":"participant_added","payload":{"id":"p"},"time":"1900-01-01T00:00:00Z"}`), "time: " + outside("1900-01-01T00:00:00Z")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeAt(tc.line, received)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
			assert.Equal(t, tc.want, err.Error())
		})
	}
	// Validate holds built events to the same range.
	e := Event{ID: "e", Type: TypeMessageCreated, Actor: Party{ID: "u"}, Source: "s", SchemaVersion: Version}
	for _, tc := range []struct {
		t  time.Time
		ok bool
	}{{MinTime, true}, {MaxTime, true}, {MinTime.Add(-time.Nanosecond), false}, {MaxTime.Add(time.Nanosecond), false}} {
		e.Time = tc.t
		assert.Equal(t, tc.ok, e.Validate() == nil, "%v", tc.t)
	}
}

// TestValidateBuiltData: Validate guards the data of a built event as Decode would see
// it, one level down in the line.
func TestValidateBuiltData(t *testing.T) {
	e := Event{ID: "e", Type: TypeMessageCreated, Time: received, Actor: Party{ID: "u"}, Source: "s", SchemaVersion: Version}
	deep := func(levels int) json.RawMessage { // data nesting `levels` deep
		return json.RawMessage(`{"x":` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`)
	}
	e.Data = deep(MaxDepth - 1)
	require.NoError(t, e.Validate())
	e.Data = deep(MaxDepth)
	assert.EqualError(t, e.Validate(), "data.x"+strings.Repeat("[0]", MaxDepth-2)+": nested deeper than 64 levels (at offset 67)")
	e.Data = json.RawMessage(`{"a":1,"a":2}`)
	assert.EqualError(t, e.Validate(), "data.a: duplicate key")
	e.Data = json.RawMessage("{\"a\":\"\xff\"}")
	assert.EqualError(t, e.Validate(), "data.a: in a string: invalid UTF-8 at offset 6")
	e.Data = json.RawMessage(`{"a":"\udbff"}`)
	assert.EqualError(t, e.Validate(), `data.a: in a string: lone surrogate \udbff at offset 6`)

	// Ids of built events: invalid UTF-8 would turn into U+FFFD once marshalled.
	e.Data = nil
	e.ID = "e\xff"
	assert.EqualError(t, e.Validate(), "id: invalid UTF-8 at byte 1")
	e.ID = "e"
	e.Actor.ID = "\xc3"
	assert.EqualError(t, e.Validate(), "actor.id: invalid UTF-8 at byte 0")

	// DecodeData guards data from anywhere.
	var u UsageData
	assert.EqualError(t, DecodeData([]byte(`{"input_tokens":1,"input_tokens":2}`), &u), "data.input_tokens: duplicate key")
	assert.EqualError(t, DecodeData([]byte(strings.Repeat("[", 100000)), &u), "data"+strings.Repeat("[0]", MaxDepth-1)+": nested deeper than 64 levels (at offset 63)")
}

// TestLongValuesAreNotEchoed: error messages quote at most a bounded prefix of what the
// client sent.
func TestLongValuesAreNotEchoed(t *testing.T) {
	big := strings.Repeat("x", 100_000)
	for _, l := range [][]byte{
		line(baseEvent, "type", big),
		line(baseEvent, "time", big),
		line(baseEvent, "actor", map[string]any{"id": "u", "type": big}),
		line(baseEvent, "actor", map[string]any{"id": "u", "handle": big}),
		line(baseEvent, "id", big),
		frame("chat_room:"+big, "message_created", `{}`),
		frame("foo"+big+":x", "message_created", `{}`),
		frame("chat_room:r", "x"+big, `{}`),
		frame("chat_room:r", "a.b"+big+".", `{}`),
		frame("chat_room:r", "event_created", `{"message_type":"`+big+`-"}`),
		frame("chat_room:r", "message_created", `{"inserted_at":"`+big+`"}`),
		frame("chat_room:r", "message_created", `{"sender_id":"u","sender_type":"`+big+`","inserted_at":"2026-02-09T10:00:00Z"}`),
	} {
		_, err := DecodeAt(l, received)
		require.Error(t, err)
		assert.Less(t, len(err.Error()), 400, "%.200s", err.Error())
	}
}

func TestOwnSourceIgnoresCaseAndSourcesAreASCII(t *testing.T) {
	for _, s := range []string{"bandplane", "bandplane-policy", "Bandplane-policy", "BANDPLANE"} {
		if !OwnSource(s) {
			t.Errorf("OwnSource(%q) = false", s)
		}
	}
	for _, s := range []string{"", "band", "sdk", "my-bandplane"} {
		if OwnSource(s) {
			t.Errorf("OwnSource(%q) = true", s)
		}
	}
	ev := Event{ID: "e", Type: "message.created", Time: MinTime.Add(time.Hour), Actor: Party{ID: "a"}, SchemaVersion: Version}
	for _, src := range []string{"b\u0430ndplane-policy", "sdk\u00e9"} { // Cyrillic а; é
		ev.Source = src
		if err := ev.Validate(); err == nil || !strings.Contains(err.Error(), "printable ASCII") {
			t.Errorf("source %q: %v, want refused", src, err)
		}
	}
	ev.Source = "My SDK 1.2"
	assert.NoError(t, ev.Validate())
}
