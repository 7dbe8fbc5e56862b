package main

import (
	"context"
	"os/exec"
	"testing"
	"time"

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
	for n := 1; n <= stacktest.ClusterNodes; n++ {
		var local, dist string
		conn := stacktest.NodeConn(t, n)
		ctx := context.Background()
		require.NoError(t, conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'events_local'", db).Scan(&local), "node %d", n)
		require.NoError(t, conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'events'", db).Scan(&dist), "node %d", n)
		assert.Equal(t, "ReplicatedReplacingMergeTree", local, "node %d", n)
		assert.Equal(t, "Distributed", dist, "node %d", n)
	}

	// Hostile: a cluster name that is not an identifier never reaches the server.
	out, err := exec.Command(bin, "migrate", "--cluster", "bandplane; DROP DATABASE x", "--clickhouse", stacktest.ClickHouseAddr(),
		"--clickhouse-db", db).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "is not a plain identifier (--cluster)")
}
