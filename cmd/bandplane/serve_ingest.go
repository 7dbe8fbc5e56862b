package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/bandplane/bandplane/ingest"
)

// ingestPart is serve's intake and pipeline: the collector (POST /v1/events and the
// OTLP receivers, which produce to the events topic) and, unless --no-consumer, the
// pipeline that stores what the topic holds.
type ingestPart struct {
	collector *ingest.Collector
	pipeline  *ingest.Pipeline // nil with --no-consumer
}

// newIngestPart builds the collector and the pipeline. With policy, the collector
// checks an organization's events against the trail's view of the process's directory
// once the policy replica has replayed the trail into it (pol nil: no check).
func newIngestPart(ctx context.Context, d *serveDeps, pol *policyPart) (*ingestPart, error) {
	c := d.c
	var (
		registrations ingest.Registrations
		bindings      ingest.Bindings
	)
	if pol != nil {
		registrations, bindings = d.dir, d.dir
	}
	collector, err := ingest.NewCollector(ingest.CollectorConfig{Producer: d.producer, Auth: d.keys,
		Registrations: registrations, RegistrationsReady: pol.isReady, Bindings: bindings, OTLPContent: c.otlpContent,
		MaxOTLPBodyBytes: c.otlpMaxBody, OTLPStreamTimeout: c.http.read, OTLPIdleTimeout: c.http.idle,
		MaxBodyBytes: c.maxBody, MaxLines: c.maxLines, MaxConcurrent: c.maxPosts,
		MaxUploads: c.maxUploads[0], MaxUploadsPerOrg: c.maxUploads[1], MaxUploadsPerKey: c.maxUploads[2],
		MaxEventAge: c.maxEventAge, MaxClockSkew: c.maxClockSkew, Logger: d.log, Metrics: d.metrics})
	if err != nil {
		return nil, err
	}
	p := &ingestPart{collector: collector}
	if c.noConsumer {
		return p, nil
	}
	p.pipeline, err = ingest.NewPipeline(ctx, ingest.PipelineConfig{
		Brokers: d.brokers, Topic: c.stack.topic, DLQTopic: c.stack.dlq(), StoredTopic: c.stack.storedTopic(), GroupID: c.group, Store: d.store,
		RollupInterval: c.rollupEvery,
		Consumer: ingest.Config{Directory: d.dir, Catalog: d.prices.Live, BatchSize: c.batchSize, BatchBytes: c.batchBytes, MaxPendingBytes: c.pendingBytes,
			BatchAge: c.batchAge, Logger: d.log, Metrics: d.metrics},
	})
	if err != nil {
		return nil, err
	}
	d.closers = append(d.closers, p.pipeline.Close)
	return p, nil
}

// component runs the pipeline (nil with --no-consumer: the collector is the API's).
func (p *ingestPart) component() *component {
	if p.pipeline == nil {
		return nil
	}
	return &component{name: "ingest", stage: stageIngest,
		run: func(ctx context.Context) error { p.pipeline.Run(ctx); return nil },
		ready: func() string {
			if !p.pipeline.Healthy() {
				return "writes are failing and being retried"
			}
			return ""
		}}
}

// otlpGRPC binds --otlp-grpc-listen and returns the component that serves OTLP/gRPC
// there (nil when the flag is empty).
func (p *ingestPart) otlpGRPC(addr string) (*component, net.Addr, error) {
	if addr == "" {
		return nil, nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot listen on %s (--otlp-grpc-listen): %w", addr, err)
	}
	srv := p.collector.GRPCServer()
	return &component{name: "grpc --otlp-grpc-listen", stage: stageIntake,
		run: func(ctx context.Context) error {
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			select {
			case err := <-served:
				if err == nil || errors.Is(err, grpc.ErrServerStopped) {
					return nil
				}
				return fmt.Errorf("otlp grpc server on %s: %w", addr, err)
			case <-ctx.Done():
			}
			stopGracefully(srv)
			return nil
		}}, ln.Addr(), nil
}

// stopGracefully lets exports in flight finish for up to 10 s, as the HTTP servers do.
func stopGracefully(srv *grpc.Server) {
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
}
