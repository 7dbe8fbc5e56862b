package graph_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
)

func getPage(h http.Handler, host, target string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Host = host
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestGraphiQLOnlyUnderAllowedHosts: a browser opening /graphql gets GraphiQL, but only
// under an allowed host name (DNS rebinding); other names get 421 naming the host.
func TestGraphiQLOnlyUnderAllowedHosts(t *testing.T) {
	h := graph.NewHandler(&fakeQuerier{}, testKeys)
	for _, host := range []string{"localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST", "localhost"} {
		rec := getPage(h, host, "/graphql")
		assert.Equal(t, http.StatusOK, rec.Code, host)
		assert.Contains(t, rec.Body.String(), "graphiql", host)
		assert.Contains(t, rec.Header().Get("Content-Type"), "text/html", host)
		assert.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"), host)
		assert.Contains(t, rec.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'", host)
		assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"), host)
		assert.Equal(t, "Accept", rec.Header().Get("Vary"), host)
	}
	for _, host := range []string{"evil.example:8080", "localhost.evil.example", "127.0.0.2", ""} {
		rec := getPage(h, host, "/graphql")
		require.Equal(t, http.StatusMisdirectedRequest, rec.Code, host)
		var body struct{ Error, Code string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		assert.Equal(t, "host_not_allowed", body.Code)
		assert.Contains(t, body.Error, "--allowed-hosts")
	}

	h = graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithAllowedHosts("board.example.com"))
	assert.Equal(t, http.StatusOK, getPage(h, "board.example.com:443", "/graphql").Code)
	assert.Equal(t, http.StatusMisdirectedRequest, getPage(h, "localhost:8080", "/graphql").Code)
}

// TestGraphQLGetWithAQueryIsTheAPI: a GET that carries a query is the API (and needs a
// key), even from a browser.
func TestGraphQLGetWithAQueryIsTheAPI(t *testing.T) {
	h := graph.NewHandler(&fakeQuerier{}, testKeys)
	rec := getPage(h, "evil.example", `/graphql?query={__typename}`)
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.JSONEq(t, `{"data":{"__typename":"Query"}}`, rec.Body.String())
}
