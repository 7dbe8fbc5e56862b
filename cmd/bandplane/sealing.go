package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
)

// Priorities of a sealer in its group (trail.Topics): an operator's `audit seal` takes
// the stored-events topic over from serve's sealers while it runs.
const (
	sealerPriorityServe    = 0
	sealerPriorityOperator = 1
)

// auditTopics are the sealer's topics of this stack.
func (s *stackFlags) auditTopics(priority uint8) trail.Topics {
	return trail.Topics{Brokers: s.brokers(), Stored: s.storedTopic(), Checkpoints: s.checkpointTopic(), Priority: priority}
}

// newSealer builds the sealer of the trail with its Kafka clients (creating the topics
// when they do not exist); close releases them.
// ingestGroup is the ingest consumer group whose offsets the coverage notes sign.
func newSealer(ctx context.Context, st *stackFlags, conn driver.Conn, key ed25519.PrivateKey, every time.Duration, priority uint8,
	ingestGroup string, log *slog.Logger, reg prometheus.Registerer) (*trail.Sealer, func() error, error) {
	prefix, err := st.prefix()
	if err != nil {
		return nil, nil, err
	}
	t := st.auditTopics(priority)
	if err := trail.EnsureTopics(ctx, t, 4); err != nil {
		return nil, nil, err
	}
	brokers := st.brokers()
	return trail.NewOnKafka(trail.Config{Conn: conn, Database: st.ch.Database, Prefix: prefix, Key: key, Every: every,
		Ingested: func(ctx context.Context) (map[int]int64, error) {
			return kafka.CommittedOffsets(ctx, brokers, st.topic, ingestGroup)
		},
		IngestTopic: st.topic, IngestGroup: ingestGroup, Logger: log, Registerer: reg}, t)
}

// replicaTrail is the policy replica's check of what it restores (replica.Trail): the
// coverage note on the checkpoints topic, of this events topic as this ingest group
// reads it, and the audit log.
type replicaTrail struct {
	log    *trail.Log
	topic  string
	group  string
	latest func(ctx context.Context) (map[string][]byte, error)
}

func (t replicaTrail) Coverage(ctx context.Context) (map[int]int64, bool, error) {
	c, ok, err := t.log.Coverage(ctx, t.latest)
	if err != nil || !ok {
		return nil, false, err
	}
	if c.Topic != t.topic || c.Group != t.group {
		// Another deployment's topic on the same brokers, or an `audit seal --group`
		// of another group: not the offsets of this trail.
		return nil, false, nil
	}
	return c.Offsets, true, nil
}

func (t replicaTrail) Sealed(ctx context.Context, rows []store.EventRow) ([]bool, error) {
	latest, err := t.latest(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot read the checkpoints topic's rotation records: %w", err)
	}
	return t.log.Sealed(ctx, trail.TopicRotations(latest), rows)
}
