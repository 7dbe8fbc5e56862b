package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
)

// livePart is serve's live status: the hub that GraphQL subscriptions read, and the
// live reader that feeds it from the events topic.
type livePart struct {
	hub        *graph.Hub
	live       *ingest.Live
	topic      string
	positioned atomic.Bool
}

// newLivePart builds the hub and the live reader, nil with --no-live. The ingest
// group's offsets come first: what lies after them may not be in ClickHouse yet
// (neither in the directory nor in the seed), so the live reader replays it into the
// hub before publishing (ingest.Live).
func newLivePart(ctx context.Context, d *serveDeps) (*livePart, error) {
	c := d.c
	if c.noLive {
		return nil, nil
	}
	start, err := kafka.CommittedOffsets(ctx, d.brokers, c.stack.topic, c.group)
	if err != nil {
		return nil, fmt.Errorf("cannot read the ingest group's offsets for the live reader: %w", err)
	}
	// The process's directory: what the live reader reads ahead of the pipeline names
	// the pipeline's events too.
	dir := d.dir
	hcfg := c.hub
	hcfg.Handles, hcfg.Logger, hcfg.Currency = dir, d.log.With("component", "hub"), d.prices.Live.Current().Currency()
	// A key.revoked event read live drops the key from this process at once, not at
	// the cache's next read of the store.
	hcfg.Forget = d.keys.Forget
	hub := graph.NewHub(hcfg)
	d.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bandplane_live_subscriptions", Help: "Open GraphQL subscriptions of this process."},
			func() float64 { return float64(hub.Subscribers()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bandplane_live_changes_delivered_total", Help: "Changes handed to subscriptions."},
			func() float64 { d, _ := hub.Stats(); return float64(d) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bandplane_live_subscriptions_dropped_total", Help: "Subscriptions dropped for falling behind (SLOW_SUBSCRIBER)."},
			func() float64 { _, d := hub.Stats(); return float64(d) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bandplane_live_renders_total",
			Help: "Changes rendered for WebSocket subscribers: once per render group (same selection, variables, organization and role), however many subscribers it has."},
			func() float64 { return float64(hub.Renders()) }),
	)
	live, err := ingest.NewLive(ingest.LiveConfig{Brokers: d.brokers, Topic: c.stack.topic, Directory: dir,
		Publish: hub.Publish, Replay: hub.Replay, Start: start, Logger: d.log})
	if err != nil {
		return nil, err
	}
	seeded, err := d.querier.TasksInProgress(ctx, time.Now(), hcfg.StuckAfter, graph.DefaultMaxTracked)
	if err != nil {
		return nil, fmt.Errorf("cannot seed the live hub with the tasks in progress: %w", err)
	}
	for _, t := range seeded {
		hub.SeedTask(t.OrgID, t.Task)
	}
	return &livePart{hub: hub, live: live, topic: c.stack.topic}, nil
}

// hubOrNil is the hub GraphQL subscriptions read; nil without live (they answer
// UNAVAILABLE).
func (l *livePart) hubOrNil() *graph.Hub {
	if l == nil {
		return nil
	}
	return l.hub
}

// component runs the live reader and the hub (nil without live); it is ready once the
// reader has reached the newest offsets.
func (l *livePart) component(log *slog.Logger) *component {
	if l == nil {
		return nil
	}
	return &component{name: "live", stage: stageIngest,
		run: func(ctx context.Context) error {
			var run sync.WaitGroup
			defer run.Wait()
			positioned := make(chan struct{})
			run.Go(func() { _ = l.live.Run(ctx, positioned) })
			run.Go(func() { l.hub.Run(ctx) })
			select {
			case <-positioned:
				l.positioned.Store(true)
				log.Info("live reader at the newest offsets", "topic", l.topic)
			case <-ctx.Done():
			}
			return nil
		},
		ready: func() string {
			if !l.positioned.Load() {
				return "the live reader is still catching up to the newest offsets"
			}
			return ""
		}}
}
