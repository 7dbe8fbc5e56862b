package dual_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
)

// loadSimulated sends events lines of simulated platform traffic (seed 5, starting two
// hours ago) through Kafka and the real ingest pipeline into rec's database, waits until
// all are stored, and stops the pipeline (so no statement runs concurrently with the
// test's own). The pipeline's statements are recorded like any other.
func loadSimulated(t *testing.T, rec *dual.Recorder, events int) simulate.Summary {
	t.Helper()
	ctx := context.Background()
	topic := stacktest.Topic(t, 2)
	stop := stacktest.RunIngest(t, topic, rec, rec.DB(), "ingest")
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	defer producer.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed = events, 5
	cfg.Start = time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
	sum, err := simulate.Run(ctx, cfg, ingest.ProducerSink{Producer: producer}, nil)
	require.NoError(t, err)
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		var n uint64
		return rec.Conn.QueryRow(ctx, "SELECT count() FROM "+rec.DB()+".events FINAL").Scan(&n) == nil && n == uint64(sum.Events)
	}), "ingest did not store the simulated traffic")
	stop()
	return sum
}
