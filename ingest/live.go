package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
)

// Live reads the event topic in every partition, outside any consumer group: each
// serve process sees every event once it is produced, whichever process ingests it.
// Records are decoded and enriched as ingest does (the directory is its own, loaded
// from ClickHouse at start and kept by the directory events it reads) and handed to
// Publish in partition order, from the newest offset at start on. What lies between
// the ingest group's committed offsets (Start: what ClickHouse, and so the directory
// and the hub's seed, may not hold yet) and that newest offset is handed to Replay
// first, so that nothing produced before the start is missed by the state it keeps;
// at most MaxReplay records per partition. Nothing is stored or committed.
type Live struct {
	cfg LiveConfig
	log *slog.Logger
}

// LiveConfig configures a Live reader.
type LiveConfig struct {
	Brokers   []string
	Topic     string
	Directory *directory.Directory
	// Publish receives each event, its organization resolved when the directory can.
	// It is called from one goroutine per partition and must not block for long.
	Publish func(ev *schema.Event)
	// Replay receives the events before the newest offset at start (see Start); nil:
	// they are skipped.
	Replay func(ev *schema.Event)
	// Start is where to begin each partition (the ingest group's committed offsets,
	// read before the directory and the seed). A partition it lacks has nothing
	// ingested yet and is replayed from its start; a nil Start begins every partition
	// at its newest offset.
	Start map[int]int64
	// MaxReplay bounds the records replayed per partition (default 100,000).
	MaxReplay int64
	Logger    *slog.Logger
	// Retry is the wait before reading a partition again after an error (default 1 s).
	Retry time.Duration
}

// NewLive checks cfg.
func NewLive(cfg LiveConfig) (*Live, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("live reader: no kafka brokers"))
	}
	if cfg.Topic == "" {
		errs = append(errs, errors.New("live reader: no topic"))
	}
	if cfg.Directory == nil || cfg.Publish == nil {
		errs = append(errs, errors.New("live reader: a directory and a publish func are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.MaxReplay <= 0 {
		cfg.MaxReplay = 100_000
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Live{cfg: cfg, log: log.With("component", "live")}, nil
}

// Run reads until ctx ends. ready is closed once every partition's reader has
// replayed up to its newest offset at start (events produced after that are
// published).
func (l *Live) Run(ctx context.Context, ready chan<- struct{}) error {
	parts, err := l.partitions(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	var positioned sync.WaitGroup
	positioned.Add(len(parts))
	for _, p := range parts {
		wg.Go(func() { l.readPartition(ctx, p, positioned.Done) })
	}
	go func() {
		positioned.Wait()
		close(ready)
	}()
	wg.Wait()
	return nil
}

func (l *Live) partitions(ctx context.Context) ([]int, error) {
	for {
		ps, err := kafka.Partitions(ctx, l.cfg.Brokers, l.cfg.Topic)
		if err == nil {
			return ps, nil
		}
		l.log.Warn("cannot list the topic's partitions; retrying", "topic", l.cfg.Topic, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(l.cfg.Retry):
		}
	}
}

// readPartition follows one partition; after an error it carries on from the next
// offset it has not seen.
func (l *Live) readPartition(ctx context.Context, partition int, positioned func()) {
	var once sync.Once
	defer once.Do(positioned)
	oldest, newest, err := l.offsets(ctx, partition)
	if err != nil {
		return // ctx ended
	}
	next := newest
	if l.cfg.Start != nil && l.cfg.Replay != nil {
		start := l.cfg.Start[partition] // 0 when absent: nothing of it was ingested
		if start < newest {
			next = max(start, newest-l.cfg.MaxReplay, oldest)
			l.log.Info("replaying what ingest has not stored yet", "partition", partition, "from", next, "to", newest)
		}
	}
	if next >= newest {
		once.Do(positioned)
	}
	for ctx.Err() == nil {
		r := kafkago.NewReader(kafkago.ReaderConfig{
			Brokers: l.cfg.Brokers, Topic: l.cfg.Topic, Partition: partition,
			MinBytes: 1, MaxBytes: kafka.ReaderFetchBytes, MaxWait: 100 * time.Millisecond,
			ReadBackoffMin: 50 * time.Millisecond, ReadBackoffMax: time.Second,
		})
		if err := r.SetOffset(next); err != nil {
			l.log.Warn("cannot position the live reader", "partition", partition, "err", err)
		}
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				if ctx.Err() == nil {
					l.log.Warn("live reader error; reconnecting", "partition", partition, "err", err)
				}
				break
			}
			next = m.Offset + 1
			l.handle(m, m.Offset < newest)
			if next >= newest {
				once.Do(positioned)
			}
		}
		_ = r.Close()
		select {
		case <-ctx.Done():
		case <-time.After(l.cfg.Retry):
		}
	}
}

// offsets reads the partition's oldest offset and its next one (where a record
// produced now goes), retrying until it can or ctx ends. Each try asks the next
// bootstrap broker for the partition's leader, so one broker down does not stop it.
func (l *Live) offsets(ctx context.Context, partition int) (int64, int64, error) {
	for try := 0; ; try++ {
		conn, err := kafkago.DialLeader(ctx, "tcp", l.cfg.Brokers[try%len(l.cfg.Brokers)], l.cfg.Topic, partition)
		if err == nil {
			first, last, err2 := conn.ReadOffsets()
			_ = conn.Close()
			if err2 == nil {
				return first, last, nil
			}
			err = err2
		}
		l.log.Warn("cannot read the newest offset of a partition; retrying", "partition", partition, "err", err)
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(l.cfg.Retry):
		}
	}
}

func (l *Live) handle(m kafkago.Message, replay bool) {
	ev, err := schema.DecodeAt(m.Value, m.Time)
	if err != nil {
		return // ingest dead-letters it; nothing to show live
	}
	if schema.IsDirectoryType(ev.Type) {
		if _, err := l.cfg.Directory.Apply(&ev); err != nil {
			return
		}
	}
	Enrich(&ev, l.cfg.Directory)
	if replay {
		l.cfg.Replay(&ev)
		return
	}
	l.cfg.Publish(&ev)
}
