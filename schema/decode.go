package schema

import (
	_ "embed"
	"encoding/json"
	"strings"
	"time"
)

// JSONSchema is the JSON Schema (draft 2020-12) of the canonical envelope.
//
//go:embed event.schema.json
var JSONSchema []byte

// SourceBand is the source of the events mapped from the platform's frames.
const SourceBand = "band"

// wire is one input line: a canonical event (it has "type") or a platform frame
// ({"topic", "event", "payload"}). Decoding into it once serves both forms, so that a
// canonical event is parsed once and straight into typed fields.
type wire struct {
	ID            string          `json:"id"`
	Type          string          `json:"type"`
	Time          string          `json:"time"`
	OrgID         string          `json:"org_id"`
	RoomID        string          `json:"room_id"`
	Actor         Party           `json:"actor"`
	Subject       *Party          `json:"subject"`
	ExecutionID   string          `json:"execution_id"`
	Source        string          `json:"source"`
	SchemaVersion *int            `json:"schema_version"`
	Data          json.RawMessage `json:"data"`

	// Platform frame.
	Topic      *string         `json:"topic"`
	Event      string          `json:"event"`
	Payload    json.RawMessage `json:"payload"`
	ReceivedAt string          `json:"received_at"` // set by some relays; the time of last resort
}

// Decode parses one line, a canonical event or a platform frame, into a canonical,
// validated Event: Time in UTC, SchemaVersion set to Version when absent, handles
// without '@', Data compact. A frame's Source is "band" and its ID is derived from the
// frame in the platform's scope (see DecodeFrom). Any error is a *FieldError.
//
// The line first passes CheckJSON (at most MaxDepth levels, no duplicate keys, valid
// UTF-8, no lone surrogates) before any decoder sees it; the event then passes
// Validate, limits included. So whatever Decode returns, marshalled and decoded again,
// gives the same event: ingest decodes the canonical form from Kafka with these rules.
//
// A frame that carries no time of its own (participant_added has none) gets the time it
// is decoded; use DecodeAt to choose it.
func Decode(line []byte) (Event, error) {
	return DecodeFrom(line, time.Time{}, PlatformWriter)
}

// DecodeAt is Decode with the time to give a frame that carries none: received, or the
// current time when received is zero. Canonical events always carry their own.
func DecodeAt(line []byte, received time.Time) (Event, error) {
	return DecodeFrom(line, received, PlatformWriter)
}

// DecodeFrom is DecodeAt for a line sent by writer: PlatformWriter for the platform's
// frames (a platform key's, or any read from Kafka, where only the platform produces
// frames), else the organization of the key that sent it. A frame's id is scoped by its
// writer: the same frame has the same id each time the same writer sends it, and another
// id when another writer does, so that no organization can take the id of a frame the
// platform has yet to send. A canonical event keeps the id it carries; from a writer
// other than the platform, one whose id has the form of a frame's (a UUID of version 8)
// is refused, as naming a frame's id directly would take it all the same.
func DecodeFrom(line []byte, received time.Time, writer string) (Event, error) {
	if fe := checkJSON(line, 0, ""); fe != nil {
		return Event{}, fe
	}
	var w wire
	if err := unmarshal(line, &w); err != nil {
		return Event{}, jsonErr(err, "")
	}
	var (
		e   Event
		err *FieldError
	)
	if w.Type == "" && w.Topic != nil {
		e, err = decodeFrame(&w, received, writer)
		if err != nil {
			return Event{}, err
		}
		if err := e.validate(true); err != nil {
			return Event{}, err
		}
		return e, nil
	}
	e, err = decodeCanonical(&w)
	if err != nil {
		return Event{}, err
	}
	if writer != PlatformWriter && isFrameID(e.ID) {
		return Event{}, fieldErr("id", "%s has the form of a frame's id (a UUID of version 8), which ingest derives from the frame: send the frame itself, or give the event an id of another form", quoteShort(e.ID))
	}
	return e, nil
}

func decodeCanonical(w *wire) (Event, *FieldError) {
	e := Event{
		ID:            w.ID,
		Type:          w.Type,
		OrgID:         w.OrgID,
		RoomID:        w.RoomID,
		Actor:         w.Actor,
		Subject:       w.Subject,
		ExecutionID:   w.ExecutionID,
		Source:        w.Source,
		SchemaVersion: Version,
	}
	if w.ID == "" {
		return Event{}, fieldErr("id", "missing")
	}
	if w.Type == "" {
		return Event{}, fieldErr("type", "missing")
	}
	if w.Time == "" {
		return Event{}, fieldErr("time", "missing")
	}
	t, err := parseTime("time", w.Time)
	if err != nil {
		return Event{}, err
	}
	e.Time = t
	if w.SchemaVersion != nil && *w.SchemaVersion != 0 {
		e.SchemaVersion = *w.SchemaVersion
	}
	e.Actor.Handle = strings.TrimPrefix(e.Actor.Handle, "@")
	if e.Subject != nil {
		e.Subject.Handle = strings.TrimPrefix(e.Subject.Handle, "@")
	}
	if len(w.Data) > 0 && string(w.Data) != "null" {
		e.Data = normalizeJSON(w.Data)
	}
	if err := e.validate(true); err != nil {
		return Event{}, err
	}
	return e, nil
}

// parseTime parses an RFC 3339 time, with or without fractional seconds; a time
// without a zone is UTC. The result is in UTC.
func parseTime(field, s string) (time.Time, *FieldError) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		var err2 error
		t, err2 = time.ParseInLocation("2006-01-02T15:04:05.999999999", s, time.UTC)
		if err2 != nil {
			return time.Time{}, fieldErr(field, "cannot parse %s as RFC 3339", quoteShort(s))
		}
	}
	return t.UTC(), nil
}

// jsonSpecial are the bytes normalizeJSON looks at: every other byte is copied as is.
var jsonSpecial = [256]bool{' ': true, '\t': true, '\n': true, '\r': true, '"': true, '\\': true, '<': true, '>': true, '&': true, 0xE2: true}

// normalizeJSON returns valid JSON v in the form encoding/json writes a RawMessage:
// without insignificant white space, and with <, >, &, U+2028 and U+2029 escaped in
// strings. Decoding what Marshal wrote then gives back the same bytes. v is returned as
// is when it is already so (white space inside strings, as in most text, is), and
// copied from the first byte that changes otherwise.
func normalizeJSON(v []byte) []byte {
	const hex = "0123456789abcdef"
	var (
		out      []byte // nil while v needs no change
		repl     [6]byte
		inString bool
	)
	for i := 0; i < len(v); i++ {
		at, c := i, v[i]
		if !jsonSpecial[c] {
			if out != nil {
				out = append(out, c)
			}
			continue
		}
		n := -1 // the length of what replaces c (and the two bytes after it, for U+2028 and U+2029) in repl
		switch {
		case !inString:
			switch c {
			case ' ', '\t', '\n', '\r':
				n = 0
			case '"':
				inString = true
			}
		case c == '\\': // an escape: the byte after it is copied with it
			if out != nil {
				out = append(out, v[i:min(i+2, len(v))]...)
			}
			i++
			continue
		case c == '"':
			inString = false
		case c == '<' || c == '>' || c == '&':
			repl, n = [6]byte{'\\', 'u', '0', '0', hex[c>>4], hex[c&0xF]}, 6
		case c == 0xE2 && i+2 < len(v) && v[i+1] == 0x80 && v[i+2]&^1 == 0xA8:
			repl, n = [6]byte{'\\', 'u', '2', '0', '2', hex[v[i+2]&0xF]}, 6
			i += 2
		}
		switch {
		case n < 0 && out != nil:
			out = append(out, c)
		case n >= 0:
			if out == nil {
				out = append(make([]byte, 0, len(v)+16), v[:at]...)
			}
			out = append(out, repl[:n]...)
		}
	}
	if out == nil {
		return v
	}
	return out
}
