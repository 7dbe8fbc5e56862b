package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// brokerOfTwoPartitions answers kafka-go's Writer as a one-broker cluster whose topic
// has two partitions. fail decides the error of the n-th produce request (counted from
// 1) to a partition; it counts the records each partition stored.
type brokerOfTwoPartitions struct {
	topic string
	fail  func(partition int32, n int) error

	mu       sync.Mutex
	requests map[int32]int
	stored   map[int32]int
}

func (b *brokerOfTwoPartitions) RoundTrip(_ context.Context, _ net.Addr, req kafkago.Request) (kafkago.Response, error) {
	switch r := req.(type) {
	case *metadataAPI.Request:
		return &metadataAPI.Response{
			Brokers: []metadataAPI.ResponseBroker{{NodeID: 1, Host: "127.0.0.1", Port: 9}},
			Topics: []metadataAPI.ResponseTopic{{Name: b.topic, Partitions: []metadataAPI.ResponsePartition{
				{PartitionIndex: 0, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}},
				{PartitionIndex: 1, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}},
			}}},
		}, nil
	case *produceAPI.Request:
		part := r.Topics[0].Partitions[0]
		b.mu.Lock()
		b.requests[part.Partition]++
		n := b.requests[part.Partition]
		b.mu.Unlock()
		if err := b.fail(part.Partition, n); err != nil {
			return nil, err
		}
		records := 0
		for {
			_, err := part.RecordSet.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, err
			}
			records++
		}
		b.mu.Lock()
		b.stored[part.Partition] += records
		b.mu.Unlock()
		return &produceAPI.Response{Topics: []produceAPI.ResponseTopic{{Topic: b.topic,
			Partitions: []produceAPI.ResponsePartition{{Partition: part.Partition}}}}}, nil
	default:
		return nil, errors.New("unexpected request " + strconv.Itoa(int(req.ApiKey())))
	}
}

func producerOn(t *testing.T, b *brokerOfTwoPartitions) *Producer {
	t.Helper()
	b.topic, b.requests, b.stored = "t", map[int32]int{}, map[int32]int{}
	p, err := NewProducer(ProducerConfig{Brokers: []string{"127.0.0.1:9"}, Topic: b.topic})
	require.NoError(t, err)
	p.w.Transport = b
	// One attempt inside kafka-go: what is written again here is ProduceMessages' own.
	p.w.MaxAttempts = 1
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// messagesOnBothPartitions returns 40 messages whose keys the writer's hash spreads
// over both partitions.
func messagesOnBothPartitions() []kafkago.Message {
	msgs := make([]kafkago.Message, 40)
	for i := range msgs {
		msgs[i] = kafkago.Message{Key: []byte("room-" + strconv.Itoa(i)), Value: []byte("{}")}
	}
	return msgs
}

func TestProduceWritesAgainWhatARestartFailed(t *testing.T) {
	for name, failure := range map[string]error{
		// A connection to a broker that restarted: kafka-go's Writer gives up at once.
		"EOF": io.EOF,
		// Metadata read while the broker went down, as the writer's transport reports it.
		"no leader": fmt.Errorf("kafka.(*Client).Produce: %w", produceAPI.NewError(protocol.NewErrNoLeader("t", 0))),
	} {
		t.Run(name, func(t *testing.T) {
			b := &brokerOfTwoPartitions{fail: func(_ int32, n int) error {
				if n <= 2 {
					return failure
				}
				return nil
			}}
			p := producerOn(t, b)
			require.NoError(t, p.ProduceMessages(context.Background(), messagesOnBothPartitions()))
			assert.Equal(t, map[int32]int{0: 3, 1: 3}, b.requests, "written twice again")
			assert.Equal(t, 40, b.stored[0]+b.stored[1], "every message is stored once")
			assert.Positive(t, b.stored[0])
			assert.Positive(t, b.stored[1])
		})
	}
}

func TestProduceDoesNotWriteAgainWhatWouldComeOutOfOrder(t *testing.T) {
	// One partition's batch failed, the other's was written: writing the failed
	// messages again could put them after later messages of their partition.
	b := &brokerOfTwoPartitions{fail: func(partition int32, n int) error {
		if partition == 0 && n == 1 {
			return io.EOF
		}
		return nil
	}}
	p := producerOn(t, b)
	err := p.ProduceMessages(context.Background(), messagesOnBothPartitions())
	require.ErrorContains(t, err, "EOF")
	assert.Equal(t, map[int32]int{0: 1, 1: 1}, b.requests)
}

func TestProduceGivesUpOnOtherErrorsAndOnEndlessEOF(t *testing.T) {
	t.Run("another error is not written again", func(t *testing.T) {
		b := &brokerOfTwoPartitions{fail: func(partition int32, _ int) error {
			if partition == 1 {
				return errors.New("the disk is full")
			}
			return nil
		}}
		p := producerOn(t, b)
		err := p.ProduceMessages(context.Background(), messagesOnBothPartitions())
		require.ErrorContains(t, err, "cannot produce 40 messages to topic t")
		require.ErrorContains(t, err, "the disk is full")
		assert.Equal(t, map[int32]int{0: 1, 1: 1}, b.requests)
	})
	t.Run("an EOF mixed with another error is not written again", func(t *testing.T) {
		b := &brokerOfTwoPartitions{fail: func(partition int32, _ int) error {
			if partition == 0 {
				return io.EOF
			}
			return errors.New("the disk is full")
		}}
		p := producerOn(t, b)
		require.Error(t, p.ProduceMessages(context.Background(), messagesOnBothPartitions()))
		assert.Equal(t, map[int32]int{0: 1, 1: 1}, b.requests)
	})
	t.Run("EOF every time stops after its attempts", func(t *testing.T) {
		b := &brokerOfTwoPartitions{fail: func(int32, int) error { return io.EOF }}
		p := producerOn(t, b)
		err := p.ProduceMessages(context.Background(), messagesOnBothPartitions())
		// kafka-go's WriteErrors does not unwrap: the EOF is in its text.
		require.ErrorContains(t, err, "EOF")
		assert.Equal(t, map[int32]int{0: producerRewrites + 1, 1: producerRewrites + 1}, b.requests)
	})
	t.Run("a cancelled context stops the writing again", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		b := &brokerOfTwoPartitions{fail: func(int32, int) error { cancel(); return io.EOF }}
		p := producerOn(t, b)
		err := p.ProduceMessages(ctx, messagesOnBothPartitions())
		require.ErrorIs(t, err, context.Canceled)
	})
}
