package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/graph/graphiql"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/keys"
)

// newAPI builds serve's HTTP surface and binds its listeners: every route on --listen,
// and /metrics on --metrics-listen of its own when given. notReady lists why
// components do not serve yet, for /readyz.
func newAPI(ctx context.Context, d *serveDeps, ing *ingestPart, pol *policyPart, lv *livePart, notReady func() []string) ([]*listener, error) {
	c, log := d.c, d.log
	mux := http.NewServeMux()
	mux.Handle("/v1/events", ing.collector)
	mux.Handle("/v1/traces", ing.collector.TracesHandler())
	if pol != nil {
		gated := pol.handler()
		for _, p := range []string{"/v1/decisions/", "/v1/peers", "/v1/policy/", "/v1/agents/"} {
			mux.Handle(p, gated)
		}
	}
	hosts := pageHosts(c.allowedHosts, c.listen)
	gopts := []graph.Option{graph.WithLogger(log), graph.WithLimits(c.graphql), graph.WithAllowedHosts(hosts...), graph.WithHub(lv.hubOrNil()),
		graph.WithPrices(d.prices.graphPrices(d.querier))}
	if pol != nil {
		gopts = append(gopts, graph.WithOperator(pol.api, d.prices.Live.Current().Currency()))
	}
	// Replays run each in a bounded process of its own (--policy-replay-max-memory),
	// for --policy-replay-timeout at most; a tenant's compares with the bundle serving
	// here.
	replays := replay.JobsConfig{Source: replay.ClickHouse{Conn: d.qconn, Database: c.stack.ch.Database}, Catalog: d.prices.Live, Logger: log,
		Limits: c.replays, MaxDuration: c.replayTimeout}
	if pol != nil {
		replays.Baseline = pol.engine.Bundle
	}
	run, err := replayRunner(c.stack, c.policy.replayMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("--policy-replay-max-memory: %w", err)
	}
	replays.Run = run
	gopts = append(gopts, graph.WithPolicyReplays(replay.NewJobs(ctx, replays)))
	api := graph.NewHandler(d.querier, d.keys, gopts...)
	mux.Handle("/graphql", api)
	mux.Handle(graphiql.AssetsPath, api) // GraphiQL's scripts and styles, embedded
	mux.Handle("/", graph.BoardHandler(hosts))
	prefix, err := c.stack.prefix()
	if err != nil {
		return nil, err
	}
	exporter, err := newAuditExporter(d.qconn, c.stack.ch.Database, prefix, c.seal.keyFile, d.latestCheckpoints, log)
	if err != nil {
		return nil, err
	}
	mux.Handle("/v1/audit/export", trail.ExportHandler(d.keys, exporter, d.auditor, log, d.c.exports))
	logHandler := trail.LogHandler(d.auditLog, d.latestCheckpoints, d.keys, log)
	mux.Handle("/v1/audit/checkpoint", logHandler)
	mux.Handle("/v1/audit/proof", logHandler)
	mux.Handle("/v1/audit/rotations", logHandler)
	metricsHandler := promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg})
	if c.metricsListen == "" {
		// The metrics are the whole process's, every organization's: platform keys only.
		platformOnly := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if k, _ := keys.FromContext(r.Context()); !k.Platform() {
				keys.Forbidden(w, k, keys.PlatformOrg)
				return
			}
			metricsHandler.ServeHTTP(w, r)
		})
		mux.Handle("/metrics", keys.Require(d.keys, keys.RoleOperator, keys.RoleAdmin)(platformOnly))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var problems []string
		if err := d.conn.Ping(pctx); err != nil {
			// Open to anyone: the reason goes to the log, not to the caller.
			log.Warn("readiness: clickhouse does not answer", "err", err)
			problems = append(problems, "clickhouse: unreachable")
		}
		problems = append(problems, notReady()...)
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
			return nil, err
		}
	}
	return servers, nil
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

// component serves the listener until ctx ends, then shuts it down, giving requests
// in flight up to 10 s.
func (l *listener) component() *component {
	return &component{name: "http " + l.name, stage: stageIntake,
		run: func(ctx context.Context) error {
			served := make(chan error, 1)
			go func() { served <- l.srv.Serve(l.ln) }()
			select {
			case err := <-served:
				if errors.Is(err, http.ErrServerClosed) {
					return nil
				}
				return fmt.Errorf("http server on %s: %w", l.addr, err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = l.srv.Shutdown(sctx)
			return nil
		}}
}
