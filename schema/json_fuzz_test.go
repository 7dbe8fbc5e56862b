package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	fastjson "github.com/segmentio/encoding/json"
)

// FuzzFastJSONAgrees checks the premise of unmarshal: whatever passes the guard and the
// fast decoder accepts, encoding/json accepts too and decodes to the same value. The
// fast decoder only ever sees what passed the guard (it recurses per level).
func FuzzFastJSONAgrees(f *testing.F) {
	if b, err := os.ReadFile("testdata/band/frames.ndjson"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f.Add([]byte(l))
		}
	}
	f.Add([]byte(`{"id":"e","type":"usage.reported","time":"2026-11-02T10:00:00Z","actor":{"id":"a","type":"agent"},"source":"s","data":{"input_tokens":1,"output_tokens":2,"cache_read_tokens":0,"cache_write_tokens":0,"model":"m"}}`))
	f.Add([]byte(`{"id":"e","data":{"a":[1,2,{"b":"\u00e9\ud83d\ude00"}]},"actor":{"id":"x"}}`))
	f.Add([]byte(`[{"id":"m","handle":"h"}]`))
	f.Add([]byte(`{"ID":"e","Source":"s","ſource":"t","\u0069d":"x"}`))
	f.Add([]byte(`{"input_tokens":1.0,"output_tokens":1e3,"reasoning_tokens":null}`))
	f.Add([]byte(`{"input_tokens":1000000001,"OUTPUT_TOKENS":-0,"reasoning_tokens":-1,"model":null,"message_id":"m","extra":{"input_tokens":"x"}}`))
	f.Add([]byte(`{"input_tokens":999999999999999999,"cache_read_tokens":1,"model":"gpt\u0000"}`))
	f.Add([]byte(strings.Repeat("[", 70) + strings.Repeat("]", 70)))
	f.Add([]byte(`[{"id":"a","handle":"b","x":{"y":["\""]}},{"ID":null,"Handle":"c/d"},{"id":"\u0041"}]`))
	f.Add([]byte(`[{"id":"a\\","handle":"@b"}, {"handle":"` + strings.Repeat("h", 129) + `"}]`))
	f.Add([]byte(`{"a":"` + strings.Repeat(`x\"`, 20) + `","b":[1,{"c":"\\"}],"\u0064":null, "e" : -1.5e3 }`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckJSON(b) != nil {
			return // never decoded
		}
		agree(t, b, func() any { return new(wire) })
		agree(t, b, func() any { return new(UsageData) })
		agree(t, b, func() any { return new([]Mention) })
		membersAgree(t, b)
		if len(b) > 0 && b[0] == '{' {
			if fe, done := checkPlainUsage(b); done {
				if slow := checkDecodedUsage(b); errText(fe) != errText(slow) {
					t.Fatalf("usage checked without decoding: %v, decoded: %v: %q", fe, slow, b)
				}
			}
		}
		if fe, done := checkPlainMentions(b); done {
			if slow := checkDecodedMentions(b); errText(fe) != errText(slow) {
				t.Fatalf("mentions checked without decoding: %v, decoded: %v: %q", fe, slow, b)
			}
		}
	})
}

func errText(fe *FieldError) string {
	if fe == nil {
		return "<nil>"
	}
	return fe.Error()
}

// membersAgree: the members iterator (validation reads messages' data with it) sees
// the members encoding/json decodes.
func membersAgree(t *testing.T, b []byte) {
	var want map[string]json.RawMessage
	if json.Unmarshal(b, &want) != nil || want == nil {
		return
	}
	got := map[string]json.RawMessage{}
	it := members{data: b}
	for {
		k, plain, v, ok := it.next()
		if !ok {
			break
		}
		var key string
		if err := json.Unmarshal([]byte(`"`+string(k)+`"`), &key); err != nil {
			t.Fatalf("members returned the key %q: %v", k, err)
		}
		if plain && key != string(k) {
			t.Fatalf("members called %q plain", k)
		}
		got[key] = v
	}
	if len(got) != len(want) {
		t.Fatalf("members found %d members, encoding/json %d: %q", len(got), len(want), b)
	}
	for k, v := range want {
		var a, c bytes.Buffer
		_ = json.Compact(&a, v)
		_ = json.Compact(&c, got[k])
		if a.String() != c.String() {
			t.Fatalf("member %q: members %q, encoding/json %q", k, got[k], v)
		}
	}
}

func agree(t *testing.T, b []byte, newV func() any) {
	fast, slow := newV(), newV()
	if fastjson.Unmarshal(b, fast) != nil {
		return // unmarshal falls back to encoding/json: nothing to compare
	}
	if err := json.Unmarshal(b, slow); err != nil {
		t.Fatalf("fast decoder accepted what encoding/json refuses (%v): %q", err, b)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("decoders disagree on %q:\nfast %#v\nslow %#v", b, fast, slow)
	}
}

// FuzzCheckJSON holds the guard to encoding/json and to a plain reference of its rules:
// what it accepts encoding/json accepts, with valid UTF-8, at most MaxDepth levels and
// no two keys of an object equal as encoding/json matches names (strings.EqualFold);
// what it refuses as malformed encoding/json refuses with the same error; and it
// accepts every well-formed input that the reference finds clean.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `{"a":1,"A":2}`, `{"a":1,"\u0061":2}`, `{"a":{"a":1}}`, `[{"a":1},{"a":1}]`,
		`{"s":"\ud83d\ude00"}`, `{"s":"\ud800"}`, `{"s":"\udc00"}`, "{\"s\":\"\xff\"}", `{"k":"K","\u212a":1}`,
		nest(MaxDepth), nest(MaxDepth + 1), strings.Repeat("[", 100), `{"a":1}x`, `{"a" 1}`, `01`, `-1.5e+10`,
		`{"a":"\"\\\/\b\f\n\r\t"}`, canonicalMessage,
	} {
		f.Add([]byte(s))
	}
	var big strings.Builder
	big.WriteString("{")
	for i := 0; i < 40; i++ {
		big.WriteString(`"k` + strings.Repeat("x", i) + `":1,`)
	}
	big.WriteString(`"KX":2}`)
	f.Add([]byte(big.String()))

	f.Fuzz(func(t *testing.T, b []byte) {
		err := CheckJSON(b)
		valid := json.Valid(b)
		if err == nil {
			if !valid {
				t.Fatalf("guard accepted what encoding/json refuses: %q", b)
			}
			if !utf8.Valid(b) {
				t.Fatalf("guard accepted invalid UTF-8: %q", b)
			}
			depth, dup, hasDup, rerr := reference(b)
			if rerr != nil {
				t.Fatalf("reference cannot read what the guard accepted (%v): %q", rerr, b)
			}
			if depth > MaxDepth {
				t.Fatalf("guard accepted depth %d: %q", depth, b)
			}
			if hasDup {
				t.Fatalf("guard accepted the duplicate key %q: %q", dup, b)
			}
			return
		}
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Fatalf("error %T is not a *FieldError: %v", err, err)
		}
		if strings.HasPrefix(fe.Reason, "invalid JSON") {
			if valid {
				t.Fatalf("guard called well-formed JSON malformed (%v): %q", err, b)
			}
			want := jsonErr(json.Unmarshal(b, new(json.RawMessage)), "")
			if fe.Error() != want.Error() {
				t.Fatalf("syntax error %q, encoding/json says %q: %q", fe, want, b)
			}
			return
		}
		if !valid {
			return // refused for a reason of its own before reaching the syntax error
		}
		if depth, _, hasDup, rerr := reference(b); rerr == nil && depth <= MaxDepth && !hasDup &&
			utf8.Valid(b) && !bytes.Contains(bytes.ToLower(b), []byte(`\ud`)) {
			t.Fatalf("guard refused a clean input (%v): %q", err, b)
		}
	})
}

// reference walks well-formed JSON with encoding/json's tokenizer: the deepest nesting,
// and a key that equals an earlier key of its object under strings.EqualFold.
func reference(b []byte) (depth int, dup string, hasDup bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // 1e700 is well-formed JSON, not a float64
	type obj struct {
		keys     []string
		isObj    bool
		wantsKey bool
	}
	var stack []*obj
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return depth, dup, hasDup, nil
		}
		if err != nil {
			return depth, dup, hasDup, err
		}
		var top *obj
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '{' || d == '[') {
			if top != nil && top.isObj {
				top.wantsKey = true
			}
			stack = append(stack, &obj{isObj: d == '{', wantsKey: d == '{'})
			depth = max(depth, len(stack))
			continue
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if top != nil && top.isObj {
			if top.wantsKey {
				k := tok.(string)
				for _, prev := range top.keys {
					if strings.EqualFold(prev, k) && !hasDup {
						dup, hasDup = k, true
					}
				}
				top.keys = append(top.keys, k)
				top.wantsKey = false
			} else {
				top.wantsKey = true
			}
		}
	}
}

// FuzzNormalizeJSON checks normalizeJSON against what it stands for: encoding/json's
// compaction of a RawMessage, on any valid JSON.
func FuzzNormalizeJSON(f *testing.F) {
	for _, s := range []string{`{"a": "b c", "d" : [1, "<&>"]}`, "{\"s\":\"\u2028 \u2029\\\"\"}\n", `"\\\"<"`, `[ ]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		want, err := json.Marshal(json.RawMessage(b))
		if err != nil {
			t.Fatal(err)
		}
		if got := normalizeJSON(bytes.Clone(b)); !bytes.Equal(got, want) {
			t.Fatalf("normalizeJSON(%q) = %q, encoding/json writes %q", b, got, want)
		}
	})
}
