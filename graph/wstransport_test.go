package graph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// liveKeys are two viewers of org-a (one render group between them), a compliance
// officer of org-a (another role) and a viewer of org-b.
var liveKeys = fakeKeys{
	"tok-a-view-1": {ID: "k-a-view-1", Org: "org-a", Role: keys.RoleViewer},
	"tok-a-view-2": {ID: "k-a-view-2", Org: "org-a", Role: keys.RoleViewer},
	"tok-a-comp":   {ID: "k-a-comp", Org: "org-a", Role: keys.RoleCompliance},
	"tok-b-view":   {ID: "k-b-view", Org: "org-b", Role: keys.RoleViewer},
}

const liveWork = `subscription($room: ID) { workStatusChanged(roomId: $room) { kind roomId eventId task { id title status } } }`

func liveServer(t *testing.T, cfg graph.HubConfig, limits graph.Limits) (*httptest.Server, *graph.Hub) {
	t.Helper()
	h := graph.NewHub(cfg)
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, liveKeys, graph.WithHub(h), graph.WithLimits(limits)))
	t.Cleanup(srv.Close)
	return srv, h
}

func taskEvent(t *testing.T, n int, org, room, title string) *schema.Event {
	t.Helper()
	b, err := json.Marshal(schema.TaskData{TaskID: fmt.Sprintf("t%d", n%3), Title: title, Status: "open"})
	require.NoError(t, err)
	return &schema.Event{ID: fmt.Sprintf("e-%s-%d", org, n), Type: schema.TypeTaskUpdated, Time: time.Date(2026, 1, 1, 10, 0, n, 0, time.UTC),
		OrgID: org, RoomID: room, Actor: schema.Party{ID: "u1", Type: schema.ActorUser}, Data: b}
}

type liveSub struct {
	name string
	ch   <-chan wsclient.Message
}

func subscribeLive(t *testing.T, ctx context.Context, srv *httptest.Server, token string, vars map[string]any, n int) []liveSub {
	t.Helper()
	conn, err := wsclient.Dial(ctx, wsURL(srv), token)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	var out []liveSub
	for i := range n {
		_, ch, err := conn.Subscribe(ctx, liveWork, vars, 64)
		require.NoError(t, err)
		out = append(out, liveSub{name: fmt.Sprintf("%s/%v/%d", token, vars, i), ch: ch})
	}
	return out
}

func nextData(t *testing.T, s liveSub) string {
	t.Helper()
	select {
	case m, ok := <-s.ch:
		require.True(t, ok, "%s ended", s.name)
		require.NoError(t, m.Err, s.name)
		require.Empty(t, m.Errors, s.name)
		return string(m.Data)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no change within 10 s", s.name)
		return ""
	}
}

// Subscribers of one operation, variables, organization and role share one render of
// each change, over any number of connections and keys; each other combination is a
// group of its own, and sees only what it asked for.
func TestLiveRendersEachChangeOncePerGroup(t *testing.T) {
	srv, h := liveServer(t, graph.HubConfig{}, graph.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var shared []liveSub
	for range 3 {
		shared = append(shared, subscribeLive(t, ctx, srv, "tok-a-view-1", nil, 4)...)
	}
	shared = append(shared, subscribeLive(t, ctx, srv, "tok-a-view-2", nil, 4)...)      // another key, same role
	room := subscribeLive(t, ctx, srv, "tok-a-view-1", map[string]any{"room": "r2"}, 2) // other variables
	comp := subscribeLive(t, ctx, srv, "tok-a-comp", nil, 2)                            // another role
	other := subscribeLive(t, ctx, srv, "tok-b-view", nil, 2)                           // another organization
	require.Eventually(t, func() bool { return h.Subscribers() == 22 }, 10*time.Second, 5*time.Millisecond)

	const changes = 10
	for n := range changes {
		h.Publish(taskEvent(t, n, "org-a", "r1", fmt.Sprintf("change %d", n)))
	}
	h.Publish(taskEvent(t, changes, "org-a", "r2", "in r2"))
	h.Publish(taskEvent(t, changes+1, "org-b", "r1", "b's"))

	for n := range changes {
		want := nextData(t, shared[0])
		assert.Contains(t, want, fmt.Sprintf(`"title":"change %d"`, n))
		for _, s := range shared[1:] {
			assert.Equal(t, want, nextData(t, s), "%s: the same bytes as every subscriber of its group", s.name)
		}
		for _, s := range comp {
			assert.Equal(t, want, nextData(t, s), "%s: another group, rendered alike", s.name)
		}
	}
	for _, s := range append(append(shared, comp...), room...) {
		assert.Contains(t, nextData(t, s), `"title":"in r2"`, s.name)
	}
	for _, s := range other {
		got := nextData(t, s)
		assert.Contains(t, got, `"title":"b's"`, s.name)
		assert.NotContains(t, got, "change", "org-b sees nothing of org-a")
	}
	// 11 changes for the shared group and for the compliance group, 1 for the room
	// group, 1 for org-b: 24 renders for the 202 messages of 22 subscribers.
	assert.Equal(t, int64(2*(changes+1)+1+1), h.Renders())
	delivered, dropped := h.Stats()
	assert.Equal(t, int64(16*(changes+1)+2*(changes+1)+2+2), delivered)
	assert.Zero(t, dropped)
}

// A subscriber whose peer stops reading is dropped with SLOW_SUBSCRIBER once its
// queue is full; the others go on receiving every change.
func TestLiveSlowSubscriberDelaysNobody(t *testing.T) {
	srv, h := liveServer(t, graph.HubConfig{Buffer: 4}, graph.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The slow peer subscribes by hand and never reads again.
	slow, resp, err := websocket.Dial(ctx, wsURL(srv), &websocket.DialOptions{Subprotocols: []string{wsclient.Protocol}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer func() { _ = slow.CloseNow() }()
	require.NoError(t, wsjson.Write(ctx, slow, map[string]any{"type": "connection_init", "payload": map[string]string{"Authorization": "Bearer tok-a-view-1"}}))
	var ack map[string]any
	require.NoError(t, wsjson.Read(ctx, slow, &ack))
	require.NoError(t, wsjson.Write(ctx, slow, map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{"query": liveWork}}))

	fast := subscribeLive(t, ctx, srv, "tok-a-view-2", nil, 1)[0]
	require.Eventually(t, func() bool { return h.Subscribers() == 2 }, 10*time.Second, 5*time.Millisecond)

	// Changes of about 64 KiB each, until the slow peer's socket buffers are full and
	// its queue overflows; the fast subscriber reads each before the next.
	title := strings.Repeat("x", 64<<10)
	for n := 0; ; n++ {
		require.Less(t, n, 10_000, "the slow subscriber was never dropped")
		h.Publish(taskEvent(t, n, "org-a", "r1", fmt.Sprintf("%d %s", n, title)))
		assert.Contains(t, nextData(t, fast), fmt.Sprintf(`"title":"%d x`, n))
		if _, dropped := h.Stats(); dropped == 1 {
			break
		}
	}
	require.Eventually(t, func() bool { return h.Subscribers() == 1 }, 10*time.Second, 5*time.Millisecond, "the slow one is gone, the fast one stays")
	h.Publish(taskEvent(t, 1_000_000, "org-a", "r1", "after"))
	assert.Contains(t, nextData(t, fast), `"title":"after"`)
}

// raw opens a connection of protocol proto and sends connection_init with token.
func raw(t *testing.T, ctx context.Context, srv *httptest.Server, proto, token string) *websocket.Conn {
	t.Helper()
	c, resp, err := websocket.Dial(ctx, wsURL(srv), &websocket.DialOptions{Subprotocols: []string{proto}})
	require.NoError(t, err)
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	if token != "" {
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"type": "connection_init", "payload": map[string]string{"Authorization": "Bearer " + token}}))
	}
	return c
}

func readFrame(t *testing.T, ctx context.Context, c *websocket.Conn) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, wsjson.Read(ctx, c, &m))
	return m
}

// closeCode reads until the connection closes and returns its close code.
func closeCode(t *testing.T, ctx context.Context, c *websocket.Conn) websocket.StatusCode {
	t.Helper()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

func TestLiveProtocol(t *testing.T) {
	// A server for each part: a connection another part closes leaves its hub a moment
	// later, and each part counts its hub's subscriptions.
	fresh := func(t *testing.T) (*httptest.Server, *graph.Hub) {
		return liveServer(t, graph.HubConfig{}, graph.Limits{MaxOperationsPerWebSocket: 2})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("ping, a query, a subscription completed by the client", func(t *testing.T) {
		srv, h := fresh(t)
		c := raw(t, ctx, srv, "graphql-transport-ws", "tok-a-view-1")
		assert.Equal(t, `"connection_ack"`, string(readFrame(t, ctx, c)["type"]))
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"type": "ping"}))
		assert.Equal(t, `"pong"`, string(readFrame(t, ctx, c)["type"]))
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "q", "type": "subscribe", "payload": map[string]any{"query": "{ __typename }"}}))
		m := readFrame(t, ctx, c)
		assert.Equal(t, `"next"`, string(m["type"]))
		assert.JSONEq(t, `{"data":{"__typename":"Query"}}`, string(m["payload"]))
		assert.Equal(t, `"complete"`, string(readFrame(t, ctx, c)["type"]))

		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "s", "type": "subscribe", "payload": map[string]any{"query": liveWork}}))
		require.Eventually(t, func() bool { return h.Subscribers() == 1 }, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "s", "type": "complete"}))
		require.Eventually(t, func() bool { return h.Subscribers() == 0 }, 10*time.Second, 5*time.Millisecond, "complete ends it in the hub")
	})
	t.Run("operations past the connection's bound are refused", func(t *testing.T) {
		srv, h := fresh(t)
		c := raw(t, ctx, srv, "graphql-transport-ws", "tok-a-view-1")
		readFrame(t, ctx, c)
		for _, id := range []string{"1", "2"} {
			require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": id, "type": "subscribe", "payload": map[string]any{"query": liveWork}}))
		}
		require.Eventually(t, func() bool { return h.Subscribers() == 2 }, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "3", "type": "subscribe", "payload": map[string]any{"query": liveWork}}))
		m := readFrame(t, ctx, c)
		assert.Equal(t, `"error"`, string(m["type"]))
		assert.Equal(t, `"3"`, string(m["id"]))
		assert.Contains(t, string(m["payload"]), "TOO_MANY_REQUESTS")
		assert.Contains(t, string(m["payload"]), "--graphql-max-operations-per-websocket")
	})
	t.Run("graphql-ws: start, data, stop, keep-alive", func(t *testing.T) {
		srv, h := fresh(t)
		c := raw(t, ctx, srv, "graphql-ws", "tok-a-view-1")
		assert.Equal(t, `"connection_ack"`, string(readFrame(t, ctx, c)["type"]))
		assert.Equal(t, `"ka"`, string(readFrame(t, ctx, c)["type"]))
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "1", "type": "start", "payload": map[string]any{"query": liveWork}}))
		require.Eventually(t, func() bool { return h.Subscribers() == 1 }, 10*time.Second, 5*time.Millisecond)
		h.Publish(taskEvent(t, 1, "org-a", "r1", "legacy"))
		m := readFrame(t, ctx, c)
		assert.Equal(t, `"data"`, string(m["type"]))
		assert.Contains(t, string(m["payload"]), `"title":"legacy"`)
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "1", "type": "stop"}))
		require.Eventually(t, func() bool { return h.Subscribers() == 0 }, 10*time.Second, 5*time.Millisecond)
	})
	t.Run("a subscription the key may not open", func(t *testing.T) {
		srv, _ := fresh(t)
		c := raw(t, ctx, srv, "graphql-transport-ws", "tok-a-view-1")
		readFrame(t, ctx, c)
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "d", "type": "subscribe",
			"payload": map[string]any{"query": `subscription { policyDenied { decision { id } } }`}}))
		var got []string
		for {
			m := readFrame(t, ctx, c)
			got = append(got, string(m["type"])+" "+string(m["payload"]))
			if string(m["type"]) != `"next"` {
				break
			}
		}
		assert.Contains(t, strings.Join(got, "\n"), "FORBIDDEN", "%s", got)
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"type": "ping"}))
		assert.Equal(t, `"pong"`, string(readFrame(t, ctx, c)["type"]), "the connection stays")
	})
	t.Run("a subscription over HTTP is refused", func(t *testing.T) {
		_, h := fresh(t)
		_, errs := post(t, graph.NewHandler(&fakeQuerier{}, liveKeys, graph.WithHub(h)), gqlBody(liveWork), bearerOf("tok-a-view-1"))
		require.NotEmpty(t, errs)
	})
}

// Hostile connections end with the code that says what was wrong, and take nothing
// from the others.
func TestLiveProtocolRefusals(t *testing.T) {
	srv, _ := liveServer(t, graph.HubConfig{}, graph.Limits{InitTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := func(id string) map[string]any {
		return map[string]any{"id": id, "type": "subscribe", "payload": map[string]any{"query": liveWork}}
	}
	for name, c := range map[string]struct {
		token string
		send  []any
		code  websocket.StatusCode
	}{
		"no init in time":         {code: 4408},
		"a subscribe before init": {send: []any{sub("1")}, code: 4401},
		"a ping, then no init":    {send: []any{map[string]any{"type": "ping"}}, code: 4408},
		"an unknown key":          {token: "tok-nope", code: 4401},
		"a second init":           {token: "tok-a-view-1", send: []any{map[string]any{"type": "connection_init"}}, code: 4429},
		"a duplicate id":          {token: "tok-a-view-1", send: []any{sub("1"), sub("1")}, code: 4409},
		"an empty id":             {token: "tok-a-view-1", send: []any{sub("")}, code: 4400},
		"an id of 257 bytes":      {token: "tok-a-view-1", send: []any{sub(strings.Repeat("i", 257))}, code: 4400},
		"an unknown type":         {token: "tok-a-view-1", send: []any{map[string]any{"type": "data"}}, code: 4400},
		"not JSON":                {token: "tok-a-view-1", send: []any{"{"}, code: 4400},
		"a message over 1 MiB":    {token: "tok-a-view-1", send: []any{strings.Repeat("x", 1<<20+1)}, code: websocket.StatusMessageTooBig},
	} {
		t.Run(name, func(t *testing.T) {
			conn := raw(t, ctx, srv, "graphql-transport-ws", c.token)
			for _, m := range c.send {
				if s, ok := m.(string); ok {
					_ = conn.Write(ctx, websocket.MessageText, []byte(s))
					continue
				}
				_ = wsjson.Write(ctx, conn, m)
			}
			assert.Equal(t, c.code, closeCode(t, ctx, conn))
		})
	}
	// A bad subscribe payload is that operation's error; the connection stays.
	conn := raw(t, ctx, srv, "graphql-transport-ws", "tok-a-view-1")
	readFrame(t, ctx, conn)
	require.NoError(t, wsjson.Write(ctx, conn, map[string]any{"id": "1", "type": "subscribe", "payload": "not an object"}))
	m := readFrame(t, ctx, conn)
	assert.Equal(t, `"error"`, string(m["type"]))
	require.NoError(t, wsjson.Write(ctx, conn, map[string]any{"id": "2", "type": "subscribe", "payload": map[string]any{"query": "subscription { nope }"}}))
	m = readFrame(t, ctx, conn)
	assert.Equal(t, `"error"`, string(m["type"]), "a query that does not validate")
	assert.Contains(t, string(m["payload"]), "nope")
	require.NoError(t, wsjson.Write(ctx, conn, map[string]any{"type": "ping"}))
	assert.Equal(t, `"pong"`, string(readFrame(t, ctx, conn)["type"]))
}

// Subscribing and completing again and again leaves nothing behind: every render group
// ends with its last subscriber, and an id is free again once its operation is over.
func TestLiveChurnLeavesNothingBehind(t *testing.T) {
	srv, h := liveServer(t, graph.HubConfig{}, graph.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := raw(t, ctx, srv, "graphql-transport-ws", "tok-a-view-1")
	readFrame(t, ctx, c)
	// Warm up: the first connection's goroutines are counted in the baseline.
	require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "w", "type": "subscribe", "payload": map[string]any{"query": liveWork}}))
	require.Eventually(t, func() bool { return h.Subscribers() == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "w", "type": "complete"}))
	require.Eventually(t, func() bool { return h.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
	base := runtime.NumGoroutine()

	for i := range 200 {
		// Each cycle its own variables: a render group of its own.
		vars := map[string]any{"room": fmt.Sprintf("r%d", i)}
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "s", "type": "subscribe", "payload": map[string]any{"query": liveWork, "variables": vars}}))
		require.Eventually(t, func() bool { return h.Subscribers() == 1 }, 10*time.Second, time.Millisecond)
		h.Publish(taskEvent(t, i, "org-a", fmt.Sprintf("r%d", i), "churn"))
		m := readFrame(t, ctx, c)
		require.Equal(t, `"next"`, string(m["type"]), "%s", m["payload"])
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "s", "type": "complete"}))
		require.Eventually(t, func() bool { return h.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
		// A query reusing one id right after it completed.
		require.NoError(t, wsjson.Write(ctx, c, map[string]any{"id": "q", "type": "subscribe", "payload": map[string]any{"query": "{ __typename }"}}))
		assert.Equal(t, `"next"`, string(readFrame(t, ctx, c)["type"]))
		assert.Equal(t, `"complete"`, string(readFrame(t, ctx, c)["type"]))
	}
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= base+5 }, 10*time.Second, 10*time.Millisecond,
		"goroutines: %d at the start, %d after 200 subscriptions came and went", base, runtime.NumGoroutine())
}
