// Package stacktest gives integration tests the real Kafka broker and ClickHouse server
// that deploy/local starts (`make up`, or `make test` which wraps the run): a unique
// topic and a unique, migrated database per test, dropped when the test ends.
//
// Integration tests run when BANDPLANE_INTEGRATION=1 (`make test` sets it); then a
// missing server fails the test with the command that starts it. Without it they skip,
// so `go test ./...` on a laptop with nothing running still passes the unit tests.
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

	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/schema/chdb"
)

// Brokers and ClickHouse address of the local stack (overridable like the CLI's).
func Brokers() []string {
	return strings.Split(env("BANDPLANE_KAFKA", "127.0.0.1:19092"), ",")
}

func ClickHouseAddr() string { return env("BANDPLANE_CLICKHOUSE", "127.0.0.1:19000") }

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
	if err := kafka.EnsureTopic(ctx, Brokers(), topic, partitions); err != nil {
		t.Fatalf("%v\n(start the stack with `make up`)", err)
	}
	t.Cleanup(func() {
		c := &kafkago.Client{Addr: kafkago.TCP(Brokers()...), Timeout: 10 * time.Second}
		_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	})
	return topic
}

// Database creates and migrates a unique database, and drops it at cleanup.
func Database(t testing.TB) (driver.Conn, string) {
	t.Helper()
	Require(t)
	cfg := chdb.DefaultConfig()
	cfg.Addr = ClickHouseAddr()
	cfg.Database = Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if _, err := chdb.Migrate(ctx, conn, cfg.Database); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+cfg.Database)
		conn.Close()
	})
	return conn, cfg.Database
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
