package chdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Retention says how long each kind of data is kept. ClickHouse 18.16 has no TTL, so
// retention drops whole partitions: daily ones for the audit trail and usage facts,
// monthly ones for the rollup and dead letters (a month is dropped once all of it is
// older than the limit). Zero keeps data forever.
type Retention struct {
	Events      time.Duration // events and usage (daily partitions)
	Rollup      time.Duration // usage_hourly, usage_rollup and usage_daily (monthly)
	DeadLetters time.Duration // dead_letters (monthly)
}

// DefaultRetention keeps the audit trail 400 days, rollups 3 years, dead letters 90 days.
func DefaultRetention() Retention {
	return Retention{Events: 400 * 24 * time.Hour, Rollup: 3 * 365 * 24 * time.Hour, DeadLetters: 90 * 24 * time.Hour}
}

func (r Retention) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{"--events": r.Events, "--rollup": r.Rollup, "--dead-letters": r.DeadLetters} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("retention %s must not be negative, got %s", name, d))
		}
	}
	return errors.Join(errs...)
}

// Dropped is one partition that ApplyRetention dropped (or would drop, in a dry run).
type Dropped struct {
	Table     string `json:"table"`
	Partition string `json:"partition"`
}

type partitioning struct {
	table   string
	monthly bool
	keep    time.Duration
}

// RetentionOptions says how ApplyRetention runs.
type RetentionOptions struct {
	// DryRun lists what would be dropped, and the cuts that would be recorded, and
	// changes nothing.
	DryRun bool
	// Sign signs each cut before it is recorded (query/trail.CutSigner with the audit
	// key). nil records cuts unsigned: audit verify honours only cuts signed with the
	// audit key, so it reports sealed events of partitions dropped without one as
	// missing.
	Sign func(*Cut)
}

// RetentionResult is what ApplyRetention dropped (or would drop, in a dry run) and
// the cuts it recorded (or would record), one per table it dropped partitions of.
type RetentionResult struct {
	Dropped []Dropped `json:"dropped"`
	Cuts    []Cut     `json:"cuts"`
}

// ApplyRetention drops every partition of cfg.Database whose newest possible row is
// older than now minus the table's retention. With opts.DryRun it only lists them. On
// cluster cfg.Cluster the partitions are listed on one replica of every shard and
// dropped from the local tables on one replica of each shard (onShards, which connects
// to it with cfg's credentials; the other replicas drop them from the replication log).
//
// Before it drops a table's partitions it records the cut in retention_cuts: before is
// the end of the newest partition it drops, so every row it removes is older than
// that; at is now; the cut is signed with opts.Sign. Verify (query/trail) treats a
// sealed event as expired, not missing, only when a cut signed with the audit key and
// recorded after the event was sealed covers its time, and no row of its day is left
// (retention drops whole days; a DELETE leaves the day's other rows). The cut is
// written first so that a run stopped half-way never leaves dropped rows without one;
// a cut whose drops failed only excuses days that are gone.
func ApplyRetention(ctx context.Context, conn driver.Conn, cfg Config, r Retention, now time.Time, opts RetentionOptions) (RetentionResult, error) {
	db := cfg.Database
	res := RetentionResult{Dropped: []Dropped{}, Cuts: []Cut{}}
	if err := r.Validate(); err != nil {
		return res, err
	}
	if !identRe.MatchString(db) {
		return res, fmt.Errorf("database name %q is not a plain identifier", db)
	}
	if cfg.Cluster != "" && !identRe.MatchString(cfg.Cluster) {
		return res, fmt.Errorf("cluster name %q is not a plain identifier (--cluster)", cfg.Cluster)
	}
	now = now.UTC().Truncate(time.Second) // as retention_cuts stores it, and as it is signed
	tables := []partitioning{
		{"events", false, r.Events},
		{"usage", false, r.Events},
		{"causes", false, r.Events},
		{"usage_hourly", true, r.Rollup},
		{"usage_rollup", true, r.Rollup},
		{"usage_daily", true, r.Rollup},
		{"initiator_hourly", true, r.Rollup},
		{"initiator_rollup", true, r.Rollup},
		{"dead_letters", true, r.DeadLetters},
		// Work status kept from the trail: requests for attention and tool calls go
		// with it (tasks, room_activity and rooms are not partitioned: 003_work.sql).
		{"attention", true, r.Events},
		{"tool_calls", true, r.Events},
	}
	for _, t := range tables {
		if t.keep == 0 {
			continue
		}
		cutoff := now.Add(-t.keep)
		parts, err := partitions(ctx, conn, db, t.table, cfg.Cluster)
		if err != nil {
			return res, err
		}
		var drop []string
		var before time.Time
		for _, p := range parts {
			end, err := partitionEnd(p, t.monthly)
			if err != nil {
				return res, fmt.Errorf("table %s.%s: %w", db, t.table, err)
			}
			if !end.After(cutoff) {
				drop = append(drop, p)
				if end.After(before) {
					before = end
				}
			}
		}
		if len(drop) == 0 {
			continue
		}
		cut := Cut{Table: t.table, Before: before, At: now, Partitions: uint64(len(drop))}
		if opts.Sign != nil {
			opts.Sign(&cut)
		}
		if !opts.DryRun {
			if err := recordCut(ctx, conn, db, cut); err != nil {
				return res, err
			}
		}
		res.Cuts = append(res.Cuts, cut)
		for _, p := range drop {
			if !opts.DryRun {
				if err := dropPartition(ctx, conn, cfg, t.table, p); err != nil {
					return res, fmt.Errorf("cannot drop partition %s of %s.%s: %w", p, db, t.table, err)
				}
			}
			res.Dropped = append(res.Dropped, Dropped{Table: t.table, Partition: p})
		}
	}
	return res, nil
}

// Cut is one retention run's drop of a table's partitions: every row it removed was
// older than Before.
type Cut struct {
	Table      string    `json:"table"`
	Before     time.Time `json:"before"`
	At         time.Time `json:"at"` // when the run started (seconds)
	Partitions uint64    `json:"partitions"`
	// KeyID is the fingerprint of the audit key that signed the cut (schema/tlog.KeyID)
	// and Signature the hex Ed25519 signature of query/trail.CutContent; both are ""
	// for a cut recorded without the key.
	KeyID     string `json:"key_id"`
	Signature string `json:"signature"`
}

func recordCut(ctx context.Context, conn driver.Conn, db string, c Cut) error {
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".retention_cuts (table_name, before, at, partitions, key_id, signature)")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.retention_cuts: %w", db, err)
	}
	defer b.Abort()
	if err := b.Append(c.Table, c.Before.UTC(), c.At.UTC(), c.Partitions, c.KeyID, c.Signature); err != nil {
		return fmt.Errorf("cannot record the retention cut of %s.%s: %w", db, c.Table, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot record the retention cut of %s.%s in %s.retention_cuts: %w", db, c.Table, db, err)
	}
	return nil
}

// RetentionCuts lists the recorded cuts of a table, oldest first.
func RetentionCuts(ctx context.Context, conn driver.Conn, db, table string) ([]Cut, error) {
	rows, err := conn.Query(ctx, "SELECT table_name, before, at, partitions, key_id, signature FROM "+db+".retention_cuts WHERE table_name = ? ORDER BY at, before", table)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.retention_cuts: %w", db, err)
	}
	defer rows.Close()
	var out []Cut
	for rows.Next() {
		var c Cut
		if err := rows.Scan(&c.Table, &c.Before, &c.At, &c.Partitions, &c.KeyID, &c.Signature); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.retention_cuts: %w", db, err)
		}
		c.Before, c.At = c.Before.UTC(), c.At.UTC()
		out = append(out, c)
	}
	return out, rows.Err()
}

// dropPartition drops partition p of table of cfg.Database (of its local table on
// every shard, on cfg.Cluster).
func dropPartition(ctx context.Context, conn driver.Conn, cfg Config, table, p string) error {
	if cfg.Cluster != "" {
		return onShards(ctx, conn, cfg, fmt.Sprintf("ALTER TABLE %s.%s%s DROP PARTITION %s", cfg.Database, table, LocalSuffix, p), nil)
	}
	return conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.%s DROP PARTITION %s", cfg.Database, table, p))
}

// partitions lists the partitions of db.table that hold rows: of its local tables on
// one replica of every shard of cluster c, when c is not "".
func partitions(ctx context.Context, conn driver.Conn, db, table, c string) ([]string, error) {
	from := "system.parts"
	if c != "" {
		from, table = "cluster('"+c+"', system.parts)", table+LocalSuffix
	}
	rows, err := conn.Query(ctx, "SELECT DISTINCT partition FROM "+from+" WHERE database = ? AND table = ? AND active ORDER BY partition", db, table)
	if err != nil {
		return nil, fmt.Errorf("cannot list partitions of %s.%s: %w", db, table, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// partitionEnd is the first instant after a YYYYMMDD or YYYYMM partition.
func partitionEnd(p string, monthly bool) (time.Time, error) {
	if _, err := strconv.Atoi(p); err != nil {
		return time.Time{}, fmt.Errorf("unexpected partition id %q", p)
	}
	if monthly {
		t, err := time.Parse("200601", p)
		if err != nil {
			return time.Time{}, fmt.Errorf("unexpected monthly partition id %q", p)
		}
		return t.AddDate(0, 1, 0), nil
	}
	t, err := time.Parse("20060102", p)
	if err != nil {
		return time.Time{}, fmt.Errorf("unexpected daily partition id %q", p)
	}
	return t.AddDate(0, 0, 1), nil
}
