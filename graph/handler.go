package graph

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/coder/websocket"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/bandplane/bandplane/graph/generated"
	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/policy/keys"
	"github.com/bandplane/bandplane/query"
)

// Limits bound what one client can make the API do. Zero fields take the defaults.
type Limits struct {
	// MaxBodyBytes bounds a POST body (default 1 MiB); a larger one is answered 413.
	MaxBodyBytes int64
	// MaxTokens bounds the tokens the parser reads of one query document (default
	// 10,000): a huge or deeply nested query is refused before it is parsed further.
	MaxTokens int
	// MaxComplexity bounds what one operation may ask for (default 50,000): a field
	// counts once, an auditEvents page its selection once per event it may return
	// (limit), a costs field once per row it may return (query.DefaultCostLimit);
	// aliases add up.
	MaxComplexity int
	// MaxWebSockets bounds the open WebSocket connections (default 256); an upgrade
	// over it is answered 503.
	MaxWebSockets int
	// InitTimeout is how long a WebSocket may take to send its init message (default
	// 10 s).
	InitTimeout time.Duration
}

func (l *Limits) defaults() {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = 1 << 20
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = 10_000
	}
	if l.MaxComplexity <= 0 {
		l.MaxComplexity = 50_000
	}
	if l.MaxWebSockets <= 0 {
		l.MaxWebSockets = 256
	}
	if l.InitTimeout <= 0 {
		l.InitTimeout = 10 * time.Second
	}
}

// Option configures NewHandler.
type Option func(*config)

type config struct {
	log     *slog.Logger
	origins []string
	limits  Limits
}

// WithLogger sets the logger internal errors are logged to (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithOriginPatterns lets WebSocket clients served from other hosts connect (patterns
// as in coder/websocket's AcceptOptions, e.g. "grafana.example.com"). By default only
// same-origin browsers (and non-browser clients) may.
func WithOriginPatterns(p ...string) Option { return func(c *config) { c.origins = p } }

// WithLimits sets the request limits (see Limits for the defaults).
func WithLimits(l Limits) Option { return func(c *config) { c.limits = l } }

// NewHandler serves the GraphQL API over POST, GET and WebSocket (graphql-ws and
// graphql-transport-ws, on coder/websocket). Every field checks the request's API key
// with auth (*keys.Cache in production). *query.Querier is the production Querier.
func NewHandler(q Querier, auth keys.Authenticator, opts ...Option) http.Handler {
	cfg := config{log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.limits.defaults()
	gc := generated.Config{Resolvers: &Resolver{q: q, auth: auth, log: cfg.log.With("component", "graph")}}
	// A field's cost is what it can return: an audit page costs its selection once per
	// event it may hold, so limit: 10000 counts 10,000 times and aliases cannot multiply
	// pages past MaxComplexity.
	gc.Complexity.Query.AuditEvents = func(child int, _ string, _, _ *time.Time, _, _ *string, _ []string, limit *int, _ *string) int {
		n := query.DefaultAuditLimit
		if limit != nil && *limit > 0 {
			n = min(*limit, query.MaxAuditLimit)
		}
		return 1 + child*n
	}
	gc.Complexity.Query.Costs = func(child int, _ string, _, _ time.Time, _ []model.CostDimension) int {
		return 1 + child*query.DefaultCostLimit
	}
	es := generated.NewExecutableSchema(gc)
	srv := handler.New(es)
	// handler.New registers no transport; the WebSocket one is built on coder/websocket.
	srv.AddTransport(transport.Websocket{
		Implementation: transport.CoderWebsocketImplementation{
			AcceptOptions: websocket.AcceptOptions{OriginPatterns: cfg.origins},
		},
		KeepAlivePingInterval: 10 * time.Second,
		InitTimeout:           cfg.limits.InitTimeout,
		InitFunc: func(ctx context.Context, p transport.InitPayload) (context.Context, *transport.InitPayload, error) {
			token, err := parseBearer(p.Authorization())
			if err != nil {
				return ctx, nil, err
			}
			if token == "" {
				token = tokenFrom(ctx) // the upgrade request's header
			}
			// A connection needs a key that exists; what it may read is decided per field.
			if _, ok := auth.Lookup(ctx, token); token == "" || !ok {
				return ctx, nil, errors.New("unauthenticated: send a valid API key as the init payload's Authorization (Bearer <key>)")
			}
			return withToken(ctx, token), &p, nil
		},
	})
	srv.AddTransport(transport.Options{})
	srv.AddTransport(transport.GET{})
	srv.AddTransport(transport.POST{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetParserTokenLimit(cfg.limits.MaxTokens)
	srv.Use(extension.FixedComplexityLimit(cfg.limits.MaxComplexity))
	srv.Use(extension.Introspection{})
	srv.Use(extension.AutomaticPersistedQuery{Cache: lru.New[string](100)})
	return bearer(limit(srv, cfg.limits))
}

// limit applies the body limit to POST requests and the connection cap to WebSocket
// upgrades, whose connections it frees of the server's read and write deadlines (a
// hijacked connection keeps them, which would end every subscription after
// --write-timeout).
func limit(next http.Handler, l Limits) http.Handler {
	sockets := make(chan struct{}, l.MaxWebSockets)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			select {
			case sockets <- struct{}{}:
				defer func() { <-sockets }()
			default:
				w.Header().Set("Retry-After", "5")
				keys.WriteError(w, http.StatusServiceUnavailable, "unavailable",
					fmt.Sprintf("too many open WebSocket connections (%d, --graphql-max-websockets)", l.MaxWebSockets))
				return
			}
			rc := http.NewResponseController(w)
			_ = rc.SetReadDeadline(time.Time{})
			_ = rc.SetWriteDeadline(time.Time{})
			next.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, l.MaxBodyBytes))
			if err != nil {
				var tooBig *http.MaxBytesError
				if errors.As(err, &tooBig) {
					keys.WriteError(w, http.StatusRequestEntityTooLarge, "too_large",
						fmt.Sprintf("request body is larger than %d bytes (--graphql-max-body)", l.MaxBodyBytes))
					return
				}
				keys.WriteError(w, http.StatusBadRequest, "bad_request", "cannot read request body: "+err.Error())
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		next.ServeHTTP(w, r)
	})
}
