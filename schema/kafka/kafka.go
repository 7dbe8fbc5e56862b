// Package kafka is bandplane's side of the event bus: the producer the collector and the
// routing core use, the consumer-group reader ingest runs on, topic creation, and
// consumer lag. It wraps segmentio/kafka-go.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package kafka

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/bandplane/bandplane/schema"
)

// Default topic names.
const (
	DefaultTopic    = "bandplane.events"
	DefaultDLQTopic = "bandplane.events.dlq"
)

// Message limits, set on both sides: the writers refuse a message larger than
// MaxMessageBytes before sending it (kafka-go's BatchBytes, which also caps a batch),
// and EnsureTopic gives every topic a max.message.bytes of TopicMaxMessageBytes, so the
// broker never refuses what a writer accepted.
const (
	// MaxMessageBytes is the largest message a Producer writes, counted as kafka-go
	// counts it (MessageSize: key, value, headers and the record's fields).
	MaxMessageBytes = 1 << 20
	// TopicMaxMessageBytes is the topics' max.message.bytes: the broker checks the
	// record batch as sent (compressed, with its header), and LZ4 can grow
	// incompressible data by 0.4%; 64 KiB covers both.
	TopicMaxMessageBytes = MaxMessageBytes + 64<<10
	// MaxEventBytes is the largest JSON value of one event that is always accepted:
	// its message (key ≤ schema.MaxIDBytes, the record's fields) fits MaxMessageBytes,
	// and so does its dead letter (the same value plus the headers ingest adds, whose
	// reason is capped at 1 KiB). The collector refuses a longer line as a line error.
	MaxEventBytes = MaxMessageBytes - MessageReserveBytes
	// MessageReserveBytes is what MaxEventBytes leaves of MaxMessageBytes for the key,
	// the record's fields and the dead-letter headers.
	MessageReserveBytes = 4 << 10
)

// MessageSize is the size kafka-go counts for m against MaxMessageBytes.
func MessageSize(m *kafkago.Message) int {
	n := 4 + 1 + 1 + 4 + len(m.Key) + 4 + len(m.Value) + 8 // kafka-go's Message.size
	n += varintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return n
}

func varintLen(n int) int { return len(binary.AppendVarint(nil, int64(n))) }

// IsMessageTooLarge says whether err is a message refused for its size, by the writer
// (MaxMessageBytes) or by the broker (the topic's max.message.bytes): retrying the same
// message cannot succeed.
func IsMessageTooLarge(err error) bool {
	var tooLarge kafkago.MessageTooLargeError
	if errors.As(err, &tooLarge) || errors.Is(err, kafkago.MessageSizeTooLarge) {
		return true
	}
	var we kafkago.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && IsMessageTooLarge(e) {
				return true
			}
		}
	}
	return false
}

// AuditBatchSize is the BatchSize for a producer of audit events written one decision
// at a time (the policy API's): kafka-go reserves room for BatchSize messages in every
// batch it starts (5,000 × ~150-byte slots = ~750 KB with the default), and such
// batches hold tens of events. In a CPU profile of bench policy --audit that slice was
// 5% of the process's CPU time with the default.
const AuditBatchSize = 64

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	Brokers      []string
	Topic        string
	BatchSize    int           // messages per partition batch
	BatchTimeout time.Duration // how long a partial batch waits for more
	WriteTimeout time.Duration
}

func (c ProducerConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no kafka brokers given (--kafka)"))
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("kafka topic is empty (--topic)"))
	}
	return errors.Join(errs...)
}

// Producer writes canonical events to a topic, keyed by room (or organization), and
// returns only once every in-sync replica has acknowledged them.
type Producer struct {
	topic     string
	w         *kafkago.Writer
	transport *kafkago.Transport
}

// Writer retries and metadata refresh, so that a write rides through the loss of a
// partition leader. When a broker dies, its partitions get new leaders only once the
// controller fences it (broker.session.timeout.ms: 9 s by default, 5 s on the local
// three-node cluster), and the writer learns of them at its next metadata refresh;
// until then its requests to the dead broker fail (connection refused or reset, which
// kafka-go retries) or wait for its acknowledgement (acks=all, until the in-sync
// replicas shrink). 20 attempts with a back-off of 0.1 s doubling to 1 s retry for
// about 16 s; the metadata is re-read at least every producerMetadataTTL (kafka-go's
// 6 s default would add up to 6 s to every leader change). The price: when the whole
// cluster is down, a write fails only after those ~16 s (refused connections, which
// ProduceMessages does not write again), unless the producer never reached a broker
// (no metadata: it fails at once) or the caller's ctx ends first.
const (
	producerMaxAttempts = 20
	producerBackoffMin  = 100 * time.Millisecond
	producerBackoffMax  = time.Second
	producerMetadataTTL = 2 * time.Second
)

func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 5000
	}
	if cfg.BatchTimeout <= 0 {
		cfg.BatchTimeout = 5 * time.Millisecond
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	// Its own transport (kafka-go's default one is shared by every client of the
	// process): for the shorter metadata TTL, on this topic's metadata only.
	tr := &kafkago.Transport{
		Dial:           (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		MetadataTTL:    producerMetadataTTL,
		MetadataTopics: []string{cfg.Topic},
	}
	return &Producer{topic: cfg.Topic, transport: tr, w: &kafkago.Writer{
		Addr:         kafkago.TCP(cfg.Brokers...),
		Topic:        cfg.Topic,
		Balancer:     &kafkago.Hash{},
		Transport:    tr,
		RequiredAcks: kafkago.RequireAll,
		// JSON events compress about 5x: less disk and network for the broker, which
		// shares the machine's disk with ClickHouse (measured with bench ingest).
		Compression:     kafkago.Lz4,
		BatchSize:       cfg.BatchSize,
		BatchBytes:      MaxMessageBytes,
		BatchTimeout:    cfg.BatchTimeout,
		WriteTimeout:    cfg.WriteTimeout,
		MaxAttempts:     producerMaxAttempts,
		WriteBackoffMin: producerBackoffMin,
		WriteBackoffMax: producerBackoffMax,
	}}, nil
}

// Produce marshals and writes events; it blocks until all are acknowledged or returns
// an error naming the topic (some of the events may then have been written: callers
// retry the whole call, which the event ids make harmless).
func (p *Producer) Produce(ctx context.Context, events []schema.Event) error {
	msgs := make([]kafkago.Message, len(events))
	for i := range events {
		b, err := json.Marshal(&events[i])
		if err != nil {
			return fmt.Errorf("cannot encode event %s: %w", events[i].ID, err)
		}
		msgs[i] = kafkago.Message{Key: []byte(events[i].Key()), Value: b}
	}
	return p.ProduceMessages(ctx, msgs)
}

// ProduceMessages writes prepared messages (the dead-letter path uses it to keep the raw
// record and its headers).
//
// kafka-go's Writer gives up at once on two failures that a broker restart leaves
// behind, and ProduceMessages writes the messages again when every one of them failed
// so, up to producerRewrites times with the producer's back-off (about 4.5 s in all,
// more than twice producerMetadataTTL):
//   - io.EOF, which a pooled connection to the restarted broker returns on its first
//     request (segmentio/kafka-go#1352: the Writer retries a reset or refused
//     connection, not EOF); the writer has dropped that connection by then;
//   - "topic partition has no leader" (protocol.ErrNoLeader), from the metadata the
//     transport read while the broker was going down; it reads it again within
//     producerMetadataTTL.
//
// When only some failed, the call fails: writing those again would put them after
// later messages of their partition that were written, and the consumers apply a
// partition in order (a copy the broker already had is harmless: events have ids).
func (p *Producer) ProduceMessages(ctx context.Context, msgs []kafkago.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	backoff := producerBackoffMin
	for attempt := 1; ; attempt++ {
		err := p.w.WriteMessages(ctx, msgs...)
		if err == nil {
			return nil
		}
		if !allFailedToWriteAgain(len(msgs), err) || attempt > producerRewrites {
			return fmt.Errorf("cannot produce %d messages to topic %s: %w", len(msgs), p.topic, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cannot produce %d messages to topic %s: %w (after %w)", len(msgs), p.topic, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, producerBackoffMax)
	}
}

// producerRewrites bounds ProduceMessages' own writes of messages again.
const producerRewrites = 7

// allFailedToWriteAgain says whether every one of n messages failed with an error
// ProduceMessages writes again (writeAgain). err is what Writer.WriteMessages returned
// for them: a WriteErrors (one entry per message) or one error for them all.
func allFailedToWriteAgain(n int, err error) bool {
	var werrs kafkago.WriteErrors
	if !errors.As(err, &werrs) {
		return writeAgain(err)
	}
	if len(werrs) != n {
		return false
	}
	for _, e := range werrs {
		if e == nil || !writeAgain(e) {
			return false
		}
	}
	return true
}

func writeAgain(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, protocol.ErrNoLeader)
}

func (p *Producer) Topic() string { return p.topic }

// Close flushes what is pending and closes the writer and its connections.
func (p *Producer) Close() error {
	err := p.w.Close()
	p.transport.CloseIdleConnections()
	return err
}

// Replication limits: a topic gets up to MaxReplicationFactor copies of every record,
// and a write with acks=all (every Producer's) is acknowledged only once
// MinInsyncReplicas of them have it. With three brokers an acknowledged record then
// survives the loss of any one broker, and one broker down still leaves enough in-sync
// replicas to accept writes.
const (
	MaxReplicationFactor = 3
	MinInsyncReplicas    = 2
)

// Replication is the replication factor and min.insync.replicas EnsureTopic gives a new
// topic on a cluster of liveBrokers brokers: min(3, brokers) and min(2, that factor), so
// a single broker gets 1 and 1, two get 2 and 2, three or more get 3 and 2.
func Replication(liveBrokers int) (factor, minInsync int) {
	factor = min(MaxReplicationFactor, max(liveBrokers, 1))
	return factor, min(MinInsyncReplicas, factor)
}

// EnsureTopic creates topic if it does not exist, with the given partition count, the
// replication of Replication(live brokers) (counted in the cluster's metadata, which
// lists the brokers that are up) and a max.message.bytes of TopicMaxMessageBytes. On an
// existing topic it raises max.message.bytes to that if it has less (a topic created
// before the limit was set, or by hand), and min.insync.replicas to min(2, the topic's
// replication factor) if it has less.
//
// It does not change an existing topic's replication factor (that is a partition
// reassignment, an operator's decision): a topic created on a single broker and later
// used on a cluster keeps one copy of every record, and EnsureTopic returns no error for
// it. Compare TopicReplication with Replication(LiveBrokers) to find such a topic.
//
// extra are more settings of a topic it creates (CheckpointTopicConfig); an existing
// topic keeps its own.
func EnsureTopic(ctx context.Context, brokers []string, topic string, partitions int, extra ...kafkago.ConfigEntry) error {
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("cannot create topic %s on %s (is kafka running? `make up` starts it): %w", topic, strings.Join(brokers, ","), err)
	}
	factor, minInsync := Replication(len(md.Brokers))
	limit := strconv.Itoa(TopicMaxMessageBytes)
	resp, err := c.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: factor,
		ConfigEntries: append([]kafkago.ConfigEntry{
			{ConfigName: "max.message.bytes", ConfigValue: limit},
			{ConfigName: "min.insync.replicas", ConfigValue: strconv.Itoa(minInsync)},
		}, extra...),
	}}})
	if err != nil {
		return fmt.Errorf("cannot create topic %s on %s (is kafka running? `make up` starts it): %w", topic, strings.Join(brokers, ","), err)
	}
	err = resp.Errors[topic]
	if err == nil {
		return awaitTopic(ctx, md.Brokers, topic)
	}
	if !errors.Is(err, kafkago.TopicAlreadyExists) {
		return fmt.Errorf("cannot create topic %s with %d partitions and replication factor %d: %w", topic, partitions, factor, err)
	}
	// Another process may have created it a moment ago: the broker asked may not know
	// it yet.
	have, err := whileSettling(ctx, func() ([]int, error) {
		return topicIntConfigs(ctx, c, topic, "max.message.bytes", "min.insync.replicas")
	})
	if err != nil {
		return err
	}
	rf, err := whileSettling(ctx, func() (int, error) { return topicReplicationFactor(ctx, c, topic) })
	if err != nil {
		return err
	}
	// Incremental: a plain AlterConfigs would reset every other setting of the topic.
	var set []kafkago.IncrementalAlterConfigsRequestConfig
	var what []string
	if have[0] < TopicMaxMessageBytes {
		set = append(set, kafkago.IncrementalAlterConfigsRequestConfig{Name: "max.message.bytes", Value: limit, ConfigOperation: kafkago.ConfigOperationSet})
		what = append(what, fmt.Sprintf("max.message.bytes from %d to %s", have[0], limit))
	}
	if want := min(MinInsyncReplicas, rf); have[1] < want {
		set = append(set, kafkago.IncrementalAlterConfigsRequestConfig{Name: "min.insync.replicas", Value: strconv.Itoa(want), ConfigOperation: kafkago.ConfigOperationSet})
		what = append(what, fmt.Sprintf("min.insync.replicas from %d to %d", have[1], want))
	}
	if len(set) == 0 {
		return nil
	}
	ar, err := c.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, Configs: set,
	}}})
	if err == nil {
		for _, r := range ar.Resources {
			if r.Error != nil {
				err = r.Error
			}
		}
	}
	if err != nil {
		return fmt.Errorf("cannot raise %s of topic %s: %w", strings.Join(what, " and "), topic, err)
	}
	return nil
}

// topicPropagation bounds how long a broker may take to learn a topic the controller
// has created (each broker applies the metadata log on its own; a moment on a healthy
// cluster).
const topicPropagation = 15 * time.Second

// whileSettling calls read again, every 100 ms for up to topicPropagation, while it
// fails with UnknownTopicOrPartition or LeaderNotAvailable, or cannot reach the broker
// it asked: for a topic known to exist (created, or reported existing, by the
// controller) that the broker asked has not learnt yet, whose partitions have no
// leader yet, or on a cluster whose metadata still lists a broker that has just died
// (until it is fenced, a request can go to it).
func whileSettling[T any](ctx context.Context, read func() (T, error)) (T, error) {
	deadline := time.Now().Add(topicPropagation)
	for {
		v, err := read()
		var netErr *net.OpError
		settling := errors.Is(err, kafkago.UnknownTopicOrPartition) || errors.Is(err, kafkago.LeaderNotAvailable) || errors.As(err, &netErr)
		if !settling || time.Now().After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// awaitTopic waits until every one of brokers (a metadata response's: those up) knows
// topic, so that what follows EnsureTopic (a producer, a configuration read, another
// process) finds it on whichever broker it asks. A broker that cannot be reached (one
// that has just died is listed until it is fenced) is waited for as long, then left
// out: the topic exists, and the others know it.
func awaitTopic(ctx context.Context, brokers []kafkago.Broker, topic string) error {
	for _, b := range brokers {
		addr := net.JoinHostPort(b.Host, strconv.Itoa(b.Port))
		unreachable := false
		_, err := whileSettling(ctx, func() ([]kafkago.Partition, error) {
			unreachable = false
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			conn, err := kafkago.DialContext(dctx, "tcp", addr)
			if err != nil {
				unreachable = true
				return nil, kafkago.UnknownTopicOrPartition // wait for it as for a broker that does not know the topic
			}
			defer conn.Close() //nolint:errcheck // it only reads metadata
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			parts, err := conn.ReadPartitions(topic)
			if err == nil && len(parts) == 0 {
				err = kafkago.UnknownTopicOrPartition
			}
			return parts, err
		})
		if err != nil && unreachable && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return fmt.Errorf("topic %s was created, but broker %d (%s) does not list it: %w", topic, b.ID, addr, err)
		}
	}
	return nil
}

// LiveBrokers is the number of brokers the cluster's metadata lists (those registered
// and not fenced: the ones up).
func LiveBrokers(ctx context.Context, brokers []string) (int, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{}})
	if err != nil {
		return 0, fmt.Errorf("cannot read the cluster metadata from %s: %w", strings.Join(brokers, ","), err)
	}
	return len(md.Brokers), nil
}

// TopicReplication reads topic's replication factor (the fewest replicas any of its
// partitions has) and its min.insync.replicas in force. A factor below
// Replication(LiveBrokers) means the topic has fewer copies than EnsureTopic would give
// it now (it was created on fewer brokers); EnsureTopic leaves that to an operator.
func TopicReplication(ctx context.Context, brokers []string, topic string) (factor, minInsync int, err error) {
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	if factor, err = topicReplicationFactor(ctx, c, topic); err != nil {
		return 0, 0, err
	}
	v, err := topicIntConfigs(ctx, c, topic, "min.insync.replicas")
	if err != nil {
		return 0, 0, err
	}
	return factor, v[0], nil
}

func topicReplicationFactor(ctx context.Context, c *kafkago.Client, topic string) (int, error) {
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("cannot read the metadata of topic %s: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return 0, fmt.Errorf("cannot read the metadata of topic %s: %w", topic, t.Error)
		}
		factor := 0
		for i, p := range t.Partitions {
			if i == 0 || len(p.Replicas) < factor {
				factor = len(p.Replicas)
			}
		}
		if factor == 0 {
			return 0, fmt.Errorf("topic %s reports no partition replicas", topic)
		}
		return factor, nil
	}
	return 0, fmt.Errorf("topic %s does not exist: %w", topic, kafkago.UnknownTopicOrPartition)
}

// topicIntConfigs reads integer settings in force for topic, in the order of names.
func topicIntConfigs(ctx context.Context, c *kafkago.Client, topic string, names ...string) ([]int, error) {
	resp, err := c.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: names,
	}}})
	if err != nil {
		return nil, fmt.Errorf("cannot read the configuration of topic %s: %w", topic, err)
	}
	out := make([]int, len(names))
	found := make([]bool, len(names))
	for _, r := range resp.Resources {
		if r.Error != nil {
			return nil, fmt.Errorf("cannot read the configuration of topic %s: %w", topic, r.Error)
		}
		for _, e := range r.ConfigEntries {
			i := slices.Index(names, e.ConfigName)
			if i < 0 {
				continue
			}
			n, err := strconv.Atoi(e.ConfigValue)
			if err != nil {
				return nil, fmt.Errorf("topic %s has %s %q: %w", topic, e.ConfigName, e.ConfigValue, err)
			}
			out[i], found[i] = n, true
		}
	}
	for i, ok := range found {
		if !ok {
			return nil, fmt.Errorf("topic %s reports no %s", topic, names[i])
		}
	}
	return out, nil
}

// TopicMessageLimit reads the max.message.bytes in force for topic.
func TopicMessageLimit(ctx context.Context, brokers []string, topic string) (int, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	v, err := topicIntConfigs(ctx, c, topic, "max.message.bytes")
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// Lag is the number of records of topic not yet committed by group, per partition and
// in total.
func Lag(ctx context.Context, brokers []string, topic, group string) (total int64, perPartition map[int]int64, err error) {
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, nil, fmt.Errorf("cannot read metadata of topic %s: %w", topic, err)
	}
	if len(md.Topics) == 0 || md.Topics[0].Error != nil {
		return 0, nil, fmt.Errorf("topic %s not found", topic)
	}
	var parts []int
	var reqs []kafkago.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		// Both ends: a partition without a committed offset lags from its first offset.
		reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	ends, err := c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, nil, fmt.Errorf("cannot list offsets of topic %s: %w", topic, err)
	}
	committed, err := c.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, nil, fmt.Errorf("cannot fetch offsets of group %s: %w", group, err)
	}
	done := map[int]int64{}
	for _, p := range committed.Topics[topic] {
		done[p.Partition] = p.CommittedOffset
	}
	perPartition = map[int]int64{}
	for _, p := range ends.Topics[topic] {
		c := done[p.Partition]
		if c < 0 { // nothing committed yet
			c = p.FirstOffset
		}
		if lag := p.LastOffset - c; lag > 0 {
			perPartition[p.Partition] = lag
			total += lag
		} else {
			perPartition[p.Partition] = 0
		}
	}
	return total, perPartition, nil
}

// Defaults of the reader's read-ahead. kafka-go's reader has one goroutine per
// partition that fetches up to ReaderFetchBytes at a time and decodes it, message by
// message, into a queue of ReaderQueueCapacity messages that FetchMessage takes from;
// a fetch is read from the connection only as the queue drains. So what the reader
// holds of the topic is at most about ReaderQueueBytes (the queue full of messages of
// TopicMaxMessageBytes) plus, per partition, the record batch being decoded (a
// producer's batch, at most TopicMaxMessageBytes compressed, and its decompressed
// copy). Ingest bounds what it holds after FetchMessage itself
// (ingest.Config.MaxPendingBytes).
//
// The queue was 20,000 messages (up to 21 GiB of large events). Measured on the local
// stack, a reader alone reads 400-600k messages/s of 400 bytes with a queue of 256 as
// with 20,000 (100 was 10-20% slower), and over 700 MB/s of 64 KiB messages; bench
// ingest's pipeline (55-75k events/s) was not slower with it.
const (
	ReaderQueueCapacity = 256
	ReaderQueueBytes    = ReaderQueueCapacity * TopicMaxMessageBytes
	ReaderFetchBytes    = 16 << 20
)

// ReaderConfig configures the consumer-group reader ingest runs on.
type ReaderConfig struct {
	Brokers []string
	Topic   string
	GroupID string
	Logger  *slog.Logger // kafka-go's errors are logged here at warn level; nil = discard
	// QueueCapacity is the most messages the reader decodes ahead of FetchMessage
	// (default ReaderQueueCapacity): with messages of up to TopicMaxMessageBytes it
	// bounds the reader's memory, at about QueueCapacity × 1 MiB.
	QueueCapacity int
}

// NewReader returns a consumer-group reader that starts at the oldest record when the
// group has no committed offset, and commits only when asked (CommitMessages).
//
// On a cluster it rides through a broker's death on its own: a partition reader whose
// leader is gone reconnects to the new one (FetchMessage returns the errors meanwhile;
// the consumer retries), and when the group's coordinator dies kafka-go leaves the
// group and joins the new coordinator as a new member, admitted once the old member's
// session (SessionTimeout) has run out; a CommitMessages in that window waits for the
// new generation and commits in it. Measured with the coordinator and leader of three
// of eight partitions SIGKILLed: ingest stored nothing for 16-19 s, then went on with
// nothing lost or doubled (ingest's TestIntegrationClusterBrokerKilled).
func NewReader(cfg ReaderConfig) (*kafkago.Reader, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("no kafka brokers given (--kafka)"))
	}
	if cfg.Topic == "" {
		errs = append(errs, errors.New("kafka topic is empty (--topic)"))
	}
	if cfg.GroupID == "" {
		errs = append(errs, errors.New("consumer group is empty (--group)"))
	}
	if cfg.QueueCapacity < 0 {
		errs = append(errs, fmt.Errorf("reader queue capacity must be >= 0, got %d", cfg.QueueCapacity))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.QueueCapacity == 0 {
		cfg.QueueCapacity = ReaderQueueCapacity
	}
	var errLog kafkago.Logger
	if cfg.Logger != nil {
		l := cfg.Logger.With("component", "kafka-reader", "topic", cfg.Topic, "group", cfg.GroupID)
		errLog = kafkago.LoggerFunc(func(msg string, args ...any) { l.Warn(fmt.Sprintf(msg, args...)) })
	}
	return kafkago.NewReader(kafkago.ReaderConfig{
		ErrorLogger:           errLog,
		Brokers:               cfg.Brokers,
		Topic:                 cfg.Topic,
		GroupID:               cfg.GroupID,
		StartOffset:           kafkago.FirstOffset,
		MinBytes:              1,
		MaxBytes:              ReaderFetchBytes,
		MaxWait:               100 * time.Millisecond,
		ReadBatchTimeout:      2 * time.Second,
		QueueCapacity:         cfg.QueueCapacity,
		CommitInterval:        0, // synchronous commits, after the batch is in ClickHouse
		HeartbeatInterval:     1 * time.Second,
		SessionTimeout:        10 * time.Second,
		RebalanceTimeout:      10 * time.Second,
		JoinGroupBackoff:      500 * time.Millisecond,
		WatchPartitionChanges: true,
		ReadBackoffMin:        50 * time.Millisecond,
		ReadBackoffMax:        1 * time.Second,
	}), nil
}

// Partitions lists the partition ids of topic.
func Partitions(ctx context.Context, brokers []string, topic string) ([]int, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 15 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("cannot read the metadata of topic %s on %s: %w", topic, strings.Join(brokers, ","), err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("topic %s: %w", topic, t.Error)
		}
		ids := make([]int, len(t.Partitions))
		for i, p := range t.Partitions {
			ids[i] = p.ID
		}
		slices.Sort(ids)
		return ids, nil
	}
	return nil, fmt.Errorf("topic %s does not exist", topic)
}

// EndOffsets returns the end offset of each partition of topic (the offset its next
// record gets).
func EndOffsets(ctx context.Context, brokers []string, topic string) (map[int]int64, error) {
	parts, err := Partitions(ctx, brokers, topic)
	if err != nil {
		return nil, err
	}
	req := make([]kafkago.OffsetRequest, len(parts))
	for i, p := range parts {
		req[i] = kafkago.LastOffsetOf(p)
	}
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: req}})
	if err != nil {
		return nil, fmt.Errorf("cannot read the end offsets of topic %s: %w", topic, err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("cannot read the end offset of topic %s partition %d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out, nil
}

// CommittedOffsets returns the offset group has committed for each partition of topic
// (the next record it will read); a partition without one is absent.
func CommittedOffsets(ctx context.Context, brokers []string, topic, group string) (map[int]int64, error) {
	parts, err := Partitions(ctx, brokers, topic)
	if err != nil {
		return nil, err
	}
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := c.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("cannot fetch the offsets of group %s on topic %s: %w", group, topic, err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.CommittedOffset >= 0 {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out, nil
}
