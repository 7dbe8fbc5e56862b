// Package prices owns prices as data: the catalog versions kept in ClickHouse (table
// prices), who may change them, the live catalog ingest and the policy replica price
// with (refreshed from ClickHouse every couple of seconds, so a price change reaches
// ingest without a restart), and the reprice jobs that apply a catalog to history
// (table jobs), run in the background by every `bandplane serve` and in the
// foreground by `bandplane reprice`.
//
// # Catalog versions
//
// Version 1 is the seed (the built-in catalog.json, or --catalog), written when the
// table is empty. Every upsert writes version max + 1: the previous version with one
// model's entry for one effective time added or replaced. A version's catalog is, for
// each (model, effective), the row of the highest (version, set_at, set_id) at or below
// it. Two upserts racing from two processes may both write version N + 1: both apply
// (nothing is lost), and a reader that saw only the first for a moment priced with "N +
// 1" without the second; within one process upserts are serialized.
//
// # Reprice jobs
//
// See Service.StartReprice and the README ("Prices and reprice jobs") for what a job
// guarantees: it never double counts (a repriced usage row replaces the old one), and
// a range it is working on is never shown as final (query.CostReport.Repricing names
// the unfinished jobs overlapping an answer).
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package prices

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Config configures a Service.
type Config struct {
	Conn     driver.Conn
	Database string
	// Seed is stored as catalog version 1 when the prices table is empty.
	Seed *pricing.Catalog
	// Auditor writes the price.* and job.* events. Without it the service only reads
	// (ListPrices, Jobs, the live catalog); every write fails.
	Auditor Producer
	// ReadOnly never writes: an empty table is served from Seed in memory, as version 0
	// (`bandplane prices list` on a fresh database).
	ReadOnly   bool
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are kept but not exported

	Refresh    time.Duration // how often Run re-reads the prices (default 2 s)
	Poll       time.Duration // how often Run looks for a job to run (default 2 s)
	Heartbeat  time.Duration // how often a running job says it is alive (default 5 s)
	StaleAfter time.Duration // a running job silent this long is resumed by another runner (default 30 s)
	Retry      time.Duration // first back-off of a failed day of a job, doubled up to a minute, 8 tries (default 1 s)
	// MaxJobs bounds the reprice jobs queued or running at once (default
	// DefaultMaxJobs), MaxJobsPerOrg those of one organization (default
	// DefaultMaxJobsPerOrg; a job counts for the organization it reprices, '*' for a job
	// of every organization) and MaxJobsPerKey those one requester asked for (the API
	// key, or the CLI's --by; default DefaultMaxJobsPerKey). MaxJobsPerOrg of MaxJobs are
	// the platform's only, so that tenants filling the queue never keep the platform's
	// jobs out. A request over its share is refused at once (schema.ErrTooMany).
	MaxJobs, MaxJobsPerOrg, MaxJobsPerKey int
	// Runner names this process in the jobs it runs (default host:pid:random).
	Runner string
	// OnProgress, when set, is called with a job's state after each day it finishes and
	// when it stops (the CLI prints it).
	OnProgress func(Job)
	Now        func() time.Time
}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Refresh <= 0 {
		c.Refresh = 2 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 2 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 5 * time.Second
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 30 * time.Second
	}
	if c.Retry <= 0 {
		c.Retry = time.Second
	}
	lim := c.queueLimits()
	c.MaxJobs, c.MaxJobsPerOrg, c.MaxJobsPerKey = lim.Total, lim.PerGroup, lim.PerClient
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Runner == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Runner = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
}

// Validate reports every problem of the config at once.
func (c Config) Validate() error {
	var errs []error
	if c.Conn == nil {
		errs = append(errs, errors.New("prices: no ClickHouse connection"))
	}
	if c.Database == "" {
		errs = append(errs, errors.New("prices: no database"))
	}
	if c.Heartbeat > 0 && c.StaleAfter > 0 && c.StaleAfter < 2*c.Heartbeat {
		errs = append(errs, fmt.Errorf("prices: the stale limit (%s) must be at least twice the heartbeat (%s)", c.StaleAfter, c.Heartbeat))
	}
	if c.MaxJobs < 0 || c.MaxJobsPerOrg < 0 || c.MaxJobsPerKey < 0 {
		errs = append(errs, fmt.Errorf("prices: the job bounds must not be negative (MaxJobs %d, MaxJobsPerOrg %d, MaxJobsPerKey %d)",
			c.MaxJobs, c.MaxJobsPerOrg, c.MaxJobsPerKey))
	} else if lim := c.queueLimits(); lim.Total < 2*lim.PerGroup {
		errs = append(errs, fmt.Errorf("prices: MaxJobs (%d) must be at least twice MaxJobsPerOrg (%d): the platform keeps one organization's share of the queue",
			lim.Total, lim.PerGroup))
	}
	return errors.Join(errs...)
}

// Service is the price catalog in ClickHouse, its live copy, and the reprice jobs.
type Service struct {
	cfg  Config
	st   *store.Store
	log  *slog.Logger
	live *pricing.Live
	m    *metrics

	mu      sync.Mutex // serializes catalog writes and reloads; guards the fields below
	cat     *pricing.Catalog
	version uint64 // of cat; 0: the seed, not stored (ReadOnly)
	rows    []store.PriceRow
	meta    map[entryKey]store.PriceRow // the row that set each entry of cat
	state   [2]uint64                   // PricesState when rows were read

	jobsMu sync.Mutex // serializes job requests in this process

	claimMu   sync.Mutex           // guards the fields below
	lastClaim map[string]time.Time // when this runner last claimed a job of each organization with unfinished jobs
	queueWarn time.Time            // when a queue read last warned of rows left out

	verMu   sync.Mutex
	lastVer uint64
}

type metrics struct {
	version       prometheus.Gauge
	refreshErrors prometheus.Counter
	jobs          *prometheus.CounterVec
	rowsChanged   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		version: prometheus.NewGauge(prometheus.GaugeOpts{Name: "bandplane_prices_catalog_version",
			Help: "The price catalog version ingest prices with (0: the seed, not stored)."}),
		refreshErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_prices_refresh_errors_total",
			Help: "Failed reads of the prices from ClickHouse (the last catalog read stays in use)."}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_prices_reprice_jobs_total",
			Help: "Reprice jobs this process ended, by final state (done, failed)."}, []string{"state"}),
		rowsChanged: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_prices_repriced_rows_total",
			Help: "Usage rows reprice jobs of this process rewrote."}),
	}
	if reg != nil {
		reg.MustRegister(m.version, m.refreshErrors, m.jobs, m.rowsChanged)
	}
	return m
}

// New loads the newest catalog version from ClickHouse, seeding the empty table with
// cfg.Seed first.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	s := &Service{cfg: cfg, st: store.New(cfg.Conn, cfg.Database), log: cfg.Logger.With("component", "prices"), m: newMetrics(cfg.Registerer),
		lastClaim: map[string]time.Time{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.reload(ctx, true); err != nil {
		return nil, err
	}
	if s.cat == nil {
		if err := s.seed(ctx); err != nil {
			return nil, err
		}
	}
	s.live = pricing.NewLive(s.cat)
	return s, nil
}

// Live is the catalog to price with now: the newest version Run has read (or this
// process has written). It never blocks.
func (s *Service) Live() pricing.Source { return s.live }

// CurrentVersion is the catalog version Live gives.
func (s *Service) CurrentVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Refresh re-reads the prices if they changed since the last read, and makes the
// newest version live.
func (s *Service) Refresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.reload(ctx, false); err != nil {
		s.m.refreshErrors.Inc()
		return err
	}
	return nil
}

// reload reads the prices (unless force is false and nothing changed) and makes the
// newest version current. With an empty table it leaves s.cat as it is. s.mu is held.
func (s *Service) reload(ctx context.Context, force bool) error {
	version, n, err := s.st.PricesState(ctx)
	if err != nil {
		return err
	}
	if !force && s.cat != nil && [2]uint64{version, n} == s.state {
		return nil
	}
	rows, err := s.st.LoadPrices(ctx)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		if s.cat != nil && s.version > 0 {
			return fmt.Errorf("%s.prices is empty: keeping catalog version %d", s.cfg.Database, s.version)
		}
		return nil
	}
	cat, meta, v, err := fold(rows, 0)
	if err != nil {
		return fmt.Errorf("cannot build the catalog from %s.prices (keeping version %d): %w", s.cfg.Database, s.version, err)
	}
	if s.cat != nil && v != s.version {
		s.log.Info("price catalog changed", "catalog_version", v, "previous", s.version)
	}
	s.cat, s.meta, s.version, s.rows, s.state = cat, meta, v, rows, [2]uint64{version, n}
	if s.live != nil {
		s.live.Set(cat)
	}
	s.m.version.Set(float64(v))
	return nil
}

// seed stores cfg.Seed as version 1 (or, ReadOnly, serves it as version 0). s.mu is held.
func (s *Service) seed(ctx context.Context) error {
	seed := s.cfg.Seed
	if seed == nil {
		return fmt.Errorf("%s.prices is empty and there is no catalog to seed it with", s.cfg.Database)
	}
	if s.cfg.ReadOnly {
		c, err := pricing.New("0", seed.Currency(), seed.Prices())
		if err != nil {
			return err
		}
		s.cat, s.version, s.meta = c, 0, map[entryKey]store.PriceRow{}
		return nil
	}
	now := s.cfg.Now().UTC().Truncate(time.Second)
	setID := newID()
	var rows []store.PriceRow
	for _, p := range seed.Prices() {
		r := rowOf(p, seed.Currency())
		r.CatalogVersion, r.SetBy, r.SetAt, r.SetID = 1, Source, now, setID
		r.Note = "seed: catalog version " + seed.Version()
		rows = append(rows, r)
	}
	if _, _, _, err := fold(rows, 0); err != nil {
		return fmt.Errorf("cannot seed %s.prices: %w", s.cfg.Database, err)
	}
	ev := event(TypePriceSeeded, "", Source, "catalog", now, SeedEventData{CatalogVersion: 1, SeedVersion: seed.Version(),
		Currency: seed.Currency(), Entries: len(rows)})
	if err := s.audit(ctx, ev); err != nil {
		return err
	}
	if err := s.st.InsertPrices(ctx, rows); err != nil {
		return err
	}
	s.log.Info("seeded the price catalog", "catalog_version", 1, "seed_version", seed.Version(), "entries", len(rows))
	if err := s.reload(ctx, true); err != nil {
		return err
	}
	if s.cat == nil {
		return fmt.Errorf("%s.prices is still empty after seeding it", s.cfg.Database)
	}
	return nil
}

// Run keeps the live catalog current and runs reprice jobs until ctx ends: one at a
// time, queued or abandoned by a silent runner, taken in turn across organizations
// (claimOrder), never one that could reprice the rows of a job running elsewhere. A
// job running when ctx ends is put back in the queue at its last checkpoint, for the
// next runner. Errors are logged; Run returns when ctx ends and its job has stopped.
func (s *Service) Run(ctx context.Context) error {
	refresh := time.NewTicker(s.cfg.Refresh)
	defer refresh.Stop()
	poll := time.NewTicker(s.cfg.Poll)
	defer poll.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	busy := make(chan struct{}, 1)
	var lastErr time.Time
	logErr := func(msg string, err error) {
		if ctx.Err() == nil && time.Since(lastErr) > time.Minute {
			s.log.Warn(msg, "err", err)
			lastErr = time.Now()
		}
	}
	tryJob := func() {
		select {
		case busy <- struct{}{}:
		default:
			return // a job is running
		}
		j, ok, err := s.claim(ctx)
		if err != nil {
			logErr("cannot look for reprice jobs, will retry", err)
		}
		if !ok {
			<-busy
			return
		}
		wg.Go(func() {
			defer func() { <-busy }()
			s.run(ctx, j)
		})
	}
	tryJob()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-refresh.C:
			if err := s.Refresh(ctx); err != nil {
				logErr("cannot refresh the price catalog, keeping the one in use", err)
			}
		case <-poll.C:
			tryJob()
		}
	}
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// nextVersion is a job row version: nanoseconds, increasing within the process.
func (s *Service) nextVersion() uint64 {
	s.verMu.Lock()
	defer s.verMu.Unlock()
	v := uint64(s.cfg.Now().UnixNano())
	if v <= s.lastVer {
		v = s.lastVer + 1
	}
	s.lastVer = v
	return v
}

// finalVersion is the version of a finished job's row: above every nextVersion of any
// process (2^63 + ns), so that no running-state write can bring the job back.
func (s *Service) finalVersion() uint64 { return 1<<63 | s.nextVersion() }

// directory loads the agents' registered models (a job prices usage of model
// "unknown" with them, as ingest's reprice of late registrations does).
func (s *Service) directory(ctx context.Context) (*directory.Directory, error) {
	dir := directory.New()
	rows, err := s.st.LoadDirectory(ctx)
	if err != nil {
		return nil, err
	}
	dir.Load(rows)
	return dir, nil
}

// stamp is now to the second: the precision of the jobs table's times.
func (s *Service) stamp() time.Time { return s.cfg.Now().UTC().Truncate(time.Second) }
