package ingest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
)

// TestIntegrationClusterBrokerKilled: on the three-broker cluster (RF 3,
// min.insync.replicas 2, acks=all), the broker that coordinates the ingest group and
// leads some of the topic's partitions is SIGKILLed while the producer writes and the
// pipeline consumes, then started again. Every acknowledged event is stored exactly
// once, and every sum and rollup matches what was produced.
func TestIntegrationClusterBrokerKilled(t *testing.T) {
	stacktest.RequireCluster(t)
	began := time.Now()
	ctx := context.Background()
	brokers := stacktest.ClusterBrokers()

	const partitions = 8
	topic := stacktest.ClusterTopic(t, partitions)
	factor, minInsync, err := kafka.TopicReplication(ctx, brokers, topic)
	require.NoError(t, err)
	require.Equal(t, 3, factor, "EnsureTopic on three brokers: replication factor 3")
	require.Equal(t, 2, minInsync, "EnsureTopic on three brokers: min.insync.replicas 2")
	parts, err := kafka.Partitions(ctx, brokers, topic)
	require.NoError(t, err)
	require.Len(t, parts, partitions)

	conn, db := stacktest.Database(t)
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })
	p := &pipeline{t: t, topic: topic, conn: conn, db: db, producer: producer}
	group := stacktest.Name(t) // its own group, so its own coordinator and no other test's members
	stacktest.RunClusterIngest(t, topic, conn, db, group)

	// 24,000 events, one batch of 250 in flight at a time (as the simulator sends
	// them), as fast as acks=all allows (a few thousand per second on an idle 2-core box,
	// some hundreds on a busy one) except while the broker is down or restarting, when
	// the sink holds the pace at about 200/s: that keeps the stream going until the
	// broker is back however long its restart takes, so both happen mid-stream.
	const events = 24_000
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed, cfg.Rooms, cfg.BatchSize = events, 11, 32, 250
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	sink := &timedSink{sink: ingest.ProducerSink{Producer: producer}}
	type result struct {
		sum simulate.Summary
		err error
	}
	produced := make(chan result, 1)
	go func() {
		sum, err := simulate.Run(ctx, cfg, sink, nil)
		produced <- result{sum, err}
	}()

	stopSampling := make(chan struct{})
	var samples []sample
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		samples = sampleStored(p, sink, stopSampling)
	}()

	// Kill a quarter of the way in: the group's coordinator, which leads some
	// partitions too (leaders are spread over the three).
	require.True(t, stacktest.Eventually(t, 60*time.Second, 20*time.Millisecond, func() bool { return sink.acked.Load() >= events/4 }),
		"the producer never got going: %d events acknowledged", sink.acked.Load())
	victim, err := stacktest.GroupCoordinator(ctx, group)
	require.NoError(t, err)
	leaders, err := stacktest.PartitionLeaders(ctx, topic)
	require.NoError(t, err)
	var led []int
	for part, leader := range leaders {
		if leader == victim {
			led = append(led, part)
		}
	}
	slices.Sort(led)
	killedAt := time.Now()
	sink.throttle.Store(true)
	stacktest.KillBroker(t, victim)
	t.Logf("SIGKILLed broker %d (group coordinator, leader of partitions %v) at %.1fs, %d events acknowledged",
		victim, led, killedAt.Sub(began).Seconds(), sink.acked.Load())

	// Down for 10 s (longer than the controller's session timeout: its partitions move
	// to the other two), then started again while the stream goes on.
	time.Sleep(10 * time.Second)
	restartAt := time.Now()
	t.Logf("restarting broker %d at %.1fs, %d events acknowledged", victim, restartAt.Sub(began).Seconds(), sink.acked.Load())
	restarted := make(chan error, 1)
	go func() { restarted <- stacktest.StartNode(ctx, victim) }()
	var res result
	ended := false
	select {
	case err := <-restarted:
		require.NoError(t, err)
	case res = <-produced:
		ended = true
		require.NoError(t, <-restarted)
	}
	sink.throttle.Store(false)
	t.Logf("broker %d back in the cluster at %.1fs (start-node took %.1fs), %d events acknowledged",
		victim, time.Since(began).Seconds(), time.Since(restartAt).Seconds(), sink.acked.Load())
	if ended {
		t.Logf("(the stream had ended before broker %d was back)", victim)
	} else {
		res = <-produced
	}
	require.NoError(t, res.err)
	sum := res.sum
	require.Equal(t, cfg.Events, sum.Events)
	require.Greater(t, sum.UsageEvents, 1000, "the workload reports usage")
	require.Greater(t, sum.InputTokens, int64(0))
	t.Logf("producer done at %.1fs: %d events (%d usage), %d sends, %d failed attempts retried by the caller",
		time.Since(began).Seconds(), sum.Events, sum.UsageEvents, sink.sends.Load(), sink.failures.Load())

	want := expected(sum)
	p.waitSums(want, 90*time.Second)
	caughtUp := time.Now()
	close(stopSampling)
	sampling.Wait()

	// Nothing lost, nothing doubled: one row per produced event id.
	var distinct, raw, finalCount uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT uniqExact(id), count() FROM "+db+".events WHERE lower(source) NOT LIKE 'bandplane%'").Scan(&distinct, &raw))
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".events FINAL WHERE lower(source) NOT LIKE 'bandplane%'").Scan(&finalCount))
	assert.Equal(t, uint64(sum.Events), distinct, "distinct event ids")
	assert.Equal(t, uint64(sum.Events), finalCount, "events FINAL")
	var usageDistinct, usageFinal uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT uniqExact(event_id) FROM "+db+".usage").Scan(&usageDistinct))
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage FINAL").Scan(&usageFinal))
	assert.Equal(t, uint64(sum.UsageEvents), usageDistinct, "distinct usage ids")
	assert.Equal(t, uint64(sum.UsageEvents), usageFinal, "usage FINAL")
	var deadLetters uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".dead_letters").Scan(&deadLetters))
	assert.Zero(t, deadLetters, "a redelivered event is a replay, never a dead letter")
	// The day rows of the cost rollup are rebuilt from the hourly one: their totals too.
	var dailyEvents uint64
	var dailyCost decimal.Decimal
	ok := stacktest.Eventually(t, 30*time.Second, 250*time.Millisecond, func() bool {
		require.NoError(t, conn.QueryRow(ctx, "SELECT sum(events), sum(cost) FROM "+db+".usage_rollup FINAL WHERE grain = 'day'").Scan(&dailyEvents, &dailyCost))
		return dailyEvents == uint64(sum.UsageEvents) && dailyCost.Shift(6).IntPart() == sum.CostMicros
	})
	assert.True(t, ok, "usage_rollup days: %d events, cost %s; want %d events, cost %d micros", dailyEvents, dailyCost, sum.UsageEvents, sum.CostMicros)

	// The restarted broker caught up: every replica of the topic in sync again.
	stacktest.WaitInSync(t, topic, 60*time.Second)

	t.Logf("stored rows: %d without FINAL for %d events (redelivered copies kept out: %d)", raw, sum.Events, raw-distinct)
	took, startedAfter := sink.longestAround(killedAt)
	t.Logf("producer stall: longest send of 250 events from the kill on took %s (started %s after the kill); before the kill at most %s",
		took, startedAfter, sink.longestBefore(killedAt))
	stall, stallAt := consumerStall(samples, killedAt)
	t.Logf("consumer stall: stored rows did not grow for %s while acknowledged events waited (from %.1fs after the kill)",
		stall.Round(10*time.Millisecond), stallAt.Sub(killedAt).Seconds())
	t.Logf("consumer caught up %.1fs after the producer finished; test took %.1fs", caughtUp.Sub(sink.lastAck()).Seconds(), time.Since(began).Seconds())
}

// timedSink times every Send of the workload and, like a client of the collector
// answered 503, retries a batch the producer could not get acknowledged (the event ids
// make that harmless).
type timedSink struct {
	sink     simulate.Sink
	acked    atomic.Int64
	sends    atomic.Int64
	failures atomic.Int64
	throttle atomic.Bool // hold the pace at about 200 events/s (batches of 250)

	mu    sync.Mutex
	spans []span
	last  time.Time
}

type span struct {
	start time.Time
	took  time.Duration
}

func (s *timedSink) Send(ctx context.Context, lines [][]byte) error {
	if s.throttle.Load() {
		time.Sleep(1200 * time.Millisecond)
	}
	start := time.Now()
	s.sends.Add(1)
	for attempt := 1; ; attempt++ {
		err := s.sink.Send(ctx, lines)
		if err == nil {
			now := time.Now()
			s.acked.Add(int64(len(lines)))
			s.mu.Lock()
			s.spans = append(s.spans, span{start, now.Sub(start)})
			s.last = now
			s.mu.Unlock()
			return nil
		}
		s.failures.Add(1)
		if ctx.Err() != nil || attempt == 20 {
			return fmt.Errorf("send of %d lines failed %d times, last: %w", len(lines), attempt, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// longestAround is the longest send that was in flight at t or started after it, and
// how long after t it started (negative: before); longestBefore the longest that ended
// before t.
func (s *timedSink) longestAround(t time.Time) (took time.Duration, startedAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best span
	for _, sp := range s.spans {
		if sp.start.Add(sp.took).After(t) && sp.took > best.took {
			best = sp
		}
	}
	return best.took.Round(10 * time.Millisecond), best.start.Sub(t).Round(10 * time.Millisecond)
}

func (s *timedSink) longestBefore(t time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	for _, sp := range s.spans {
		if !sp.start.Add(sp.took).After(t) {
			d = max(d, sp.took)
		}
	}
	return d.Round(10 * time.Millisecond)
}

func (s *timedSink) lastAck() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// sample is the count of rows in events (all copies) next to the count of events the
// producer had had acknowledged at the time.
type sample struct {
	at            time.Time
	stored, acked int64
}

// sampleStored reads the stored row count every 100 ms until stop is closed.
func sampleStored(p *pipeline, sink *timedSink, stop <-chan struct{}) []sample {
	var out []sample
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case <-tick.C:
		}
		acked := sink.acked.Load()
		var n uint64
		if err := p.conn.QueryRow(context.Background(), "SELECT count() FROM "+p.db+".events").Scan(&n); err != nil {
			continue
		}
		out = append(out, sample{at: time.Now(), stored: int64(n), acked: acked})
	}
}

// consumerStall is the longest time, ending after kill, during which the stored row count
// stayed the same although the producer had had more events acknowledged than were
// stored: time the consumer could have been writing and was not.
func consumerStall(samples []sample, kill time.Time) (time.Duration, time.Time) {
	var longest time.Duration
	var at time.Time
	for i := 0; i < len(samples); {
		j := i
		for j+1 < len(samples) && samples[j+1].stored == samples[i].stored {
			j++
		}
		if j+1 < len(samples) && samples[j+1].at.After(kill) && samples[i].acked > samples[i].stored {
			if d := samples[j+1].at.Sub(samples[i].at); d > longest {
				longest, at = d, samples[i].at
			}
		}
		i = j + 1
	}
	return longest, at
}
