package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
)

func init() {
	register("serve", "run the collector, the ingest consumer and the HTTP API", runServe)
}

type serveConfig struct {
	stack         stackFlags
	listen        string
	metricsListen string
	group         string
	partitions    int
	batchSize     int
	batchBytes    int
	pendingBytes  int
	batchAge      time.Duration
	catalog       string
	rollupEvery   time.Duration
	maxBody       int64
	maxLines      int
	maxPosts      int
	maxEventAge   time.Duration
	maxClockSkew  time.Duration
	keyRefresh    time.Duration
	http          httpLimits
	graphql       graph.Limits
	queryConns    int
	hub           graph.HubConfig
	noLive        bool
	allowedHosts  string
	noConsumer    bool
	policy        policyFlags
	seal          sealFlags
}

// sealFlags configure serve's sealing of the audit trail.
type sealFlags struct {
	keyFile string
	every   time.Duration
}

func (s *sealFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.keyFile, "audit-key", envOr("BANDPLANE_AUDIT_KEY", ""), "Ed25519 private key file (bandplane audit keygen) to seal the audit trail with (env BANDPLANE_AUDIT_KEY); without it nothing is sealed")
	fs.DurationVar(&s.every, "seal-every", time.Minute, "how often what was ingested is sealed (with --audit-key)")
}

// sealer returns the sealer of the trail, or nil without --audit-key; close releases
// its Kafka clients.
func (s *sealFlags) sealer(ctx context.Context, st *stackFlags, conn driver.Conn, ingestGroup string, log *slog.Logger, reg prometheus.Registerer) (*trail.Sealer, func() error, error) {
	if s.keyFile == "" {
		return nil, func() error { return nil }, nil
	}
	key, err := trail.LoadPrivateKey(s.keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot use --audit-key: %w", err)
	}
	return newSealer(ctx, st, conn, key, s.every, sealerPriorityServe, ingestGroup, log, reg)
}

// log returns the reader of the audit log, checked against --audit-key's public half,
// or nil without --audit-key.
func (s *sealFlags) log(conn driver.Conn, st *stackFlags) (*trail.Log, error) {
	if s.keyFile == "" {
		return nil, nil
	}
	pub, err := trail.LoadPublicKey(s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("cannot use --audit-key: %w", err)
	}
	prefix, err := st.prefix()
	if err != nil {
		return nil, err
	}
	return trail.NewLog(conn, st.ch.Database, prefix, []ed25519.PublicKey{pub})
}

// httpLimits are the timeouts of serve's HTTP servers.
type httpLimits struct {
	readHeader, read, write, idle time.Duration
}

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "serve", "[flags]")
	var c serveConfig
	c.stack.register(fs)
	fs.StringVar(&c.listen, "listen", envOr("BANDPLANE_LISTEN", "127.0.0.1:8080"), "HTTP listen address (collector, decisions, /graphql, /healthz, /readyz; /metrics too unless --metrics-listen)")
	fs.StringVar(&c.metricsListen, "metrics-listen", envOr("BANDPLANE_METRICS_LISTEN", ""), "serve /metrics without a key on this address of its own (env BANDPLANE_METRICS_LISTEN); without it /metrics is on --listen and needs an operator or admin key")
	fs.StringVar(&c.group, "group", "ingest", "Kafka consumer group of the ingest consumer")
	fs.IntVar(&c.partitions, "partitions", 4, "partitions of the events topic when it has to be created")
	fs.IntVar(&c.batchSize, "batch-size", 20000, "flush to ClickHouse after this many records")
	fs.IntVar(&c.batchBytes, "batch-bytes", ingest.DefaultBatchBytes, "or when the pending records hold this many bytes")
	fs.IntVar(&c.pendingBytes, "max-pending-bytes", 0, "most bytes of records fetched but not yet stored and committed (default 5 × --batch-bytes): bounds ingest's memory")
	fs.DurationVar(&c.batchAge, "batch-age", 500*time.Millisecond, "or when the oldest pending record is this old")
	fs.StringVar(&c.catalog, "catalog", envOr("BANDPLANE_CATALOG", ""), "price catalog JSON file (default: the built-in catalog)")
	fs.DurationVar(&c.rollupEvery, "rollup-interval", 10*time.Second, "how often touched hours of the cost rollup are rebuilt (each rebuild re-reads those hours with FINAL)")
	fs.Int64Var(&c.maxBody, "max-body", ingest.DefaultMaxBodyBytes, "largest accepted POST /v1/events body in bytes (larger: 413)")
	fs.IntVar(&c.maxLines, "max-lines", ingest.DefaultMaxLines, "most events in one POST /v1/events (more: 413)")
	fs.IntVar(&c.maxPosts, "max-concurrent-posts", ingest.DefaultMaxConcurrent, "POST /v1/events requests read and decoded at once; others wait (bounds the collector's memory)")
	fs.DurationVar(&c.maxEventAge, "max-event-age", ingest.DefaultMaxEventAge, "the collector refuses events older than this (default: the events retention, 400 days)")
	fs.DurationVar(&c.maxClockSkew, "max-clock-skew", ingest.DefaultMaxClockSkew, "the collector refuses events this far ahead of its clock")
	fs.DurationVar(&c.keyRefresh, "key-refresh", 5*time.Second, "how often API keys are re-read from ClickHouse (a revocation takes effect within it)")
	fs.DurationVar(&c.http.readHeader, "read-header-timeout", 10*time.Second, "HTTP: time to read a request's headers")
	fs.DurationVar(&c.http.read, "read-timeout", 60*time.Second, "HTTP: time to read a whole request, body included")
	fs.DurationVar(&c.http.write, "write-timeout", 60*time.Second, "HTTP: time to write a response (WebSockets are exempt)")
	fs.DurationVar(&c.http.idle, "idle-timeout", 120*time.Second, "HTTP: how long an idle keep-alive connection stays open")
	fs.Int64Var(&c.graphql.MaxBodyBytes, "graphql-max-body", 1<<20, "largest /graphql POST body in bytes (larger: 413)")
	fs.IntVar(&c.graphql.MaxTokens, "graphql-max-tokens", 10_000, "most tokens the GraphQL parser reads of one query")
	fs.IntVar(&c.graphql.MaxComplexity, "graphql-max-complexity", 50_000, "most one GraphQL operation may ask for: a field counts once, an auditEvents page once per event of its limit (aliases add up)")
	fs.IntVar(&c.graphql.MaxWebSockets, "graphql-max-websockets", 256, "most open GraphQL WebSocket connections (more: 503)")
	fs.IntVar(&c.graphql.MaxWebSocketsPerKey, "graphql-max-websockets-per-key", 32, "most open GraphQL WebSocket connections of one API key (more: refused at init)")
	fs.DurationVar(&c.graphql.InitTimeout, "graphql-init-timeout", 10*time.Second, "how long a GraphQL WebSocket may take to send its init message")
	fs.DurationVar(&c.graphql.QueryTimeout, "graphql-query-timeout", 10*time.Second, "longest one GraphQL query may run (ClickHouse stops it too; longer: code TIMEOUT)")
	fs.IntVar(&c.graphql.MaxAliases, "graphql-max-aliases", 100, "most aliased fields in one GraphQL operation, through fragments (more: refused, BAD_USER_INPUT)")
	fs.IntVar(&c.graphql.MaxConcurrentPerKey, "graphql-max-concurrent-per-key", 4, "most ClickHouse reads one API key runs at once through GraphQL, aliases counted (more: code TOO_MANY_REQUESTS)")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", envOr("BANDPLANE_ALLOWED_HOSTS", ""), "comma-separated host names the browser pages (GraphiQL at GET /graphql) answer to, against DNS rebinding (default: localhost, 127.0.0.1, ::1 and --listen's host); env BANDPLANE_ALLOWED_HOSTS")
	fs.DurationVar(&c.hub.StuckAfter, "stuck-after", 15*time.Minute, "a task in progress with no activity from its assignee for this long is stuck (workStatus, the live board)")
	fs.IntVar(&c.hub.Buffer, "graphql-subscriber-buffer", graph.DefaultSubscriberBuffer, "changes one subscription may fall behind by before it is told (SLOW_SUBSCRIBER) and dropped")
	fs.IntVar(&c.hub.MaxSubscriptionsPerKey, "graphql-max-subscriptions-per-key", graph.DefaultMaxSubscriptionsPerKey, "most subscriptions one API key holds open (more: code TOO_MANY_REQUESTS)")
	fs.BoolVar(&c.noLive, "no-live", false, "do not run the live reader: GraphQL subscriptions answer UNAVAILABLE")
	fs.IntVar(&c.queryConns, "graphql-clickhouse-conns", 4, "ClickHouse connections of the GraphQL queries, a pool apart from ingest's so that heavy queries never starve it")
	fs.BoolVar(&c.noConsumer, "no-consumer", false, "run the collector only (no ingest consumer)")
	c.policy.register(fs)
	c.seal.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := c.validateGraphQL(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return serve(ctx, e.log, reg, c)
}

// pageHosts are the host names the browser pages answer to: the comma-separated list,
// or else the loopback names and the host --listen names (unless it is a wildcard).
func pageHosts(list, listen string) []string {
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) > 0 {
		return hosts
	}
	hosts = append(hosts, graph.DefaultAllowedHosts...)
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
		hosts = append(hosts, h)
	}
	return hosts
}

// validateGraphQL refuses GraphQL limits that would switch a limit off or mean nothing
// (the handler would take its default for them silently).
func (c *serveConfig) validateGraphQL() error {
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"--graphql-query-timeout", c.graphql.QueryTimeout > 0},
		{"--graphql-max-concurrent-per-key", c.graphql.MaxConcurrentPerKey > 0},
		{"--graphql-max-aliases", c.graphql.MaxAliases > 0},
		{"--graphql-max-websockets-per-key", c.graphql.MaxWebSocketsPerKey > 0},
		{"--graphql-clickhouse-conns", c.queryConns > 0},
		{"--stuck-after", c.hub.StuckAfter > 0},
		{"--graphql-subscriber-buffer", c.hub.Buffer > 0},
		{"--graphql-max-subscriptions-per-key", c.hub.MaxSubscriptionsPerKey > 0},
	} {
		if !f.ok {
			return fmt.Errorf("%s must be greater than 0", f.name)
		}
	}
	return nil
}

func serve(ctx context.Context, log *slog.Logger, reg *prometheus.Registry, c serveConfig) error {
	cat, err := loadCatalog(c.catalog)
	if err != nil {
		return err
	}
	conn, err := c.stack.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	brokers := c.stack.brokers()
	for _, t := range []string{c.stack.topic, c.stack.dlq()} {
		if err := kafka.EnsureTopic(ctx, brokers, t, c.partitions); err != nil {
			return err
		}
	}
	// Ingest notes what it stores whether this process seals or not: a sealer
	// elsewhere, or one started later, seals it.
	if err := trail.EnsureTopics(ctx, c.stack.auditTopics(sealerPriorityServe), c.partitions); err != nil {
		return err
	}
	metrics := ingest.NewMetrics(reg)
	st := store.New(conn, c.stack.ch.Database)

	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: c.stack.topic})
	if err != nil {
		return err
	}
	defer producer.Close()
	// Bandplane's own audit events (decisions, operator actions, keys, seals) are written
	// one at a time: their own producer, sized for that (the writer connects on first
	// use, so it costs nothing unused).
	auditor, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: c.stack.topic, BatchSize: kafka.AuditBatchSize})
	if err != nil {
		return err
	}
	defer auditor.Close()

	keyCache, err := keys.NewCache(keys.CacheConfig{Store: keys.NewStore(conn, c.stack.ch.Database, auditor), Refresh: c.keyRefresh, Logger: log})
	if err != nil {
		return err
	}
	if err := keyCache.Load(ctx); err != nil {
		return err
	}

	prices, err := newPriceService(ctx, conn, c.stack.ch.Database, cat, auditor, log, reg)
	if err != nil {
		return err
	}
	// The audit log checks what the policy replica restores from ClickHouse, and
	// answers /v1/audit/checkpoint and /v1/audit/proof (nil without --audit-key).
	auditLog, err := c.seal.log(conn, &c.stack)
	if err != nil {
		return err
	}
	latestCheckpoints := func(ctx context.Context) (map[string][]byte, error) {
		return kafka.ReadLatest(ctx, brokers, c.stack.checkpointTopic())
	}
	var sealed replica.Trail
	if auditLog != nil {
		sealed = replicaTrail{log: auditLog, topic: c.stack.topic, group: c.group, latest: latestCheckpoints}
	}
	pol, err := c.policy.build(ctx, log, reg, conn, c.stack, prices.Live, auditor, keyCache, sealed)
	if err != nil {
		return err
	}
	// Until the replica has loaded the directory, a decision would be taken on an empty
	// one (deny everything), and an organization's events could not be checked against
	// it: both answer 503 until then, and /readyz says so.
	var policyReady atomic.Bool
	var registrations ingest.Registrations
	if pol != nil {
		registrations = pol.engine.Directory()
	}
	collector, err := ingest.NewCollector(ingest.CollectorConfig{Producer: producer, Auth: keyCache,
		Registrations: registrations, RegistrationsReady: policyReady.Load,
		MaxBodyBytes: c.maxBody, MaxLines: c.maxLines, MaxConcurrent: c.maxPosts,
		MaxEventAge: c.maxEventAge, MaxClockSkew: c.maxClockSkew, Logger: log, Metrics: metrics})
	if err != nil {
		return err
	}

	var pipeline *ingest.Pipeline
	if !c.noConsumer {
		pipeline, err = ingest.NewPipeline(ctx, ingest.PipelineConfig{
			Brokers: brokers, Topic: c.stack.topic, DLQTopic: c.stack.dlq(), StoredTopic: c.stack.storedTopic(), GroupID: c.group, Store: st, Catalog: prices.Live,
			BatchSize: c.batchSize, BatchBytes: c.batchBytes, MaxPendingBytes: c.pendingBytes, BatchAge: c.batchAge,
			RollupInterval: c.rollupEvery, Logger: log, Metrics: metrics,
		})
		if err != nil {
			return err
		}
		defer pipeline.Close()
	}
	sealer, closeSealer, err := c.seal.sealer(ctx, &c.stack, conn, c.group, log, reg)
	if err != nil {
		return err
	}
	defer func() { _ = closeSealer() }()

	mux := http.NewServeMux()
	mux.Handle("/v1/events", collector)
	if pol != nil {
		gated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !policyReady.Load() {
				w.Header().Set("Retry-After", "1")
				keys.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the policy directory is still loading from ClickHouse; retry")
				return
			}
			pol.api.ServeHTTP(w, r)
		})
		for _, p := range []string{"/v1/decisions/", "/v1/peers", "/v1/policy/", "/v1/agents/"} {
			mux.Handle(p, gated)
		}
	}
	// The queries have their own connections: a heavy one waits for its pool, never for
	// ingest's (nor ingest for it).
	qcfg := c.stack.ch
	qcfg.MaxOpenConns = c.queryConns
	qconn, err := chdb.Open(ctx, qcfg)
	if err != nil {
		return err
	}
	defer qconn.Close()
	querier := query.New(qconn, c.stack.ch.Database)
	hosts := pageHosts(c.allowedHosts, c.listen)
	var hub *graph.Hub
	var live *ingest.Live
	var liveReady atomic.Bool
	if !c.noLive {
		// The ingest group's offsets first: what lies after them may not be in
		// ClickHouse yet (neither in the directory nor in the seed), so the live reader
		// replays it into the hub before publishing (ingest.Live).
		start, err := kafka.CommittedOffsets(ctx, brokers, c.stack.topic, c.group)
		if err != nil {
			return fmt.Errorf("cannot read the ingest group's offsets for the live reader: %w", err)
		}
		liveDir := ingest.NewDirectory()
		snapshot, err := st.LoadDirectory(ctx)
		if err != nil {
			return fmt.Errorf("cannot load the directory for the live reader: %w", err)
		}
		liveDir.Load(snapshot)
		hcfg := c.hub
		hcfg.Handles, hcfg.Logger, hcfg.Currency = liveDir, log.With("component", "hub"), prices.Live.Current().Currency()
		hub = graph.NewHub(hcfg)
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bandplane_live_subscriptions", Help: "Open GraphQL subscriptions of this process."},
				func() float64 { return float64(hub.Subscribers()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bandplane_live_changes_delivered_total", Help: "Changes handed to subscriptions."},
				func() float64 { d, _ := hub.Stats(); return float64(d) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bandplane_live_subscriptions_dropped_total", Help: "Subscriptions dropped for falling behind (SLOW_SUBSCRIBER)."},
				func() float64 { _, d := hub.Stats(); return float64(d) }),
		)
		live, err = ingest.NewLive(ingest.LiveConfig{Brokers: brokers, Topic: c.stack.topic, Directory: liveDir,
			Publish: hub.Publish, Replay: hub.Replay, Start: start, Logger: log})
		if err != nil {
			return err
		}
		seeded, err := querier.TasksInProgress(ctx, time.Now(), hcfg.StuckAfter, graph.DefaultMaxTracked)
		if err != nil {
			return fmt.Errorf("cannot seed the live hub with the tasks in progress: %w", err)
		}
		for _, t := range seeded {
			hub.SeedTask(t.OrgID, t.Task)
		}
	}
	gopts := []graph.Option{graph.WithLogger(log), graph.WithLimits(c.graphql), graph.WithAllowedHosts(hosts...), graph.WithHub(hub),
		graph.WithPrices(prices.graphPrices(querier))}
	if pol != nil {
		gopts = append(gopts, graph.WithOperator(pol.api, prices.Live.Current().Currency()))
	}
	mux.Handle("/graphql", graph.NewHandler(querier, keyCache, gopts...))
	mux.Handle("/", graph.BoardHandler(hosts))
	prefix, err := c.stack.prefix()
	if err != nil {
		return err
	}
	exporter, err := newAuditExporter(qconn, c.stack.ch.Database, prefix, c.seal.keyFile, latestCheckpoints, log)
	if err != nil {
		return err
	}
	export := auditExportHandler(keyCache, exporter, auditor, log)
	mux.Handle("/v1/audit/export", export)
	logHandler := newAuditLogHandler(auditLog, latestCheckpoints, keyCache, log)
	mux.Handle("/v1/audit/checkpoint", logHandler)
	mux.Handle("/v1/audit/proof", logHandler)
	mux.Handle("/v1/audit/rotations", logHandler)
	metricsHandler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if c.metricsListen == "" {
		// The metrics are the whole process's, every organization's: platform keys only.
		platformOnly := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if k, _ := keys.FromContext(r.Context()); !k.Platform() {
				keys.Forbidden(w, k, keys.PlatformOrg)
				return
			}
			metricsHandler.ServeHTTP(w, r)
		})
		mux.Handle("/metrics", keys.Require(keyCache, keys.RoleOperator, keys.RoleAdmin)(platformOnly))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var problems []string
		if err := conn.Ping(pctx); err != nil {
			// Open to anyone: the reason goes to the log, not to the caller.
			log.Warn("readiness: clickhouse does not answer", "err", err)
			problems = append(problems, "clickhouse: unreachable")
		}
		if pipeline != nil && !pipeline.Healthy() {
			problems = append(problems, "ingest: writes are failing and being retried")
		}
		if pol != nil && !policyReady.Load() {
			problems = append(problems, "policy: the directory is still loading")
		}
		if live != nil && !liveReady.Load() {
			problems = append(problems, "live: the live reader is still catching up to the newest offsets")
		}
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, p := range problems {
				fmt.Fprintln(w, p)
			}
			return
		}
		fmt.Fprintln(w, "ready")
	})
	servers := []*listener{{name: "--listen", addr: c.listen, handler: mux}}
	if c.metricsListen != "" {
		m := http.NewServeMux()
		m.Handle("/metrics", metricsHandler)
		servers = append(servers, &listener{name: "--metrics-listen", addr: c.metricsListen, handler: m})
	}
	for _, s := range servers {
		if err := s.listen(c.http); err != nil {
			for _, o := range servers {
				o.close()
			}
			return err
		}
	}
	log.Info("serving", "addr", servers[0].ln.Addr().String(), "metrics_addr", c.metricsListen, "topic", c.stack.topic, "group", c.group,
		"clickhouse", c.stack.ch.Addr, "database", c.stack.ch.Database, "catalog_version", prices.Service.CurrentVersion(), "sealing", sealer != nil)

	// Workers stop in order: HTTP intake first, then the pipeline (the consumer flushes
	// and commits, then the rollup catches up), the policy replica and the sealer (one
	// last seal of what was ingested), then clients close (deferred above).
	consumerCtx, stopConsumer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConsumer()
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() {
			if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http server on %s (%s): %w", s.addr, s.name, err)
			}
		}()
	}
	var workers sync.WaitGroup
	workers.Go(func() { _ = keyCache.Run(consumerCtx) })
	workers.Go(func() { prices.Run(consumerCtx) })
	var pipelineWG sync.WaitGroup
	if pipeline != nil {
		pipelineWG.Go(func() { pipeline.Run(consumerCtx) })
	}
	if live != nil {
		positioned := make(chan struct{})
		workers.Go(func() { _ = live.Run(consumerCtx, positioned) })
		workers.Go(func() { hub.Run(consumerCtx) })
		go func() {
			select {
			case <-positioned:
				liveReady.Store(true)
				log.Info("live reader at the newest offsets", "topic", c.stack.topic)
			case <-consumerCtx.Done():
			}
		}()
	}
	// The sealer stops after the consumer's last flush, so its last seal covers it.
	sealCtx, stopSealer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSealer()
	var sealerWG sync.WaitGroup
	if sealer != nil {
		sealerWG.Go(func() { _ = sealer.Run(sealCtx) })
	}
	if pol != nil {
		ready := make(chan struct{})
		replicaErr := make(chan error, 1)
		workers.Go(func() { replicaErr <- pol.replica.Run(consumerCtx, ready) })
		workers.Go(func() { pol.api.Watch(consumerCtx, 2*time.Second) })
		workers.Go(func() { pol.engine.Limiter().Run(consumerCtx, time.Minute) })
		workers.Go(func() { pol.engine.Ledger().Run(consumerCtx, 5*time.Second) })
		workers.Go(func() { pol.api.RunCrossings(consumerCtx) })
		select {
		case <-ready:
			policyReady.Store(true)
			log.Info("policy directory ready", "policy_revision", pol.api.Revision())
		case err := <-replicaErr:
			for _, s := range servers {
				s.close()
			}
			stopConsumer()
			return fmt.Errorf("cannot start the policy replica: %w", err)
		}
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-errc:
		log.Error("stopping after error", "err", runErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.srv.Shutdown(sctx)
	}
	stopConsumer()
	pipelineWG.Wait()
	stopSealer()
	sealerWG.Wait()
	workers.Wait()
	log.Info("stopped")
	return runErr
}

// listener is one of serve's HTTP servers.
type listener struct {
	name, addr string
	handler    http.Handler
	ln         net.Listener
	srv        *http.Server
}

func (l *listener) listen(lim httpLimits) error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s (%s): %w", l.addr, l.name, err)
	}
	l.ln = ln
	l.srv = &http.Server{Handler: l.handler, ReadHeaderTimeout: lim.readHeader, ReadTimeout: lim.read,
		WriteTimeout: lim.write, IdleTimeout: lim.idle, MaxHeaderBytes: 1 << 20}
	return nil
}

func (l *listener) close() {
	if l.ln != nil {
		_ = l.ln.Close()
	}
}
