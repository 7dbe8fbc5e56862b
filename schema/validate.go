package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Validate reports the first thing wrong with e as a *FieldError, or nil. Decode calls it
// on every event it returns; producers of canonical events can call it before sending.
//
// The envelope needs an id, a lowercase `noun.verb` type (unknown ones are allowed), a
// non-zero time, a source, and a schema_version from 1 to Version. Message, room event
// (event.*) and usage types need the sender as actor.id. Actor and subject types must be
// agent, user or system when given; handles, wherever given, must be `person` or
// `owner/agent-slug` with an optional leading '@'. Data, when present, must be a JSON
// object; for the types whose data the contract fixes, it is checked too: token counts
// are not negative, directory events name their subject, owner and handle, contact and
// mention handles are well formed.
func (e *Event) Validate() error {
	if err := e.validate(false); err != nil {
		return err
	}
	return nil
}

// validate is Validate; trustedData says Data is known to be valid JSON (Decode has
// just parsed it), which saves a scan on the hot path.
func (e *Event) validate(trustedData bool) *FieldError {
	if e.ID == "" {
		return fieldErr("id", "missing")
	}
	if e.Type == "" {
		return fieldErr("type", "missing")
	}
	if !isEventType(e.Type) {
		return fieldErr("type", "%q is not a lowercase noun.verb type", e.Type)
	}
	if e.Time.IsZero() {
		return fieldErr("time", "zero time")
	}
	if y := e.Time.UTC().Year(); y < 1 || y > 9999 {
		return fieldErr("time", "year %d out of range", y)
	}
	if e.Source == "" {
		return fieldErr("source", "missing")
	}
	if e.SchemaVersion > Version {
		return fieldErr("schema_version", "version %d is newer than the supported version %d", e.SchemaVersion, Version)
	}
	if e.SchemaVersion < 1 {
		return fieldErr("schema_version", "version %d is not positive", e.SchemaVersion)
	}
	if err := validateParty("actor", &e.Actor); err != nil {
		return err
	}
	if e.Subject != nil {
		if err := validateParty("subject", e.Subject); err != nil {
			return err
		}
	}
	if e.Actor.ID == "" && needsSender(e.Type) {
		return fieldErr("actor.id", "missing sender")
	}
	if len(e.Data) > 0 {
		if err := checkObject(e.Data, trustedData); err != nil {
			return err
		}
	}
	return e.validateData()
}

// needsSender says whether a type is something a party said or spent: messages, room
// events and usage. A deletion may name only the message.
func needsSender(typ string) bool {
	switch {
	case typ == TypeMessageDeleted:
		return false
	case strings.HasPrefix(typ, "message."), strings.HasPrefix(typ, "event."), strings.HasPrefix(typ, "usage."):
		return true
	}
	return false
}

func validateParty(name string, p *Party) *FieldError {
	switch p.Type {
	case "", ActorAgent, ActorUser, ActorSystem:
	default:
		return fieldErr(name+".type", "unknown actor type %q (want agent, user or system)", string(p.Type))
	}
	// Decode strips the '@' of a party's handle: one that still has one is malformed.
	if p.Handle != "" && (p.Handle[0] == '@' || !ValidHandle(p.Handle)) {
		return fieldErr(name+".handle", "invalid handle %q", p.Handle)
	}
	return nil
}

// checkObject says whether data is a JSON object. Unless trusted, it also checks that
// data is valid JSON at all.
func checkObject(data []byte, trusted bool) *FieldError {
	if !trusted && !json.Valid(data) {
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			if fe := jsonErr(err, ""); fe.Field == "" {
				return fieldErr("data", "%s", fe.Reason)
			}
		}
		return fieldErr("data", "invalid JSON")
	}
	t := bytes.TrimLeft(data, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return fieldErr("data", "must be a JSON object, got %s", kindOf(t))
	}
	return nil
}

func kindOf(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// validateData checks the data of the types whose data the contract fixes.
func (e *Event) validateData() *FieldError {
	switch {
	case e.Type == TypeUsageReported:
		var u UsageData
		if err := decodeData(e.Data, &u); err != nil {
			return err
		}
		for _, c := range [...]struct {
			name string
			v    int64
		}{
			{"input_tokens", u.InputTokens},
			{"output_tokens", u.OutputTokens},
			{"cache_read_tokens", u.CacheReadTokens},
			{"cache_write_tokens", u.CacheWriteTokens},
		} {
			if c.v < 0 {
				return fieldErr("data."+c.name, "negative token count %d", c.v)
			}
		}
		if u.ReasoningTokens != nil && *u.ReasoningTokens < 0 {
			return fieldErr("data.reasoning_tokens", "negative token count %d", *u.ReasoningTokens)
		}
	case e.Type == TypeAgentRegistered || e.Type == TypeAgentUpdated:
		if e.Subject == nil || e.Subject.ID == "" {
			return fieldErr("subject.id", "missing agent")
		}
		var a AgentData
		if err := decodeData(e.Data, &a); err != nil {
			return err
		}
		if a.OwnerID == "" {
			return fieldErr("data.owner_id", "missing")
		}
		if a.Handle == "" {
			return fieldErr("data.handle", "missing")
		}
		if !ValidHandle(a.Handle) || !strings.Contains(a.Handle, "/") {
			return fieldErr("data.handle", "invalid agent handle %q (want owner/agent-slug)", a.Handle)
		}
	case e.Type == TypeUserRegistered:
		if e.Subject == nil || e.Subject.ID == "" {
			return fieldErr("subject.id", "missing user")
		}
		var u UserData
		if err := decodeData(e.Data, &u); err != nil {
			return err
		}
		if u.Handle != "" && !ValidHandle(u.Handle) {
			return fieldErr("data.handle", "invalid handle %q", u.Handle)
		}
	case strings.HasPrefix(e.Type, "contact."):
		var c ContactData
		if err := decodeData(e.Data, &c); err != nil {
			return err
		}
		for _, h := range [...]struct{ name, v string }{
			{"from_handle", c.FromHandle}, {"to_handle", c.ToHandle}, {"handle", c.Handle},
		} {
			if h.v != "" && !ValidHandle(h.v) {
				return fieldErr("data."+h.name, "invalid handle %q", h.v)
			}
		}
	case strings.HasPrefix(e.Type, "message.") || strings.HasPrefix(e.Type, "event."):
		// Only mentions are checked: parse them alone (the hot path is mostly messages).
		raw := topLevelValue(e.Data, "mentions")
		if raw == nil {
			return nil
		}
		var mentions []Mention
		if err := unmarshal(raw, &mentions); err != nil {
			fe := jsonErr(err, "data.mentions")
			if fe.Field == "" {
				fe.Field = "data.mentions"
			}
			return fe
		}
		for i, mm := range mentions {
			if mm.Handle != "" && !ValidHandle(mm.Handle) {
				return fieldErr(fmt.Sprintf("data.mentions[%d].handle", i), "invalid handle %q", mm.Handle)
			}
		}
	}
	return nil
}

func decodeData(data []byte, v any) *FieldError {
	if len(data) == 0 {
		return nil
	}
	if err := unmarshal(data, v); err != nil {
		fe := jsonErr(err, "data.")
		if fe.Field == "" {
			fe.Field = "data"
		}
		return fe
	}
	return nil
}

// ValidHandle says whether h is a person's handle (`alice`) or an agent's
// (`alice/reviewer-agent`), with or without a leading '@'. Each part starts with a
// letter or digit and continues with letters, digits, '_', '.' or '-'; case does not
// matter.
func ValidHandle(h string) bool {
	h = strings.TrimPrefix(h, "@")
	owner, slug, isAgent := strings.Cut(h, "/")
	if !validHandlePart(owner) {
		return false
	}
	return !isAgent || validHandlePart(slug)
}

func validHandlePart(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20 // ASCII lower case; maps no other byte into a-z
		switch {
		case c >= 'a' && c <= 'z', s[i] >= '0' && s[i] <= '9':
		case i > 0 && (s[i] == '_' || s[i] == '.' || s[i] == '-'):
		default:
			return false
		}
	}
	return true
}

// isEventType says whether t looks like `noun.verb`: two lowercase words, each a letter
// then letters, digits or underscores, joined by one dot.
func isEventType(t string) bool {
	noun, verb, ok := strings.Cut(t, ".")
	return ok && isWord(noun) && isWord(verb)
}

func isWord(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// topLevelValue returns the value of key in the JSON object data, or nil. data must be
// valid JSON; only a key written without escapes is found (which is how encoding/json
// writes the keys of the data types).
func topLevelValue(data []byte, key string) []byte {
	if !bytes.Contains(data, []byte(key)) {
		return nil
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil
	}
	i++
	for {
		i = skipSpace(data, i)
		if i >= len(data) || data[i] != '"' {
			return nil
		}
		kEnd := skipValue(data, i)
		k := data[i+1 : kEnd-1]
		i = skipSpace(data, kEnd)
		if i >= len(data) || data[i] != ':' {
			return nil
		}
		i = skipSpace(data, i+1)
		vEnd := skipValue(data, i)
		if string(k) == key {
			return data[i:vEnd]
		}
		i = skipSpace(data, vEnd)
		if i >= len(data) || data[i] != ',' {
			return nil
		}
		i++
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the (valid) JSON value that starts at i.
func skipValue(data []byte, i int) int {
	depth := 0
	for i < len(data) {
		switch c := data[i]; c {
		case '"':
			i++
			for i < len(data) && data[i] != '"' {
				if data[i] == '\\' {
					i++
				}
				i++
			}
			i++
		case '{', '[':
			depth++
			i++
		case '}', ']':
			depth--
			i++
		default:
			i++
			if c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				// separators only occur inside containers here
				continue
			}
			if depth == 0 {
				// a literal: run to its end
				for i < len(data) && !isDelim(data[i]) {
					i++
				}
				return i
			}
		}
		if depth == 0 {
			return i
		}
	}
	return i
}

func isDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
