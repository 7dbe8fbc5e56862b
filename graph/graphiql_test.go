package graph_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/graph/graphiql"
)

// TestGraphiQLFilesNeedNoKey: the handler serves the files the page names, below
// graphiql.AssetsPath, without an API key and as a browser asks for them (no text/html
// in Accept), but only under an allowed host name, like the page; a path below it that
// names no file is 404, never the API.
func TestGraphiQLFilesNeedNoKey(t *testing.T) {
	h := graph.NewHandler(&fakeQuerier{}, testKeys)
	page := getPage(h, "localhost:8080", "/graphql")
	require.Equal(t, http.StatusOK, page.Code)
	refs := regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(page.Body.String(), -1)
	require.Len(t, refs, 6, page.Body.String())
	for _, m := range refs {
		for _, host := range []string{"localhost:8080", "127.0.0.1", "[::1]:8080"} {
			req := httptest.NewRequest(http.MethodGet, m[1], nil)
			req.Host = host
			req.Header.Set("Accept", "*/*")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, http.StatusOK, rec.Code, "%s under %s: %.200s", m[1], host, rec.Body.String())
			assert.Equal(t, "public, max-age=31536000, immutable", rec.Header().Get("Cache-Control"), m[1])
			assert.Empty(t, rec.Header().Get("Vary"), "%s: the same for every Accept", m[1])
		}
		rec := getPage(h, "evil.example", m[1])
		assert.Equal(t, http.StatusMisdirectedRequest, rec.Code, m[1])
	}
	for _, target := range []string{graphiql.AssetsPath, graphiql.AssetsPath + "?query={__typename}", graphiql.AssetsPath + "x.js"} {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.Host = "localhost"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		assert.Equal(t, http.StatusNotFound, rec.Code, target)
		assert.NotContains(t, rec.Body.String(), "__typename", target)
	}
}
