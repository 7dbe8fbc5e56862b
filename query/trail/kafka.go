package trail

import (
	"context"
	"errors"
	"fmt"

	"github.com/bandplane/bandplane/schema/kafka"
)

// Topics are where a sealer on Kafka reads and writes: the stored-events topic (read
// as Group, which gives the whole topic to the member of the highest Priority) and the
// compacted checkpoints topic.
type Topics struct {
	Brokers     []string
	Stored      string
	Checkpoints string
	Group       string
	Priority    uint8
}

// Group is the consumer group of the sealers of a stored-events topic.
func Group(storedTopic string) string { return "bandplane-sealer:" + storedTopic }

// EnsureTopics creates the stored-events topic (with partitions) and the compacted
// checkpoints topic when they do not exist.
func EnsureTopics(ctx context.Context, t Topics, partitions int) error {
	if err := kafka.EnsureTopic(ctx, t.Brokers, t.Stored, partitions); err != nil {
		return err
	}
	return kafka.EnsureTopic(ctx, t.Brokers, t.Checkpoints, 1, kafka.CompactedTopicConfig...)
}

// NewOnKafka is New with cfg's Notes, Publisher and Published on the topics t names;
// close releases the Kafka clients (the sealer leaves its group).
func NewOnKafka(cfg Config, t Topics) (s *Sealer, close func() error, err error) {
	if t.Group == "" {
		t.Group = Group(t.Stored)
	}
	reader, err := kafka.NewGroupReader(kafka.GroupReaderConfig{Brokers: t.Brokers, Topic: t.Stored, GroupID: t.Group,
		Priority: t.Priority, Logger: cfg.Logger})
	if err != nil {
		return nil, nil, err
	}
	pub, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: t.Brokers, Topic: t.Checkpoints, BatchSize: kafka.AuditBatchSize})
	if err != nil {
		_ = reader.Close()
		return nil, nil, err
	}
	closeAll := func() error { return errors.Join(reader.Close(), pub.Close()) }
	cfg.Notes, cfg.Publisher = reader, pub
	cfg.Published = func(ctx context.Context) (map[string][]byte, error) {
		return kafka.ReadLatest(ctx, t.Brokers, t.Checkpoints)
	}
	if s, err = New(cfg); err != nil {
		_ = closeAll()
		return nil, nil, fmt.Errorf("cannot make the sealer: %w", err)
	}
	return s, closeAll, nil
}
