package chdb

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rows of equal sorting key must land on one shard (cluster.go): every sharding key
// column is a column of its table's ORDER BY, and every table has one.
func TestShardKeysAreInSortKeys(t *testing.T) {
	ms, err := Migrations()
	require.NoError(t, err)
	stmts := []string{migrationsTable}
	for _, m := range ms {
		stmts = append(stmts, m.Statements...)
	}
	seen := map[string]bool{}
	for _, s := range stmts {
		m := createTableRe.FindStringSubmatch(strings.TrimSpace(s))
		if m == nil {
			continue
		}
		table := m[1]
		seen[table] = true
		key, ok := shardKeys[table]
		if !assert.True(t, ok, "table %s has no sharding key", table) {
			continue
		}
		sortKey := sortKeyColumns(s)
		require.NotEmpty(t, sortKey, "table %s: no ORDER BY found", table)
		for _, c := range strings.Split(key, ",") {
			assert.Contains(t, sortKey, strings.TrimSpace(c), "table %s: sharding column %s is not in ORDER BY %v", table, c, sortKey)
		}
	}
	for table := range shardKeys {
		assert.True(t, seen[table], "shardKeys names %s, which no migration creates", table)
	}
}

// Every statement of every migration has a cluster form, so `migrate --cluster`
// never stops half-way on a statement it cannot rewrite.
func TestEveryMigrationRunsOnACluster(t *testing.T) {
	ms, err := Migrations()
	require.NoError(t, err)
	for _, m := range ms {
		for i, s := range m.Statements {
			steps, err := clusterStatements(s, "c1")
			require.NoError(t, err, "migration %03d_%s statement %d", m.Version, m.Name, i+1)
			for _, st := range steps {
				if !strings.HasPrefix(st.sql, "INSERT") && !st.perShard {
					assert.Contains(t, st.sql, " ON CLUSTER c1 ", "migration %03d_%s statement %d", m.Version, m.Name, i+1)
				}
			}
		}
	}
}

func TestClusterStatements(t *testing.T) {
	steps, err := clusterStatements("CREATE TABLE IF NOT EXISTS {db}.usage (\n a String, v UInt64\n) ENGINE = ReplacingMergeTree(version)\nPARTITION BY x\nORDER BY (org_id, time, event_id)", "c1")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	assert.Equal(t, "CREATE TABLE IF NOT EXISTS {db}.usage_local ON CLUSTER c1 (\n a String, v UInt64\n)\n"+
		"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{db}/usage', '{replica}', version)\nPARTITION BY x\nORDER BY (org_id, time, event_id)", steps[0].sql)
	assert.Equal(t, "CREATE TABLE IF NOT EXISTS {db}.usage ON CLUSTER c1 AS {db}.usage_local\nENGINE = Distributed(c1, {db}, usage_local, cityHash64(org_id, event_id))", steps[1].sql)

	steps, err = clusterStatements("ALTER TABLE {db}.usage_hourly ADD COLUMN x UInt8 DEFAULT 0", "c1")
	require.NoError(t, err)
	assert.Equal(t, []clusterStep{{sql: "ALTER TABLE {db}.usage_hourly_local ADD COLUMN x UInt8 DEFAULT 0", perShard: true, remakeDist: "usage_hourly"}}, steps)

	// Hostile: a table without a sharding key, and statements with no cluster form.
	_, err = clusterStatements("CREATE TABLE IF NOT EXISTS {db}.nokey (a String) ENGINE = MergeTree() ORDER BY a", "c1")
	assert.ErrorContains(t, err, "table nokey has no sharding key")
	for _, s := range []string{"DROP TABLE {db}.events", "CREATE VIEW {db}.v AS SELECT 1", "OPTIMIZE TABLE {db}.events FINAL"} {
		_, err = clusterStatements(s, "c1")
		assert.ErrorContains(t, err, "cannot be run on a cluster", s)
	}
	assert.True(t, slices.Equal([]string{"org_id", "time", "id"}, sortKeyColumns("x ORDER BY (org_id, time, id)")))
	assert.Equal(t, []string{"version"}, sortKeyColumns("ENGINE = MergeTree() ORDER BY version"))
}

func TestQuorumOnlyForTablesOfRecord(t *testing.T) {
	for table := range recordTables {
		assert.Contains(t, shardKeys, table, "table of record %s is not a table of the schema", table)
	}
	assert.True(t, needsQuorum("INSERT INTO bp.events (id, type)"))
	assert.True(t, needsQuorum("  INSERT INTO bp.usage (event_id)"))
	assert.True(t, needsQuorum("INSERT INTO bp.schema_migrations (version, name, checksum, applied_at)"))
	assert.False(t, needsQuorum("INSERT INTO bp.usage_hourly (hour)"), "derived: rebuilt from usage")
	assert.False(t, needsQuorum("INSERT INTO bp.tasks (task_id)"))
	assert.False(t, needsQuorum("SELECT * FROM bp.events"))
	assert.False(t, needsQuorum("INSERT INTO bp.events_local (id)"), "a local table is never written by bandplane")
	assert.Equal(t, withQuorum(nil, 1), nil, "a quorum of one is no wrapper")
}

func TestClusterConfigIsBounded(t *testing.T) {
	c := DefaultConfig()
	c.Cluster, c.InsertQuorum = "bandplane", 2
	c.Addr = "127.0.0.1:29001, 127.0.0.1:29002"
	require.NoError(t, c.Validate())
	assert.Equal(t, []string{"127.0.0.1:29001", "127.0.0.1:29002"}, c.Addrs())

	bad := c
	bad.Cluster = "bandplane ON CLUSTER x; DROP DATABASE bandplane"
	assert.ErrorContains(t, bad.Validate(), "is not a plain identifier (--cluster)")
	bad = c
	bad.InsertQuorum = 17
	assert.ErrorContains(t, bad.Validate(), "insert quorum 17 is out of range 0..16 (--insert-quorum)")
	bad.InsertQuorum = -1
	assert.ErrorContains(t, bad.Validate(), "out of range")
	bad = c
	bad.Addr = "127.0.0.1:29001,nohostport"
	assert.ErrorContains(t, bad.Validate(), `clickhouse address 2 "nohostport" is not host:port (--clickhouse)`)
	bad.Addr = strings.Repeat("h:1,", 65)
	assert.ErrorContains(t, bad.Validate(), "65 clickhouse addresses: at most 64")

	_, err := MigrateOn(t.Context(), nil, Config{Database: "db", Cluster: "c; DROP"})
	assert.ErrorContains(t, err, `cluster name "c; DROP" is not a plain identifier`)
	_, err = ApplyRetention(t.Context(), nil, Config{Database: "db", Cluster: "c'"}, DefaultRetention(), time.Now(), RetentionOptions{})
	assert.ErrorContains(t, err, `cluster name "c'" is not a plain identifier`)
}
