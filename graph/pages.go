package graph

import (
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/bandplane/bandplane/schema/keys"
)

// DefaultAllowedHosts are the host names the browser-facing pages answer to when no
// other is configured: the loopback ones.
var DefaultAllowedHosts = []string{"localhost", "127.0.0.1", "::1"}

// AllowHosts serves next only to requests whose Host (without its port) is one of
// hosts, compared case-insensitively; any other gets 421 with a JSON error. It guards
// the pages people open in a browser against DNS rebinding: a page of another site
// whose name was re-pointed at this server sends that site's name as Host.
func AllowHosts(hosts []string, next http.Handler) http.Handler {
	allowed := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		allowed[normalizeHost(h)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := normalizeHost(r.Host); !allowed[h] {
			keys.WriteError(w, http.StatusMisdirectedRequest, "host_not_allowed",
				fmt.Sprintf("host %q is not served here; add it to --allowed-hosts to open this page under that name", h))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// normalizeHost is a Host header's or a configured name's host, lower case, without
// port or IPv6 brackets.
func normalizeHost(h string) string {
	h = strings.TrimSpace(h)
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
}

// wantsPage says whether r is a browser opening /graphql (a GET for HTML without a
// query), which gets GraphiQL instead of the API.
func wantsPage(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Query().Get("query") == "" &&
		strings.Contains(r.Header.Get("Accept"), "text/html")
}
