package graph

import (
	"context"
	"errors"
	"net/http"
	"strings"
)

// Authorizer decides whether the caller holding token may read orgID's data. It is
// asked before every query, may block on a token store, and returns nil to allow, or
// an error wrapping ErrUnauthenticated (no or unknown token) or ErrForbidden (the token
// is not valid for orgID). token is "" when the request carried none.
//
// Per-organization bearer tokens are a later issue; until then the server allows
// everything (AllowAll).
type Authorizer interface {
	AuthorizeOrg(ctx context.Context, token, orgID string) error
}

// Errors an Authorizer returns; the API reports them as UNAUTHENTICATED and FORBIDDEN.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
)

// AllowAll is the Authorizer used until tokens exist: every caller may read every org.
type AllowAll struct{}

func (AllowAll) AuthorizeOrg(context.Context, string, string) error { return nil }

type tokenKey struct{}

// withToken records the request's bearer token for the resolvers.
func withToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

func tokenFrom(ctx context.Context) string {
	t, _ := ctx.Value(tokenKey{}).(string)
	return t
}

// parseBearer returns the token of an Authorization value; "" is no token, and
// anything other than "Bearer <token>" is an error.
func parseBearer(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	scheme, token, ok := strings.Cut(v, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errors.New(`malformed Authorization: want "Bearer <token>"`)
	}
	return token, nil
}

// bearer reads the optional Authorization header of HTTP requests and of the
// WebSocket upgrade. Browsers cannot set headers on a WebSocket, so the transport's
// init payload may carry it instead (see NewHandler).
func bearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := parseBearer(r.Header.Get("Authorization"))
		if err != nil {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(withToken(r.Context(), token)))
	})
}
