// Package graph owns bandplane's GraphQL API (gqlgen): the schema, its resolvers over
// the query package, the HTTP and WebSocket handler, and the authorization hook. The
// code in generated/ and model/ is generated: see README.md.
//
// It may import ingest/, policy/, query/, schema/ and its own folder's packages, never
// deploy/ or cmd/ (deploy/layers).
package graph

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/work"
)

// Querier is what the resolvers read. *query.Querier implements it; tests use a fake.
// Both methods block on the database and return an error matching schema.ErrInvalid
// for the caller's mistakes, any other error for failures.
type Querier interface {
	Costs(ctx context.Context, q query.CostQuery) (query.CostReport, error)
	UsageSeries(ctx context.Context, q query.SeriesQuery) ([]query.Series, error)
	Delegation(ctx context.Context, q query.DelegationQuery) (query.Delegation, error)
	CrossOwnerSpend(ctx context.Context, q query.CrossOwnerQuery) (query.CrossOwnerSpend, error)
	ChattyAgents(ctx context.Context, q query.ChattyQuery) ([]query.ChattyAgent, error)
	Names(ctx context.Context, orgID string, ids []string) (map[string]query.Party, error)
	RoomNames(ctx context.Context, orgID string, ids []string) (map[string]string, error)
	AuditEvents(ctx context.Context, q query.AuditQuery) (query.AuditPage, error)
	ContactRequests(ctx context.Context, q query.ContactQuery) (query.ContactPage, error)
	PolicyDecisions(ctx context.Context, q query.DecisionQuery) (query.DecisionPage, error)
	WorkStatus(ctx context.Context, q query.WorkQuery) (query.WorkStatus, error)
	Agents(ctx context.Context, q query.AgentQuery) ([]query.Agent, error)
	Rooms(ctx context.Context, q query.RoomQuery) ([]query.Room, error)
}

var _ Querier = (*query.Querier)(nil)

// Resolver is gqlgen's root resolver.
type Resolver struct {
	q       Querier
	auth    keys.Holder
	log     *slog.Logger
	timeout time.Duration // Limits.QueryTimeout, for its error message
	slots   readSlots
	// maxResponse is Limits.MaxResponseBytes, named in the refusal.
	maxResponse int64
	hub         *Hub // nil: subscriptions answer UNAVAILABLE

	operator Operator      // nil: budgets and operator mutations answer UNAVAILABLE
	currency string        // the billing currency of budgets
	prices   Prices        // nil: prices and jobs answer UNAVAILABLE
	replays  PolicyReplays // nil: policy replays answer UNAVAILABLE
}

// fail turns err into what the client sees: its own mistakes and authorization
// failures as they are, with a code; anything else is logged here and reported as an
// internal error, so database details do not leak.
func (r *Resolver) fail(ctx context.Context, err error) error {
	code := ""
	switch {
	case errors.Is(err, schema.ErrInvalid):
		code = "BAD_USER_INPUT"
	case errors.Is(err, schema.ErrUnauthenticated):
		code = "UNAUTHENTICATED"
	case errors.Is(err, schema.ErrForbidden):
		code = "FORBIDDEN"
	case errors.Is(err, schema.ErrTooMany), errors.Is(err, ErrTooManySubscriptions):
		code = "TOO_MANY_REQUESTS"
	case errors.Is(err, context.Canceled) || ctx.Err() == context.Canceled:
		// The client went away (a disconnect, a WebSocket "complete"): nothing to report.
		r.log.DebugContext(ctx, "field cancelled by the client", "field", graphql.GetFieldContext(ctx).Field.Name)
		return &gqlerror.Error{Message: "cancelled", Path: graphql.GetPath(ctx), Extensions: map[string]any{"code": "CANCELLED"}}
	case query.IsResponseTooLarge(err):
		r.log.InfoContext(ctx, "response over its byte budget", "field", graphql.GetFieldContext(ctx).Field.Name, "err", err)
		return &gqlerror.Error{Message: fmt.Sprintf("the answer is larger than %d bytes, the most one response may carry (--graphql-max-response-bytes): "+
			"ask for fewer rows (limit) or leave out large fields (data)", r.maxResponse),
			Path: graphql.GetPath(ctx), Extensions: map[string]any{"code": "RESPONSE_TOO_LARGE"}}
	case errors.Is(err, query.ErrTimeout):
		// The error names the database; the client gets the limit instead.
		r.log.WarnContext(ctx, "query timed out", "field", graphql.GetFieldContext(ctx).Field.Name, "err", err)
		return &gqlerror.Error{Message: fmt.Sprintf("the query took longer than %s (--graphql-query-timeout); narrow its time range or filters", r.timeout),
			Path: graphql.GetPath(ctx), Extensions: map[string]any{"code": "TIMEOUT"}}
	}
	if code == "" {
		fc := graphql.GetFieldContext(ctx)
		r.log.ErrorContext(ctx, "cannot resolve field", "field", fc.Field.Name, "err", err)
		return &gqlerror.Error{Message: "internal error", Path: graphql.GetPath(ctx),
			Extensions: map[string]any{"code": "INTERNAL_SERVER_ERROR"}}
	}
	return &gqlerror.Error{Message: strings.ReplaceAll(err.Error(), "\n", "; "), Path: graphql.GetPath(ctx),
		Extensions: map[string]any{"code": code}}
}

var dimensions = map[model.CostDimension]string{
	model.CostDimensionOwner: query.DimOwner,
	model.CostDimensionAgent: query.DimAgent,
	model.CostDimensionRoom:  query.DimRoom,
	model.CostDimensionModel: query.DimModel,
	model.CostDimensionHour:  query.DimHour,
	model.CostDimensionDay:   query.DimDay,

	model.CostDimensionInitiator:      query.DimInitiator,
	model.CostDimensionInitiatorOwner: query.DimInitiatorOwner,
	model.CostDimensionChainDepth:     query.DimChainDepth,
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func costFilter(f *model.CostFilter) query.CostFilter {
	if f == nil {
		return query.CostFilter{}
	}
	return query.CostFilter{OwnerIDs: f.OwnerIds, AgentIDs: f.AgentIds, RoomIDs: f.RoomIds, Models: f.Models,
		InitiatorIDs: f.InitiatorIds, InitiatorOwnerIDs: f.InitiatorOwnerIds, ChainDepths: f.ChainDepths}
}

func outcomeOf(o *model.DecisionOutcome) string {
	switch {
	case o == nil:
		return ""
	case *o == model.DecisionOutcomeAllowed:
		return "allowed"
	default:
		return "denied"
	}
}

// stuckAfter is the hub's stuck time, so queries and live changes agree.
func (r *Resolver) stuckAfter() time.Duration {
	if r.hub == nil {
		return work.DefaultStuckAfter
	}
	return r.hub.StuckAfter()
}

// subscribe authorizes a subscription field. A client's subscription is registered
// with the hub and handed to the WebSocket transport, which delivers it (it returns a
// nil channel then); a render group's own execution reads the changes its group feeds
// it (wstransport.go). It takes no query slot: a subscription reads nothing from
// ClickHouse.
func (r *Resolver) subscribe(ctx context.Context, orgID, roomID *string, roles []keys.Role, kind subKind) (<-chan *change, error) {
	// A render group's execution: each of its members was authorized on its own.
	if feed, ok := ctx.Value(renderKey{}).(*renderFeed); ok {
		feed.taken.Store(true)
		return feed.ch, nil
	}
	k, org, err := r.authorize(ctx, orgID, roles)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	if roomID != nil && len(*roomID) > 256 {
		return nil, r.fail(ctx, &schema.FieldError{Field: "roomId", Reason: "longer than 256 bytes"})
	}
	if r.hub == nil {
		return nil, &gqlerror.Error{Message: "live updates are not running in this process", Path: graphql.GetPath(ctx),
			Extensions: map[string]any{"code": "UNAVAILABLE"}}
	}
	slot, ok := ctx.Value(liveKey{}).(*liveSlot)
	if !ok {
		return nil, &gqlerror.Error{Message: "subscriptions are served over WebSocket (graphql-transport-ws)", Path: graphql.GetPath(ctx),
			Extensions: map[string]any{"code": "BAD_REQUEST"}}
	}
	// Checked again every hub tick from the keys the process holds (no store read):
	// a key revoked elsewhere ends its subscriptions within a refresh of the cache,
	// one whose key.revoked event the live reader sees at once (Hub.apply).
	token := keys.TokenFrom(ctx)
	valid := func() bool {
		k, ok := r.auth.Held(token)
		return ok && k.Has(roles...) && k.MayActOn(org)
	}
	ch, err := r.hub.subscribe(ctx, k.ID, org, deref(roomID), kind, valid)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	slot.in, slot.group = ch, groupKey{org: org, role: k.Role}
	return nil, nil
}
