package chdb

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one embedded, numbered schema change. Statements are idempotent
// (IF NOT EXISTS), so re-running a migration that failed half-way is safe.
type Migration struct {
	Version    uint32
	Name       string
	Statements []string
	Checksum   string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, path := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.ParseUint(num, 10, 32)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %s: name must be NNN_name.sql", path)
		}
		body, err := migrationFS.ReadFile(path)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{
			Version:    uint32(v),
			Name:       name,
			Statements: splitStatements(string(body)),
			Checksum:   hex.EncodeToString(sum[:8]),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations have version %d", out[i].Version)
		}
	}
	return out, nil
}

// RequiredVersion is the schema version this build needs: its newest migration.
func RequiredVersion() uint32 {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// splitStatements splits a file on ';' at the end of a line and drops comment-only
// chunks. Migrations must not put ';' at a line end inside a string literal.
func splitStatements(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			if s := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"); s != "" {
				out = append(out, s)
			}
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// MigrateResult says what Migrate did.
type MigrateResult struct {
	From, To uint32
	Applied  []string
}

// Migrate creates the database if needed and applies every migration newer than the
// database's version, recording each in schema_migrations.
func Migrate(ctx context.Context, conn driver.Conn, db string) (MigrateResult, error) {
	return MigrateOn(ctx, conn, Config{Database: db})
}

// migrationsTable is schema_migrations, created before the migrations are read.
const migrationsTable = `CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
	version UInt32, name String, checksum String, applied_at DateTime('UTC')
) ENGINE = MergeTree() ORDER BY version`

// MigrateOn is Migrate of cfg.Database on cluster cfg.Cluster (every server of it, with
// replicated local tables and Distributed tables over them: cluster.go; an ALTER
// connects to one replica of each shard itself, with cfg's credentials), or on the one
// server conn talks to when cfg.Cluster is "".
func MigrateOn(ctx context.Context, conn driver.Conn, cfg Config) (MigrateResult, error) {
	db, c := cfg.Database, cfg.Cluster
	if !identRe.MatchString(db) {
		return MigrateResult{}, fmt.Errorf("database name %q is not a plain identifier", db)
	}
	if c != "" && !identRe.MatchString(c) {
		return MigrateResult{}, fmt.Errorf("cluster name %q is not a plain identifier (--cluster)", c)
	}
	ms, err := Migrations()
	if err != nil {
		return MigrateResult{}, err
	}
	onCluster := ""
	if c != "" {
		if err := CheckCluster(ctx, conn, c); err != nil {
			return MigrateResult{}, err
		}
		onCluster = " ON CLUSTER " + c
	}
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+db+onCluster); err != nil {
		return MigrateResult{}, fmt.Errorf("cannot create database %s: %w", db, err)
	}
	if err := apply(ctx, conn, cfg, migrationsTable); err != nil {
		return MigrateResult{}, fmt.Errorf("cannot create %s.schema_migrations: %w", db, err)
	}
	cur, err := SchemaVersion(ctx, conn, db)
	if err != nil {
		return MigrateResult{}, err
	}
	res := MigrateResult{From: cur, To: cur}
	for _, m := range ms {
		if m.Version <= cur {
			continue
		}
		for i, stmt := range m.Statements {
			if err := apply(ctx, conn, cfg, stmt); err != nil {
				return res, fmt.Errorf("cannot apply migration %03d_%s (statement %d) to %s: %w", m.Version, m.Name, i+1, db, err)
			}
		}
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".schema_migrations (version, name, checksum, applied_at)")
		if err != nil {
			return res, fmt.Errorf("cannot record migration %d: %w", m.Version, err)
		}
		if err := b.Append(m.Version, m.Name, m.Checksum, time.Now().UTC()); err != nil {
			return res, fmt.Errorf("cannot record migration %d: %w", m.Version, err)
		}
		if err := b.Send(); err != nil {
			return res, fmt.Errorf("cannot record migration %d: %w", m.Version, err)
		}
		res.To = m.Version
		res.Applied = append(res.Applied, fmt.Sprintf("%03d_%s", m.Version, m.Name))
	}
	return res, nil
}

// apply runs one migration statement on cfg.Database, rewritten for cfg.Cluster unless
// that is "".
func apply(ctx context.Context, conn driver.Conn, cfg Config, stmt string) error {
	db, c := cfg.Database, cfg.Cluster
	steps := []clusterStep{{sql: stmt}}
	if c != "" {
		var err error
		if steps, err = clusterStatements(stmt, c); err != nil {
			return err
		}
	}
	for _, s := range steps {
		sql := strings.ReplaceAll(s.sql, "{db}", db)
		if s.perShard {
			if err := onShards(ctx, conn, cfg, sql, func(err error) bool { return alreadyAdded(sql, err) }); err != nil {
				return err
			}
		} else if err := conn.Exec(ctx, sql); err != nil && !alreadyAdded(sql, err) {
			return err
		}
		if s.remakeDist != "" {
			if err := remakeDistributed(ctx, conn, db, c, s.remakeDist); err != nil {
				return err
			}
		}
	}
	return nil
}

// alreadyAdded says whether err is an ADD COLUMN finding its column there: 18.16 has
// no ADD COLUMN IF NOT EXISTS, so a migration that stopped half-way and is run again
// meets the columns it already added (code 44, "column with this name already
// exists").
func alreadyAdded(stmt string, err error) bool {
	var ex *clickhouse.Exception
	return strings.Contains(stmt, "ADD COLUMN") && errors.As(err, &ex) && ex.Code == 44
}

// SchemaVersion is the newest migration recorded in db, or 0 if none is.
func SchemaVersion(ctx context.Context, conn driver.Conn, db string) (uint32, error) {
	var exists uint8
	if err := conn.QueryRow(ctx, "SELECT count() > 0 FROM system.tables WHERE database = ? AND name = 'schema_migrations'", db).Scan(&exists); err != nil {
		return 0, fmt.Errorf("cannot read the schema version of %s: %w", db, err)
	}
	if exists == 0 {
		return 0, nil
	}
	var v uint32
	if err := conn.QueryRow(ctx, "SELECT max(version) FROM "+db+".schema_migrations").Scan(&v); err != nil {
		return 0, fmt.Errorf("cannot read the schema version of %s: %w", db, err)
	}
	return v, nil
}

// CheckVersion refuses a database whose schema is older than this build needs.
func CheckVersion(ctx context.Context, conn driver.Conn, db string) error {
	have, err := SchemaVersion(ctx, conn, db)
	if err != nil {
		return err
	}
	if need := RequiredVersion(); have < need {
		return fmt.Errorf("database %s is at schema version %d but this build needs %d: run `bandplane migrate` first", db, have, need)
	}
	return nil
}
