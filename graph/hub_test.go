package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/work"
)

type fakeHandles map[string]string // id → handle; ids starting with "u" are people

func (f fakeHandles) Handle(org, id string) (string, bool, bool) {
	h, ok := f[org+"/"+id]
	return h, len(id) > 0 && id[0] == 'u', ok
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func liveEvent(id, typ string, at time.Time, org, room, actor string, actorType schema.ActorType, data any) *schema.Event {
	b, _ := json.Marshal(data)
	return &schema.Event{ID: id, Type: typ, Time: at, OrgID: org, RoomID: room, Actor: schema.Party{ID: actor, Type: actorType}, Data: b}
}

func next(t *testing.T, ch <-chan *change) *change {
	t.Helper()
	select {
	case c, ok := <-ch:
		require.True(t, ok, "channel closed")
		return c
	case <-time.After(2 * time.Second):
		t.Fatal("no change within 2 s")
		return nil
	}
}

// quiet checks that nothing is waiting on ch. Publish, Replay, checkStuck and checkKeys
// hand their changes to the subscribers' buffers before they return, so whatever the
// calls before it changed is already there.
func quiet(t *testing.T, ch <-chan *change) {
	t.Helper()
	select {
	case c := <-ch:
		t.Fatalf("unexpected change %+v", c)
	default:
	}
}

func TestHubTasksBecomeStuckOnTheirOwn(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	h := NewHub(HubConfig{StuckAfter: 15 * time.Minute, Now: clk.now, Handles: fakeHandles{"org-a/a1": "lead/coder"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work, err := h.subscribe(ctx, "k1", "org-a", "", subWork, nil)
	require.NoError(t, err)
	other, err := h.subscribe(ctx, "k2", "org-b", "", subWork, nil)
	require.NoError(t, err)

	h.Publish(liveEvent("e1", schema.TypeTaskUpdated, clk.now(), "org-a", "r1", "u1", schema.ActorUser,
		schema.TaskData{TaskID: "t1", Title: "Fix", Status: "in_progress", Assignee: "a1"}))
	c := next(t, work)
	require.Equal(t, model.WorkChangeKindTask, c.work.Kind)
	require.Equal(t, "lead/coder", *c.work.Task.AssigneeHandle)
	require.False(t, c.work.Task.Stuck)

	clk.add(14 * time.Minute)
	h.checkStuck()
	quiet(t, work)
	clk.add(time.Minute)
	h.checkStuck() // no event: the timer alone finds it
	c = next(t, work)
	require.Equal(t, model.WorkChangeKindTaskStuck, c.work.Kind)
	require.Nil(t, c.work.EventID)
	require.True(t, c.work.Task.Stuck)
	h.checkStuck()
	quiet(t, work) // once per transition

	// The assignee speaks: unstuck.
	h.Publish(liveEvent("e2", schema.TypeMessageCreated, clk.now(), "org-a", "r1", "a1", schema.ActorAgent, schema.MessageData{Content: "back"}))
	c = next(t, work)
	require.Equal(t, model.WorkChangeKindTask, c.work.Kind)
	require.False(t, c.work.Task.Stuck)
	c = next(t, work)
	require.Equal(t, model.WorkChangeKindAgentActive, c.work.Kind)
	require.Equal(t, "a1", *c.work.AgentID)

	quiet(t, other) // another organization sees none of it

	// A seeded task (stored before the hub started) becomes stuck too.
	h.SeedTask("org-a", taskOf("t2", "r1", "a9", "working", clk.now().Add(-20*time.Minute)))
	h.checkStuck()
	c = next(t, work)
	require.Equal(t, "t2", c.work.Task.ID)
	require.Equal(t, model.WorkChangeKindTaskStuck, c.work.Kind)
}

func TestHubAttention(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	h := NewHub(HubConfig{Now: clk.now, Handles: fakeHandles{"org-a/u-lead": "lead"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work, err := h.subscribe(ctx, "k", "org-a", "r1", subWork, nil)
	require.NoError(t, err)
	asks, err := h.subscribe(ctx, "k", "org-a", "", subAttention, nil)
	require.NoError(t, err)
	elsewhere, err := h.subscribe(ctx, "k", "org-a", "r2", subWork, nil)
	require.NoError(t, err)

	h.Publish(liveEvent("q1", schema.TypeAttention, clk.now(), "org-a", "r1", "a1", schema.ActorAgent,
		schema.MessageData{Content: "@lead ok?", Mentions: []schema.Mention{{ID: "a2"}, {ID: "u-lead"}}}))
	c := next(t, work)
	require.Equal(t, model.WorkChangeKindAttentionOpened, c.work.Kind)
	require.Equal(t, "u-lead", *c.work.Attention.AddressedTo)
	a := next(t, asks)
	require.Equal(t, "q1", a.attention.ID)
	quiet(t, elsewhere)

	clk.add(time.Minute)
	// Another person's message does not answer it; the lead's does.
	h.Publish(liveEvent("m1", schema.TypeMessageCreated, clk.now(), "org-a", "r1", "u-other", schema.ActorUser, schema.MessageData{Content: "hm"}))
	quiet(t, work)
	h.Publish(liveEvent("m2", schema.TypeMessageCreated, clk.now(), "org-a", "r1", "u-lead", schema.ActorUser, schema.MessageData{Content: "yes"}))
	c = next(t, work)
	require.Equal(t, model.WorkChangeKindAttentionClosed, c.work.Kind)
	require.Equal(t, "q1", c.work.Attention.ID)
}

func TestHubDropsASlowSubscriberOnly(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	h := NewHub(HubConfig{Buffer: 2, Now: clk.now})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := h.subscribe(ctx, "k", "org-a", "", subWork, nil)
	require.NoError(t, err)
	fast, err := h.subscribe(ctx, "k", "org-a", "", subWork, nil)
	require.NoError(t, err)
	got := make(chan struct{})
	go func() {
		for range fast {
			got <- struct{}{}
		}
	}()
	for i := range 5 {
		h.Publish(liveEvent("m"+string(rune('0'+i)), schema.TypeMessageCreated, clk.now(), "org-a", "r1", "a1", schema.ActorAgent, schema.MessageData{}))
		// The fast one takes each change before the next is published: it keeps up.
		select {
		case <-got:
		case <-time.After(2 * time.Second):
			t.Fatalf("the fast subscriber did not get change %d", i)
		}
	}
	n := 0
	for range slow { // closed after its buffer of 2
		n++
	}
	require.Equal(t, 2, n)
	delivered, dropped := h.Stats()
	require.Equal(t, int64(1), dropped)
	require.Equal(t, int64(7), delivered)
	require.Equal(t, 1, h.Subscribers())
}

func TestHubReleasesOnCancelAndCapsKeys(t *testing.T) {
	h := NewHub(HubConfig{MaxSubscriptionsPerKey: 2})
	ctx, cancel := context.WithCancel(context.Background())
	_, err := h.subscribe(ctx, "k", "org-a", "", subWork, nil)
	require.NoError(t, err)
	ch, err := h.subscribe(ctx, "k", "org-a", "", subDenied, nil)
	require.NoError(t, err)
	_, err = h.subscribe(ctx, "k", "org-a", "", subWork, nil)
	require.ErrorIs(t, err, ErrTooManySubscriptions)
	_, err = h.subscribe(ctx, "other", "org-a", "", subWork, nil)
	require.NoError(t, err, "the cap is per key")
	out := forward(ctx, ch, func(c *change) *model.PolicyDenial { return c.denial })
	cancel()
	select {
	case _, ok := <-out:
		require.False(t, ok)
	case <-time.After(2 * time.Second):
		t.Fatal("forward did not end with its context")
	}
	require.Eventually(t, func() bool { return h.Subscribers() == 0 }, 2*time.Second, 5*time.Millisecond)
	_, err = h.subscribe(context.Background(), "k", "org-a", "", subWork, nil)
	require.NoError(t, err, "the key's subscriptions were released")
}

func TestHubIgnoresWhatItCannotRead(t *testing.T) {
	h := NewHub(HubConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := h.subscribe(ctx, "k", "org-a", "", subWork, nil)
	require.NoError(t, err)
	now := time.Now()
	for _, ev := range []*schema.Event{
		{ID: "x1", Type: schema.TypeTaskUpdated, OrgID: "org-a", Time: now, Data: json.RawMessage(`{bad`)},
		{ID: "x2", Type: schema.TypeTaskUpdated, OrgID: "org-a", Time: now, Data: json.RawMessage(`{}`)},
		{ID: "x3", Type: schema.TypeAttention, OrgID: "org-a", Time: now, Data: json.RawMessage(`[]`)},
		{ID: "x4", Type: schema.TypePolicyDecided, OrgID: "org-a", Time: now, Data: json.RawMessage(`{"allow":false,"reasons":"no"}`)},
		{ID: "x5", Type: schema.TypeTaskUpdated, Time: now, Data: json.RawMessage(`{"task_id":"t","status":"in_progress"}`)}, // no org
	} {
		h.Publish(ev)
	}
	quiet(t, ch)
}

func taskOf(id, room, assignee, status string, last time.Time) work.Task {
	return work.Task{ID: id, RoomID: room, AssigneeID: assignee, Status: status, UpdatedAt: last, LastActivity: last}
}

func TestHubIsReplaySafeAndQuietOnReplay(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	h := NewHub(HubConfig{StuckAfter: time.Minute, Now: clk.now})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work, err := h.subscribe(ctx, "k", "org-a", "", subWork, nil)
	require.NoError(t, err)
	start := liveEvent("s", schema.TypeTaskUpdated, clk.now(), "org-a", "r1", "u1", schema.ActorUser, schema.TaskData{TaskID: "t1", Status: "in_progress", Assignee: "a1"})
	done := liveEvent("d", schema.TypeTaskUpdated, clk.now().Add(time.Second), "org-a", "r1", "u1", schema.ActorUser, schema.TaskData{TaskID: "t1", Status: "done", Assignee: "a1"})
	h.Publish(start)
	h.Publish(done)
	next(t, work)
	next(t, work)
	h.Publish(start) // Kafka redelivers the older event: ignored
	quiet(t, work)
	clk.add(time.Hour)
	h.checkStuck()
	quiet(t, work) // t1 is done; the replay did not bring it back

	ask := liveEvent("q", schema.TypeAttention, clk.now(), "org-a", "r1", "a1", schema.ActorAgent, schema.MessageData{Content: "?"})
	h.Publish(ask)
	next(t, work)
	h.Publish(ask)
	quiet(t, work) // the same request once

	// Replay (catch-up at start) updates state and tells nobody.
	h.Replay(liveEvent("s2", schema.TypeTaskUpdated, clk.now(), "org-a", "r1", "u1", schema.ActorUser, schema.TaskData{TaskID: "t2", Status: "in_progress", Assignee: "a2"}))
	quiet(t, work)
	clk.add(2 * time.Minute)
	h.checkStuck()
	require.Equal(t, "t2", next(t, work).work.Task.ID, "a replayed task is followed")

	// A huge question is kept cut.
	big := liveEvent("big", schema.TypeAttention, clk.now(), "org-a", "r1", "a1", schema.ActorAgent, schema.MessageData{Content: strings.Repeat("x", 900_000)})
	h.Publish(big)
	require.Len(t, next(t, work).work.Attention.Question, 1000, "work.MaxQuestion")
}

func TestHubBudgetsArePerOrganization(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	h := NewHub(HubConfig{StuckAfter: time.Minute, MaxTracked: 2, Now: clk.now})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := h.subscribe(ctx, "k", "org-b", "", subWork, nil)
	require.NoError(t, err)
	for i := range 5 { // org-a fills its own budget
		h.Publish(liveEvent(fmt.Sprint("a", i), schema.TypeTaskUpdated, clk.now(), "org-a", "r", "u", schema.ActorUser,
			schema.TaskData{TaskID: fmt.Sprint("ta", i), Status: "in_progress", Assignee: "x"}))
	}
	h.Publish(liveEvent("b", schema.TypeTaskUpdated, clk.now(), "org-b", "r", "u", schema.ActorUser, schema.TaskData{TaskID: "tb", Status: "in_progress", Assignee: "x"}))
	next(t, b)
	clk.add(2 * time.Minute)
	h.checkStuck()
	c := next(t, b)
	require.Equal(t, model.WorkChangeKindTaskStuck, c.work.Kind, "org-b's task is followed whatever org-a does")
}

func TestHubEndsSubscriptionsOfRevokedKeys(t *testing.T) {
	h := NewHub(HubConfig{})
	var revoked atomic.Bool
	ch, err := h.subscribe(context.Background(), "k", "org-a", "", subWork, func() bool { return !revoked.Load() })
	require.NoError(t, err)
	h.checkKeys()
	require.Equal(t, 1, h.Subscribers())
	revoked.Store(true)
	h.checkKeys()
	_, ok := <-ch
	require.False(t, ok, "closed")
	require.Equal(t, 0, h.Subscribers())
}

func TestHubBudgetCrossings(t *testing.T) {
	h := NewHub(HubConfig{Currency: "USD"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := h.subscribe(ctx, "k", "org-a", "", subBudget, nil)
	require.NoError(t, err)
	now := time.Now().UTC()
	b := policy.Budget{Org: "org-a", Scope: policy.ScopeOrg, Period: policy.PeriodDay, Tokens: 100, Hard: true, UpdatedAt: now}
	b.Normalize()
	crossing := func(id, org, source string, b policy.Budget) *schema.Event {
		data, _ := json.Marshal(policy.Crossing{Budget: b, Threshold: 80, PeriodStart: policy.PeriodStart(policy.PeriodDay, now), SpentTokens: 81, At: now})
		return &schema.Event{ID: id, Type: schema.TypeBudgetCrossed, OrgID: org, Time: now, Source: source, Data: data}
	}
	other := b
	other.Org = "org-b"
	h.Publish(crossing("forged", "org-a", "router", b))              // not bandplane's own: ignored
	h.Publish(crossing("mixed", "org-a", "bandplane-policy", other)) // another organization's budget: ignored
	h.Publish(&schema.Event{ID: "bad", Type: schema.TypeBudgetCrossed, OrgID: "org-a", Time: now, Source: "bandplane-policy", Data: json.RawMessage(`{bad`)})
	h.Publish(crossing("x1", "org-a", "bandplane-policy", b))
	out := forward(ctx, ch, func(c *change) *model.BudgetCrossing { return c.budget })
	select {
	case x := <-out:
		require.Equal(t, "x1", x.EventID)
		require.Equal(t, 80, x.Threshold)
		require.Equal(t, b.ID, x.Budget.ID)
		require.Equal(t, int64(81), x.Budget.SpentTokens)
		require.Equal(t, "USD", x.Budget.Currency)
		require.Equal(t, int64(19), *x.Budget.RemainingTokens)
	case <-time.After(2 * time.Second):
		t.Fatal("no crossing delivered")
	}
	// Publish counts what it hands to a subscriber before it returns: the four
	// crossings above gave the one subscriber one change.
	delivered, dropped := h.Stats()
	require.Equal(t, int64(1), delivered, "a second crossing")
	require.Zero(t, dropped)
}

// A send_message denied by the loop guard, bandplane's own decision, stops its agent
// in its room on the board (AGENT_STOPPED, with the policy's reason); a deny for
// another reason, or a decision from any other source, stops nothing.
func TestHubLoopStops(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	h := NewHub(HubConfig{Now: clk.now, Handles: fakeHandles{"org-a/a1": "lead/coder"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	board, err := h.subscribe(ctx, "k", "org-a", "r1", subWork, nil)
	require.NoError(t, err)
	other, err := h.subscribe(ctx, "k2", "org-b", "", subWork, nil)
	require.NoError(t, err)
	require.Equal(t, policy.CodeLoop, work.StopLoop, "the board's stop is the policy's code")

	decided := func(id, source, code string) *schema.Event {
		ev := liveEvent(id, schema.TypePolicyDecided, clk.now(), "org-a", "r1", "a1", schema.ActorAgent, map[string]any{
			"decision": "send_message", "allow": false, "reasons": []map[string]string{{"code": code, "message": code + ": past max_handoffs 6"}}})
		ev.Source = source
		return ev
	}
	h.Publish(decided("d1", schema.SourceBandplane+"/policy", policy.CodeLoop))
	c := next(t, board)
	require.NotNil(t, c.work)
	assert.Equal(t, model.WorkChangeKindAgentStopped, c.work.Kind)
	assert.Equal(t, [4]string{"r1", "a1", "lead/coder", "loop"}, [4]string{c.work.RoomID, *c.work.AgentID, *c.work.AgentHandle, *c.work.Stopped})
	assert.Equal(t, "loop: past max_handoffs 6", *c.work.StopReason)
	quiet(t, other)

	h.Publish(decided("d2", schema.SourceBandplane+"/policy", policy.CodeRateLimited))
	h.Publish(decided("d3", "platform", policy.CodeLoop))
	quiet(t, board)
}
