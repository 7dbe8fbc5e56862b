package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/directory"
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
	otlpGRPC      string
	otlpContent   bool
	otlpMaxBody   int64
	maxLines      int
	maxPosts      int
	maxUploads    [3]int // in all, per organization, per key
	repriceJobs   [3]int // queued or running: in all, per organization, per requester
	exports       trail.ExportLimits
	replays       replay.JobLimits
	replayTimeout time.Duration
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
	fs.StringVar(&c.otlpGRPC, "otlp-grpc-listen", envOr("BANDPLANE_OTLP_GRPC_LISTEN", "127.0.0.1:4317"), "OTLP/gRPC listen address (TraceService/Export, an organization's ingest key; env BANDPLANE_OTLP_GRPC_LISTEN); empty: no gRPC receiver. OTLP/HTTP is POST /v1/traces on --listen")
	fs.Int64Var(&c.otlpMaxBody, "otlp-max-body", ingest.DefaultMaxOTLPBodyBytes, "largest OTLP request in bytes, after gunzip (POST /v1/traces: 413; an OTLP/gRPC message: RESOURCE_EXHAUSTED); the OpenTelemetry Collector's own default")
	fs.BoolVar(&c.otlpContent, "otlp-content", false, "store the prompts, completions and tool arguments and results OTLP spans carry (gen_ai.input.messages and the like); off they are dropped, as they are often personal data")
	fs.IntVar(&c.maxLines, "max-lines", ingest.DefaultMaxLines, "most events in one POST /v1/events (more: 413)")
	fs.IntVar(&c.maxPosts, "max-concurrent-posts", ingest.DefaultMaxConcurrent, "POST /v1/events bodies, read whole, decoded and produced at once; others wait")
	fs.IntVar(&c.maxUploads[0], "max-uploads", ingest.DefaultMaxUploads, "POST /v1/events bodies being read at once; organizations' keys hold at most three quarters, the platform's keys keep the rest (more: 429)")
	fs.IntVar(&c.maxUploads[1], "max-uploads-per-org", ingest.DefaultMaxUploadsPerOrg, "POST /v1/events bodies one organization's keys send at once (more: 429)")
	fs.IntVar(&c.maxUploads[2], "max-uploads-per-key", ingest.DefaultMaxUploadsPerKey, "POST /v1/events bodies one API key sends at once (more: 429)")
	fs.IntVar(&c.exports.Total, "max-exports", trail.MaxConcurrentExports, "audit exports running at once; one of them is the platform's keys' only (more: 429)")
	fs.IntVar(&c.exports.PerOrg, "max-exports-per-org", trail.MaxConcurrentExportsPerOrg, "audit exports one organization's keys run at once (more: 429)")
	fs.IntVar(&c.exports.PerKey, "max-exports-per-key", trail.MaxConcurrentExportsPerKey, "audit exports one API key runs at once (more: 429)")
	fs.IntVar(&c.repriceJobs[0], "max-reprice-jobs", prices.DefaultMaxJobs, "reprice jobs queued or running at once; one organization's share of them stays for the platform's (more: TOO_MANY_REQUESTS)")
	fs.IntVar(&c.repriceJobs[1], "max-reprice-jobs-per-org", prices.DefaultMaxJobsPerOrg, "reprice jobs of one organization queued or running at once (more: TOO_MANY_REQUESTS)")
	fs.IntVar(&c.replays.Total, "max-policy-replays", replay.DefaultMaxJobs, "policy replays (startPolicyReplay) running at once; one of them is the platform's keys' only (more: TOO_MANY_REQUESTS)")
	fs.IntVar(&c.replays.PerOrg, "max-policy-replays-per-org", replay.DefaultMaxJobsPerOrg, "policy replays one organization's keys run at once (more: TOO_MANY_REQUESTS)")
	fs.IntVar(&c.replays.PerKey, "max-policy-replays-per-key", replay.DefaultMaxJobsPerKey, "policy replays one API key runs at once (more: TOO_MANY_REQUESTS)")
	fs.DurationVar(&c.replayTimeout, "policy-replay-timeout", replay.DefaultMaxJobDuration, "how long one policy replay (startPolicyReplay) may run; a longer one is stopped and fails, saying so")
	fs.IntVar(&c.repriceJobs[2], "max-reprice-jobs-per-key", prices.DefaultMaxJobsPerKey, "reprice jobs one API key has queued or running at once (more: TOO_MANY_REQUESTS)")
	fs.DurationVar(&c.maxEventAge, "max-event-age", ingest.DefaultMaxEventAge, "the collector refuses events older than this (default: the events retention, 400 days)")
	fs.DurationVar(&c.maxClockSkew, "max-clock-skew", ingest.DefaultMaxClockSkew, "the collector refuses events this far ahead of its clock")
	fs.DurationVar(&c.keyRefresh, "key-refresh", 5*time.Second, "how often API keys are re-read from ClickHouse (a revocation takes effect within it)")
	fs.DurationVar(&c.http.readHeader, "read-header-timeout", 10*time.Second, "HTTP: time to read a request's headers")
	fs.DurationVar(&c.http.read, "read-timeout", 60*time.Second, "HTTP: time to read a whole request, body included; an OTLP/gRPC stream's whole life too")
	fs.DurationVar(&c.http.write, "write-timeout", 60*time.Second, "HTTP: time to write a response (WebSockets are exempt)")
	fs.DurationVar(&c.http.idle, "idle-timeout", 120*time.Second, "HTTP: how long an idle keep-alive connection stays open; an idle OTLP/gRPC connection too")
	fs.Int64Var(&c.graphql.MaxBodyBytes, "graphql-max-body", 1<<20, "largest /graphql POST body in bytes (larger: 413)")
	fs.IntVar(&c.graphql.MaxTokens, "graphql-max-tokens", 10_000, "most tokens the GraphQL parser reads of one query")
	fs.IntVar(&c.graphql.MaxComplexity, "graphql-max-complexity", 50_000, "most one GraphQL operation may ask for: a field counts once, an auditEvents page once per event of its limit (aliases add up)")
	fs.IntVar(&c.graphql.MaxWebSockets, "graphql-max-websockets", 256, "most authenticated GraphQL WebSocket connections (more: closed at init, code 4503)")
	fs.IntVar(&c.graphql.MaxPendingWebSockets, "graphql-max-pending-websockets", 1024, "most GraphQL WebSocket upgrades waiting for their connection_init (more: 503); they hold no slot of --graphql-max-websockets")
	fs.IntVar(&c.graphql.MaxPendingWebSocketsPerAddress, "graphql-max-pending-websockets-per-address", 16, "most GraphQL WebSocket upgrades of one remote address (IPv4, or IPv6 /64) waiting for their connection_init (more: 503)")
	fs.IntVar(&c.graphql.MaxWebSocketsPerKey, "graphql-max-websockets-per-key", 32, "most open GraphQL WebSocket connections of one API key (more: refused at init)")
	fs.IntVar(&c.graphql.MaxWebSocketsPerOrg, "graphql-max-websockets-per-org", 128, "most open GraphQL WebSocket connections of one organization's keys (more: refused at init)")
	fs.DurationVar(&c.graphql.InitTimeout, "graphql-init-timeout", 10*time.Second, "how long a GraphQL WebSocket may take to send its init message")
	fs.IntVar(&c.graphql.MaxOperationsPerWebSocket, "graphql-max-operations-per-websocket", 100, "most operations one GraphQL WebSocket connection runs at once (more: code TOO_MANY_REQUESTS)")
	fs.DurationVar(&c.graphql.WebSocketWriteTimeout, "graphql-websocket-write-timeout", 10*time.Second, "how long a write to a GraphQL WebSocket may wait for its peer to read; past it that connection is closed")
	fs.IntVar(&c.graphql.WebSocketWritesPerSecond, "graphql-websocket-writes-per-second", 50_000, "the writes all GraphQL subscriptions of this process share a second: with n subscriptions each waits n/this between writes and sends what queued meanwhile in one")
	fs.DurationVar(&c.graphql.QueryTimeout, "graphql-query-timeout", 10*time.Second, "longest one GraphQL query may run (ClickHouse stops it too; longer: code TIMEOUT)")
	fs.Int64Var(&c.graphql.MaxResponseBytes, "graphql-max-response-bytes", 16<<20, "most bytes the ClickHouse reads of one GraphQL query may return, in all; ClickHouse refuses a result over what is left before sending it (more: code RESPONSE_TOO_LARGE)")
	fs.Int64Var(&c.graphql.MaxReadBytesPerOrg, "graphql-max-read-bytes-per-org", 4<<20, "most bytes one organization's keys read from ClickHouse through GraphQL a second, in bursts of up to --graphql-max-response-bytes (more: a field waits for the share to refill, or fails with code TOO_MANY_REQUESTS at its deadline)")
	fs.IntVar(&c.graphql.MaxAliases, "graphql-max-aliases", 100, "most aliased fields in one GraphQL operation, through fragments (more: refused, BAD_USER_INPUT)")
	fs.IntVar(&c.graphql.MaxConcurrentPerKey, "graphql-max-concurrent-per-key", 4, "most ClickHouse reads one API key runs at once through GraphQL, aliases counted (more: code TOO_MANY_REQUESTS)")
	fs.IntVar(&c.graphql.MaxConcurrentPerOrg, "graphql-max-concurrent-per-org", 16, "most ClickHouse reads one organization's keys run at once through GraphQL (more: code TOO_MANY_REQUESTS)")
	fs.IntVar(&c.graphql.MaxConcurrent, "graphql-max-concurrent", 64, "most ClickHouse reads GraphQL runs at once; organizations' keys hold at most three quarters, the platform's keys keep the rest (more: code TOO_MANY_REQUESTS)")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", envOr("BANDPLANE_ALLOWED_HOSTS", ""), "comma-separated host names the browser pages (GraphiQL at GET /graphql) answer to, against DNS rebinding (default: localhost, 127.0.0.1, ::1 and --listen's host); env BANDPLANE_ALLOWED_HOSTS")
	fs.DurationVar(&c.hub.StuckAfter, "stuck-after", 15*time.Minute, "a task in progress with no activity from its assignee for this long is stuck (workStatus, the live board)")
	fs.IntVar(&c.hub.Buffer, "graphql-subscriber-buffer", graph.DefaultSubscriberBuffer, "changes one subscription may fall behind by before it is told (SLOW_SUBSCRIBER) and dropped")
	fs.IntVar(&c.hub.MaxSubscriptionsPerKey, "graphql-max-subscriptions-per-key", graph.DefaultMaxSubscriptionsPerKey, "most subscriptions one API key holds open (more: code TOO_MANY_REQUESTS)")
	fs.BoolVar(&c.noLive, "no-live", false, "do not run the live reader: GraphQL subscriptions answer UNAVAILABLE")
	fs.IntVar(&c.queryConns, "graphql-clickhouse-conns", 8, "ClickHouse connections of the GraphQL queries, a pool apart from ingest's so that heavy queries never starve it; more than --graphql-max-concurrent-per-key, so that one key cannot hold them all")
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
		{"--graphql-max-response-bytes", c.graphql.MaxResponseBytes > 0},
		{"--graphql-max-read-bytes-per-org", c.graphql.MaxReadBytesPerOrg > 0},
		{"--graphql-max-websockets-per-key", c.graphql.MaxWebSocketsPerKey > 0},
		{"--graphql-max-websockets", c.graphql.MaxWebSockets > 0},
		{"--graphql-max-websockets-per-org", c.graphql.MaxWebSocketsPerOrg > 0},
		{"--graphql-max-concurrent-per-org", c.graphql.MaxConcurrentPerOrg > 0},
		{"--graphql-max-concurrent", c.graphql.MaxConcurrent > 0},
		{"--graphql-max-pending-websockets", c.graphql.MaxPendingWebSockets > 0},
		{"--graphql-max-pending-websockets-per-address", c.graphql.MaxPendingWebSocketsPerAddress > 0},
		{"--graphql-max-operations-per-websocket", c.graphql.MaxOperationsPerWebSocket > 0},
		{"--graphql-websocket-write-timeout", c.graphql.WebSocketWriteTimeout > 0},
		{"--graphql-websocket-writes-per-second", c.graphql.WebSocketWritesPerSecond > 0},
		{"--graphql-clickhouse-conns", c.queryConns > 0},
		{"--max-exports", c.exports.Total > 0},
		{"--max-exports-per-org", c.exports.PerOrg > 0},
		{"--max-exports-per-key", c.exports.PerKey > 0},
		{"--max-reprice-jobs", c.repriceJobs[0] > 0},
		{"--max-reprice-jobs-per-org", c.repriceJobs[1] > 0},
		{"--max-reprice-jobs-per-key", c.repriceJobs[2] > 0},
		{"--max-policy-replays", c.replays.Total > 0},
		{"--max-policy-replays-per-org", c.replays.PerOrg > 0},
		{"--max-policy-replays-per-key", c.replays.PerKey > 0},
		{"--policy-replay-timeout", c.replayTimeout > 0},
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

// serveDeps are the clients and services serve's components share; close releases
// them, after every component has stopped.
type serveDeps struct {
	c       serveConfig
	log     *slog.Logger
	reg     *prometheus.Registry
	brokers []string
	conn    driver.Conn // ingest's, policy's and sealing's
	qconn   driver.Conn // the queries' pool, apart so that a heavy one never starves ingest
	store   *store.Store
	// dir is the process's one directory of agents and people: the pipeline, the live
	// reader and the policy replica apply the registrations they read to it.
	dir      *directory.Directory
	querier  *query.Querier
	metrics  *ingest.Metrics
	producer *kafka.Producer // the collector's
	// auditor writes bandplane's own audit events (decisions, operator actions, keys,
	// seals) one at a time: a producer of its own, sized for that (it connects on
	// first use, so it costs nothing unused).
	auditor  *kafka.Producer
	keys     *keys.Cache
	prices   *priceService
	auditLog *trail.Log // nil without --audit-key
	closers  []func() error
}

func (d *serveDeps) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		_ = d.closers[i]()
	}
}

// latestCheckpoints reads the newest checkpoint of every organization on the
// checkpoints topic.
func (d *serveDeps) latestCheckpoints(ctx context.Context) (map[string][]byte, error) {
	return kafka.ReadLatest(ctx, d.brokers, d.c.stack.checkpointTopic())
}

// openDeps connects to ClickHouse and Kafka (creating the topics that do not exist)
// and loads the keys and the price catalog. On error, what it opened is closed.
func openDeps(ctx context.Context, log *slog.Logger, reg *prometheus.Registry, c serveConfig) (d *serveDeps, err error) {
	d = &serveDeps{c: c, log: log, reg: reg, brokers: c.stack.brokers()}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	cat, err := loadCatalog(c.catalog)
	if err != nil {
		return nil, err
	}
	if d.conn, err = c.stack.openDB(ctx); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, d.conn.Close)
	for _, t := range []string{c.stack.topic, c.stack.dlq()} {
		if err := kafka.EnsureTopic(ctx, d.brokers, t, c.partitions); err != nil {
			return nil, err
		}
	}
	// Ingest notes what it stores whether this process seals or not: a sealer
	// elsewhere, or one started later, seals it.
	if err := trail.EnsureTopics(ctx, c.stack.auditTopics(sealerPriorityServe), c.partitions); err != nil {
		return nil, err
	}
	d.metrics = ingest.NewMetrics(reg)
	d.store = store.New(d.conn, c.stack.ch.Database)
	d.dir = directory.New()
	snapshot, err := d.store.LoadDirectory(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot load the directory: %w", err)
	}
	d.dir.Load(snapshot)
	if d.producer, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: d.brokers, Topic: c.stack.topic}); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, d.producer.Close)
	if d.auditor, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: d.brokers, Topic: c.stack.topic, BatchSize: kafka.AuditBatchSize}); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, d.auditor.Close)
	if d.keys, err = keys.NewCache(keys.CacheConfig{Store: keys.NewStore(d.conn, c.stack.ch.Database, d.auditor), Refresh: c.keyRefresh, Logger: log}); err != nil {
		return nil, err
	}
	if err := d.keys.Load(ctx); err != nil {
		return nil, err
	}
	jobs := prices.Config{MaxJobs: c.repriceJobs[0], MaxJobsPerOrg: c.repriceJobs[1], MaxJobsPerKey: c.repriceJobs[2]}
	if d.prices, err = newPriceService(ctx, d.conn, c.stack.ch.Database, cat, jobs, d.auditor, log, reg); err != nil {
		return nil, err
	}
	// The audit log checks what the policy replica restores from ClickHouse, and
	// answers /v1/audit/checkpoint and /v1/audit/proof (nil without --audit-key).
	if d.auditLog, err = c.seal.log(d.conn, &c.stack); err != nil {
		return nil, err
	}
	qcfg := c.stack.ch
	qcfg.MaxOpenConns = c.queryConns
	if d.qconn, err = chdb.Open(ctx, qcfg); err != nil {
		return nil, err
	}
	d.closers = append(d.closers, d.qconn.Close)
	d.querier = query.New(d.qconn, c.stack.ch.Database)
	return d, nil
}

// serve builds serve's components over the shared clients and runs them until ctx
// ends (runComponents).
func serve(ctx context.Context, log *slog.Logger, reg *prometheus.Registry, c serveConfig) error {
	d, err := openDeps(ctx, log, reg, c)
	if err != nil {
		return err
	}
	defer d.close()
	pol, err := newPolicyPart(ctx, d)
	if err != nil {
		return err
	}
	ing, err := newIngestPart(ctx, d, pol)
	if err != nil {
		return err
	}
	lv, err := newLivePart(ctx, d)
	if err != nil {
		return err
	}
	sealer, err := newSealingPart(ctx, d)
	if err != nil {
		return err
	}
	// Background jobs: keys re-read (revocations), the price catalog and reprice jobs.
	jobs := []*component{
		{name: "keys", stage: stageIngest, run: func(ctx context.Context) error { _ = d.keys.Run(ctx); return nil }},
		{name: "prices", stage: stageIngest, run: func(ctx context.Context) error { d.prices.Run(ctx); return nil }},
	}
	// The order of the parts is the order of /readyz's lines.
	var parts []*component
	for _, p := range []*component{ing.component(), pol.component(log), lv.component(log), sealer.component()} {
		if p != nil {
			parts = append(parts, p)
		}
	}
	servers, err := newAPI(ctx, d, ing, pol, lv, func() []string { return notReady(parts) })
	if err != nil {
		return err
	}
	otlpGRPC, otlpAddr, err := ing.otlpGRPC(c.otlpGRPC)
	if err != nil {
		for _, s := range servers {
			s.close()
		}
		return err
	}
	log.Info("serving", "addr", servers[0].ln.Addr().String(), "otlp_grpc_addr", fmt.Sprint(otlpAddr), "metrics_addr", c.metricsListen, "topic", c.stack.topic, "group", c.group,
		"clickhouse", c.stack.ch.Addr, "database", c.stack.ch.Database, "catalog_version", d.prices.Service.CurrentVersion(), "sealing", sealer != nil)
	all := append(parts, jobs...)
	for _, s := range servers {
		all = append(all, s.component())
	}
	if otlpGRPC != nil {
		all = append(all, otlpGRPC)
	}
	return runComponents(ctx, log, all)
}
