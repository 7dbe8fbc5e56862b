package cause

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func who(p schema.Party) (string, string) {
	switch p.ID {
	case "alice":
		return "org-a", "alice"
	case "coder", "reviewer":
		return "org-a", "alice"
	case "partner-bot":
		return "org-b", "bob"
	}
	return "", ""
}

type world struct {
	t  *testing.T
	tr *Tracker
	n  int
}

func newWorld(t *testing.T) *world { return &world{t: t, tr: New(who, 0, 0)} }

func (w *world) ev(actor schema.Party, typ string, at time.Duration, data any) *schema.Event {
	w.n++
	b, err := json.Marshal(data)
	require.NoError(w.t, err)
	return &schema.Event{ID: fmt.Sprintf("e%d", w.n), Type: typ, Time: t0.Add(at), RoomID: "room-1", Actor: actor, Data: b}
}

func (w *world) observe(ev *schema.Event) (Link, []Resolution) {
	o, ok := w.tr.Observe(ev, func(h string) string {
		if h == "coder-handle" {
			return "coder"
		}
		return ""
	})
	require.True(w.t, ok, "%s by %s gets a link", ev.Type, ev.Actor.ID)
	return o.Link, o.Resolved
}

var (
	alice    = schema.Party{ID: "alice", Type: schema.ActorUser}
	coder    = schema.Party{ID: "coder", Type: schema.ActorAgent}
	reviewer = schema.Party{ID: "reviewer", Type: schema.ActorAgent}
	partner  = schema.Party{ID: "partner-bot", Type: schema.ActorAgent}
)

func msg(id string, mentions ...string) map[string]any {
	var ms []map[string]string
	for _, m := range mentions {
		ms = append(ms, map[string]string{"id": m})
	}
	return map[string]any{"message_id": id, "content": "hi", "mentions": ms}
}

func usage() map[string]any { return map[string]any{"input_tokens": 10, "output_tokens": 1} }

func TestInferredChainAcrossAgentsAndOwners(t *testing.T) {
	w := newWorld(t)
	root, _ := w.observe(w.ev(alice, schema.TypeMessageCreated, 0, msg("m1", "coder")))
	assert.Equal(t, Link{Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice", Explicit: true}, root)

	tool, _ := w.observe(w.ev(coder, schema.TypeToolCall, time.Second, map[string]any{"tool_name": "search"}))
	reply, _ := w.observe(w.ev(coder, schema.TypeMessageCreated, 2*time.Second, msg("m2", "reviewer", "alice")))
	use, _ := w.observe(w.ev(coder, schema.TypeUsageReported, 3*time.Second, usage()))
	want := Link{Trigger: "m1", TriggerEvent: "e1", Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice", Depth: 1}
	for _, l := range []Link{tool, reply, use} {
		assert.Equal(t, want, l)
		assert.Equal(t, SourceInferred, l.Source())
	}
	rev, _ := w.observe(w.ev(reviewer, schema.TypeUsageReported, 4*time.Second, usage()))
	assert.Equal(t, Link{Trigger: "m2", TriggerEvent: "e3", Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice", Depth: 2}, rev)

	// Across owners: the reviewer hands to another organization's agent, which is
	// still alice's spend.
	w.observe(w.ev(reviewer, schema.TypeMessageCreated, 5*time.Second, msg("m3", "partner-bot")))
	p, _ := w.observe(w.ev(partner, schema.TypeUsageReported, 6*time.Second, usage()))
	assert.Equal(t, alice, p.Initiator)
	assert.Equal(t, "org-a", p.InitiatorOrg)
	assert.Equal(t, 3, p.Depth)
}

func TestExplicitTriggerWinsAndStaysExplicit(t *testing.T) {
	w := newWorld(t)
	w.observe(w.ev(alice, schema.TypeMessageCreated, 0, msg("m1", "coder")))
	w.observe(w.ev(alice, schema.TypeMessageCreated, time.Second, msg("m9", "coder"))) // a later mention
	l, _ := w.observe(w.ev(coder, schema.TypeUsageReported, 2*time.Second,
		map[string]any{"input_tokens": 1, "output_tokens": 1, "extra": map[string]any{"metadata": map[string]any{"trigger_message_id": "m1"}}}))
	assert.Equal(t, "m1", l.Trigger, "the explicit trigger, not the latest mention")
	assert.Equal(t, "e1", l.TriggerEvent)
	assert.True(t, l.Explicit)
	assert.Equal(t, SourceExplicit, l.Source())

	// Named by event id too, in the canonical field.
	l, _ = w.observe(w.ev(coder, schema.TypeToolCall, 3*time.Second, map[string]any{"tool_name": "x", "trigger": map[string]any{"message_id": "e2"}}))
	assert.Equal(t, "m9", l.Trigger)
	assert.Equal(t, "e2", l.TriggerEvent)
	assert.True(t, l.Explicit)
}

// A trigger key spelled with an escape is still the trigger: the check that skips
// decoding the data of most events does not miss it.
func TestEscapedTriggerKeyIsRead(t *testing.T) {
	w := newWorld(t)
	w.observe(w.ev(alice, schema.TypeMessageCreated, 0, msg("m1", "coder")))
	w.observe(w.ev(alice, schema.TypeMessageCreated, time.Second, msg("m2", "coder")))
	ev := w.ev(coder, schema.TypeUsageReported, 2*time.Second, nil)
	ev.Data = []byte(`{"input_tokens":1,"\u0074rigger":{"message_id":"m1"}}`)
	l, _ := w.observe(ev)
	assert.Equal(t, "m1", l.Trigger)
	assert.True(t, l.Explicit)
}

// A message's observation carries what the causes table keeps of it: its platform id
// and each agent it mentions once, never its author.
func TestObservationOfAMessage(t *testing.T) {
	tr := New(who, 0, 0)
	ev := schema.Event{ID: "e1", Type: schema.TypeMessageCreated, Time: t0, RoomID: "r", Actor: coder,
		Data: []byte(`{"message_id":"m1","mentions":[{"id":"reviewer"},{"id":"coder"},{"id":"reviewer"},{"handle":"nobody"}]}`)}
	o, ok := tr.Observe(&ev, nil)
	require.True(t, ok)
	require.NotNil(t, o.Message)
	assert.Equal(t, "m1", o.Message.MessageID)
	assert.Equal(t, []string{"reviewer"}, o.Message.Mentions)

	use := schema.Event{ID: "e2", Type: schema.TypeUsageReported, Time: t0, RoomID: "r", Actor: coder, Data: []byte(`{"input_tokens":1}`)}
	o, ok = tr.Observe(&use, nil)
	require.True(t, ok)
	assert.Nil(t, o.Message)
}

func TestLateTriggerIsPendingThenResolved(t *testing.T) {
	w := newWorld(t)
	early := w.ev(coder, schema.TypeUsageReported, time.Second, map[string]any{"input_tokens": 1, "output_tokens": 1, "trigger": map[string]any{"message_id": "m-late"}})
	early.ExecutionID = "x1"
	l, _ := w.observe(early)
	assert.True(t, l.Pending)
	assert.Equal(t, SourcePending, l.Source())
	assert.Equal(t, schema.Party{}, l.Initiator, "no initiator until the trigger is seen")

	_, res := w.observe(w.ev(alice, schema.TypeMessageCreated, 0, msg("m-late", "coder")))
	want := Link{Trigger: "m-late", TriggerEvent: "e2", Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice", Depth: 1, Explicit: true}
	assert.Equal(t, []Resolution{{EventID: early.ID, Time: early.Time, Link: want}}, res)

	// The execution's later events get the resolved link.
	later := w.ev(coder, schema.TypeToolCall, 2*time.Second, map[string]any{"tool_name": "x"})
	later.ExecutionID = "x1"
	l, _ = w.observe(later)
	assert.Equal(t, want, l)
}

func TestSourcesAndRoots(t *testing.T) {
	w := newWorld(t)
	l, _ := w.observe(w.ev(coder, schema.TypeUsageReported, 0, map[string]any{"input_tokens": 1, "output_tokens": 1,
		"extra": map[string]any{"metadata": map[string]any{"trigger_source": "schedule"}}}))
	assert.Equal(t, Link{Initiator: schema.Party{ID: "schedule", Type: schema.ActorSystem}, InitiatorOrg: "org-a", Depth: 1, Explicit: true}, l)

	// Nobody mentioned it: it acted on its own.
	l, _ = w.observe(w.ev(reviewer, schema.TypeUsageReported, time.Second, usage()))
	assert.Equal(t, Link{Initiator: reviewer, InitiatorOrg: "org-a", InitiatorOwner: "alice"}, l)

	// A mention past the horizon starts nothing.
	w.observe(w.ev(alice, schema.TypeMessageCreated, 2*time.Second, msg("m1", "coder")))
	l, _ = w.observe(w.ev(coder, schema.TypeUsageReported, 2*time.Second+DefaultHorizon+time.Second, usage()))
	assert.Equal(t, coder, l.Initiator)
	assert.Equal(t, 0, l.Depth)
}

func TestExecutionKeepsItsFirstLink(t *testing.T) {
	w := newWorld(t)
	w.observe(w.ev(alice, schema.TypeMessageCreated, 0, msg("m1", "coder")))
	first := w.ev(coder, schema.TypeToolCall, time.Second, map[string]any{"tool_name": "x"})
	first.ExecutionID = "x1"
	w.observe(first)
	w.observe(w.ev(reviewer, schema.TypeMessageCreated, 2*time.Second, msg("m2", "coder"))) // mentions it again meanwhile
	use := w.ev(coder, schema.TypeUsageReported, 3*time.Second, usage())
	use.ExecutionID = "x1"
	l, _ := w.observe(use)
	assert.Equal(t, "m1", l.Trigger, "the execution's first trigger")
	// Without an execution id the latest mention wins: the inference's known limit.
	l, _ = w.observe(w.ev(coder, schema.TypeUsageReported, 4*time.Second, usage()))
	assert.Equal(t, "m2", l.Trigger)
}

func TestHandleOnlyMentionsAndSelfMentions(t *testing.T) {
	w := newWorld(t)
	w.observe(w.ev(alice, schema.TypeMessageCreated, 0, map[string]any{"message_id": "m1", "mentions": []map[string]string{{"handle": "coder-handle"}}}))
	l, _ := w.observe(w.ev(coder, schema.TypeUsageReported, time.Second, usage()))
	assert.Equal(t, "m1", l.Trigger)
	// An agent mentioning itself starts nothing of its own.
	w.observe(w.ev(reviewer, schema.TypeMessageCreated, 2*time.Second, msg("m2", "reviewer")))
	l, _ = w.observe(w.ev(reviewer, schema.TypeUsageReported, 3*time.Second, usage()))
	assert.Equal(t, reviewer, l.Initiator)
}

func TestOnlyRoomEventsAndUsageAreLinked(t *testing.T) {
	tr := New(who, 0, 0)
	for _, ev := range []schema.Event{
		{Type: schema.TypeAgentRegistered, Actor: alice},
		{Type: schema.TypeUsageReported, Actor: alice},
		{Type: schema.TypeMessageCreated, Actor: schema.Party{ID: "sys", Type: schema.ActorSystem}},
		{Type: "policy.decided", Actor: coder},
	} {
		_, ok := tr.Observe(&ev, nil)
		assert.False(t, ok, "%s by %s", ev.Type, ev.Actor.Type)
	}
}

// Whatever data a client sent, Observe answers and keeps its bounds.
func TestHostileData(t *testing.T) {
	tr := New(who, time.Minute, 100)
	wall := t0
	tr.wall = func() time.Time { return wall }
	for i, data := range []string{`not json`, `[1,2]`, `{"mentions":"x"}`, `{"trigger":7}`, `{"extra":{"metadata":[]}}`, `null`, ``} {
		ev := schema.Event{ID: fmt.Sprint("h", i), Type: schema.TypeMessageCreated, Time: t0, RoomID: "r", Actor: coder, Data: json.RawMessage(data)}
		_, ok := tr.Observe(&ev, nil)
		assert.True(t, ok)
	}
	// Many messages: the oldest are forgotten at the cap.
	for i := range 1000 {
		ev := schema.Event{ID: fmt.Sprint("m", i), Type: schema.TypeMessageCreated, Time: t0.Add(time.Duration(i) * time.Millisecond), RoomID: "r", Actor: alice,
			Data: json.RawMessage(fmt.Sprintf(`{"message_id":"p%d","mentions":[{"id":"coder"}]}`, i))}
		tr.Observe(&ev, nil)
	}
	msgs, _, _, _ := tr.Remembered()
	assert.LessOrEqual(t, msgs, 100)
	// Unknown triggers hold at most maxPendingPerTrigger events each, and go at the
	// horizon.
	for i := range maxPendingPerTrigger + 10 {
		ev := schema.Event{ID: fmt.Sprint("u", i), Type: schema.TypeUsageReported, Time: t0, Actor: coder, Data: json.RawMessage(`{"trigger":{"message_id":"never"}}`)}
		tr.Observe(&ev, nil)
	}
	assert.Len(t, tr.pending[roomKey("", "never")], maxPendingPerTrigger)
	// Many unknown triggers: no more of them than messages are held.
	for i := range 300 {
		ev := schema.Event{ID: fmt.Sprint("v", i), Type: schema.TypeUsageReported, Time: t0, Actor: coder,
			Data: json.RawMessage(fmt.Sprintf(`{"trigger":{"message_id":"never-%d"}}`, i))}
		o, _ := tr.Observe(&ev, nil)
		assert.True(t, o.Link.Pending)
	}
	assert.Len(t, tr.pending, 100)
	wall = wall.Add(10 * time.Minute)
	late := schema.Event{ID: "late", Type: schema.TypeUsageReported, Time: t0.Add(10 * time.Minute), Actor: coder, Data: json.RawMessage(`{}`)}
	tr.Observe(&late, nil)
	_, _, rooms, pending := tr.Remembered()
	assert.Equal(t, 0, pending)
	assert.Equal(t, 0, rooms)
}

// A partition whose events lag the others' by hours of event time (a backlog caught up
// unevenly) keeps its rooms' messages: the sweep forgets only what was also seen long
// ago.
func TestLaggingRoomKeepsItsMessages(t *testing.T) {
	tr := New(who, 0, 0)
	wall := t0
	tr.wall = func() time.Time { return wall }
	msg := orgEvent("a1", "org-a", alice, schema.TypeMessageCreated, 0, `{"message_id":"m-a","mentions":[{"id":"coder"}]}`)
	tr.Observe(msg, nil)
	ahead := orgEvent("x1", "org-a", reviewer, schema.TypeUsageReported, 5*time.Hour, `{}`)
	ahead.RoomID = "room-2"
	wall = wall.Add(time.Minute)
	tr.Observe(ahead, nil)
	use := orgEvent("c1", "org-a", coder, schema.TypeUsageReported, time.Second, `{"trigger":{"message_id":"m-a"}}`)
	o, ok := tr.Observe(use, nil)
	require.True(t, ok)
	assert.Equal(t, alice, o.Link.Initiator, "room-1's message is kept though room-2 is hours ahead")
	assert.False(t, o.Link.Pending)

	wall = wall.Add(3 * time.Hour) // seen long ago too: gone
	ahead.ID, ahead.Time = "x2", ahead.Time.Add(time.Hour)
	tr.Observe(ahead, nil)
	msgs, _, _, _ := tr.Remembered()
	assert.Zero(t, msgs)
}

func TestPendingExecutionHoldsItsLaterEventsAndWarmsFromStore(t *testing.T) {
	w := newWorld(t)
	first := w.ev(coder, schema.TypeUsageReported, time.Second, map[string]any{"input_tokens": 1, "output_tokens": 1, "trigger": map[string]any{"message_id": "m-late"}})
	first.ExecutionID = "x1"
	w.observe(first)
	second := w.ev(coder, schema.TypeToolCall, 2*time.Second, map[string]any{"tool_name": "x"})
	second.ExecutionID = "x1"
	l, _ := w.observe(second)
	assert.True(t, l.Pending, "a later event of a pending execution waits for the same trigger")

	// A restarted tracker learns the stored pending links (Await), then the message.
	tr := New(who, 0, 0)
	tr.Await(Pending{EventID: first.ID, Room: "room-1", Agent: "coder", ExecutionID: "x1", Trigger: "m-late", Time: first.Time})
	tr.Await(Pending{EventID: second.ID, Room: "room-1", Agent: "coder", ExecutionID: "x1", Trigger: "m-late", Time: second.Time})
	tr.Await(Pending{EventID: second.ID, Room: "room-1", Agent: "coder", ExecutionID: "x1", Trigger: "m-late", Time: second.Time}) // read twice: held once
	res := tr.Remember(Message{Room: "room-1", EventID: "e9", MessageID: "m-late", Time: t0,
		Link: Link{Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice", Explicit: true}})
	require.Len(t, res, 2)
	for _, r := range res {
		assert.Equal(t, alice, r.Link.Initiator)
		assert.Equal(t, 1, r.Link.Depth)
		assert.Equal(t, SourceExplicit, r.Link.Source())
	}
}

// Warmed from stored rows (Await, then Remember oldest first), a tracker resolves a
// late trigger's hand-overs as one that saw them live does.
func TestWarmedTrackerResolvesHandOversOfALateTrigger(t *testing.T) {
	tr := New(who, 0, 0)
	pending := Link{Trigger: "m-late", Explicit: true, Pending: true, Depth: 1}
	tr.Await(Pending{EventID: "e-coder-use", Room: "room-1", Agent: "coder", ExecutionID: "x1", Trigger: "m-late", Time: t0.Add(2 * time.Second)})
	tr.Await(Pending{EventID: "e-coder-msg", Room: "room-1", Agent: "coder", ExecutionID: "x1", Trigger: "m-late", Time: t0.Add(3 * time.Second)})
	tr.Await(Pending{EventID: "e-reviewer-use", Room: "room-1", Agent: "reviewer", Trigger: "m2", Time: t0.Add(4 * time.Second)}) // inferred from m2, pending with it
	assert.Empty(t, tr.Remember(Message{Room: "room-1", EventID: "e-coder-msg", MessageID: "m2", Time: t0.Add(3 * time.Second),
		Mentions: []string{"reviewer"}, Link: pending}), "a pending message resolves nothing")

	res := tr.Remember(Message{Room: "room-1", EventID: "e-alice", MessageID: "m-late", Time: t0.Add(time.Second),
		Mentions: []string{"coder"}, Link: Link{Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice", Explicit: true}})
	got := map[string]Link{}
	for _, r := range res {
		got[r.EventID] = r.Link
	}
	require.Len(t, got, 3)
	for _, id := range []string{"e-coder-use", "e-coder-msg"} {
		assert.Equal(t, Link{Trigger: "m-late", TriggerEvent: "e-alice", Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice",
			Depth: 1, Explicit: true}, got[id], id)
	}
	assert.Equal(t, Link{Trigger: "m2", TriggerEvent: "e-coder-msg", Initiator: alice, InitiatorOrg: "org-a", InitiatorOwner: "alice",
		Depth: 2, Explicit: true}, got["e-reviewer-use"], "Await holds stored pending rows as named")

	// The reviewer's next event infers m2, now resolved.
	ev := schema.Event{ID: "e-next", Type: schema.TypeUsageReported, Time: t0.Add(5 * time.Second), RoomID: "room-1", Actor: reviewer, Data: []byte(`{}`)}
	o, ok := tr.Observe(&ev, nil)
	require.True(t, ok)
	assert.Equal(t, alice, o.Link.Initiator)
	assert.Equal(t, 2, o.Link.Depth)
	assert.False(t, o.Link.Pending)
}

// orgEvent is an event of org in room-1.
func orgEvent(id, org string, actor schema.Party, typ string, at time.Duration, data string) *schema.Event {
	return &schema.Event{ID: id, OrgID: org, Type: typ, Time: t0.Add(at), RoomID: "room-1", Actor: actor, Data: json.RawMessage(data)}
}

// One organization cannot make its spend another's by naming the other's message, by
// reusing its execution id, or by sending a message of the id another's pending events
// wait for; a contact's message that mentions the agent does start its execution.
func TestLinksStayWithinWhatAnOrganizationMayClaim(t *testing.T) {
	bob := schema.Party{ID: "bob", Type: schema.ActorUser}
	mallory := schema.Party{ID: "mallory-bot", Type: schema.ActorAgent}
	eve := schema.Party{ID: "eve", Type: schema.ActorUser}
	observe := func(tr *Tracker, ev *schema.Event) Observation {
		t.Helper()
		o, ok := tr.Observe(ev, nil)
		require.True(t, ok)
		return o
	}

	t.Run("explicit trigger naming another organization's message", func(t *testing.T) {
		tr := New(who, 0, 0)
		observe(tr, orgEvent("b1", "org-b", bob, schema.TypeMessageCreated, 0, `{"message_id":"m-bob","mentions":[{"id":"partner-bot"}]}`))
		o := observe(tr, orgEvent("x1", "org-x", mallory, schema.TypeUsageReported, time.Second, `{"input_tokens":1,"trigger":{"message_id":"m-bob"}}`))
		assert.Equal(t, mallory, o.Link.Initiator, "not bob's: his message does not mention mallory-bot")
		assert.Equal(t, 0, o.Link.Depth)
		// The contact's agent that bob mentioned is his.
		o = observe(tr, orgEvent("p1", "org-p", partner, schema.TypeUsageReported, 2*time.Second, `{"input_tokens":1,"trigger":{"message_id":"m-bob"}}`))
		assert.Equal(t, bob, o.Link.Initiator)
		assert.Equal(t, 1, o.Link.Depth)
		assert.True(t, o.Link.Explicit)
	})

	t.Run("another organization's execution id", func(t *testing.T) {
		tr := New(who, 0, 0)
		observe(tr, orgEvent("b1", "org-b", bob, schema.TypeMessageCreated, 0, `{"message_id":"m-bob","mentions":[{"id":"partner-bot"}]}`))
		ev := orgEvent("b2", "org-b", partner, schema.TypeUsageReported, time.Second, `{"input_tokens":1}`)
		ev.ExecutionID = "exec-1"
		assert.Equal(t, bob, observe(tr, ev).Link.Initiator)
		ev = orgEvent("x1", "org-x", mallory, schema.TypeUsageReported, 2*time.Second, `{"input_tokens":1}`)
		ev.ExecutionID = "exec-1"
		assert.Equal(t, mallory, observe(tr, ev).Link.Initiator, "the id is org-b's execution's only")
	})

	t.Run("a message of the id another organization's pending events wait for", func(t *testing.T) {
		tr := New(who, 0, 0)
		pending := observe(tr, orgEvent("p1", "org-p", partner, schema.TypeUsageReported, 0, `{"input_tokens":1,"trigger":{"message_id":"m-late"}}`))
		require.True(t, pending.Link.Pending)
		o := observe(tr, orgEvent("e1", "org-x", eve, schema.TypeMessageCreated, time.Second, `{"message_id":"m-late"}`))
		assert.Empty(t, o.Resolved, "eve's message does not mention partner-bot: it resolves nothing")
		// bob's message of that id, in time, mentions it: it does.
		o = observe(tr, orgEvent("b1", "org-b", bob, schema.TypeMessageCreated, 2*time.Second, `{"message_id":"m-late","mentions":[{"id":"partner-bot"}]}`))
		assert.Empty(t, o.Resolved, "the id is eve's in the room now: the first organization to use it keeps it")

		tr = New(who, 0, 0)
		observe(tr, orgEvent("p1", "org-p", partner, schema.TypeUsageReported, 0, `{"input_tokens":1,"trigger":{"message_id":"m-late"}}`))
		o = observe(tr, orgEvent("b1", "org-b", bob, schema.TypeMessageCreated, time.Second, `{"message_id":"m-late","mentions":[{"id":"partner-bot"}]}`))
		require.Len(t, o.Resolved, 1)
		assert.Equal(t, Resolution{EventID: "p1", OrgID: "org-p", Time: t0, Link: Link{Trigger: "m-late", TriggerEvent: "b1", Initiator: bob,
			Depth: 1, Explicit: true}}, o.Resolved[0])
	})

	t.Run("a trigger in another room", func(t *testing.T) {
		tr := New(who, 0, 0)
		observe(tr, orgEvent("a1", "org-a", alice, schema.TypeMessageCreated, 0, `{"message_id":"m-a","mentions":[{"id":"coder"}]}`))
		ev := orgEvent("c1", "org-a", coder, schema.TypeUsageReported, time.Second, `{"input_tokens":1,"trigger":{"message_id":"m-a"}}`)
		ev.RoomID = "room-2"
		o := observe(tr, ev)
		assert.True(t, o.Link.Pending, "a trigger is a message of the event's room")
	})
}
