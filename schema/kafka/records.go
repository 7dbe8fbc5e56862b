package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// Record is a record ReadAt found: its value and its timestamp.
type Record struct {
	Value []byte
	Time  time.Time
}

// Read is what ReadAt found of one partition.
type Read struct {
	// First is the partition's first offset (retention removed the records before it)
	// and End its end (the offset of the next record written), as of the read.
	First, End int64
	// Records are the records at the offsets asked for. An offset asked for in
	// [First, End) that is neither here nor in Unread holds no record.
	Records map[int64]Record
	// Unread are offsets asked for in [First, End) that were not read: the byte bound
	// ran out first, the record's value is longer than ReadAtRecordBytes, or the broker
	// returned nothing from there. Nothing is known of them.
	Unread []int64
	// Bytes is how much of keys and values the read took.
	Bytes int
}

// ErrNoPartition says the topic has no such partition.
var ErrNoPartition = errors.New("no such partition")

// Bounds of ReadAt.
const (
	// ReadAtRecordBytes is the longest value ReadAt keeps: the topics' largest
	// message (TopicMaxMessageBytes).
	ReadAtRecordBytes = TopicMaxMessageBytes
	// ReadAtTimeout bounds one ReadAt call.
	ReadAtTimeout = 2 * time.Minute
	// readAtFetchBytes is what one fetch asks for; the broker returns a first record
	// batch larger than that whole.
	readAtFetchBytes = 1 << 20
	// readAhead is how close the next offset asked for must be to be read on to in
	// the same fetch rather than fetched from on its own.
	readAhead = 256
)

// ReadAt reads the records of topic's partition at the given offsets (in any order,
// repeated or not) with one client: it lists the partition's first and end offsets,
// then fetches from each offset asked for that the fetch before did not reach, reading
// on to the next one when it is close. It reads at most maxBytes of keys and values in
// all (the offsets left are Unread), keeps only the records asked for, and gives up
// after ReadAtTimeout. A partition the topic does not have is ErrNoPartition.
func ReadAt(ctx context.Context, brokers []string, topic string, partition int, offsets []int64, maxBytes int) (Read, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadAtTimeout)
	defer cancel()
	parts, err := Partitions(ctx, brokers, topic)
	if err != nil {
		return Read{}, err
	}
	if !slices.Contains(parts, partition) {
		return Read{}, fmt.Errorf("topic %s partition %d: %w (it has %d)", topic, partition, ErrNoPartition, len(parts))
	}
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	out := Read{Records: map[int64]Record{}}
	if out.First, out.End, err = partitionOffsets(ctx, c, topic, partition); err != nil {
		return Read{}, err
	}
	want := slices.Compact(slices.Sorted(slices.Values(offsets)))
	want = slices.DeleteFunc(want, func(o int64) bool { return o < out.First || o >= out.End })
	used := 0
	for i := 0; i < len(want); {
		if used >= maxBytes {
			out.Unread = append(out.Unread, want[i:]...)
			break
		}
		resp, err := c.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: partition, Offset: want[i],
			MinBytes: 1, MaxBytes: int64(min(readAtFetchBytes, maxBytes-used)), MaxWait: 500 * time.Millisecond})
		if err == nil {
			err = resp.Error
		}
		if errors.Is(err, kafkago.OffsetOutOfRange) {
			// Retention removed records since the offsets were listed: the ones left
			// below the new first offset are gone.
			first, _, lerr := partitionOffsets(ctx, c, topic, partition)
			if lerr != nil {
				return Read{}, lerr
			}
			if first <= want[i] {
				return Read{}, fmt.Errorf("cannot read topic %s partition %d at offset %d (its first offset is %d): %w", topic, partition, want[i], first, err)
			}
			out.First = first
			for i < len(want) && want[i] < first {
				i++
			}
			continue
		}
		if err != nil {
			return Read{}, fmt.Errorf("cannot read topic %s partition %d at offset %d: %w", topic, partition, want[i], err)
		}
		next, err := take(resp.Records, want, i, &out, &used, maxBytes)
		if err != nil {
			return Read{}, fmt.Errorf("cannot read topic %s partition %d at offset %d: %w", topic, partition, want[i], err)
		}
		if next == i {
			// Nothing at or after want[i] came back, though it lies below the end.
			out.Unread = append(out.Unread, want[i])
			next++
		}
		i = next
	}
	out.Bytes = used
	return out, nil
}

// take reads the records of one fetch response into out: those at the offsets asked
// for from want[i] on, stopping when the next one asked for is far ahead, when there
// is none, or when maxBytes are used. It returns the index of the next offset to
// fetch from; i when nothing at or after want[i] came back.
func take(rs kafkago.RecordReader, want []int64, i int, out *Read, used *int, maxBytes int) (int, error) {
	for i < len(want) && *used < maxBytes {
		rec, err := rs.ReadRecord()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return i, err
		}
		*used += bytesLen(rec.Key) + bytesLen(rec.Value)
		off := rec.Offset
		if off < want[i] {
			// A record batch may start before the offset asked for.
			closeBytes(rec)
			continue
		}
		for i < len(want) && want[i] < off {
			i++ // no record there (the log skips it)
		}
		if i < len(want) && want[i] == off {
			if n := bytesLen(rec.Value); n > ReadAtRecordBytes {
				out.Unread = append(out.Unread, off)
			} else {
				v := []byte{}
				if rec.Value != nil {
					if v, err = io.ReadAll(rec.Value); err != nil {
						closeBytes(rec)
						return i, err
					}
				}
				out.Records[off] = Record{Value: v, Time: rec.Time}
			}
			i++
		}
		closeBytes(rec)
		if i < len(want) && want[i]-off > readAhead {
			break
		}
	}
	return i, nil
}

func bytesLen(b protocol.Bytes) int {
	if b == nil {
		return 0
	}
	return b.Len()
}

func closeBytes(r *kafkago.Record) {
	if r.Key != nil {
		_ = r.Key.Close()
	}
	if r.Value != nil {
		_ = r.Value.Close()
	}
}

// partitionOffsets lists a partition's first and end offsets.
func partitionOffsets(ctx context.Context, c *kafkago.Client, topic string, partition int) (first, end int64, err error) {
	resp, err := c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		topic: {kafkago.FirstOffsetOf(partition), kafkago.LastOffsetOf(partition)}}})
	if err != nil {
		return 0, 0, fmt.Errorf("cannot read the offsets of topic %s partition %d: %w", topic, partition, err)
	}
	for _, po := range resp.Topics[topic] {
		if po.Partition != partition {
			continue
		}
		if po.Error != nil {
			return 0, 0, fmt.Errorf("cannot read the offsets of topic %s partition %d: %w", topic, partition, po.Error)
		}
		return po.FirstOffset, po.LastOffset, nil
	}
	return 0, 0, fmt.Errorf("cannot read the offsets of topic %s partition %d: the broker did not answer for it", topic, partition)
}
