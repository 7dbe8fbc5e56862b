// Package bench measures ingest on the real stack: the raw ClickHouse insert rate of a
// workload's rows, the full pipeline rate (produce → Kafka → consume → ClickHouse) of
// the same events, and freshness (produce to queryable) at half the pipeline's rate.
// All three run in one process, one after another, so their ratio is meaningful on a
// noisy machine.
//
// It may import any folder but cmd/ (deploy/layers).
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Config of one benchmark run.
type Config struct {
	Events         int
	Seed           int64
	BatchSize      int
	BatchAge       time.Duration
	Partitions     int
	Freshness      time.Duration // how long the freshness phase produces
	RollupInterval time.Duration // as bandplane serve --rollup-interval
	ProbeEvery     int           // every n-th event of the freshness phase is timed
	Brokers        []string
	ClickHouse     chdb.Config // Database is a prefix: each phase uses its own database
	KeepData       bool
	// OTLPReports, when > 0, adds the OTLP phase (otlp.go): that many usage reports
	// through the native collector and through the OTLP receiver, OTLPBatch a request.
	OTLPReports, OTLPBatch int
	Logger                 *slog.Logger
	Progress               func(format string, args ...any)
}

func (c *Config) Validate() error {
	var errs []error
	if c.Events < 1000 {
		errs = append(errs, fmt.Errorf("--events must be >= 1000, got %d", c.Events))
	}
	if c.BatchSize <= 0 {
		errs = append(errs, fmt.Errorf("--batch-size must be > 0, got %d", c.BatchSize))
	}
	if c.BatchAge <= 0 {
		errs = append(errs, fmt.Errorf("--batch-age must be > 0, got %s", c.BatchAge))
	}
	if c.Partitions <= 0 {
		errs = append(errs, fmt.Errorf("--partitions must be > 0, got %d", c.Partitions))
	}
	if c.Freshness <= 0 {
		errs = append(errs, fmt.Errorf("--freshness must be > 0, got %s", c.Freshness))
	}
	if c.OTLPReports < 0 || (c.OTLPReports > 0 && c.OTLPReports < 1000) {
		errs = append(errs, fmt.Errorf("--otlp-reports must be >= 1000, got %d", c.OTLPReports))
	}
	if c.OTLPReports > 0 && (c.OTLPBatch <= 0 || c.OTLPBatch > ingest.DefaultMaxLines) {
		errs = append(errs, fmt.Errorf("--otlp-batch must be in [1, %d], got %d", ingest.DefaultMaxLines, c.OTLPBatch))
	}
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no kafka brokers (--kafka)"))
	}
	return errors.Join(errs...)
}

// Result is the one JSON line `bandplane bench ingest` prints.
type Result struct {
	Events             int     `json:"events"`
	RawRowsPerS        float64 `json:"raw_rows_per_s"`
	PipelineEventsPerS float64 `json:"pipeline_events_per_s"`
	Ratio              float64 `json:"ratio"`
	FreshnessP50Ms     float64 `json:"freshness_p50_ms"`
	FreshnessP99Ms     float64 `json:"freshness_p99_ms"`
	FreshnessRate      float64 `json:"freshness_rate_events_per_s"`
	FreshnessProbes    int     `json:"freshness_probes"`
	RawSeconds         float64 `json:"raw_s"`
	PipelineSeconds    float64 `json:"pipeline_s"`
	ProduceSeconds     float64 `json:"pipeline_produce_s"`
	UsageRows          int     `json:"usage_rows"`
	BatchSize          int     `json:"batch_size"`
	BatchAgeMs         int64   `json:"batch_age_ms"`
	Partitions         int     `json:"partitions"`
	*OTLPResult
}

// workload is the benchmark's events, generated and encoded once, outside every timer.
type workload struct {
	events []schema.Event
	msgs   []kafkago.Message
}

func generate(ctx context.Context, cfg Config) (*workload, error) {
	sc := simulate.DefaultConfig()
	sc.Events, sc.Seed, sc.BatchSize = cfg.Events, cfg.Seed, 10000
	sc.Orgs, sc.OwnersPerOrg, sc.AgentsPerOwner, sc.Rooms = 10, 5, 4, 200
	sc.Start = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	w := &workload{events: make([]schema.Event, 0, cfg.Events)}
	_, err := simulate.Run(ctx, sc, simulate.SinkFunc(func(ctx context.Context, lines [][]byte) error {
		evs, rejects := ingest.DecodeLines(lines)
		if len(rejects) > 0 {
			return fmt.Errorf("simulator line %d: %s", rejects[0].Line, rejects[0].Reason)
		}
		w.events = append(w.events, evs...)
		return nil
	}), nil)
	if err != nil {
		return nil, err
	}
	// The simulator paces time like a busy workspace (about a day per 6,000 events), so
	// 1M events would span months and every batch would scatter over many daily
	// partitions. A stream this fast covers minutes: spread the workload, in order, over
	// one hour ending now. Raw and pipeline phases insert the same rows.
	end := time.Now().UTC()
	step := time.Hour / time.Duration(len(w.events))
	for i := range w.events {
		w.events[i].Time = end.Add(-time.Hour + time.Duration(i)*step).Truncate(time.Millisecond)
	}
	w.msgs = make([]kafkago.Message, len(w.events))
	for i := range w.events {
		b, err := json.Marshal(&w.events[i])
		if err != nil {
			return nil, err
		}
		w.msgs[i] = kafkago.Message{Key: []byte(w.events[i].Key()), Value: b}
	}
	return w, nil
}

// Run runs the three phases.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	res := Result{Events: cfg.Events, BatchSize: cfg.BatchSize, BatchAgeMs: cfg.BatchAge.Milliseconds(), Partitions: cfg.Partitions}
	cfg.Progress("generating %d events", cfg.Events)
	w, err := generate(ctx, cfg)
	if err != nil {
		return res, fmt.Errorf("cannot generate the workload: %w", err)
	}
	conn, err := chdb.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return res, err
	}
	defer conn.Close()
	stamp := time.Now().UTC().Format("20060102_150405")

	// (a) raw inserts of the same rows, built beforehand.
	rawDB := cfg.ClickHouse.Database + "_bench_raw_" + stamp
	if err := freshDB(ctx, conn, cfg.ClickHouse, rawDB); err != nil {
		return res, err
	}
	if !cfg.KeepData {
		defer dropDB(conn, rawDB, cfg.ClickHouse.Cluster)
	}
	batches, usage, err := rowBatches(w.events, cfg.BatchSize)
	if err != nil {
		return res, err
	}
	res.UsageRows = usage
	cfg.Progress("raw: inserting %d events (+%d usage rows) in batches of %d", len(w.events), usage, cfg.BatchSize)
	st := store.New(conn, rawDB)
	start := time.Now()
	for _, b := range batches {
		if err := st.BatchInsert(ctx, b); err != nil {
			return res, fmt.Errorf("raw insert: %w", err)
		}
	}
	res.RawSeconds = time.Since(start).Seconds()
	res.RawRowsPerS = float64(len(w.events)) / res.RawSeconds
	cfg.Progress("raw: %.0f rows/s", res.RawRowsPerS)

	// (b) the full pipeline, as fast as it goes.
	p, err := newPipeline(ctx, cfg, conn, stamp+"_p")
	if err != nil {
		return res, err
	}
	cfg.Progress("pipeline: producing and consuming %d events", len(w.events))
	start = time.Now()
	produced := make(chan error, 1)
	go func() {
		err := produceAll(ctx, p.producer, w.msgs)
		res.ProduceSeconds = time.Since(start).Seconds()
		produced <- err
	}()
	if err := p.waitCount(ctx, uint64(len(w.events))+1, produced); err != nil { // +1: the warm-up sentinel
		p.close()
		return res, err
	}
	res.PipelineSeconds = time.Since(start).Seconds()
	res.PipelineEventsPerS = float64(len(w.events)) / res.PipelineSeconds
	res.Ratio = res.PipelineEventsPerS / res.RawRowsPerS
	cfg.Progress("pipeline: %.0f events/s (ratio %.2f)", res.PipelineEventsPerS, res.Ratio)
	p.close()

	// (c) freshness at half the pipeline's rate.
	rate := res.PipelineEventsPerS / 2
	n := min(int(rate*cfg.Freshness.Seconds()), len(w.events))
	res.FreshnessRate = rate
	p, err = newPipeline(ctx, cfg, conn, stamp+"_f")
	if err != nil {
		return res, err
	}
	defer p.close()
	cfg.Progress("freshness: %d events at %.0f/s, timing every %dth", n, rate, cfg.ProbeEvery)
	lat, err := p.freshness(ctx, w, n, rate, cfg.ProbeEvery)
	if err != nil {
		return res, err
	}
	res.FreshnessProbes = len(lat)
	res.FreshnessP50Ms = percentile(lat, 0.50)
	res.FreshnessP99Ms = percentile(lat, 0.99)
	cfg.Progress("freshness: p50 %.0f ms, p99 %.0f ms", res.FreshnessP50Ms, res.FreshnessP99Ms)
	if cfg.OTLPReports > 0 {
		if res.OTLPResult, err = runOTLP(ctx, cfg, conn, stamp); err != nil {
			return res, fmt.Errorf("otlp phase: %w", err)
		}
		cfg.Progress("otlp: %.0f spans/s, %.2f× the native collector's %.0f reports/s", res.OTLPSpansPerS, res.OTLPRatio, res.NativeReportsPerS)
	}
	return res, nil
}

// rowBatches builds the rows the pipeline writes for events, in batches of size: the
// events, their usage linked to its cause, and the cause links (the work-status rows
// BatchInsert derives itself).
func rowBatches(events []schema.Event, size int) ([]*store.Batch, int, error) {
	var out []*store.Batch
	cat := pricing.Default()
	dir := directory.New()
	links := ingest.NewTracker(dir)
	usage := 0
	for i := 0; i < len(events); i += size {
		b := &store.Batch{}
		for j := i; j < min(i+size, len(events)); j++ {
			ev := events[j] // Rows enriches its argument; keep the workload as produced
			r, u, c, err := ingest.Rows(&ev, dir, cat, links)
			if err != nil {
				return nil, 0, err
			}
			b.Events = append(b.Events, r)
			if u != nil {
				b.Usage = append(b.Usage, *u)
				usage++
			}
			if c != nil {
				b.Causes = append(b.Causes, *c)
			}
		}
		out = append(out, b)
	}
	return out, usage, nil
}

// freshDB makes db on cfg's server or cluster.
func freshDB(ctx context.Context, conn driver.Conn, cfg chdb.Config, db string) error {
	cfg.Database = db
	_, err := chdb.MigrateOn(ctx, conn, cfg)
	return err
}

func dropDB(conn driver.Conn, db, c string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	q := "DROP DATABASE IF EXISTS " + db
	if c != "" {
		q += " ON CLUSTER " + c
	}
	_ = conn.Exec(ctx, q)
}

func produceAll(ctx context.Context, p *kafka.Producer, msgs []kafkago.Message) error {
	const chunk = 20000
	for i := 0; i < len(msgs); i += chunk {
		if err := p.ProduceMessages(ctx, msgs[i:min(i+chunk, len(msgs))]); err != nil {
			return err
		}
	}
	return nil
}

type pipeline struct {
	cfg      Config
	conn     driver.Conn
	db       string
	topic    string
	producer *kafka.Producer
	ingest   *ingest.Pipeline
	cancel   context.CancelFunc
	done     chan struct{}
}

func newPipeline(ctx context.Context, cfg Config, conn driver.Conn, suffix string) (*pipeline, error) {
	p := &pipeline{cfg: cfg, conn: conn, db: cfg.ClickHouse.Database + "_bench_" + suffix, topic: "bandplane.bench." + suffix}
	if err := freshDB(ctx, conn, cfg.ClickHouse, p.db); err != nil {
		return nil, err
	}
	for _, t := range []string{p.topic, p.topic + ".dlq", p.topic + ".stored"} {
		if err := kafka.EnsureTopic(ctx, cfg.Brokers, t, cfg.Partitions); err != nil {
			return nil, err
		}
	}
	var err error
	if p.producer, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: cfg.Brokers, Topic: p.topic, BatchSize: 10000}); err != nil {
		return nil, err
	}
	// The same pipeline `bandplane serve` runs, with the benchmark's batching (and its
	// notes for the sealer).
	p.ingest, err = ingest.NewPipeline(ctx, ingest.PipelineConfig{
		Brokers: cfg.Brokers, Topic: p.topic, DLQTopic: p.topic + ".dlq", StoredTopic: p.topic + ".stored", GroupID: "bench",
		Store: store.New(conn, p.db), RollupInterval: cfg.RollupInterval,
		Consumer: ingest.Config{Catalog: pricing.Default(), BatchSize: cfg.BatchSize, BatchAge: cfg.BatchAge, Logger: cfg.Logger},
	})
	if err != nil {
		_ = p.producer.Close() // the pipeline's error is the one reported
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel, p.done = cancel, make(chan struct{})
	go func() { defer close(p.done); p.ingest.Run(rctx) }()
	if err := p.warmUp(ctx); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// warmUp waits until the consumer has joined its group and stored a sentinel event, so
// that timed phases measure the running pipeline, not the group join (1-3 s).
func (p *pipeline) warmUp(ctx context.Context) error {
	ev := schema.Event{ID: "bench-warmup-" + p.topic, Type: "bench.warmup", Time: time.Now().UTC(),
		OrgID: "bench", Actor: schema.Party{ID: "bench", Type: schema.ActorSystem}, Source: "bench", SchemaVersion: schema.Version}
	if err := p.producer.Produce(ctx, []schema.Event{ev}); err != nil {
		return err
	}
	return p.waitCount(ctx, 1, nil)
}

func (p *pipeline) close() {
	p.cancel()
	<-p.done
	_ = p.ingest.Close()
	_ = p.producer.Close()
	c := &kafkago.Client{Addr: kafkago.TCP(p.cfg.Brokers...), Timeout: 10 * time.Second}
	_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{p.topic, p.topic + ".dlq", p.topic + ".stored"}})
	if !p.cfg.KeepData {
		dropDB(p.conn, p.db, p.cfg.ClickHouse.Cluster)
	}
}

// waitCount polls until the audit trail holds n rows and the producer has finished
// without error.
func (p *pipeline) waitCount(ctx context.Context, n uint64, produced <-chan error) error {
	last, lastChange := uint64(0), time.Now()
	producing := produced != nil
	for {
		if producing {
			select {
			case err := <-produced:
				if err != nil {
					return fmt.Errorf("cannot produce the workload: %w", err)
				}
				producing = false
			default:
			}
		}
		var got uint64
		if err := p.conn.QueryRow(ctx, "SELECT count() FROM "+p.db+".events").Scan(&got); err != nil {
			return fmt.Errorf("cannot count %s.events: %w", p.db, err)
		}
		if got >= n && !producing {
			return nil
		}
		if got != last {
			last, lastChange = got, time.Now()
		} else if time.Since(lastChange) > 60*time.Second {
			return fmt.Errorf("pipeline stalled at %d of %d events for 60s", got, n)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// freshness produces n events at rate, in 10 ms slices, and times every probeEvery-th
// from the moment it is handed to the producer until a query finds it.
func (p *pipeline) freshness(ctx context.Context, w *workload, n int, rate float64, probeEvery int) ([]float64, error) {
	var mu sync.Mutex
	probes := map[string]*probe{}
	var pending []string
	done := make(chan error, 1)
	go func() {
		const slice = 10 * time.Millisecond
		per := rate * slice.Seconds()
		start := time.Now()
		sent := 0
		for sent < n {
			due := int(math.Min(float64(n), per*float64(time.Since(start)/slice+1)))
			if due > sent {
				now := time.Now()
				mu.Lock()
				for i := sent; i < due; i++ {
					if i%probeEvery == 0 {
						id := w.events[i].ID
						probes[id] = &probe{sent: now, evTime: w.events[i].Time}
						pending = append(pending, id)
					}
				}
				mu.Unlock()
				if err := p.producer.ProduceMessages(ctx, w.msgs[sent:due]); err != nil {
					done <- err
					return
				}
				sent = due
			}
			next := start.Add(time.Duration(sent/int(math.Max(per, 1))) * slice)
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
		}
		done <- nil
	}()
	var lat []float64
	producing := true
	deadline := time.Time{}
	for {
		if producing {
			select {
			case err := <-done:
				if err != nil {
					return nil, err
				}
				producing = false
				deadline = time.Now().Add(60 * time.Second)
			default:
			}
		}
		mu.Lock()
		ids := append([]string(nil), pending...)
		since := minTime(probes, ids)
		mu.Unlock()
		if len(ids) > 0 {
			rows, err := p.conn.Query(ctx, "SELECT id FROM "+p.db+".events WHERE time >= ? AND has(?, id)", since, ids)
			if err != nil {
				return nil, fmt.Errorf("cannot poll %s.events: %w", p.db, err)
			}
			now := time.Now()
			seen := map[string]bool{}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return nil, err
				}
				seen[id] = true
			}
			rows.Close()
			mu.Lock()
			kept := pending[:0]
			for _, id := range pending {
				if seen[id] && !probes[id].seen {
					probes[id].seen = true
					lat = append(lat, float64(now.Sub(probes[id].sent).Microseconds())/1000)
				} else if !seen[id] {
					kept = append(kept, id)
				}
			}
			pending = kept
			left := len(pending)
			mu.Unlock()
			if !producing && left == 0 {
				return lat, nil
			}
		}
		if !producing && time.Now().After(deadline) {
			return nil, fmt.Errorf("freshness: %d probes never became queryable", len(pending))
		}
		// 50 ms between polls: finer would load the database being measured, for an
		// error that is small against the 2 s goal.
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

type probe struct {
	sent   time.Time
	evTime time.Time
	seen   bool
}

// minTime is the earliest event time among the pending probes: a lower bound that lets
// the poll skip most of the table.
func minTime(probes map[string]*probe, ids []string) time.Time {
	var t time.Time
	for _, id := range ids {
		if pr := probes[id]; t.IsZero() || pr.evTime.Before(t) {
			t = pr.evTime
		}
	}
	return t.Truncate(time.Second)
}

func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}
