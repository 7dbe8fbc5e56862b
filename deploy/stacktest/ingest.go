package stacktest

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Logger discards unless BANDPLANE_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("BANDPLANE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// StoredTopic is the stored-events topic of the ingest RunIngest runs on topic: the
// notes of what it stored, for a sealer.
func StoredTopic(topic string) string { return topic + "_stored" }

// RunIngest runs the real ingest pipeline on topic into db, as `bandplane serve` does,
// with small batches for quick tests; it notes what it stores on StoredTopic(topic).
// The returned function stops it gracefully (flush and commit); cleanup calls it too.
func RunIngest(t testing.TB, topic string, conn driver.Conn, db, group string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tp := range []string{topic + "_dlq", StoredTopic(topic)} {
		if err := kafka.EnsureTopic(ctx, Brokers(), tp, 1); err != nil {
			t.Fatal(err)
		}
	}
	return runIngest(t, Brokers(), topic, conn, db, group)
}

// runIngest runs the pipeline on topic of brokers (its dead-letter topic, topic_dlq,
// and its stored-events topic made already) until stop or cleanup.
func runIngest(t testing.TB, brokers []string, topic string, conn driver.Conn, db, group string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := ingest.NewPipeline(ctx, ingest.PipelineConfig{
		Brokers: brokers, Topic: topic, DLQTopic: topic + "_dlq", StoredTopic: StoredTopic(topic), GroupID: group, Store: store.New(conn, db),
		RollupInterval: 200 * time.Millisecond,
		Consumer: ingest.Config{Catalog: pricing.Default(), BatchSize: 2000, BatchAge: 200 * time.Millisecond,
			RetryMin: 50 * time.Millisecond, RetryMax: time.Second, Logger: Logger()},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = p.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}
