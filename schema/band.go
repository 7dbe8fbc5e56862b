package schema

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The platform's frames: {"topic": "<channel>:<id>", "event": "<noun>_<verb>",
// "payload": {...}}, the payload exactly as the platform sends it to its SDKs.
//
// Topics and who the event is about:
//
//	chat_room:<room>          actor: the sender (sender_id, sender_type); room: payload.chat_room_id or <room>
//	room_participants:<room>  actor: none (the platform does not say who added or removed);
//	                          subject: the participant; room: <room>
//	agent_rooms:<agent>       actor: the agent (it is the one added to or removed from the room,
//	                          and the one observing it); room: payload.id
//	agent_contacts:<agent>    actor: the agent whose contacts changed; subject: the contact, when
//	                          the payload names one (contact_added, contact_removed)
//	agent_control:<agent>     actor: the agent being controlled
//	tasks:<user>              actor: the user
//	user_rooms:<user>         actor: the user; room: payload.id (the human side of agent_rooms)
//
// Event names map `<noun>_<verb>` to `<noun>.<verb>`, splitting at the first underscore
// (contact_request_received → contact.request_received), names that already have a dot
// (agent.control) stay, and event_created becomes event.<message_type>, or usage.reported
// for a task event whose metadata holds band_usage. Event names a topic is not known to
// carry are mapped by the same rule, their payload kept under data.extra.

// Topic kinds.
const (
	topicChatRoom         = "chat_room"
	topicRoomParticipants = "room_participants"
	topicAgentRooms       = "agent_rooms"
	topicAgentContacts    = "agent_contacts"
	topicAgentControl     = "agent_control"
	topicTasks            = "tasks"
	topicUserRooms        = "user_rooms"
)

func parseTopic(topic string) (kind, id string, err *FieldError) {
	kind, id, ok := strings.Cut(topic, ":")
	if !ok {
		return "", "", fieldErr("topic", "malformed topic %s (want <channel>:<id>)", quoteShort(topic))
	}
	switch kind {
	case topicChatRoom, topicRoomParticipants, topicAgentRooms, topicAgentContacts,
		topicAgentControl, topicTasks, topicUserRooms:
	default:
		return "", "", fieldErr("topic", "unknown topic %s", quoteShort(topic))
	}
	if id == "" || strings.TrimSpace(id) != id || strings.Contains(id, ":") {
		return "", "", fieldErr("topic", "malformed topic %s (want %s:<id>)", quoteShort(topic), kind)
	}
	return kind, id, nil
}

// frameType maps a frame's event name to a canonical type.
func frameType(event string, p *payload) (string, *FieldError) {
	if event == "" {
		return "", fieldErr("event", "missing")
	}
	if strings.Contains(event, ".") {
		if !isEventType(event) {
			return "", fieldErr("event", "%s is not a lowercase noun.verb or noun_verb event", quoteShort(event))
		}
		return event, nil
	}
	if event == "event_created" {
		mt, _ := p.m["message_type"].(string)
		if mt == "" {
			return "", fieldErr("payload.message_type", "missing (event_created needs it)")
		}
		if !isWord(mt) {
			return "", fieldErr("payload.message_type", "%s is not a lowercase word", quoteShort(mt))
		}
		if mt == "task" {
			if md, ok := p.m["metadata"].(map[string]any); ok {
				if _, ok := md["band_usage"]; ok {
					return TypeUsageReported, nil
				}
			}
		}
		return "event." + mt, nil
	}
	noun, verb, ok := strings.Cut(event, "_")
	if !ok || !isWord(noun) || !isWord(verb) {
		return "", fieldErr("event", "cannot map %s to a noun.verb type", quoteShort(event))
	}
	return noun + "." + verb, nil
}

func decodeFrame(w *wire, received time.Time, writer string) (Event, *FieldError) {
	topic := *w.Topic
	kind, topicID, ferr := parseTopic(topic)
	if ferr != nil {
		return Event{}, ferr
	}
	p, ferr := parsePayload(w.Payload)
	if ferr != nil {
		return Event{}, ferr
	}
	typ, ferr := frameType(w.Event, p)
	if ferr != nil {
		return Event{}, ferr
	}
	id, err := frameID(writer, topic, w.Event, p.m)
	if err != nil {
		return Event{}, fieldErr("payload", "%v", err)
	}
	e := Event{ID: id, Type: typ, Source: SourceBand, SchemaVersion: Version}

	if e.Time, ferr = frameTime(w, p, typ, received); ferr != nil {
		return Event{}, ferr
	}

	noun, _, _ := strings.Cut(typ, ".")
	roomFromID := noun == "room" && (kind == topicAgentRooms || kind == topicUserRooms)
	if roomFromID {
		if e.RoomID, ferr = p.str("id"); ferr != nil {
			return Event{}, ferr
		}
	}
	room, ferr := p.str("chat_room_id")
	if ferr != nil {
		return Event{}, ferr
	}
	if room != "" {
		e.RoomID = room
	}
	switch kind {
	case topicChatRoom:
		if e.RoomID == "" {
			e.RoomID = topicID
		}
		if e.Actor.ID, ferr = p.str("sender_id"); ferr != nil {
			return Event{}, ferr
		}
		st, ferr := p.str("sender_type")
		if ferr != nil {
			return Event{}, ferr
		}
		e.Actor.Type = actorType(st)
	case topicRoomParticipants:
		if e.RoomID == "" {
			e.RoomID = topicID
		}
		if noun == "room" {
			// room_deleted: the payload's id is the room itself.
			if rid, _ := p.m["id"].(string); rid == e.RoomID {
				delete(p.m, "id")
			}
		}
	case topicAgentRooms, topicAgentContacts, topicAgentControl:
		e.Actor = Party{ID: topicID, Type: ActorAgent}
	case topicTasks, topicUserRooms:
		e.Actor = Party{ID: topicID, Type: ActorUser}
	}

	var data any
	switch {
	case typ == TypeToolCall:
		data, ferr = toolCallData(p)
	case typ == TypeToolResult:
		data, ferr = toolResultData(p)
	case typ == TypeUsageReported:
		data, ferr = usageData(p)
	case noun == "message" || noun == "event":
		data, ferr = messageData(p)
	case noun == "participant":
		data, ferr = participantData(p, &e)
	case noun == "room":
		data, ferr = roomData(p)
	case noun == "contact":
		data, ferr = contactData(p, &e)
	case noun == "task":
		data, ferr = taskData(p)
	case typ == TypeAgentControl:
		data, ferr = controlData(p)
	default:
		data, ferr = struct {
			Extra json.RawMessage `json:"extra,omitempty"`
		}{p.extra()}, nil
	}
	if ferr != nil {
		return Event{}, ferr
	}
	b, err := json.Marshal(data)
	if err != nil {
		return Event{}, fieldErr("payload", "%v", err)
	}
	// The canonical event must decode again under the same rules (ingest reads it back
	// from Kafka): payload fields left over move a level down, under data.extra, so a
	// frame within the limit can map to an event beyond it.
	if fe := checkJSON(b, 1, "data"); fe != nil {
		return Event{}, fieldErr("payload", "too deeply nested once mapped to the canonical event (its fields move a level down, under data.extra): %s", fe)
	}
	if string(b) != "{}" {
		e.Data = b
	}
	return e, nil
}

// frameTime is the time of the frame's event: the payload's own timestamp
// (updated_at for an update, removed_at or deleted_at for a removal, else inserted_at or
// created_at), else a relay's received_at or time on the frame, else received.
func frameTime(w *wire, p *payload, typ string, received time.Time) (time.Time, *FieldError) {
	_, verb, _ := strings.Cut(typ, ".")
	var keys []string
	switch {
	case strings.HasSuffix(verb, "updated"):
		keys = []string{"updated_at", "inserted_at", "created_at"}
	case strings.HasSuffix(verb, "removed") || strings.HasSuffix(verb, "deleted"):
		keys = []string{"removed_at", "deleted_at", "updated_at", "inserted_at", "created_at"}
	default:
		keys = []string{"inserted_at", "created_at", "updated_at"}
	}
	for _, k := range keys {
		s, ok := p.m[k].(string)
		if !ok {
			continue
		}
		t, ferr := parseCheckedTime("payload."+k, s)
		if ferr != nil {
			return time.Time{}, ferr
		}
		delete(p.m, k)
		// The other stamp says nothing more when it is the same.
		for _, other := range [...]string{"inserted_at", "updated_at"} {
			if o, ok := p.m[other].(string); ok && o == s {
				delete(p.m, other)
			}
		}
		return t, nil
	}
	if w.ReceivedAt != "" {
		return parseCheckedTime("received_at", w.ReceivedAt)
	}
	if w.Time != "" {
		return parseCheckedTime("time", w.Time)
	}
	if received.IsZero() {
		received = time.Now()
	}
	return received.UTC(), nil
}

func parseCheckedTime(field, s string) (time.Time, *FieldError) {
	t, fe := parseTime(field, s)
	if fe == nil {
		fe = checkTime(field, t)
	}
	return t, fe
}

func actorType(platform string) ActorType {
	switch platform {
	case "":
		return ""
	case "User", "user":
		return ActorUser
	case "Agent", "agent":
		return ActorAgent
	case "System", "system":
		return ActorSystem
	}
	return ActorType(strings.ToLower(platform))
}

// PlatformWriter is the writer scope of the platform's own frames: those posted with a
// platform key and those produced to Kafka directly (only the platform writes there).
// It is the organization of a platform key, keys.PlatformOrg.
const PlatformWriter = "*"

// frameID is the id of the event a frame maps to: a UUID (version 8 layout) made of the
// first 16 bytes of the SHA-256 of the frame's canonical form (topic, event and payload
// re-serialized with sorted keys) in its writer's scope. The same writer's frame,
// however it is spaced or its keys ordered, has the same id, so a frame sent again is a
// replay; any change to it (an edit, another event name) gives another.
//
// The scope is part of the hash input because a frame's content is predictable: an
// organization's key adds its organization (as "writer"), so the frame it posts never
// has the id the platform's copy of the same frame will have, nor another
// organization's. The platform's scope is the frame alone, which keeps the ids of its
// frames already in the audit trail and in Kafka what they are: a redelivered record is
// still recognized as a replay; no organization's hash input can equal it, as only
// theirs holds a "writer" key.
func frameID(writer, topic, event string, payload map[string]any) (string, error) {
	canon := map[string]any{"topic": topic, "event": event, "payload": payload}
	if writer != PlatformWriter {
		canon["writer"] = writer
	}
	b, err := json.Marshal(canon)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	var u [16]byte
	copy(u[:], sum[:16])
	return formatUUID(u, 8), nil
}

// isFrameID says whether id has the form frameID writes: a lowercase UUID of version 8.
func isFrameID(id string) bool {
	if len(id) != 36 || id[14] != '8' || !strings.ContainsRune("89ab", rune(id[19])) {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case (c < '0' || c > '9') && (c < 'a' || c > 'f'):
			return false
		}
	}
	return true
}

// NewID returns a random event id: a UUID, version 4. Events bandplane itself writes
// (policy decisions, operator actions) use it.
func NewID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // never fails (crypto/rand since Go 1.24)
	return formatUUID(u, 4)
}

// formatUUID sets the version and the RFC 9562 variant of u and formats it.
func formatUUID(u [16]byte, version byte) string {
	u[6] = u[6]&0x0f | version<<4
	u[8] = u[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// payload is a frame's payload (or an object inside it), decoded with json.Number.
// Reading a field consumes it; what is left over is the data's extra.
type payload struct {
	m    map[string]any
	path string
}

func parsePayload(raw json.RawMessage) (*payload, *FieldError) {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] == 'n' {
		return nil, fieldErr("payload", "missing")
	}
	if t[0] != '{' {
		return nil, fieldErr("payload", "must be a JSON object, got %s", kindOf(t))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, jsonErr(err, "payload.")
	}
	return &payload{m: m, path: "payload"}, nil
}

func (p *payload) typeErr(key, want string, v any) *FieldError {
	return fieldErr(p.path+"."+key, "expected %s, got %s", want, anyKind(v))
}

func anyKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	case nil:
		return "null"
	}
	return "unknown"
}

// str consumes a string field; a number is taken as its text, null or absent is "".
func (p *payload) str(key string) (string, *FieldError) {
	v, ok := p.m[key]
	if !ok {
		return "", nil
	}
	switch v := v.(type) {
	case nil:
	case string:
		delete(p.m, key)
		return v, nil
	case json.Number:
		delete(p.m, key)
		return v.String(), nil
	default:
		return "", p.typeErr(key, "string", v)
	}
	delete(p.m, key)
	return "", nil
}

// handle is str without the leading '@'.
func (p *payload) handle(key string) (string, *FieldError) {
	h, err := p.str(key)
	return strings.TrimPrefix(h, "@"), err
}

func (p *payload) boolean(key string) (*bool, *FieldError) {
	v, ok := p.m[key]
	if !ok {
		return nil, nil
	}
	switch v := v.(type) {
	case nil:
		delete(p.m, key)
		return nil, nil
	case bool:
		delete(p.m, key)
		return &v, nil
	}
	return nil, p.typeErr(key, "boolean", v)
}

// isRemote consumes is_remote and its legacy alias is_external; is_remote wins.
func (p *payload) isRemote() (*bool, *FieldError) {
	ext, err := p.boolean("is_external")
	if err != nil {
		return nil, err
	}
	r, err := p.boolean("is_remote")
	if err != nil {
		return nil, err
	}
	if r == nil {
		r = ext
	}
	return r, nil
}

// tokens consumes a token count: an integer in [0, MaxTokens]. A number written with
// a fraction or an exponent is taken when its value is an integer (1200.0, 1.2e3:
// senders that hold counts as floating point write them so); the value is read exactly
// from the text, never through a float64. Absent or null is 0, not ok.
func (p *payload) tokens(key string) (n int64, ok bool, fe *FieldError) {
	v, present := p.m[key]
	if !present || v == nil {
		delete(p.m, key)
		return 0, false, nil
	}
	num, isNum := v.(json.Number)
	if !isNum {
		return 0, false, p.typeErr(key, "integer", v)
	}
	text := num.String()
	u, neg, integer, big := integerValue(text, MaxTokens)
	switch {
	case !integer:
		return 0, false, fieldErr(p.path+"."+key, "expected integer, got %s", shortNumber(text))
	case neg && (u != 0 || big):
		return 0, false, fieldErr(p.path+"."+key, "negative token count %s", shortNumber(text))
	case big:
		return 0, false, fieldErr(p.path+"."+key, "%s is above the cap of %d tokens", shortNumber(text), MaxTokens)
	}
	delete(p.m, key)
	return int64(u), true, nil
}

// shortNumber is a number's text for an error message: a client can send a number as
// long as its line.
func shortNumber(s string) string {
	if len(s) <= 32 {
		return s
	}
	return s[:32] + fmt.Sprintf("… (%d digits)", len(s))
}

// integerValue reads the JSON number s exactly: its magnitude u when that is at most
// limit (else big), its sign, and whether it is an integer at all.
func integerValue(s string, limit uint64) (u uint64, neg, integer, big bool) {
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	mant, exp, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, exp, _ = strings.Cut(s, "E")
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	e := 0
	if exp != "" {
		eneg := exp[0] == '-'
		for _, c := range strings.TrimLeft(exp, "+-") {
			if e < 1_000_000_000 { // saturate: any exponent this large decides alone
				e = e*10 + int(c-'0')
			}
		}
		if eneg {
			e = -e
		}
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, neg, true, false
	}
	e -= len(frac)
	trimmed := strings.TrimRight(digits, "0")
	e += len(digits) - len(trimmed)
	digits = trimmed
	if e < 0 {
		return 0, neg, false, false
	}
	if len(digits)+e > 19 {
		return 0, neg, true, true
	}
	for _, c := range digits {
		u = u*10 + uint64(c-'0')
	}
	for ; e > 0; e-- {
		u *= 10
	}
	return u, neg, true, u > limit
}

// object returns a nested object, not consumed: its fields are, one by one, and what is
// left of it stays in the parent's extra.
func (p *payload) object(key string) (*payload, *FieldError) {
	v, ok := p.m[key]
	if !ok || v == nil {
		return nil, nil
	}
	m, isObj := v.(map[string]any)
	if !isObj {
		return nil, p.typeErr(key, "object", v)
	}
	return &payload{m: m, path: p.path + "." + key}, nil
}

// done drops a nested object from its parent once nothing is left of it.
func (p *payload) done(key string, child *payload) {
	if child != nil && len(child.m) == 0 {
		delete(p.m, key)
	}
}

// extra is what is left of the payload, as a JSON object, or nil.
func (p *payload) extra() json.RawMessage {
	if len(p.m) == 0 {
		return nil
	}
	b, err := json.Marshal(p.m)
	if err != nil { // cannot happen: the map came from JSON
		return nil
	}
	return b
}

// rawJSON is a value as JSON; a string that holds JSON (tool arguments often come so)
// is that JSON, when it passes the guard with `outer` levels above it where it lands
// (else it stays a string): the canonical event must decode again under the same rules.
func rawJSON(v any, stringMayHoldJSON bool, outer int) (json.RawMessage, error) {
	if s, ok := v.(string); ok && stringMayHoldJSON {
		if t := strings.TrimSpace(s); t != "" && (t[0] == '{' || t[0] == '[') && checkJSON([]byte(t), outer, "") == nil {
			return normalizeJSON([]byte(t)), nil
		}
	}
	if v == nil {
		return nil, nil
	}
	return json.Marshal(v)
}

// contentObject decodes a message's content when it is a JSON object (tool calls and
// results carry their data so) that passes the guard where what is left of it lands,
// data.extra.content, three levels down. It is not consumed.
func (p *payload) contentObject() *payload {
	s, ok := p.m["content"].(string)
	if !ok {
		return nil
	}
	t := strings.TrimSpace(s)
	if t == "" || t[0] != '{' || checkJSON([]byte(t), 3, "") != nil {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(t))
	dec.UseNumber()
	var m map[string]any
	if dec.Decode(&m) != nil || dec.More() {
		return nil
	}
	return &payload{m: m, path: "payload.content"}
}

// first consumes the first of keys that is present and returns its value.
func (p *payload) first(keys ...string) (any, bool) {
	for _, k := range keys {
		if v, ok := p.m[k]; ok {
			delete(p.m, k)
			return v, true
		}
	}
	return nil, false
}

// firstStr is first for a string (or number) field.
func (p *payload) firstStr(keys ...string) (string, *FieldError) {
	for _, k := range keys {
		if _, ok := p.m[k]; ok {
			return p.str(k)
		}
	}
	return "", nil
}

func messageData(p *payload) (MessageData, *FieldError) {
	var d MessageData
	var err *FieldError
	if d.MessageID, err = p.str("id"); err != nil {
		return d, err
	}
	if d.Content, err = p.str("content"); err != nil {
		return d, err
	}
	if d.MessageType, err = p.str("message_type"); err != nil {
		return d, err
	}
	if d.ThreadID, err = p.str("thread_id"); err != nil {
		return d, err
	}
	md, err := p.object("metadata")
	if err != nil {
		return d, err
	}
	if md != nil {
		if d.Mentions, err = mentions(md); err != nil {
			return d, err
		}
		p.done("metadata", md)
	}
	d.Extra = p.extra()
	return d, nil
}

func mentions(md *payload) ([]Mention, *FieldError) {
	v, ok := md.m["mentions"]
	if !ok || v == nil {
		delete(md.m, "mentions")
		return nil, nil
	}
	list, isList := v.([]any)
	if !isList {
		return nil, md.typeErr("mentions", "array", v)
	}
	out := make([]Mention, 0, len(list))
	for _, item := range list {
		switch item := item.(type) {
		case string:
			out = append(out, Mention{Handle: strings.TrimPrefix(item, "@")})
		case map[string]any:
			m := &payload{m: item, path: md.path + ".mentions[]"}
			id, err := m.str("id")
			if err != nil {
				return nil, err
			}
			h, err := m.firstStr("handle", "username")
			if err != nil {
				return nil, err
			}
			out = append(out, Mention{ID: id, Handle: strings.TrimPrefix(h, "@")})
		default:
			return nil, md.typeErr("mentions[]", "object", item)
		}
	}
	delete(md.m, "mentions")
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// argumentsOuter is how many levels are above data.arguments (and data.output): the
// envelope and data.
const argumentsOuter = 2

// toolCallData reads a tool call from the content JSON ({"name", "args",
// "tool_call_id"}) or, failing that, from metadata.function ({"name", "arguments"}),
// the id from metadata.tool_call_id or, in the OpenAI shape, metadata.id.
func toolCallData(p *payload) (ToolCallData, *FieldError) {
	var d ToolCallData
	var err *FieldError
	if d.MessageID, err = p.str("id"); err != nil {
		return d, err
	}
	if c := p.contentObject(); c != nil {
		if d.ToolName, err = c.firstStr("name", "tool_name"); err != nil {
			return d, err
		}
		if d.ToolCallID, err = c.firstStr("tool_call_id", "id"); err != nil {
			return d, err
		}
		if args, ok := c.first("args", "arguments", "input"); ok {
			d.Arguments, _ = rawJSON(args, true, argumentsOuter)
		}
		delete(p.m, "content")
		if len(c.m) > 0 {
			p.m["content"] = c.m
		}
	}
	md, err := p.object("metadata")
	if err != nil {
		return d, err
	}
	if md != nil {
		if fn, err := md.object("function"); err != nil {
			return d, err
		} else if fn != nil {
			name, err := fn.firstStr("name")
			if err != nil {
				return d, err
			}
			id, err := fn.firstStr("tool_call_id", "id")
			if err != nil {
				return d, err
			}
			args, hasArgs := fn.first("arguments", "args")
			if d.ToolName == "" {
				d.ToolName = name
			}
			if d.ToolCallID == "" {
				d.ToolCallID = id
			}
			if d.Arguments == nil && hasArgs {
				d.Arguments, _ = rawJSON(args, true, argumentsOuter)
			}
			md.done("function", fn)
		}
		if d.ToolCallID == "" {
			if d.ToolCallID, err = md.str("tool_call_id"); err != nil {
				return d, err
			}
		}
		// The OpenAI shape, {"id", "type": "function", "function": {…}}: the call's id
		// is metadata.id. Only there: another metadata's id is not a tool call's.
		if t, _ := md.m["type"].(string); t == "function" {
			delete(md.m, "type")
			if d.ToolCallID == "" {
				if d.ToolCallID, err = md.str("id"); err != nil {
					return d, err
				}
			}
		}
		p.done("metadata", md)
	}
	if mt, _ := p.m["message_type"].(string); mt == "tool_call" {
		delete(p.m, "message_type")
	}
	d.Extra = p.extra()
	return d, nil
}

// toolResultData reads a tool result from the content JSON ({"name", "output",
// "tool_call_id", "is_error"}; "result" is taken for "output"), then from metadata
// (tool_call_id, tool_name or function.name, is_error). Content that is not a JSON
// object is the output itself.
func toolResultData(p *payload) (ToolResultData, *FieldError) {
	var d ToolResultData
	var err *FieldError
	if d.MessageID, err = p.str("id"); err != nil {
		return d, err
	}
	if c := p.contentObject(); c != nil {
		if d.ToolName, err = c.firstStr("name", "tool_name"); err != nil {
			return d, err
		}
		if d.ToolCallID, err = c.firstStr("tool_call_id", "id"); err != nil {
			return d, err
		}
		isErr, err := c.boolean("is_error")
		if err != nil {
			return d, err
		}
		if isErr != nil {
			d.IsError = *isErr
		}
		if out, ok := c.first("output", "result", "content"); ok {
			d.Output, _ = rawJSON(out, false, argumentsOuter)
		}
		delete(p.m, "content")
		if len(c.m) > 0 {
			p.m["content"] = c.m
		}
	} else if s, ok := p.m["content"].(string); ok {
		d.Output, _ = json.Marshal(s)
		delete(p.m, "content")
	}
	md, err := p.object("metadata")
	if err != nil {
		return d, err
	}
	if md != nil {
		if d.ToolCallID == "" {
			if d.ToolCallID, err = md.str("tool_call_id"); err != nil {
				return d, err
			}
		}
		if d.ToolName == "" {
			if d.ToolName, err = md.firstStr("tool_name", "name"); err != nil {
				return d, err
			}
		}
		if fn, err := md.object("function"); err != nil {
			return d, err
		} else if fn != nil && d.ToolName == "" {
			if d.ToolName, err = fn.firstStr("name"); err != nil {
				return d, err
			}
			md.done("function", fn)
		}
		if !d.IsError {
			isErr, err := md.boolean("is_error")
			if err != nil {
				return d, err
			}
			d.IsError = isErr != nil && *isErr
		}
		p.done("metadata", md)
	}
	if mt, _ := p.m["message_type"].(string); mt == "tool_result" {
		delete(p.m, "message_type")
	}
	d.Extra = p.extra()
	return d, nil
}

// usageData reads metadata.band_usage. The message's text ("Token usage: …") stays in
// extra.
func usageData(p *payload) (UsageData, *FieldError) {
	var d UsageData
	var err *FieldError
	if d.MessageID, err = p.str("id"); err != nil {
		return d, err
	}
	md, err := p.object("metadata")
	if err != nil {
		return d, err
	}
	var u *payload
	if md != nil {
		if u, err = md.object("band_usage"); err != nil {
			return d, err
		}
	}
	if u == nil {
		u = &payload{m: map[string]any{}, path: "payload.metadata.band_usage"}
	}
	for _, f := range [...]struct {
		key string
		dst *int64
	}{
		{"input_tokens", &d.InputTokens},
		{"output_tokens", &d.OutputTokens},
		{"cache_read_tokens", &d.CacheReadTokens},
		{"cache_write_tokens", &d.CacheWriteTokens},
	} {
		if *f.dst, _, err = u.tokens(f.key); err != nil {
			return d, err
		}
	}
	r, ok, err := u.tokens("reasoning_tokens")
	if err != nil {
		return d, err
	}
	if ok {
		d.ReasoningTokens = &r
	}
	if d.Model, err = u.str("model"); err != nil {
		return d, err
	}
	if md != nil {
		md.done("band_usage", u)
		p.done("metadata", md)
	}
	if mt, _ := p.m["message_type"].(string); mt == "task" {
		delete(p.m, "message_type")
	}
	d.Extra = p.extra()
	return d, nil
}

// participantData reads a participant (also the event's subject).
func participantData(p *payload, e *Event) (ParticipantData, *FieldError) {
	var d ParticipantData
	var err *FieldError
	if d.ParticipantID, err = p.str("id"); err != nil {
		return d, err
	}
	if d.Name, err = p.str("name"); err != nil {
		return d, err
	}
	t, err := p.str("type")
	if err != nil {
		return d, err
	}
	d.ParticipantType = actorType(t)
	if d.Handle, err = p.handle("handle"); err != nil {
		return d, err
	}
	if d.IsRemote, err = p.isRemote(); err != nil {
		return d, err
	}
	if d.ParticipantID != "" {
		e.Subject = &Party{ID: d.ParticipantID, Type: d.ParticipantType, Handle: d.Handle}
	}
	d.Extra = p.extra()
	return d, nil
}

func roomData(p *payload) (RoomData, *FieldError) {
	var d RoomData
	var err *FieldError
	if d.Title, err = p.str("title"); err != nil {
		return d, err
	}
	if d.TaskID, err = p.str("task_id"); err != nil {
		return d, err
	}
	if d.Status, err = p.str("status"); err != nil {
		return d, err
	}
	d.Extra = p.extra()
	return d, nil
}

// contactData reads a contact request (its id is the request's) or a contact (its id,
// type and handle are the event's subject).
func contactData(p *payload, e *Event) (ContactData, *FieldError) {
	var d ContactData
	var err *FieldError
	id, err := p.str("id")
	if err != nil {
		return d, err
	}
	if d.RequestID, err = p.str("request_id"); err != nil {
		return d, err
	}
	if d.Status, err = p.str("status"); err != nil {
		return d, err
	}
	if d.FromHandle, err = p.handle("from_handle"); err != nil {
		return d, err
	}
	if d.ToHandle, err = p.handle("to_handle"); err != nil {
		return d, err
	}
	if d.Handle, err = p.handle("handle"); err != nil {
		return d, err
	}
	if d.Message, err = p.str("message"); err != nil {
		return d, err
	}
	if d.IsRemote, err = p.isRemote(); err != nil {
		return d, err
	}
	if strings.HasPrefix(e.Type, "contact.request") {
		if d.RequestID == "" {
			d.RequestID = id
		} else if id != "" {
			p.m["id"] = id
		}
	} else if id != "" {
		t, err := p.str("type")
		if err != nil {
			return d, err
		}
		e.Subject = &Party{ID: id, Type: actorType(t), Handle: d.Handle}
	}
	d.Extra = p.extra()
	return d, nil
}

func taskData(p *payload) (TaskData, *FieldError) {
	var d TaskData
	var err *FieldError
	if d.TaskID, err = p.firstStr("task_id", "id"); err != nil {
		return d, err
	}
	if d.Title, err = p.str("title"); err != nil {
		return d, err
	}
	if d.Status, err = p.str("status"); err != nil {
		return d, err
	}
	if d.Assignee, err = p.firstStr("assignee_id", "assignee"); err != nil {
		return d, err
	}
	d.Extra = p.extra()
	return d, nil
}

func controlData(p *payload) (AgentControlData, *FieldError) {
	var d AgentControlData
	var err *FieldError
	if d.Action, err = p.firstStr("action", "command"); err != nil {
		return d, err
	}
	d.Extra = p.extra()
	return d, nil
}
