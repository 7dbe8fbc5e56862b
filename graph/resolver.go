// Package graph owns bandplane's GraphQL API (gqlgen): the schema, its resolvers over
// the query package, the HTTP and WebSocket handler, and the authorization hook. The
// code in generated/ and model/ is generated: see README.md.
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
	"github.com/bandplane/bandplane/policy/keys"
	"github.com/bandplane/bandplane/query"
)

// Querier is what the resolvers read. *query.Querier implements it; tests use a fake.
// Both methods block on the database and return an error matching query.IsInvalid
// for the caller's mistakes, any other error for failures.
type Querier interface {
	Costs(ctx context.Context, q query.CostQuery) ([]query.CostRow, error)
	Names(ctx context.Context, orgID string, ids []string) (map[string]query.Party, error)
	AuditEvents(ctx context.Context, q query.AuditQuery) (query.AuditPage, error)
}

var _ Querier = (*query.Querier)(nil)

// Resolver is gqlgen's root resolver.
type Resolver struct {
	q       Querier
	auth    keys.Authenticator
	log     *slog.Logger
	timeout time.Duration // Limits.QueryTimeout, for its error message
	slots   *keySlots
}

// fail turns err into what the client sees: its own mistakes and authorization
// failures as they are, with a code; anything else is logged here and reported as an
// internal error, so database details do not leak.
func (r *Resolver) fail(ctx context.Context, err error) error {
	code := ""
	switch {
	case query.IsInvalid(err):
		code = "BAD_USER_INPUT"
	case errors.Is(err, ErrUnauthenticated):
		code = "UNAUTHENTICATED"
	case errors.Is(err, ErrForbidden):
		code = "FORBIDDEN"
	case errors.Is(err, ErrTooMany):
		code = "TOO_MANY_REQUESTS"
	case errors.Is(err, context.Canceled) || ctx.Err() == context.Canceled:
		// The client went away (a disconnect, a WebSocket "complete"): nothing to report.
		r.log.DebugContext(ctx, "field cancelled by the client", "field", graphql.GetFieldContext(ctx).Field.Name)
		return &gqlerror.Error{Message: "cancelled", Path: graphql.GetPath(ctx), Extensions: map[string]any{"code": "CANCELLED"}}
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
}

// name sets handle and name from the directory entry of id, if there is one.
func name(names map[string]query.Party, id string, handle, display **string) {
	if p, ok := names[id]; ok && id != "" {
		*handle, *display = &p.Handle, &p.Name
	}
}

func costRow(r query.CostRow, groupBy []string, names map[string]query.Party) model.CostRow {
	out := model.CostRow{
		Events: int64(r.Events), UnpricedEvents: int64(r.UnpricedEvents),
		InputTokens: int64(r.InputTokens), OutputTokens: int64(r.OutputTokens),
		CacheReadTokens: int64(r.CacheReadTokens), CacheWriteTokens: int64(r.CacheWriteTokens),
		ReasoningTokens: int64(r.ReasoningTokens),
		Cost:            r.Cost.StringFixed(6), Currency: r.Currency,
	}
	// Only grouped keys are set: an empty owner of a grouped row ("" in the table) is
	// a value, an ungrouped one is null.
	for _, d := range groupBy {
		switch d {
		case query.DimOwner:
			out.OwnerID = &r.OwnerID
			name(names, r.OwnerID, &out.OwnerHandle, &out.OwnerName)
		case query.DimAgent:
			out.AgentID = &r.AgentID
			name(names, r.AgentID, &out.AgentHandle, &out.AgentName)
		case query.DimRoom:
			out.RoomID = &r.RoomID
		case query.DimModel:
			out.Model = &r.Model
		case query.DimHour:
			out.Hour = &r.Hour
		case query.DimDay:
			out.Day = &r.Day
		}
	}
	return out
}

func auditEvent(e query.Event) model.AuditEvent {
	return model.AuditEvent{
		ID: e.ID, Type: e.Type, Time: e.Time, OrgID: e.OrgID, RoomID: e.RoomID,
		ActorID: e.ActorID, ActorType: e.ActorType, ActorHandle: e.ActorHandle, OwnerID: e.OwnerID,
		SubjectID: e.SubjectID, SubjectType: e.SubjectType, SubjectHandle: e.SubjectHandle,
		ExecutionID: e.ExecutionID, Source: e.Source, SchemaVersion: int(e.SchemaVersion), Data: e.Data,
		IngestedAt: e.IngestedAt, KafkaPartition: int(e.KafkaPartition), KafkaOffset: e.KafkaOffset,
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
