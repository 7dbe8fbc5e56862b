package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Validate reports the first thing wrong with e as a *FieldError, or nil. Decode calls it
// on every event it returns; producers of canonical events can call it before sending.
//
// The envelope needs an id, a lowercase `noun.verb` type (unknown ones are allowed), a
// time within [MinTime, MaxTime] (what ClickHouse's DateTime holds), a source, and a
// schema_version from 1 to Version. Message, room event (event.*) and usage types need
// the sender as actor.id. Actor and subject types must be agent, user or system when
// given; handles, wherever given, must be `person` or `owner/agent-slug` with an
// optional leading '@'. Data, when present, must be a JSON object that passes
// CheckJSON at its place in the event; for the types whose data the contract fixes, it
// is checked too: token counts are integers in [0, MaxTokens], directory events name
// their subject, owner and handle, contact and mention handles are well formed.
//
// The limits (see limits.go): every id — id, org_id, room_id, actor.id, subject.id,
// execution_id, and in data owner_id (agent.*), task_id and assignee_id (task.*),
// request_id (contact.*), participant_id (participant.*), the mentions' id, and
// message_id, thread_id, tool_call_id and model where the type has them — is at most
// MaxIDBytes of valid UTF-8 without control characters (C0, DEL, C1); a handle at most
// MaxHandleBytes; the type at most MaxTypeBytes; the source at most MaxSourceBytes,
// without control characters. The org_id "*" is reserved: it means the platform in API
// keys.
func (e *Event) Validate() error {
	if err := e.validate(false); err != nil {
		return err
	}
	return nil
}

// validate is Validate; trustedData says Data has passed the guard as part of the line
// Decode has just read, which saves a scan on the hot path.
func (e *Event) validate(trustedData bool) *FieldError {
	if e.ID == "" {
		return fieldErr("id", "missing")
	}
	if fe := checkID("id", e.ID); fe != nil {
		return fe
	}
	if e.Type == "" {
		return fieldErr("type", "missing")
	}
	if len(e.Type) > MaxTypeBytes {
		return fieldErr("type", "%d bytes is longer than the limit of %d", len(e.Type), MaxTypeBytes)
	}
	if !isEventType(e.Type) {
		return fieldErr("type", "%s is not a lowercase noun.verb type", quoteShort(e.Type))
	}
	if e.Time.IsZero() {
		return fieldErr("time", "zero time")
	}
	if fe := checkTime("time", e.Time); fe != nil {
		return fe
	}
	if e.Source == "" {
		return fieldErr("source", "missing")
	}
	if len(e.Source) > MaxSourceBytes {
		return fieldErr("source", "%d bytes is longer than the limit of %d", len(e.Source), MaxSourceBytes)
	}
	if r := idProblem(e.Source); r != "" {
		return fieldErr("source", "%s", r)
	}
	// Printable ASCII only: a source that looks like one of bandplane's own with
	// lookalike letters must not pass for it (OwnSource).
	for i := 0; i < len(e.Source); i++ {
		if c := e.Source[i]; c < 0x20 || c > 0x7e {
			return fieldErr("source", "byte %d is not printable ASCII (0x%02x)", i, c)
		}
	}
	if fe := checkID("org_id", e.OrgID); fe != nil {
		return fe
	}
	if e.OrgID == "*" {
		return fieldErr("org_id", `"*" is reserved (it means the platform in API keys)`)
	}
	if fe := checkID("room_id", e.RoomID); fe != nil {
		return fe
	}
	if fe := checkID("execution_id", e.ExecutionID); fe != nil {
		return fe
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

// checkID checks an id against the limits; an empty id is not checked (whether it may
// be missing is the caller's business).
func checkID(field, id string) *FieldError {
	if len(id) > MaxIDBytes {
		return fieldErr(field, "%d bytes is longer than the limit of %d", len(id), MaxIDBytes)
	}
	if r := idProblem(id); r != "" {
		return fieldErr(field, "%s", r)
	}
	return nil
}

// IDProblem says what is wrong with s as an id, whatever field it will land in: a
// control character (C0, DEL or C1) or invalid UTF-8; "" when nothing is. Its length is
// the caller's to bound (MaxIDBytes).
func IDProblem(s string) string { return idProblem(s) }

// idProblem says what is wrong with the bytes of an id, source or handle: a control
// character (C0, DEL or C1) or invalid UTF-8; "" when nothing is.
func idProblem[T string | []byte](s T) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f {
			return fmt.Sprintf("control character 0x%02x at byte %d", c, i)
		}
		if c >= utf8.RuneSelf {
			return idProblemSlow(string(s[i:]), i)
		}
	}
	return ""
}

func idProblemSlow(s string, off int) string {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return fmt.Sprintf("invalid UTF-8 at byte %d", off+i)
		case r < 0x20 || r == 0x7f:
			return fmt.Sprintf("control character 0x%02x at byte %d", r, off+i)
		case r >= 0x80 && r <= 0x9f:
			return fmt.Sprintf("control character U+%04X at byte %d", r, off+i)
		}
		i += n
	}
	return ""
}

// checkHandle checks a handle's length (without a leading '@', as ValidHandle counts
// it), then its form.
func checkHandle(field, h string) *FieldError {
	if h == "" {
		return nil
	}
	if n := len(strings.TrimPrefix(h, "@")); n > MaxHandleBytes {
		return fieldErr(field, "%d bytes is longer than the limit of %d", n, MaxHandleBytes)
	}
	if !ValidHandle(h) {
		return fieldErr(field, "invalid handle %q", h)
	}
	return nil
}

// checkTime checks that t is a time ClickHouse's DateTime can hold.
func checkTime(field string, t time.Time) *FieldError {
	if t.Before(MinTime) || t.After(MaxTime) {
		return fieldErr(field, "%s is outside [%s, %s]", t.UTC().Format(time.RFC3339Nano),
			MinTime.Format(time.RFC3339Nano), MaxTime.Format(time.RFC3339Nano))
	}
	return nil
}

// checkTokens checks a token count against [0, MaxTokens].
func checkTokens(field string, n int64) *FieldError {
	if n < 0 {
		return fieldErr(field, "negative token count %d", n)
	}
	if n > MaxTokens {
		return fieldErr(field, "%d is above the cap of %d tokens", n, MaxTokens)
	}
	return nil
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
		return fieldErr(name+".type", "unknown actor type %s (want agent, user or system)", quoteShort(string(p.Type)))
	}
	if len(p.ID) > MaxIDBytes || idProblem(p.ID) != "" {
		return checkID(name+".id", p.ID)
	}
	if p.Handle == "" {
		return nil
	}
	// Decode strips the '@' of a party's handle: one that still has one is malformed.
	if len(p.Handle) > MaxHandleBytes || p.Handle[0] == '@' || !ValidHandle(p.Handle) {
		if fe := checkHandle(name+".handle", p.Handle); fe != nil {
			return fe
		}
		return fieldErr(name+".handle", "invalid handle %q", p.Handle)
	}
	return nil
}

// checkObject says whether data is a JSON object. Unless trusted, it also checks that
// data passes the guard as the data of an event (one level down).
func checkObject(data []byte, trusted bool) *FieldError {
	if !trusted {
		if fe := checkJSON(data, 1, "data"); fe != nil {
			return fe
		}
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
		return checkUsage(e.Data)
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
		if fe := checkID("data.owner_id", a.OwnerID); fe != nil {
			return fe
		}
		if a.Handle == "" {
			return fieldErr("data.handle", "missing")
		}
		if fe := checkHandle("data.handle", a.Handle); fe != nil {
			return fe
		}
		if !strings.Contains(a.Handle, "/") {
			return fieldErr("data.handle", "invalid agent handle %q (want owner/agent-slug)", a.Handle)
		}
		return checkID("data.model", a.Model)
	case e.Type == TypeUserRegistered:
		if e.Subject == nil || e.Subject.ID == "" {
			return fieldErr("subject.id", "missing user")
		}
		var u UserData
		if err := decodeData(e.Data, &u); err != nil {
			return err
		}
		return checkHandle("data.handle", u.Handle)
	case strings.HasPrefix(e.Type, "contact."):
		var c ContactData
		if err := decodeData(e.Data, &c); err != nil {
			return err
		}
		if fe := checkID("data.request_id", c.RequestID); fe != nil {
			return fe
		}
		for _, h := range [...]struct{ name, v string }{
			{"data.from_handle", c.FromHandle}, {"data.to_handle", c.ToHandle}, {"data.handle", c.Handle},
		} {
			if fe := checkHandle(h.name, h.v); fe != nil {
				return fe
			}
		}
	case strings.HasPrefix(e.Type, "participant."):
		var d ParticipantData
		if err := decodeData(e.Data, &d); err != nil {
			return err
		}
		if fe := checkID("data.participant_id", d.ParticipantID); fe != nil {
			return fe
		}
		return checkHandle("data.handle", d.Handle)
	case strings.HasPrefix(e.Type, "task."):
		var d TaskData
		if err := decodeData(e.Data, &d); err != nil {
			return err
		}
		if fe := checkID("data.task_id", d.TaskID); fe != nil {
			return fe
		}
		return checkID("data.assignee_id", d.Assignee)
	case strings.HasPrefix(e.Type, "message.") || strings.HasPrefix(e.Type, "event."):
		// Messages are most of the traffic: read only the members that are checked, in
		// one pass, matching names as the struct decoders do (ignoring case).
		it := members{data: e.Data}
		for {
			k, plain, v, ok := it.next()
			if !ok {
				return nil
			}
			var fe *FieldError
			switch {
			case keyIs(k, plain, "mentions"):
				fe = checkMentions(v)
			case keyIs(k, plain, "message_id"):
				fe = checkDataID("data.message_id", v)
			case keyIs(k, plain, "thread_id"):
				fe = checkDataID("data.thread_id", v)
			case keyIs(k, plain, "tool_call_id"):
				fe = checkDataID("data.tool_call_id", v)
			}
			if fe != nil {
				return fe
			}
		}
	}
	return nil
}

// usageFields are the members of usage data that are checked, in the order they are.
var usageFields = [...]string{"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "model", "message_id"}

// checkUsage checks usage data: every token count in [0, MaxTokens], the model and the
// message id as ids.
func checkUsage(data []byte) *FieldError {
	if fe, done := checkPlainUsage(data); done {
		return fe
	}
	return checkDecodedUsage(data)
}

// checkDecodedUsage is checkUsage by decoding the data.
func checkDecodedUsage(data []byte) *FieldError {
	var u UsageData
	if err := decodeData(data, &u); err != nil {
		return err
	}
	for i, n := range [...]int64{u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens} {
		if fe := checkTokens("data."+usageFields[i], n); fe != nil {
			return fe
		}
	}
	if u.ReasoningTokens != nil {
		if fe := checkTokens("data.reasoning_tokens", *u.ReasoningTokens); fe != nil {
			return fe
		}
	}
	if fe := checkID("data.model", u.Model); fe != nil {
		return fe
	}
	return checkID("data.message_id", u.MessageID)
}

// checkPlainUsage is checkUsage without decoding, for data in the usual form: keys
// without escapes, counts written as integers of at most 18 digits (or null), model and
// message_id strings without escapes (or null). It is not done when it meets anything
// else; then the decoder says what the data is. Other members are skipped, as the
// decoder skips them.
func checkPlainUsage(data []byte) (fe *FieldError, done bool) {
	var (
		counts       [5]int64
		hasReasoning bool
		strs         [2][]byte // model, message_id
	)
	it := members{data: data}
	for {
		k, plain, v, ok := it.next()
		if !ok {
			break
		}
		if !plain {
			return nil, false
		}
		f := -1
		for i, name := range usageFields {
			if keyIs(k, true, name) {
				f = i
				break
			}
		}
		switch {
		case f < 0 || v[0] == 'n': // not checked, or null: as absent
		case f < len(counts):
			n, ok := plainInt(v)
			if !ok {
				return nil, false
			}
			counts[f] = n
			hasReasoning = hasReasoning || f == 4
		default:
			if v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
				return nil, false
			}
			strs[f-len(counts)] = v[1 : len(v)-1]
		}
	}
	for i, n := range counts {
		if i < 4 || hasReasoning {
			if n < 0 || n > MaxTokens {
				return checkTokens("data."+usageFields[i], n), true
			}
		}
	}
	for i, s := range strs {
		if len(s) > MaxIDBytes || idProblem(s) != "" {
			return checkID("data."+usageFields[len(counts)+i], string(s)), true
		}
	}
	return nil, true
}

// plainInt reads a JSON number written as an integer of at most 18 digits, which an
// int64 always holds.
func plainInt(v []byte) (int64, bool) {
	neg := len(v) > 0 && v[0] == '-'
	if neg {
		v = v[1:]
	}
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

func checkMentions(raw []byte) *FieldError {
	if fe, done := checkPlainMentions(raw); done {
		return fe
	}
	return checkDecodedMentions(raw)
}

func tooManyMentions() *FieldError {
	return fieldErr("data.mentions", "more than %d mentions", MaxMentions)
}

// checkDecodedMentions is checkMentions by decoding the mentions.
func checkDecodedMentions(raw []byte) *FieldError {
	var mentions []Mention
	if err := unmarshal(raw, &mentions); err != nil {
		fe := jsonErr(err, "data.mentions")
		if fe.Field == "" {
			fe.Field = "data.mentions"
		}
		return fe
	}
	if len(mentions) > MaxMentions {
		return tooManyMentions()
	}
	for i, m := range mentions {
		if len(m.ID) > MaxIDBytes || idProblem(m.ID) != "" {
			return checkID(fmt.Sprintf("data.mentions[%d].id", i), m.ID)
		}
		if m.Handle != "" && !ValidHandle(m.Handle) {
			return checkHandle(fmt.Sprintf("data.mentions[%d].handle", i), m.Handle)
		}
	}
	return nil
}

// checkPlainMentions checks mentions in their usual form, without decoding them: an
// array of objects whose id and handle are strings without escapes (or null). It is
// not done when it meets anything else; then the decoder says what the mentions are.
// Other members of a mention are skipped, as the decoder skips them.
func checkPlainMentions(raw []byte) (fe *FieldError, done bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	if i = skipSpace(raw, i+1); i < len(raw) && raw[i] == ']' {
		return nil, true
	}
	for n := 0; ; n++ {
		if n == MaxMentions {
			return tooManyMentions(), true
		}
		if i >= len(raw) || raw[i] != '{' {
			return nil, false
		}
		end := skipValue(raw, i)
		var id, handle []byte
		it := members{data: raw[i:end]}
		for {
			k, plain, v, ok := it.next()
			if !ok {
				break
			}
			if !plain {
				return nil, false
			}
			isID := keyIs(k, true, "id")
			if !isID && !keyIs(k, true, "handle") {
				continue
			}
			if v[0] == 'n' {
				continue // null: as absent
			}
			if v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
				return nil, false
			}
			if isID {
				id = v[1 : len(v)-1]
			} else {
				handle = v[1 : len(v)-1]
			}
		}
		if len(id) > MaxIDBytes || idProblem(id) != "" {
			return checkID(fmt.Sprintf("data.mentions[%d].id", n), string(id)), true
		}
		if len(handle) > 0 && !validHandle(handle) {
			return checkHandle(fmt.Sprintf("data.mentions[%d].handle", n), string(handle)), true
		}
		if i = skipSpace(raw, end); i < len(raw) && raw[i] == ']' {
			return nil, true
		}
		if i >= len(raw) || raw[i] != ',' {
			return nil, false
		}
		i = skipSpace(raw, i+1)
	}
}

// checkDataID checks the id in a member of data: a string, or null.
func checkDataID(field string, v []byte) *FieldError {
	if len(v) == 0 || v[0] == 'n' {
		return nil
	}
	if v[0] != '"' {
		return fieldErr(field, "expected string, got %s", valueKind(v))
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		var id string
		if err := json.Unmarshal(v, &id); err != nil {
			return jsonErr(err, field)
		}
		return checkID(field, id)
	}
	if len(s) > MaxIDBytes {
		return fieldErr(field, "%d bytes is longer than the limit of %d", len(s), MaxIDBytes)
	}
	if r := idProblem(s); r != "" {
		return fieldErr(field, "%s", r)
	}
	return nil
}

// valueKind names the kind of a JSON value as encoding/json's errors do.
func valueKind(v []byte) string {
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
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
// (`alice/reviewer-agent`), with or without a leading '@', of at most MaxHandleBytes
// (without the '@'). Each part starts with a letter or digit and continues with
// letters, digits, '_', '.' or '-'; case does not matter.
func ValidHandle(h string) bool { return validHandle(h) }

func validHandle[T string | []byte](h T) bool {
	if len(h) > 0 && h[0] == '@' {
		h = h[1:]
	}
	if len(h) > MaxHandleBytes {
		return false
	}
	slash := -1
	for i := 0; i < len(h); i++ {
		if h[i] == '/' {
			slash = i
			break
		}
	}
	if slash < 0 {
		return validHandlePart(h)
	}
	return validHandlePart(h[:slash]) && validHandlePart(h[slash+1:])
}

func validHandlePart[T string | []byte](s T) bool {
	if len(s) == 0 {
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

// members iterates over the members of a JSON object that has passed the guard.
type members struct {
	data []byte
	i    int // after the '{' once started
}

// next returns the next member: its key as written (between the quotes), whether that
// is plain (no escapes, ASCII only), and its value; ok is false after the last.
func (m *members) next() (key []byte, plain bool, val []byte, ok bool) {
	d := m.data
	if m.i == 0 {
		m.i = skipSpace(d, 0)
		if m.i >= len(d) || d[m.i] != '{' {
			m.i = len(d)
			return nil, false, nil, false
		}
		m.i++
	}
	i := skipSpace(d, m.i)
	if i < len(d) && d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	if i >= len(d) || d[i] != '"' {
		m.i = len(d)
		return nil, false, nil, false
	}
	start := i + 1
	plain = true
	end := skipString(d, i)
	key = d[start:max(start, end-1)]
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	i = skipSpace(d, end)
	if i >= len(d) || d[i] != ':' {
		m.i = len(d)
		return nil, false, nil, false
	}
	i = skipSpace(d, i+1)
	end = skipValue(d, i)
	m.i = end
	return key, plain, d[i:end], true
}

// keyIs says whether a key as written matches name (plain, lower case) the way the
// struct decoders match it: unescaped, ignoring case (Unicode folding included).
func keyIs(key []byte, plain bool, name string) bool {
	if plain {
		if len(key) != len(name) {
			return false
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c != name[i] && (c|0x20 != name[i] || c|0x20 < 'a' || c|0x20 > 'z') {
				return false
			}
		}
		return true
	}
	j := 0
	for i := 0; i < len(key); {
		var r rune
		r, i = keyRune(key, i)
		if j >= len(name) || foldRune(r) != foldRune(rune(name[j])) {
			return false
		}
		j++
	}
	return j == len(name)
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
			i = skipString(data, i)
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

// skipString returns the end of the (valid) JSON string that starts at i.
func skipString(data []byte, i int) int {
	// Most strings are short: look at their first bytes one by one.
	n := i + 17
	for i++; i < len(data) && i < n; i++ {
		switch data[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
	for ; i < len(data); i++ {
		j := bytes.IndexByte(data[i:], '"')
		if j < 0 {
			return len(data)
		}
		i += j
		// The quote ends the string unless an odd number of backslashes escapes it.
		k := i
		for k > 0 && data[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 {
			return i + 1
		}
	}
	return len(data)
}

func isDelim(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
