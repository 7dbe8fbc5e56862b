// Package ingest turns the event stream into the audit trail: it consumes the events
// topic as a consumer group, decodes and validates each record (platform frame or
// canonical event), enriches it from the directory and the price catalog, writes
// batches to ClickHouse and only then commits offsets. Records it cannot use go to the
// dead-letter topic and table with the reason. Delivery is at-least-once; the event id
// makes it effectively-once in everything queries read.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/ingest/pricing"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
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

// Storage writes a batch durably: BatchInsert returns nil only once every row is
// acknowledged by ClickHouse. It must be idempotent, because a failed batch is retried
// whole and a replayed record is written again.
type Storage interface {
	BatchInsert(ctx context.Context, b *store.Batch) error
	// UnattributedIDs returns which of ids are stored without an organization.
	UnattributedIDs(ctx context.Context, ids []string) (map[string]bool, error)
}

// Config configures a Consumer.
type Config struct {
	Reader      MessageReader
	DeadLetters MessageWriter // the dead-letter topic
	Storage     Storage
	Directory   *Directory
	Catalog     *pricing.Catalog
	Topic       string // the source topic, recorded with dead letters

	Decoders        int           // goroutines decoding records (default GOMAXPROCS)
	BatchSize       int           // flush when this many records are pending
	BatchAge        time.Duration // or when the oldest pending record is this old
	RetryMin        time.Duration // first back-off after a failed write
	RetryMax        time.Duration
	ShutdownTimeout time.Duration // how long a graceful stop may take to flush and commit

	// LateParties are the agents and people that already have events stored without an
	// organization (store.UnattributedParties), read at start.
	LateParties []string
	// UnpricedAgents are the agents with usage stored unpriced for want of a model
	// (store.UnpricedAgents), read at start; their registration triggers a reprice.
	UnpricedAgents []string

	// AfterFlush, if set, is called after each committed batch with the hours of usage
	// it touched and the agents whose unpriced usage may now be priced (their
	// registration arrived). The rollup worker uses it.
	AfterFlush func(hours []store.HourKey, repriceAgents []string)

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
	return errors.Join(errs...)
}

// Consumer is the ingest pipeline of one process.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	m       *Metrics
	healthy atomic.Bool // false while ClickHouse or the dead-letter topic refuses writes
	// agents seen with usage that could not be priced because no model was known.
	unpricedAgents map[string]bool
	// parties (agents, people) with events stored without an organization.
	// unpricedAgents and late are owned by the Run goroutine (add, toRows).
	late   map[string]bool
	stored prometheus.Counter // m.Records{result="stored"}, looked up once
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
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	c := &Consumer{cfg: cfg, log: cfg.Logger.With("component", "ingest"), m: cfg.Metrics, unpricedAgents: map[string]bool{},
		late: map[string]bool{}}
	for _, id := range cfg.LateParties {
		c.late[id] = true
	}
	for _, id := range cfg.UnpricedAgents {
		c.unpricedAgents[id] = true
	}
	c.stored = c.m.Records.WithLabelValues("stored")
	c.healthy.Store(true)
	return c, nil
}

// Healthy reports whether the last write to ClickHouse and the dead-letter topic
// succeeded (readiness).
func (c *Consumer) Healthy() bool { return c.healthy.Load() }

// pending is a batch being built: the rows and the messages they came from.
type pending struct {
	batch         store.Batch
	last          map[int]kafkago.Message // highest message per partition, for the commit
	records       int
	dlq           []kafkago.Message
	repriceAgents []string
	parked        []parked
	recheck       []int // indexes into batch.Events of late-attributed events
	first         time.Time
}

type parked struct {
	ev  schema.Event
	msg kafkago.Message
}

func newPending(size int) *pending {
	return &pending{last: map[int]kafkago.Message{}, batch: store.Batch{Events: make([]store.EventRow, 0, size)}}
}

// Run consumes until ctx ends, then flushes what it has fetched, commits, and returns
// nil. It returns an error only if it cannot start. A record is committed only after it
// (or its dead letter) is in ClickHouse.
func (c *Consumer) Run(ctx context.Context) error {
	fetched := make(chan record, c.cfg.BatchSize)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.fetchLoop(ctx, fetched)
	}()

	// One flusher writes batches in order while the next one is being built.
	flushes := make(chan *pending, 1)
	flusherDone := make(chan struct{})
	// The flusher outlives ctx by ShutdownTimeout so that a graceful stop can finish.
	flushCtx, cancelFlush := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFlush()
	go func() {
		defer close(flusherDone)
		for p := range flushes {
			c.flush(flushCtx, p)
		}
	}()

	p := newPending(c.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// handOff passes the pending batch to the flusher. While the flusher is still
	// retrying the previous batch (ClickHouse down) this blocks, which stops fetching:
	// back-pressure instead of unbounded memory. A stop request ends the wait and the
	// batch is flushed by the shutdown path below.
	handOff := func(stopping <-chan struct{}) {
		timer.Stop()
		if p.records == 0 {
			return
		}
		c.resolveParked(p)
		select {
		case flushes <- p:
			p = newPending(c.cfg.BatchSize)
		case <-stopping:
		}
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case m := <-fetched:
			if p.records == 0 {
				p.first = time.Now()
				timer.Reset(c.cfg.BatchAge)
			}
			c.add(p, m)
			if p.records >= c.cfg.BatchSize {
				handOff(ctx.Done())
			}
		case <-timer.C:
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
	c.log.Info("stopping: flushing and committing", "pending_records", p.records)
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
// once every goroutine it started has stopped; what was fetched but not handed over
// when ctx ends is simply not committed, and is redelivered.
func (c *Consumer) fetchLoop(ctx context.Context, out chan<- record) {
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
				return
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
		select {
		case ins[i%n] <- m:
			i++
		case <-ctx.Done():
			return
		}
	}
}

// add enriches a decoded record and appends it to the pending batch.
func (c *Consumer) add(p *pending, r record) {
	m, ev, err := r.msg, r.ev, r.err
	p.records++
	if prev, ok := p.last[m.Partition]; !ok || m.Offset > prev.Offset {
		p.last[m.Partition] = m
	}
	if err != nil {
		c.deadLetter(p, m, stageOf(err), err.Error())
		return
	}
	if IsDirectoryEvent(ev.Type) {
		row, err := c.cfg.Directory.Apply(&ev)
		if err != nil {
			c.deadLetter(p, m, "enrich", err.Error())
			return
		}
		p.batch.Directory = append(p.batch.Directory, row)
		if c.unpricedAgents[row.ID] && row.Model != "" {
			delete(c.unpricedAgents, row.ID)
			p.repriceAgents = append(p.repriceAgents, row.ID)
		}
	}
	if ev.OrgID == "" && c.unknownParty(&ev) {
		// Its registration may be in this batch on another partition: decide at the end.
		p.parked = append(p.parked, parked{ev: ev, msg: m})
		return
	}
	c.toRows(p, &ev, m)
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
	for i := range p.parked {
		c.toRows(p, &p.parked[i].ev, p.parked[i].msg)
	}
	p.parked = nil
}

func (c *Consumer) toRows(p *pending, ev *schema.Event, m kafkago.Message) {
	envelopeOrg := ev.OrgID
	owner := Enrich(ev, c.cfg.Directory)
	if ev.OrgID == "" {
		c.m.Unattributed.Inc()
		c.late[party(ev).ID] = true
	} else if envelopeOrg == "" && c.late[party(ev).ID] {
		// This party has rows stored without an organization; if this event is one of
		// them (a replay), it must keep org "" or it would be stored twice.
		p.recheck = append(p.recheck, len(p.batch.Events))
	}
	if ev.Type == schema.TypeUsageReported {
		u, err := UsageRow(ev, owner, c.cfg.Directory, c.cfg.Catalog)
		if err != nil {
			c.deadLetter(p, m, "validate", err.Error())
			return
		}
		if u.Model == Unknown {
			c.unpricedAgents[u.AgentID] = true
		}
		if !u.Priced {
			c.m.Unpriced.Inc()
		}
		p.batch.Usage = append(p.batch.Usage, u)
	}
	p.batch.Events = append(p.batch.Events, EventRow(ev, owner, int32(m.Partition), m.Offset))
	c.stored.Inc()
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

func (c *Consumer) deadLetter(p *pending, m kafkago.Message, stage, reason string) {
	c.m.Records.WithLabelValues("dead_letter").Inc()
	c.m.DeadLetters.WithLabelValues(stage).Inc()
	topic := m.Topic
	if topic == "" {
		topic = c.cfg.Topic
	}
	p.batch.DeadLetters = append(p.batch.DeadLetters, store.DeadLetter{
		Time: m.Time.UTC(), Topic: topic, Partition: int32(m.Partition), Offset: m.Offset,
		Key: string(m.Key), Raw: string(m.Value), Stage: stage, Reason: reason, ReceivedAt: time.Now().UTC(),
	})
	p.dlq = append(p.dlq, kafkago.Message{Key: m.Key, Value: m.Value, Headers: []kafkago.Header{
		{Key: "bandplane-reason", Value: []byte(reason)},
		{Key: "bandplane-stage", Value: []byte(stage)},
		{Key: "bandplane-source", Value: fmt.Appendf(nil, "%s/%d/%d", topic, m.Partition, m.Offset)},
	}})
}

// keepFirstAttribution resets to "" the organization of rechecked events that are
// already stored without one. The dedupe key (org, time, id) must not change between
// an event's first ingest and a replay; attributing old unattributed rows is a
// separate, explicit repair.
func (c *Consumer) keepFirstAttribution(ctx context.Context, p *pending) error {
	ids := make([]string, len(p.recheck))
	for i, idx := range p.recheck {
		ids[i] = p.batch.Events[idx].ID
	}
	stored, err := c.cfg.Storage.UnattributedIDs(ctx, ids)
	if err != nil {
		return err
	}
	if len(stored) == 0 {
		return nil
	}
	for _, idx := range p.recheck {
		if e := &p.batch.Events[idx]; stored[e.ID] {
			e.OrgID = ""
		}
	}
	for i := range p.batch.Usage {
		if u := &p.batch.Usage[i]; stored[u.EventID] {
			u.OrgID = ""
		}
	}
	return nil
}

// flush writes the dead letters to their topic, the batch to ClickHouse, and commits.
// Writes are retried with back-off until they succeed or ctx ends (shutdown timeout);
// in the latter case nothing is committed and the records are redelivered.
func (c *Consumer) flush(ctx context.Context, p *pending) {
	start := time.Now()
	if !c.retry(ctx, "produce dead letters", c.m.DLQErrors, func() error { return c.cfg.DeadLetters.ProduceMessages(ctx, p.dlq) }) {
		return
	}
	if len(p.recheck) > 0 && !c.retry(ctx, "look up unattributed events", c.m.StoreErrors, func() error { return c.keepFirstAttribution(ctx, p) }) {
		return
	}
	if !c.retry(ctx, "insert batch into clickhouse", c.m.StoreErrors, func() error {
		// Usage versions are the write time: the rollup's catch-up after a crash looks
		// for usage written after its last rebuild (Rollup.CatchUp).
		v := uint64(time.Now().UnixNano())
		for i := range p.batch.Usage {
			p.batch.Usage[i].Version = v
		}
		return c.cfg.Storage.BatchInsert(ctx, &p.batch)
	}) {
		return
	}
	msgs := make([]kafkago.Message, 0, len(p.last))
	for _, m := range p.last {
		msgs = append(msgs, m)
	}
	if err := c.cfg.Reader.CommitMessages(ctx, msgs...); err != nil {
		// The rows are stored; a redelivery is deduplicated by event id.
		c.m.CommitErrors.Inc()
		c.log.Warn("cannot commit offsets; records will be redelivered and deduplicated", "err", err, "records", p.records)
	}
	c.m.Batches.Inc()
	c.m.BatchRows.Observe(float64(p.records))
	c.m.FlushSeconds.Observe(time.Since(start).Seconds())
	c.log.Debug("batch flushed", "records", p.records, "events", len(p.batch.Events), "dead_letters", len(p.batch.DeadLetters),
		"usage", len(p.batch.Usage), "age_ms", time.Since(p.first).Milliseconds(), "flush_ms", time.Since(start).Milliseconds())
	if c.cfg.AfterFlush != nil && (len(p.batch.Usage) > 0 || len(p.repriceAgents) > 0) {
		c.cfg.AfterFlush(usageHours(p.batch.Usage), p.repriceAgents)
	}
}

// usageHours lists the (organization, hour) keys of usage rows as they were stored:
// read after keepFirstAttribution, which may have moved a replayed row back to org "".
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

func (c *Consumer) retry(ctx context.Context, what string, failures prometheus.Counter, f func() error) bool {
	backoff := c.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			if attempt > 1 {
				c.log.Info("recovered", "op", what, "attempts", attempt)
			}
			c.healthy.Store(true)
			return true
		}
		c.healthy.Store(false)
		failures.Inc()
		if attempt == 1 || attempt%10 == 0 {
			c.log.Error("cannot "+what+", retrying", "err", err, "attempt", attempt, "backoff", backoff)
		}
		if !sleepCtx(ctx, backoff) {
			c.log.Error("gave up: "+what+"; the batch is not committed and will be redelivered", "err", err)
			return false
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
