package kafka

import (
	"context"
	"fmt"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// CompactedTopicConfig are the settings of a topic that keeps the newest record of
// each key (the checkpoints topic): compaction, and segments rolled hourly so that the
// part not yet compacted stays small.
var CompactedTopicConfig = []kafkago.ConfigEntry{
	{ConfigName: "cleanup.policy", ConfigValue: "compact"},
	{ConfigName: "segment.ms", ConfigValue: "3600000"},
	{ConfigName: "min.cleanable.dirty.ratio", ConfigValue: "0.1"},
}

// MaxLatestRecords bounds what ReadLatest reads of one topic.
const MaxLatestRecords = 1_000_000

// ReadLatest reads topic from its oldest record to its end as of the call and returns
// the newest value of each key. It is meant for a compacted topic, whose size grows
// with its keys, not with time.
func ReadLatest(ctx context.Context, brokers []string, topic string) (map[string][]byte, error) {
	// A broker may not know a topic another process created a moment ago.
	parts, err := whileSettling(ctx, func() ([]int, error) { return Partitions(ctx, brokers, topic) })
	if err != nil {
		return nil, err
	}
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	var req []kafkago.OffsetRequest
	for _, p := range parts {
		req = append(req, kafkago.FirstOffsetOf(p), kafkago.LastOffsetOf(p))
	}
	resp, err := c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: req}})
	if err != nil {
		return nil, fmt.Errorf("cannot read the offsets of topic %s: %w", topic, err)
	}
	out := map[string][]byte{}
	n := 0
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("cannot read the offsets of topic %s partition %d: %w", topic, po.Partition, po.Error)
		}
		if po.FirstOffset >= po.LastOffset {
			continue
		}
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: topic, Partition: po.Partition, MinBytes: 1,
			MaxBytes: ReaderFetchBytes, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(po.FirstOffset); err != nil {
			_ = r.Close()
			return nil, err
		}
		for {
			if n++; n > MaxLatestRecords {
				_ = r.Close()
				return nil, fmt.Errorf("topic %s holds more than %d records: is it compacted (cleanup.policy=compact)?", topic, MaxLatestRecords)
			}
			m, err := r.FetchMessage(ctx)
			if err != nil {
				_ = r.Close()
				return nil, fmt.Errorf("cannot read topic %s partition %d: %w", topic, po.Partition, err)
			}
			if m.Value == nil {
				delete(out, string(m.Key)) // a tombstone
			} else {
				out[string(m.Key)] = m.Value
			}
			if m.Offset+1 >= po.LastOffset {
				break
			}
		}
		_ = r.Close() // a partition reader commits nothing
	}
	return out, nil
}
