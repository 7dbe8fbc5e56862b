package schema

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const canonicalMessage = `{"id":"0b7c6a2e-4f5d-8a9b-9c1d-2e3f4a5b6c7d","type":"message.created","time":"2026-02-09T10:31:00.123456Z","org_id":"org-1","room_id":"room-123","actor":{"id":"agent-123","type":"agent","handle":"alice/architect-agent"},"execution_id":"exec-9","source":"band","schema_version":1,"data":{"content":"@TestBot hi","message_type":"text","mentions":[{"id":"agent-123","handle":"testbot"}],"message_id":"msg-123"}}`

func TestDecodeCanonical(t *testing.T) {
	e, err := Decode([]byte(canonicalMessage))
	require.NoError(t, err)
	assert.Equal(t, Event{
		ID:            "0b7c6a2e-4f5d-8a9b-9c1d-2e3f4a5b6c7d",
		Type:          TypeMessageCreated,
		Time:          time.Date(2026, 2, 9, 10, 31, 0, 123456000, time.UTC),
		OrgID:         "org-1",
		RoomID:        "room-123",
		Actor:         Party{ID: "agent-123", Type: ActorAgent, Handle: "alice/architect-agent"},
		ExecutionID:   "exec-9",
		Source:        "band",
		SchemaVersion: 1,
		Data:          json.RawMessage(`{"content":"@TestBot hi","message_type":"text","mentions":[{"id":"agent-123","handle":"testbot"}],"message_id":"msg-123"}`),
	}, e)
	assert.Equal(t, "room-123", e.Key())

	// Marshal writes back the same line.
	b, err := json.Marshal(e)
	require.NoError(t, err)
	assert.Equal(t, canonicalMessage, string(b))
}

func TestDecodeCanonicalNormalizes(t *testing.T) {
	line := `{
		"type": "agent.registered", "id": "e-1", "time": "2026-02-09T12:31:00+02:00", "org_id": "org-1",
		"actor": {"id": "u-1", "type": "user", "handle": "@alice"},
		"subject": {"id": "a-1", "type": "agent", "handle": "@alice/reviewer-agent"},
		"source": "core",
		"data": { "handle": "alice/reviewer-agent", "owner_id": "u-1", "description": "a <b> & c \u2028" },
		"unknown_top_level": true
	}`
	e, err := Decode([]byte(line))
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 2, 9, 10, 31, 0, 0, time.UTC), e.Time)
	assert.Same(t, time.UTC, e.Time.Location())
	assert.Equal(t, Version, e.SchemaVersion, "schema_version defaults to Version")
	assert.Equal(t, "alice", e.Actor.Handle, "'@' stripped")
	assert.Equal(t, "alice/reviewer-agent", e.Subject.Handle, "'@' stripped")
	assert.Equal(t, `{"handle":"alice/reviewer-agent","owner_id":"u-1","description":"a \u003cb\u003e \u0026 c \u2028"}`, string(e.Data))
	assert.Equal(t, "org-1", e.Key())

	var a AgentData
	require.NoError(t, json.Unmarshal(e.Data, &a))
	assert.Equal(t, "a <b> & c \u2028", a.Description)
}

func TestDecodeCanonicalVariants(t *testing.T) {
	base := map[string]any{
		"id": "e-1", "type": "message.created", "time": "2026-02-09T10:31:00Z",
		"actor": map[string]any{"id": "u-1", "type": "user"}, "source": "band",
	}
	with := func(kv ...any) []byte {
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
	t.Run("unknown noun.verb type is kept", func(t *testing.T) {
		e, err := Decode(with("type", "widget.spun_up"))
		require.NoError(t, err)
		assert.Equal(t, "widget.spun_up", e.Type)
	})
	t.Run("zone-less time is UTC", func(t *testing.T) {
		e, err := Decode(with("time", "2026-02-09T10:31:00.5"))
		require.NoError(t, err)
		assert.Equal(t, time.Date(2026, 2, 9, 10, 31, 0, 500000000, time.UTC), e.Time)
	})
	t.Run("schema_version 0 is the current version", func(t *testing.T) {
		e, err := Decode(with("schema_version", 0))
		require.NoError(t, err)
		assert.Equal(t, Version, e.SchemaVersion)
	})
	t.Run("null data is no data", func(t *testing.T) {
		b := []byte(strings.Replace(string(with()), `"id"`, `"data":null,"id"`, 1))
		e, err := Decode(b)
		require.NoError(t, err)
		assert.Nil(t, e.Data)
	})
	t.Run("type and topic: canonical wins", func(t *testing.T) {
		e, err := Decode(with("topic", "foo"))
		require.NoError(t, err)
		assert.Equal(t, "e-1", e.ID)
	})
	t.Run("message.deleted needs no sender", func(t *testing.T) {
		_, err := Decode(with("type", TypeMessageDeleted, "actor", map[string]any{"id": ""}))
		require.NoError(t, err)
	})
	t.Run("directory events need no actor", func(t *testing.T) {
		_, err := Decode(with("type", TypeUserRegistered, "actor", nil, "subject", map[string]any{"id": "u-2", "type": "user"},
			"data", map[string]any{"handle": "@bob"}))
		require.NoError(t, err)
	})
	t.Run("usage with reasoning tokens", func(t *testing.T) {
		e, err := Decode(with("type", TypeUsageReported, "data", map[string]any{
			"input_tokens": 1, "output_tokens": 2, "cache_read_tokens": 3, "cache_write_tokens": 4, "reasoning_tokens": 5, "model": "m",
		}))
		require.NoError(t, err)
		var u UsageData
		require.NoError(t, json.Unmarshal(e.Data, &u))
		require.NotNil(t, u.ReasoningTokens)
		assert.Equal(t, UsageData{InputTokens: 1, OutputTokens: 2, CacheReadTokens: 3, CacheWriteTokens: 4, ReasoningTokens: u.ReasoningTokens, Model: "m"}, u)
		assert.EqualValues(t, 5, *u.ReasoningTokens)
	})
}

func TestDecodeErrors(t *testing.T) {
	ok := map[string]any{
		"id": "e-1", "type": "message.created", "time": "2026-02-09T10:31:00Z",
		"actor": map[string]any{"id": "u-1", "type": "user"}, "source": "band", "schema_version": 1,
	}
	with := func(kv ...any) string {
		m := map[string]any{}
		for k, v := range ok {
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
		return string(b)
	}
	agent := func(data map[string]any, subject any) string {
		return with("type", TypeAgentRegistered, "actor", map[string]any{"id": "core", "type": "system"}, "subject", subject, "data", data)
	}
	tests := []struct {
		name, line, want string
	}{
		{"malformed JSON", `{"id":"e-1",`, "invalid JSON at offset 12: unexpected end of JSON input"},
		{"garbage", `hello`, "invalid JSON at offset 1: invalid character 'h' looking for beginning of value"},
		{"trailing data", with() + ` {}`, "invalid JSON at offset " + strconv.Itoa(len(with())+2) + ": invalid character '{' after top-level value"},
		{"not an object", `[1,2]`, "expected a JSON object, got array"},
		{"empty object", `{}`, "id: missing"},
		{"missing id", with("id", nil), "id: missing"},
		{"id not a string", with("id", 5), "id: expected string, got number"},
		{"missing type", with("type", nil), "type: missing"},
		{"type not noun.verb", with("type", "MessageCreated"), `type: "MessageCreated" is not a lowercase noun.verb type`},
		{"type with three parts", with("type", "a.b.c"), `type: "a.b.c" is not a lowercase noun.verb type`},
		{"missing time", with("time", nil), "time: missing"},
		{"unparseable time", with("time", "yesterday"), `time: cannot parse "yesterday" as RFC 3339`},
		{"time not a string", with("time", 1700000000), "time: expected string, got number"},
		{"zero time", with("time", "0001-01-01T00:00:00Z"), "time: zero time"},
		{"time before year 1 in UTC", with("time", "0001-01-01T00:30:00+01:00"), "time: 0000-12-31T23:30:00Z is outside [1970-01-01T00:00:00Z, 2105-12-31T23:59:59.999Z]"},
		{"newer schema_version", with("schema_version", 2), "schema_version: version 2 is newer than the supported version 1"},
		{"negative schema_version", with("schema_version", -1), "schema_version: version -1 is not positive"},
		{"fractional schema_version", with("schema_version", 1.5), "schema_version: expected integer, got number 1.5"},
		{"missing source", with("source", nil), "source: missing"},
		{"missing actor", with("actor", nil), "actor.id: missing sender"},
		{"missing sender of an event", with("type", TypeToolCall, "actor", map[string]any{"type": "agent"}), "actor.id: missing sender"},
		{"missing sender of usage", with("type", TypeUsageReported, "actor", map[string]any{"id": ""}), "actor.id: missing sender"},
		{"bad actor type", with("actor", map[string]any{"id": "u", "type": "robot"}), `actor.type: unknown actor type "robot" (want agent, user or system)`},
		{"actor type in upper case", with("actor", map[string]any{"id": "u", "type": "User"}), `actor.type: unknown actor type "User" (want agent, user or system)`},
		{"bad subject type", with("subject", map[string]any{"id": "u", "type": "org"}), `subject.type: unknown actor type "org" (want agent, user or system)`},
		{"bad actor handle", with("actor", map[string]any{"id": "u", "handle": "@al ice"}), `actor.handle: invalid handle "al ice"`},
		{"actor not an object", with("actor", "u-1"), "actor: expected object, got string"},
		{"data an array", with("data", []any{1}), "data: must be a JSON object, got an array"},
		{"data a string", with("data", "x"), "data: must be a JSON object, got a string"},
		{"negative input tokens", with("type", TypeUsageReported, "data", map[string]any{"input_tokens": -5}), "data.input_tokens: negative token count -5"},
		{"negative cache write tokens", with("type", TypeUsageReported, "data", map[string]any{"cache_write_tokens": -1}), "data.cache_write_tokens: negative token count -1"},
		{"negative reasoning tokens", with("type", TypeUsageReported, "data", map[string]any{"reasoning_tokens": -2}), "data.reasoning_tokens: negative token count -2"},
		{"tokens not integers", with("type", TypeUsageReported, "data", map[string]any{"output_tokens": "many"}), "data.output_tokens: expected integer, got string"},
		{"agent.registered without subject", agent(map[string]any{"owner_id": "u", "handle": "u/a"}, nil), "subject.id: missing agent"},
		{"agent.registered without owner", agent(map[string]any{"handle": "u/a"}, map[string]any{"id": "a"}), "data.owner_id: missing"},
		{"agent.registered without handle", agent(map[string]any{"owner_id": "u"}, map[string]any{"id": "a"}), "data.handle: missing"},
		{"agent.registered with a person's handle", agent(map[string]any{"owner_id": "u", "handle": "alice"}, map[string]any{"id": "a"}), `data.handle: invalid agent handle "alice" (want owner/agent-slug)`},
		{"agent.updated without subject id", with("type", TypeAgentUpdated, "subject", map[string]any{"id": ""}), "subject.id: missing agent"},
		{"user.registered without subject", with("type", TypeUserRegistered), "subject.id: missing user"},
		{"user.registered with a bad handle", with("type", TypeUserRegistered, "subject", map[string]any{"id": "u"}, "data", map[string]any{"handle": "_x"}), `data.handle: invalid handle "_x"`},
		{"contact with a bad handle", with("type", TypeContactAdded, "data", map[string]any{"to_handle": "a/"}), `data.to_handle: invalid handle "a/"`},
		{"mention with a bad handle", with("data", map[string]any{"mentions": []any{map[string]any{"id": "x", "handle": "@"}}}), `data.mentions[0].handle: invalid handle "@"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.line))
			require.Error(t, err, tt.line)
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want a *FieldError, got %T", err)
			assert.Equal(t, tt.want, err.Error())
		})
	}
}

func TestValidateBuiltEvents(t *testing.T) {
	good := Event{
		ID: "e", Type: TypeMessageCreated, Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		Actor: Party{ID: "u", Type: ActorUser}, Source: "band", SchemaVersion: Version,
	}
	require.NoError(t, good.Validate())

	bad := good
	bad.Data = json.RawMessage(`{"content":`)
	assert.EqualError(t, bad.Validate(), "data: invalid JSON at offset 11: unexpected end of JSON input")

	bad = good
	bad.SchemaVersion = 0
	assert.EqualError(t, bad.Validate(), "schema_version: version 0 is not positive")

	bad = good
	bad.Time = time.Time{}
	assert.EqualError(t, bad.Validate(), "time: zero time")

	var fe *FieldError
	require.ErrorAs(t, bad.Validate(), &fe)
	assert.Equal(t, &FieldError{Field: "time", Reason: "zero time"}, fe)
}

func TestValidHandle(t *testing.T) {
	for _, h := range []string{"alice", "@alice", "Alice", "john_doe", "a1", "9lives", "alice/reviewer-agent", "@partner/reviewer-agent", "bob/weather-bot", "a.b/c.d_e-f", "X/Y"} {
		assert.True(t, ValidHandle(h), h)
	}
	for _, h := range []string{"", "@", "@@alice", "_alice", "-a", "al ice", "alice/", "/agent", "a/b/c", "a/-b", "ali\u00e9", "a@b", "a/b c", "alice\n"} {
		assert.False(t, ValidHandle(h), h)
	}
}

func TestNormalizeJSON(t *testing.T) {
	for _, in := range []string{
		`{}`, `{"a":1}`, " { \"a\" : [ 1 , 2 ] ,\n\t\"b\" : \"x y\" } ",
		`{"h":"<a href=\"x\">&amp;</a>"}`, "{\"s\":\"\u2028\u2029\"}", `{"e":"\\\"<"}`, `{"u":"\u00e9\u65e5"}`,
		`{"t":"a b\tc"}`, `{"t":"a b"} `, "{\"t\":\"x\u2028\"}\n", `{"t":"\u2027\u2030"}`, `["<", 1]`,
	} {
		got := normalizeJSON([]byte(in))
		want, err := json.Marshal(json.RawMessage(in))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), in)
	}
	// Clean JSON, white space in its strings included, is returned as is, not copied.
	clean := []byte(`{"span_name":"chat claude sonnet","n":[1,2]}`)
	assert.Same(t, &clean[0], &normalizeJSON(clean)[0])
}

func TestJSONSchema(t *testing.T) {
	var s struct {
		Schema     string                     `json:"$schema"`
		Type       string                     `json:"type"`
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	require.NoError(t, json.Unmarshal(JSONSchema, &s), "event.schema.json is valid JSON")
	assert.Equal(t, "https://json-schema.org/draft/2020-12/schema", s.Schema)
	assert.Equal(t, "object", s.Type)

	// Every field of the envelope is described; every field Marshal always writes is required.
	rt := reflect.TypeOf(Event{})
	for i := 0; i < rt.NumField(); i++ {
		tag := rt.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		assert.Contains(t, s.Properties, name, "property %s", name)
		if !strings.Contains(opts, "omitempty") {
			assert.Contains(t, s.Required, name, "required %s", name)
		}
	}
	for _, name := range s.Required {
		assert.Contains(t, s.Properties, name)
	}
}

func TestDecodeDoubleAtHandle(t *testing.T) {
	_, err := Decode([]byte(`{"id":"e","type":"user.registered","time":"2026-01-01T00:00:00Z","source":"core","subject":{"id":"u","handle":"@@alice"}}`))
	assert.EqualError(t, err, `subject.handle: invalid handle "@alice"`)
}

func TestMembers(t *testing.T) {
	all := func(data string) map[string]string {
		got := map[string]string{}
		it := members{data: []byte(data)}
		for {
			k, plain, v, ok := it.next()
			if !ok {
				return got
			}
			got[string(k)+map[bool]string{true: "", false: " (escaped)"}[plain]] = string(v)
		}
	}
	data := ` { "a" : [1, {"mentions": 2}, "x\"]"] , "s":"mentions","n":-1.5e3,"t":true, "mentions" : [ {"id":"x","handle":"y"} ] , "z":null, "\u006d":{}, "é":1 } `
	assert.Equal(t, map[string]string{
		"a": `[1, {"mentions": 2}, "x\"]"]`, "s": `"mentions"`, "n": "-1.5e3", "t": "true",
		"mentions": `[ {"id":"x","handle":"y"} ]`, "z": "null", `\u006d (escaped)`: "{}", "é (escaped)": "1",
	}, all(data))
	assert.Empty(t, all(`[]`))
	assert.Empty(t, all(`{}`))
	assert.Empty(t, all(``))

	for _, tc := range []struct {
		key   string
		plain bool
		want  bool
	}{
		{"message_id", true, true}, {"MESSAGE_ID", true, true}, {"Message_Id", true, true},
		{"message_i", true, false}, {"message_idx", true, false}, {"message-id", true, false},
		{`message\u005fid`, false, true}, {`MESSAGE\u005FID`, false, true},
		{"meſſage_id", false, true}, // U+017F folds to s, as encoding/json matches it
		{`message\u005fi`, false, false}, {`message\u005fidd`, false, false},
	} {
		assert.Equal(t, tc.want, keyIs([]byte(tc.key), tc.plain, "message_id"), tc.key)
	}
}

func TestSkipString(t *testing.T) {
	for _, s := range []string{
		`""`, `"a"`, `"\""`, `"\\"`, `"\\\""`, `"a\\\\"`,
		`"` + strings.Repeat("x", 16) + `\""`, `"` + strings.Repeat("x", 15) + `\\"`, `"` + strings.Repeat("x", 40) + `\\\"\\"`,
		`"` + strings.Repeat(`\"`, 30) + `"`, `"` + strings.Repeat("é", 30) + `"`,
	} {
		require.True(t, json.Valid([]byte(s)), s)
		for _, tail := range []string{"", `,"b"`, `:1}`} {
			assert.Equal(t, len(s), skipString([]byte(s+tail), 0), s+tail)
		}
	}
}

// BenchmarkNormalizeJSON: usage data as a client sends it, and an OTLP receiver's
// usage data, whose span name has a space in a string.
func BenchmarkNormalizeJSON(b *testing.B) {
	for _, tc := range []struct{ name, data string }{
		{"usage", `{"model":"claude-sonnet-4-5","input_tokens":1800,"output_tokens":100,"cache_read_tokens":199,"cache_write_tokens":0}`},
		{"otlp", `{"input_tokens":1800,"output_tokens":100,"cache_read_tokens":199,"cache_write_tokens":0,"model":"gpt-5","trigger":{"source":"otlp:checkout"},"otlp":{"service":"checkout","operation":"chat","span_name":"planner step one"}}`},
	} {
		v := []byte(tc.data)
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				normalizeJSON(v)
			}
		})
	}
}
