package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

const workSub = `subscription($room: ID) {
  workStatusChanged(roomId: $room) { kind roomId eventId task { id status stuck assigneeHandle } attention { id addressedTo } agentId }
}`

type workChange struct {
	WorkStatusChanged struct {
		Kind    string
		RoomID  string
		EventID *string
		Task    *struct {
			ID, Status, AssigneeHandle string
			Stuck                      bool
		}
		Attention *struct{ ID, AddressedTo string }
		AgentID   *string
	}
}

// liveSubscriptions is the bandplane_live_subscriptions gauge of srv (operator: a
// platform operator's key), the subscriptions its hub holds, or -1 when unreadable.
func liveSubscriptions(t *testing.T, srv *server, operator string) int {
	t.Helper()
	code, body := srv.do(http.MethodGet, "/metrics", operator, "", nil)
	if code != http.StatusOK {
		return -1
	}
	for l := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, "bandplane_live_subscriptions "); ok {
			if n, err := strconv.ParseFloat(v, 64); err == nil {
				return int(n)
			}
		}
	}
	return -1
}

// waitSubscribed waits until srv's hub holds n subscriptions: a subscription sent over
// WebSocket is registered, and sees the events produced from then on.
func waitSubscribed(t *testing.T, srv *server, operator string, n int) {
	t.Helper()
	require.True(t, stacktest.Eventually(t, 30*time.Second, 20*time.Millisecond, func() bool { return liveSubscriptions(t, srv, operator) == n }),
		"the hub holds %d subscriptions, want %d", liveSubscriptions(t, srv, operator), n)
}

func nextChange(t *testing.T, ch <-chan wsclient.Message, within time.Duration) workChange {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "subscription ended")
		require.NoError(t, m.Err)
		require.Empty(t, m.Errors)
		var c workChange
		require.NoError(t, json.Unmarshal(m.Data, &c), "%s", m.Data)
		return c
	case <-time.After(within):
		t.Fatalf("no change within %s", within)
		return workChange{}
	}
}

// TestIntegrationLiveWorkStatus subscribes over WebSocket (coder/websocket) to a real
// serve and produces events to Kafka: the changes arrive in order, a stuck transition
// arrives with no new event, another organization's events never arrive, and a
// disconnect leaves no goroutine behind.
func TestIntegrationLiveWorkStatus(t *testing.T) {
	s := newStack(t)
	viewer := s.key(t, "live-viewer", "org-acme", keys.RoleViewer)
	otherViewer := s.key(t, "live-other", "org-other", keys.RoleViewer)
	operator := s.key(t, "live-operator", keys.PlatformOrg, keys.RoleOperator)
	srv := s.serve(t, "--stuck-after", "2s")
	wsURL := "ws" + strings.TrimPrefix(srv.url, "http") + "/graphql"

	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: s.topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	room := "room-live-" + tag
	n := 0
	event := func(org, typ string, actor schema.Party, subject *schema.Party, data any) schema.Event {
		n++
		b, err := json.Marshal(data)
		require.NoError(t, err)
		e := schema.Event{ID: fmt.Sprintf("live-%s-%d", tag, n), Type: typ, Time: time.Now().UTC(), OrgID: org, Actor: actor, Subject: subject,
			Source: "live-test", SchemaVersion: schema.Version, Data: b}
		if !strings.HasSuffix(typ, ".registered") {
			e.RoomID = room
		}
		require.NoError(t, e.Validate())
		return e
	}
	lead := schema.Party{ID: "u-live-lead", Type: schema.ActorUser, Handle: "lead"}
	coder := schema.Party{ID: "a-live-coder", Type: schema.ActorAgent, Handle: "lead/coder"}
	regs := []schema.Event{
		event("org-acme", schema.TypeUserRegistered, schema.Party{ID: "system", Type: schema.ActorSystem}, &lead, schema.UserData{Handle: "lead"}),
		event("org-acme", schema.TypeAgentRegistered, lead, &coder, map[string]any{"handle": "lead/coder", "owner_id": lead.ID}),
	}
	require.NoError(t, p.Produce(ctx, regs))
	// Stored, and so noted for the sealer: the notes' producer has started its
	// goroutines before they are counted.
	isoWaitStored(t, s, []string{regs[0].ID, regs[1].ID})

	goroutines := func() int {
		t.Helper()
		code, body := srv.do(http.MethodGet, "/metrics", operator, "", nil)
		require.Equal(t, http.StatusOK, code, "%s", body)
		sc := bufio.NewScanner(bytes.NewReader(body))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
				n, err := strconv.ParseFloat(v, 64)
				require.NoError(t, err)
				return int(n)
			}
		}
		t.Fatal("no go_goroutines in /metrics")
		return 0
	}
	before := goroutines()

	conn, err := wsclient.Dial(ctx, wsURL, viewer)
	require.NoError(t, err)
	_, changes, err := conn.Subscribe(ctx, workSub, map[string]any{"room": room}, 64)
	require.NoError(t, err)
	oconn, err := wsclient.Dial(ctx, wsURL, otherViewer)
	require.NoError(t, err)
	_, others, err := oconn.Subscribe(ctx, workSub, nil, 64)
	require.NoError(t, err)
	waitSubscribed(t, srv, operator, 2) // the subscribe frames are read before the events

	// Five task steps in one produce call: they arrive in that order.
	statuses := []string{"open", "in_progress", "blocked", "in_progress", "done"}
	var steps []schema.Event
	for _, st := range statuses {
		steps = append(steps, event("org-acme", schema.TypeTaskUpdated, lead, nil, schema.TaskData{TaskID: "t-" + tag, Title: "Ship", Status: st, Assignee: coder.ID}))
	}
	require.NoError(t, p.Produce(ctx, steps))
	for i, st := range statuses {
		c := nextChange(t, changes, 10*time.Second).WorkStatusChanged
		require.Equal(t, "TASK", c.Kind, "change %d", i)
		require.Equal(t, st, c.Task.Status, "change %d in order", i)
		require.Equal(t, steps[i].ID, *c.EventID)
		require.Equal(t, "lead/coder", c.Task.AssigneeHandle, "named from serve's directory")
	}

	// A task in progress, then silence: the stuck transition comes from the timer.
	require.NoError(t, p.Produce(ctx, []schema.Event{event("org-acme", schema.TypeTaskUpdated, lead, nil,
		schema.TaskData{TaskID: "t2-" + tag, Title: "Review", Status: "in_progress", Assignee: coder.ID})}))
	c := nextChange(t, changes, 10*time.Second).WorkStatusChanged
	require.Equal(t, "TASK", c.Kind)
	require.False(t, c.Task.Stuck)
	start := time.Now()
	c = nextChange(t, changes, 10*time.Second).WorkStatusChanged
	require.Equal(t, "TASK_STUCK", c.Kind)
	require.True(t, c.Task.Stuck)
	require.Nil(t, c.EventID, "no event caused it")
	t.Logf("stuck transition %s after the task went quiet (--stuck-after 2s)", time.Since(start).Round(time.Millisecond))

	// A request for the lead, answered by the lead.
	ask := event("org-acme", schema.TypeAttention, coder, nil, schema.MessageData{Content: "@lead merge?", Mentions: []schema.Mention{{ID: lead.ID, Handle: "lead"}}})
	require.NoError(t, p.Produce(ctx, []schema.Event{ask}))
	c = nextChange(t, changes, 10*time.Second).WorkStatusChanged
	require.Equal(t, "TASK", c.Kind, "the assignee's own event: its task is no longer stuck")
	require.False(t, c.Task.Stuck)
	require.Equal(t, ask.ID, *c.EventID)
	c = nextChange(t, changes, 10*time.Second).WorkStatusChanged
	require.Equal(t, "ATTENTION_OPENED", c.Kind)
	require.Equal(t, lead.ID, c.Attention.AddressedTo)
	require.NoError(t, p.Produce(ctx, []schema.Event{event("org-acme", schema.TypeMessageCreated, lead, nil, schema.MessageData{Content: "yes"})}))
	c = nextChange(t, changes, 10*time.Second).WorkStatusChanged
	require.Equal(t, "ATTENTION_CLOSED", c.Kind)
	require.Equal(t, ask.ID, c.Attention.ID)

	// The other organization's subscriber saw none of it: a task of its own, in the same
	// room id (the same Kafka key, so on the partition after every event above), is the
	// first change it gets.
	mine := event("org-other", schema.TypeTaskUpdated, schema.Party{ID: "u-live-other", Type: schema.ActorUser}, nil,
		schema.TaskData{TaskID: "t-other-" + tag, Title: "Theirs", Status: "open"})
	require.NoError(t, p.Produce(ctx, []schema.Event{mine}))
	c = nextChange(t, others, 10*time.Second).WorkStatusChanged
	require.NotNil(t, c.EventID, "org-other received a change of no event: %+v", c)
	require.Equal(t, mine.ID, *c.EventID, "org-other received a change of another organization's event first")

	// Aiming at another organization fails at once.
	_, denied, err := conn.Subscribe(ctx, `subscription { workStatusChanged(orgId: "org-other") { kind } }`, nil, 1)
	require.NoError(t, err)
	m := <-denied // gqlgen answers a failed subscribe with a "next" of errors, then "complete"
	require.NotEmpty(t, m.Errors, "%+v", m)
	require.Equal(t, "null", strings.TrimSpace(string(m.Data)), "no data")
	require.Equal(t, "FORBIDDEN", m.Errors[0].Code())

	// Disconnect: everything the subscriptions held is released.
	require.NoError(t, conn.Close())
	require.NoError(t, oconn.Close())
	deadline := time.Now().Add(10 * time.Second)
	for {
		after := goroutines()
		if after <= before+2 { // the metrics scrape itself, a kept-alive HTTP connection
			t.Logf("goroutines: %d before subscribing, %d after disconnecting", before, after)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d before subscribing, still %d 10 s after disconnecting", before, after)
		}
		time.Sleep(200 * time.Millisecond)
	}
	srv.alive()
}

// TestIntegrationLiveReplaysWhatIngestHasNotStored: a task put in progress while no
// serve ran, and not in ClickHouse (the second serve ingests nothing), is still
// followed: the live reader replays it from the ingest group's committed offset, and
// the timer makes it stuck.
func TestIntegrationLiveReplaysWhatIngestHasNotStored(t *testing.T) {
	s := newStack(t)
	viewer := s.key(t, "replay-viewer", "org-acme", keys.RoleViewer)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: s.topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	lead := schema.Party{ID: "u-replay-lead", Type: schema.ActorUser, Handle: "lead"}
	ev := func(id, typ string, actor schema.Party, subject *schema.Party, room string, data any) schema.Event {
		b, _ := json.Marshal(data)
		e := schema.Event{ID: id + "-" + tag, Type: typ, Time: time.Now().UTC(), OrgID: "org-acme", RoomID: room, Actor: actor, Subject: subject,
			Source: "live-test", SchemaVersion: schema.Version, Data: b}
		require.NoError(t, e.Validate())
		return e
	}
	// A first serve ingests the directory and commits its offsets.
	require.NoError(t, p.Produce(ctx, []schema.Event{ev("reg", schema.TypeUserRegistered, schema.Party{ID: "system", Type: schema.ActorSystem}, &lead, "", schema.UserData{Handle: "lead"})}))
	first := s.serve(t)
	require.Eventually(t, func() bool {
		var n uint64
		require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM "+s.db+".directory").Scan(&n))
		return n == 1
	}, 30*time.Second, 100*time.Millisecond)
	first.stop()

	// While nothing runs: a task goes in progress.
	room := "room-replay-" + tag
	task := ev("task", schema.TypeTaskUpdated, lead, nil, room, schema.TaskData{TaskID: "t-" + tag, Title: "Ship", Status: "in_progress", Assignee: "a-nobody"})
	require.NoError(t, p.Produce(ctx, []schema.Event{task}))

	srv := s.serve(t, "--no-consumer", "--stuck-after", "3s")
	conn, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(srv.url, "http")+"/graphql", viewer)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, changes, err := conn.Subscribe(ctx, workSub, map[string]any{"room": room}, 8)
	require.NoError(t, err)
	c := nextChange(t, changes, 20*time.Second).WorkStatusChanged
	require.Equal(t, "TASK_STUCK", c.Kind, "the replayed task becomes stuck, and its replay itself told nobody")
	require.Equal(t, "t-"+tag, c.Task.ID)
	var stored uint64
	require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM "+s.db+".tasks").Scan(&stored))
	require.Zero(t, stored, "nothing ingested it: only the replay knew")
}
