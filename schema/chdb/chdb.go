// Package chdb owns bandplane's ClickHouse database: connecting, the embedded
// versioned migrations, the schema-version check services run before they start, and
// retention by partition drop. Everything here runs on ClickHouse 18.16 and on current
// releases: it avoids what 18.16 lacks (DateTime64, TTL, Map, LowCardinality, window
// functions, ADD COLUMN IF NOT EXISTS) and what current releases refuse (a JOIN
// subquery without an alias, positional ORDER BY, an INSERT block over 100 partitions).
// Times cross the wire as values, never as text: 18.16 writes the zero DateTime as
// 0000-00-00 00:00:00, which 26.9 parses as a date of the current year, not the epoch.
// deploy/stacktest/dual runs every statement of this package and the others on both.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package chdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Config says where the database is.
type Config struct {
	// Addr is host:port of the native protocol, or several, comma-separated: servers
	// of one cluster, the first that can be reached taking every connection (Open).
	Addr         string
	Database     string
	User         string
	Password     string
	DialTimeout  time.Duration
	ReadTimeout  time.Duration // set explicitly: the driver's default is minutes
	MaxOpenConns int
	// Cluster is the ClickHouse cluster the schema was made on (MigrateOn), "" for one
	// server: connections then carry ClusterSettings, DDL names the local tables ON
	// CLUSTER, and ALTERs and partition drops run on one replica of each shard
	// (onShards).
	Cluster string
	// InsertQuorum is the replicas of a shard that must hold an insert into a table of
	// record before it returns, with Cluster (0 or 1: one replica, the others copy it
	// later); recordTables in cluster.go.
	InsertQuorum int
}

// DefaultConfig matches deploy/local/clickhouse.sh.
func DefaultConfig() Config {
	return Config{
		Addr:         "127.0.0.1:19000",
		Database:     "bandplane",
		User:         "default",
		DialTimeout:  5 * time.Second,
		ReadTimeout:  60 * time.Second,
		MaxOpenConns: 8,
	}
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports every problem of the config at once.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("clickhouse address is empty (--clickhouse)"))
	}
	addrs := c.Addrs()
	if len(addrs) > 64 {
		errs = append(errs, fmt.Errorf("%d clickhouse addresses: at most 64 (--clickhouse)", len(addrs)))
	}
	for i, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("clickhouse address %d %q is not host:port (--clickhouse): %w", i+1, a, err))
		}
	}
	if !identRe.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("clickhouse database %q is not a plain identifier (--clickhouse-db)", c.Database))
	}
	if c.Cluster != "" && !identRe.MatchString(c.Cluster) {
		errs = append(errs, fmt.Errorf("clickhouse cluster %q is not a plain identifier (--cluster)", c.Cluster))
	}
	if c.InsertQuorum < 0 || c.InsertQuorum > 16 {
		errs = append(errs, fmt.Errorf("insert quorum %d is out of range 0..16 (--insert-quorum)", c.InsertQuorum))
	}
	if c.ReadTimeout <= 0 {
		errs = append(errs, errors.New("clickhouse read timeout must be > 0"))
	}
	return errors.Join(errs...)
}

// Addrs are the addresses of Addr.
func (c Config) Addrs() []string {
	var out []string
	for _, a := range strings.Split(c.Addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Open connects and pings. The database itself need not exist yet (Migrate creates it),
// so the connection's default database is left as "default" and every statement names
// its tables as db.table.
func Open(ctx context.Context, cfg Config) (driver.Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxOpenConns <= 0 {
		cfg.MaxOpenConns = 8
	}
	var settings clickhouse.Settings
	if cfg.Cluster != "" {
		settings = ClusterSettings()
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr: cfg.Addrs(),
		// Every connection goes to the first server that can be reached (the next one
		// when it cannot): on a cluster that server runs each Distributed insert and
		// read, and 18.16 writes a shard's rows to the initiator's own replica (when it
		// is one) else to the shard's first, and reads them from the same ones
		// (load_balancing 'in_order'), so that a read right after a write of a table
		// without the insert quorum finds it. Connections spread over several servers
		// would write through one and read through another, and miss such rows for the
		// moment replication takes.
		ConnOpenStrategy: clickhouse.ConnOpenInOrder,
		// A pooled connection is reused until it ends: one made to the next server
		// while the first was down would keep the process there. Five minutes bounds
		// how long a process stays off its first server after that one is back.
		ConnMaxLifetime: 5 * time.Minute,
		Settings:        settings,
		Auth:            clickhouse.Auth{Database: "default", Username: cfg.User, Password: cfg.Password},
		DialTimeout:     cfg.DialTimeout,
		ReadTimeout:     cfg.ReadTimeout,
		MaxOpenConns:    cfg.MaxOpenConns,
		MaxIdleConns:    cfg.MaxOpenConns,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot open clickhouse at %s: %w", cfg.Addr, err)
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("cannot reach clickhouse at %s (is it running? `make up` starts it): %w", cfg.Addr, err)
	}
	if cfg.Cluster != "" {
		if err := CheckCluster(ctx, conn, cfg.Cluster); err != nil {
			conn.Close()
			return nil, err
		}
		conn = withQuorum(conn, cfg.InsertQuorum)
	}
	return conn, nil
}

// externalKey is the context key of the external tables WithExternalTable attached.
type externalKey struct{}

// WithExternalTable returns ctx sending tbl with its query as an external table (a
// set of ids or keys the query joins with, without putting them in its text). It is
// the one way bandplane attaches external tables, so the ones a context carries can be
// read back (ExternalTables): the two-engine test replays them on the other engine.
func WithExternalTable(ctx context.Context, tbl *ext.Table) context.Context {
	tables := append(ExternalTables(ctx), tbl)
	ctx = context.WithValue(ctx, externalKey{}, tables)
	return clickhouse.Context(ctx, clickhouse.WithExternalTable(tables...))
}

// ExternalTables are the external tables WithExternalTable attached to ctx.
func ExternalTables(ctx context.Context) []*ext.Table {
	tables, _ := ctx.Value(externalKey{}).([]*ext.Table)
	return tables[:len(tables):len(tables)]
}
