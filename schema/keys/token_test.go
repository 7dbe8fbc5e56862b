package keys

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ParseBearer reads one value, as a WebSocket init payload carries it: nothing is no
// token, and the value is held to the same rules as a header.
func TestParseBearer(t *testing.T) {
	tok := newToken()
	got, err := ParseBearer("")
	require.NoError(t, err)
	assert.Empty(t, got)
	got, err = ParseBearer("Bearer " + tok)
	require.NoError(t, err)
	assert.Equal(t, tok, got)
	for _, v := range []string{tok, "Basic x", "Bearer ", "Bearer a b", "Bearer a\x00b", "Bearer " + strings.Repeat("a", 2000)} {
		_, err := ParseBearer(v)
		require.Error(t, err, "%q", v)
		assert.NotContains(t, err.Error(), "aaaa", "the error never repeats the value")
	}
}

// Token passes every request with no or a well-formed header on, with its token in
// the context, and answers 401 to a malformed one.
func TestTokenMiddleware(t *testing.T) {
	var seen []string
	h := Token(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, TokenFrom(r.Context()))
	}))
	tok := newToken()
	for _, c := range []struct {
		headers []string
		status  int
	}{
		{nil, http.StatusOK},
		{[]string{"Bearer " + tok}, http.StatusOK},
		{[]string{"Bearer " + tok + "\x01"}, http.StatusUnauthorized},
		{[]string{"Bearer " + tok, "Bearer " + tok}, http.StatusUnauthorized},
	} {
		r := httptest.NewRequest(http.MethodPost, "/graphql", nil)
		for _, v := range c.headers {
			r.Header.Add("Authorization", v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		assert.Equal(t, c.status, w.Code, "%q", c.headers)
		if c.status == http.StatusUnauthorized {
			assert.Equal(t, `Bearer realm="bandplane"`, w.Header().Get("WWW-Authenticate"))
			assert.NotContains(t, w.Body.String(), tok)
		}
	}
	assert.Equal(t, []string{"", tok}, seen)
}
