package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/query"
)

func init() {
	register("serve", "run the collector, the ingest consumer and the HTTP API", runServe)
}

type serveConfig struct {
	stack       stackFlags
	listen      string
	group       string
	partitions  int
	token       string
	batchSize   int
	batchAge    time.Duration
	catalog     string
	rollupEvery time.Duration
	maxBody     int64
	noConsumer  bool
	policy      policyFlags
}

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "serve", "[flags]")
	var c serveConfig
	c.stack.register(fs)
	fs.StringVar(&c.listen, "listen", envOr("BANDPLANE_LISTEN", "127.0.0.1:8080"), "HTTP listen address (collector, /metrics, /healthz, /readyz)")
	fs.StringVar(&c.group, "group", "ingest", "Kafka consumer group of the ingest consumer")
	fs.IntVar(&c.partitions, "partitions", 4, "partitions of the events topic when it has to be created")
	fs.StringVar(&c.token, "collector-token", envOr("BANDPLANE_COLLECTOR_TOKEN", ""), "bearer token for POST /v1/events (env BANDPLANE_COLLECTOR_TOKEN); required")
	fs.IntVar(&c.batchSize, "batch-size", 20000, "flush to ClickHouse after this many records")
	fs.DurationVar(&c.batchAge, "batch-age", 500*time.Millisecond, "or when the oldest pending record is this old")
	fs.StringVar(&c.catalog, "catalog", envOr("BANDPLANE_CATALOG", ""), "price catalog JSON file (default: the built-in catalog)")
	fs.DurationVar(&c.rollupEvery, "rollup-interval", 10*time.Second, "how often touched hours of the cost rollup are rebuilt (each rebuild re-reads those hours with FINAL)")
	fs.Int64Var(&c.maxBody, "max-body", 16<<20, "largest accepted POST /v1/events body in bytes")
	fs.BoolVar(&c.noConsumer, "no-consumer", false, "run the collector only (no ingest consumer)")
	c.policy.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return serve(ctx, e.log, reg, c)
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
	metrics := ingest.NewMetrics(reg)
	st := store.New(conn, c.stack.ch.Database)

	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: c.stack.topic})
	if err != nil {
		return err
	}
	defer producer.Close()
	collector, err := ingest.NewCollector(ingest.CollectorConfig{Producer: producer, Token: c.token, MaxBodyBytes: c.maxBody, Logger: log, Metrics: metrics})
	if err != nil {
		return err
	}

	// The policy API writes its audit events one decision at a time: its own producer,
	// sized for that (the writer connects on first use, so it costs nothing unused).
	auditor, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: c.stack.topic, BatchSize: kafka.AuditBatchSize})
	if err != nil {
		return err
	}
	defer auditor.Close()
	policyAPI, replica, err := c.policy.build(ctx, log, reg, conn, c.stack, cat, auditor)
	if err != nil {
		return err
	}

	var pipeline *ingest.Pipeline
	if !c.noConsumer {
		pipeline, err = ingest.NewPipeline(ctx, ingest.PipelineConfig{
			Brokers: brokers, Topic: c.stack.topic, DLQTopic: c.stack.dlq(), GroupID: c.group, Store: st, Catalog: cat,
			BatchSize: c.batchSize, BatchAge: c.batchAge, RollupInterval: c.rollupEvery, Logger: log, Metrics: metrics,
		})
		if err != nil {
			return err
		}
		defer pipeline.Close()
	}

	mux := http.NewServeMux()
	mux.Handle("/v1/events", collector)
	// Until the replica has loaded the directory, a decision would be taken on an empty
	// one (deny everything): answer 503 instead, and say so in /readyz.
	var policyReady atomic.Bool
	if policyAPI != nil {
		gated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !policyReady.Load() {
				w.Header().Set("Retry-After", "1")
				http.Error(w, `{"error":"the policy directory is still loading from ClickHouse; retry"}`, http.StatusServiceUnavailable)
				return
			}
			policyAPI.ServeHTTP(w, r)
		})
		for _, p := range []string{"/v1/decisions/", "/v1/peers", "/v1/policy/", "/v1/agents/"} {
			mux.Handle(p, gated)
		}
	}
	mux.Handle("/graphql", graph.NewHandler(query.New(conn, c.stack.ch.Database), graph.WithLogger(log)))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var problems []string
		if err := conn.Ping(pctx); err != nil {
			problems = append(problems, "clickhouse: "+err.Error())
		}
		if pipeline != nil && !pipeline.Healthy() {
			problems = append(problems, "ingest: writes are failing and being retried")
		}
		if policyAPI != nil && !policyReady.Load() {
			problems = append(problems, "policy: the directory is still loading")
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
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s (--listen): %w", c.listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving", "addr", ln.Addr().String(), "topic", c.stack.topic, "group", c.group,
		"clickhouse", c.stack.ch.Addr, "database", c.stack.ch.Database, "catalog_version", cat.Version())

	// Workers stop in order: HTTP intake first, then the pipeline (the consumer flushes
	// and commits, then the rollup catches up) and the policy replica, then clients close
	// (deferred above).
	consumerCtx, stopConsumer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConsumer()
	errc := make(chan error, 1)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http server: %w", err)
		}
	}()
	var pipelineWG sync.WaitGroup
	if pipeline != nil {
		pipelineWG.Add(1)
		go func() { defer pipelineWG.Done(); pipeline.Run(consumerCtx) }()
	}
	var policyWG sync.WaitGroup
	if replica != nil {
		ready := make(chan struct{})
		replicaErr := make(chan error, 1)
		policyWG.Add(2)
		go func() { defer policyWG.Done(); replicaErr <- replica.Run(consumerCtx, ready) }()
		go func() { defer policyWG.Done(); policyAPI.Watch(consumerCtx, 2*time.Second) }()
		select {
		case <-ready:
			policyReady.Store(true)
			log.Info("policy directory ready", "policy_revision", policyAPI.Revision())
		case err := <-replicaErr:
			_ = srv.Close()
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
	_ = srv.Shutdown(sctx)
	stopConsumer()
	policyWG.Wait()
	pipelineWG.Wait()
	log.Info("stopped")
	return runErr
}
