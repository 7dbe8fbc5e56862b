package schema

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	fastjson "github.com/segmentio/encoding/json"
)

// FuzzFastJSONAgrees checks the premise of unmarshal: whatever the fast decoder accepts,
// encoding/json accepts too and decodes to the same value.
func FuzzFastJSONAgrees(f *testing.F) {
	if b, err := os.ReadFile("testdata/band/frames.ndjson"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f.Add([]byte(l))
		}
	}
	f.Add([]byte(`{"id":"e","type":"usage.reported","time":"2026-11-02T10:00:00Z","actor":{"id":"a","type":"agent"},"source":"s","data":{"input_tokens":1,"output_tokens":2,"cache_read_tokens":0,"cache_write_tokens":0,"model":"m"}}`))
	f.Add([]byte(`{"id":"e","data":{"a":[1,2,{"b":"\u00e9\ud83d\ude00"}]},"actor":{"id":"x"}}`))
	f.Add([]byte(`[{"id":"m","handle":"h"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		agree(t, b, func() any { return new(wire) })
		agree(t, b, func() any { return new(UsageData) })
		agree(t, b, func() any { return new([]Mention) })
	})
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
