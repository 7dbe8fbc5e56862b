package main

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

// `bandplane migrate --cluster` makes the replicated local tables and the Distributed
// tables on every server of the cluster, and a second run finds them up to date.
func TestIntegrationClusterMigrateCommand(t *testing.T) {
	stacktest.RequireClickHouseCluster(t)
	bin := bandplaneBinary(t)
	db := stacktest.Name(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_ = stacktest.NodeConn(t, 1).Exec(ctx, "DROP DATABASE IF EXISTS "+db+" ON CLUSTER "+stacktest.ClickHouseCluster())
	})
	run := func() string {
		out, err := exec.Command(bin, "migrate", "--cluster", stacktest.ClickHouseCluster(), "--clickhouse", stacktest.ClickHouseAddr(),
			"--clickhouse-db", db).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	assert.Contains(t, run(), "migrated from version 0 to")
	assert.Contains(t, run(), "is up to date")
	ctx := context.Background()
	nodes := make([]driver.Conn, stacktest.ClusterNodes+1) // by node number
	for n := 1; n <= stacktest.ClusterNodes; n++ {
		nodes[n] = stacktest.NodeConn(t, n)
	}
	for n := 1; n <= stacktest.ClusterNodes; n++ {
		var local, dist string
		conn := nodes[n]
		require.NoError(t, conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'events_local'", db).Scan(&local), "node %d", n)
		require.NoError(t, conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'events'", db).Scan(&dist), "node %d", n)
		assert.Equal(t, "ReplicatedReplacingMergeTree", local, "node %d", n)
		assert.Equal(t, "Distributed", dist, "node %d", n)
		// The ALTERs ran on one replica of each shard and reached the other (a replica
		// that was briefly inactive applies them from the log a moment later).
		var added uint64
		assert.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
			require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND "+
				"(table, name) IN (('usage_hourly_local', 'unpriced_reasoning_tokens'), ('dead_letters_local', 'raw_truncated'))", db).Scan(&added))
			return added == 2
		}), "node %d has %d of the 2 columns of the ALTERs", n, added)
	}

	// `retention --cluster` drops the old partitions from every replica of every shard.
	old := time.Now().UTC().AddDate(0, 0, -200)
	require.NoError(t, nodes[1].Exec(ctx, "INSERT INTO "+db+".dead_letters (time, topic, partition, offset, key, raw, stage, reason, received_at) "+
		"SELECT if(number < 40, toDateTime(?, 'UTC'), now()), concat('t', toString(number % 7)), 0, number, '', '', 'decode', 'r', now() FROM system.numbers LIMIT 41", old))
	localRows := func(n int) (total, oldRows uint64) {
		require.NoError(t, nodes[n].QueryRow(ctx, "SELECT count(), countIf(time < now() - 86400) FROM "+db+".dead_letters_local").Scan(&total, &oldRows))
		return total, oldRows
	}
	perShard := func() (sum uint64) {
		for n := 1; n <= stacktest.ClusterNodes; n += 2 {
			total, _ := localRows(n)
			sum += total
		}
		return sum
	}
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool { return perShard() == 41 }), "41 rows over the shards")
	out, err := exec.Command(bin, "retention", "--cluster", stacktest.ClickHouseCluster(), "--clickhouse", stacktest.ClickHouseAddr(),
		"--clickhouse-db", db).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), `"table":"dead_letters"`)
	for n := 1; n <= stacktest.ClusterNodes; n++ {
		var oldRows uint64
		ok := stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
			_, oldRows = localRows(n)
			return oldRows == 0
		})
		assert.True(t, ok, "node %d still has %d rows of the dropped partition", n, oldRows)
	}
	assert.Equal(t, uint64(1), perShard(), "the recent row is kept")

	// Hostile: a cluster name that is not an identifier never reaches the server.
	out, err = exec.Command(bin, "migrate", "--cluster", "bandplane; DROP DATABASE x", "--clickhouse", stacktest.ClickHouseAddr(),
		"--clickhouse-db", db).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "is not a plain identifier (--cluster)")
}
