package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// writesConn records each write that reaches the socket.
type writesConn struct {
	net.Conn
	writes []string
}

func (w *writesConn) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func TestCorkConnSendsWhatItHeldInOneWrite(t *testing.T) {
	under := &writesConn{}
	c := &corkConn{Conn: under}
	_, err := c.Write([]byte("a"))
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, under.writes, "uncorked, a write goes through")

	c.cork()
	for _, s := range []string{"b", "c", "d"} {
		_, err := c.Write([]byte(s))
		require.NoError(t, err)
	}
	assert.Len(t, under.writes, 1, "corked, nothing is written")
	require.NoError(t, c.uncork())
	assert.Equal(t, []string{"a", "bcd"}, under.writes)
	require.NoError(t, c.uncork(), "uncorking twice is harmless")

	// A batch over corkLimit is written in parts; a write larger than the limit goes
	// through as it is.
	under.writes = nil
	c.cork()
	big := strings.Repeat("x", corkLimit-10)
	_, _ = c.Write([]byte(big))
	_, _ = c.Write([]byte(strings.Repeat("y", 20)))
	huge := strings.Repeat("z", corkLimit+1)
	_, _ = c.Write([]byte(huge))
	require.NoError(t, c.uncork())
	assert.Equal(t, []string{big, strings.Repeat("y", 20), huge}, under.writes)
}

type oneKey struct{}

func (oneKey) Lookup(_ context.Context, token string) (keys.Key, bool) {
	return keys.Key{ID: "k-view", Org: "org-a", Role: keys.RoleViewer}, token == "tok-view"
}
func (k oneKey) Held(token string) (keys.Key, bool) { return k.Lookup(context.Background(), token) }

// A subscription waits for its share of WebSocketWritesPerSecond between writes and
// sends the changes queued meanwhile together, in order.
func TestSubscriptionWritesWaitForTheirShare(t *testing.T) {
	asked := make(chan time.Duration, 1)
	release := make(chan struct{})
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	limits := Limits{WebSocketWritesPerSecond: 4, now: func() time.Time { return start },
		sleep: func(ctx context.Context, d time.Duration) error {
			asked <- d
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
	h := NewHub(HubConfig{})
	srv := httptest.NewServer(NewHandler(nil, oneKey{}, WithHub(h), WithLimits(limits)))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), "tok-view")
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, ch, err := conn.Subscribe(ctx, `subscription { workStatusChanged { task { title } } }`, nil, 16)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.Subscribers() == 1 }, 10*time.Second, 5*time.Millisecond)

	publish := func(n int) {
		b, err := json.Marshal(schema.TaskData{TaskID: fmt.Sprintf("t%d", n), Title: fmt.Sprintf("change %d", n), Status: "open"})
		require.NoError(t, err)
		h.Publish(&schema.Event{ID: fmt.Sprintf("e%d", n), Type: schema.TypeTaskUpdated, Time: start.Add(time.Duration(n) * time.Second),
			OrgID: "org-a", RoomID: "r1", Actor: schema.Party{ID: "u1", Type: schema.ActorUser}, Data: b})
	}
	title := func() string {
		select {
		case m := <-ch:
			require.NoError(t, m.Err)
			require.Empty(t, m.Errors)
			return string(m.Data)
		case <-ctx.Done():
			t.Fatal("no change")
			return ""
		}
	}
	publish(0)
	assert.Contains(t, title(), "change 0", "the first write waits for nothing")
	publish(1)
	// One subscription of 4 writes a second: a quarter of a second after the last.
	assert.Equal(t, 250*time.Millisecond, <-asked)
	publish(2)
	publish(3)
	select {
	case m := <-ch:
		t.Fatalf("a change written while its subscription waits: %s", m.Data)
	default:
	}
	close(release)
	for n := 1; n <= 3; n++ {
		assert.Contains(t, title(), fmt.Sprintf("change %d", n))
	}
}
