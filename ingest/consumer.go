// Package ingest turns the event stream into the audit trail: it consumes the events
// topic as a consumer group, decodes and validates each record (platform frame or
// canonical event), enriches it from the directory and the price catalog, writes
// batches to ClickHouse and only then commits offsets. Records it cannot use go to the
// dead-letter topic and table with the reason. Delivery is at-least-once; the event id
// makes it effectively-once in everything queries read.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/cause"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// MessageReader is the consumer-group side of Kafka. FetchMessage blocks until a record
// is available or ctx ends; CommitMessages commits, per partition, the offset after the
// highest message given. *kafkago.Reader implements it.
type MessageReader interface {
	FetchMessage(ctx context.Context) (kafkago.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafkago.Message) error
}

// MessageWriter produces dead letters; it returns once they are acknowledged.
type MessageWriter interface {
	ProduceMessages(ctx context.Context, msgs []kafkago.Message) error
}

// NoteWriter produces notes to the stored-events topic (query/trail's package doc):
// the leaves of the rows a batch stored. It returns once every one is acknowledged,
// or an error (the call is retried whole; the sealer drops a note it has sealed).
type NoteWriter interface {
	WriteNotes(ctx context.Context, leaves []tlog.Leaf) error
}

// Storage writes a batch durably: BatchInsert returns nil only once every row is
// acknowledged by ClickHouse. It must be idempotent, because a failed batch is retried
// and a replayed record is written again. An error for which store.Permanent is true
// means ClickHouse refuses the rows themselves: the consumer then splits the batch.
type Storage interface {
	BatchInsert(ctx context.Context, b *store.Batch) error
	// StoredEvents returns the stored audit-trail rows whose replacing key
	// (organization, time in seconds, id) is one of keys.
	StoredEvents(ctx context.Context, keys []store.EventKey) ([]store.EventRow, error)
}

// Defaults of the horizons of the consumer's memory (Config.LateHorizon,
// Config.UnpricedHorizon).
const (
	DefaultLateHorizon     = time.Hour
	DefaultUnpricedHorizon = 24 * time.Hour
)

// DefaultBatchBytes is the default of Config.BatchBytes: a batch is flushed once its
// records hold this many raw bytes, however few they are. At most DefaultPendingBatches
// such batches are in memory at once (Config.MaxPendingBytes).
const DefaultBatchBytes = 64 << 20

// DefaultPendingBatches is the default of Config.MaxPendingBytes in batches of
// BatchBytes: one being stored, one being checked, one waiting for the checker, one
// being built, and room for the records being decoded. (The checker keeps the rows of
// the batch it handed to the writer until it takes the next one, which it compares
// them with: up to one batch more than the budget counts.)
const DefaultPendingBatches = 5

// MaxReasonBytes bounds the reason of a dead letter (it travels as a Kafka header and
// is stored beside the record); a longer one is cut at a UTF-8 boundary.
const MaxReasonBytes = 1 << 10

// maxDeadLetterKeyBytes bounds the key of a dead letter: a record's key is normally a
// room id (schema.MaxIDBytes), but a record produced by anything else may carry more.
const maxDeadLetterKeyBytes = 1 << 10

// ReasonIDReused starts the reason of a record dead-lettered because its event id is
// stored (or earlier in its batch) with other content.
const ReasonIDReused = "id reused with different content"

// Config configures a Consumer.
type Config struct {
	Reader      MessageReader
	DeadLetters MessageWriter // the dead-letter topic
	Storage     Storage
	Directory   *directory.Directory
	Catalog     pricing.Source // read per usage event: a new catalog version prices the next one
	Topic       string         // the source topic, recorded with dead letters
	// Notes, when set, gets the notes of every batch once it is stored and before its
	// offsets are committed: the sealer seals what the notes say, never what it finds
	// in ClickHouse. Nil: nothing is noted, and nothing stored is ever sealed.
	Notes NoteWriter
	// DeadLetterMaxBytes is the dead-letter writer's message limit: a dead letter that
	// would be larger is sent and stored with its raw record cut (default
	// kafka.MaxMessageBytes).
	DeadLetterMaxBytes int

	Decoders  int           // goroutines decoding records (default GOMAXPROCS)
	BatchSize int           // flush when this many records are pending
	BatchAge  time.Duration // or when the oldest pending record is this old
	// BatchBytes also flushes the batch once its records' raw bytes (key, value and
	// headers as fetched, recordBytes) reach it (default DefaultBatchBytes): with events
	// of up to kafka.MaxEventBytes, BatchSize alone would let one batch hold gigabytes.
	BatchBytes int
	// MaxPendingBytes bounds the raw bytes of the records fetched but not yet stored
	// and committed (being decoded, in the batch being built, in the batches being
	// flushed): fetching waits while they are at the bound, so that a stream of large
	// events cannot exhaust memory (default DefaultPendingBatches × BatchBytes; at
	// least BatchBytes). The memory they take is a small multiple of it (the record,
	// its decoded event and its rows). kafka-go's own queue comes on top: at most
	// kafka.ReaderQueueCapacity messages of at most kafka.TopicMaxMessageBytes.
	MaxPendingBytes int

	RetryMin        time.Duration // first back-off after a failed write
	RetryMax        time.Duration
	ShutdownTimeout time.Duration // how long a graceful stop may take to flush and commit

	// LateHorizon is how long the consumer remembers a party (agent, person) after it
	// last stored an event of it without an organization (default
	// DefaultLateHorizon). Within it, a replay of such an event keeps org "" and
	// collapses with the stored row; records are committed right after they are
	// stored, so a redelivery is of the last uncommitted batches, well within an hour.
	// A replay from further back (a client re-posting day-old events after the agent
	// registered) is stored a second time, attributed.
	LateHorizon time.Duration
	// UnpricedHorizon is how long the consumer remembers an agent after it last stored
	// usage of it that could not be priced for want of a model (default
	// DefaultUnpricedHorizon). A registration within it reprices that usage
	// automatically; after it, `bandplane reprice` still does.
	UnpricedHorizon time.Duration
	// LateParties are the parties with events stored without an organization within
	// LateHorizon (store.UnattributedParties), each with the last time, read at start.
	LateParties map[string]time.Time
	// Unattributed reads those parties again (store.UnattributedParties). When set, it
	// is read before every batch's check of what is stored: with several ingest
	// processes in one group, a record another process stored without an organization
	// and did not commit before it died is delivered here again, and this process never
	// saw the party late; the read tells it, so the replay keeps org "" and collapses
	// with the stored row instead of being stored a second time, attributed.
	Unattributed func(ctx context.Context, since time.Time) (map[string]time.Time, error)
	// ReloadDirectory reads the directory ClickHouse holds (store.LoadDirectory). When
	// set, a batch that ends with events of parties this process does not know reloads
	// it first (at most once a second): with several ingest processes in one group, a
	// party's registration is consumed by the process that holds its partition, and
	// the others learn it only from ClickHouse.
	ReloadDirectory func(ctx context.Context) ([]store.DirectoryRow, error)
	// UnpricedAgents are the agents with usage stored unpriced for want of a model
	// within UnpricedHorizon (store.UnpricedAgents), read at start.
	UnpricedAgents map[string]time.Time

	// AfterFlush, if set, is called after each committed batch with the hours of usage
	// it touched and the agents whose unpriced usage may now be priced (their
	// registration arrived), each named by the organization that registered it. The
	// rollup worker uses it.
	AfterFlush func(hours []store.HourKey, repriceAgents []AgentKey)

	// Causes keeps events' cause links across restarts and late triggers
	// (store.Store): the tracker is warmed from it at start, and the stored rows a
	// late trigger resolves are rewritten through it. Nil: links are derived from what
	// this process sees, and a late trigger resolves only the events it saw.
	Causes Causes

	// Now is the consumer's clock (nil: time.Now): the write time it stamps on each
	// insert attempt, and the horizons of what it remembers.
	Now func() time.Time

	Logger  *slog.Logger
	Metrics *Metrics
}

func (c *Config) Validate() error {
	var errs []error
	if c.Reader == nil {
		errs = append(errs, errors.New("ingest: no Kafka reader"))
	}
	if c.DeadLetters == nil {
		errs = append(errs, errors.New("ingest: no dead-letter writer"))
	}
	if c.Storage == nil {
		errs = append(errs, errors.New("ingest: no storage"))
	}
	if c.Directory == nil {
		errs = append(errs, errors.New("ingest: no directory"))
	}
	if c.Catalog == nil {
		errs = append(errs, errors.New("ingest: no price catalog"))
	}
	if c.BatchSize <= 0 {
		errs = append(errs, fmt.Errorf("ingest: batch size must be > 0, got %d (--batch-size)", c.BatchSize))
	}
	if c.BatchAge <= 0 {
		errs = append(errs, fmt.Errorf("ingest: batch age must be > 0, got %s (--batch-age)", c.BatchAge))
	}
	batchBytes := cmp.Or(c.BatchBytes, DefaultBatchBytes)
	if c.BatchBytes < 0 {
		errs = append(errs, fmt.Errorf("ingest: batch bytes must be > 0, got %d", c.BatchBytes))
	}
	if c.MaxPendingBytes < 0 || (c.MaxPendingBytes > 0 && c.MaxPendingBytes < batchBytes) {
		errs = append(errs, fmt.Errorf("ingest: pending bytes must be >= the batch bytes (%d), got %d", batchBytes, c.MaxPendingBytes))
	}
	if c.LateHorizon < 0 || c.UnpricedHorizon < 0 {
		errs = append(errs, fmt.Errorf("ingest: horizons must be >= 0, got late %s, unpriced %s", c.LateHorizon, c.UnpricedHorizon))
	}
	if c.DeadLetterMaxBytes != 0 && c.DeadLetterMaxBytes < 4*MaxReasonBytes {
		errs = append(errs, fmt.Errorf("ingest: dead-letter message limit must be >= %d bytes, got %d", 4*MaxReasonBytes, c.DeadLetterMaxBytes))
	}
	return errors.Join(errs...)
}

// Consumer is the ingest pipeline of one process.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	m       *Metrics
	healthy atomic.Bool // false while ClickHouse or the dead-letter topic refuses writes
	now     func() time.Time
	// unpriced holds the agents seen with usage that could not be priced because no
	// model was known; late the parties (agents, people) with events stored without an
	// organization. Both are owned by the Run goroutine (add, toRows).
	unpriced *expiring
	late     *expiring
	reloaded time.Time          // the directory's last reload for parked events (main loop only)
	tracker  *cause.Tracker     // the events' cause links (main loop only)
	stored   prometheus.Counter // m.Records{result="stored"}, looked up once
}

func New(cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 100 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 10 * time.Second
	}
	if cfg.Decoders <= 0 {
		cfg.Decoders = runtime.GOMAXPROCS(0)
	}
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	if cfg.MaxPendingBytes == 0 {
		cfg.MaxPendingBytes = DefaultPendingBatches * cfg.BatchBytes
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.LateHorizon == 0 {
		cfg.LateHorizon = DefaultLateHorizon
	}
	if cfg.UnpricedHorizon == 0 {
		cfg.UnpricedHorizon = DefaultUnpricedHorizon
	}
	if cfg.DeadLetterMaxBytes == 0 {
		cfg.DeadLetterMaxBytes = kafka.MaxMessageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Consumer{cfg: cfg, log: cfg.Logger.With("component", "ingest"), m: cfg.Metrics, now: cfg.Now,
		unpriced: newExpiring(cfg.UnpricedHorizon), late: newExpiring(cfg.LateHorizon), tracker: NewTracker(cfg.Directory)}
	for id, at := range cfg.LateParties {
		c.late.mark(id, at)
	}
	for id, at := range cfg.UnpricedAgents {
		c.unpriced.mark(id, at)
	}
	c.stored = c.m.Records.WithLabelValues("stored")
	c.healthy.Store(true)
	return c, nil
}

// Healthy reports whether the last write to ClickHouse and the dead-letter topic
// succeeded (readiness).
func (c *Consumer) Healthy() bool { return c.healthy.Load() }

// pending is a batch being built: the records fetched, in fetch order, and the rows
// made of them. Each row remembers its record (the *Rec slices, parallel to the
// batch's tables), so that a batch ClickHouse refuses can be split by record.
type pending struct {
	batch    store.Batch
	msgs     []kafkago.Message // every record of the batch
	bytes    int               // the records' recordBytes, taken from the pending budget
	evRec    []int32           // evRec[i] is the record of batch.Events[i]; and so on
	usageRec []int32
	dirRec   []int32
	dlRec    []int32
	causeRec []int32
	dlq      []kafkago.Message       // the dead-letter messages, parallel to batch.DeadLetters
	last     map[int]kafkago.Message // highest message per partition, for the commit
	replays  int                     // records whose event was stored already, same content
	// replayHours are the hours of the replays' usage, which is not written again: the
	// rollup rebuilds them all the same, in case a crash came before it did.
	replayHours []store.HourKey
	// notes are the leaves of the rows ClickHouse holds for the batch's events: those
	// of the records' own copies that the check found (ownLeaf), then those each insert
	// wrote.
	notes   []tlog.Leaf
	lookup  time.Duration // how long checkStored took
	written chan struct{} // closed once the writer is done with the batch

	repriceAgents []AgentKey
	parked        []parked
	// parkedKeys are the partition keys (rooms) of the parked events: the events of
	// such a room after a parked one are parked too, so that the cause tracker sees
	// each room's events in stream order.
	parkedKeys map[string]bool
	recheck    []int // indexes into batch.Events of late-attributed events
	// resolved are the events of earlier batches whose pending link a trigger of this
	// batch resolved: their stored rows are rewritten once the batch is stored
	// (relink). The rows of this batch's own pending events (pendingRows) are given
	// their resolved link before they are written.
	resolved    []cause.Resolution
	pendingRows map[rowRef]pendingRow
	first       time.Time
}

// rowRef is an event by its organization and id.
type rowRef struct{ org, id string }

// pendingRow is where a pending event's rows are in its batch (usage -1: none).
type pendingRow struct{ cause, usage int }

type parked struct {
	ev  schema.Event
	rec int32
}

func newPending(size int) *pending {
	return &pending{last: map[int]kafkago.Message{}, msgs: make([]kafkago.Message, 0, size),
		batch: store.Batch{Events: make([]store.EventRow, 0, size)}, evRec: make([]int32, 0, size),
		written: make(chan struct{})}
}

// done says whether the writer is done with p.
func (p *pending) done() bool {
	select {
	case <-p.written:
		return true
	default:
		return false
	}
}

// overlaps says whether an event of p has the replacing key of one of q's rows (or,
// for p's late-attributed events, their key without organization, as checkStored
// looks them up). q's rows are only read: the writer stamps the batch, not its rows.
func (p *pending) overlaps(q *pending) bool {
	if len(p.batch.Events) == 0 || len(q.batch.Events) == 0 {
		return false
	}
	keys := make(map[store.EventKey]struct{}, len(q.batch.Events))
	for i := range q.batch.Events {
		keys[store.KeyOf(&q.batch.Events[i])] = struct{}{}
	}
	for i := range p.batch.Events {
		if _, ok := keys[store.KeyOf(&p.batch.Events[i])]; ok {
			return true
		}
	}
	for _, i := range p.recheck {
		k := store.KeyOf(&p.batch.Events[i])
		k.OrgID = ""
		if _, ok := keys[k]; ok {
			return true
		}
	}
	return false
}

// Run consumes until ctx ends, then flushes what it has fetched, commits, and returns
// nil. It returns an error only if it cannot start. A record is committed only after it
// (or its dead letter) is in ClickHouse, and so is every record fetched before it from
// its partition.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.warm(ctx) {
		return nil
	}
	fetched := make(chan record, c.cfg.BatchSize)
	// Every record fetched holds its bytes of the budget until the batch holding it is
	// done with (stored and committed, or given up).
	budget := newByteBudget(c.cfg.MaxPendingBytes)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.fetchLoop(ctx, fetched, budget)
	}()

	// Batches are written in order by two stages while the next one is being built: a
	// checker looks up which events of a batch are stored already (checkStored) while a
	// writer stores the batch before it (store). A batch holding an event with the key
	// of one in the batch being written (a replay or a reused id straddling the two:
	// rare) is checked only once that one is written, so that the lookup sees what it
	// stored and what ClickHouse refused: exactly as if they were flushed one after the
	// other. The writer takes a batch only once the one before is committed, so nothing
	// else is in flight.
	flushes := make(chan *pending, 1)
	// room says that the checker took a batch from flushes: a batch that is due waits
	// for it (see due below).
	room := make(chan struct{}, 1)
	checked := make(chan *pending)
	flusherDone := make(chan struct{})
	// The checker and the writer outlive ctx by ShutdownTimeout so that a graceful stop
	// can finish.
	flushCtx, cancelFlush := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFlush()
	// Once a batch could not be checked or stored (the shutdown timeout ended its
	// retries), no later batch may be committed: its offsets would pass the records of
	// the one that was not stored.
	var stopped atomic.Bool
	go func() {
		defer close(checked)
		var writing *pending // the batch handed to the writer last
		for p := range flushes {
			select {
			case room <- struct{}{}:
			default:
			}
			if writing != nil && !writing.done() && p.overlaps(writing) {
				<-writing.written
			}
			writing = nil
			if stopped.Load() || !c.check(flushCtx, p) {
				stopped.Store(true)
				budget.release(p.bytes)
				continue
			}
			writing = p
			checked <- p
		}
	}()
	go func() {
		defer close(flusherDone)
		for p := range checked {
			if !stopped.Load() && !c.store(flushCtx, p) {
				stopped.Store(true)
			}
			close(p.written)
			budget.release(p.bytes)
		}
	}()

	p := newPending(c.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// handOff passes the pending batch to the checker. While the writer is still
	// retrying a batch (ClickHouse down), the checker and then this block, which stops
	// fetching: back-pressure instead of unbounded memory (the byte budget stops it too,
	// earlier for large records). A stop request ends the wait and the batch is flushed
	// by the shutdown path below.
	//
	// A batch that is due (its age reached) while flushes is still full is not closed
	// yet: it goes on taking records until there is room, or it is full. Under load the
	// batches grow to what the writer can take in one go, instead of queueing up small
	// ones each with its own inserts; a record waits no longer than it would have in
	// the queue.
	due := false
	handOff := func(stopping <-chan struct{}) {
		due = false
		timer.Stop()
		if len(p.msgs) == 0 {
			return
		}
		c.resolveParked(p)
		select {
		case flushes <- p:
			p = newPending(c.cfg.BatchSize)
			c.m.Batching.Set(0)
		case <-stopping:
		}
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case m := <-fetched:
			if len(p.msgs) == 0 {
				p.first = time.Now()
				timer.Reset(c.cfg.BatchAge)
			}
			c.add(p, m)
			if len(p.msgs) >= c.cfg.BatchSize || p.bytes >= c.cfg.BatchBytes {
				handOff(ctx.Done())
			}
		case <-timer.C:
			due = true
		case <-room:
		}
		// Only this loop sends on flushes, so room seen here is room at the send.
		if due && len(flushes) < cap(flushes) {
			handOff(ctx.Done())
		}
	}
	wg.Wait() // the fetch loop has stopped: nothing more arrives
	for drained := false; !drained; {
		select {
		case m := <-fetched:
			c.add(p, m)
		default:
			drained = true
		}
	}
	c.log.Info("stopping: flushing and committing", "pending_records", len(p.msgs))
	stopTimer := time.AfterFunc(c.cfg.ShutdownTimeout, cancelFlush)
	defer stopTimer.Stop()
	handOff(nil)
	close(flushes)
	<-flusherDone
	return nil
}

// record is a fetched message, already decoded: decoding is pure and the costliest
// step, so the fetch goroutine does it while the main loop enriches and batches.
type record struct {
	msg kafkago.Message
	ev  schema.Event
	err error
}

// fetchLoop fetches records and hands them to out decoded, in fetch order. Decoding is
// spread over Decoders goroutines: records are dealt to them round-robin and collected
// in the same round-robin order, so order is kept without sequence numbers. It returns
// once every goroutine it started has stopped.
//
// What reaches out is always a gap-free prefix of what was fetched: when ctx ends, a
// decoder that cannot hand over its record stops for good (it does not go on with the
// next one, which would arrive in the record's place), and the merger stops at the
// first decoder that has stopped. What was fetched but not handed over is not
// committed, and is redelivered.
//
// Each record takes its recordBytes from budget before it is handed to a decoder
// (waiting while the budget is spent); the checker or the writer gives them back when
// the batch holding the record is done with.
func (c *Consumer) fetchLoop(ctx context.Context, out chan<- record, budget *byteBudget) {
	n := c.cfg.Decoders
	ins := make([]chan kafkago.Message, n)
	outs := make([]chan record, n)
	var decoders sync.WaitGroup
	for i := range n {
		ins[i], outs[i] = make(chan kafkago.Message, 512), make(chan record, 512)
		decoders.Add(1)
		go func(in <-chan kafkago.Message, res chan<- record) {
			defer decoders.Done()
			defer close(res)
			for m := range in {
				// A frame without a timestamp gets the record's: the same on every redelivery.
				ev, err := schema.DecodeAt(m.Value, m.Time)
				select {
				case res <- record{msg: m, ev: ev, err: err}:
				case <-ctx.Done():
					return // the records after this one must not take its place
				}
			}
		}(ins[i], outs[i])
	}
	merged := make(chan struct{})
	go func() {
		defer close(merged)
		for i := 0; ; i++ {
			r, ok := <-outs[i%n]
			if !ok {
				return // that decoder stopped: record i is missing, so nothing after it may follow
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() {
		for _, in := range ins {
			close(in)
		}
		decoders.Wait()
		<-merged
	}()

	backoff := c.cfg.RetryMin
	var lastLog time.Time
	for i := 0; ; {
		m, err := c.cfg.Reader.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.m.FetchErrors.Inc()
			if time.Since(lastLog) > 10*time.Second {
				c.log.Warn("cannot fetch from kafka, retrying", "err", err, "backoff", backoff)
				lastLog = time.Now()
			}
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, c.cfg.RetryMax)
			continue
		}
		backoff = c.cfg.RetryMin
		if !budget.acquire(ctx, recordBytes(&m)) {
			return // like a record not handed over below: not committed, redelivered
		}
		select {
		case ins[i%n] <- m:
			i++
		case <-ctx.Done():
			return
		}
	}
}

// recordBytes is what a fetched record weighs against BatchBytes and MaxPendingBytes:
// its key, value and headers.
func recordBytes(m *kafkago.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// byteBudget is a byte-weighted semaphore: acquire waits until n bytes fit under the
// limit. A record larger than the whole limit is let through once nothing else is
// held, so that it cannot wait forever. One goroutine acquires (the fetch loop), two
// release (the checker, for a batch it gives up, and the writer).
type byteBudget struct {
	mu    sync.Mutex
	limit int
	used  int
	freed chan struct{} // closed, and replaced, by each release
}

func newByteBudget(limit int) *byteBudget {
	return &byteBudget{limit: limit, freed: make(chan struct{})}
}

// acquire takes n bytes, waiting for releases while they do not fit; it returns false
// if ctx ends first.
func (b *byteBudget) acquire(ctx context.Context, n int) bool {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return true
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return false
		}
	}
}

func (b *byteBudget) release(n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// held is the number of bytes acquired and not released.
func (b *byteBudget) held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// add enriches a decoded record and appends it to the pending batch.
func (c *Consumer) add(p *pending, r record) {
	m, ev, err := r.msg, r.ev, r.err
	rec := int32(len(p.msgs))
	p.msgs = append(p.msgs, m)
	c.m.Batching.Set(float64(len(p.msgs)))
	p.bytes += recordBytes(&m)
	if prev, ok := p.last[m.Partition]; !ok || m.Offset > prev.Offset {
		p.last[m.Partition] = m
	}
	now := c.now()
	c.sweep(now)
	if err != nil {
		c.deadLetter(p, rec, stageOf(err), err.Error())
		return
	}
	if schema.IsDirectoryType(ev.Type) {
		row, err := c.cfg.Directory.Apply(&ev)
		if err != nil {
			c.deadLetter(p, rec, "enrich", err.Error())
			return
		}
		p.batch.Directory = append(p.batch.Directory, row)
		p.dirRec = append(p.dirRec, rec)
		if row.Model != "" && c.unpriced.has(row.ID, now) {
			// unpriced knows the id, not whose usage it was: the reprice is of this
			// organization's agent, and reads only the usage that is that agent's.
			c.unpriced.remove(row.ID)
			p.repriceAgents = append(p.repriceAgents, AgentKey{OrgID: row.OrgID, AgentID: row.ID})
		}
	}
	if key := ev.Key(); ev.OrgID == "" && c.unknownParty(&ev) || p.parkedKeys[key] {
		// Its registration may be in this batch on another partition: decide at the end.
		p.parked = append(p.parked, parked{ev: ev, rec: rec})
		if p.parkedKeys == nil {
			p.parkedKeys = map[string]bool{}
		}
		p.parkedKeys[key] = true
		return
	}
	c.toRows(p, &ev, rec, now)
}

// warm gives the cause tracker what ingest stored within its horizon (WarmTracker)
// and stores the links it resolves. ClickHouse down is retried until ctx ends (false:
// stopped); a read it refuses for good is logged, and links are derived from what
// this process sees.
func (c *Consumer) warm(ctx context.Context) bool {
	if c.cfg.Causes == nil {
		return true
	}
	var messages int
	var res []cause.Resolution
	err := c.retry(ctx, "read the stored cause links", c.m.StoreErrors, store.Permanent, func() error {
		var err error
		messages, res, err = WarmTracker(ctx, c.tracker, c.cfg.Causes, c.now())
		return err
	})
	if errors.Is(err, errStopped) {
		return false
	}
	if err != nil {
		c.log.Error("cannot read the stored cause links; the triggers of executions started before this process are not inferred", "err", err)
		return true
	}
	c.log.Info("cause links warmed", "messages", messages, "resolved", len(res))
	if len(res) == 0 {
		return true
	}
	hours, ok := c.relink(ctx, res)
	if ok && c.cfg.AfterFlush != nil {
		c.cfg.AfterFlush(hours, nil)
	}
	return ok
}

// relink stores the links a late trigger resolved (relink), retried like a batch's
// insert. A rewrite ClickHouse refuses for good is logged and given up: those events
// keep their pending link. It returns false only if it was given up (shutdown).
func (c *Consumer) relink(ctx context.Context, res []cause.Resolution) ([]store.HourKey, bool) {
	var hours []store.HourKey
	err := c.retry(ctx, "store the links a late trigger resolved", c.m.StoreErrors, store.Permanent, func() error {
		var err error
		hours, err = relink(ctx, c.cfg.Causes, res, c.now())
		return err
	})
	if errors.Is(err, errStopped) {
		return nil, false
	}
	if err != nil {
		c.log.Error("cannot store the links a late trigger resolved; those events keep their pending link", "err", err, "events", len(res))
		return nil, true
	}
	c.m.Links.WithLabelValues("resolved").Add(float64(len(res)))
	return hours, true
}

// sweep forgets the parties and agents whose horizon has passed, and keeps the gauges
// of what is remembered current.
func (c *Consumer) sweep(now time.Time) {
	if n, ok := c.late.sweep(now); ok {
		c.m.Forgotten.WithLabelValues("late").Add(float64(n))
		c.m.Remembered.WithLabelValues("late").Set(float64(c.late.len()))
	}
	if n, ok := c.unpriced.sweep(now); ok {
		c.m.Forgotten.WithLabelValues("unpriced").Add(float64(n))
		c.m.Remembered.WithLabelValues("unpriced").Set(float64(c.unpriced.len()))
	}
}

// party is who an event is attributed through: its actor, or its subject when it has
// no actor (agent_rooms and room_participants frames).
func party(ev *schema.Event) schema.Party {
	if ev.Actor.ID == "" && ev.Subject != nil {
		return *ev.Subject
	}
	return ev.Actor
}

// unknownParty says whether the event's agent or person is not in the directory yet.
func (c *Consumer) unknownParty(ev *schema.Event) bool {
	p := party(ev)
	switch p.Type {
	case schema.ActorAgent:
		_, ok := c.cfg.Directory.Agent(p.ID)
		return !ok
	case schema.ActorUser:
		_, ok := c.cfg.Directory.Person(p.ID)
		return !ok
	}
	return false
}

// resolveParked turns the parked events into rows, with whatever the directory knows
// now that the whole batch has been read.
func (c *Consumer) resolveParked(p *pending) {
	now := c.now()
	c.reloadForParked(p, now)
	for i := range p.parked {
		c.toRows(p, &p.parked[i].ev, p.parked[i].rec, now)
	}
	p.parked, p.parkedKeys = nil, nil
}

// directoryReload is how often the directory is reloaded from ClickHouse
// (Config.ReloadDirectory) whatever the batches hold: an agent.updated (a new model or
// owner) is applied by the process that consumes it, and the others learn it so.
const directoryReload = 10 * time.Second

// reloadForParked reloads the directory from ClickHouse (Config.ReloadDirectory) when a
// parked event's party is still unknown, at most once a second, so that a party that
// never registers does not cost a reload per batch; and every directoryReload.
func (c *Consumer) reloadForParked(p *pending, now time.Time) {
	if c.cfg.ReloadDirectory == nil || now.Sub(c.reloaded) < time.Second {
		return
	}
	unknown := false
	for i := range p.parked {
		if c.unknownParty(&p.parked[i].ev) {
			unknown = true
			break
		}
	}
	if !unknown && now.Sub(c.reloaded) < directoryReload {
		return
	}
	c.reloaded = now
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := c.cfg.ReloadDirectory(ctx)
	if err != nil {
		c.log.Warn("cannot reload the directory from clickhouse; events of parties this process does not know are stored without organization", "err", err, "events", len(p.parked))
		return
	}
	c.cfg.Directory.Load(rows)
}

func (c *Consumer) toRows(p *pending, ev *schema.Event, rec int32, now time.Time) {
	envelopeOrg := ev.OrgID
	owner := Enrich(ev, c.cfg.Directory)
	var usage *store.UsageRow
	if ev.Type == schema.TypeUsageReported {
		// First: a record dead-lettered here has no rows, so nothing below may be noted
		// of it (an index into the events it will not be among, a party marked late).
		u, err := UsageRow(ev, owner, c.cfg.Directory, c.cfg.Catalog.Current())
		if err != nil {
			c.deadLetter(p, rec, "validate", err.Error())
			return
		}
		usage = &u
		if u.Model == Unknown {
			c.unpriced.mark(u.AgentID, now)
		}
		if !u.Priced {
			c.m.Unpriced.Inc()
		}
	}
	if o, ok := c.tracker.Observe(ev, nil); ok {
		c.m.Links.WithLabelValues(o.Link.Source()).Inc()
		if usage != nil {
			usage.Chain = ChainOf(o.Link)
		}
		p.batch.Causes = append(p.batch.Causes, causeRow(ev, o))
		p.causeRec = append(p.causeRec, rec)
		if o.Link.Pending {
			if p.pendingRows == nil {
				p.pendingRows = map[rowRef]pendingRow{}
			}
			at := pendingRow{cause: len(p.batch.Causes) - 1, usage: -1}
			if usage != nil {
				at.usage = len(p.batch.Usage) // appended below
			}
			p.pendingRows[rowRef{ev.OrgID, ev.ID}] = at
		}
		c.resolve(p, o.Resolved)
	}
	if usage != nil {
		p.batch.Usage = append(p.batch.Usage, *usage)
		p.usageRec = append(p.usageRec, rec)
	}
	pid := party(ev).ID
	if ev.OrgID == "" {
		c.m.Unattributed.Inc()
		c.late.mark(pid, now)
	} else if envelopeOrg == "" && c.late.has(pid, now) {
		// This party has rows stored without an organization; if this event is one of
		// them (a replay), it must keep org "" or it would be stored twice. The index is
		// of the event appended just below.
		p.recheck = append(p.recheck, len(p.batch.Events))
	}
	p.batch.Events = append(p.batch.Events, EventRow(ev, owner, int32(p.msgs[rec].Partition), p.msgs[rec].Offset))
	p.evRec = append(p.evRec, rec)
}

// resolve gives the rows of this batch that res resolves their link, and keeps the
// others for relink.
func (c *Consumer) resolve(p *pending, res []cause.Resolution) {
	for _, r := range res {
		at, ok := p.pendingRows[rowRef{r.OrgID, r.EventID}]
		if !ok {
			p.resolved = append(p.resolved, r)
			continue
		}
		delete(p.pendingRows, rowRef{r.OrgID, r.EventID})
		ch := ChainOf(r.Link)
		p.batch.Causes[at.cause].Chain = ch
		if at.usage >= 0 {
			p.batch.Usage[at.usage].Chain = ch
		}
		c.m.Links.WithLabelValues("resolved").Inc()
	}
}

// stageOf tells a record that is not JSON (or not an object) from one that is JSON but
// breaks the contract.
func stageOf(err error) string {
	var fe *schema.FieldError
	if errors.As(err, &fe) && fe.Field == "" && (strings.HasPrefix(fe.Reason, "invalid JSON") || strings.HasPrefix(fe.Reason, "expected a JSON object")) {
		return "decode"
	}
	return "validate"
}

// deadLetter adds the dead letter of record rec to the batch (the record has no other
// rows).
func (c *Consumer) deadLetter(p *pending, rec int32, stage, reason string) {
	dl, msg := c.newDeadLetter(p.msgs[rec], stage, reason)
	p.batch.DeadLetters = append(p.batch.DeadLetters, dl)
	p.dlq = append(p.dlq, msg)
	p.dlRec = append(p.dlRec, rec)
}

// newDeadLetter makes the row and the Kafka message of a dead letter. The reason is cut
// to MaxReasonBytes and the time is clamped into DateTime's range (a record's timestamp
// is whatever its producer set). A dead letter whose message would exceed
// DeadLetterMaxBytes carries only the start of its raw record, in the topic and in the
// table alike, marked: header bandplane-truncated (the full size), raw_truncated = 1;
// raw_bytes is always the full size.
func (c *Consumer) newDeadLetter(m kafkago.Message, stage, reason string) (store.DeadLetter, kafkago.Message) {
	topic := m.Topic
	if topic == "" {
		topic = c.cfg.Topic
	}
	reason = truncateUTF8(reason, MaxReasonBytes)
	key := m.Key
	if len(key) > maxDeadLetterKeyBytes {
		key = key[:maxDeadLetterKeyBytes]
	}
	msg := kafkago.Message{Key: key, Value: m.Value, Headers: []kafkago.Header{
		{Key: "bandplane-reason", Value: []byte(reason)},
		{Key: "bandplane-stage", Value: []byte(stage)},
		{Key: "bandplane-source", Value: fmt.Appendf(nil, "%s/%d/%d", topic, m.Partition, m.Offset)},
	}}
	dl := store.DeadLetter{
		Time: clampTime(m.Time), Topic: topic, Partition: int32(m.Partition), Offset: m.Offset,
		Key: string(key), Stage: stage, Reason: reason, RawBytes: uint64(len(m.Value)), ReceivedAt: c.now().UTC(),
	}
	if kafka.MessageSize(&msg) > c.cfg.DeadLetterMaxBytes {
		msg.Value = nil
		msg.Headers = append(msg.Headers, kafkago.Header{Key: "bandplane-truncated", Value: strconv.AppendInt(nil, int64(len(m.Value)), 10)})
		keep := max(c.cfg.DeadLetterMaxBytes-kafka.MessageSize(&msg), 0)
		msg.Value = []byte(truncateUTF8(string(m.Value), keep))
		dl.RawTruncated = true
		c.m.DeadLettersTruncated.Inc()
	}
	dl.Raw = string(msg.Value)
	return dl, msg
}

// truncateUTF8 cuts s to at most n bytes, backing off to the start of a UTF-8 sequence
// so that a valid string stays valid.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && cut > n-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if !utf8.RuneStart(s[cut]) { // not UTF-8 there at all: cut at the byte
		cut = n
	}
	return s[:cut]
}

// clampTime moves t into what a DateTime column holds.
func clampTime(t time.Time) time.Time {
	switch {
	case t.Before(schema.MinTime):
		return schema.MinTime
	case t.After(schema.MaxTime):
		return schema.MaxTime.Truncate(time.Second)
	}
	return t.UTC()
}

// errStopped says a write was given up because its context ended (the shutdown
// timeout): the batch is not committed and will be redelivered.
var errStopped = errors.New("stopped before the write succeeded")

// A batch is flushed in two steps (Run runs them for consecutive batches at once):
// check looks up which of its events are stored already (replays are not written
// again, reused ids are dead-lettered); store produces the dead letters to their
// topic, writes the batch to ClickHouse, splitting it until the records ClickHouse
// refuses are isolated and dead-lettered, and commits. Transient failures are retried with back-off until they
// succeed or ctx ends (shutdown timeout); the step then returns false, nothing is
// committed and the records are redelivered.
func (c *Consumer) check(ctx context.Context, p *pending) bool {
	start := time.Now()
	if len(p.batch.Events) > 0 && !c.checkStored(ctx, p) {
		return false
	}
	p.lookup = time.Since(start)
	return true
}

// store is the second step of a flush (see check).
func (c *Consumer) store(ctx context.Context, p *pending) bool {
	start := time.Now()
	if !c.produceDeadLetters(ctx, p.dlq) {
		return false
	}
	failed, ok := c.insert(ctx, p)
	if !ok {
		return false
	}
	insertDur := time.Since(start)
	if len(failed) > 0 && !c.storeRefused(ctx, p, failed) {
		return false
	}
	hours := append(usageHours(p.batch.Usage), p.replayHours...)
	var relinkDur time.Duration
	if len(p.resolved) > 0 && c.cfg.Causes != nil {
		began := time.Now()
		relinked, ok := c.relink(ctx, p.resolved)
		if !ok {
			return false
		}
		hours = append(hours, relinked...)
		relinkDur = time.Since(began)
	}
	if !c.note(ctx, p, failed) {
		return false
	}
	msgs := make([]kafkago.Message, 0, len(p.last))
	for _, m := range p.last {
		msgs = append(msgs, m)
	}
	if err := c.cfg.Reader.CommitMessages(ctx, msgs...); err != nil {
		// The rows are stored; a redelivery is recognised as a replay.
		c.m.CommitErrors.Inc()
		c.log.Warn("cannot commit offsets; records will be redelivered and deduplicated", "err", err, "records", len(p.msgs))
	}
	deadLetters := 0
	for _, dl := range p.batch.DeadLetters {
		c.m.DeadLetters.WithLabelValues(dl.Stage).Inc()
		deadLetters++
	}
	for _, f := range failed {
		if f.ownDeadLetter < 0 {
			c.m.DeadLetters.WithLabelValues("store").Inc()
			deadLetters++
		}
	}
	c.m.Records.WithLabelValues("dead_letter").Add(float64(deadLetters))
	c.m.Records.WithLabelValues("replayed").Add(float64(p.replays))
	c.stored.Add(float64(len(p.msgs) - deadLetters - p.replays))
	c.m.Batches.Inc()
	c.m.BatchRows.Observe(float64(len(p.msgs)))
	flushed := p.lookup + time.Since(start) // the two steps' time, not the wall time: they overlap
	c.m.FlushSeconds.Observe(flushed.Seconds())
	c.log.Debug("batch flushed", "records", len(p.msgs), "events", len(p.batch.Events), "dead_letters", deadLetters,
		"replays", p.replays, "usage", len(p.batch.Usage), "age_ms", time.Since(p.first).Milliseconds(), "flush_ms", flushed.Milliseconds(),
		"lookup_ms", p.lookup.Milliseconds(), "insert_ms", insertDur.Milliseconds(), "resolved", len(p.resolved), "relink_ms", relinkDur.Milliseconds())
	if c.cfg.AfterFlush != nil && (len(hours) > 0 || len(p.repriceAgents) > 0) {
		c.cfg.AfterFlush(hours, p.repriceAgents)
	}
	return true
}

// checkStored looks up, in one query, which of the batch's events are stored already
// under the same replacing key (organization, second, id), and:
//   - keeps the first attribution of a replayed event that was stored without an
//     organization (no organization, and the owner of a party ingest did not know), so
//     that it collapses with the stored row instead of being stored again under its
//     organization;
//   - drops the event row of a replay (same ContentDigest as the stored row): the
//     original keeps its ingested_at, owner and Kafka coordinates, and seals stay
//     valid; the record's usage and directory rows are still written (idempotent). A
//     stored copy that is the record's own is noted again (ownLeaf): its notes may
//     never have left (a crash between the insert and the notes; the sealer drops a
//     note it has). Any other copy with the same content is a replay of another
//     record (a platform resend), noted when it was stored, or an edit: not noted;
//   - dead-letters a record whose event reuses a stored id with other content: the
//     original is never replaced;
//   - within the batch, keeps one row of identical duplicates and dead-letters a later
//     event that reuses an earlier one's id with other content.
//
// It returns false only if the lookup was given up (shutdown). A lookup that
// ClickHouse refuses for good is logged and the batch is written unchecked, as before
// this check existed, rather than stalled.
func (c *Consumer) checkStored(ctx context.Context, p *pending) bool {
	ev := p.batch.Events
	c.recheckOthersLate(ctx, p)
	keys := make([]store.EventKey, 0, len(ev)+len(p.recheck))
	for i := range ev {
		keys = append(keys, store.KeyOf(&ev[i]))
	}
	for _, i := range p.recheck {
		k := store.KeyOf(&ev[i])
		k.OrgID = ""
		keys = append(keys, k)
	}
	stored, err := c.lookup(ctx, keys)
	if errors.Is(err, errStopped) {
		return false
	}
	if err != nil {
		c.m.LookupErrors.Inc()
		c.log.Error("cannot look up which events are stored; writing the batch unchecked", "err", err, "events", len(ev))
		return true
	}
	now := c.now()
	byKey := make(map[store.EventKey][]int, len(stored))
	for i := range stored {
		k := store.KeyOf(&stored[i])
		byKey[k] = append(byKey[k], i)
	}

	if len(p.recheck) > 0 && len(stored) > 0 {
		usageOf := make(map[int32]int, len(p.usageRec))
		for i, rec := range p.usageRec {
			usageOf[rec] = i
		}
		for _, i := range p.recheck {
			k := store.KeyOf(&ev[i])
			k.OrgID = ""
			rows := byKey[k]
			if len(rows) == 0 {
				continue
			}
			// The event row is not written again (it is a replay, or dead-lettered), only
			// compared with the stored copies to find the record's own (ownLeaf): it gets
			// the owner ingest stores while the party is unknown, as it was when the row
			// was stored without an organization, not the stored copy's, which may be an
			// edit. Its usage and cause rows are not written again either; the usage
			// row's organization is the stored one's, whose hour the rollups rebuild.
			ev[i].OrgID, ev[i].OwnerID = "", unknownPartyOwner(&ev[i])
			if u, ok := usageOf[p.evRec[i]]; ok {
				p.batch.Usage[u].OrgID = ""
			}
		}
	}

	// Record order decides which of two events with the same key is the later one;
	// parked events were appended after the others.
	order := make([]int, len(ev))
	for i := range order {
		order[i] = i
	}
	if !slices.IsSortedFunc(order, func(a, b int) int { return cmp.Compare(p.evRec[a], p.evRec[b]) }) {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(p.evRec[a], p.evRec[b]) })
	}
	drop := make([]bool, len(ev))
	reject := map[int32]string{}
	first := make(map[store.EventKey]int, len(ev))
	for _, i := range order {
		e := &ev[i]
		k := store.KeyOf(e)
		if rows := byKey[k]; len(rows) > 0 {
			d := e.ContentDigest()
			same := false
			for _, j := range rows {
				if stored[j].ContentDigest() == d {
					if l, ok := ownLeaf(e, &stored[j], p.msgs[p.evRec[i]].Time, now); ok {
						p.notes = append(p.notes, l)
					}
					same = true
				}
			}
			if same {
				drop[i] = true
				p.replays++
			} else {
				reject[p.evRec[i]] = fmt.Sprintf("%s: event %s of org %q at %s is already stored with other content; the stored event is kept",
					ReasonIDReused, e.ID, e.OrgID, e.Time.UTC().Format(time.RFC3339Nano))
			}
			continue
		}
		if j, ok := first[k]; ok {
			if ev[j].ContentDigest() == e.ContentDigest() {
				drop[i] = true
				p.replays++
			} else {
				reject[p.evRec[i]] = fmt.Sprintf("%s: event %s of org %q at %s comes earlier in the same batch with other content; the earlier event is kept",
					ReasonIDReused, e.ID, e.OrgID, e.Time.UTC().Format(time.RFC3339Nano))
			}
			continue
		}
		first[k] = i
	}
	if len(reject) == 0 && p.replays == 0 {
		return true
	}
	// A replay's usage and cause rows are not written again either: the stored ones
	// stand, with the link the event got when it first came (a replay, after a restart
	// or a rebalance, is linked with less of its room's history).
	replayed := make(map[int32]bool, p.replays)
	for i, d := range drop {
		if d {
			replayed[p.evRec[i]] = true
		}
	}
	p.batch.Events, p.evRec = compact(p.batch.Events, p.evRec, func(i int, rec int32) bool { return drop[i] || reject[rec] != "" })
	stale := func(_ int, rec int32) bool { return replayed[rec] || reject[rec] != "" }
	for i, rec := range p.usageRec {
		if replayed[rec] {
			p.replayHours = append(p.replayHours, usageHours(p.batch.Usage[i:i+1])...)
		}
	}
	p.batch.Usage, p.usageRec = compact(p.batch.Usage, p.usageRec, stale)
	p.batch.Causes, p.causeRec = compact(p.batch.Causes, p.causeRec, stale)
	if len(reject) > 0 {
		gone := func(_ int, rec int32) bool { return reject[rec] != "" }
		p.batch.Directory, p.dirRec = compact(p.batch.Directory, p.dirRec, gone)
		recs := make([]int32, 0, len(reject))
		for rec := range reject {
			recs = append(recs, rec)
		}
		slices.Sort(recs)
		for _, rec := range recs {
			c.m.IDReused.Inc()
			c.log.Warn("dead-lettering an event that reuses a stored id with other content", "reason", reject[rec],
				"partition", p.msgs[rec].Partition, "offset", p.msgs[rec].Offset)
			c.deadLetter(p, rec, "store", reject[rec])
		}
	}
	p.recheck = nil // indexes into the events before compaction
	return true
}

// recheckOthersLate adds to p's rechecks the attributed events of parties that another
// process (or this one, before it restarted) stored without an organization, as
// Config.Unattributed reads them now. A read that fails is logged, and the batch is
// checked with what this process knows.
func (c *Consumer) recheckOthersLate(ctx context.Context, p *pending) {
	if c.cfg.Unattributed == nil || len(p.batch.Events) == 0 {
		return
	}
	now := c.now()
	parties, err := c.cfg.Unattributed(ctx, now.Add(-c.cfg.LateHorizon))
	if err != nil {
		c.m.LookupErrors.Inc()
		c.log.Warn("cannot read the parties stored without an organization; checking the batch with what this process knows", "err", err)
		return
	}
	if len(parties) == 0 {
		return
	}
	// c.late belongs to the fetch loop (this runs in the checker): the read alone
	// decides, and it holds every party this process stored late too.
	has := make(map[int]bool, len(p.recheck))
	for _, i := range p.recheck {
		has[i] = true
	}
	for i := range p.batch.Events {
		e := &p.batch.Events[i]
		pid := e.ActorID
		if pid == "" {
			pid = e.SubjectID
		}
		if at, ok := parties[pid]; ok && e.OrgID != "" && !has[i] && now.Sub(at) < c.cfg.LateHorizon {
			p.recheck = append(p.recheck, i)
		}
	}
}

// lookup reads the stored rows of keys. A lookup of several keys that ClickHouse has
// not the memory for (store.MemoryLimit) is split in halves, each looked up the same
// way; a single key that still gets it is retried with back-off.
func (c *Consumer) lookup(ctx context.Context, keys []store.EventKey) ([]store.EventRow, error) {
	var stored []store.EventRow
	err := c.retry(ctx, "look up stored events", c.m.StoreErrors, func(err error) bool {
		return store.Permanent(err) || len(keys) > 1 && store.MemoryLimit(err)
	}, func() (err error) {
		stored, err = c.cfg.Storage.StoredEvents(ctx, keys)
		return err
	})
	if err == nil || errors.Is(err, errStopped) || store.Permanent(err) {
		return stored, err
	}
	c.m.StoreErrors.Inc()
	c.log.Warn("clickhouse has not the memory to look up the batch's events; splitting the lookup", "err", err, "keys", len(keys))
	mid := len(keys) / 2
	a, err := c.lookup(ctx, keys[:mid])
	if err != nil {
		return nil, err
	}
	b, err := c.lookup(ctx, keys[mid:])
	if err != nil {
		return nil, err
	}
	return append(a, b...), nil
}

// compact removes the rows (and their record indexes) for which gone is true.
func compact[T any](rows []T, recs []int32, gone func(i int, rec int32) bool) ([]T, []int32) {
	n := 0
	for i := range rows {
		if gone(i, recs[i]) {
			continue
		}
		rows[n], recs[n] = rows[i], recs[i]
		n++
	}
	return rows[:n], recs[:n]
}

// produceDeadLetters writes dead-letter messages to their topic. A refusal for size
// (each was sized to fit DeadLetterMaxBytes, so the topic's own limit must be lower:
// EnsureTopic raises it at start) is answered by sending them once more without their
// raw records; if even that is refused, they are in ClickHouse only, and logged.
func (c *Consumer) produceDeadLetters(ctx context.Context, msgs []kafkago.Message) bool {
	if len(msgs) == 0 {
		return true
	}
	err := c.retry(ctx, "produce dead letters", c.m.DLQErrors, kafka.IsMessageTooLarge, func() error { return c.cfg.DeadLetters.ProduceMessages(ctx, msgs) })
	if err == nil {
		return true
	}
	if errors.Is(err, errStopped) {
		return false
	}
	c.m.DLQErrors.Inc()
	c.log.Error("the dead-letter topic refuses dead letters for their size; sending them without their raw records", "err", err, "dead_letters", len(msgs))
	bare := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		bare[i] = kafkago.Message{Key: m.Key, Headers: append(slices.Clip(m.Headers),
			kafkago.Header{Key: "bandplane-truncated", Value: strconv.AppendInt(nil, int64(len(m.Value)), 10)})}
	}
	err = c.retry(ctx, "produce dead letters without raw records", c.m.DLQErrors, kafka.IsMessageTooLarge, func() error { return c.cfg.DeadLetters.ProduceMessages(ctx, bare) })
	if errors.Is(err, errStopped) {
		return false
	}
	if err != nil {
		c.m.DLQErrors.Inc()
		c.log.Error("cannot produce dead letters to their topic; they are stored in clickhouse only", "err", err, "dead_letters", len(msgs))
	}
	return true
}

// note produces the notes of what the batch stored, before its offsets are committed:
// a crash in between redelivers the batch, whose rows are then replays, noted again. A
// record ClickHouse refused may still have its event row stored (BatchInsert writes the
// events before the work-status tables and the dead letters): it is looked up, and a
// copy that is the record's own (ownLeaf) is noted too. It returns false only if it was
// given up (shutdown).
func (c *Consumer) note(ctx context.Context, p *pending, failed []refused) bool {
	if c.cfg.Notes == nil {
		return true
	}
	if len(failed) > 0 {
		mine := map[store.EventKey][]int{} // indexes into batch.Events
		var keys []store.EventKey
		refusedRec := map[int32]bool{}
		for _, f := range failed {
			refusedRec[f.rec] = true
		}
		for i, rec := range p.evRec {
			if refusedRec[rec] {
				k := store.KeyOf(&p.batch.Events[i])
				mine[k] = append(mine[k], i)
				keys = append(keys, k)
			}
		}
		if len(keys) > 0 {
			rows, err := c.lookup(ctx, keys)
			if errors.Is(err, errStopped) {
				return false
			}
			if err != nil {
				c.m.LookupErrors.Inc()
				c.log.Error("cannot look up whether refused records left event rows; those rows stay unsealed (audit verify reports them)", "err", err, "records", len(keys))
			}
			for i := range rows {
				now := c.now()
				for _, e := range mine[store.KeyOf(&rows[i])] {
					if l, ok := ownLeaf(&p.batch.Events[e], &rows[i], p.msgs[p.evRec[e]].Time, now); ok {
						p.notes = append(p.notes, l)
						break
					}
				}
			}
		}
	}
	if len(p.notes) == 0 {
		return true
	}
	err := c.retry(ctx, "produce the notes of stored events", c.m.NoteErrors, func(error) bool { return false }, func() error {
		return c.cfg.Notes.WriteNotes(ctx, p.notes)
	})
	return err == nil
}

// ownLeaf is the leaf of e, the row ingest writes for a record, as an earlier insert
// attempt of that record stored it, if r (a copy of e's key read back from ClickHouse)
// is that attempt's: its Kafka partition and offset are the record's, and its
// SealDigest (the content and owner_id) is e's. The leaf is built from e, never from
// r: ClickHouse is writable by the attacker, so only ingested_at, which ingest stamped
// at that attempt and cannot know otherwise, is taken from r. A copy with other
// coordinates or another owner is not the record's own: a replay of another record
// with the same content (a platform resend), noted when it was stored, or an edit.
//
// The ingested_at taken must lie where an attempt can have stamped it: not before the
// record's Kafka time, nor after now, each less or more ingestedSkew (clocks of broker
// and ingest differ). A copy stamped outside, say in the far future, is not noted, so
// an edit between the attempt and the replay cannot seal a date no reader expects; it
// stays unsealed and verify reports it.
func ownLeaf(e, r *store.EventRow, recorded, now time.Time) (tlog.Leaf, bool) {
	if r.Partition != e.Partition || r.Offset != e.Offset {
		return tlog.Leaf{}, false
	}
	if r.IngestedAt.Before(recorded.Add(-ingestedSkew)) || r.IngestedAt.After(now.Add(ingestedSkew)) {
		return tlog.Leaf{}, false
	}
	own := *e
	own.IngestedAt = r.IngestedAt
	l := tlog.LeafOf(&own)
	if r.SealDigest() != l.Digest {
		return tlog.Leaf{}, false
	}
	return l, true
}

// ingestedSkew is how far ownLeaf lets a stored ingested_at lie outside the span an
// insert attempt can have stamped it in.
const ingestedSkew = 10 * time.Minute

// noDirectory knows no party: Enrich with it attributes an event as ingest does while
// its party is not in the directory.
var noDirectory = directory.New()

// unknownPartyOwner is the owner ingest stores for the event of row e while its party
// is unknown (Enrich, from the row's actor and subject): the owner of a replay that was
// stored without an organization.
func unknownPartyOwner(e *store.EventRow) string {
	ev := schema.Event{Actor: schema.Party{ID: e.ActorID, Type: schema.ActorType(e.ActorType)}}
	if e.SubjectID != "" || e.SubjectType != "" {
		ev.Subject = &schema.Party{ID: e.SubjectID, Type: schema.ActorType(e.SubjectType)}
	}
	return Enrich(&ev, noDirectory)
}

// refused is a record that ClickHouse refuses on its own.
type refused struct {
	rec           int32
	err           error
	ownDeadLetter int // index into batch.DeadLetters when what is refused is the record's dead letter, else -1
}

// insert writes the batch. When ClickHouse refuses it for good (store.Permanent), the
// batch is bisected by record, and each half written the same way, until the records
// it refuses are isolated: k bad records among n cost about 2·k·log2(n) inserts, and
// everything else is stored. It returns the isolated records, or false if it was given
// up (shutdown). ingested_at and the usage versions are set at each attempt, so a batch
// that waited in retries gets the time it was written.
//
// A part of several records that ClickHouse has not the memory for
// (store.MemoryLimit) is halved the same way, but nothing is dead-lettered for it:
// each half is written, and halved again if need be. A single record that still gets
// it is retried with back-off, like any transient error.
//
// BatchInsert writes its tables in chains (store.BatchInsert says which wait for
// which), so an isolated record may have rows in the tables written before or beside
// the one that refused it (its directory row, its work-status rows, or its usage row
// when its event is refused); the dead letter says which table refused what.
func (c *Consumer) insert(ctx context.Context, p *pending) ([]refused, bool) {
	var out []refused
	all := [2]int32{0, int32(len(p.msgs))}
	spans := [][2]int32{all}
	for len(spans) > 0 {
		s := spans[len(spans)-1]
		spans = spans[:len(spans)-1]
		b := &p.batch
		if s != all {
			b = p.slice(s[0], s[1])
		}
		if len(b.Events)+len(b.Usage)+len(b.Directory)+len(b.DeadLetters)+len(b.Causes) == 0 {
			continue
		}
		splittable := s[1]-s[0] > 1
		err := c.retry(ctx, "insert batch into clickhouse", c.m.StoreErrors, func(err error) bool {
			return store.Permanent(err) || splittable && store.MemoryLimit(err)
		}, func() error {
			c.stamp(b)
			return c.cfg.Storage.BatchInsert(ctx, b)
		})
		if err == nil {
			for _, r := range b.Events {
				r.IngestedAt = b.IngestedAt
				p.notes = append(p.notes, tlog.LeafOf(&r))
			}
			continue
		}
		if errors.Is(err, errStopped) {
			return nil, false
		}
		mid := s[0] + (s[1]-s[0])/2
		if !store.Permanent(err) { // out of memory for this many records: no record is refused
			c.m.StoreErrors.Inc()
			if s == all {
				c.log.Warn("clickhouse has not the memory for the batch; splitting it (a lower batch size or batch bytes avoids this)",
					"err", err, "records", len(p.msgs), "bytes", p.bytes)
			}
			spans = append(spans, [2]int32{mid, s[1]}, [2]int32{s[0], mid})
			continue
		}
		c.m.InsertRejections.Inc()
		if s[1]-s[0] > 1 {
			if s == all {
				c.log.Warn("clickhouse refuses the batch; splitting it to isolate the records it refuses", "err", err, "records", len(p.msgs))
			}
			spans = append(spans, [2]int32{mid, s[1]}, [2]int32{s[0], mid}) // the first half first
			continue
		}
		r := refused{rec: s[0], err: err, ownDeadLetter: -1}
		for i, rec := range p.dlRec {
			if rec == s[0] {
				r.ownDeadLetter = i
			}
		}
		c.log.Warn("clickhouse refuses a record; dead-lettering it", "err", err,
			"partition", p.msgs[s[0]].Partition, "offset", p.msgs[s[0]].Offset)
		out = append(out, r)
	}
	return out, true
}

// stamp sets the write time of an insert attempt: ingested_at of the events (the
// sealer's watermark) and the usage versions (the rollup's catch-up after a crash
// looks for usage written after its last rebuild, Rollup.CatchUp).
func (c *Consumer) stamp(b *store.Batch) {
	now := c.now().UTC()
	b.IngestedAt = now // not on the rows: the checker may be reading them (Run)
	v := uint64(now.UnixNano())
	for i := range b.Usage {
		b.Usage[i].Version = v
	}
	for i := range b.Causes {
		b.Causes[i].Version = v
	}
}

// slice is the part of the batch made of records [lo, hi).
func (p *pending) slice(lo, hi int32) *store.Batch {
	in := func(rec int32) bool { return rec >= lo && rec < hi }
	b := &store.Batch{}
	for i, rec := range p.evRec {
		if in(rec) {
			b.Events = append(b.Events, p.batch.Events[i])
		}
	}
	for i, rec := range p.usageRec {
		if in(rec) {
			b.Usage = append(b.Usage, p.batch.Usage[i])
		}
	}
	for i, rec := range p.dirRec {
		if in(rec) {
			b.Directory = append(b.Directory, p.batch.Directory[i])
		}
	}
	for i, rec := range p.dlRec {
		if in(rec) {
			b.DeadLetters = append(b.DeadLetters, p.batch.DeadLetters[i])
		}
	}
	for i, rec := range p.causeRec {
		if in(rec) {
			b.Causes = append(b.Causes, p.batch.Causes[i])
		}
	}
	return b
}

// storeRefused dead-letters the records ClickHouse refuses (stage store, with
// ClickHouse's error as the reason): to the topic, then to the table. A record whose
// refused row was its own dead letter is stored again without its raw record. It
// returns false only if it was given up (shutdown).
func (c *Consumer) storeRefused(ctx context.Context, p *pending, failed []refused) bool {
	var fresh []store.DeadLetter
	var msgs []kafkago.Message
	for _, f := range failed {
		if f.ownDeadLetter >= 0 {
			continue
		}
		dl, msg := c.newDeadLetter(p.msgs[f.rec], "store", f.err.Error())
		fresh = append(fresh, dl)
		msgs = append(msgs, msg)
	}
	if !c.produceDeadLetters(ctx, msgs) {
		return false
	}
	if len(fresh) > 0 {
		// Out of memory for several of them, they are stored one by one.
		err := c.retry(ctx, "insert dead letters into clickhouse", c.m.StoreErrors, func(err error) bool {
			return store.Permanent(err) || len(fresh) > 1 && store.MemoryLimit(err)
		}, func() error {
			return c.cfg.Storage.BatchInsert(ctx, &store.Batch{DeadLetters: fresh})
		})
		if errors.Is(err, errStopped) {
			return false
		}
		if err != nil {
			for _, dl := range fresh {
				if !c.storeDeadLetter(ctx, dl, len(fresh) == 1, err) {
					return false
				}
			}
		}
	}
	for _, f := range failed {
		if f.ownDeadLetter >= 0 && !c.storeDeadLetter(ctx, p.batch.DeadLetters[f.ownDeadLetter], true, f.err) {
			return false
		}
	}
	return true
}

// storeDeadLetter stores one dead letter that ClickHouse refused together with others:
// alone (unless that was tried already), then without its raw record, and if even
// that is refused it is logged at error level and counted in
// bandplane_ingest_dropped_total. It returns false only if it was given up (shutdown).
func (c *Consumer) storeDeadLetter(ctx context.Context, dl store.DeadLetter, triedAlone bool, err error) bool {
	bare := dl
	bare.Raw, bare.RawTruncated = "", true
	tries := []store.DeadLetter{dl, bare}
	if triedAlone {
		tries = tries[1:]
	}
	for _, try := range tries {
		err = c.retry(ctx, "insert a dead letter into clickhouse", c.m.StoreErrors, store.Permanent, func() error {
			return c.cfg.Storage.BatchInsert(ctx, &store.Batch{DeadLetters: []store.DeadLetter{try}})
		})
		if err == nil {
			return true
		}
		if errors.Is(err, errStopped) {
			return false
		}
	}
	c.m.Dropped.Inc()
	c.log.Error("cannot store a dead letter, even without its raw record; it is dropped", "err", err, "topic", dl.Topic,
		"partition", dl.Partition, "offset", dl.Offset, "stage", dl.Stage, "reason", dl.Reason)
	return true
}

// usageHours lists the (organization, hour) keys of usage rows as they were stored:
// read after checkStored, which may have moved a replayed row back to org "".
func usageHours(rows []store.UsageRow) []store.HourKey {
	seen := map[store.HourKey]bool{}
	var out []store.HourKey
	for _, u := range rows {
		k := store.HourKey{OrgID: u.OrgID, Hour: u.Time.Truncate(time.Hour)}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// retry runs f until it succeeds, fails for good (permanent(err), then that error is
// returned at once), or ctx ends (errStopped). Other failures are retried with
// exponential back-off between RetryMin and RetryMax.
func (c *Consumer) retry(ctx context.Context, what string, failures prometheus.Counter, permanent func(error) bool, f func() error) error {
	backoff := c.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			if attempt > 1 {
				c.log.Info("recovered", "op", what, "attempts", attempt)
			}
			c.healthy.Store(true)
			return nil
		}
		if permanent != nil && permanent(err) && ctx.Err() == nil {
			c.healthy.Store(true) // the server answers; it is the data it refuses
			return err
		}
		c.healthy.Store(false)
		failures.Inc()
		if attempt == 1 || attempt%10 == 0 {
			c.log.Error("cannot "+what+", retrying", "err", err, "attempt", attempt, "backoff", backoff)
		}
		if !sleepCtx(ctx, backoff) {
			c.log.Error("gave up: "+what+"; the batch is not committed and will be redelivered", "err", err)
			return errStopped
		}
		backoff = min(backoff*2, c.cfg.RetryMax)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
