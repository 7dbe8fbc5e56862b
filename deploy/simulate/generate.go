package simulate

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/pricing"
)

// Source is the envelope source of the canonical lines the simulator writes.
const Source = "simulate"

// chattyShare is the talkative agent's target share of all messages.
const chattyShare = 0.25

// scheduleSource is the system that starts scheduled executions (metadata.trigger_source).
const scheduleSource = "schedule"

// scheduledShare is the share of conversations an agent starts on a schedule rather
// than because a person asked.
const scheduledShare = 0.05

// generator yields the simulation's lines one at a time, drawing everything from one
// seeded source so that a Config always yields the same lines.
type generator struct {
	r     rnd
	w     *world
	cfg   Config
	clock time.Time
	// wall, when set, is the clock simulated time never runs ahead of: a run that
	// starts now and is paced (make run) would otherwise soon post events hours in the
	// future, which the collector refuses (--max-clock-skew).
	wall  func() time.Time
	queue []queued
	// held are the lines that come in the stream after the next ones (a late trigger):
	// while holding, emitted lines go there, until release.
	held    []queued
	holding bool
	cur     *execution // the execution whose agent's frames are being emitted

	started  bool
	begun    bool // the clock has been read once
	messages int  // message_created frames so far
	chatty   int  // … of them by the talkative agent

	pending  []*contactReq
	outcomes int // contact requests resolved so far
}

// queued is a line and, when it has one, how its event came to be.
type queued struct {
	line  []byte
	truth *Truth
}

// execution is one agent execution, as the simulator runs it.
type execution struct {
	a  *agent
	rm *room
	// trigger is the platform id of the message that started it; source the system
	// that did when no message did.
	trigger, source string
	chain           chain // its own: one deeper than its trigger's
	sent            bool  // its frames name the trigger
	late            bool  // … and the triggering message comes after them in the stream
}

// trigger modes of an execution.
const (
	modeInferred = iota
	modeSent
	modeLate
)

type contactReq struct {
	id       string
	from     party
	to       *agent
	inserted time.Time
}

func newGenerator(cfg Config, cat *pricing.Catalog, start time.Time) *generator {
	r := newRnd(cfg.Seed)
	g := &generator{r: r, cfg: cfg, clock: start.UTC().Truncate(time.Microsecond)}
	g.w = buildWorld(r, cfg, cat)
	g.directory()
	return g
}

// next returns the next line and, when it has one, how its event came to be.
func (g *generator) next() ([]byte, *Truth) {
	for len(g.queue) == 0 {
		if !g.started {
			g.started = true
			g.openRooms()
			g.webhookScript()
		} else {
			g.episode()
		}
		g.topUpChatty()
	}
	q := g.queue[0]
	g.queue[0] = queued{}
	g.queue = g.queue[1:]
	return q.line, q.truth
}

// advance moves the simulated clock on by about d (±30 %, plus microseconds).
// The first call leaves the clock at Start, so that the first event is at Start.
// Times are whole microseconds, as the platform writes them.
func (g *generator) advance(d time.Duration) time.Time {
	if !g.begun {
		g.begun = true
		return g.clock
	}
	j := time.Duration(float64(d) * (0.7 + 0.6*g.r.Float64()))
	g.clock = g.clock.Add(j + time.Duration(g.r.IntN(1000))*time.Microsecond).Truncate(time.Microsecond)
	if g.wall != nil {
		if now := g.wall().UTC().Truncate(time.Microsecond); g.clock.After(now) {
			g.clock = now // never before the previous clock: now only grows
		}
	}
	return g.clock
}

func (g *generator) emit(v any, truth *Truth) {
	b, err := json.Marshal(v)
	if err != nil {
		panic("simulate: marshal: " + err.Error()) // only our own types: a bug
	}
	q := queued{line: b, truth: truth}
	if g.holding {
		g.held = append(g.held, q)
		return
	}
	g.queue = append(g.queue, q)
}

// release puts the held lines in the stream.
func (g *generator) release() {
	g.queue = append(g.queue, g.held...)
	g.held = nil
}

func (g *generator) frame(topic, event string, payload any) {
	g.emit(frame{Topic: topic, Event: event, Payload: payload}, nil)
}

// ---- executions ----

// drawMode draws how an execution's trigger travels: named in its frames (sent), named
// but its message later in the stream (late, where lateOK), or not at all.
func (g *generator) drawMode(lateOK bool) int {
	u := g.r.Float64()
	switch {
	case u < g.cfg.ExplicitTriggers:
		return modeSent
	case lateOK && u < g.cfg.ExplicitTriggers+g.cfg.LateTriggers:
		return modeLate
	}
	return modeInferred
}

// start begins the execution of agent a that message trig started.
func (g *generator) start(a *agent, rm *room, trig sentMsg, mode int) *execution {
	e := &execution{a: a, rm: rm, trigger: trig.id, sent: mode != modeInferred, late: mode == modeLate,
		chain: chain{initiator: trig.chain.initiator, depth: trig.chain.depth + 1, ambiguous: trig.chain.ambiguous}}
	e.chain.explicit = trig.chain.explicit && e.sent
	g.cur = e
	return e
}

// scheduled begins an execution of agent a that a schedule started.
func (g *generator) scheduled(a *agent, rm *room) *execution {
	e := &execution{a: a, rm: rm, source: scheduleSource, sent: true,
		chain: chain{initiator: schema.Party{ID: scheduleSource, Type: schema.ActorSystem}, depth: 1, explicit: true}}
	g.cur = e
	return e
}

// end ends the current execution.
func (g *generator) end() { g.cur = nil }

// attribution is how a frame from `from` comes to be now, and the trigger its
// metadata names: a person's message is a root; an agent's frame belongs to its
// current execution (none outside one).
func (g *generator) attribution(from party) (*Truth, triggerMetadata) {
	if from.us != nil {
		return &Truth{Initiator: schema.Party{ID: from.id, Type: schema.ActorUser}, Explicit: true}, triggerMetadata{}
	}
	e := g.cur
	if e == nil || from.ag != e.a {
		return nil, triggerMetadata{}
	}
	t := &Truth{Initiator: e.chain.initiator, TriggerMessageID: e.trigger, Depth: e.chain.depth,
		Explicit: e.chain.explicit, Late: e.late, Ambiguous: e.chain.ambiguous}
	var md triggerMetadata
	if e.sent {
		md = triggerMetadata{TriggerMessageID: e.trigger, TriggerSource: e.source}
	}
	return t, md
}

// ts is the platform timestamp of now; 2 % of them carry no zone.
func (g *generator) ts(t time.Time) string { return stamp(t, g.r.chance(0.02)) }

// ---- directory (canonical) ----

func (g *generator) canonical(typ, org string, actor schema.Party, subject *schema.Party, data any) {
	raw, err := json.Marshal(data)
	if err != nil {
		panic("simulate: marshal: " + err.Error())
	}
	g.emit(schema.Event{
		ID: g.r.uuid(), Type: typ, Time: g.clock, OrgID: org, Actor: actor, Subject: subject,
		Source: Source, SchemaVersion: schema.Version, Data: raw,
	}, nil)
}

// directory emits user.registered for every person, then agent.registered for each of
// their agents, in registration order.
func (g *generator) directory() {
	system := schema.Party{ID: "system", Type: schema.ActorSystem}
	for _, u := range g.w.users {
		g.advance(3 * time.Second)
		g.canonical(schema.TypeUserRegistered, u.OrgID, system,
			&schema.Party{ID: u.ID, Type: schema.ActorUser, Handle: u.Handle},
			schema.UserData{Handle: u.Handle, Name: u.Name})
		for _, a := range u.agents {
			g.advance(20 * time.Second)
			g.canonical(schema.TypeAgentRegistered, u.OrgID,
				schema.Party{ID: u.ID, Type: schema.ActorUser, Handle: u.Handle},
				&schema.Party{ID: a.ID, Type: schema.ActorAgent, Handle: a.Handle},
				schema.AgentData{
					Handle: a.Handle, Name: a.Name, OwnerID: u.ID, Model: a.Model, Description: a.Description,
					PersonalRegistryAccess: a.PersonalRegistryAccess, SharedWithOrg: a.SharedWithOrg,
					Global: a.Global, Listed: a.Listed,
				})
		}
	}
}

// ---- rooms and participants ----

func (g *generator) openRooms() {
	for _, rm := range g.w.rooms {
		g.advance(40 * time.Second)
		members := g.w.initialMembers(g.r, rm)
		var first *agent
		for _, p := range members {
			if p.ag != nil {
				first = p.ag
				break
			}
		}
		t := g.ts(g.clock)
		g.frame("agent_rooms:"+first.ID, "room_added", roomPayload{ID: rm.ID, Title: rm.Title, TaskID: jsonNull, InsertedAt: t, UpdatedAt: t})
		for _, p := range members {
			g.addParticipant(rm, p)
		}
	}
}

func (g *generator) participantPayload(rm *room, p party) participantPayload {
	pp := participantPayload{ID: p.id, Name: p.name, Handle: g.handle(p.handle), Type: p.kind}
	pp.IsRemote = p.ag != nil && p.ag.Owner != rm.owner
	if g.r.chance(0.3) {
		v := pp.IsRemote
		pp.IsExternal = &v // the legacy alias, as older senders add it
	}
	return pp
}

func (g *generator) addParticipant(rm *room, p party) {
	g.advance(2 * time.Second)
	rm.members = append(rm.members, p)
	for i, q := range rm.removed {
		if q.id == p.id {
			rm.removed = append(rm.removed[:i], rm.removed[i+1:]...)
			break
		}
	}
	pp := g.participantPayload(rm, p)
	pp.InsertedAt = g.ts(g.clock)
	g.frame("room_participants:"+rm.ID, "participant_added", pp)
}

func (g *generator) removeParticipant(rm *room, p party) {
	g.advance(5 * time.Second)
	for i, q := range rm.members {
		if q.id == p.id {
			rm.members = append(rm.members[:i], rm.members[i+1:]...)
			break
		}
	}
	rm.removed = append(rm.removed, p)
	pp := g.participantPayload(rm, p)
	pp.RemovedAt = g.ts(g.clock)
	g.frame("room_participants:"+rm.ID, "participant_removed", pp)
}

// handle is a handle as a sender writes it: 3 % carry the leading '@'.
func (g *generator) handle(h string) string {
	if g.r.chance(0.03) {
		return "@" + h
	}
	return h
}

// ---- messages and events ----

func senderType(p party) string { return p.kind }

func (g *generator) mentionsJSON(ms []party) []mentionJSON {
	out := make([]mentionJSON, 0, len(ms))
	for _, m := range ms {
		out = append(out, mentionJSON{ID: m.id, Handle: g.handle(m.handle), Name: m.name})
	}
	return out
}

// message posts a message_created frame: the content is prefixed with the mentions.
// It returns the message, for the executions it starts.
func (g *generator) message(rm *room, from party, mentions []party, text string) sentMsg {
	g.advance(8 * time.Second)
	var b strings.Builder
	for _, m := range mentions {
		b.WriteString("@" + m.name + " ")
	}
	b.WriteString(text)
	id := g.r.uuid()
	t := g.ts(g.clock)
	truth, trig := g.attribution(from)
	g.emit(frame{Topic: "chat_room:" + rm.ID, Event: "message_created", Payload: messagePayload{
		ID: id, Content: b.String(), MessageType: "text",
		Metadata: messageMetadata{Mentions: g.mentionsJSON(mentions), Status: "sent", triggerMetadata: trig},
		SenderID: from.id, SenderType: senderType(from), ChatRoomID: rm.ID, ThreadID: jsonNull,
		InsertedAt: t, UpdatedAt: t,
	}}, truth)
	m := sentMsg{id: id, content: b.String(), sender: from, mentions: mentions, inserted: g.clock}
	if truth != nil {
		m.chain = chain{initiator: truth.Initiator, depth: truth.Depth, explicit: truth.Explicit, ambiguous: truth.Ambiguous}
	} else {
		m.chain = chain{initiator: schema.Party{ID: from.id, Type: schema.ActorAgent}} // an agent on its own
	}
	rm.recent = append(rm.recent, m)
	if len(rm.recent) > 8 {
		rm.recent = rm.recent[1:]
	}
	g.messages++
	if from.ag != nil && from.ag.chatty {
		g.chatty++
	}
	return m
}

// event posts an event_created frame of a non-text type; its metadata names the
// execution's trigger when it is sent (md nil: none but that).
func (g *generator) event(rm *room, from party, typ, content string, md metadata, gap time.Duration) {
	g.advance(gap)
	t := g.ts(g.clock)
	if md == nil {
		md = triggerMetadata{}
	}
	truth, trig := g.attribution(from)
	g.emit(frame{Topic: "chat_room:" + rm.ID, Event: "event_created", Payload: messagePayload{
		ID: g.r.uuid(), Content: content, MessageType: typ, Metadata: md.withTrigger(trig),
		SenderID: from.id, SenderType: senderType(from), ChatRoomID: rm.ID,
		InsertedAt: t, UpdatedAt: t,
	}}, truth)
}

func (g *generator) toolCall(rm *room, a *agent, name string, args any, output any, isErr bool) {
	argsJSON, _ := json.Marshal(args)
	prefix := "call_"
	if strings.HasPrefix(a.Model, "claude") {
		prefix = "toolu_"
	}
	callID := g.r.token(prefix, 24)
	if g.r.chance(0.25) {
		var md functionMetadata
		md.Function.Name, md.Function.Arguments, md.ToolCallID = name, string(argsJSON), callID
		g.event(rm, agentParty(a), "tool_call", "Calling "+name, md, 3*time.Second)
	} else {
		c, _ := json.Marshal(toolCallContent{Name: name, Args: argsJSON, ToolCallID: callID})
		g.event(rm, agentParty(a), "tool_call", string(c), nil, 3*time.Second)
	}
	out, _ := json.Marshal(output)
	c, _ := json.Marshal(toolResultContent{Name: name, Output: out, ToolCallID: callID, IsError: isErr})
	g.event(rm, agentParty(a), "tool_result", string(c), nil, 1500*time.Millisecond)
}

// usage posts the token usage of an agent's turn: a task event with band_usage.
func (g *generator) usage(rm *room, a *agent, scale float64) {
	u := bandUsage{
		InputTokens:  int64(float64(g.r.logUniform(500, 20000)) * scale),
		OutputTokens: int64(float64(g.r.logUniform(50, 3000)) * scale),
	}
	u.InputTokens, u.OutputTokens = max(u.InputTokens, 500), max(u.OutputTokens, 50)
	if g.r.chance(0.45) {
		u.CacheReadTokens = int64(g.r.logUniform(1000, 60000))
	}
	if g.r.chance(0.2) {
		u.CacheWriteTokens = int64(g.r.logUniform(500, 12000))
	}
	if a.reasoning && g.r.chance(0.3) {
		rt := u.OutputTokens * int64(g.r.between(20, 80)) / 100 // included in output_tokens
		u.ReasoningTokens = &rt
	}
	content := fmt.Sprintf("Token usage: input=%d output=%d", u.InputTokens, u.OutputTokens)
	if u.CacheReadTokens > 0 || u.CacheWriteTokens > 0 {
		content += fmt.Sprintf(" cache_read=%d cache_write=%d", u.CacheReadTokens, u.CacheWriteTokens)
	}
	g.event(rm, agentParty(a), "task", content, usageMetadata{BandUsage: u}, 500*time.Millisecond)
}

// ---- episodes ----

// episode draws one stretch of activity in one room.
func (g *generator) episode() {
	g.advance(20 * time.Second) // quiet time between episodes
	rm := g.pickRoom()
	switch n := g.r.IntN(100); {
	case n < 58:
		g.conversation(rm)
	case n < 63:
		g.edit(rm)
	case n < 68:
		g.participants(rm)
	case n < 78:
		g.taskStep(rm)
	case n < 86:
		g.contactStep()
	case n < 91:
		g.attention(rm)
	case n < 95:
		g.progressNote(rm)
	default:
		g.failure(rm)
	}
}

func (g *generator) pickRoom() *room {
	total := 0
	for _, rm := range g.w.rooms {
		total += rm.weight
	}
	n := g.r.IntN(total)
	for _, rm := range g.w.rooms {
		if n < rm.weight {
			return rm
		}
		n -= rm.weight
	}
	return g.w.rooms[0]
}

func (g *generator) humans(rm *room) []party {
	var out []party
	for _, p := range rm.members {
		if p.kind == "User" {
			out = append(out, p)
		}
	}
	return out
}

// workers are the room's agents other than the talkative one.
func (g *generator) workers(rm *room) []party {
	var out []party
	for _, p := range rm.agents() {
		if !p.ag.chatty {
			out = append(out, p)
		}
	}
	return out
}

var asks = []string{
	"Can you look into %s and tell me what you find?",
	"Please draft a plan for %s.",
	"What is the status of %s?",
	"Could you double-check %s before we ship?",
	"I need a short summary of %s for the standup.",
	"Take %s from here, please.",
}

var replies = []string{
	"I looked into %s. Short version: it's mostly fine, two edge cases need a fix.",
	"Here is the plan for %s: 1) reproduce, 2) patch, 3) add a regression test.",
	"Done with %s. I left notes in the thread.",
	"%s is blocked on a decision; details below.",
	"I checked %s against the requirements and it passes.",
	"Summary of %s: three open items, one of them urgent.",
}

var followUps = []string{
	"One more thing on %s: include the numbers from last week.",
	"Also, for %s: keep it short.",
	"Actually, make %s your priority.",
}

// asker is a person in the room (its owner when none is).
func (g *generator) asker(rm *room) party {
	asker := userParty(rm.owner)
	if hs := g.humans(rm); len(hs) > 0 {
		asker = pick(g.r, hs)
	}
	return asker
}

// conversation: a person asks an agent, or a schedule starts one; the agent thinks,
// calls tools, answers, and reports its usage; sometimes it hands over to another
// agent, which does the same. A share of conversations run away in a loop.
func (g *generator) conversation(rm *room) {
	workers := g.workers(rm)
	if len(workers) == 0 {
		return
	}
	target := pick(g.r, workers)
	topic := pick(g.r, g.w.kindOf[target.ag].topics)
	asker := g.asker(rm)
	if g.r.chance(g.cfg.Loops) {
		if b := g.loopPartner(rm, target.ag); b != nil {
			g.loop(rm, asker, target.ag, b, topic)
			return
		}
	}
	var e *execution
	if g.r.chance(scheduledShare) {
		e = g.scheduled(target.ag, rm)
	} else {
		mode := g.drawMode(true)
		g.holding = mode == modeLate
		trig := g.message(rm, asker, []party{target}, fmt.Sprintf(pick(g.r, asks), topic))
		g.holding = false
		e = g.start(target.ag, rm, trig, mode)
	}
	to := asker
	for hop := 0; ; hop++ {
		reply, next := g.turn(e, to, topic, hop < 2)
		if next == nil {
			g.release() // a late trigger comes once the work it set going is done
			return
		}
		to, e = agentParty(e.a), g.start(next.ag, rm, reply, g.drawMode(false))
	}
}

// loopPartner is an agent of the room that a and it may hand over to each other.
func (g *generator) loopPartner(rm *room, a *agent) *agent {
	var out []*agent
	for _, p := range g.workers(rm) {
		if g.w.mayHandOver(a, p.ag) && g.w.mayHandOver(p.ag, a) {
			out = append(out, p.ag)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return pick(g.r, out)
}

// loop: a person asks agent a, which hands over to b, b back to a, and so on, 8 to 20
// times, before the last one answers the person.
func (g *generator) loop(rm *room, asker party, a, b *agent, topic string) {
	trig := g.message(rm, asker, []party{agentParty(a)}, fmt.Sprintf(pick(g.r, asks), topic))
	e := g.start(a, rm, trig, g.drawMode(false))
	for range g.r.between(8, 20) {
		other := b
		if e.a == b {
			other = a
		}
		reply, _ := g.turn(e, agentParty(other), topic, false)
		e = g.start(other, rm, reply, g.drawMode(false))
	}
	g.turn(e, asker, topic, false)
}

// turn is the work of execution e: its agent thinks, calls tools, answers `to` (and
// hands over to another agent it may work with, when handover), and reports its
// usage. It returns the answer and the agent handed over to, if any. A person may
// mention the agent again meanwhile (Overlap): the agent's next execution then follows
// this one.
func (g *generator) turn(e *execution, to party, topic string, handover bool) (sentMsg, *party) {
	rm, a := e.rm, e.a
	if g.r.chance(0.35) {
		g.event(rm, agentParty(a), "thought", "I should check "+topic+" before answering.", nil, 2*time.Second)
	}
	for range g.r.IntN(3) {
		g.randomTool(rm, a, topic)
	}
	var again *sentMsg
	if !e.late && g.r.chance(g.cfg.Overlap) {
		if hs := g.humans(rm); len(hs) > 0 {
			m := g.message(rm, pick(g.r, hs), []party{agentParty(a)}, fmt.Sprintf(pick(g.r, followUps), topic))
			again = &m
			if !e.sent {
				e.chain.ambiguous = true // inference credits the rest of e to m
			}
		}
	}
	if g.r.chance(0.03) {
		g.event(rm, agentParty(a), "error", "Model provider returned 529 (overloaded); retrying in 2s", nil, 2*time.Second)
	}
	mentions := []party{to}
	var next *party
	if handover && g.r.chance(0.3) {
		var others []party
		for _, o := range g.workers(rm) {
			if o.id != to.id && g.w.mayHandOver(a, o.ag) {
				others = append(others, o)
			}
		}
		if len(others) > 0 {
			o := pick(g.r, others)
			mentions = append(mentions, o)
			next = &o
		}
	}
	reply := g.message(rm, agentParty(a), mentions, fmt.Sprintf(pick(g.r, replies), topic))
	g.usage(rm, a, 1)
	g.end()
	if again != nil {
		g.start(a, rm, *again, g.drawMode(false))
		g.message(rm, agentParty(a), []party{again.sender}, "Noted for "+topic+"; updated above.")
		g.usage(rm, a, 0.5)
		g.end()
	}
	return reply, next
}

func (g *generator) randomTool(rm *room, a *agent, topic string) {
	name := pick(g.r, g.w.kindOf[a].tools)
	var args any
	switch name {
	case "sql_query":
		args = map[string]any{"query": "SELECT count(*) FROM events WHERE topic = '" + topic + "'"}
	case "read_file", "write_file":
		args = map[string]any{"path": pick(g.r, []string{"webhooks/sender.py", "retry/backoff.go", "docs/contacts.md", "billing/invoice.py"})}
	case "band_lookup_peers":
		args = map[string]any{}
	case "run_tests":
		args = map[string]any{"path": "tests/", "filter": slugify(topic)}
	default:
		args = map[string]any{"query": topic}
	}
	isErr := g.r.chance(0.05)
	var out any = map[string]any{"ok": true, "items": g.r.IntN(12)}
	if isErr {
		out = "error: upstream timed out after 30s"
	}
	g.toolCall(rm, a, name, args, out, isErr)
}

// edit: a person edits one of their recent messages in the room (message_updated).
// Agents edit nothing: they act only in an execution.
func (g *generator) edit(rm *room) {
	var mine []int
	for i, m := range rm.recent {
		if m.sender.us != nil {
			mine = append(mine, i)
		}
	}
	if len(mine) == 0 {
		g.conversation(rm)
		return
	}
	m := &rm.recent[pick(g.r, mine)]
	g.advance(30 * time.Second)
	m.content += " (edited: fixed a typo)"
	g.frame("chat_room:"+rm.ID, "message_updated", messagePayload{
		ID: m.id, Content: m.content, MessageType: "text",
		Metadata: messageMetadata{Mentions: g.mentionsJSON(m.mentions), Status: "sent"},
		SenderID: m.sender.id, SenderType: senderType(m.sender), ChatRoomID: rm.ID, ThreadID: jsonNull,
		InsertedAt: g.ts(m.inserted), UpdatedAt: g.ts(g.clock),
	})
}

// participants: an agent leaves, or a former participant or a peer is added.
func (g *generator) participants(rm *room) {
	if len(rm.removed) > 0 && g.r.chance(0.6) {
		g.addParticipant(rm, rm.removed[0])
		return
	}
	ws := g.workers(rm)
	if len(ws) > 1 && g.r.chance(0.5) {
		g.removeParticipant(rm, pick(g.r, ws))
		return
	}
	if a := g.w.peerFor(g.r, rm.owner, rm); a != nil {
		g.addParticipant(rm, agentParty(a))
	}
}

var taskTitles = []string{"Fix %s", "Write a test plan for %s", "Review %s", "Summarize %s for the customer", "Ship %s"}

// taskStep creates a task for the room's owner or moves one on:
// open → in_progress → (blocked → in_progress) → done.
func (g *generator) taskStep(rm *room) {
	var open *task
	for _, t := range rm.tasks {
		if t.status != "done" {
			open = t
			break
		}
	}
	ws := g.workers(rm)
	if open == nil || (len(rm.tasks) < 50 && g.r.chance(0.25)) {
		if len(ws) == 0 {
			return
		}
		a := pick(g.r, ws).ag
		g.advance(10 * time.Second)
		t := &task{id: g.r.uuid(), title: fmt.Sprintf(pick(g.r, taskTitles), pick(g.r, g.w.kindOf[a].topics)),
			status: "open", assignee: a, owner: rm.owner, inserted: g.clock}
		rm.tasks = append(rm.tasks, t)
		g.taskFrame(rm, t, "task_created")
		return
	}
	switch open.status {
	case "open":
		open.status = "in_progress"
	case "in_progress":
		if g.r.chance(0.35) {
			open.status = "blocked"
		} else {
			open.status = "done"
		}
	case "blocked":
		open.status = "in_progress"
	}
	g.advance(2 * time.Minute)
	g.taskFrame(rm, open, "task_updated")
}

func (g *generator) taskFrame(rm *room, t *task, event string) {
	g.frame("tasks:"+t.owner.ID, event, taskPayload{
		ID: t.id, Title: t.title, Status: t.status, AssigneeID: t.assignee.ID, ChatRoomID: rm.ID,
		InsertedAt: g.ts(t.inserted), UpdatedAt: g.ts(g.clock),
	})
}

// attention: a person asks an agent, which asks a person in the room for a decision
// before it continues; mostly the decision comes, and the agent goes on.
func (g *generator) attention(rm *room) {
	ws, hs := g.workers(rm), g.humans(rm)
	if len(ws) == 0 || len(hs) == 0 {
		return
	}
	a, h := pick(g.r, ws).ag, pick(g.r, hs)
	topic := pick(g.r, g.w.kindOf[a].topics)
	trig := g.message(rm, h, []party{agentParty(a)}, fmt.Sprintf("Take %s from here, please.", topic))
	g.start(a, rm, trig, g.drawMode(false))
	g.event(rm, agentParty(a), "attention",
		fmt.Sprintf("@%s I need your decision on %s before I continue: approve or reject?", h.name, topic),
		eventMetadata{Mentions: g.mentionsJSON([]party{h})}, 5*time.Second)
	g.end()
	if g.r.chance(0.7) {
		g.advance(3 * time.Minute)
		answer := g.message(rm, h, []party{agentParty(a)}, pick(g.r, []string{"Approved, go ahead.", "Rejected: wait for the review.", "Approved with the change we discussed."}))
		g.start(a, rm, answer, g.drawMode(false))
		g.message(rm, agentParty(a), []party{h}, "Understood, I will proceed accordingly on "+topic+".")
		g.usage(rm, a, 0.5)
		g.end()
	}
}

// progressNote: a person asks an agent how it is going, and it posts a task event
// that is not a usage report.
func (g *generator) progressNote(rm *room) {
	ws := g.workers(rm)
	if len(ws) == 0 {
		return
	}
	a := pick(g.r, ws).ag
	asker := g.asker(rm)
	trig := g.message(rm, asker, []party{agentParty(a)}, fmt.Sprintf("What is the status of %s?", pick(g.r, g.w.kindOf[a].topics)))
	g.start(a, rm, trig, g.drawMode(false))
	g.event(rm, agentParty(a), "task", fmt.Sprintf("Progress: step %d of %d done", g.r.between(1, 4), 5), nil, 10*time.Second)
	g.end()
}

// failure: a person asks an agent, and its execution fails.
func (g *generator) failure(rm *room) {
	ws := g.workers(rm)
	if len(ws) == 0 {
		return
	}
	a := pick(g.r, ws).ag
	asker := g.asker(rm)
	trig := g.message(rm, asker, []party{agentParty(a)}, fmt.Sprintf(pick(g.r, asks), pick(g.r, g.w.kindOf[a].topics)))
	g.start(a, rm, trig, g.drawMode(false))
	g.event(rm, agentParty(a), "error", pick(g.r, []string{
		"Tool run_tests failed: exit status 1",
		"Context window exceeded; the conversation was truncated",
		"Rate limited by the model provider (429); giving up after 3 retries",
	}), nil, 4*time.Second)
	g.end()
}

// ---- contacts ----

// contactStep resolves the oldest pending request, or sends a new one across owners.
func (g *generator) contactStep() {
	if len(g.pending) > 0 && (len(g.pending) > 3 || g.r.chance(0.55)) {
		req := g.pending[0]
		g.pending = g.pending[1:]
		g.resolveContact(req, g.nextOutcome())
		return
	}
	for range 10 {
		to := pick(g.r, g.w.agents)
		var from party
		if g.r.chance(0.2) {
			from = userParty(pick(g.r, g.w.users))
		} else {
			from = agentParty(pick(g.r, g.w.agents))
		}
		owner := from.us
		if from.ag != nil {
			owner = from.ag.Owner
		}
		if to.Owner == owner || to.chatty || g.w.contacts[pairKey(from.id, to.ID)] || g.isPending(from.id, to.ID) {
			continue
		}
		g.requestContact(from, to, pick(g.r, []string{"Hi there!", "Can we work together on " + pick(g.r, g.w.kindOf[to].topics) + "?", "Requesting access for a cross-team project.", ""}))
		return
	}
}

func (g *generator) isPending(a, b string) bool {
	for _, p := range g.pending {
		if pairKey(p.from.id, p.to.ID) == pairKey(a, b) {
			return true
		}
	}
	return false
}

// nextOutcome: the first resolutions go through every outcome, then they are drawn.
func (g *generator) nextOutcome() string {
	g.outcomes++
	switch g.outcomes {
	case 1:
		return "approved"
	case 2:
		return "rejected"
	case 3:
		return "cancelled"
	}
	switch n := g.r.IntN(100); {
	case n < 55:
		return "approved"
	case n < 80:
		return "rejected"
	default:
		return "cancelled"
	}
}

func (g *generator) requestContact(from party, to *agent, message string) *contactReq {
	g.advance(30 * time.Second)
	req := &contactReq{id: g.r.uuid(), from: from, to: to, inserted: g.clock}
	g.frame("agent_contacts:"+to.ID, "contact_request_received", contactRequestPayload{
		ID: req.id, FromHandle: g.handle(from.handle), FromName: from.name, Message: message,
		Status: "pending", InsertedAt: g.ts(g.clock),
	})
	g.pending = append(g.pending, req)
	return req
}

func (g *generator) resolveContact(req *contactReq, status string) {
	g.advance(5 * time.Minute)
	g.frame("agent_contacts:"+req.to.ID, "contact_request_updated", contactRequestPayload{
		ID: req.id, FromHandle: g.handle(req.from.handle), FromName: req.from.name, Status: status,
		InsertedAt: g.ts(req.inserted), UpdatedAt: g.ts(g.clock),
	})
	if status != "approved" {
		return
	}
	g.w.contacts[pairKey(req.from.id, req.to.ID)] = true
	g.contactAdded(req.to, req.from)
	if req.from.ag != nil {
		g.contactAdded(req.from.ag, agentParty(req.to))
	}
}

// contactAdded tells agent a that c is now its contact.
func (g *generator) contactAdded(a *agent, c party) {
	g.advance(time.Second)
	desc := ""
	if c.ag != nil {
		desc = c.ag.Description
	}
	p := contactPayload{ID: c.id, Handle: g.handle(c.handle), Name: c.name, Type: c.kind, Description: desc,
		IsRemote: true, InsertedAt: g.ts(g.clock)}
	if g.r.chance(0.3) {
		t := true
		p.IsExternal = &t
	}
	g.frame("agent_contacts:"+a.ID, "contact_added", p)
}

// ---- the talkative agent ----

var digests = []string{
	"Status digest: %d commits since the last update, build green, nothing blocked.",
	"Quick update: %d pull requests open, two waiting on review.",
	"Reminder: %d tasks are still open in this room.",
	"Heads-up: CI finished, %d tests ran, all passed.",
	"Another digest: %d new messages since my last summary.",
}

// topUpChatty lets the talkative agent post until it has its share of the messages,
// each digest an execution a schedule started.
func (g *generator) topUpChatty() {
	c := g.w.cast.chatty
	for float64(g.chatty) < chattyShare*float64(g.messages) {
		rm := g.w.webhook
		if len(g.w.rooms) > 1 && g.r.chance(0.6) {
			rm = g.w.rooms[1]
		}
		if !rm.has(c.ID) {
			g.addParticipant(rm, agentParty(c))
		}
		var mentions []party
		if g.r.chance(0.3) {
			mentions = []party{userParty(rm.owner)}
		}
		g.scheduled(c, rm)
		g.message(rm, agentParty(c), mentions, fmt.Sprintf(pick(g.r, digests), g.r.between(1, 40)))
		if g.r.chance(0.5) {
			g.usage(rm, c, 0.3)
		}
		g.end()
	}
}

// ---- the "Webhook Retries" tutorial ----

// webhookScript plays the tutorial: the Reviewer Agent is removed, the Architect Agent
// finds it again through its peers and adds it, the Coder Agent posts the code, the
// review goes round, the Architect Agent sends a contact request to the partner's
// Reviewer Agent (approved), adds it and hands the change over to it (a chain across
// owners through an approved contact), and the owner is asked to approve the change.
// Each agent acts in an execution that a mention started.
func (g *generator) webhookScript() {
	rm := g.w.webhook
	c := &g.w.cast
	me, arch, coder, rev := userParty(c.owner), agentParty(c.architect), agentParty(c.coder), agentParty(c.reviewer)
	partnerRev := agentParty(c.partnerReviewer)

	g.removeParticipant(rm, rev)
	m := g.message(rm, me, []party{arch}, "Find an agent among your peers that can review code, add it to this room, and tell it what the retry change must do.")
	g.start(c.architect, rm, m, g.drawMode(false))
	g.event(rm, arch, "thought", "I need a code reviewer. Let me look up my peers.", nil, 2*time.Second)
	g.toolCall(rm, c.architect, "band_lookup_peers", map[string]any{},
		map[string]any{"peers": []map[string]any{{"id": c.reviewer.ID, "handle": c.reviewer.Handle, "name": c.reviewer.Name, "description": c.reviewer.Description, "is_contact": false}}}, false)
	g.toolCall(rm, c.architect, "band_add_participant", map[string]any{"participant": c.reviewer.Handle},
		map[string]any{"status": "added", "id": c.reviewer.ID}, false)
	g.addParticipant(rm, rev)
	g.message(rm, arch, []party{rev}, "Please review the webhook retry change. Requirements: at most 5 attempts, exponential backoff starting at 1s with jitter, retry only on 5xx and timeouts, and log the final failure with the event id.")
	g.usage(rm, c.architect, 1)
	g.end()

	m = g.message(rm, me, []party{coder}, "Post the current version of the retry code for Reviewer Agent.")
	g.start(c.coder, rm, m, g.drawMode(false))
	g.toolCall(rm, c.coder, "read_file", map[string]any{"path": "webhooks/sender.py"}, "def send_with_retry(event): ...", false)
	m = g.message(rm, coder, []party{rev}, "Here is the retry code:\n```python\nfor attempt in range(5):\n    resp = post(event)\n    if resp.status < 500:\n        return resp\n    sleep(2 ** attempt + random())\n```")
	g.usage(rm, c.coder, 1)
	g.start(c.reviewer, rm, m, g.drawMode(false))
	g.toolCall(rm, c.reviewer, "run_tests", map[string]any{"path": "tests/test_sender.py"}, map[string]any{"passed": 11, "failed": 1}, false)
	m = g.message(rm, rev, []party{coder}, "Fixes needed: 1) timeouts are not retried, 2) the final failure is not logged with the event id.")
	g.usage(rm, c.reviewer, 1)
	g.start(c.coder, rm, m, g.drawMode(false))
	m = g.message(rm, coder, []party{rev}, "Updated: timeouts are retried and the final failure is logged with the event id.")
	g.usage(rm, c.coder, 1)
	g.start(c.reviewer, rm, m, g.drawMode(false))
	g.message(rm, rev, []party{arch}, "The change passes review.")
	g.usage(rm, c.reviewer, 1)
	g.end()

	// Cross-account contact.
	m = g.message(rm, me, []party{arch}, `Send a contact request to @partner/reviewer-agent with the message "Code review for the webhook sender".`)
	g.start(c.architect, rm, m, g.drawMode(false))
	g.toolCall(rm, c.architect, "band_add_contact", map[string]any{"handle": c.partnerReviewer.Handle, "message": "Code review for the webhook sender"},
		map[string]any{"status": "pending"}, false)
	req := g.requestContact(arch, c.partnerReviewer, "Code review for the webhook sender")
	g.usage(rm, c.architect, 1)
	g.end()
	g.pending = g.pending[:len(g.pending)-1]
	g.resolveContact(req, g.nextOutcome()) // the first outcome: approved

	// The partner's Reviewer Agent, a contact now, reviews too: the owner's request
	// sets another owner's agent going.
	m = g.message(rm, me, []party{arch}, "Add @partner/reviewer-agent to this room and tell it what the retry change must do.")
	g.start(c.architect, rm, m, g.drawMode(false))
	g.toolCall(rm, c.architect, "band_add_participant", map[string]any{"participant": c.partnerReviewer.Handle},
		map[string]any{"status": "added", "id": c.partnerReviewer.ID}, false)
	g.addParticipant(rm, partnerRev)
	m = g.message(rm, arch, []party{partnerRev}, "Please review the webhook retry change: at most 5 attempts, exponential backoff with jitter, retry on 5xx and timeouts.")
	g.usage(rm, c.architect, 1)
	g.start(c.partnerReviewer, rm, m, g.drawMode(false))
	g.toolCall(rm, c.partnerReviewer, "run_tests", map[string]any{"path": "tests/test_sender.py"}, map[string]any{"passed": 12, "failed": 0}, false)
	g.message(rm, partnerRev, []party{arch}, "Reviewed: the change meets the requirements.")
	g.usage(rm, c.partnerReviewer, 1)
	g.end()
	g.removeParticipant(rm, partnerRev)

	// Human in the loop.
	m = g.message(rm, me, []party{coder}, "Get the retry change ready to merge.")
	g.start(c.coder, rm, m, g.drawMode(false))
	g.event(rm, coder, "attention", fmt.Sprintf("@%s The retry change passed review. Approve it before it is merged?", c.owner.Name),
		eventMetadata{Mentions: g.mentionsJSON([]party{me})}, 5*time.Second)
	g.end()
	m = g.message(rm, me, []party{coder}, "Approved, merge it.")
	g.start(c.coder, rm, m, g.drawMode(false))
	g.message(rm, coder, []party{me}, "Merged.")
	g.usage(rm, c.coder, 0.5)
	g.end()
	t := &task{id: g.r.uuid(), title: "Ship the webhook retry change", status: "open", assignee: c.coder, owner: c.owner, inserted: g.clock}
	rm.tasks = append(rm.tasks, t)
	g.taskFrame(rm, t, "task_created")
}
