// Package keys owns bandplane's API keys: the roles, the key store in ClickHouse
// (api_keys, only SHA-256 digests of tokens), the audit events of key creation and
// revocation, the in-memory cache every HTTP surface authenticates against, and the
// HTTP middleware and JSON error writers those surfaces share.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package keys

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bandplane/bandplane/schema"
)

// Role is what a key may do. Roles do not nest: an endpoint lists every role it
// admits, admin included.
type Role string

const (
	RoleIngest     Role = "ingest"     // POST /v1/events
	RoleRouter     Role = "router"     // /v1/decisions/*, /v1/peers
	RoleViewer     Role = "viewer"     // GraphQL: costs, usage, work status, agents, rooms
	RoleManager    Role = "manager"    // viewer + chatty agents, budgets
	RoleCompliance Role = "compliance" // viewer + audit events with content, decisions, contact requests
	RoleOperator   Role = "operator"   // suspend, resume, policy reload
	RoleAdmin      Role = "admin"      // everything of its organization (readers and operator)
)

// Roles are all roles, in the order above.
var Roles = []Role{RoleIngest, RoleRouter, RoleViewer, RoleManager, RoleCompliance, RoleOperator, RoleAdmin}

// Valid says whether r is one of Roles.
func (r Role) Valid() bool {
	for _, v := range Roles {
		if r == v {
			return true
		}
	}
	return false
}

// ParseRole reads a role name; the error lists the valid ones.
func ParseRole(s string) (Role, error) {
	if r := Role(s); r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (valid: %s)", s, RoleList(Roles))
}

// RoleList names roles for a message: "compliance, admin".
func RoleList(roles []Role) string {
	s := make([]string, len(roles))
	for i, r := range roles {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// PlatformOrg is the organization of a platform key (the routing core's): it acts on
// every organization.
const PlatformOrg = "*"

// MaxNameBytes bounds a key's name.
const MaxNameBytes = 256

// Key is an API key as everyone but its holder sees it: never its token or the token's
// digest.
type Key struct {
	ID        string    `json:"id"`
	Org       string    `json:"org"`
	Role      Role      `json:"role"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
}

// Platform says whether k is a platform key.
func (k Key) Platform() bool { return k.Org == PlatformOrg }

// Active says whether k has not been revoked.
func (k Key) Active() bool { return k.RevokedAt.IsZero() }

// MayActOn says whether k may read or write org's data: a platform key may act on
// every organization, any other key only on its own.
func (k Key) MayActOn(org string) bool { return k.Platform() || (org != "" && org == k.Org) }

// Has says whether k's role is one of roles. Admin is not implied: callers list it.
func (k Key) Has(roles ...Role) bool {
	for _, r := range roles {
		if k.Role == r {
			return true
		}
	}
	return false
}

// ValidateOrg checks the organization of a new key: PlatformOrg, or an organization id
// (non-empty, at most schema.MaxIDBytes, valid UTF-8, no control characters, no '*').
func ValidateOrg(org string) error {
	switch {
	case org == PlatformOrg:
		return nil
	case org == "":
		return errors.New("organization is empty (give an organization id, or '*' for a platform key)")
	case len(org) > schema.MaxIDBytes:
		return fmt.Errorf("organization is %d bytes long, more than %d", len(org), schema.MaxIDBytes)
	case strings.Contains(org, PlatformOrg):
		return fmt.Errorf("organization %q contains '*': '*' alone is a platform key, and no organization id has one", org)
	}
	return checkText("organization", org)
}

// validateName checks a key's name (optional: "" is allowed).
func validateName(name string) error {
	if len(name) > MaxNameBytes {
		return fmt.Errorf("name is %d bytes long, more than %d", len(name), MaxNameBytes)
	}
	return checkText("name", name)
}

// validateBy checks who created or revoked a key (the audit event's actor).
func validateBy(by string) error {
	switch {
	case by == "":
		return errors.New("who acts is empty (--by)")
	case len(by) > schema.MaxIDBytes:
		return fmt.Errorf("who acts (--by) is %d bytes long, more than %d", len(by), schema.MaxIDBytes)
	}
	return checkText("who acts (--by)", by)
}

func checkText(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s %q has a control character at byte %d", what, s, i)
		}
	}
	return nil
}

// Tokens are TokenPrefix and the unpadded base64url form of tokenBytes random bytes:
// 256 bits of entropy, recognisable in a leaked log or a secret scanner.
const (
	TokenPrefix = "bpk_"
	tokenBytes  = 32
)

var tokenLen = len(TokenPrefix) + base64.RawURLEncoding.EncodedLen(tokenBytes)

func newToken() string {
	var b [tokenBytes]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// wellFormed says whether token could be one newToken made; anything else is refused
// before any digest or store read.
func wellFormed(token string) bool {
	if len(token) != tokenLen || !strings.HasPrefix(token, TokenPrefix) {
		return false
	}
	for _, c := range []byte(token[len(TokenPrefix):]) {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') { //nolint:staticcheck // reads as the set of bytes a token may hold
			return false
		}
	}
	return true
}

// digest is the SHA-256 of a token, the only form of it that is stored.
func digest(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

func digestHex(token string) string {
	d := digest(token)
	return hex.EncodeToString(d[:])
}
