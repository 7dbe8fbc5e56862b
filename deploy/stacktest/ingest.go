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
	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/pricing"
	"github.com/bandplane/bandplane/ingest/store"
)

// Logger discards unless BANDPLANE_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("BANDPLANE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// RunIngest runs the real ingest consumer (and its rollup) on topic into db, as
// `bandplane serve` does, with small batches for quick tests. The returned function
// stops it gracefully (flush and commit); cleanup calls it too.
func RunIngest(t testing.TB, topic string, conn driver.Conn, db, group string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reader, err := kafka.NewReader(kafka.ReaderConfig{Brokers: Brokers(), Topic: topic, GroupID: group})
	if err != nil {
		t.Fatal(err)
	}
	dlqTopic := topic + "_dlq"
	if err := kafka.EnsureTopic(ctx, Brokers(), dlqTopic, 1); err != nil {
		t.Fatal(err)
	}
	dlq, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: Brokers(), Topic: dlqTopic})
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(conn, db)
	dir := ingest.NewDirectory()
	rows, err := st.LoadDirectory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir.Load(rows)
	late, err := st.UnattributedParties(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unpriced, err := st.UnpricedAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	log, m := Logger(), ingest.NewMetrics(nil)
	rollup := ingest.NewRollup(st, dir, pricing.Default(), 200*time.Millisecond, log, m)
	c, err := ingest.New(ingest.Config{
		Reader: reader, DeadLetters: dlq, Storage: st, Directory: dir, Catalog: pricing.Default(), Topic: topic,
		BatchSize: 2000, BatchAge: 200 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: time.Second,
		LateParties: late, UnpricedAgents: unpriced, AfterFlush: rollup.Mark, Logger: log, Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = c.Run(ctx) }()
	go func() { defer wg.Done(); _ = rollup.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			reader.Close()
			dlq.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}
