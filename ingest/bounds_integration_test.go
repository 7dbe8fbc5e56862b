package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// TestIntegrationLargeEventsAreBatchedByTheirBytes runs the real pipeline on events of
// 700 KiB with batches of 3 MiB: with a batch age of a minute and a batch size of
// 2,000, only their bytes can flush them, five at a time.
func TestIntegrationLargeEventsAreBatchedByTheirBytes(t *testing.T) {
	const events, size = 25, 700 << 10
	topic := stacktest.Topic(t, 2)
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, kafka.EnsureTopic(ctx, stacktest.Brokers(), topic+"_dlq", 1))
	metrics := ingest.NewMetrics(nil)
	p, err := ingest.NewPipeline(ctx, ingest.PipelineConfig{
		Brokers: stacktest.Brokers(), Topic: topic, DLQTopic: topic + "_dlq", GroupID: "large", Store: store.New(conn, db),
		RollupInterval: time.Second,
		Consumer: ingest.Config{Catalog: pricing.Default(), BatchSize: 2000, BatchAge: time.Minute, BatchBytes: 3 << 20, MaxPendingBytes: 8 << 20,
			RetryMin: 50 * time.Millisecond, RetryMax: time.Second, Logger: stacktest.Logger(), Metrics: metrics},
	})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done; _ = p.Close() }()

	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	defer producer.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	msgs := make([]kafkago.Message, events)
	for i := range msgs {
		content := strings.Repeat(string(rune('a'+i)), size)
		line := eventLine(fmt.Sprintf("large-%02d", i), "message.created", "u1", "user", "org-1", `{"content":"`+content+`"}`)
		msgs[i] = kafkago.Message{Key: []byte("room-1"), Value: []byte(line)} // one partition: one order
	}
	require.NoError(t, producer.ProduceMessages(ctx, msgs))

	var n, bytes uint64
	ok := stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(), sum(length(data)) FROM "+db+".events").Scan(&n, &bytes))
		return n == events
	})
	require.True(t, ok, "%d of %d large events stored within 30 s: batches are not flushed for their bytes", n, events)
	assert.Greater(t, bytes, uint64(events*size), "stored whole")
	// The last batch is counted after its commit, a moment after its rows are visible.
	stacktest.Eventually(t, 5*time.Second, 20*time.Millisecond, func() bool { return counterValue(t, metrics.Batches) >= events/5 })
	assert.Equal(t, float64(events/5), counterValue(t, metrics.Batches), "five events of 700 KiB reach 3 MiB")
	var lag int64
	ok = stacktest.Eventually(t, 10*time.Second, 100*time.Millisecond, func() bool {
		lag, _, err = kafka.Lag(ctx, stacktest.Brokers(), topic, "large")
		return err == nil && lag == 0
	})
	assert.True(t, ok, "committed: lag %d, %v", lag, err)
}
