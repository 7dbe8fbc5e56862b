package keys

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Authenticator finds the active key of a token (Cache implements it). Lookup may
// block on a read of the key store, bounded by ctx.
type Authenticator interface {
	Lookup(ctx context.Context, token string) (Key, bool)
}

// Holder is an Authenticator that also answers from the keys it holds alone, never
// reading the store (Cache): a check repeated for many open connections uses it, so
// that unknown or revoked tokens cost no read each.
type Holder interface {
	Authenticator
	Held(token string) (Key, bool)
}

// Error codes of the JSON errors Require and Forbidden write.
const (
	CodeUnauthenticated = "unauthenticated"
	CodeForbidden       = "forbidden"
)

// ErrorBody is every JSON error of bandplane's HTTP surfaces.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// maxBearerBytes bounds the token Bearer accepts (a key's token is 47 bytes).
const maxBearerBytes = 1024

var errMalformed = errors.New(`malformed Authorization header: want "Bearer <API key>"`)

// Bearer returns the token of the request's Authorization header: "" and nil when there
// is none, an error when there are several or the one is not "Bearer <token>"
// (ParseBearer). The error never repeats the header's value (it may be a secret).
func Bearer(r *http.Request) (string, error) {
	vals := r.Header.Values("Authorization")
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		if vals[0] == "" {
			return "", errMalformed // sent, but empty
		}
		return ParseBearer(vals[0])
	default:
		return "", fmt.Errorf("%d Authorization headers: send one", len(vals))
	}
}

// ParseBearer returns the token of one Authorization value, from a header or a
// WebSocket init payload: "" and nil for "", an error unless it is "Bearer <token>"
// with a token of at most 1 KiB of printable ASCII. The error never repeats the value.
func ParseBearer(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errMalformed
	}
	token = strings.Trim(token, " \t")
	if token == "" || len(token) > maxBearerBytes {
		return "", errMalformed
	}
	for _, c := range []byte(token) {
		if c <= ' ' || c >= 0x7f { // RFC 6750 token68 is printable ASCII without spaces
			return "", errMalformed
		}
	}
	return token, nil
}

// Token admits every request whose Authorization header is absent or well formed and
// puts its token ("" for none) in the request's context (TokenFrom), for surfaces that
// decide per operation whether a key is needed (GraphQL). A malformed header is 401.
func Token(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := Bearer(r)
		if err != nil {
			unauthenticated(w, err.Error())
			return
		}
		next.ServeHTTP(w, r.WithContext(WithToken(r.Context(), token)))
	})
}

type tokenCtx struct{}

// WithToken returns ctx carrying a bearer token (Token does it for every request).
func WithToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenCtx{}, token)
}

// TokenFrom returns the token Token found, "" for none.
func TokenFrom(ctx context.Context) string {
	t, _ := ctx.Value(tokenCtx{}).(string)
	return t
}

// Require admits requests whose bearer token is an active key with one of roles (any
// active key when roles is empty) and puts the key in the request's context. Otherwise
// it answers 401 (no, malformed, unknown or revoked key; with WWW-Authenticate) or 403
// (the key's role is not one of roles), each with an ErrorBody saying which.
func Require(a Authenticator, roles ...Role) func(http.Handler) http.Handler {
	roles = append([]Role(nil), roles...)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			token, err := Bearer(r)
			switch {
			case err != nil:
				unauthenticated(w, err.Error())
				return
			case token == "":
				unauthenticated(w, `missing API key: send "Authorization: Bearer <API key>"`)
				return
			}
			k, ok := a.Lookup(r.Context(), token)
			if !ok {
				unauthenticated(w, "unknown or revoked API key")
				return
			}
			if len(roles) > 0 && !k.Has(roles...) {
				WriteError(w, http.StatusForbidden, CodeForbidden,
					fmt.Sprintf("key %s has role %s; %s %s needs one of: %s", k.ID, k.Role, r.Method, r.URL.Path, RoleList(roles)))
				return
			}
			next.ServeHTTP(w, r.WithContext(WithKey(r.Context(), k)))
		})
	}
}

func unauthenticated(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="bandplane"`)
	WriteError(w, http.StatusUnauthorized, CodeUnauthenticated, msg)
}

type keyCtx struct{}

// WithKey returns ctx carrying k (Require does it for every admitted request).
func WithKey(ctx context.Context, k Key) context.Context {
	return context.WithValue(ctx, keyCtx{}, k)
}

// FromContext returns the key Require admitted the request with.
func FromContext(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyCtx{}).(Key)
	return k, ok
}

// WriteJSON is bandplane's one JSON writer: Content-Type, status, body.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes {"error": message, "code": code}.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	WriteJSON(w, status, ErrorBody{Error: message, Code: code})
}

// Forbidden answers 403 for key k acting on organization org, which is not its own.
func Forbidden(w http.ResponseWriter, k Key, org string) {
	WriteError(w, http.StatusForbidden, CodeForbidden,
		fmt.Sprintf("key %s (%s) of organization %s may not act on organization %s", k.ID, k.Role, k.Org, org))
}
