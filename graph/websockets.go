package graph

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/bandplane/bandplane/schema/keys"
)

// WebSocket admission. A connection holds a slot of the server's MaxWebSockets, and
// one of its key's MaxWebSocketsPerKey, only once its connection_init carried a valid
// key: an upgrade that never sends one takes nothing a viewer needs. Until then it
// holds a pending place of its remote address (MaxPendingWebSocketsPerAddress) and of
// the server (MaxPendingWebSockets), for at most InitTimeout: one address cannot hold
// more than its share of the upgrades in flight, however many it opens.

// counter counts what each key (an API key's id, a remote address) holds, up to perKey
// each and total in all.
type counter struct {
	mu            sync.Mutex
	perKey, total int
	n             map[string]int
	sum           int
}

func newCounter(perKey, total int) *counter {
	return &counter{perKey: perKey, total: total, n: map[string]int{}}
}

// take counts one more for key if both bounds allow it and returns the func (safe to
// call more than once) that counts it out; byKey says which bound refused.
func (c *counter) take(key string) (release func(), ok, byKey bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= c.perKey {
		return nil, false, true
	}
	if c.sum >= c.total {
		return nil, false, false
	}
	c.n[key]++
	c.sum++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.sum--
			if c.n[key]--; c.n[key] <= 0 {
				delete(c.n, key)
			}
		})
	}, true, false
}

// upgradeTokens says whether the request asks for a protocol upgrade, and whether
// websocket is among the protocols it names. Upgrade is a comma-separated list
// (RFC 9110, section 7.8), possibly over several header lines, as coder/websocket
// reads it: "h2c, websocket" is a WebSocket upgrade.
func upgradeTokens(h http.Header) (upgrade, websocket bool) {
	for _, v := range h.Values("Upgrade") {
		for t := range strings.SplitSeq(v, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			upgrade = true
			// A protocol may carry a version ("websocket/13" is not one coder/websocket
			// accepts, but it is still an upgrade).
			if name, _, _ := strings.Cut(t, "/"); strings.EqualFold(name, "websocket") {
				websocket = true
			}
		}
	}
	return upgrade, websocket
}

// remoteKey is the remote address an upgrade is counted under: its IP, and for IPv6
// its /64, which one host holds whole as easily as one address.
func remoteKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

type pendingKey struct{}

// admitUpgrade answers a WebSocket upgrade over its address's or the server's pending
// bound with 503, and otherwise serves it holding a pending place until its
// connection_init is answered (admitInit) or the connection ends. An Upgrade header
// that names no websocket is refused (400): the WebSocket transport would take it.
func admitUpgrade(next http.Handler, pending *counter, l Limits) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, ok, byAddr := pending.take(remoteKey(r))
		if !ok {
			w.Header().Set("Retry-After", "5")
			msg := fmt.Sprintf("too many WebSocket upgrades waiting for their connection_init (%d, --graphql-max-pending-websockets)", l.MaxPendingWebSockets)
			if byAddr {
				msg = fmt.Sprintf("too many WebSocket upgrades from this address waiting for their connection_init (%d, --graphql-max-pending-websockets-per-address)",
					l.MaxPendingWebSocketsPerAddress)
			}
			keys.WriteError(w, http.StatusServiceUnavailable, "unavailable", msg)
			return
		}
		defer release()
		// A hijacked connection keeps the server's read and write deadlines, which would
		// end every subscription after --write-timeout.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), pendingKey{}, release)))
	})
}

// initArrived ends a connection's pending place: its connection_init has arrived,
// and is answered at once.
func initArrived(ctx context.Context) {
	if done, ok := ctx.Value(pendingKey{}).(func()); ok {
		done()
	}
}

// admitInit takes the slots of an authenticated connection: its key's and the
// server's. It returns the func that gives them back, or the close code and reason of
// a refusal.
func admitInit(keyID string, slots *counter, l Limits) (release func(), code int, reason string) {
	release, ok, byKey := slots.take(keyID)
	switch {
	case ok:
		return release, 0, ""
	case byKey:
		return nil, 4429, fmt.Sprintf("too many WebSocket connections for this key (%d, --graphql-max-websockets-per-key)", l.MaxWebSocketsPerKey)
	default:
		return nil, 4503, fmt.Sprintf("too many open WebSocket connections (%d, --graphql-max-websockets)", l.MaxWebSockets)
	}
}
