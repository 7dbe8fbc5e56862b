package graph

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
)

// WebSocket admission, in two pools (schema/share). A connection holds a slot of the
// server's MaxWebSockets, of its organization's MaxWebSocketsPerOrg and of its key's
// MaxWebSocketsPerKey only once its connection_init carried a valid key: an upgrade
// that never sends one takes nothing a viewer needs. Until then it holds a pending
// place of its remote address (MaxPendingWebSocketsPerAddress) and of the server
// (MaxPendingWebSockets), for at most InitTimeout: one address cannot hold more than
// its share of the upgrades in flight, however many it opens.

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
func admitUpgrade(next http.Handler, pending *share.Pool, l Limits) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, refused := pending.Take(remoteKey(r), "")
		if refused != nil {
			w.Header().Set("Retry-After", "5")
			msg := fmt.Sprintf("too many WebSocket upgrades waiting for their connection_init (%d, --graphql-max-pending-websockets)", l.MaxPendingWebSockets)
			if refused.Bound == share.BoundGroup {
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

// admitInit takes the slot of an authenticated connection. It returns the func that
// gives it back, or the close code and reason of a refusal.
func admitInit(k keys.Key, slots *share.Pool, l Limits) (release func(), code int, reason string) {
	release, refused := slots.Take(k.Org, k.ID)
	switch {
	case refused == nil:
		return release, 0, ""
	case refused.Bound == share.BoundClient:
		return nil, 4429, fmt.Sprintf("too many WebSocket connections for this key (%d, --graphql-max-websockets-per-key)", l.MaxWebSocketsPerKey)
	case refused.Bound == share.BoundGroup:
		return nil, 4429, fmt.Sprintf("too many WebSocket connections for this organization (%d, --graphql-max-websockets-per-org)", l.MaxWebSocketsPerOrg)
	default:
		return nil, 4503, fmt.Sprintf("too many open WebSocket connections (%d, --graphql-max-websockets)", l.MaxWebSockets)
	}
}
