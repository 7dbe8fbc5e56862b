package kafka_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
)

// deadLetterOf is the largest message ingest makes of a record of value v: the record
// as its value, a key of the longest id, and the headers of a dead letter with a
// reason of the longest allowed, a source naming the longest topic, and the
// truncation mark.
func deadLetterOf(v []byte) kafkago.Message {
	return kafkago.Message{Key: []byte(strings.Repeat("k", schema.MaxIDBytes)), Value: v, Headers: []kafkago.Header{
		{Key: "bandplane-reason", Value: []byte(strings.Repeat("r", 1024))},
		{Key: "bandplane-stage", Value: []byte("validate")},
		{Key: "bandplane-source", Value: []byte(strings.Repeat("t", 249) + "/2147483647/9223372036854775807")},
		{Key: "bandplane-truncated", Value: []byte("9223372036854775807")},
	}}
}

func TestMessageLimitsLeaveRoomForTheKeyAndADeadLetter(t *testing.T) {
	assert.Equal(t, 1<<20, kafka.MaxMessageBytes)
	assert.Greater(t, kafka.TopicMaxMessageBytes, kafka.MaxMessageBytes+kafka.MaxMessageBytes/200+1024, "room for LZ4's worst case and the batch header")
	m := deadLetterOf(make([]byte, kafka.MaxEventBytes))
	assert.LessOrEqual(t, kafka.MessageSize(&m), kafka.MaxMessageBytes, "an event of MaxEventBytes always fits, as itself and as a dead letter")
	m.Headers = nil
	assert.Less(t, kafka.MessageSize(&m), kafka.MaxMessageBytes)
}

// TestMessageSizeCountsAsTheWriterDoes: the writer refuses, before any I/O, a message
// whose MessageSize exceeds its BatchBytes, and accepts one that equals it.
func TestMessageSizeCountsAsTheWriterDoes(t *testing.T) {
	m := deadLetterOf([]byte("some value"))
	size := kafka.MessageSize(&m)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	w := &kafkago.Writer{Addr: kafkago.TCP("127.0.0.1:1"), Topic: "t", BatchBytes: int64(size - 1), MaxAttempts: 1}
	err := w.WriteMessages(ctx, m)
	assert.True(t, kafka.IsMessageTooLarge(err), "%v", err)
	w = &kafkago.Writer{Addr: kafkago.TCP("127.0.0.1:1"), Topic: "t", BatchBytes: int64(size), MaxAttempts: 1}
	err = w.WriteMessages(ctx, m)
	require.Error(t, err, "nothing listens there")
	assert.False(t, kafka.IsMessageTooLarge(err), "%v", err)
}

func TestIsMessageTooLarge(t *testing.T) {
	assert.True(t, kafka.IsMessageTooLarge(kafkago.WriteErrors{nil, kafkago.MessageSizeTooLarge}))
	assert.True(t, kafka.IsMessageTooLarge(kafkago.MessageSizeTooLarge))
	assert.False(t, kafka.IsMessageTooLarge(kafkago.WriteErrors{kafkago.NotLeaderForPartition}))
	assert.False(t, kafka.IsMessageTooLarge(context.DeadlineExceeded))
	assert.False(t, kafka.IsMessageTooLarge(nil))
}

func TestIntegrationAnEventOfMaxEventBytesIsAccepted(t *testing.T) {
	topic := stacktest.Topic(t, 1)
	ctx := context.Background()
	require.Equal(t, kafka.TopicMaxMessageBytes, eventualLimit(t, topic, kafka.TopicMaxMessageBytes), "EnsureTopic sets the topic's limit")

	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	defer p.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	// Random bytes: LZ4 cannot shrink them, the broker sees the batch at full size.
	v := make([]byte, kafka.MaxEventBytes)
	_, _ = rand.Read(v)
	dl := deadLetterOf(v) // the biggest dead letter of the biggest event
	require.NoError(t, p.ProduceMessages(ctx, []kafkago.Message{dl}))
	// A batch of several large ones: the writer splits by BatchBytes.
	require.NoError(t, p.ProduceMessages(ctx, []kafkago.Message{{Value: v[:kafka.MaxEventBytes/2]}, {Value: v[:kafka.MaxEventBytes/2]}, {Value: v}}))

	over := kafkago.Message{Value: make([]byte, kafka.MaxMessageBytes)}
	err = p.ProduceMessages(ctx, []kafkago.Message{over})
	require.Error(t, err)
	assert.True(t, kafka.IsMessageTooLarge(err), "%v", err)

	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: stacktest.Brokers(), Topic: topic, Partition: 0, MaxBytes: 8 << 20})
	defer r.Close() //nolint:errcheck // a partition reader commits nothing
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	m, err := r.ReadMessage(rctx)
	require.NoError(t, err)
	assert.Equal(t, v, m.Value)
	assert.Len(t, m.Headers, 4)
}

func TestIntegrationEnsureTopicRaisesALowerLimit(t *testing.T) {
	stacktest.Require(t)
	topic := stacktest.Name(t)
	ctx := context.Background()
	c := &kafkago.Client{Addr: kafkago.TCP(stacktest.Brokers()...), Timeout: 15 * time.Second}
	resp, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafkago.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "100000"}, {ConfigName: "retention.ms", ConfigValue: "3600000"}},
	}}})
	require.NoError(t, err)
	require.NoError(t, resp.Errors[topic])
	t.Cleanup(func() {
		_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	})

	require.NoError(t, kafka.EnsureTopic(ctx, stacktest.Brokers(), topic, 1))
	// The broker applies a configuration change from its metadata log, a moment after
	// the controller accepted it.
	assert.Equal(t, kafka.TopicMaxMessageBytes, eventualLimit(t, topic, kafka.TopicMaxMessageBytes))
	dc, err := c.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"}}}})
	require.NoError(t, err)
	require.Len(t, dc.Resources, 1)
	require.Len(t, dc.Resources[0].ConfigEntries, 1)
	assert.Equal(t, "3600000", dc.Resources[0].ConfigEntries[0].ConfigValue, "the topic's other settings are kept")

	// A topic with a higher limit is left alone.
	_, err = c.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{Name: "max.message.bytes", Value: strconv.Itoa(8 << 20)}}}}})
	require.NoError(t, err)
	require.Equal(t, 8<<20, eventualLimit(t, topic, 8<<20))
	require.NoError(t, kafka.EnsureTopic(ctx, stacktest.Brokers(), topic, 1))
	limit, err := kafka.TopicMessageLimit(ctx, stacktest.Brokers(), topic)
	require.NoError(t, err)
	assert.Equal(t, 8<<20, limit)
}

func TestReplicationFollowsTheLiveBrokers(t *testing.T) {
	for _, tc := range []struct{ brokers, factor, minInsync int }{
		{0, 1, 1}, // no broker listed (yet): what one would get; CreateTopics then fails
		{1, 1, 1}, // the local single node: as before
		{2, 2, 2}, // a cluster with a broker down: both copies must acknowledge
		{3, 3, 2}, // any one broker can be lost, and writes go on with one down
		{5, 3, 2},
	} {
		factor, minInsync := kafka.Replication(tc.brokers)
		assert.Equal(t, tc.factor, factor, "replication factor with %d brokers", tc.brokers)
		assert.Equal(t, tc.minInsync, minInsync, "min.insync.replicas with %d brokers", tc.brokers)
		assert.LessOrEqual(t, minInsync, factor, "a topic must be writable with every replica in sync")
	}
}

// TestIntegrationEnsureTopicReplication: on the local single broker a topic gets one
// replica and min.insync.replicas 1, as before there were clusters (on whatever
// BANDPLANE_KAFKA names: what Replication says for its brokers).
func TestIntegrationEnsureTopicReplication(t *testing.T) {
	topic := stacktest.Topic(t, 2)
	ctx := context.Background()
	live, err := kafka.LiveBrokers(ctx, stacktest.Brokers())
	require.NoError(t, err)
	require.GreaterOrEqual(t, live, 1)
	wantFactor, wantMinInsync := kafka.Replication(live)
	if live == 1 {
		require.Equal(t, 1, wantFactor)
		require.Equal(t, 1, wantMinInsync)
	}
	factor, minInsync, err := kafka.TopicReplication(ctx, stacktest.Brokers(), topic)
	require.NoError(t, err)
	assert.Equal(t, wantFactor, factor)
	assert.Equal(t, wantMinInsync, minInsync)

	_, _, err = kafka.TopicReplication(ctx, stacktest.Brokers(), topic+"_missing")
	require.Error(t, err)
	assert.Contains(t, err.Error(), topic+"_missing")
}

// TestIntegrationClusterEnsureTopicReplication runs on the three-broker cluster (`make
// test-cluster`): a new topic gets three replicas and min.insync.replicas 2; an existing
// one with one replica is left so, without an error, and TopicReplication shows it; one
// with three replicas and min.insync.replicas 1 is raised to 2.
func TestIntegrationClusterEnsureTopicReplication(t *testing.T) {
	topic := stacktest.ClusterTopic(t, 3)
	ctx := context.Background()
	brokers := stacktest.ClusterBrokers()
	live, err := kafka.LiveBrokers(ctx, brokers)
	require.NoError(t, err)
	require.Equal(t, 3, live)
	factor, minInsync, err := kafka.TopicReplication(ctx, brokers, topic)
	require.NoError(t, err)
	assert.Equal(t, 3, factor)
	assert.Equal(t, 2, minInsync)

	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	create := func(name string, rf int, minISR string) {
		resp, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
			Topic: name, NumPartitions: 2, ReplicationFactor: rf,
			ConfigEntries: []kafkago.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: minISR}},
		}}})
		require.NoError(t, err)
		require.NoError(t, resp.Errors[name])
		t.Cleanup(func() {
			_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{name}})
		})
	}
	single := stacktest.Name(t)
	create(single, 1, "1")
	require.NoError(t, kafka.EnsureTopic(ctx, brokers, single, 2), "a topic with fewer replicas is not an error")
	factor, minInsync, err = kafka.TopicReplication(ctx, brokers, single)
	require.NoError(t, err)
	wantFactor, _ := kafka.Replication(live)
	assert.Equal(t, 1, factor, "EnsureTopic does not reassign partitions")
	assert.Less(t, factor, wantFactor, "the shortfall is detectable")
	assert.Equal(t, 1, minInsync)

	loose := stacktest.Name(t)
	create(loose, 3, "1")
	require.NoError(t, kafka.EnsureTopic(ctx, brokers, loose, 2))
	// The brokers apply a configuration change from the metadata log a moment later.
	ok := stacktest.Eventually(t, 10*time.Second, 50*time.Millisecond, func() bool {
		_, minInsync, err = kafka.TopicReplication(ctx, brokers, loose)
		require.NoError(t, err)
		return minInsync == 2
	})
	assert.True(t, ok, "min.insync.replicas raised to 2, is %d", minInsync)
}

// eventualLimit reads the topic's max.message.bytes until it is want, for up to 10 s,
// and returns the last value read.
func eventualLimit(t *testing.T, topic string, want int) int {
	t.Helper()
	var limit int
	stacktest.Eventually(t, 10*time.Second, 50*time.Millisecond, func() bool {
		var err error
		limit, err = kafka.TopicMessageLimit(context.Background(), stacktest.Brokers(), topic)
		require.NoError(t, err)
		return limit == want
	})
	return limit
}

func TestNewReaderQueueIsBoundedInBytes(t *testing.T) {
	assert.LessOrEqual(t, kafka.ReaderQueueBytes, 512<<20, "a queue full of the largest messages stays in hundreds of MiB")
	base := kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"}
	r, err := kafka.NewReader(base)
	require.NoError(t, err)
	assert.Equal(t, kafka.ReaderQueueCapacity, r.Config().QueueCapacity, "the default")
	assert.Equal(t, kafka.ReaderFetchBytes, r.Config().MaxBytes)
	require.NoError(t, r.Close())

	cfg := base
	cfg.QueueCapacity = 10
	r, err = kafka.NewReader(cfg)
	require.NoError(t, err)
	assert.Equal(t, 10, r.Config().QueueCapacity)
	require.NoError(t, r.Close())

	cfg.QueueCapacity = -1
	_, err = kafka.NewReader(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "queue capacity")
}
