package querybench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// The simulated world of the benchmark: 3 organizations (as in the design's "Reading
// at scale" measurements), 150 generated agents plus the tutorial's cast, 60 rooms.
// A change here changes layout, so a database loaded with another world is reloaded.
const (
	orgs           = 3
	ownersPerOrg   = 10
	agentsPerOwner = 5
	rooms          = 60
	layoutVersion  = 1
)

// markerTable records a finished load in the benchmark's database: a load that
// stopped half-way has none and is redone from scratch.
const markerTable = "bench_query_load"

// Loaded is what the marker says about the data.
type Loaded struct {
	Seed     int64
	Events   int
	Layout   string
	DataEnd  time.Time // the newest event's time (the data covers Days before it)
	Seconds  float64   // how long the load took
	LoadedAt time.Time
}

func (c *Config) layout() string {
	return fmt.Sprintf("v%d orgs=%d owners=%d agents=%d rooms=%d days=%d distinct=%d",
		layoutVersion, orgs, ownersPerOrg, agentsPerOwner, rooms, c.Days, c.Distinct)
}

// readMarker returns the database's load marker, if it has one.
func readMarker(ctx context.Context, conn driver.Conn, db string) (Loaded, bool, error) {
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", db, markerTable).Scan(&n); err != nil {
		return Loaded{}, false, fmt.Errorf("cannot look for %s.%s: %w", db, markerTable, err)
	}
	if n == 0 {
		return Loaded{}, false, nil
	}
	var m Loaded
	var seed, events uint64
	err := conn.QueryRow(ctx, "SELECT seed, events, layout, data_end, seconds, loaded_at FROM "+db+"."+markerTable+" ORDER BY loaded_at DESC LIMIT 1").
		Scan(&seed, &events, &m.Layout, &m.DataEnd, &m.Seconds, &m.LoadedAt)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Loaded{}, false, nil
		}
		return Loaded{}, false, fmt.Errorf("cannot read %s.%s: %w", db, markerTable, err)
	}
	m.Seed, m.Events, m.DataEnd = int64(seed), int(events), m.DataEnd.UTC()
	return m, true, nil
}

func writeMarker(ctx context.Context, conn driver.Conn, db string, m Loaded) error {
	if err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+db+"."+markerTable+
		" (seed UInt64, events UInt64, layout String, data_end DateTime('UTC'), seconds Float64, loaded_at DateTime('UTC')) ENGINE = MergeTree() ORDER BY loaded_at"); err != nil {
		return fmt.Errorf("cannot create %s.%s: %w", db, markerTable, err)
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+"."+markerTable+" (seed, events, layout, data_end, seconds, loaded_at)")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.%s: %w", db, markerTable, err)
	}
	defer b.Abort()
	if err := b.Append(uint64(m.Seed), uint64(m.Events), m.Layout, m.DataEnd, m.Seconds, m.LoadedAt); err != nil {
		return fmt.Errorf("cannot append to %s.%s: %w", db, markerTable, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert into %s.%s: %w", db, markerTable, err)
	}
	return nil
}

// ensureData reuses the database's events when its marker says they are the ones
// asked for (same seed and layout, at least as many events), else drops the database
// and loads it again.
func ensureData(ctx context.Context, cfg *Config, conn driver.Conn) (Loaded, bool, error) {
	db := cfg.ClickHouse.Database
	if !cfg.Reload {
		m, ok, err := readMarker(ctx, conn, db)
		if err != nil {
			return Loaded{}, false, err
		}
		switch {
		case ok && m.Seed == cfg.Seed && m.Layout == cfg.layout() && m.Events >= cfg.Events:
			if err := chdb.CheckVersion(ctx, conn, db); err == nil {
				cfg.Progress("reusing %d events of seed %d in %s, loaded %s (--reload loads them again)",
					m.Events, m.Seed, db, m.LoadedAt.Format(time.RFC3339))
				return m, true, nil
			}
			cfg.Progress("%s holds the events but an older schema: loading again", db)
		case ok:
			cfg.Progress("%s holds %d events of seed %d (%s); want %d of seed %d (%s): loading again",
				db, m.Events, m.Seed, m.Layout, cfg.Events, cfg.Seed, cfg.layout())
		}
	}
	if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		return Loaded{}, false, fmt.Errorf("cannot drop database %s: %w", db, err)
	}
	if _, err := chdb.Migrate(ctx, conn, db); err != nil {
		return Loaded{}, false, err
	}
	m, err := load(ctx, cfg, conn)
	if err != nil {
		return Loaded{}, false, err
	}
	if err := writeMarker(ctx, conn, db, m); err != nil {
		return Loaded{}, false, err
	}
	return m, false, nil
}

// base is the simulator's distinct events, as the rows ingest would store for them
// (enriched and priced once).
type base struct {
	events []store.EventRow
	usage  []*store.UsageRow // by event; nil for events without usage
	dir    []*store.DirectoryRow
}

// generate runs the simulator for n events and builds their rows the way ingest
// does (ingest.Rows), keeping the directory rows that ingest.Rows leaves out.
func generate(ctx context.Context, cfg *Config, n int) (*base, error) {
	sc := simulate.DefaultConfig()
	sc.Events, sc.Seed, sc.BatchSize = n, cfg.Seed, 10000
	sc.Orgs, sc.OwnersPerOrg, sc.AgentsPerOwner, sc.Rooms = orgs, ownersPerOrg, agentsPerOwner, rooms
	// A fixed start makes the lines, ids included, the same on every run (the times
	// are replaced below anyway).
	sc.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cat := pricing.Default()
	dir := directory.New()
	links := ingest.NewTracker(dir) // usage linked to its cause, as ingest does
	b := &base{events: make([]store.EventRow, 0, n), usage: make([]*store.UsageRow, 0, n), dir: make([]*store.DirectoryRow, 0, n)}
	last := time.Now()
	_, err := simulate.Run(ctx, sc, simulate.SinkFunc(func(ctx context.Context, lines [][]byte) error {
		evs, rejects := ingest.DecodeLines(lines)
		if len(rejects) > 0 {
			return fmt.Errorf("simulator line %d: %s", rejects[0].Line, rejects[0].Reason)
		}
		for i := range evs {
			ev := &evs[i]
			var dr *store.DirectoryRow
			if schema.IsDirectoryType(ev.Type) {
				r, err := dir.Apply(ev) // ingest.Rows applies it too, harmlessly (same version)
				if err != nil {
					return err
				}
				dr = &r
			}
			r, u, _, err := ingest.Rows(ev, dir, cat, links)
			if err != nil {
				return err
			}
			b.events, b.usage, b.dir = append(b.events, r), append(b.usage, u), append(b.dir, dr)
		}
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			cfg.Progress("load: simulated %d of %d distinct events", len(b.events), n)
		}
		return nil
	}), nil)
	if err != nil {
		return nil, fmt.Errorf("cannot simulate %d events: %w", n, err)
	}
	return b, nil
}

// copyID is the id of an event's pass-th repetition: the first 32 bits of the UUID
// XOR pass. Unique: two ids collide only with equal last 96 bits (the same event) and
// then equal passes.
func copyID(id string, pass int) string {
	if pass == 0 {
		return id
	}
	if len(id) == 36 && id[8] == '-' {
		if p, err := strconv.ParseUint(id[:8], 16, 32); err == nil {
			return fmt.Sprintf("%08x", uint32(p)^uint32(pass)) + id[8:]
		}
	}
	return id + "~" + strconv.Itoa(pass)
}

// load writes cfg.Events events spread evenly over cfg.Days ending now: the first
// cfg.Distinct from the simulator, the rest repeating them in order with fresh ids
// and times (directory events only once), in batches of cfg.BatchSize through
// store.BatchInsert (two at a time, so that ClickHouse works on one while the other is
// built and sent), then rebuilds the cost rollup of every hour touched.
func load(ctx context.Context, cfg *Config, conn driver.Conn) (Loaded, error) {
	start := time.Now()
	distinct := min(cfg.Distinct, cfg.Events)
	cfg.Progress("load: simulating %d distinct events (seed %d)", distinct, cfg.Seed)
	b, err := generate(ctx, cfg, distinct)
	if err != nil {
		return Loaded{}, err
	}
	cfg.Progress("load: simulated in %s; writing %d events over %d days into %s", time.Since(start).Round(time.Millisecond),
		cfg.Events, cfg.Days, cfg.ClickHouse.Database)

	end := time.Now().UTC().Truncate(time.Millisecond)
	span := time.Duration(cfg.Days) * 24 * time.Hour
	step := span / time.Duration(cfg.Events)
	first := end.Add(-span)

	st := store.New(conn, cfg.ClickHouse.Database)
	batches := make(chan *store.Batch, 2)
	var wg sync.WaitGroup
	var insertErr error
	var errOnce sync.Once
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 2 {
		wg.Go(func() {
			for batch := range batches {
				if err := st.BatchInsert(wctx, batch); err != nil {
					errOnce.Do(func() { insertErr = err; cancel() })
					return
				}
			}
		})
	}

	hours := map[store.HourKey]bool{}
	written, pass, i := 0, 0, 0
	writeStart, lastProgress := time.Now(), time.Now()
	batch := &store.Batch{}
	flush := func() bool {
		if len(batch.Events) == 0 {
			return true
		}
		batch.IngestedAt = time.Now().UTC()
		select {
		case batches <- batch:
		case <-wctx.Done():
			return false
		}
		batch = &store.Batch{Events: make([]store.EventRow, 0, cfg.BatchSize)}
		return true
	}
	for written < cfg.Events && wctx.Err() == nil {
		if i == len(b.events) {
			i, pass = 0, pass+1
		}
		j := i
		i++
		if pass > 0 && b.dir[j] != nil {
			continue // a person or an agent registers once
		}
		t := first.Add(time.Duration(written) * step).Truncate(time.Millisecond)
		r := b.events[j]
		r.ID, r.Time = copyID(r.ID, pass), t
		batch.Events = append(batch.Events, r)
		if d := b.dir[j]; d != nil {
			dr := *d
			dr.EventID, dr.UpdatedAt, dr.Version = r.ID, t, uint64(t.UnixMilli())
			batch.Directory = append(batch.Directory, dr)
		}
		if u := b.usage[j]; u != nil {
			ur := *u
			ur.EventID, ur.Time = r.ID, t
			batch.Usage = append(batch.Usage, ur)
			hours[store.HourKey{OrgID: ur.OrgID, Hour: t.Truncate(time.Hour)}] = true
		}
		written++
		if len(batch.Events) >= cfg.BatchSize && !flush() {
			break
		}
		if time.Since(lastProgress) >= 5*time.Second {
			lastProgress = time.Now()
			rate := float64(written) / time.Since(writeStart).Seconds()
			eta := time.Duration(float64(cfg.Events-written) / rate * float64(time.Second))
			cfg.Progress("load: %d of %d events (%.0f%%), %.0f events/s, ETA %s", written, cfg.Events,
				100*float64(written)/float64(cfg.Events), rate, eta.Round(time.Second))
		}
	}
	flush()
	close(batches)
	wg.Wait()
	if insertErr != nil {
		return Loaded{}, fmt.Errorf("cannot load the benchmark's events: %w", insertErr)
	}
	if err := ctx.Err(); err != nil {
		return Loaded{}, err
	}
	cfg.Progress("load: %d events written in %s (%.0f events/s); rebuilding the rollup of %d hours", written,
		time.Since(writeStart).Round(time.Millisecond), float64(written)/time.Since(writeStart).Seconds(), len(hours))

	rollStart := time.Now()
	keys := make([]store.HourKey, 0, len(hours))
	for k := range hours {
		keys = append(keys, k)
	}
	if err := st.RefreshRollup(ctx, keys); err != nil {
		return Loaded{}, fmt.Errorf("cannot build the rollup of the benchmark's events: %w", err)
	}
	cfg.Progress("load: rollup rebuilt in %s", time.Since(rollStart).Round(time.Millisecond))
	return Loaded{Seed: cfg.Seed, Events: written, Layout: cfg.layout(), DataEnd: first.Add(time.Duration(written-1) * step).Truncate(time.Second),
		Seconds: time.Since(start).Seconds(), LoadedAt: time.Now().UTC()}, nil
}

// settle waits until ClickHouse has no merge running in db for a second, at most
// max: merges after a load take the same two cores the measurements need.
func settle(ctx context.Context, cfg *Config, conn driver.Conn) error {
	if cfg.Settle <= 0 {
		return nil
	}
	start, told := time.Now(), time.Now()
	quiet := 0
	for {
		var merges, parts uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.merges WHERE database = ?", cfg.ClickHouse.Database).Scan(&merges); err != nil {
			return fmt.Errorf("cannot read system.merges: %w", err)
		}
		if merges == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if quiet >= 2 || time.Since(start) > cfg.Settle {
			if err := conn.QueryRow(ctx, "SELECT count() FROM system.parts WHERE active AND database = ? AND table = 'events'", cfg.ClickHouse.Database).Scan(&parts); err != nil {
				return fmt.Errorf("cannot read system.parts: %w", err)
			}
			if quiet >= 2 {
				cfg.Progress("merges settled after %s; events in %d parts", time.Since(start).Round(time.Second), parts)
			} else {
				cfg.Progress("still %d merges running after %s (--settle); measuring anyway; events in %d parts", merges, cfg.Settle, parts)
			}
			return nil
		}
		if time.Since(told) >= 15*time.Second {
			told = time.Now()
			cfg.Progress("waiting for %d merges in %s", merges, cfg.ClickHouse.Database)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
