// Package cause derives who set each agent event going. On the platform an agent acts
// only when a message mentions it, so every agent execution has a trigger, the message
// that started it, and a chain of such messages leads back to an initiator: the person
// (or the system outside chat) at its root. Each message, tool call and usage event of
// an agent gets a Link: its trigger, its initiator, the chain's depth, and whether the
// platform sent every link of the chain or some were inferred.
//
// The rules, in the order they apply to an agent's event:
//
//  1. An execution_id seen before keeps the link its first event got.
//  2. An explicit trigger: data.trigger.message_id (canonical events) or
//     metadata.trigger_message_id (the platform's frames) names the message, by the
//     platform's id or the event's. A trigger from outside chat is data.trigger.source
//     or metadata.trigger_source ("schedule", "webhook:github"): that system is the
//     initiator.
//  3. Otherwise the trigger is inferred: the latest message in the room that mentions
//     the agent, seen before this event and within the horizon.
//  4. With none of these the agent acted on its own: it is its own initiator.
//
// A person's message is a root (depth 0, its author the initiator). A link's depth is
// its trigger's depth plus one. An explicit trigger not seen yet makes a pending link
// (the initiator unknown), and so does a trigger whose own link is pending (a
// hand-over from an execution whose trigger is late). When the message arrives,
// Observe reports the events it resolves, those of the hand-overs included. Inference
// is exact when an agent's events of one execution come before the next message that
// mentions it; two mentions of one agent close together, with the first execution
// still running, credit its later events to the second. Platforms make that exact by
// sending the trigger (rule 2) or an execution_id on every event (rule 1).
//
// A Tracker holds the state in memory; ingest feeds it each room's events in Kafka
// order (a room is one partition's), and warms it at start from the links it stored
// (Remember, Await). It is not safe for concurrent use.
//
// It imports the standard library and schema/ packages only: schema/ is the basement
// every other folder builds on (deploy/layers).
package cause

import (
	"bytes"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
)

// Link is how one event came to be.
type Link struct {
	// Trigger is the platform's id of the message that started the execution (its
	// event id when it has none); TriggerEvent is that message's event id. Both are
	// empty at a root.
	Trigger, TriggerEvent string
	// Initiator is the root of the chain: a person, an agent that acted on its own, or
	// a system outside chat (Type schema.ActorSystem, ID its source). InitiatorOrg and
	// InitiatorOwner are its organization and accountable person (for an agent its
	// owner; for a person, that person).
	Initiator                    schema.Party
	InitiatorOrg, InitiatorOwner string
	// Depth is 0 for the root's own events, 1 for an execution the root's message
	// started, and so on.
	Depth int
	// Explicit says that the platform sent every link from the root to here.
	Explicit bool
	// Pending says that the explicit trigger has not been seen yet: the initiator is
	// unknown until it is (Tracker.Observe reports the events it resolves).
	Pending bool
}

// Source of a link, as stored and as GraphQL shows it.
const (
	SourceExplicit = "explicit"
	SourceInferred = "inferred"
	SourcePending  = "pending"
)

// Source is how the link was made.
func (l Link) Source() string {
	switch {
	case l.Pending:
		return SourcePending
	case l.Explicit:
		return SourceExplicit
	}
	return SourceInferred
}

// Who returns the organization and accountable person of a party, from the directory.
type Who func(p schema.Party) (org, owner string)

// Resolution is an event whose pending link a late trigger resolved.
type Resolution struct {
	EventID, OrgID string
	Time           time.Time // the event's
	Link           Link
}

// Defaults of a Tracker.
const (
	// DefaultHorizon is how long a mention may trigger an execution, and how long a
	// message's link is kept for the explicit triggers that name it.
	DefaultHorizon = time.Hour
	// DefaultMaxMessages bounds the messages remembered (their links, for explicit
	// triggers and for the mentions they hold); the oldest go first.
	DefaultMaxMessages = 1_000_000
	// maxPendingPerTrigger bounds the events one unknown trigger holds pending.
	maxPendingPerTrigger = 10_000
)

// Tracker derives links from the events of rooms in order.
//
// Its state is keyed by what a client cannot borrow from another organization: a
// message and the events waiting for it by room and id, an execution by organization,
// agent and id. A message of another organization (a contact's, in a shared room)
// triggers an agent only if it mentions the agent: the platform delivers a message to
// the participants it tags, so a client cannot make its own spend someone else's by
// naming their message. The first organization to use a message id in a room keeps
// it.
type Tracker struct {
	who         Who
	horizon     time.Duration
	maxMessages int

	rooms        map[string]*room       // room id → its mentions
	messages     map[string]*remembered // room and id (the platform's, and the event's) → the message
	order        []messageKey           // the messages in the order they came, for the cap and the sweep
	executions   map[string]*remembered // organization, agent and execution id → the link of its first event
	pending      map[string][]waiting   // room and trigger → the events waiting for it
	pendingExecs map[string][]string    // room and trigger → the executions whose link waits for it
	pendingAt    map[string]stamp       // room and trigger → the latest event waiting for it
	swept        time.Time              // the last sweep of the maps (event time)
	// wall is the clock of when things are seen (time.Now): what the sweep forgets is
	// old in event time and was seen long ago, so that a partition whose events lag
	// the others' by hours (a backlog caught up unevenly) keeps its rooms' messages.
	wall func() time.Time
}

// stamp is when something happened (event time) and when the Tracker saw it (wall).
type stamp struct{ at, seen time.Time }

type messageKey struct {
	keys [2]string
	stamp
}

type waiting struct {
	id, org, agent string
	at             time.Time
	explicit       bool // the event named its trigger (false: inferred from a mention)
}

type remembered struct {
	link           Link
	at             time.Time
	msgID, eventID string   // a message's two ids
	room           string   // a message's
	org            string   // a message's or an execution's organization
	mentions       []string // a message's
	agent          string   // an execution's
	seen           time.Time
}

// mayTrigger says whether message r may have started an execution of agent in org:
// any message of the agent's organization, another's only if it mentions the agent.
func (r *remembered) mayTrigger(org, agent string) bool {
	return r.org == org || slices.Contains(r.mentions, agent)
}

func roomKey(room, id string) string { return room + "\x00" + id }

func execKey(org, agent, execution string) string { return org + "\x00" + agent + "\x00" + execution }

type room struct {
	mentioned map[string]mention // agent id → the latest message that mentioned it
}

type mention struct {
	msgID, eventID string
	at, seen       time.Time
	link           Link // the mentioning message's own link
}

// New makes a Tracker; horizon and maxMessages of 0 take the defaults.
func New(who Who, horizon time.Duration, maxMessages int) *Tracker {
	if horizon <= 0 {
		horizon = DefaultHorizon
	}
	if maxMessages <= 0 {
		maxMessages = DefaultMaxMessages
	}
	if who == nil {
		who = func(schema.Party) (string, string) { return "", "" }
	}
	return &Tracker{who: who, horizon: horizon, maxMessages: maxMessages, rooms: map[string]*room{},
		messages: map[string]*remembered{}, executions: map[string]*remembered{}, pending: map[string][]waiting{},
		pendingExecs: map[string][]string{}, pendingAt: map[string]stamp{}, wall: time.Now}
}

// Linked says whether events of this type by this kind of actor get a link: the
// messages and room events of agents and people, and agents' usage.
func Linked(ev *schema.Event) bool {
	switch ev.Actor.Type {
	case schema.ActorAgent:
	case schema.ActorUser:
		return isMessage(ev.Type)
	default:
		return false
	}
	return isMessage(ev.Type) || ev.Type == schema.TypeUsageReported || strings.HasPrefix(ev.Type, "event.")
}

func isMessage(t string) bool {
	return t == schema.TypeMessageCreated || t == schema.TypeMessageUpdated
}

// fields is what a link needs of an event's data, whatever its type.
type fields struct {
	MessageID string           `json:"message_id"`
	Mentions  []schema.Mention `json:"mentions"`
	Trigger   *struct {
		MessageID string `json:"message_id"`
		Source    string `json:"source"`
	} `json:"trigger"`
	Extra *struct {
		Metadata *struct {
			TriggerMessageID string `json:"trigger_message_id"`
			TriggerSource    string `json:"trigger_source"`
		} `json:"metadata"`
	} `json:"extra"`
}

// Explicit is the explicit trigger of an event's data: a message id or a source.
func explicit(f *fields) (msg, source string) {
	if f.Trigger != nil {
		msg, source = f.Trigger.MessageID, f.Trigger.Source
	}
	if msg == "" && source == "" && f.Extra != nil && f.Extra.Metadata != nil {
		msg, source = f.Extra.Metadata.TriggerMessageID, f.Extra.Metadata.TriggerSource
	}
	return msg, source
}

// Observation is what Observe makes of an event.
type Observation struct {
	Link Link
	// Message is the event as the Tracker remembers a message (its platform id, the
	// agents it mentions), which ingest stores beside its link; nil for an event that
	// is no message.
	Message *Message
	// Resolved are the pending events that this message resolves, as the late trigger
	// they named.
	Resolved []Resolution
}

// Observe returns what ev's link is (ok false for an event that gets none, see
// Linked). mentioned resolves a mention without an id (the platform sometimes sends
// only a handle) to an agent id; nil: such mentions are ignored.
func (t *Tracker) Observe(ev *schema.Event, mentioned func(handle string) string) (Observation, bool) {
	if !Linked(ev) {
		return Observation{}, false
	}
	f := lazyFields{ev: ev}
	t.sweep(ev.Time)
	var o Observation
	if ev.Actor.Type == schema.ActorUser {
		org, owner := t.who(ev.Actor)
		o.Link = Link{Initiator: ev.Actor, InitiatorOrg: org, InitiatorOwner: owner, Explicit: true}
	} else {
		o.Link = t.agentLink(ev, &f)
	}
	if isMessage(ev.Type) {
		o.Message = message(ev, f.get(), o.Link, mentioned)
		o.Resolved = t.Remember(*o.Message)
	}
	return o, true
}

var (
	triggerKey = []byte(`"trigger`) // data.trigger and metadata.trigger_message_id, trigger_source
	escape     = []byte(`\u`)
)

// decodeFields decodes what a link needs of ev's data. A message needs its id and
// mentions; any other event only an explicit trigger, which most do not carry, so
// their data is decoded only when it holds the key (or an escape, which could spell
// it).
func decodeFields(ev *schema.Event) fields {
	var f fields
	if len(ev.Data) == 0 || !isMessage(ev.Type) && !bytes.Contains(ev.Data, triggerKey) && !bytes.Contains(ev.Data, escape) {
		return f
	}
	_ = schema.DecodeData(ev.Data, &f) // data that is no object has no link fields
	return f
}

// lazyFields decodes an event's link fields when they are first asked for: an agent's
// event of an execution the Tracker remembers takes the execution's link and never
// needs them.
type lazyFields struct {
	ev      *schema.Event
	f       fields
	decoded bool
}

func (l *lazyFields) get() *fields {
	if !l.decoded {
		l.f, l.decoded = decodeFields(l.ev), true
	}
	return &l.f
}

func (t *Tracker) agentLink(ev *schema.Event, f *lazyFields) Link {
	var xk string
	if ev.ExecutionID != "" {
		xk = execKey(ev.OrgID, ev.Actor.ID, ev.ExecutionID)
		if r, ok := t.executions[xk]; ok {
			if r.link.Pending { // its events wait for the trigger its first one named
				t.await(ev, r.link.Trigger, r.link.Explicit)
			}
			return r.link
		}
	}
	l, ok := t.explicitLink(ev, f.get())
	if !ok {
		l = t.inferredLink(ev)
	}
	if xk != "" {
		t.executions[xk] = &remembered{link: l, at: ev.Time, org: ev.OrgID, agent: ev.Actor.ID, seen: t.wall()}
		if l.Pending {
			t.awaitExecution(roomKey(ev.RoomID, l.Trigger), xk, ev.Time)
		}
	}
	return l
}

// explicitLink is the link of an event that names its trigger. ok is false when it
// names none, or a message of another organization that does not mention the agent:
// such a trigger is not believed, and the link is inferred instead.
func (t *Tracker) explicitLink(ev *schema.Event, f *fields) (Link, bool) {
	msg, source := explicit(f)
	switch {
	case msg != "":
		r, ok := t.messages[roomKey(ev.RoomID, msg)]
		if !ok {
			t.await(ev, msg, true)
			return Link{Trigger: msg, Explicit: true, Pending: true, Depth: 1}, true
		}
		if !r.mayTrigger(ev.OrgID, ev.Actor.ID) {
			return Link{}, false
		}
		l := child(r.link, r.msgID, true)
		l.TriggerEvent = r.eventID
		if r.link.Pending { // a message of an execution whose own trigger is late
			t.await(ev, r.msgID, true)
		}
		return l, true
	case source != "":
		org, _ := t.who(ev.Actor)
		return Link{Initiator: schema.Party{ID: source, Type: schema.ActorSystem}, InitiatorOrg: org, Depth: 1, Explicit: true}, true
	}
	return Link{}, false
}

// inferredLink is the link of an event from the room's latest message that mentioned
// its agent within the horizon; without one the agent acted on its own.
func (t *Tracker) inferredLink(ev *schema.Event) Link {
	if rm, ok := t.rooms[ev.RoomID]; ok {
		if m, ok := rm.mentioned[ev.Actor.ID]; ok && !ev.Time.Before(m.at) && ev.Time.Sub(m.at) <= t.horizon {
			l := child(m.link, m.msgID, false)
			l.TriggerEvent = m.eventID
			if m.link.Pending {
				t.await(ev, m.msgID, false)
			}
			return l
		}
	}
	org, owner := t.who(ev.Actor)
	return Link{Initiator: ev.Actor, InitiatorOrg: org, InitiatorOwner: owner}
}

// child is the link of an execution that a message of link parent started.
func child(parent Link, trigger string, explicit bool) Link {
	return Link{Trigger: trigger, Initiator: parent.Initiator, InitiatorOrg: parent.InitiatorOrg,
		InitiatorOwner: parent.InitiatorOwner, Depth: parent.Depth + 1, Explicit: parent.Explicit && explicit,
		Pending: parent.Pending}
}

// message is ev as the Tracker remembers a message: its platform id (its event id when
// it has none) and, for a new one, the agents it mentions, each once.
func message(ev *schema.Event, f *fields, l Link, mentioned func(string) string) *Message {
	m := &Message{OrgID: ev.OrgID, Room: ev.RoomID, EventID: ev.ID, MessageID: f.MessageID, Time: ev.Time, Link: l}
	if m.MessageID == "" {
		m.MessageID = ev.ID
	}
	if ev.Type == schema.TypeMessageCreated {
		for _, x := range f.Mentions {
			id := x.ID
			if id == "" && mentioned != nil && x.Handle != "" {
				id = mentioned(x.Handle)
			}
			if id != "" && id != ev.Actor.ID && !slices.Contains(m.Mentions, id) { // at most schema.MaxMentions
				m.Mentions = append(m.Mentions, id)
			}
		}
	}
	return m
}

// Message is a message as the Tracker keeps it: what Warm is given of the messages
// ingest stored before it started.
type Message struct {
	OrgID, Room, EventID, MessageID string
	Time                            time.Time
	Mentions                        []string // the ids of the agents it mentions
	Link                            Link
}

// Remember records a message (Observe does for the messages it sees; ingest does at
// start for those it stored within the horizon, oldest first) and returns the pending
// events it resolves.
func (t *Tracker) Remember(m Message) []Resolution {
	if m.MessageID == "" {
		m.MessageID = m.EventID
	}
	seen := t.wall()
	r := &remembered{link: m.Link, at: m.Time, msgID: m.MessageID, eventID: m.EventID, room: m.Room, org: m.OrgID, mentions: m.Mentions, seen: seen}
	keys := [2]string{roomKey(m.Room, m.MessageID), roomKey(m.Room, m.EventID)}
	held := false // by another organization's message of the same id
	for _, k := range keys {
		if old, ok := t.messages[k]; ok && old.org != r.org {
			held = true
		}
	}
	if !held {
		t.messages[keys[0]], t.messages[keys[1]] = r, r
		t.order = append(t.order, messageKey{keys: keys, stamp: stamp{at: m.Time, seen: seen}})
		for len(t.order) > t.maxMessages {
			t.forget(t.order[0])
			t.order = t.order[1:]
		}
	}
	if len(m.Mentions) > 0 {
		rm := t.rooms[m.Room]
		if rm == nil {
			rm = &room{mentioned: map[string]mention{}}
			t.rooms[m.Room] = rm
		}
		for _, id := range m.Mentions {
			if old, ok := rm.mentioned[id]; !ok || !m.Time.Before(old.at) {
				rm.mentioned[id] = mention{msgID: m.MessageID, eventID: m.EventID, at: m.Time, seen: seen, link: m.Link}
			}
		}
	}
	if held || m.Link.Pending { // the events waiting for a pending one wait for its own trigger
		return nil
	}
	return t.resolve(*r)
}

// resolve gives the events waiting for message m (by either of its ids) their links,
// now that m's is known, and in turn the events waiting for the messages among them:
// a late trigger resolves the hand-overs of the execution it started too.
func (t *Tracker) resolve(m remembered) []Resolution {
	var out []Resolution
	for work := []remembered{m}; len(work) > 0; {
		m, work = work[len(work)-1], work[:len(work)-1]
		for _, name := range [2]string{m.msgID, m.eventID} {
			k := roomKey(m.room, name)
			var keep []waiting // of another organization, not mentioned: still waiting
			for _, e := range t.pending[k] {
				if !m.mayTrigger(e.org, e.agent) {
					keep = append(keep, e)
					continue
				}
				l := child(m.link, m.msgID, e.explicit)
				l.TriggerEvent = m.eventID
				out = append(out, Resolution{EventID: e.id, OrgID: e.org, Time: e.at, Link: l})
				if r, ok := t.messages[roomKey(m.room, e.id)]; ok && r.link.Pending && r.eventID == e.id && r.org == e.org {
					work = append(work, t.relearn(*r, l))
				}
			}
			for _, xk := range t.pendingExecs[k] {
				if x, ok := t.executions[xk]; ok && x.link.Pending && x.link.Trigger == name && m.mayTrigger(x.org, x.agent) {
					x.link = child(m.link, m.msgID, x.link.Explicit)
					x.link.TriggerEvent = m.eventID
				}
			}
			delete(t.pendingExecs, k)
			if len(keep) > 0 {
				t.pending[k] = keep
			} else {
				delete(t.pending, k)
				delete(t.pendingAt, k)
			}
		}
	}
	return out
}

// relearn gives a remembered message whose link was pending its resolved link l, where
// explicit triggers and mentions find it, and returns it.
func (t *Tracker) relearn(r remembered, l Link) remembered {
	r.link = l
	for _, id := range [2]string{r.msgID, r.eventID} {
		k := roomKey(r.room, id)
		if old, ok := t.messages[k]; ok && old.at.Equal(r.at) && old.org == r.org {
			t.messages[k] = &r
		}
	}
	if rm := t.rooms[r.room]; rm != nil {
		for _, agent := range r.mentions {
			if x, ok := rm.mentioned[agent]; ok && x.eventID == r.eventID {
				x.link = l
				rm.mentioned[agent] = x
			}
		}
	}
	return r
}

// Pending is a stored event whose link waits for its trigger: what Await is given.
type Pending struct {
	EventID, OrgID, Room, Agent, ExecutionID string
	Trigger                                  string // the stored link's
	Time                                     time.Time
}

// Await records a stored event whose link is pending (ingest does at start for the
// pending links it stored within the horizon, before it remembers the messages), so
// that the trigger resolves it when it comes. A stored pending link does not say
// whether its last hop was named or inferred: it resolves as named.
func (t *Tracker) Await(p Pending) {
	k := roomKey(p.Room, p.Trigger)
	if !slices.ContainsFunc(t.pending[k], func(x waiting) bool { return x.id == p.EventID && x.org == p.OrgID }) {
		t.hold(k, waiting{id: p.EventID, org: p.OrgID, agent: p.Agent, at: p.Time, explicit: true})
	}
	if p.ExecutionID != "" {
		xk := execKey(p.OrgID, p.Agent, p.ExecutionID)
		if _, ok := t.executions[xk]; !ok {
			t.executions[xk] = &remembered{link: Link{Trigger: p.Trigger, Explicit: true, Pending: true, Depth: 1}, at: p.Time, org: p.OrgID, agent: p.Agent,
				seen: t.wall()}
			t.awaitExecution(k, xk, p.Time)
		}
	}
}

// await holds ev pending on trigger, a message of its room not seen yet or whose own
// link is pending.
func (t *Tracker) await(ev *schema.Event, trigger string, explicit bool) {
	t.hold(roomKey(ev.RoomID, trigger), waiting{id: ev.ID, org: ev.OrgID, agent: ev.Actor.ID, at: ev.Time, explicit: explicit})
}

// hold adds w to the events waiting for trigger k: at most maxPendingPerTrigger per
// trigger, and as many triggers as messages remembered, so that triggers that never
// come cannot hold unbounded memory. An event past the bounds keeps its pending link.
func (t *Tracker) hold(k string, w waiting) {
	list, ok := t.pending[k]
	if !ok && len(t.pending) >= t.maxMessages {
		return
	}
	if len(list) < maxPendingPerTrigger {
		t.pending[k] = append(list, w)
		t.pendingAt[k] = stamp{at: maxTime(t.pendingAt[k].at, w.at), seen: t.wall()}
	}
}

// awaitExecution notes that execution xk's link waits for trigger k, within the same
// bounds, so that the trigger updates it without a scan of every execution.
func (t *Tracker) awaitExecution(k, xk string, at time.Time) {
	list, ok := t.pendingExecs[k]
	if !ok && len(t.pendingExecs) >= t.maxMessages {
		return
	}
	if len(list) < maxPendingPerTrigger {
		t.pendingExecs[k] = append(list, xk)
		t.pendingAt[k] = stamp{at: maxTime(t.pendingAt[k].at, at), seen: t.wall()}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (t *Tracker) forget(k messageKey) {
	for _, key := range k.keys {
		if r, ok := t.messages[key]; ok && r.at.Equal(k.at) {
			delete(t.messages, key)
		}
	}
}

// sweep forgets what is older than twice the horizon before now (event time: a
// room's events come in order, other rooms' may lag, so it keeps a horizon of slack)
// and was seen more than twice the horizon ago (wall time: a lagging partition's
// rooms keep theirs). The maps are swept once per eighth of the horizon, so that an
// event costs the sweep nothing in between.
func (t *Tracker) sweep(now time.Time) {
	cut, wall := now.Add(-2*t.horizon), t.wall()
	stale := func(s stamp) bool { return s.at.Before(cut) && wall.Sub(s.seen) > 2*t.horizon }
	for len(t.order) > 0 && stale(t.order[0].stamp) {
		t.forget(t.order[0])
		t.order = t.order[1:]
	}
	if now.Sub(t.swept) < t.horizon/8 && len(t.executions) <= t.maxMessages {
		return
	}
	t.swept = now
	for id, e := range t.executions {
		if stale(stamp{e.at, e.seen}) || len(t.executions) > t.maxMessages {
			delete(t.executions, id)
		}
	}
	for k, at := range t.pendingAt {
		if stale(at) {
			delete(t.pending, k)
			delete(t.pendingExecs, k)
			delete(t.pendingAt, k)
		}
	}
	for id, rm := range t.rooms {
		for a, m := range rm.mentioned {
			if stale(stamp{m.at, m.seen}) {
				delete(rm.mentioned, a)
			}
		}
		if len(rm.mentioned) == 0 {
			delete(t.rooms, id)
		}
	}
}

// Remembered is the count of messages, executions, rooms and pending triggers held,
// for the gauges.
func (t *Tracker) Remembered() (messages, executions, rooms, pending int) {
	return len(t.order), len(t.executions), len(t.rooms), len(t.pending)
}
