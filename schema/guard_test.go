package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nest is a value nested depth levels deep: arrays, with an object every other level
// (key "k"), around 1.
func nest(depth int) string {
	var open, close strings.Builder
	for d := 0; d < depth; d++ {
		if d%2 == 0 {
			open.WriteString(`{"k":`)
			close.WriteString(`}`)
		} else {
			open.WriteString(`[`)
			close.WriteString(`]`)
		}
	}
	c := []byte(close.String())
	for i, j := 0, len(c)-1; i < j; i, j = i+1, j-1 {
		c[i], c[j] = c[j], c[i]
	}
	return open.String() + "1" + string(c)
}

func TestCheckJSONAccepts(t *testing.T) {
	for _, in := range []string{
		`{}`, `[]`, `1`, `-0.5e+3`, `"x"`, `true`, `null`, ` { "a" : [ 1 , 2 ] } `,
		`{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`,         // the same key in different objects
		`{"s":"\ud83d\ude00 \u00e9 é 日本 \"\\\/\b\f\n\r\t"}`, // a valid surrogate pair, escapes
		`{"\ud83d\ude00":1,"😀x":2}`,
		`{"a":1,"a ":2,"A_":3,"_a":4}`,
		`{"k":"` + strings.Repeat("é", 1000) + `"}`,
		nest(MaxDepth),
		canonicalMessage,
	} {
		assert.NoError(t, CheckJSON([]byte(in)), in)
		assert.True(t, json.Valid([]byte(in)), in)
	}
	// An object of many keys (a set past linearKeys) without a duplicate.
	var big strings.Builder
	big.WriteString("{")
	for i := 0; i < 500; i++ {
		if i > 0 {
			big.WriteString(",")
		}
		big.WriteString(`"key` + string(rune('a'+i%26)) + strings.Repeat("x", i/26) + `":1`)
	}
	big.WriteString("}")
	assert.NoError(t, CheckJSON([]byte(big.String())))
}

func TestCheckJSONRefuses(t *testing.T) {
	manyKeys := func(n int, last string) string {
		var sb strings.Builder
		sb.WriteString(`{"data":{`)
		for i := 0; i < n; i++ {
			sb.WriteString(`"k` + strings.Repeat("x", i) + `":1,`)
		}
		sb.WriteString(last + `:2}}`)
		return sb.String()
	}
	tests := []struct {
		name, in, field, reason string
	}{
		{"depth 65", nest(MaxDepth + 1), "k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0]", "nested deeper than 64 levels (at offset 192)"},
		{"arrays 65 deep, unclosed", strings.Repeat("[", 65), "[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]", "nested deeper than 64 levels (at offset 64)"},
		{"depth in a later element", `[1,2,` + nest(MaxDepth) + `]`, "[2].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k[0].k", "nested deeper than 64 levels (at offset 196)"},

		{"duplicate at top level", `{"id":"a","type":"x","id":"b"}`, "id", "duplicate key"},
		{"duplicate in data", `{"id":"a","data":{"x":1,"y":2,"x":3}}`, "data.x", "duplicate key"},
		{"duplicate in payload.metadata", `{"payload":{"metadata":{"mentions":[],"mentions":[1]}}}`, "payload.metadata.mentions", "duplicate key"},
		{"duplicate in an array's object", `{"a":[{"b":1},{"b":1,"b":2}]}`, "a[1].b", "duplicate key"},
		{"escaped-equal keys", `{"a":1,"\u0061":2}`, "a", `duplicate key: the same as a once unescaped and compared ignoring case`},
		{"escaped-equal keys, other order", `{"\u0061":1,"a":2}`, "a", `duplicate key: the same as a once unescaped and compared ignoring case`},
		{"keys equal but for case", `{"org_id":"o1","ORG_ID":"o2"}`, "ORG_ID", "duplicate key: the same as org_id once unescaped and compared ignoring case"},
		{"keys equal under Unicode folding", `{"source":"s","ſource":"bandplane"}`, "ſource", "key has U+017F, which encoding/json matches as the letter 'S' and the fast decoder does not"},
		{"Kelvin sign", `{"k":1,"\u212a":2}`, "\u212a", "key has U+212A, which encoding/json matches as the letter 'K' and the fast decoder does not"},
		{"Unicode-folded duplicate of a non-ASCII key", `{"é":1,"É":2}`, "É", "duplicate key: the same as é once unescaped and compared ignoring case"},
		{"duplicate in a large object", manyKeys(40, `"kxxx"`), "data.kxxx", "duplicate key"},
		{"case duplicate in a large object", manyKeys(40, `"KXX"`), "data.KXX", "duplicate key: the same as kxx once unescaped and compared ignoring case"},
		{"escaped duplicate in a large object", manyKeys(40, `"\u006bx"`), "data.kx", "duplicate key: the same as kx once unescaped and compared ignoring case"},
		{"Unicode-folded key in a large object", manyKeys(40, `"\u212ax"`), "data.\u212ax", "key has U+212A, which encoding/json matches as the letter 'K' and the fast decoder does not"},
		{"duplicate of a key written escaped, in a large object", strings.Replace(manyKeys(40, `"kxxxxx"`), `"kxxxxx"`, `"\u006BXXXXX"`, 1), "data.kxxxxx", "duplicate key: the same as kXXXXX once unescaped and compared ignoring case"},

		{"invalid UTF-8 in a value", "{\"data\":{\"content\":\"ab\xffc\"}}", "data.content", "in a string: invalid UTF-8 at offset 22"},
		{"invalid UTF-8 in a key", "{\"data\":{\"a\xc3\":1}}", "data", "in a key: invalid UTF-8 at offset 11"},
		{"invalid UTF-8 in a top-level key", "{\"\xe9\":1}", "", "in a key: invalid UTF-8 at offset 2"},
		{"truncated sequence", "[\"\xe6\x97\"]", "[0]", "in a string: invalid UTF-8 at offset 2"},
		{"overlong encoding", "{\"id\":\"\xc0\xaf\"}", "id", "in a string: invalid UTF-8 at offset 7"},
		{"surrogate encoded in UTF-8", "{\"id\":\"\xed\xa0\x80\"}", "id", "in a string: invalid UTF-8 at offset 7"},
		{"beyond U+10FFFF", "{\"id\":\"\xf4\x90\x80\x80\"}", "id", "in a string: invalid UTF-8 at offset 7"},
		{"invalid UTF-8 in a top-level string", "\"\xff\"", "", "in a string: invalid UTF-8 at offset 1"},

		{"lone high surrogate", `{"id":"a\ud800"}`, "id", `in a string: lone surrogate \ud800 at offset 8`},
		{"lone low surrogate", `{"id":"\udc00b"}`, "id", `in a string: lone surrogate \udc00 at offset 7`},
		{"high surrogate then a letter", `{"id":"\uD800\u0041"}`, "id", `in a string: lone surrogate \uD800 at offset 7`},
		{"high surrogate then a high one", `{"id":"\ud800\ud800"}`, "id", `in a string: lone surrogate \ud800 at offset 7`},
		{"reversed pair", `{"id":"\ude00\ud83d"}`, "id", `in a string: lone surrogate \ude00 at offset 7`},
		{"lone surrogate in a key", `{"m":{"\udfff":1}}`, "m", `in a key: lone surrogate \udfff at offset 7`},

		{"a key with dots is quoted in the path", `{"a.b":{"c d":"\ud800"}}`, `["a.b"]["c d"]`, `in a string: lone surrogate \ud800 at offset 15`},
		{"a long key is cut in the path", `{"` + strings.Repeat("k", 100) + `":"\udc00"}`, strings.Repeat("k", 64) + "…", `in a string: lone surrogate \udc00 at offset 105`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckJSON([]byte(tt.in))
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
			assert.Equal(t, tt.field, fe.Field)
			assert.Equal(t, tt.reason, fe.Reason)
		})
	}
}

// TestCheckJSONSyntaxIsEncodingJSONs: a malformed line gets encoding/json's error.
func TestCheckJSONSyntaxIsEncodingJSONs(t *testing.T) {
	for _, in := range []string{
		``, ` `, `{`, `{"a"`, `{"a":`, `{"a":1,}`, `{"a":1 "b":2}`, `[1,]`, `[1 2]`, `{1:2}`, `{"a" 1}`,
		`01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `tru`, `nul`, `falsey`, `"abc`, `"\x"`, `"\u12"`, `"\u12g4"`,
		"\"a\nb\"", "\"\t\"", `{} {}`, `{}x`, `[}`, `{]`, "\xef\xbb\xbf{}", `{"a":1}}`, `]`, `NaN`, `Infinity`,
		`{"a":[1,2,{"b":}]}`, `"\`,
	} {
		want := json.Unmarshal([]byte(in), new(json.RawMessage))
		require.Error(t, want, in)
		var se *json.SyntaxError
		require.ErrorAs(t, want, &se, in)
		got := CheckJSON([]byte(in))
		require.Error(t, got, in)
		assert.Equal(t, jsonErr(want, "").Error(), got.Error(), "%q", in)
		assert.True(t, strings.HasPrefix(got.Error(), "invalid JSON at offset "), got.Error())
	}
}

// deepLine is a canonical message whose data nests so that the whole line is depth
// levels deep (the envelope is level 1, data level 2).
func deepLine(depth int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"id":"e-1","type":"message.created","time":"2026-02-09T10:31:00Z","actor":{"id":"u-1","type":"user"},"source":"band","data":{"content":"x","extra":`)
	n := depth - 2
	b.WriteString(strings.Repeat("[", n))
	b.WriteString("1")
	b.WriteString(strings.Repeat("]", n))
	b.WriteString(`}}`)
	return b.Bytes()
}

func TestDecodeDepth(t *testing.T) {
	for _, depth := range []int{3, 63, 64} {
		line := deepLine(depth)
		e, err := Decode(line)
		require.NoError(t, err, "depth %d", depth)
		b, err := json.Marshal(e)
		require.NoError(t, err)
		again, err := Decode(b)
		require.NoError(t, err, "depth %d, round trip", depth)
		assert.Equal(t, e, again)
	}
	for _, depth := range []int{65, 1000, 3_000_000} {
		line := deepLine(depth)
		_, err := Decode(line)
		var fe *FieldError
		require.True(t, errors.As(err, &fe), "depth %d: want a *FieldError, got %v", depth, err)
		assert.Equal(t, "data.extra"+strings.Repeat("[0]", 62), fe.Field, "depth %d", depth)
		// The scan stops at level 65, whatever follows (BenchmarkDecodeTooDeep: a 6 MB
		// line costs what its first 211 bytes do).
		assert.Equal(t, "nested deeper than 64 levels (at offset 210)", fe.Reason, "depth %d", depth)
	}
	// 3,000,000 levels unclosed, as a frame: refused at once as well.
	line := append([]byte(`{"topic":"chat_room:r","event":"message_created","payload":`), bytes.Repeat([]byte(`{"a":`), 3_000_000)...)
	_, err := Decode(line)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nested deeper than 64 levels")
	assert.True(t, strings.HasPrefix(err.Error(), "payload.a.a.a."), err.Error())
}

// TestDecodeGuardFiresFirst: the guard's refusals come before any decoding, whatever
// the form of the line.
func TestDecodeGuardFiresFirst(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"id":"e","id":"f","type":"message.created"}`, "id: duplicate key"},
		{`{"id":"e","type":"usage.reported","time":"2026-02-09T10:31:00Z","actor":{"id":"a"},"source":"s","data":{"input_tokens":1,"Input_Tokens":900}}`, "data.Input_Tokens: duplicate key: the same as input_tokens once unescaped and compared ignoring case"},
		{`{"id":"e","type":"message.created","time":"2026-02-09T10:31:00Z","actor":{"id":"a\udc00"},"source":"s"}`, `actor.id: in a string: lone surrogate \udc00 at offset 81`},
		{"{\"id\":\"e\xff\"}", "id: in a string: invalid UTF-8 at offset 8"},
		{`{"topic":"chat_room:r","event":"message_created","payload":{"id":"m","metadata":{"mentions":[{"id":"a","id":"b"}]}}}`, "payload.metadata.mentions[0].id: duplicate key"},
		{`{"topic":"chat_room:r","event":"event_created","payload":{"message_type":"tool_call","metadata":{"function":{"name":"f","arguments":{"x":1,"X":2}}}}}`, "payload.metadata.function.arguments.X: duplicate key: the same as x once unescaped and compared ignoring case"},
	} {
		_, err := Decode([]byte(tc.line))
		require.Error(t, err, tc.line)
		assert.Equal(t, tc.want, err.Error(), tc.line)
	}
}

// TestCheckJSONRefusesASCIILookalikeKeys: a key with ſ or the Kelvin sign would be read
// as input_tokens by encoding/json (the replica) and ignored by the fast decoder (ingest),
// so one line would be two different usage reports.
func TestCheckJSONRefusesASCIILookalikeKeys(t *testing.T) {
	for _, line := range []string{
		`{"data":{"input_tokenſ":4000000000000000000}}`,
		`{"data":{"output_to\u212Aens":1}}`,
		"{\"data\":{\"output_to\u212Aens\":1}}", // the rune itself, not its escape
		`{"ſource":"bandplane-policy"}`,
	} {
		err := CheckJSON([]byte(line))
		if err == nil || !strings.Contains(err.Error(), "folds") && !strings.Contains(err.Error(), "matches as the letter") {
			t.Errorf("CheckJSON(%s) = %v, want the lookalike refused", line, err)
		}
	}
	for _, line := range []string{`{"café":1}`, `{"naïve":{"ü":2}}`, `{"\u00e9t\u00e9":3}`} {
		if err := CheckJSON([]byte(line)); err != nil {
			t.Errorf("CheckJSON(%s) = %v, want accepted", line, err)
		}
	}
}
