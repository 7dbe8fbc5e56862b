package graphiql_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph/graphiql"
)

func get(h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// pageRefs are the URLs the page's HTML loads (src and href).
func pageRefs(t *testing.T, page string) []string {
	t.Helper()
	var refs []string
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		refs = append(refs, m[1])
	}
	require.Len(t, refs, 6, "two stylesheets and four scripts:\n%s", page)
	return refs
}

// TestPageLoadsOnlyItsOwnFiles: the page references nothing but files below
// AssetsPath, each of which is served with its type and cached for good under a URL
// that names its version (or its content's hash); the page itself is never cached.
func TestPageLoadsOnlyItsOwnFiles(t *testing.T) {
	ui := graphiql.New()
	rec := get(ui.Page(), http.MethodGet, "/graphql")
	require.Equal(t, http.StatusOK, rec.Code)
	page := rec.Body.String()
	assert.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	nonce := regexp.MustCompile(`<script src="[^"]*" nonce="([A-Za-z0-9_-]{22})" defer>`).FindStringSubmatch(page)
	require.Len(t, nonce, 2, "the page's own script carries the response's nonce:\n%s", page)
	assert.Equal(t, graphiql.CSP(nonce[1]), rec.Header().Get("Content-Security-Policy"))
	assert.NotContains(t, get(ui.Page(), http.MethodGet, "/graphql").Body.String(), nonce[1], "a nonce serves one response")
	assert.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
	assert.NotContains(t, page, "//", "no absolute or scheme-relative URL")
	assert.NotContains(t, page, "<script>", "no inline script: the CSP forbids it")
	assert.NotContains(t, page, "<style", "no inline style: the CSP forbids it")
	assert.Contains(t, page, `data-endpoint="/graphql"`)

	wantType := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
	for _, ref := range pageRefs(t, page) {
		require.True(t, strings.HasPrefix(ref, graphiql.AssetsPath), ref)
		rec := get(ui.Assets(), http.MethodGet, ref)
		require.Equal(t, http.StatusOK, rec.Code, ref)
		assert.Equal(t, wantType[filepath.Ext(ref)], rec.Header().Get("Content-Type"), ref)
		assert.Equal(t, "public, max-age=31536000, immutable", rec.Header().Get("Cache-Control"), ref)
		assert.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"), ref)
		assert.NotEmpty(t, rec.Body.Bytes(), ref)
		// A revalidation costs no body.
		etag := rec.Header().Get("ETag")
		require.NotEmpty(t, etag, ref)
		assert.Equal(t, http.StatusNotModified, get(ui.Assets(), http.MethodGet, ref, "If-None-Match", etag).Code, ref)
	}
	refs := strings.Join(pageRefs(t, page), " ")
	for _, versioned := range []string{
		"graphiql-" + graphiql.GraphiQLVersion + "/graphiql.min.js",
		"graphiql-" + graphiql.GraphiQLVersion + "/graphiql.min.css",
		"react-" + graphiql.ReactVersion + "/react.production.min.js",
		"react-dom-" + graphiql.ReactVersion + "/react-dom.production.min.js",
	} {
		assert.Contains(t, refs, graphiql.AssetsPath+versioned)
	}
	assert.Regexp(t, `/page\.[0-9a-f]{12}\.js\b`, refs, "the page's own script is named by its content")

	for _, lic := range []string{"graphiql-" + graphiql.GraphiQLVersion, "react-" + graphiql.ReactVersion, "react-dom-" + graphiql.ReactVersion} {
		rec := get(ui.Assets(), http.MethodGet, graphiql.AssetsPath+lic+"/LICENSE")
		require.Equal(t, http.StatusOK, rec.Code, lic)
		assert.Equal(t, "text/plain; charset=utf-8", rec.Header().Get("Content-Type"), lic)
		assert.Contains(t, rec.Body.String(), "MIT License", lic)
	}
}

// TestAssetsServeNothingElse: a path that is not exactly one of the embedded files'
// names (a directory, a traversal, an encoded one, the template, the Go source, the
// embedded tree's own names, a source map) is 404 with no content; a method other than
// GET and HEAD is 405. Through a ServeMux too, which cleans some of these first.
func TestAssetsServeNothingElse(t *testing.T) {
	ui := graphiql.New()
	js := graphiql.AssetsPath + "graphiql-" + graphiql.GraphiQLVersion + "/graphiql.min.js"
	hostile := []string{
		"/graphql/assets",
		"/graphql/assets/",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion,
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "/",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "/graphiql.min.js.map",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "/graphiql.min.js/",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "/./graphiql.min.js",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "//graphiql.min.js",
		"/graphql/assets/GRAPHIQL-" + graphiql.GraphiQLVersion + "/graphiql.min.js",
		"/graphql/assets/vendor/graphiql-" + graphiql.GraphiQLVersion + "/graphiql.min.js",
		"/graphql/assets/vendor/",
		"/graphql/assets/page.html",
		"/graphql/assets/page.js",
		"/graphql/assets/page.css",
		"/graphql/assets/graphiql.go",
		"/graphql/assets/README.md",
		"/graphql/assets/../graphiql.go",
		"/graphql/assets/../../go.mod",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "/../../graphiql.go",
		"/graphql/assets/..%2f..%2fgo.mod",
		"/graphql/assets/%2e%2e/%2e%2e/go.mod",
		"/graphql/assets/..%5c..%5cgo.mod",
		"/graphql/assets//etc/passwd",
		"/graphql/assets/%2fetc%2fpasswd",
		"/graphql/assets/graphiql.min.js%00.js",
		"/graphql/assets/*",
		"/graphql/assets/graphiql-" + graphiql.GraphiQLVersion + "/*.js",
		"/etc/passwd",
	}
	mux := http.NewServeMux()
	mux.Handle(graphiql.AssetsPath, ui.Assets())
	for _, target := range hostile {
		rec := get(ui.Assets(), http.MethodGet, target)
		requireNotFound(t, rec, target)
		assert.Contains(t, rec.Body.String(), `"code":"not_found"`, target)
		// The mux redirects an unclean path to its clean form (and a folder's name to
		// the folder): what matters is what that path answers, which is the file the
		// path was short for or nothing.
		rec = get(mux, http.MethodGet, target)
		if loc := rec.Header().Get("Location"); loc != "" && rec.Code/100 == 3 {
			if loc == js {
				continue
			}
			rec, target = get(mux, http.MethodGet, loc), target+" -> "+loc
		}
		requireNotFound(t, rec, "mux "+target)
	}

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		rec := get(ui.Assets(), m, js)
		assert.Equal(t, http.StatusMethodNotAllowed, rec.Code, m)
		assert.Equal(t, "GET, HEAD", rec.Header().Get("Allow"), m)
	}
	rec := get(ui.Assets(), http.MethodHead, js)
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Empty(t, rec.Body.Bytes())
	// The happy path beside the hostile ones: the same file, named exactly, is served.
	rec = get(mux, http.MethodGet, js)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, rec.Body.String(), "GraphiQL")
}

func requireNotFound(t *testing.T, rec *httptest.ResponseRecorder, target string) {
	t.Helper()
	require.Equal(t, http.StatusNotFound, rec.Code, "%s: %.200s", target, rec.Body.String())
	assert.Less(t, rec.Body.Len(), 200, "%s: no file's content", target)
	assert.NotContains(t, rec.Header().Get("Content-Type"), "javascript", target)
}

// TestVendoredFilesAreThePublishedOnes: each vendored file is byte for byte the one the
// README's table lists (the release's, by sha256), and the table lists every vendored
// file, so an edit to a bundle or an update without its record fails here.
func TestVendoredFilesAreThePublishedOnes(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	rows := regexp.MustCompile("(?m)^\\| (\\S+) \\| (\\S+) \\| `([^`]+)`[^|]* \\| (\\d+) \\| `([0-9a-f]{64})` \\|$").FindAllStringSubmatch(string(readme), -1)
	listed := map[string]string{}
	for _, r := range rows {
		listed[filepath.Join("vendor", r[1]+"-"+r[2], r[3])] = r[5]
	}
	require.Len(t, listed, 7, "the README's table of releases")

	found := map[string]string{}
	require.NoError(t, filepath.WalkDir("vendor", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		found[path] = hex.EncodeToString(sum[:])
		return nil
	}))
	assert.Equal(t, listed, found, "vendor/ against README.md's table")
	for _, dir := range []string{"graphiql-" + graphiql.GraphiQLVersion, "react-" + graphiql.ReactVersion, "react-dom-" + graphiql.ReactVersion} {
		assert.DirExists(t, filepath.Join("vendor", dir), "the version constants name the vendored folders")
	}
}
