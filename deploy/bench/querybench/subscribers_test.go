package querybench

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeGraphQL speaks just enough graphql-transport-ws for RunSubscribers: it answers
// the first refuse upgrades 503, checks the token, acknowledges, and holds each
// subscription for the test to send to.
type fakeGraphQL struct {
	t       *testing.T
	refuse  int32
	upgrade atomic.Int32
	mu      sync.Mutex
	conns   []*websocket.Conn
	subbed  chan struct{} // a value per subscription held
	done    sync.WaitGroup
}

func (f *fakeGraphQL) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.upgrade.Add(1) <= f.refuse {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "too many WebSocket upgrades from this address", http.StatusServiceUnavailable)
		return
	}
	f.done.Add(1)
	defer f.done.Done()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return
	}
	ctx := context.Background()
	var init struct {
		Type    string
		Payload map[string]string
	}
	if wsjson.Read(ctx, c, &init) != nil || init.Type != "connection_init" || init.Payload["Authorization"] != "Bearer tok" {
		_ = c.Close(4401, "bad init")
		return
	}
	_ = wsjson.Write(ctx, c, map[string]string{"type": "connection_ack"})
	var sub struct {
		ID      string
		Type    string
		Payload struct {
			Variables map[string]string
		}
	}
	if wsjson.Read(ctx, c, &sub) != nil || sub.Type != "subscribe" || sub.ID != "1" || sub.Payload.Variables["org"] != "org-a" {
		_ = c.Close(websocket.StatusPolicyViolation, "bad subscribe")
		return
	}
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	f.subbed <- struct{}{}
	for { // until the client closes (reading answers its close frame)
		var m json.RawMessage
		if wsjson.Read(ctx, c, &m) != nil {
			return
		}
	}
}

func (f *fakeGraphQL) send(c *websocket.Conn, frame string) {
	require.NoError(f.t, c.Write(context.Background(), websocket.MessageText, []byte(frame)))
}

// TestRunSubscribers runs the subscribers' process in this one against the fake: it
// retries refused upgrades, reports ready once all are subscribed, a record per change
// read and one per subscription ended, and ends cleanly when its stdin closes.
func TestRunSubscribers(t *testing.T) {
	const n = 12
	fake := &fakeGraphQL{t: t, refuse: 3, subbed: make(chan struct{}, n)}
	srv := httptest.NewServer(fake)
	defer srv.Close()

	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	var stderr strings.Builder
	done := make(chan error, 1)
	go func() {
		err := RunSubscribers(context.Background(), stdinR, stdoutW, &stderr)
		_ = stdoutW.Close()
		done <- err
	}()
	spec, err := json.Marshal(SubscriberSpec{URL: "ws" + strings.TrimPrefix(srv.URL, "http"), Token: "tok", Org: "org-a",
		Subscribers: n, Dials: 4, Buffer: 4})
	require.NoError(t, err)
	_, err = stdinW.Write(append(spec, '\n'))
	require.NoError(t, err)

	out := bufio.NewReader(stdoutR)
	next := func() record {
		var b [recordSize]byte
		_, err := io.ReadFull(out, b[:])
		require.NoError(t, err)
		r, err := decodeRecord(&b)
		require.NoError(t, err)
		return r
	}
	ready := next()
	require.Equal(t, recReady, ready.kind)
	assert.Equal(t, n, ready.sub)
	for range n {
		<-fake.subbed // the server reads a subscribe after the client has written it
	}
	fake.mu.Lock()
	conns := fake.conns
	fake.mu.Unlock()
	require.Len(t, conns, n)

	// The first is dropped as slow; the others get two changes, and a message of no
	// benchmark change, which is not reported.
	fake.send(conns[0], `{"id":"1","type":"error","payload":[{"message":"too slow","extensions":{"code":"SLOW_SUBSCRIBER"}}]}`)
	for _, c := range conns[1:] {
		for _, title := range []string{titlePrefix + "0 1764600000000000000", "Fix the retry tests", titlePrefix + "1 1764600000050000000"} {
			fake.send(c, `{"id":"1","type":"next","payload":{"data":{"workStatusChanged":{"kind":"TASK","task":{"id":"t","title":"`+title+`","status":"in_progress"}}}}}`)
		}
	}
	read := map[int][]uint32{}
	var ended []record
	for range 2*(n-1) + 1 {
		r := next()
		switch r.kind {
		case recMessage:
			read[r.sub] = append(read[r.sub], r.val)
			assert.Positive(t, r.at)
		case recEnded:
			ended = append(ended, r)
		default:
			t.Fatalf("unexpected record %+v", r)
		}
	}
	require.Len(t, ended, 1)
	assert.Equal(t, uint32(endSlow), ended[0].val)
	assert.Len(t, read, n-1)
	assert.NotContains(t, read, ended[0].sub, "the slow one read nothing")
	for sub, seqs := range read {
		assert.Equal(t, []uint32{0, 1}, seqs, "subscriber %d", sub)
	}

	// Closing stdin ends the process; its own closing of the connections reports
	// nothing.
	require.NoError(t, stdinW.Close())
	rest, err := io.ReadAll(out)
	require.NoError(t, err)
	assert.Empty(t, rest)
	require.NoError(t, <-done)
	fake.done.Wait()
	assert.Contains(t, stderr.String(), "12 subscribed in ")
	assert.Contains(t, stderr.String(), "(3 upgrades retried after 503)")
}

func TestRunSubscribersRefusesBadSpecs(t *testing.T) {
	for spec, want := range map[string]string{
		"":                          "no subscriber spec on stdin",
		"{\n":                       "cannot decode the subscriber spec",
		`{"url":"http://x"}` + "\n": "url \"http://x\" is not ws:// or wss://",
		`{"url":"ws://x","subscribers":0,"dials":1,"buffer":1}` + "\n": "subscribers must be in [1, 16777216), got 0",
	} {
		err := RunSubscribers(context.Background(), strings.NewReader(spec), io.Discard, io.Discard)
		assert.ErrorContains(t, err, want, spec)
	}
}
