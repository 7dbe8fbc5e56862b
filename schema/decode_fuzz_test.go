package schema

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// FuzzDecode: Decode never panics, fails only with a *FieldError, is deterministic, and
// what it returns is valid and survives a round trip: json.Marshal of the event, decoded
// again, gives the same event, byte for byte in Data. A line the guard refuses is refused
// with the guard's error; an accepted line passed the guard, and so does its canonical
// form.
func FuzzDecode(f *testing.F) {
	if b, err := os.ReadFile("testdata/band/frames.ndjson"); err == nil {
		for _, line := range splitLines(b) {
			f.Add(line)
		}
	}
	f.Add([]byte(canonicalMessage))
	f.Add([]byte(`{"id":"e","type":"usage.reported","time":"2026-02-09T10:31:00+02:00","actor":{"id":"a","type":"agent","handle":"@o/a"},"source":"band","data":{"input_tokens":1,"output_tokens":2,"cache_read_tokens":0,"cache_write_tokens":0}}`))
	f.Add([]byte(`{"id":"e","type":"agent.registered","time":"2026-02-09T10:31:00","source":"core","subject":{"id":"a"},"data":{ "handle" : "o/a", "owner_id":"o", "d":"<&>"}}`))
	f.Add([]byte(`{"topic":"chat_room:r","event":"event_created","payload":{"id":"e","content":"x","message_type":"tool_result","metadata":{"function":{"name":"f","arguments":"{\"a\":1}"}},"sender_id":"a","sender_type":"Agent","inserted_at":"2026-02-09T10:31:00.1"}}`))
	f.Add([]byte(`{"topic":"room_participants:r","event":"participant_added","payload":{"id":"p","type":"User","handle":"@alice","is_external":true},"received_at":"2026-02-09T10:31:00Z"}`))
	f.Add([]byte(`{"topic":"foo:bar","event":"x_y","payload":{}}`))
	// Hostile lines: the guard's and the limits' refusals.
	f.Add(deepLine(MaxDepth))
	f.Add(deepLine(MaxDepth + 1))
	f.Add([]byte(`{"id":"e","ID":"f","type":"message.created","time":"2026-02-09T10:31:00Z","actor":{"id":"a"},"source":"s"}`))
	f.Add([]byte(`{"id":"e\ud800","type":"message.created","time":"2026-02-09T10:31:00Z","actor":{"id":"a"},"source":"s"}`))
	f.Add([]byte("{\"id\":\"e\xff\",\"type\":\"message.created\",\"time\":\"2026-02-09T10:31:00Z\",\"actor\":{\"id\":\"a\"},\"source\":\"s\"}"))
	f.Add([]byte(`{"id":"e","type":"usage.reported","time":"9999-02-09T10:31:00Z","actor":{"id":"a"},"source":"s","data":{"input_tokens":1000000001}}`))
	f.Add([]byte(`{"topic":"chat_room:r","event":"event_created","payload":{"id":"e","message_type":"task","metadata":{"band_usage":{"input_tokens":1.2e3,"output_tokens":-0}},"sender_id":"a","inserted_at":"2026-02-09T10:00:00Z"}}`))
	f.Add([]byte(`{"topic":"chat_room:r","event":"event_created","payload":{"message_type":"tool_call","content":"{\"name\":\"f\",\"args\":\"[[[[{\\\"a\\\":1}]]]]\"}","sender_id":"a","inserted_at":"2026-02-09T10:00:00Z"}}`))
	f.Add(frame("chat_room:r", "message_created", `{"id":"m","content":"x","sender_id":"u","inserted_at":"2026-02-09T10:00:00Z","deep":`+strings.Repeat("[", MaxDepth-2)+strings.Repeat("]", MaxDepth-2)+`}`))

	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := DecodeAt(line, received)
		guard := CheckJSON(line)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T is not a *FieldError: %v", err, err)
			}
			if guard != nil && guard.Error() != err.Error() {
				t.Fatalf("the guard says %q, Decode %q", guard, err)
			}
			return
		}
		if guard != nil {
			t.Fatalf("Decode accepted what the guard refuses (%v)", guard)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("Decode returned an invalid event: %v\n%+v", err, e)
		}
		if e.Time.Location().String() != "UTC" {
			t.Fatalf("time not in UTC: %v", e.Time)
		}
		again, err := DecodeAt(line, received)
		if err != nil || !sameEvent(e, again) {
			t.Fatalf("not deterministic: %+v vs %+v (%v)", e, again, err)
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatalf("marshal: %v\n%+v", err, e)
		}
		if err := CheckJSON(b); err != nil {
			t.Fatalf("the canonical form does not pass the guard: %v\n%s", err, b)
		}
		rt, err := Decode(b)
		if err != nil {
			t.Fatalf("decoding the marshalled event: %v\n%s", err, b)
		}
		if !sameEvent(e, rt) {
			t.Fatalf("round trip changed the event:\n in: %s\nout: %+v\nwas: %+v", b, rt, e)
		}
	})
}

func sameEvent(a, b Event) bool {
	if !a.Time.Equal(b.Time) || a.Time.Location() != b.Time.Location() {
		return false
	}
	if (a.Subject == nil) != (b.Subject == nil) || a.Subject != nil && *a.Subject != *b.Subject {
		return false
	}
	return a.ID == b.ID && a.Type == b.Type && a.OrgID == b.OrgID && a.RoomID == b.RoomID &&
		a.Actor == b.Actor && a.ExecutionID == b.ExecutionID && a.Source == b.Source &&
		a.SchemaVersion == b.SchemaVersion && string(a.Data) == string(b.Data)
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == '\n' {
			if i > start {
				out = append(out, b[start:i])
			}
			start = i + 1
		}
	}
	if start < len(b) {
		out = append(out, b[start:])
	}
	return out
}
