package graph_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/graph/wsclient"
)

// idleUpgrade opens a WebSocket upgrade from the loopback address from (127.0.0.x)
// with the given Upgrade header and never sends connection_init. It returns the
// response's status code; the connection stays open until the test ends.
func idleUpgrade(t *testing.T, srv *httptest.Server, from, upgrade string) int {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = fmt.Fprintf(c, "GET /graphql HTTP/1.1\r\nHost: %s\r\nUpgrade: %s\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: graphql-transport-ws\r\n\r\n",
		strings.TrimPrefix(srv.URL, "http://"), upgrade)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		if resp.Body != nil {
			_ = resp.Body.Close()
		}
	} // a switched connection's body is the connection, closed at cleanup
	return resp.StatusCode
}

func wsURL(srv *httptest.Server) string { return "ws" + strings.TrimPrefix(srv.URL, "http") }

// Upgrades that never send connection_init hold places of their own address only:
// a viewer from another address connects, and no slot of MaxWebSockets is taken.
func TestPendingUpgradesHoldNoSlot(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{
		MaxWebSockets: 1, MaxPendingWebSocketsPerAddress: 3, InitTimeout: time.Minute})))
	defer srv.Close()
	for range 3 {
		require.Equal(t, http.StatusSwitchingProtocols, idleUpgrade(t, srv, "127.0.0.2", "websocket"))
	}
	require.Equal(t, http.StatusServiceUnavailable, idleUpgrade(t, srv, "127.0.0.2", "websocket"),
		"the address's fourth upgrade in flight")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	viewer, err := wsclient.Dial(ctx, wsURL(srv), "tok-a-viewer")
	require.NoError(t, err, "another address upgrades, and the idle ones hold none of the one slot")
	require.NoError(t, viewer.Close())
}

func TestPendingUpgradesOfAnAddressAreRefusedWithTheFlag(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{
		MaxPendingWebSocketsPerAddress: 1, InitTimeout: time.Minute})))
	defer srv.Close()
	require.Equal(t, http.StatusSwitchingProtocols, idleUpgrade(t, srv, "127.0.0.3", "websocket"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	viewer, err := wsclient.Dial(ctx, wsURL(srv), "tok-a-viewer")
	require.NoError(t, err, "another address is not held back")
	require.NoError(t, viewer.Close())

	// The same address again, over plain HTTP to read the answer.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
	client := http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/graphql", nil)
	require.NoError(t, err)
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "5", resp.Header.Get("Retry-After"))
	var body struct{ Error, Code string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "unavailable", body.Code)
	assert.Contains(t, body.Error, "--graphql-max-pending-websockets-per-address")
}

func TestPendingUpgradesOfTheServerAreBounded(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{
		MaxPendingWebSockets: 2, InitTimeout: time.Minute})))
	defer srv.Close()
	require.Equal(t, http.StatusSwitchingProtocols, idleUpgrade(t, srv, "127.0.0.4", "websocket"))
	require.Equal(t, http.StatusSwitchingProtocols, idleUpgrade(t, srv, "127.0.0.5", "websocket"))
	assert.Equal(t, http.StatusServiceUnavailable, idleUpgrade(t, srv, "127.0.0.6", "websocket"))
}

// Upgrade is a token list: "h2c, websocket" is a WebSocket upgrade and is counted as
// one; an upgrade to anything but WebSocket is refused.
func TestUpgradeIsATokenList(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{
		MaxPendingWebSocketsPerAddress: 1, InitTimeout: time.Minute})))
	defer srv.Close()
	require.Equal(t, http.StatusSwitchingProtocols, idleUpgrade(t, srv, "127.0.0.7", "h2c, websocket"))
	assert.Equal(t, http.StatusServiceUnavailable, idleUpgrade(t, srv, "127.0.0.7", "WebSocket"))
	assert.Equal(t, http.StatusBadRequest, idleUpgrade(t, srv, "127.0.0.8", "h2c"))
	assert.Equal(t, http.StatusBadRequest, idleUpgrade(t, srv, "127.0.0.8", "h2c, websocketx"))
}

// MaxWebSockets counts authenticated connections; the one over it is closed at init
// with a reason naming the flag, and a closed one gives its place back.
func TestWebSocketCapCountsAuthenticatedConnections(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{MaxWebSockets: 1})))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := wsclient.Dial(ctx, wsURL(srv), "tok-a-viewer")
	require.NoError(t, err)
	_, err = wsclient.Dial(ctx, wsURL(srv), "tok-a-compliance")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--graphql-max-websockets)")
	_, err = wsclient.Dial(ctx, wsURL(srv), "tok-nope")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unauthenticated", "a bad key is told so, whatever the cap")
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool {
		c, err := wsclient.Dial(ctx, wsURL(srv), "tok-a-compliance")
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 5*time.Second, 10*time.Millisecond, "a closed connection gives its place back")
}

// connection_ack carries no payload: echoing the init payload would send the token
// back to whoever reads the connection's frames.
func TestConnectionAckCarriesNoPayload(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, proto := range []string{"graphql-transport-ws", "graphql-ws"} {
		c, resp, err := websocket.Dial(ctx, wsURL(srv), &websocket.DialOptions{Subprotocols: []string{proto}})
		require.NoError(t, err, proto)
		if resp.Body != nil {
			_ = resp.Body.Close()
		}
		init, err := json.Marshal(map[string]any{"type": "connection_init", "payload": map[string]string{"Authorization": "Bearer tok-a-viewer"}})
		require.NoError(t, err)
		require.NoError(t, c.Write(ctx, websocket.MessageText, init))
		_, ack, err := c.Read(ctx)
		require.NoError(t, err, proto)
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(ack, &m), string(ack))
		assert.Equal(t, `"connection_ack"`, string(m["type"]), proto)
		assert.NotContains(t, m, "payload", proto)
		assert.NotContains(t, string(ack), "tok-a-viewer", proto)
		_ = c.CloseNow()
	}
}

func TestIntrospectionNeedsAKey(t *testing.T) {
	h := graph.NewHandler(&fakeQuerier{}, testKeys)
	for _, q := range []string{
		`{ __schema { queryType { name } } }`,
		`{ __type(name: "Query") { name } }`,
		`query { ...f } fragment f on Query { __schema { types { name } } }`,
	} {
		_, errs := post(t, h, gqlBody(q), nil)
		require.Len(t, errs, 1, q)
		assert.Equal(t, "UNAUTHENTICATED", errs[0].Extensions["code"], q)
		assert.Contains(t, errs[0].Message, "introspection needs an API key", q)

		_, errs = post(t, h, gqlBody(q), bearerOf("tok-nope"))
		require.Len(t, errs, 1, q)
		assert.Equal(t, "UNAUTHENTICATED", errs[0].Extensions["code"], q)

		code, errs := post(t, h, gqlBody(q), bearerOf("tok-a-viewer"))
		assert.Equal(t, http.StatusOK, code)
		assert.Empty(t, errs, "%s with a key", q)
	}
	_, errs := post(t, h, gqlBody(`{ __typename }`), nil)
	assert.Empty(t, errs, "__typename needs no key")
}

func TestWebSocketsPerOrg(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{MaxWebSocketsPerOrg: 1})))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := wsclient.Dial(ctx, wsURL(srv), "tok-a-viewer")
	require.NoError(t, err)
	defer func() { _ = first.Close() }()
	_, err = wsclient.Dial(ctx, wsURL(srv), "tok-a-compliance")
	require.Error(t, err, "another key of the same organization")
	assert.Contains(t, err.Error(), "--graphql-max-websockets-per-org")
	other, err := wsclient.Dial(ctx, wsURL(srv), "tok-b-compliance")
	require.NoError(t, err, "another organization has its own share")
	require.NoError(t, other.Close())
}
