package graph

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/bandplane/bandplane/schema/keys"
)

// The board is three static files: no build step, nothing loaded from another host.
//
//go:embed board/index.html board/board.js board/board.css
var boardFiles embed.FS

// BoardCSP is the live work board's Content-Security-Policy. Its scripts and styles
// are its own files only (no inline code, no eval), and it connects only to its own
// origin: 'self' covers the WebSocket to the same host and port (ws: for an http:
// page, wss: for https:) in CSP Level 3 browsers (Chromium since 71, Firefox, Safari
// since 16), so no Host header is ever echoed into the policy. Trusted Types make any
// assignment of a string to innerHTML and its kin throw in Chromium: the board writes
// chat content, which attackers control, with textContent only, and this holds it to
// that. form-action 'none' keeps the key form from ever being submitted as a
// navigation (which would put the key in a URL) when its script did not run.
const BoardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

type boardFile struct {
	name        string // in boardFiles
	contentType string
	cache       string
	body        []byte
	etag        string
}

// BoardHandler serves the live work board (graph/README.md, "The live work board") at
// "/": the page at "/", its script at "/board.js" and its styles at "/board.css"; any
// other path is 404, and nothing but GET and HEAD is answered (405). Like GraphiQL it
// answers only under allowedHosts (AllowHosts; none given: DefaultAllowedHosts), so a
// site re-pointing its name at this server cannot open it. Mount it at "/" of the mux.
func BoardHandler(allowedHosts []string) http.Handler {
	if len(allowedHosts) == 0 {
		allowedHosts = DefaultAllowedHosts
	}
	files := map[string]*boardFile{
		// The page is never cached: a new release's page must not pair with old assets.
		"/":          {name: "board/index.html", contentType: "text/html; charset=utf-8", cache: "no-store"},
		"/board.js":  {name: "board/board.js", contentType: "text/javascript; charset=utf-8", cache: "no-cache"},
		"/board.css": {name: "board/board.css", contentType: "text/css; charset=utf-8", cache: "no-cache"},
	}
	for _, f := range files {
		b, err := boardFiles.ReadFile(f.name)
		if err != nil {
			panic("graph: board file missing from the embedded files: " + err.Error()) // a build mistake
		}
		sum := sha256.Sum256(b)
		f.body, f.etag = b, `"`+hex.EncodeToString(sum[:16])+`"`
	}
	serve := AllowHosts(allowedHosts, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			keys.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "the work board answers only GET and HEAD")
			return
		}
		f := files[r.URL.Path]
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("Cache-Control", f.cache)
		h.Set("ETag", f.etag)
		// ServeContent answers HEAD, If-None-Match (304) and ranges.
		http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.body))
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", BoardCSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		// Only the three paths exist, looked up whole: nothing reaches a file system, so
		// no path (../, %2e%2e, a directory) can name anything else. The path is checked
		// before the host so that a mistyped API path under a name not allowed for pages
		// gets 404, not advice about --allowed-hosts.
		if files[r.URL.Path] == nil {
			h.Set("Cache-Control", "no-store")
			keys.WriteError(w, http.StatusNotFound, "not_found", "no such page: the work board is at /")
			return
		}
		serve.ServeHTTP(w, r)
	})
}
