package keys

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeAuth knows tokens by value.
type fakeAuth map[string]Key

func (f fakeAuth) Lookup(_ context.Context, token string) (Key, bool) {
	k, ok := f[token]
	return k, ok && k.Active()
}

func TestBearer(t *testing.T) {
	tok := newToken()
	for _, c := range []struct {
		name    string
		headers []string
		want    string
		err     string
	}{
		{name: "absent"},
		{name: "bearer", headers: []string{"Bearer " + tok}, want: tok},
		{name: "scheme case", headers: []string{"bearer " + tok}, want: tok},
		{name: "extra spaces", headers: []string{"Bearer   " + tok + " "}, want: tok},
		{name: "empty value", headers: []string{""}, err: "malformed"},
		{name: "no scheme", headers: []string{tok}, err: "malformed"},
		{name: "basic", headers: []string{"Basic dXNlcjpwYXNz"}, err: "malformed"},
		{name: "bearer only", headers: []string{"Bearer"}, err: "malformed"},
		{name: "bearer space", headers: []string{"Bearer "}, err: "malformed"},
		{name: "two tokens", headers: []string{"Bearer a b"}, err: "malformed"},
		{name: "control", headers: []string{"Bearer a\x01b"}, err: "malformed"},
		{name: "non-ascii", headers: []string{"Bearer tökén"}, err: "malformed"},
		{name: "huge", headers: []string{"Bearer " + strings.Repeat("a", 2000)}, err: "malformed"},
		{name: "two headers", headers: []string{"Bearer " + tok, "Bearer " + tok}, err: "2 Authorization headers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, h := range c.headers {
				r.Header.Add("Authorization", h)
			}
			got, err := Bearer(r)
			if c.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.err)
				assert.NotContains(t, err.Error(), tok, "the error never repeats a secret")
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestRequire(t *testing.T) {
	router := Key{ID: "k-router", Org: PlatformOrg, Role: RoleRouter}
	viewer := Key{ID: "k-viewer", Org: "acme", Role: RoleViewer}
	revoked := Key{ID: "k-old", Org: PlatformOrg, Role: RoleRouter}
	revoked.RevokedAt = revoked.RevokedAt.AddDate(2026, 0, 0)
	auth := fakeAuth{"tok-router": router, "tok-viewer": viewer, "tok-old": revoked}

	var seen Key
	h := Require(auth, RoleRouter, RoleAdmin)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, ok := FromContext(r.Context())
		require.True(t, ok)
		seen = k
		WriteJSON(w, http.StatusOK, map[string]bool{"ok": true})
	}))

	for _, c := range []struct {
		name   string
		auth   string
		status int
		code   string
		msg    string
	}{
		{name: "missing", status: 401, code: "unauthenticated", msg: `missing API key: send "Authorization: Bearer <API key>"`},
		{name: "malformed", auth: "Token tok-router", status: 401, code: "unauthenticated", msg: `malformed Authorization header: want "Bearer <API key>"`},
		{name: "unknown", auth: "Bearer tok-nobody", status: 401, code: "unauthenticated", msg: "unknown or revoked API key"},
		{name: "revoked", auth: "Bearer tok-old", status: 401, code: "unauthenticated", msg: "unknown or revoked API key"},
		{name: "wrong role", auth: "Bearer tok-viewer", status: 403, code: "forbidden",
			msg: "key k-viewer has role viewer; POST /v1/decisions/peer_visible needs one of: router, admin"},
		{name: "ok", auth: "Bearer tok-router", status: 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			seen = Key{}
			r := httptest.NewRequest(http.MethodPost, "/v1/decisions/peer_visible", nil)
			if c.auth != "" {
				r.Header.Set("Authorization", c.auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Equal(t, c.status, w.Code)
			assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
			if c.status == 200 {
				assert.Equal(t, router, seen)
				assert.Empty(t, w.Header().Get("WWW-Authenticate"))
				return
			}
			assert.Zero(t, seen, "the handler did not run")
			var body ErrorBody
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body), w.Body.String())
			assert.Equal(t, c.code, body.Code)
			assert.Equal(t, c.msg, body.Error)
			if c.status == 401 {
				assert.Equal(t, `Bearer realm="bandplane"`, w.Header().Get("WWW-Authenticate"))
			} else {
				assert.Empty(t, w.Header().Get("WWW-Authenticate"))
			}
			assert.NotContains(t, w.Body.String(), "tok-", "no token echoed")
		})
	}
}

func TestRequireNoRolesAdmitsAnyActiveKey(t *testing.T) {
	auth := fakeAuth{"tok": {ID: "k", Org: "acme", Role: RoleViewer}}
	h := Require(auth)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer tok")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, 204, w.Code)
}

func TestForbiddenAndWriteError(t *testing.T) {
	w := httptest.NewRecorder()
	Forbidden(w, Key{ID: "k1", Org: "acme", Role: RoleViewer}, "globex")
	assert.Equal(t, 403, w.Code)
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.JSONEq(t, `{"error":"key k1 (viewer) of organization acme may not act on organization globex","code":"forbidden"}`, w.Body.String())

	w = httptest.NewRecorder()
	WriteError(w, http.StatusBadRequest, "bad_request", "body is empty")
	assert.Equal(t, 400, w.Code)
	assert.JSONEq(t, `{"error":"body is empty","code":"bad_request"}`, w.Body.String())
}

func TestContextKey(t *testing.T) {
	_, ok := FromContext(context.Background())
	assert.False(t, ok)
	k := Key{ID: "k1", Org: "acme", Role: RoleAdmin}
	got, ok := FromContext(WithKey(context.Background(), k))
	require.True(t, ok)
	assert.Equal(t, k, got)
}

// Require on the real Cache: a key created after the cache loaded is admitted at the
// early refresh, a revoked one refused at the next read.
func TestRequireWithCache(t *testing.T) {
	src := &fakeSource{}
	clock := &fakeClock{}
	c := newTestCache(t, src, clock, nil)
	require.NoError(t, c.Load(context.Background()))
	h := Require(c, RoleIngest)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) }))
	do := func(tok string) int {
		r := httptest.NewRequest(http.MethodPost, "/v1/events", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	tok := src.add("k1", "acme", RoleIngest)
	clock.advance(time.Second)
	assert.Equal(t, http.StatusAccepted, do(tok))
	src.revoke("k1")
	require.NoError(t, c.refresh(context.Background(), false, false))
	assert.Equal(t, http.StatusUnauthorized, do(tok))
}
