package main

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
)

// priceService is the price side of serve: the catalog ingest and
// the policy replica price with, and the reprice job runner.
type priceService struct {
	// Live is what ingest and the policy replica price with: the newest catalog version
	// in ClickHouse, refreshed by Run every 2 s.
	Live pricing.Source
	// Service is the price and job API (UpsertPrice, ListPrices, StartReprice, Jobs,
	// Job, CancelJob) the GraphQL layer calls.
	Service *prices.Service
}

// newPriceService loads the newest catalog version from ClickHouse; seed (the built-in
// catalog or --catalog) is stored as version 1 when the prices table is empty, and is
// otherwise not used. jobs holds the reprice queue's bounds (MaxJobs…).
func newPriceService(ctx context.Context, conn driver.Conn, db string, seed *pricing.Catalog, jobs prices.Config, auditor *kafka.Producer, log *slog.Logger, reg prometheus.Registerer) (*priceService, error) {
	cfg := prices.Config{Conn: conn, Database: db, Seed: seed, Logger: log, Registerer: reg,
		MaxJobs: jobs.MaxJobs, MaxJobsPerOrg: jobs.MaxJobsPerOrg, MaxJobsPerKey: jobs.MaxJobsPerKey}
	if auditor != nil { // a nil *Producer in the interface would not be nil
		cfg.Auditor = auditor
	}
	svc, err := prices.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	seedVersion := ""
	if seed != nil {
		seedVersion = seed.Version()
	}
	log.Info("price catalog loaded from clickhouse", "catalog_version", svc.CurrentVersion(), "seed_version", seedVersion)
	return &priceService{Live: svc.Live(), Service: svc}, nil
}

// Run keeps the catalog current and runs reprice jobs until ctx ends.
func (p *priceService) Run(ctx context.Context) { _ = p.Service.Run(ctx) }

// graphPrices adapts the price service (and the querier, for the unpriced models) to
// what the GraphQL layer calls: serve passes graph.WithPrices(prices.graphPrices(querier)).
// The service's errors are the GraphQL layer's kinds (schema.ErrInvalid,
// schema.ErrForbidden); a conflict becomes the caller's mistake (graphErr).
func (p *priceService) graphPrices(q *query.Querier) graph.Prices {
	return priceGraph{svc: p.Service, q: q}
}

type priceGraph struct {
	svc *prices.Service
	q   *query.Querier
}

func (g priceGraph) UpsertPrice(ctx context.Context, by keys.Key, c graph.PriceChange) (graph.PriceInfo, error) {
	v, err := g.svc.UpsertPrice(ctx, by, prices.PriceInput{Model: c.Model, Input: c.Input, Output: c.Output,
		CacheRead: c.CacheRead, CacheWrite: c.CacheWrite, Currency: c.Currency, Effective: c.Effective})
	if err != nil {
		return graph.PriceInfo{}, graphErr(err, "model")
	}
	return priceInfo(v), nil
}

func (g priceGraph) Prices(ctx context.Context) ([]graph.PriceInfo, error) {
	list, err := g.svc.ListPrices(ctx)
	if err != nil {
		return nil, graphErr(err, "")
	}
	out := make([]graph.PriceInfo, len(list))
	for i, v := range list {
		out[i] = priceInfo(v)
	}
	return out, nil
}

func (g priceGraph) StartReprice(ctx context.Context, by keys.Key, org string, from, to time.Time) (graph.JobInfo, error) {
	j, err := g.svc.StartReprice(ctx, by, org, from, to)
	if err != nil {
		return graph.JobInfo{}, graphErr(err, "orgId")
	}
	return jobInfo(j), nil
}

func (g priceGraph) Jobs(ctx context.Context, org string, limit int) ([]graph.JobInfo, error) {
	list, err := g.svc.Jobs(ctx, org, limit)
	if err != nil {
		return nil, graphErr(err, "")
	}
	out := make([]graph.JobInfo, len(list))
	for i, j := range list {
		out[i] = jobInfo(j)
	}
	return out, nil
}

func (g priceGraph) UnpricedModels(ctx context.Context, org string, from, to time.Time, limit int) ([]graph.UnpricedInfo, error) {
	list, _, err := g.q.UnpricedModels(ctx, org, from, to, limit)
	if err != nil {
		return nil, err
	}
	out := make([]graph.UnpricedInfo, len(list))
	for i, m := range list {
		t := m.Tokens
		out[i] = graph.UnpricedInfo{Model: m.Model, Events: int64(m.Events), Input: int64(t.Input), Output: int64(t.Output),
			CacheRead: int64(t.CacheRead), CacheWrite: int64(t.CacheWrite), Reasoning: int64(t.Reasoning), Total: int64(t.Total()),
			FirstSeen: m.FirstSeen, LastSeen: m.LastSeen}
	}
	return out, nil
}

func priceInfo(v prices.PriceVersion) graph.PriceInfo {
	return graph.PriceInfo{Model: v.Model, Currency: v.Currency, Input: v.Input, Output: v.Output, CacheRead: v.CacheRead,
		CacheWrite: v.CacheWrite, CatalogVersion: strconv.FormatUint(v.CatalogVersion, 10), Effective: v.Effective}
}

func jobInfo(j prices.Job) graph.JobInfo {
	v := ""
	if j.CatalogVersion > 0 {
		v = strconv.FormatUint(j.CatalogVersion, 10)
	}
	return graph.JobInfo{ID: j.ID, Kind: j.Kind, State: string(j.State), CatalogVersion: v, RequestedBy: j.RequestedBy, Error: j.Error,
		From: j.From, To: j.To, CreatedAt: j.RequestedAt, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt,
		DaysDone: j.DaysDone, DaysTotal: j.DaysTotal, RowsScanned: int64(j.RowsScanned), RowsChanged: int64(j.RowsChanged)}
}

// graphErr reports a conflict of the price service as the caller's mistake about
// conflictField; its other errors are the GraphQL layer's kinds already.
func graphErr(err error, conflictField string) error {
	if errors.Is(err, schema.ErrConflict) && conflictField != "" {
		return &schema.FieldError{Field: conflictField, Reason: err.Error()}
	}
	return err
}
