package chdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// On a ClickHouse cluster (`migrate --cluster NAME`) every table of the schema is two:
// NAME_local, a Replicated*MergeTree on every server (its replicas share a ZooKeeper
// path per shard), and NAME, a Distributed table over NAME_local on every server. Code
// reads and writes NAME as on one server; only DDL, partition drops and system tables
// need the local names (deploy/README.md, "Running on a cluster").
//
// The sharding key of every table is a hash of columns of its ORDER BY key. The
// Replacing engines collapse rows of equal sorting key only within one server's table,
// so a row and every later row that must replace it (a replayed event, a re-priced usage
// row, a rebuilt rollup hour, a task's newer state) must land on the same shard: rows
// of equal sorting key have equal sharding key, whatever else differs. shardKeys names
// the columns; TestShardKeysAreInSortKeys checks each is in its table's ORDER BY. Within
// that rule the keys spread a large organization over the shards (events by id, usage
// by event id, so an event and its usage row share a shard) instead of pinning it to
// one.
var shardKeys = map[string]string{
	"schema_migrations": "version",
	"events":            "org_id, id",
	"usage":             "org_id, event_id",
	"causes":            "org_id, event_id",
	"usage_hourly":      "org_id, agent_id",
	"usage_daily":       "org_id, agent_id",
	"usage_rollup":      "org_id, agent_id",
	"initiator_hourly":  "org_id, initiator_id",
	"initiator_rollup":  "org_id, initiator_id",
	"dead_letters":      "topic, partition, offset",
	"directory":         "id",
	"api_keys":          "id",
	"seals":             "org_id",
	"seal_entries":      "org_id, id",
	"retention_cuts":    "table_name, at",
	"tasks":             "org_id, task_id",
	"room_activity":     "org_id, room_id",
	"attention":         "org_id, room_id",
	"tool_calls":        "org_id, agent_id",
	"rooms":             "org_id, room_id",
	"budgets":           "org_id, budget_id",
	"prices":            "model",
	"jobs":              "org_id, id",
	"log_leaves":        "org_id, id",
	"log_index":         "org_id, idx",
	"log_tree":          "org_id, idx",
	"checkpoints":       "org_id",
	"key_rotations":     "note",
}

// LocalSuffix names a table's local (replicated) part on a cluster.
const LocalSuffix = "_local"

// ClusterSettings are set on every connection to a cluster (Config.Cluster), and on the
// servers' default profile by deploy/local/cluster.sh for clickhouse-client and Grafana:
// insert_distributed_sync, so that a Distributed insert returns once every shard holds
// its rows (the default queues them on the initiator's disk and sends them later: an
// acknowledged batch could still be lost with that server, and a read right after
// could miss it). Only numbers: 18.16's protocol carries a setting as its binary
// value, which the driver can write for numbers only; the one text setting a cluster
// needs, distributed_product_mode = 'global', must be in the user's profile
// (CheckCluster).
func ClusterSettings() clickhouse.Settings {
	return clickhouse.Settings{"insert_distributed_sync": 1}
}

// recordTables are the tables of record: the audit trail and what bandplane itself
// decides (keys, seals, cuts, prices, jobs). On a cluster their inserts wait until
// Config.InsertQuorum replicas of each shard hold them (insert_quorum), so a replica
// that dies the moment after loses nothing acknowledged, and, with the quorum equal to
// the replicas per shard, every replica answers every read of them exactly (ingest
// reads usage back for the rollup, and the batch's events for its replay check). The
// other tables are derived from the trail and rebuilt from it (rollups, work status,
// directory, budgets): their inserts skip the quorum, which 18.16 serialises per table
// and shard (an insert fails with code 286 while the previous one waits for its
// quorum), so that rollup rebuilds of several ingest processes do not queue behind
// each other.
var recordTables = map[string]bool{
	"events": true, "usage": true, "dead_letters": true, "api_keys": true, "seals": true, "seal_entries": true,
	"log_leaves": true, "log_index": true, "log_tree": true, "checkpoints": true, "key_rotations": true,
	"retention_cuts": true, "prices": true, "jobs": true, "schema_migrations": true,
}

var insertIntoRe = regexp.MustCompile(`^\s*INSERT INTO [A-Za-z_][A-Za-z0-9_]*\.([A-Za-z_][A-Za-z0-9_]*)`)

// quorumConn is a connection to a cluster whose inserts into the tables of record carry
// insert_quorum.
type quorumConn struct {
	driver.Conn
	settings clickhouse.Settings
}

// needsQuorum says whether query inserts into a table of record.
func needsQuorum(query string) bool {
	m := insertIntoRe.FindStringSubmatch(query)
	return m != nil && recordTables[m[1]]
}

func (c quorumConn) ctx(ctx context.Context, query string) context.Context {
	if needsQuorum(query) {
		return clickhouse.Context(ctx, clickhouse.WithSettings(c.settings))
	}
	return ctx
}

func (c quorumConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	return c.Conn.PrepareBatch(c.ctx(ctx, query), query, opts...)
}

func (c quorumConn) Exec(ctx context.Context, query string, args ...any) error {
	return c.Conn.Exec(c.ctx(ctx, query), query, args...)
}

// withQuorum wraps conn so that inserts into the tables of record wait for quorum
// replicas (nothing to do for a quorum of 0 or 1).
func withQuorum(conn driver.Conn, quorum int) driver.Conn {
	if quorum <= 1 {
		return conn
	}
	return quorumConn{Conn: conn, settings: clickhouse.Settings{"insert_quorum": quorum, "insert_quorum_timeout": 15000}}
}

// CheckCluster refuses a connection on which cluster c is unknown, or whose profile
// does not set distributed_product_mode = 'global': without it an IN or JOIN subquery
// over a Distributed table inside a distributed query fails (the default, 'deny'), and
// 'local' would answer from each shard's own rows only; 'global' runs the subquery once
// over the whole cluster and ships its result to the shards.
func CheckCluster(ctx context.Context, conn driver.Conn, c string) error {
	if _, err := clusterShards(ctx, conn, c); err != nil {
		return err
	}
	var mode string
	if err := conn.QueryRow(ctx, "SELECT value FROM system.settings WHERE name = 'distributed_product_mode'").Scan(&mode); err != nil {
		return fmt.Errorf("cannot read the distributed_product_mode setting: %w", err)
	}
	if mode != "global" {
		return fmt.Errorf("cluster %s: the ClickHouse user's profile sets distributed_product_mode = '%s'; bandplane needs 'global' on a cluster "+
			"(users.d, as deploy/local/cluster/users.xml does)", c, mode)
	}
	return nil
}

var (
	createTableRe = regexp.MustCompile(`(?s)^CREATE TABLE IF NOT EXISTS \{db\}\.([a-z_]+) (\(.*\))\s*ENGINE = ([A-Za-z]*MergeTree)\(([^)]*)\)(.*)$`)
	alterTableRe  = regexp.MustCompile(`(?s)^ALTER TABLE \{db\}\.([a-z_]+) (.*)$`)
	orderByRe     = regexp.MustCompile(`ORDER BY \(?([a-z_, ]+)\)?`)
)

// clusterStep is one statement of a migration on a cluster; after an ALTER of a local
// table, the Distributed table is made again from it (18.16 refuses ALTER … ON CLUSTER
// of a table that is not replicated), once every server has the new columns.
type clusterStep struct {
	sql string
	// perShard: sql runs on one replica of each shard (onShards), not ON CLUSTER.
	perShard   bool
	remakeDist string // table whose Distributed table is made again after sql
}

// clusterStatements rewrites one migration statement for cluster c: CREATE TABLE makes
// the replicated local table and the Distributed table over it, ALTER TABLE alters the
// local table on one replica of each shard (which replicates it: onShards) and remakes
// the Distributed one, INSERT goes through the Distributed
// table as it is. Anything else is refused, so a migration this cannot rewrite fails
// TestEveryMigrationRunsOnACluster instead of half-applying on a cluster.
func clusterStatements(stmt, c string) ([]clusterStep, error) {
	stmt = strings.TrimSpace(stmt)
	if m := createTableRe.FindStringSubmatch(stmt); m != nil {
		table, cols, engine, args, rest := m[1], m[2], m[3], strings.TrimSpace(m[4]), m[5]
		if _, ok := shardKeys[table]; !ok {
			return nil, fmt.Errorf("table %s has no sharding key (schema/chdb/cluster.go, shardKeys)", table)
		}
		zk := fmt.Sprintf("'/clickhouse/tables/{shard}/{db}/%s', '{replica}'", table)
		if args != "" {
			zk += ", " + args
		}
		local := fmt.Sprintf("CREATE TABLE IF NOT EXISTS {db}.%s%s ON CLUSTER %s %s\nENGINE = Replicated%s(%s)%s",
			table, LocalSuffix, c, cols, engine, zk, rest)
		return []clusterStep{{sql: local}, {sql: distributedDDL(table, c)}}, nil
	}
	if m := alterTableRe.FindStringSubmatch(stmt); m != nil {
		return []clusterStep{{sql: fmt.Sprintf("ALTER TABLE {db}.%s%s %s", m[1], LocalSuffix, m[2]), perShard: true, remakeDist: m[1]}}, nil
	}
	if strings.HasPrefix(stmt, "INSERT INTO {db}.") {
		return []clusterStep{{sql: stmt}}, nil
	}
	return nil, fmt.Errorf("statement cannot be run on a cluster: %.60q", stmt)
}

func distributedDDL(table, c string) string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS {db}.%s ON CLUSTER %s AS {db}.%s%s\nENGINE = Distributed(%s, {db}, %s%s, cityHash64(%s))",
		table, c, table, LocalSuffix, c, table, LocalSuffix, shardKeys[table])
}

// remakeDistributed drops and creates the Distributed table of table from its local
// table, once the shards agree on its columns. 18.16's ALTER of a replicated table
// returns once every active replica has applied it, so one replica of each shard
// (cluster(), which connects as the Distributed tables do, with the credentials of
// remote_servers) stands for its shard. The Distributed table holds no data (inserts
// are synchronous), so nothing is lost; reads of it fail for the moment between.
func remakeDistributed(ctx context.Context, conn driver.Conn, db, c, table string) error {
	// Every shard holds the same (name, type) pairs when the rows number shards × the
	// distinct pairs and those are the local table's (a shard missing a column, or with
	// another type for one, breaks one of the two equalities).
	q := fmt.Sprintf(`SELECT (SELECT uniqExact(shard_num) FROM system.clusters WHERE cluster = ?) AS shards,
		count() AS n, uniqExact(name, type) AS pairs, (SELECT count() FROM system.columns WHERE database = ? AND table = ?) AS local
		FROM cluster('%s', system.columns) WHERE database = ? AND table = ?`, c)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var shards, n, pairs, local uint64
		if err := conn.QueryRow(ctx, q, c, db, table+LocalSuffix, db, table+LocalSuffix).Scan(&shards, &n, &pairs, &local); err != nil {
			return fmt.Errorf("cannot compare the columns of %s.%s%s on the shards of cluster %s: %w", db, table, LocalSuffix, c, err)
		}
		if n == shards*pairs && pairs == local {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the shards of cluster %s still disagree on the columns of %s.%s%s after 2 minutes", c, db, table, LocalSuffix)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := conn.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s.%s ON CLUSTER %s", db, table, c)); err != nil {
		return fmt.Errorf("cannot drop the Distributed table %s.%s to remake it: %w", db, table, err)
	}
	if err := conn.Exec(ctx, strings.ReplaceAll(distributedDDL(table, c), "{db}", db)); err != nil {
		return fmt.Errorf("cannot remake the Distributed table %s.%s: %w", db, table, err)
	}
	return nil
}

// onShards runs stmt on one replica of every shard of cfg.Cluster, each by a connection
// of its own (cfg's user, password and timeouts, to the host and port the cluster's
// definition gives): for a statement a replicated table replicates itself to the other
// replicas of its shard (an ALTER of its columns, a DROP PARTITION). ON CLUSTER would
// run such a statement through the distributed DDL queue's leader-replica path, which
// on 18.16 races between the replicas of a shard: one replica runs it after the other
// already has, fails to mark it executed ("Node exists"), and its DDL worker stops for
// good ("Unexpected ZooKeeper error"), so that every later ON CLUSTER statement waits
// for that server until distributed_ddl_task_timeout, until it restarts. The replicas
// of a shard are tried in order: one that cannot be reached is skipped (a replica that
// is down applies the statement from the replication log when it is back); an
// exception from a server that was reached ends it (the statement may still be running
// there). done says which errors mean the statement had already been applied (nil:
// none does).
func onShards(ctx context.Context, conn driver.Conn, cfg Config, stmt string, done func(error) bool) error {
	shards, err := clusterShards(ctx, conn, cfg.Cluster)
	if err != nil {
		return err
	}
	for _, sh := range shards {
		var errs []error
		for _, addr := range sh.replicas {
			err := execOn(ctx, cfg, addr, stmt)
			if err == nil || done != nil && done(err) {
				errs = nil
				break
			}
			var ex *clickhouse.Exception
			if errors.As(err, &ex) {
				// The server ran it and refused it (or its outcome is its own): running
				// it on another replica of the shard would only race with it.
				return fmt.Errorf("replica %s of shard %d of cluster %s: %w", addr, sh.num, cfg.Cluster, err)
			}
			errs = append(errs, fmt.Errorf("replica %s: %w", addr, err))
		}
		if errs != nil {
			return fmt.Errorf("no replica of shard %d of cluster %s could be reached: %w", sh.num, cfg.Cluster, errors.Join(errs...))
		}
	}
	return nil
}

// shard is one shard of a cluster: its number and its replicas' host:port, in order.
type shard struct {
	num      uint32
	replicas []string
}

// clusterShards reads the shards of cluster c as the server connected to knows them
// (system.clusters: the host names and ports of its remote_servers).
func clusterShards(ctx context.Context, conn driver.Conn, c string) ([]shard, error) {
	rows, err := conn.Query(ctx, "SELECT shard_num, host_name, port FROM system.clusters WHERE cluster = ? ORDER BY shard_num, replica_num", c)
	if err != nil {
		return nil, fmt.Errorf("cannot read cluster %s from system.clusters: %w", c, err)
	}
	defer rows.Close()
	var out []shard
	for rows.Next() {
		var num uint32
		var host string
		var port uint16
		if err := rows.Scan(&num, &host, &port); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].num != num {
			out = append(out, shard{num: num})
		}
		last := &out[len(out)-1]
		last.replicas = append(last.replicas, net.JoinHostPort(host, strconv.Itoa(int(port))))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the server knows no cluster named %s (system.clusters; its remote_servers config)", c)
	}
	return out, nil
}

// execOn runs stmt on the one server at addr, with cfg's credentials and timeouts.
func execOn(ctx context.Context, cfg Config, addr, stmt string) error {
	one := Config{Addr: addr, Database: cfg.Database, User: cfg.User, Password: cfg.Password,
		DialTimeout: cfg.DialTimeout, ReadTimeout: cfg.ReadTimeout, MaxOpenConns: 1}
	if one.Database == "" {
		one.Database = "default"
	}
	if one.ReadTimeout <= 0 {
		one.ReadTimeout = DefaultConfig().ReadTimeout
	}
	conn, err := Open(ctx, one)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Exec(ctx, stmt)
}

// sortKeyColumns are the columns of a CREATE TABLE statement's ORDER BY.
func sortKeyColumns(stmt string) []string {
	m := orderByRe.FindStringSubmatch(stmt)
	if m == nil {
		return nil
	}
	var out []string
	for _, c := range strings.Split(m[1], ",") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}
