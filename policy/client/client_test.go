package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/client"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// fake is a scripted replica: it counts requests and answers with handle.
type fake struct {
	*httptest.Server
	hits   atomic.Int64
	auth   atomic.Value // last Authorization header
	handle func(w http.ResponseWriter, r *http.Request)
}

func newFake(t *testing.T) *fake {
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		f.auth.Store(r.Header.Get("Authorization"))
		f.handle(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func misdirect(to string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(shard.OwnerHeader, to)
		w.WriteHeader(http.StatusMisdirectedRequest)
		_, _ = fmt.Fprintf(w, `{"code":"misdirected","owner":%q,"message":"ask %s","error":"ask %s"}`, to, to, to)
	}
}

func allow(self string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if self != "" {
			w.Header().Set(shard.OwnerHeader, self)
		}
		_, _ = fmt.Fprintf(w, `{"decision_id":"d-1","decision":%q,"allow":true,"reasons":[],"policy_revision":"rev"}`, strings.TrimPrefix(r.URL.Path, "/v1/decisions/"))
	}
}

func newClient(t *testing.T, endpoint string, peers ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoint: endpoint, Peers: peers, APIKey: "bpk_router", Timeout: time.Second})
	require.NoError(t, err)
	return c
}

var msg = policy.MessageInput{Agent: "a-1", Room: "r"}

func TestFollowsTheOwnerAndRemembersIt(t *testing.T) {
	a, b := newFake(t), newFake(t)
	a.handle, b.handle = misdirect(b.URL), allow(b.URL)
	c := newClient(t, a.URL, a.URL, b.URL)
	for range 3 {
		d, err := c.Decide(t.Context(), policy.SendMessage, msg)
		require.NoError(t, err)
		assert.True(t, d.Allow)
	}
	assert.Equal(t, int64(1), a.hits.Load(), "one 421, then straight to the owner")
	assert.Equal(t, int64(3), b.hits.Load())
	assert.Equal(t, "Bearer bpk_router", b.auth.Load())
	owner, ok := c.Owner("a-1")
	assert.True(t, ok)
	assert.Equal(t, b.URL, owner)

	// Stateless decisions go to the endpoint, whatever the agent.
	a.handle = allow("")
	_, err := c.Decide(t.Context(), policy.PeerVisible, policy.PeerInput{Agent: "a-1"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.hits.Load())

	// The owner moves (a new peer list): the old owner's 421 is followed and learnt.
	b.handle = misdirect(a.URL)
	_, err = c.Decide(t.Context(), policy.SendMessage, json.RawMessage(`{"agent":"a-1","room":"r"}`))
	require.NoError(t, err)
	owner, _ = c.Owner("a-1")
	assert.Equal(t, a.URL, owner)
}

func TestAReplyFromTheOwnerPinsTheAgent(t *testing.T) {
	a, b := newFake(t), newFake(t)
	a.handle, b.handle = allow(a.URL), allow(b.URL)
	c := newClient(t, b.URL, a.URL, b.URL)
	_, err := c.Decide(t.Context(), policy.SendMessage, msg)
	require.NoError(t, err)
	owner, _ := c.Owner("a-1")
	assert.Equal(t, b.URL, owner)

	// A header naming a stranger is not remembered.
	evil := newFake(t)
	evil.handle = allow("")
	b.handle = allow(evil.URL)
	c = newClient(t, b.URL, a.URL, b.URL)
	_, err = c.Decide(t.Context(), policy.SendMessage, msg)
	require.NoError(t, err)
	_, ok := c.Owner("a-1")
	assert.False(t, ok)
}

// TestHostileReplicas: a compromised or broken replica cannot send the router's key to
// a host outside the peer list, keep a decision in a loop, or make it read without end.
func TestHostileReplicas(t *testing.T) {
	t.Run("redirect to a foreign host", func(t *testing.T) {
		a, b, evil := newFake(t), newFake(t), newFake(t)
		evil.handle = allow("")
		for _, to := range []string{evil.URL, "http://evil.example", "https://" + strings.TrimPrefix(b.URL, "http://"), b.URL + "/other", "javascript:alert(1)", ""} {
			a.handle = misdirect(to)
			_, err := newClient(t, a.URL, a.URL, b.URL).Decide(t.Context(), policy.SendMessage, msg)
			assert.ErrorIs(t, err, client.ErrForeignOwner, "%q", to)
		}
		assert.Zero(t, evil.hits.Load(), "the key never went there")
		assert.Zero(t, b.hits.Load())
	})
	t.Run("header and body disagree: the header is checked", func(t *testing.T) {
		a, b, evil := newFake(t), newFake(t), newFake(t)
		a.handle = func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set(shard.OwnerHeader, evil.URL)
			w.WriteHeader(http.StatusMisdirectedRequest)
			_, _ = fmt.Fprintf(w, `{"code":"misdirected","owner":%q}`, b.URL)
		}
		_, err := newClient(t, a.URL, a.URL, b.URL).Decide(t.Context(), policy.SendMessage, msg)
		assert.ErrorIs(t, err, client.ErrForeignOwner)
		assert.Zero(t, evil.hits.Load())
	})
	t.Run("loop", func(t *testing.T) {
		a, b := newFake(t), newFake(t)
		a.handle, b.handle = misdirect(b.URL), misdirect(a.URL)
		c := newClient(t, a.URL, a.URL, b.URL)
		_, err := c.Decide(t.Context(), policy.SendMessage, msg)
		assert.ErrorIs(t, err, client.ErrRedirectLoop)
		assert.Equal(t, int64(1), a.hits.Load())
		assert.Equal(t, int64(1), b.hits.Load())
		_, ok := c.Owner("a-1")
		assert.False(t, ok, "no owner is remembered from a loop")
		a.handle = misdirect(a.URL)
		_, err = c.Decide(t.Context(), policy.SendMessage, msg)
		assert.ErrorIs(t, err, client.ErrRedirectLoop, "to itself")
	})
	t.Run("too many hops", func(t *testing.T) {
		f := []*fake{newFake(t), newFake(t), newFake(t), newFake(t)}
		for i := range 3 {
			f[i].handle = misdirect(f[i+1].URL)
		}
		f[3].handle = allow(f[3].URL)
		_, err := newClient(t, f[0].URL, f[0].URL, f[1].URL, f[2].URL, f[3].URL).Decide(t.Context(), policy.SendMessage, msg)
		assert.ErrorIs(t, err, client.ErrTooManyHops)
		assert.Zero(t, f[3].hits.Load(), "a third redirect is not followed")
		// Two are.
		f[2].handle = allow(f[2].URL)
		d, err := newClient(t, f[0].URL, f[0].URL, f[1].URL, f[2].URL, f[3].URL).Decide(t.Context(), policy.SendMessage, msg)
		require.NoError(t, err)
		assert.True(t, d.Allow)
	})
	t.Run("a 421 without peers", func(t *testing.T) {
		a := newFake(t)
		a.handle = misdirect(a.URL + "x")
		_, err := newClient(t, a.URL).Decide(t.Context(), policy.SendMessage, msg)
		assert.ErrorIs(t, err, client.ErrForeignOwner)
	})
	t.Run("huge body", func(t *testing.T) {
		for _, status := range []int{http.StatusOK, http.StatusMisdirectedRequest, http.StatusInternalServerError} {
			a := newFake(t)
			a.handle = func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(status)
				_, _ = w.Write([]byte(`{"peers":[`))
				chunk := []byte(strings.Repeat(`{"id":"x"},`, 1000))
				for range 1000 { // 11 MB, never all read
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			}
			c, err := client.New(client.Config{Endpoint: a.URL, APIKey: "k", MaxResponseBytes: 64 << 10})
			require.NoError(t, err)
			_, err = c.Decide(t.Context(), policy.SendMessage, msg)
			assert.ErrorIs(t, err, client.ErrResponseTooLarge, "status %d", status)
		}
	})
	t.Run("http redirects are not followed", func(t *testing.T) {
		a, evil := newFake(t), newFake(t)
		evil.handle = allow("")
		a.handle = func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, evil.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}
		_, err := newClient(t, a.URL, a.URL).Decide(t.Context(), policy.SendMessage, msg)
		var e *client.Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, http.StatusTemporaryRedirect, e.Status)
		assert.Zero(t, evil.hits.Load())
	})
	t.Run("a 421 that is not the API's", func(t *testing.T) {
		a, b := newFake(t), newFake(t)
		a.handle = func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set(shard.OwnerHeader, b.URL)
			w.WriteHeader(http.StatusMisdirectedRequest)
			_, _ = w.Write([]byte("misdirected (TLS)"))
		}
		_, err := newClient(t, a.URL, a.URL, b.URL).Decide(t.Context(), policy.SendMessage, msg)
		var e *client.Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, http.StatusMisdirectedRequest, e.Status)
		assert.Zero(t, b.hits.Load())
	})
	t.Run("slow replica", func(t *testing.T) {
		a := newFake(t)
		release := make(chan struct{})
		defer close(release)
		// The replica answers only once Decide has returned: only the timeout ends it.
		a.handle = func(http.ResponseWriter, *http.Request) { <-release }
		c, err := client.New(client.Config{Endpoint: a.URL, APIKey: "k", Timeout: 200 * time.Millisecond})
		require.NoError(t, err)
		_, err = c.Decide(t.Context(), policy.SendMessage, msg)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

func TestErrorsCarryTheAPIsCode(t *testing.T) {
	a := newFake(t)
	a.handle = func(w http.ResponseWriter, _ *http.Request) {
		keys.WriteError(w, http.StatusForbidden, keys.CodeForbidden, "not yours")
	}
	_, err := newClient(t, a.URL).Decide(t.Context(), policy.SendMessage, msg)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, http.StatusForbidden, e.Status)
	assert.Equal(t, keys.CodeForbidden, e.Code)
	assert.Equal(t, "not yours", e.Message)

	// A cached owner that is gone is forgotten: the next decision asks the endpoint.
	b := newFake(t)
	a.handle, b.handle = misdirect(b.URL), allow(b.URL)
	c := newClient(t, a.URL, a.URL, b.URL)
	_, err = c.Decide(t.Context(), policy.SendMessage, msg)
	require.NoError(t, err)
	b.Close()
	_, err = c.Decide(t.Context(), policy.SendMessage, msg)
	assert.Error(t, err)
	_, ok := c.Owner("a-1")
	assert.False(t, ok)
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  client.Config
		want string
	}{
		{client.Config{Endpoint: "http://a"}, "no API key"},
		{client.Config{APIKey: "k"}, "no endpoint and no peers"},
		{client.Config{APIKey: "k", Endpoint: "ftp://a"}, "endpoint"},
		{client.Config{APIKey: "k", Peers: []string{"http://a", "http://a/"}}, "peer 2"},
		{client.Config{APIKey: "k", Endpoint: "http://a", Timeout: -1}, "negative"},
	} {
		_, err := client.New(tc.cfg)
		assert.ErrorContains(t, err, tc.want)
	}
}

// TestAgainstTwoReplicas drives the real decision API of two replicas of one
// deployment: whichever the client asks first, every send_message is decided (and
// audited) once, by the owner, and the rate holds as with one replica.
func TestAgainstTwoReplicas(t *testing.T) {
	ctx := context.Background()
	urls := make([]string, 2)
	var handlers [2]atomic.Pointer[http.Handler]
	for i := range urls {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handlers[i].Load()).ServeHTTP(w, r) }))
		t.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	var audited atomic.Int64
	auditor := auditFunc(func(evs []schema.Event) {
		for _, ev := range evs {
			if ev.Type == schema.TypePolicyDecided {
				audited.Add(1)
			}
		}
	})
	for i := range urls {
		s, err := shard.New(shard.Config{Peers: urls, Self: urls[i]})
		require.NoError(t, err)
		snap, err := policy.LoadDirectoryFile("../testdata/directory.json")
		require.NoError(t, err)
		dir := policy.NewDirectory()
		require.NoError(t, dir.Load(ctx, snap))
		eng, err := policy.New(ctx, policy.Config{Directory: dir})
		require.NoError(t, err)
		a, err := api.New(api.Config{Engine: eng, Auth: routerKey, Shards: s, Auditor: auditor})
		require.NoError(t, err)
		var h http.Handler = a
		handlers[i].Store(&h)
	}
	clients := []*client.Client{newClient(t, urls[0], urls...), newClient(t, urls[1], urls...)}
	allowed := 0
	for i := range 40 {
		d, err := clients[i%2].Decide(ctx, policy.SendMessage, policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries"})
		require.NoError(t, err)
		if d.Allow {
			allowed++
		}
	}
	assert.Equal(t, 12, allowed, "the room's rate, as with one replica")
	assert.Equal(t, int64(40), audited.Load(), "each decision audited once")
}

type auditFunc func([]schema.Event)

func (f auditFunc) Produce(_ context.Context, evs []schema.Event) error { f(evs); return nil }

type staticKey struct{}

func (staticKey) Lookup(_ context.Context, token string) (keys.Key, bool) {
	return keys.Key{ID: "k-router", Org: keys.PlatformOrg, Role: keys.RoleRouter}, token == "bpk_router"
}

var routerKey staticKey
