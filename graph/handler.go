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
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/bandplane/bandplane/graph/generated"
	"github.com/bandplane/bandplane/graph/graphiql"
	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
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
	// MaxWebSockets bounds the authenticated WebSocket connections (default 256); a
	// connection over it is closed at init (code 4503).
	MaxWebSockets int
	// MaxPendingWebSockets bounds the WebSocket upgrades waiting for their
	// connection_init (default 1024), and MaxPendingWebSocketsPerAddress those of one
	// remote address (an IPv4 address or an IPv6 /64; default 16); an upgrade over
	// either is answered 503. A pending upgrade holds no slot of MaxWebSockets.
	MaxPendingWebSockets           int
	MaxPendingWebSocketsPerAddress int
	// InitTimeout is how long a WebSocket may take to send its init message (default
	// 10 s).
	InitTimeout time.Duration
	// QueryTimeout bounds one query or mutation (default 10 s); clickhouse-go passes its
	// deadline on to ClickHouse (max_execution_time, and a cancel when it passes), and a
	// query over it answers code TIMEOUT.
	QueryTimeout time.Duration
	// MaxConcurrentPerKey bounds the ClickHouse reads one API key runs at once (default
	// 4), counted per field (aliases and parallel fields each take one); a field over it
	// answers code TOO_MANY_REQUESTS at once, without waiting.
	MaxConcurrentPerKey int
	// MaxConcurrentPerOrg bounds those of one organization's keys together (default
	// 16), and MaxConcurrent those of the whole server (default 64), of which tenants
	// hold at most three quarters: the platform's keys keep the rest.
	MaxConcurrentPerOrg int
	MaxConcurrent       int
	// MaxWebSocketsPerKey bounds the WebSocket connections one API key holds open
	// (default 32), and MaxWebSocketsPerOrg those of one organization's keys (default
	// 128), so that no key or tenant takes every connection of MaxWebSockets; a
	// connection over either is refused at init (code 4429).
	MaxWebSocketsPerKey int
	MaxWebSocketsPerOrg int
	// MaxOperationsPerWebSocket bounds the operations one connection runs at once
	// (default 100); one over it is answered with code TOO_MANY_REQUESTS.
	MaxOperationsPerWebSocket int
	// WebSocketWriteTimeout is how long a write to a WebSocket may wait for its peer to
	// read (default 10 s); past it the connection is closed, and only it.
	WebSocketWriteTimeout time.Duration
	// WebSocketWritesPerSecond is the writes the process's subscriptions share a
	// second (default 50,000): with n of them delivering, each leaves at least
	// n/WebSocketWritesPerSecond between its writes, and what queues meanwhile goes out
	// in one write (wscork.go). A write is a syscall whose cost hardly depends on its
	// size, so this bounds the CPU that fan-out takes however many subscribe; with few
	// subscribers the gap is below the time between changes and nothing waits.
	WebSocketWritesPerSecond int
	// MaxResponseBytes bounds what the reads of one query or mutation may bring into the
	// process, in bytes (default 16 MiB): ClickHouse refuses a result over what is left
	// before sending it (query.WithResponseBudget), and the field answers code
	// RESPONSE_TOO_LARGE.
	MaxResponseBytes int64
	// MaxReadBytesPerOrg bounds the bytes one organization's keys read from ClickHouse
	// a second, in bursts of up to MaxResponseBytes (default 4 MiB): past it their
	// fields wait for the share to refill, or fail (TOO_MANY_REQUESTS) at their
	// deadline (readSlots).
	MaxReadBytesPerOrg int64
	// now and sleep are the read rate's clock (tests); nil: the wall clock.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
	// MaxAliases bounds the aliased fields of one operation (default 100), counted
	// through fragments as often as they are spread; more is refused before anything
	// runs (code BAD_USER_INPUT).
	MaxAliases int
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
	if l.MaxPendingWebSockets <= 0 {
		l.MaxPendingWebSockets = 1024
	}
	if l.MaxPendingWebSocketsPerAddress <= 0 {
		l.MaxPendingWebSocketsPerAddress = 16
	}
	if l.InitTimeout <= 0 {
		l.InitTimeout = 10 * time.Second
	}
	if l.MaxReadBytesPerOrg <= 0 {
		l.MaxReadBytesPerOrg = 4 << 20
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.sleep == nil {
		l.sleep = func(ctx context.Context, d time.Duration) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if l.MaxOperationsPerWebSocket <= 0 {
		l.MaxOperationsPerWebSocket = 100
	}
	if l.WebSocketWriteTimeout <= 0 {
		l.WebSocketWriteTimeout = 10 * time.Second
	}
	if l.WebSocketWritesPerSecond <= 0 {
		l.WebSocketWritesPerSecond = 50_000
	}
	if l.QueryTimeout <= 0 {
		l.QueryTimeout = 10 * time.Second
	}
	if l.MaxConcurrentPerKey <= 0 {
		l.MaxConcurrentPerKey = 4
	}
	if l.MaxConcurrentPerOrg <= 0 {
		l.MaxConcurrentPerOrg = 16
	}
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = 64
	}
	if l.MaxAliases <= 0 {
		l.MaxAliases = 100
	}
	if l.MaxResponseBytes <= 0 {
		l.MaxResponseBytes = 16 << 20
	}
	if l.MaxWebSocketsPerKey <= 0 {
		l.MaxWebSocketsPerKey = 32
	}
	if l.MaxWebSocketsPerOrg <= 0 {
		l.MaxWebSocketsPerOrg = 128
	}
}

// Option configures NewHandler.
type Option func(*config)

type config struct {
	log     *slog.Logger
	origins []string
	hosts   []string
	limits  Limits
	hub     *Hub

	operator Operator
	currency string
	prices   Prices
	replays  PolicyReplays
}

// WithHub serves the subscriptions from hub (without one they answer UNAVAILABLE).
func WithHub(h *Hub) Option { return func(c *config) { c.hub = h } }

// perRow is the complexity of a list field: its selection once per row its limit
// (or the default) lets it return.
func perRow(child int, limit *int, def, max int) int {
	n := def
	if limit != nil && *limit > 0 {
		n = min(*limit, max)
	}
	return 1 + child*n
}

// WithLogger sets the logger internal errors are logged to (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithOriginPatterns lets WebSocket clients served from other hosts connect (patterns
// as in coder/websocket's AcceptOptions, e.g. "grafana.example.com"). By default only
// same-origin browsers (and non-browser clients) may.
func WithOriginPatterns(p ...string) Option { return func(c *config) { c.origins = p } }

// WithAllowedHosts sets the host names GraphiQL (GET /graphql from a browser) answers
// to (default DefaultAllowedHosts): see AllowHosts.
func WithAllowedHosts(h ...string) Option { return func(c *config) { c.hosts = h } }

// WithLimits sets the request limits (see Limits for the defaults).
func WithLimits(l Limits) Option { return func(c *config) { c.limits = l } }

// NewHandler serves the GraphQL API over POST, GET and WebSocket (graphql-ws and
// graphql-transport-ws, on coder/websocket). Every field checks the request's API key
// with auth (*keys.Cache in production); open subscriptions are checked again with
// what auth holds (keys.Holder). *query.Querier is the production Querier.
// A browser opening it gets GraphiQL, whose files it serves below graphiql.AssetsPath:
// mount it there too.
func NewHandler(q Querier, auth keys.Holder, opts ...Option) http.Handler {
	cfg := config{log: slog.New(slog.DiscardHandler), hosts: DefaultAllowedHosts}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.limits.defaults()
	slots := newReadSlots(cfg.limits)
	gc := generated.Config{Resolvers: &Resolver{q: q, auth: auth, log: cfg.log.With("component", "graph"),
		timeout: cfg.limits.QueryTimeout, slots: slots, maxResponse: cfg.limits.MaxResponseBytes, hub: cfg.hub,
		operator: cfg.operator, currency: cfg.currency, prices: cfg.prices, replays: cfg.replays}}
	// A field's cost is what it can return: an audit page costs its selection once per
	// event it may hold, so limit: 10000 counts 10,000 times and aliases cannot multiply
	// pages past MaxComplexity; every list field likewise (perRow). A workStatus answer
	// counts its selection 10 times (its rooms are capped, their lists are small).
	gc.Complexity.Query.AuditEvents = func(child int, _ *string, _, _ *time.Time, _, _, _ *string, _ []string, _ *model.DecisionOutcome, limit *int, _ *string) int {
		return perRow(child, limit, query.DefaultAuditLimit, query.MaxAuditLimit)
	}
	gc.Complexity.Query.Costs = func(child int, _ *string, _, _ time.Time, _ []model.CostDimension, _ *model.CostFilter, limit *int) int {
		return perRow(child, limit, query.DefaultCostLimit, query.MaxCostLimit)
	}
	// A series holds a point per bucket: its selection counts once per series and per
	// 100 buckets.
	gc.Complexity.Query.UsageSeries = func(child int, _ *string, from, to time.Time, interval model.SeriesInterval, _ *model.CostDimension, _ *model.CostFilter, limit *int) int {
		step := time.Hour
		if interval == model.SeriesIntervalDay {
			step = 24 * time.Hour
		}
		buckets := min(max(int(to.Sub(from)/step), 1), query.MaxSeriesBuckets)
		return perRow(child, limit, query.DefaultSeriesLimit, query.MaxSeriesLimit) * max(1, buckets/100)
	}
	gc.Complexity.Query.ChattyAgents = func(child int, _ *string, _, _ *time.Time, limit *int) int {
		return perRow(child, limit, query.DefaultChattyLimit, query.MaxChattyLimit)
	}
	gc.Complexity.Query.ContactRequests = func(child int, _ *string, _, _ *time.Time, _, _ *string, limit *int) int {
		return perRow(child, limit, query.DefaultContactLimit, query.MaxContactLimit)
	}
	gc.Complexity.Query.PolicyDecisions = func(child int, _ *string, _, _ *time.Time, _ *string, _ *model.DecisionOutcome, _ *string, limit *int, _ *string) int {
		return perRow(child, limit, query.DefaultDecisionLimit, query.MaxDecisionLimit)
	}
	gc.Complexity.Query.WorkStatus = func(child int, _, _ *string) int { return 1 + child*10 }
	gc.Complexity.Query.Agents = func(child int, _ *string, limit *int) int {
		return perRow(child, limit, query.DefaultListLimit, query.MaxListLimit)
	}
	gc.Complexity.Query.Rooms = func(child int, _ *string, limit *int) int {
		return perRow(child, limit, query.DefaultListLimit, query.MaxListLimit)
	}
	// budgets (at most policy.MaxBudgetsPerOrg, read from memory) and prices (the
	// catalog's models) have no limit: they count as 100 rows.
	gc.Complexity.Query.Budgets = func(child int, _ *string) int { return perRow(child, nil, 100, 100) }
	gc.Complexity.Query.Prices = func(child int, _ *string) int { return perRow(child, nil, 100, 100) }
	gc.Complexity.Query.Jobs = func(child int, _ *string, limit *int) int {
		return perRow(child, limit, DefaultJobsLimit, MaxJobsLimit)
	}
	gc.Complexity.PolicyReplayResult.Examples = func(child int, _ model.PolicyReplayClass, _, limit *int) int {
		return perRow(child, limit, model.DefaultExamplesLimit, model.MaxExamplesLimit)
	}
	gc.Complexity.Query.UnpricedModels = func(child int, _ *string, _, _ *time.Time, limit *int) int {
		return perRow(child, limit, DefaultUnpricedLimit, MaxUnpricedLimit)
	}
	es := generated.NewExecutableSchema(gc)
	srv := handler.New(es)
	sockets := share.New(share.Limits{Total: cfg.limits.MaxWebSockets, PerGroup: cfg.limits.MaxWebSocketsPerOrg,
		PerClient: cfg.limits.MaxWebSocketsPerKey}, "")
	pending := share.New(share.Limits{Total: cfg.limits.MaxPendingWebSockets, PerGroup: cfg.limits.MaxPendingWebSocketsPerAddress}, "")
	// handler.New registers no transport; the WebSocket one is bandplane's
	// (wstransport.go), on coder/websocket.
	srv.AddTransport(&wsTransport{auth: auth, sockets: sockets, limits: cfg.limits, origins: cfg.origins, log: cfg.log.With("component", "graph"),
		hub: cfg.hub})
	srv.AddTransport(transport.Options{})
	srv.AddTransport(httpTransport{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetParserTokenLimit(cfg.limits.MaxTokens)
	srv.Use(extension.FixedComplexityLimit(cfg.limits.MaxComplexity))
	srv.Use(keyedIntrospection{auth: auth})
	srv.Use(extension.AutomaticPersistedQuery{Cache: lru.New[string](100)})
	srv.AroundOperations(operationDeadline(cfg.limits, func(ctx context.Context, bytes int64) {
		if k, ok := auth.Held(keys.TokenFrom(ctx)); ok {
			slots.charge(k, bytes)
		}
	}))
	api := keys.Token(limit(srv, pending, cfg.limits))
	ui := graphiql.New()
	page, assets := AllowHosts(cfg.hosts, ui.Page()), AllowHosts(cfg.hosts, ui.Assets())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, graphiql.AssetsPath) {
			assets.ServeHTTP(w, r) // before the key check: the page loads them without one
			return
		}
		w.Header().Add("Vary", "Accept") // the same URL is the page or the API
		if wantsPage(r) {
			page.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// operationDeadline gives each query and mutation its deadline (Limits.QueryTimeout),
// which clickhouse-go passes on to ClickHouse, and its byte budget
// (Limits.MaxResponseBytes), and refuses @defer (a deferred part
// would resolve after the operation's deadline is released). Subscriptions, which live
// as long as their connection, are bounded by the connection cap instead.
func operationDeadline(l Limits, charge func(ctx context.Context, bytes int64)) graphql.OperationMiddleware {
	return func(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
		op := graphql.GetOperationContext(ctx).Operation
		if op == nil {
			return next(ctx)
		}
		if n := countAliases(op.SelectionSet, graphql.GetOperationContext(ctx).Doc, map[string]int{}, l.MaxAliases+1); n > l.MaxAliases {
			return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{{
				Message:    fmt.Sprintf("the operation has more than %d aliased fields (--graphql-max-aliases)", l.MaxAliases),
				Extensions: map[string]any{"code": "BAD_USER_INPUT"},
			}}})
		}
		if op.Operation == ast.Subscription {
			return next(ctx)
		}
		if usesDefer(op.SelectionSet, map[string]bool{}, graphql.GetOperationContext(ctx).Doc) {
			return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{{
				Message: "@defer is not supported", Extensions: map[string]any{"code": "BAD_USER_INPUT"},
			}}})
		}
		bctx := query.WithResponseBudget(ctx, l.MaxResponseBytes)
		budget := query.BudgetOf(bctx)
		ctx, cancel := context.WithTimeout(bctx, l.QueryTimeout)
		var once sync.Once
		h := next(ctx)
		return func(rctx context.Context) *graphql.Response {
			// A query or mutation has one response; what its reads returned is then
			// known, and counted against the reader's organization.
			defer once.Do(func() { cancel(); charge(ctx, budget.Used()) })
			return h(rctx)
		}
	}
}

// countAliases counts the aliased fields of a selection set, a fragment as often as it
// is spread (its own count is computed once, in memo), and stops counting at stop:
// a fragment spread in a fragment spread in … cannot make it work exponentially.
func countAliases(set ast.SelectionSet, doc *ast.QueryDocument, memo map[string]int, stop int) int {
	n := 0
	for _, sel := range set {
		if n >= stop {
			return n
		}
		switch s := sel.(type) {
		case *ast.Field:
			if s.Alias != "" && s.Alias != s.Name {
				n++
			}
			n += countAliases(s.SelectionSet, doc, memo, stop-n)
		case *ast.InlineFragment:
			n += countAliases(s.SelectionSet, doc, memo, stop-n)
		case *ast.FragmentSpread:
			c, ok := memo[s.Name]
			if !ok {
				memo[s.Name] = 0 // a cycle counts nothing (validation refuses cycles anyway)
				if doc != nil {
					if f := doc.Fragments.ForName(s.Name); f != nil {
						c = countAliases(f.SelectionSet, doc, memo, stop)
					}
				}
				memo[s.Name] = c
			}
			n += c
		}
	}
	return n
}

// usesDefer says whether a selection set uses @defer, through fragments too (each
// named fragment is looked at once).
func usesDefer(set ast.SelectionSet, seen map[string]bool, doc *ast.QueryDocument) bool {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if usesDefer(s.SelectionSet, seen, doc) {
				return true
			}
		case *ast.InlineFragment:
			if s.Directives.ForName("defer") != nil || usesDefer(s.SelectionSet, seen, doc) {
				return true
			}
		case *ast.FragmentSpread:
			if s.Directives.ForName("defer") != nil {
				return true
			}
			if seen[s.Name] || doc == nil {
				continue
			}
			seen[s.Name] = true
			if f := doc.Fragments.ForName(s.Name); f != nil && usesDefer(f.SelectionSet, seen, doc) {
				return true
			}
		}
	}
	return false
}

// limit applies the body limit to POST requests and WebSocket admission to upgrades
// (admitUpgrade).
func limit(next http.Handler, pending *share.Pool, l Limits) http.Handler {
	upgrades := admitUpgrade(next, pending, l)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if upgrade, ws := upgradeTokens(r.Header); upgrade {
			if !ws {
				keys.WriteError(w, http.StatusBadRequest, "bad_request", "the Upgrade header names no websocket: /graphql upgrades to WebSocket only")
				return
			}
			upgrades.ServeHTTP(w, r)
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
