package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/kafka"
)

// valueAt is the value produced at offset i: small, but 200 KiB at 300-309, so that
// the reads there take several fetches.
func valueAt(i int) []byte {
	v := []byte(fmt.Sprintf("record %d", i))
	if i >= 300 && i < 310 {
		v = append(v, bytes.Repeat([]byte{'x'}, 200<<10)...)
	}
	return v
}

// producedTopic is a topic of one partition holding n records, valueAt(i) at offset i.
func producedTopic(t *testing.T, n int) string {
	t.Helper()
	topic := stacktest.Topic(t, 1)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	defer p.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	msgs := make([]kafkago.Message, n)
	for i := range msgs {
		msgs[i] = kafkago.Message{Key: []byte("k"), Value: valueAt(i)}
	}
	require.NoError(t, p.ProduceMessages(context.Background(), msgs))
	return topic
}

func TestIntegrationReadAtReadsTheOffsetsAskedFor(t *testing.T) {
	topic := producedTopic(t, 700)
	ctx := context.Background()
	// Unsorted, repeated, close together and far apart, past the end.
	asked := []int64{650, 0, 1, 2, 5, 5, 299, 300, 305, 309, 310, 699, 700, 1000, 2}
	r, err := kafka.ReadAt(ctx, stacktest.Brokers(), topic, 0, asked, 64<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(0), r.First)
	assert.Equal(t, int64(700), r.End)
	assert.Empty(t, r.Unread)
	var got []int64
	for o, rec := range r.Records {
		got = append(got, o)
		assert.Equal(t, valueAt(int(o)), rec.Value, "offset %d", o)
		assert.False(t, rec.Time.IsZero(), "offset %d has its timestamp", o)
	}
	assert.ElementsMatch(t, []int64{0, 1, 2, 5, 299, 300, 305, 309, 310, 650, 699}, got, "each offset below the end, once; none past it")
	assert.Less(t, r.Bytes, 3<<20, "read on only to close offsets, else fetched from each")

	// Nothing asked: the partition's offsets alone.
	r, err = kafka.ReadAt(ctx, stacktest.Brokers(), topic, 0, nil, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, [2]int64{0, 700}, [2]int64{r.First, r.End})
	assert.Empty(t, r.Records)
}

func TestIntegrationReadAtIsBoundedInBytes(t *testing.T) {
	topic := producedTopic(t, 400)
	asked := []int64{10, 300, 301, 302, 303, 350, 399}
	r, err := kafka.ReadAt(context.Background(), stacktest.Brokers(), topic, 0, asked, 300<<10)
	require.NoError(t, err)
	assert.NotEmpty(t, r.Unread, "the bound ran out")
	assert.Contains(t, r.Records, int64(10))
	for _, o := range asked {
		_, found := r.Records[o]
		assert.True(t, found != contains(r.Unread, o), "offset %d is either read or unread", o)
	}
	assert.Less(t, r.Bytes, 300<<10+2<<20, "one fetch past the bound at most")
}

func TestIntegrationReadAtNamesAPartitionTheTopicLacks(t *testing.T) {
	topic := producedTopic(t, 3)
	_, err := kafka.ReadAt(context.Background(), stacktest.Brokers(), topic, 4, []int64{1}, 1<<20)
	require.ErrorIs(t, err, kafka.ErrNoPartition)
	assert.Contains(t, err.Error(), "partition 4")
}

func contains(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
