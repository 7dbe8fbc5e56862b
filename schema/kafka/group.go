package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// GroupReaderConfig configures a GroupReader.
type GroupReaderConfig struct {
	Brokers []string
	Topic   string
	GroupID string
	// Priority decides which member reads: the whole topic goes to the member of the
	// highest priority (the smallest member id among those, on a tie), the others
	// hold nothing until it leaves. An operator's one-off run takes over from the
	// long-running readers that way, instead of sharing the partitions with them.
	Priority uint8
	Logger   *slog.Logger // kafka-go's errors at warn level; nil = discard
}

// wholeTopic is the group balancer of GroupReader: every partition to one member.
type wholeTopic struct{ priority uint8 }

func (wholeTopic) ProtocolName() string { return "bandplane-whole-topic" }

func (b wholeTopic) UserData() ([]byte, error) { return []byte{b.priority}, nil }

func (wholeTopic) AssignGroups(members []kafkago.GroupMember, partitions []kafkago.Partition) kafkago.GroupMemberAssignments {
	out := kafkago.GroupMemberAssignments{}
	if len(members) == 0 {
		return out
	}
	best := members[0]
	prio := func(m kafkago.GroupMember) uint8 {
		if len(m.UserData) == 1 {
			return m.UserData[0]
		}
		return 0
	}
	for _, m := range members[1:] {
		if p, q := prio(m), prio(best); p > q || p == q && m.ID < best.ID {
			best = m
		}
	}
	for _, m := range members {
		out[m.ID] = map[string][]int{}
	}
	for _, p := range partitions {
		out[best.ID][p.Topic] = append(out[best.ID][p.Topic], p.ID)
	}
	return out
}

// GroupReader reads a topic as a member of a consumer group in passes: each Drain
// returns what the partitions this member holds had when it was called, from the
// group's committed offsets on, and Commit commits exactly what Drain returned. The
// group makes one member the reader of each partition; the sealer uses it so that one
// sealer extends an organization's log at a time. It is not safe for concurrent use.
type GroupReader struct {
	cfg     GroupReaderConfig
	client  *kafkago.Client
	group   *kafkago.ConsumerGroup
	gen     *kafkago.Generation
	genDone chan struct{}
	pos     map[int]int64 // the next offset to read, per held partition
	read    map[int]int64 // what the last Drain read up to, to commit
	base    map[int]int64 // where the generation started or the last Commit left pos
	readers map[int]*kafkago.Reader
	errLog  kafkago.Logger
}

func NewGroupReader(cfg GroupReaderConfig) (*GroupReader, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("no kafka brokers given (--kafka)"))
	}
	if cfg.Topic == "" || cfg.GroupID == "" {
		errs = append(errs, errors.New("group reader: topic and group are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var errLog kafkago.Logger
	if cfg.Logger != nil {
		l := cfg.Logger.With("component", "kafka-group-reader", "topic", cfg.Topic, "group", cfg.GroupID)
		errLog = kafkago.LoggerFunc(func(msg string, args ...any) { l.Warn(fmt.Sprintf(msg, args...)) })
	}
	group, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID: cfg.GroupID, Brokers: cfg.Brokers, Topics: []string{cfg.Topic}, StartOffset: kafkago.FirstOffset,
		GroupBalancers:    []kafkago.GroupBalancer{wholeTopic{priority: cfg.Priority}},
		HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 500 * time.Millisecond, WatchPartitionChanges: true, ErrorLogger: errLog,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot join consumer group %s on topic %s: %w", cfg.GroupID, cfg.Topic, err)
	}
	return &GroupReader{cfg: cfg, client: &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Timeout: 15 * time.Second},
		group: group, errLog: errLog, readers: map[int]*kafkago.Reader{}}, nil
}

// generation returns the member's current generation, waiting for one (a join, or the
// rejoin after a rebalance) when the last one ended.
func (g *GroupReader) generation(ctx context.Context) error {
	if g.gen != nil {
		select {
		case <-g.genDone:
		default:
			return nil
		}
		g.closeReaders()
	}
	gen, err := g.group.Next(ctx)
	if err != nil {
		return fmt.Errorf("cannot join consumer group %s on topic %s: %w", g.cfg.GroupID, g.cfg.Topic, err)
	}
	done := make(chan struct{})
	gen.Start(func(ctx context.Context) { <-ctx.Done(); close(done) })
	g.gen, g.genDone = gen, done
	g.pos, g.read, g.base = map[int]int64{}, map[int]int64{}, map[int]int64{}
	var unset []kafkago.OffsetRequest
	for _, a := range gen.Assignments[g.cfg.Topic] {
		if a.Offset >= 0 {
			g.pos[a.ID] = a.Offset
		} else {
			unset = append(unset, kafkago.FirstOffsetOf(a.ID))
		}
	}
	if len(unset) > 0 {
		resp, err := g.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{g.cfg.Topic: unset}})
		if err != nil {
			return fmt.Errorf("cannot read the first offsets of topic %s: %w", g.cfg.Topic, err)
		}
		for _, p := range resp.Topics[g.cfg.Topic] {
			if p.Error != nil {
				return fmt.Errorf("cannot read the first offset of topic %s partition %d: %w", g.cfg.Topic, p.Partition, p.Error)
			}
			g.pos[p.Partition] = p.FirstOffset
		}
	}
	maps.Copy(g.base, g.pos)
	return nil
}

func (g *GroupReader) closeReaders() {
	for p, r := range g.readers {
		_ = r.Close()
		delete(g.readers, p)
	}
}

// Holds says whether this member holds the topic's partitions: it did at the last
// Drain, and that generation has not ended since.
func (g *GroupReader) Holds() bool {
	if len(g.pos) == 0 || g.genDone == nil {
		return false
	}
	select {
	case <-g.genDone:
		return false
	default:
		return true
	}
}

// Generation identifies the member's generation at the last Drain (0 before one): a
// change says another member may have read and committed in between, so anything the
// caller derived from an earlier generation may be stale.
func (g *GroupReader) Generation() int64 {
	if g.gen == nil {
		return 0
	}
	return int64(g.gen.ID)
}

// Rewind forgets what the Drains since the last Commit returned: the next Drain
// returns those records again, and Commit commits nothing until then.
func (g *GroupReader) Rewind() {
	if len(g.read) == 0 {
		return
	}
	g.closeReaders()
	maps.Copy(g.pos, g.base)
	g.read = map[int]int64{}
}

// Drain returns the records of the held partitions from the committed offsets up to
// each partition's end as of the call, at most max; more says it stopped at max.
func (g *GroupReader) Drain(ctx context.Context, max int) ([]kafkago.Message, bool, error) {
	if err := g.generation(ctx); err != nil {
		return nil, false, err
	}
	if len(g.pos) == 0 {
		return nil, false, nil
	}
	var req []kafkago.OffsetRequest
	for p := range g.pos {
		req = append(req, kafkago.LastOffsetOf(p))
	}
	resp, err := g.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{g.cfg.Topic: req}})
	if err != nil {
		return nil, false, fmt.Errorf("cannot read the end offsets of topic %s: %w", g.cfg.Topic, err)
	}
	var out []kafkago.Message
	more := false
	for _, po := range resp.Topics[g.cfg.Topic] {
		if po.Error != nil {
			return nil, false, fmt.Errorf("cannot read the end offset of topic %s partition %d: %w", g.cfg.Topic, po.Partition, po.Error)
		}
		p, end := po.Partition, po.LastOffset
		for g.pos[p] < end {
			if len(out) >= max {
				more = true
				break
			}
			m, err := g.reader(p).FetchMessage(ctx)
			if err != nil {
				return nil, false, fmt.Errorf("cannot read topic %s partition %d at offset %d: %w", g.cfg.Topic, p, g.pos[p], err)
			}
			g.pos[p] = m.Offset + 1
			g.read[p] = g.pos[p]
			out = append(out, m)
		}
	}
	return out, more, nil
}

func (g *GroupReader) reader(p int) *kafkago.Reader {
	if r := g.readers[p]; r != nil {
		return r
	}
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: g.cfg.Brokers, Topic: g.cfg.Topic, Partition: p, MinBytes: 1,
		MaxBytes: ReaderFetchBytes, MaxWait: 100 * time.Millisecond, ErrorLogger: g.errLog, QueueCapacity: 64})
	_ = r.SetOffset(g.pos[p])
	g.readers[p] = r
	return r
}

// Commit commits what the last Drain read. It fails when the generation ended since
// (another member holds the partitions now and reads them again from the last commit).
func (g *GroupReader) Commit(ctx context.Context) error {
	if g.gen == nil || len(g.read) == 0 {
		return nil
	}
	offsets := map[int]int64{}
	for p, o := range g.read {
		offsets[p] = o
	}
	if err := g.gen.CommitOffsets(map[string]map[int]int64{g.cfg.Topic: offsets}); err != nil {
		return fmt.Errorf("cannot commit the offsets of group %s on topic %s: %w", g.cfg.GroupID, g.cfg.Topic, err)
	}
	maps.Copy(g.base, offsets)
	g.read = map[int]int64{}
	return nil
}

// Close leaves the group.
func (g *GroupReader) Close() error {
	g.closeReaders()
	return g.group.Close()
}
