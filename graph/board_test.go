package graph_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/bandplane/bandplane/graph"
)

func boardRequest(h http.Handler, method, host, target string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	req.Host = host
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func requireBoardHeaders(t *testing.T, rec *httptest.ResponseRecorder, what string) {
	t.Helper()
	h := rec.Header()
	assert.Equal(t, graph.BoardCSP, h.Get("Content-Security-Policy"), what)
	assert.Equal(t, "DENY", h.Get("X-Frame-Options"), what)
	assert.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), what)
	assert.Equal(t, "no-referrer", h.Get("Referrer-Policy"), what)
}

// TestBoardServesPageAndAssets: the page and its two assets, with their types, the
// security headers, and the page never cached.
func TestBoardServesPageAndAssets(t *testing.T) {
	h := graph.BoardHandler([]string{"localhost", "board.example.com"})
	for _, tc := range []struct {
		path, contentType, cache, contains string
	}{
		{"/", "text/html; charset=utf-8", "no-store", `<script src="board.js" defer></script>`},
		{"/?room=x", "text/html; charset=utf-8", "no-store", `id="status"`},
		{"/board.js", "text/javascript; charset=utf-8", "no-cache", `"graphql-transport-ws"`},
		{"/board.css", "text/css; charset=utf-8", "no-cache", "tr.task.stuck"},
	} {
		for _, host := range []string{"localhost:8080", "BOARD.example.com"} {
			rec := boardRequest(h, http.MethodGet, host, tc.path)
			require.Equal(t, http.StatusOK, rec.Code, "%s %s: %s", host, tc.path, rec.Body)
			assert.Equal(t, tc.contentType, rec.Header().Get("Content-Type"), tc.path)
			assert.Equal(t, tc.cache, rec.Header().Get("Cache-Control"), tc.path)
			assert.Contains(t, rec.Body.String(), tc.contains, tc.path)
			requireBoardHeaders(t, rec, tc.path)

			head := boardRequest(h, http.MethodHead, host, tc.path)
			assert.Equal(t, http.StatusOK, head.Code, "HEAD %s", tc.path)
			assert.Empty(t, head.Body.String(), "HEAD %s has no body", tc.path)
			assert.Equal(t, rec.Header().Get("Content-Length"), head.Header().Get("Content-Length"), "HEAD %s", tc.path)
			assert.Equal(t, tc.contentType, head.Header().Get("Content-Type"), "HEAD %s", tc.path)

			etag := rec.Header().Get("ETag")
			require.NotEmpty(t, etag, tc.path)
			again := boardRequest(h, http.MethodGet, host, tc.path, "If-None-Match", etag)
			assert.Equal(t, http.StatusNotModified, again.Code, "revalidating %s", tc.path)
		}
	}
}

// TestBoardCSPIsStrict: the policy allows only the board's own files and its own
// origin, and nothing inline.
func TestBoardCSPIsStrict(t *testing.T) {
	directives := map[string]string{}
	for _, d := range strings.Split(graph.BoardCSP, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		_, dup := directives[name]
		require.False(t, dup, "directive %s twice (browsers take the first)", name)
		directives[name] = value
	}
	assert.Equal(t, map[string]string{
		"default-src":               "'none'",
		"script-src":                "'self'",
		"style-src":                 "'self'",
		"img-src":                   "'self'",
		"connect-src":               "'self'",
		"base-uri":                  "'none'",
		"form-action":               "'none'",
		"frame-ancestors":           "'none'",
		"require-trusted-types-for": "'script'",
		"trusted-types":             "'none'",
	}, directives)
	for _, loose := range []string{"unsafe-inline", "unsafe-eval", "*", "data:", "http:", "https:", "ws:", "wss:"} {
		assert.NotContains(t, strings.Fields(strings.ReplaceAll(graph.BoardCSP, ";", " ")), loose)
	}
}

// TestBoardRefusesOtherHosts: like GraphiQL, the board answers only under the allowed
// names (DNS rebinding), whatever the path of its own.
func TestBoardRefusesOtherHosts(t *testing.T) {
	h := graph.BoardHandler(nil) // DefaultAllowedHosts
	for _, host := range []string{"localhost:8080", "127.0.0.1", "[::1]:9", "LocalHost"} {
		assert.Equal(t, http.StatusOK, boardRequest(h, http.MethodGet, host, "/").Code, host)
	}
	for _, host := range []string{"evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.2", ""} {
		for _, path := range []string{"/", "/board.js", "/board.css"} {
			rec := boardRequest(h, http.MethodGet, host, path)
			require.Equal(t, http.StatusMisdirectedRequest, rec.Code, "%s %s", host, path)
			var body struct{ Error, Code string }
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
			assert.Equal(t, "host_not_allowed", body.Code)
			assert.Contains(t, body.Error, "--allowed-hosts")
			assert.NotContains(t, rec.Body.String(), "<html", "nothing of the page")
			requireBoardHeaders(t, rec, host)
		}
	}
}

// TestBoardOnlyGetAndHead: every other method is 405 with Allow.
func TestBoardOnlyGetAndHead(t *testing.T) {
	h := graph.BoardHandler(nil)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions, "PROPFIND"} {
		for _, path := range []string{"/", "/board.js"} {
			rec := boardRequest(h, m, "localhost", path)
			assert.Equal(t, http.StatusMethodNotAllowed, rec.Code, "%s %s", m, path)
			assert.Equal(t, "GET, HEAD", rec.Header().Get("Allow"), m)
			assert.NotContains(t, rec.Body.String(), "<html", m)
		}
	}
}

// TestBoardServesNothingElse: only the three paths exist. No traversal reaches the
// source or the file system, no directory is listed, the embedded folder is not
// browsable.
func TestBoardServesNothingElse(t *testing.T) {
	h := graph.BoardHandler(nil)
	mux := http.NewServeMux() // as serve mounts it
	mux.Handle("/", h)
	paths := []string{
		"/index.html", "/board/", "/board/index.html", "/board/board.js", "/board", "/graph/board.go",
		"/../board.go", "/..%2fboard.go", "/%2e%2e/", "/%2e%2e/board.go", "/board.js/", "//board.js", "/./board.js",
		"/board.js/..", "/board.js%00", "/board.js.map", "/favicon.ico", "/.git/config", "/etc/passwd", "/../../../../etc/passwd",
		"/BOARD.JS", "/board.css;x", `/..\board.go`,
	}
	for _, p := range paths {
		for _, host := range []string{"localhost", "evil.example"} {
			for name, handler := range map[string]http.Handler{"handler": h, "mux": mux} {
				rec := rawRequest(t, handler, "GET "+p+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
				if name == "mux" && rec.Code >= 300 && rec.Code < 400 {
					// The mux redirects an unclean path to its clean form (/./board.js to
					// /board.js, the same public file), which is one more request to the
					// board: anything but its own files is 404 there too.
					loc := rec.Header().Get("Location")
					if loc == "/" || loc == "/board.js" || loc == "/board.css" {
						continue
					}
					rec = rawRequest(t, handler, "GET "+loc+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
				}
				assert.Equal(t, http.StatusNotFound, rec.Code, "%s %s (%s): %s", host, p, name, rec.Body)
				body := rec.Body.String()
				assert.NotContains(t, body, "package graph", p)
				assert.NotContains(t, body, "<pre>", "no directory listing: %s", p)
				assert.NotContains(t, body, "board.css\"", "no directory listing: %s", p)
				assert.Equal(t, graph.BoardCSP, rec.Header().Get("Content-Security-Policy"), p)
			}
		}
	}
}

// rawRequest parses a request as the HTTP server does (the path is not cleaned) and
// serves it.
func rawRequest(t *testing.T, h http.Handler, raw string) *httptest.ResponseRecorder {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	require.NoError(t, err, raw)
	req.RemoteAddr = "192.0.2.1:1234"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestBoardFilesLoadNothingFromElsewhere: the page has no inline script or style and
// names no other host; the script writes data only as text, never as markup.
func TestBoardFilesLoadNothingFromElsewhere(t *testing.T) {
	page := boardFile(t, "board/index.html")
	js := boardFile(t, "board/board.js")
	css := boardFile(t, "board/board.css")

	for _, m := range regexp.MustCompile(`(?is)<script\b[^>]*>(.*?)</script>`).FindAllStringSubmatch(page, -1) {
		assert.Empty(t, strings.TrimSpace(m[1]), "inline script: %s", m[0])
		assert.Regexp(t, `src="[a-z]+\.js"`, m[0])
	}
	refuse(t, "index.html", page, `(?i)<style\b`, "an inline style element")
	refuse(t, "index.html", page, `(?i)\sstyle\s*=`, "an inline style attribute")
	refuse(t, "index.html", page, `(?i)\son[a-z]+\s*=`, "an inline event handler")
	for _, m := range regexp.MustCompile(`(?i)\s(?:src|href|action)\s*=\s*"([^"]*)"`).FindAllStringSubmatch(page, -1) {
		assert.Regexp(t, `^[a-z]+\.(js|css)$`, m[1], "only the board's own files: %s", m[0])
	}
	for name, text := range map[string]string{"index.html": page, "board.js": js, "board.css": css} {
		refuse(t, name, text, `(?i)\b(?:https?|wss?|ftp):/|(?:^|[\s"'(=])//[a-z0-9-]+\.[a-z0-9.-]+`, "another host")
	}
	refuse(t, "board.css", css, `(?i)url\(|@import`, "something loaded by the styles")
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
		"setTimeout(\"", "createContextualFragment", "srcdoc", "localStorage", "document.cookie", ".href =", "location ="} {
		refuse(t, "board.js", js, regexp.QuoteMeta(sink), "a use of "+sink)
	}
	// The key stays in this tab, and goes nowhere but to this server's API.
	assert.Contains(t, js, "sessionStorage.setItem(KEY_ITEM")
	assert.Contains(t, js, `new URL("graphql", location.href)`)
	assert.Contains(t, js, `credentials: "omit"`)
}

// refuse fails when text (the file name) matches re, showing the line, not the file.
func refuse(t *testing.T, name, text, re, what string) {
	t.Helper()
	if loc := regexp.MustCompile(re).FindStringIndex(text); loc != nil {
		line := strings.Count(text[:loc[0]], "\n") + 1
		t.Errorf("%s:%d has %s: %q", name, line, what, text[loc[0]:loc[1]])
	}
}

// TestBoardOperationsMatchTheSchema: the query and the subscription board.js sends are
// valid against schema.graphqls (a renamed field fails here, not in a browser).
func TestBoardOperationsMatchTheSchema(t *testing.T) {
	sdl, err := os.ReadFile("schema.graphqls")
	require.NoError(t, err)
	schema, gerr := gqlparser.LoadSchema(&ast.Source{Name: "schema.graphqls", Input: string(sdl)})
	require.Nil(t, gerr, "%v", gerr)
	js := boardFile(t, "board/board.js")
	ops := map[string]ast.Operation{"BOARD_QUERY": ast.Query, "LIVE_SUBSCRIPTION": ast.Subscription}
	for name, kind := range ops {
		m := regexp.MustCompile(`const ` + name + " = `([^`]*)`;").FindStringSubmatch(js)
		require.NotNil(t, m, "board.js has no %s template literal", name)
		assert.NotContains(t, m[1], "${", "%s is one literal, without interpolation", name)
		doc, gerr := gqlparser.LoadQueryWithRules(schema, m[1], nil) // nil: the default rules
		require.Nil(t, gerr, "%s: %v", name, gerr)
		require.Len(t, doc.Operations, 1, name)
		assert.Equal(t, kind, doc.Operations[0].Operation, name)
	}
	// Every kind of change is handled by name.
	for _, v := range schema.Types["WorkChangeKind"].EnumValues {
		assert.Contains(t, js, `case "`+v.Name+`":`, "board.js does not handle %s", v.Name)
	}
}

func boardFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	return string(b)
}
