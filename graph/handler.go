package graph

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/coder/websocket"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/bandplane/bandplane/graph/generated"
)

// Option configures NewHandler.
type Option func(*config)

type config struct {
	auth    Authorizer
	log     *slog.Logger
	origins []string
}

// WithAuthorizer sets who may read which organization (default AllowAll).
func WithAuthorizer(a Authorizer) Option { return func(c *config) { c.auth = a } }

// WithLogger sets the logger internal errors are logged to (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithOriginPatterns lets WebSocket clients served from other hosts connect (patterns
// as in coder/websocket's AcceptOptions, e.g. "grafana.example.com"). By default only
// same-origin browsers (and non-browser clients) may.
func WithOriginPatterns(p ...string) Option { return func(c *config) { c.origins = p } }

// NewHandler serves the GraphQL API over POST, GET and WebSocket (graphql-ws and
// graphql-transport-ws). *query.Querier is the production Querier.
func NewHandler(q Querier, opts ...Option) http.Handler {
	cfg := config{auth: AllowAll{}, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	es := generated.NewExecutableSchema(generated.Config{Resolvers: &Resolver{
		q: q, auth: cfg.auth, log: cfg.log.With("component", "graph"),
	}})
	srv := handler.New(es)
	// handler.New registers no transport; the WebSocket one is built on coder/websocket.
	srv.AddTransport(transport.Websocket{
		Implementation: transport.CoderWebsocketImplementation{
			AcceptOptions: websocket.AcceptOptions{OriginPatterns: cfg.origins},
		},
		KeepAlivePingInterval: 10 * time.Second,
		InitFunc: func(ctx context.Context, p transport.InitPayload) (context.Context, *transport.InitPayload, error) {
			token, err := parseBearer(p.Authorization())
			if err != nil {
				return ctx, nil, err
			}
			if token != "" {
				ctx = withToken(ctx, token)
			}
			return ctx, &p, nil
		},
	})
	srv.AddTransport(transport.Options{})
	srv.AddTransport(transport.GET{})
	srv.AddTransport(transport.POST{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.Use(extension.Introspection{})
	srv.Use(extension.AutomaticPersistedQuery{Cache: lru.New[string](100)})
	return bearer(srv)
}
