package graph

import (
	"context"
	"fmt"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// Every field is authorized with the request's API key (schema/README.md, "Keys and roles"): the
// key must have one of the field's roles, and may read only its own organization (a
// platform key, org '*', may name any). The roles of each field are in graph/README.md.
var (
	// readers may read costs and usage.
	readers = []keys.Role{keys.RoleViewer, keys.RoleManager, keys.RoleCompliance, keys.RoleAdmin}
	// auditors may read the audit trail, message content included.
	auditors = []keys.Role{keys.RoleCompliance, keys.RoleAdmin}
	// managers may read who talks too much.
	managers = []keys.Role{keys.RoleManager, keys.RoleAdmin}
	// denialWatchers may follow denied decisions live.
	denialWatchers = []keys.Role{keys.RoleManager, keys.RoleCompliance, keys.RoleAdmin}
)

// begin starts a field that reads an organization's data from ClickHouse. It checks
// the request's key (one lookup): the key must exist and have one of roles, and the
// organization read is the key's own, which orgID (the field's argument, nil when not
// given) may only repeat; a platform key must name one. It then takes one of the key's
// query slots (Limits.MaxConcurrentPerKey) and returns the organization and the func
// that gives the slot back once the read is done.
func (r *Resolver) begin(ctx context.Context, orgID *string, roles []keys.Role) (string, func(), error) {
	k, org, err := r.authorize(ctx, orgID, roles)
	if err != nil {
		return "", nil, err
	}
	done, err := r.slots.acquire(ctx, k)
	return org, done, err
}

// authorize checks the request's key for a field of roles reading orgID (see begin),
// and returns the key and the organization read.
func (r *Resolver) authorize(ctx context.Context, orgID *string, roles []keys.Role) (keys.Key, string, error) {
	token := keys.TokenFrom(ctx)
	if token == "" {
		return keys.Key{}, "", fmt.Errorf("no API key: send Authorization: Bearer <key> (over WebSocket: in the init payload): %w", schema.ErrUnauthenticated)
	}
	k, ok := r.auth.Lookup(ctx, token)
	if !ok {
		return keys.Key{}, "", fmt.Errorf("unknown or revoked API key: %w", schema.ErrUnauthenticated)
	}
	if !k.Has(roles...) {
		return keys.Key{}, "", fmt.Errorf("key %s has role %s; this field needs one of %s: %w", k.ID, k.Role, keys.RoleList(roles), schema.ErrForbidden)
	}
	org := k.Org
	if orgID != nil && *orgID != "" {
		org = *orgID
	} else if k.Platform() {
		return keys.Key{}, "", &schema.FieldError{Field: "orgId", Reason: "required with a platform key (organization '*'): name the organization to read"}
	}
	if !k.MayActOn(org) {
		return keys.Key{}, "", fmt.Errorf("key %s of organization %q may not read organization %q: %w", k.ID, k.Org, org, schema.ErrForbidden)
	}
	return k, org, nil
}

// authorizeKey checks the request's key for a field of roles that reads or changes
// what every organization shares: orgId need not be given, even with a platform key,
// and when given must be one the key may act on.
func (r *Resolver) authorizeKey(ctx context.Context, orgID *string, roles []keys.Role) (keys.Key, error) {
	if orgID == nil || *orgID == "" {
		k, ok := r.auth.Lookup(ctx, keys.TokenFrom(ctx))
		if ok && k.Platform() {
			star := keys.PlatformOrg
			orgID = &star
		}
	}
	k, _, err := r.authorize(ctx, orgID, roles)
	return k, err
}

// keyedIntrospection answers introspection (__schema, __type) to a request with a valid
// API key only, like every other field: the schema tells an attacker what to ask for.
// __typename stays open: clients add it to every selection.
type keyedIntrospection struct{ auth keys.Authenticator }

func (keyedIntrospection) ExtensionName() string                   { return "KeyedIntrospection" }
func (keyedIntrospection) Validate(graphql.ExecutableSchema) error { return nil }

func (k keyedIntrospection) MutateOperationContext(ctx context.Context, oc *graphql.OperationContext) *gqlerror.Error {
	token := keys.TokenFrom(ctx)
	if token != "" {
		if _, ok := k.auth.Lookup(ctx, token); ok {
			oc.DisableIntrospection = false
			return nil
		}
	}
	oc.DisableIntrospection = true
	if oc.Operation != nil && introspects(oc.Operation.SelectionSet, oc.Doc, map[string]bool{}) {
		return &gqlerror.Error{Message: "introspection needs an API key: send Authorization: Bearer <key>",
			Extensions: map[string]any{"code": "UNAUTHENTICATED"}}
	}
	return nil
}

// introspects says whether a selection set asks for __schema or __type, through
// fragments too (each named fragment is looked at once).
func introspects(set ast.SelectionSet, doc *ast.QueryDocument, seen map[string]bool) bool {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if s.Name == "__schema" || s.Name == "__type" || introspects(s.SelectionSet, doc, seen) {
				return true
			}
		case *ast.InlineFragment:
			if introspects(s.SelectionSet, doc, seen) {
				return true
			}
		case *ast.FragmentSpread:
			if seen[s.Name] || doc == nil {
				continue
			}
			seen[s.Name] = true
			if f := doc.Fragments.ForName(s.Name); f != nil && introspects(f.SelectionSet, doc, seen) {
				return true
			}
		}
	}
	return false
}
