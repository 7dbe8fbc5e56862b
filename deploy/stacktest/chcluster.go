package stacktest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema/chdb"
)

// The ClickHouse cluster of deploy/local/cluster.sh (2 shards x 2 replicas, `make
// test-cluster` starts it and points BANDPLANE_CLICKHOUSE at its four servers and
// BANDPLANE_CLICKHOUSE_CLUSTER at it, so that Database migrates there).

// ClusterNodes is the number of ClickHouse servers of cluster.sh; node n (1-based)
// holds shard (n+1)/2.
const ClusterNodes = 4

// NodeAddr is the native address of cluster.sh's node n.
func NodeAddr(n int) string { return fmt.Sprintf("127.0.0.1:2900%d", n) }

// RequireClickHouseCluster skips t unless cluster tests are enabled, and fails it when
// the tests' databases are not made on cluster.sh's cluster.
func RequireClickHouseCluster(t testing.TB) {
	t.Helper()
	RequireCluster(t)
	if ClickHouseCluster() == "" {
		t.Fatal("BANDPLANE_CLICKHOUSE_CLUSTER is not set: run `make test-cluster` (or deploy/local/cluster.sh up and set " +
			"BANDPLANE_CLICKHOUSE=127.0.0.1:29001,127.0.0.1:29002,127.0.0.1:29003,127.0.0.1:29004 BANDPLANE_CLICKHOUSE_CLUSTER=bandplane)")
	}
}

func clusterScript(t testing.TB, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(RepoRoot(), "deploy", "local", "cluster.sh"), args...)
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cluster.sh %v: %v\n%s", args, err, out)
	}
}

// KillClickHouse SIGKILLs ClickHouse node n; StartClickHouse starts it again (cleanup does too, so
// a failed test never leaves the cluster short of a server).
func KillClickHouse(t testing.TB, n int) {
	t.Helper()
	clusterScript(t, "kill-node", fmt.Sprint(n))
	t.Cleanup(func() { clusterScript(t, "start-node", fmt.Sprint(n)) })
}

func StartClickHouse(t testing.TB, n int) { t.Helper(); clusterScript(t, "start-node", fmt.Sprint(n)) }

// NodeConn connects to node n alone, to read its local tables.
func NodeConn(t testing.TB, n int) driver.Conn {
	t.Helper()
	cfg := chdb.DefaultConfig()
	cfg.Addr = NodeAddr(n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
