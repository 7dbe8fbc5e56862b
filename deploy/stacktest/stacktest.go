// Package stacktest gives integration tests the real Kafka broker and ClickHouse server
// that deploy/local starts (`make up`, or `make test` which wraps the run): a unique
// topic and a unique, migrated database per test, dropped when the test ends.
//
// Integration tests run when BANDPLANE_INTEGRATION=1 (`make test` sets it); then a
// missing server fails the test with the command that starts it. Without it they skip,
// so `go test ./...` on a laptop with nothing running still passes the unit tests.
//
// It may import any folder but cmd/ (deploy/layers).
package stacktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/kafka"
)

// Brokers and ClickHouse address of the local stack (overridable like the CLI's).
func Brokers() []string {
	return strings.Split(env("BANDPLANE_KAFKA", "127.0.0.1:19092"), ",")
}

func ClickHouseAddr() string { return env("BANDPLANE_CLICKHOUSE", "127.0.0.1:19000") }

// ClickHouseCluster is the cluster the tests' databases are made on (BANDPLANE_CLICKHOUSE_CLUSTER,
// as the CLI's --cluster), "" for one server. `make test-cluster` runs the integration
// tests of the query and ingest packages on deploy/local/cluster.sh's cluster this way.
func ClickHouseCluster() string { return os.Getenv("BANDPLANE_CLICKHOUSE_CLUSTER") }

// ClickHouseConfig is the connection config of the tests' ClickHouse for database db.
func ClickHouseConfig(db string) chdb.Config {
	cfg := chdb.DefaultConfig()
	cfg.Addr = ClickHouseAddr()
	cfg.Database = db
	if cfg.Cluster = ClickHouseCluster(); cfg.Cluster != "" {
		cfg.InsertQuorum = 2
	}
	return cfg
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Require skips t unless integration tests are enabled.
func Require(t testing.TB) {
	t.Helper()
	if os.Getenv("BANDPLANE_INTEGRATION") != "1" {
		t.Skip("integration test: run `make test` (starts Kafka and ClickHouse, sets BANDPLANE_INTEGRATION=1)")
	}
}

// Name returns a unique identifier usable as a topic or database name.
func Name(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, t.Name())
	if len(n) > 40 {
		n = n[:40]
	}
	return "t_" + n + "_" + hex.EncodeToString(b[:])
}

// Topic creates a unique topic with the given partitions and deletes it at cleanup.
func Topic(t testing.TB, partitions int) string {
	t.Helper()
	Require(t)
	topic := Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ensureTopic(ctx, Brokers(), topic, partitions); err != nil {
		t.Fatalf("%v\n(start the stack with `make up`)", err)
	}
	t.Cleanup(func() {
		c := &kafkago.Client{Addr: kafkago.TCP(Brokers()...), Timeout: 10 * time.Second}
		_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	})
	return topic
}

// ensureTopic is kafka.EnsureTopic, tried again for a few seconds: a broker that was
// just restarted (the cluster tests kill them) may reset the first connections.
func ensureTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	var err error
	for try := 0; try < 5; try++ {
		if err = kafka.EnsureTopic(ctx, brokers, topic, partitions); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
	return err
}

// Database creates and migrates a unique database, and drops it at cleanup.
func Database(t testing.TB) (driver.Conn, string) {
	t.Helper()
	Require(t)
	cfg := ClickHouseConfig(Name(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if _, err := chdb.MigrateOn(ctx, conn, cfg); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		drop := "DROP DATABASE IF EXISTS " + cfg.Database
		if cfg.Cluster != "" {
			drop += " ON CLUSTER " + cfg.Cluster
		}
		_ = conn.Exec(ctx, drop)
		conn.Close()
	})
	return conn, cfg.Database
}

// Truncate empties db.table, on every server of the cluster when the tests run on one
// (a TRUNCATE of the Distributed table would leave its local tables as they are).
func Truncate(t testing.TB, conn driver.Conn, db, table string) {
	t.Helper()
	q := "TRUNCATE TABLE " + db + "." + table
	if c := ClickHouseCluster(); c != "" {
		q = "TRUNCATE TABLE " + db + "." + table + chdb.LocalSuffix + " ON CLUSTER " + c
	}
	if err := conn.Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// SkipOnCluster skips a test of one server's physical layout (parts, partitions, DDL
// on a table) when the tests run on a cluster.
func SkipOnCluster(t testing.TB, why string) {
	t.Helper()
	if ClickHouseCluster() != "" {
		t.Skip("not on a cluster: " + why)
	}
}

// RepoRoot is the repository's top folder (for deploy scripts and the binary build).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Eventually polls cond every interval until it returns true or timeout passes.
func Eventually(t testing.TB, timeout, interval time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// AwayFromMidnight returns when the next UTC midnight is at least margin away, waiting
// past it if it is nearer: a test of a day's budget, whose decisions take the real
// server's clock, then runs inside one day.
func AwayFromMidnight(t testing.TB, margin time.Duration) {
	t.Helper()
	now := time.Now().UTC()
	next := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	if wait := next.Sub(now); wait < margin {
		t.Logf("waiting %s for UTC midnight to pass: the test's budget is a day's", wait.Round(time.Second))
		time.Sleep(wait + time.Second)
	}
}
