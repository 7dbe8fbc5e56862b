package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// PipelineConfig configures a Pipeline: where to read and write, and the consumer.
type PipelineConfig struct {
	Brokers  []string
	Topic    string
	DLQTopic string
	// StoredTopic is the stored-events topic the consumer notes what it stored on, for
	// the sealer ("": nothing is noted, so nothing is ever sealed: benchmarks only).
	StoredTopic    string
	GroupID        string
	Store          *store.Store
	RollupInterval time.Duration
	// Consumer is the consumer's configuration: its catalog, batching, retries,
	// horizons, logger and metrics (the rollup uses the same catalog, logger and
	// metrics). Its Directory is the process's directory, loaded from ClickHouse's
	// snapshot, when it shares one (nil: the pipeline loads one of its own). The pipeline
	// sets what it wires itself: the reader, the dead-letter and notes writers, the
	// storage and the state read at start.
	Consumer Config
}

// Pipeline is ingest as a process runs it: the consumer group reader, the consumer,
// the dead-letter producer, the rollup and the lag gauge, wired together.
// `bandplane serve`, the benchmark and the integration tests all run this one.
type Pipeline struct {
	cfg      PipelineConfig
	reader   *kafkago.Reader
	dlq      *kafka.Producer
	notes    *kafka.Producer // nil without StoredTopic
	consumer *Consumer
	rollup   *Rollup
}

// NewPipeline loads what the consumer needs to know from ClickHouse (the directory,
// the parties with unattributed events and the agents with unpriced usage, each within
// its horizon) and opens its Kafka reader and dead-letter producer. Close releases
// them.
func NewPipeline(ctx context.Context, cfg PipelineConfig) (*Pipeline, error) {
	c := cfg.Consumer
	if cfg.Store == nil || c.Catalog == nil {
		return nil, errors.New("ingest pipeline: store and catalog are required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if c.LateHorizon <= 0 {
		c.LateHorizon = DefaultLateHorizon
	}
	if c.UnpricedHorizon <= 0 {
		c.UnpricedHorizon = DefaultUnpricedHorizon
	}
	cfg.Consumer = c
	st := cfg.Store
	dir := c.Directory
	if dir == nil {
		dir = directory.New()
		rows, err := st.LoadDirectory(ctx)
		if err != nil {
			return nil, err
		}
		dir.Load(rows)
	}
	now := time.Now()
	late, err := st.UnattributedParties(ctx, now.Add(-c.LateHorizon))
	if err != nil {
		return nil, err
	}
	unpriced, err := st.UnpricedAgents(ctx, now.Add(-c.UnpricedHorizon))
	if err != nil {
		return nil, err
	}
	agents, people := dir.Len()
	c.Logger.Info("ingest state loaded from clickhouse", "agents", agents, "people", people,
		"unattributed_parties", len(late), "agents_with_unpriced_usage", len(unpriced))

	p := &Pipeline{cfg: cfg}
	if p.reader, err = kafka.NewReader(kafka.ReaderConfig{Brokers: cfg.Brokers, Topic: cfg.Topic, GroupID: cfg.GroupID, Logger: c.Logger}); err != nil {
		return nil, err
	}
	if p.dlq, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: cfg.Brokers, Topic: cfg.DLQTopic}); err != nil {
		_ = p.reader.Close() // the producer's error is the one reported
		return nil, err
	}
	if cfg.StoredTopic != "" {
		if p.notes, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: cfg.Brokers, Topic: cfg.StoredTopic}); err != nil {
			_ = p.Close() // the producer's error is the one reported
			return nil, err
		}
		c.Notes = noteProducer{p.notes}
	}
	p.rollup = NewRollup(st, dir, c.Catalog, cfg.RollupInterval, c.Logger, c.Metrics)
	c.Reader, c.DeadLetters, c.Storage, c.Directory, c.Topic = p.reader, p.dlq, st, dir, cfg.Topic
	c.DeadLetterMaxBytes = kafka.MaxMessageBytes
	c.LateParties, c.Unattributed, c.ReloadDirectory, c.UnpricedAgents = late, st.UnattributedParties, st.LoadDirectory, unpriced
	c.Causes = st
	c.AfterFlush = p.rollup.Mark
	p.consumer, err = New(c)
	if err != nil {
		_ = p.Close() // the consumer's error is the one reported
		return nil, err
	}
	return p, nil
}

// Healthy reports whether the consumer's last writes succeeded (readiness).
func (p *Pipeline) Healthy() bool { return p.consumer.Healthy() }

// Run consumes until ctx ends, then stops in order: the consumer flushes and commits,
// then the rollup rebuilds what that last flush touched.
func (p *Pipeline) Run(ctx context.Context) {
	rollupCtx, stopRollup := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRollup()
	var consumer, rollup sync.WaitGroup
	consumer.Add(2)
	go func() { defer consumer.Done(); _ = p.consumer.Run(ctx) }()
	go func() { defer consumer.Done(); p.pollLag(ctx) }()
	rollup.Add(1)
	go func() { defer rollup.Done(); _ = p.rollup.Run(rollupCtx) }()
	consumer.Wait()
	stopRollup()
	rollup.Wait()
}

// Close releases the Kafka reader (leaving the group) and the producers.
func (p *Pipeline) Close() error {
	err := errors.Join(p.reader.Close(), p.dlq.Close())
	if p.notes != nil {
		err = errors.Join(err, p.notes.Close())
	}
	return err
}

// noteProducer writes notes to the stored-events topic: a message per organization
// (tlog.EncodeNotes, at most tlog.MaxNotesBytes each), keyed by it, in the order
// given.
type noteProducer struct{ p *kafka.Producer }

func (n noteProducer) WriteNotes(ctx context.Context, leaves []tlog.Leaf) error {
	var orgs []string
	byOrg := map[string][]tlog.Leaf{}
	for _, l := range leaves {
		if _, ok := byOrg[l.Org]; !ok {
			orgs = append(orgs, l.Org)
		}
		byOrg[l.Org] = append(byOrg[l.Org], l)
	}
	var msgs []kafkago.Message
	for _, org := range orgs {
		for _, b := range tlog.EncodeNotes(byOrg[org]) {
			msgs = append(msgs, kafkago.Message{Key: []byte(org), Value: b})
		}
	}
	return n.p.ProduceMessages(ctx, msgs)
}

// pollLag keeps bandplane_ingest_consumer_lag current.
func (p *Pipeline) pollLag(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lag, _, err := kafka.Lag(lctx, p.cfg.Brokers, p.cfg.Topic, p.cfg.GroupID)
		cancel()
		if err != nil {
			if ctx.Err() == nil && time.Since(lastLog) > time.Minute {
				p.cfg.Consumer.Logger.Warn("cannot read consumer lag", "err", err)
				lastLog = time.Now()
			}
			continue
		}
		p.cfg.Consumer.Metrics.Lag.Set(float64(lag))
	}
}
