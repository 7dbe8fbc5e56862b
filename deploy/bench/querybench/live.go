package querybench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
)

const workSubscription = `subscription($org: ID) {
  workStatusChanged(orgId: $org) { kind roomId time eventId task { id title status assigneeId assigneeHandle } }
}`

// titlePrefix starts the title of every task the benchmark changes; the rest is the
// change's sequence number and the Unix nanoseconds it was handed to the producer.
const titlePrefix = "bench-query "

// liveTasks is how many tasks the changes cycle through.
const liveTasks = 20

// livePipeline is serve's live path: the live Kafka reader with its own directory,
// loaded from ClickHouse, publishing into the hub the GraphQL handler serves.
type livePipeline struct {
	hub  *graph.Hub
	live *ingest.Live
	// produced[seq] is when change seq was handed to the producer, reached[seq] when
	// the live reader handed it to the hub (Unix ns).
	produced, reached []atomic.Int64
}

func newLive(ctx context.Context, cfg *Config, conn driver.Conn, db string) (*livePipeline, error) {
	dir := directory.New()
	snapshot, err := store.New(conn, db).LoadDirectory(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot load the directory for the live reader: %w", err)
	}
	dir.Load(snapshot)
	n := int(cfg.Rate*cfg.LiveDuration.Seconds()) + 16
	p := &livePipeline{produced: make([]atomic.Int64, n), reached: make([]atomic.Int64, n)}
	p.hub = graph.NewHub(graph.HubConfig{Handles: dir, MaxSubscriptionsPerKey: cfg.Subscribers + 16,
		Logger: cfg.Logger.With("component", "hub")})
	p.live, err = ingest.NewLive(ingest.LiveConfig{Brokers: cfg.Brokers, Topic: cfg.Topic, Directory: dir, Logger: cfg.Logger,
		Publish: func(ev *schema.Event) {
			if seq, _, ok := changeOf(ev); ok && seq < len(p.reached) {
				p.reached[seq].Store(time.Now().UnixNano())
			}
			p.hub.Publish(ev)
		}})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// changeOf reads the sequence number and produce time of a benchmark change.
func changeOf(ev *schema.Event) (seq int, produced int64, ok bool) {
	if ev.Type != schema.TypeTaskUpdated {
		return 0, 0, false
	}
	var d schema.TaskData
	if json.Unmarshal(ev.Data, &d) != nil {
		return 0, 0, false
	}
	return parseTitle(d.Title)
}

// parseTitle reads a benchmark change's title: titlePrefix, the sequence number, a
// space and the produce time. It takes the bytes of a message as well as a decoded
// string, without allocating.
func parseTitle[T string | []byte](title T) (seq int, produced int64, ok bool) {
	if len(title) < len(titlePrefix) || string(title[:len(titlePrefix)]) != titlePrefix {
		return 0, 0, false
	}
	rest := title[len(titlePrefix):]
	s, n := leadingInt(rest)
	if n == 0 || n == len(rest) || rest[n] != ' ' {
		return 0, 0, false
	}
	rest = rest[n+1:]
	p, m := leadingInt(rest)
	if m == 0 || m != len(rest) {
		return 0, 0, false
	}
	return int(s), p, true
}

// leadingInt parses the decimal digits s starts with, returning how many it read (0
// when there are none or they overflow an int64).
func leadingInt[T string | []byte](s T) (v int64, n int) {
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		d := int64(s[n] - '0')
		if v > (math.MaxInt64-d)/10 {
			return 0, 0
		}
		v = v*10 + d
		n++
	}
	return v, n
}

// titleKey starts the title of a benchmark change in a message's data.
var titleKey = []byte(`"title":"` + titlePrefix)

// titleOf reads the sequence number and produce time from a message's data. It looks
// for the title in the JSON rather than decoding it: the subscribers' process reads
// as many messages as the server writes, on the same two cores, so its side is kept
// lean (as bench policy's load generator), and gqlgen writes the title as is (digits
// and spaces need no escaping).
func titleOf(data []byte) (seq int, produced int64, ok bool) {
	i := bytes.Index(data, titleKey)
	if i < 0 {
		return 0, 0, false
	}
	rest := data[i+len(titleKey)-len(titlePrefix):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return 0, 0, false
	}
	return parseTitle(rest[:end])
}

// LiveStats explain the subscriber figures.
type LiveStats struct {
	Subscribers int
	Produced    int
	Total       Dist // produce → each subscriber
	Produce     Dist // the producer's call (until Kafka acknowledged)
	Kafka       Dist // produce → the live reader hands it to the hub
	FanOut      Dist // the hub → each subscriber (gqlgen, WebSocket, the subscribers' process)
	Slow        int  // subscriptions ended with SLOW_SUBSCRIBER
	Broken      int  // ended otherwise (connection errors)
	Missing     int  // subscribers that missed at least one change
	Dropped     int
	Connect     time.Duration // starting the subscribers' process, dialling and subscribing every subscriber
	// CPU while the changes were produced and received: Self is this process (the
	// server, the live reader, the hub, the producer), Subscribers the subscribers'.
	CPU CPUUse
}

const (
	// subscriberDials is how many connections the subscribers' process dials at once;
	// the bench server lets twice that many upgrades of one address wait for their
	// init.
	subscriberDials = 64
	// subscriberBuffer is each subscription's channel in wsclient: the subscriber's
	// reader takes each message at once, the hub's buffer is the one that matters.
	subscriberBuffer = 16
)

// serverFiles is what the benchmark's process opens besides its WebSockets:
// ClickHouse and Kafka connections, the listener, pipes.
const serverFiles = 512

func (p *livePipeline) measure(ctx context.Context, cfg *Config, url, token string, producer *kafka.Producer, t Target) (LiveStats, error) {
	st := LiveStats{Subscribers: cfg.Subscribers}
	liveCtx, stop := context.WithCancel(ctx)
	positioned := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { _ = p.live.Run(liveCtx, positioned) })
	wg.Go(func() { p.hub.Run(liveCtx) })
	select {
	case <-positioned:
	case <-time.After(30 * time.Second):
		return st, fmt.Errorf("the live reader of topic %s is not positioned after 30 s", cfg.Topic)
	case <-ctx.Done():
		return st, ctx.Err()
	}

	n := len(p.reached)
	count := min(int(cfg.Rate*cfg.LiveDuration.Seconds()), n)
	tally := newTally(cfg.Subscribers, count, p.produced, p.reached)
	cfg.Progress("live: starting a process of %d WebSocket subscribers to workStatusChanged of org %s", cfg.Subscribers, t.Org)
	connectStart := time.Now()
	spec := SubscriberSpec{URL: "ws" + strings.TrimPrefix(url, "http"), Token: token, Org: t.Org,
		Subscribers: cfg.Subscribers, Dials: subscriberDials, Buffer: subscriberBuffer, CPUProfile: cfg.SubscriberCPUProfile}
	child, err := startSubscribers(ctx, cfg, spec, tally)
	if err != nil {
		return st, err
	}
	defer child.kill()
	// Dialling takes under a millisecond a subscriber on the 2-core machine: ten times
	// that and a minute leave room for a busy one.
	if err := child.waitReady(ctx, time.Minute+time.Duration(cfg.Subscribers)*10*time.Millisecond); err != nil {
		return st, err
	}
	// Subscribe returns once the request is written; the hub registers it a moment
	// later.
	deadline := time.Now().Add(30 * time.Second)
	for p.hub.Subscribers() < cfg.Subscribers {
		if time.Now().After(deadline) {
			return st, fmt.Errorf("only %d of %d subscriptions registered with the hub after 30 s", p.hub.Subscribers(), cfg.Subscribers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st.Connect = time.Since(connectStart)

	cfg.Progress("live: %d subscribers connected in %s (the subscriber process's pid %d); producing %d task changes at %g/s to %s",
		cfg.Subscribers, st.Connect.Round(time.Millisecond), child.pid(), count, cfg.Rate, cfg.Topic)
	cpu := sampleCPUWith(child.pid())
	produceMs, err := p.produceChanges(ctx, producer, t, count, cfg.Rate)
	if err != nil {
		return st, err
	}
	st.Produced = len(produceMs)
	// Wait for every subscriber to have every change, or the grace period.
	graceEnd := time.Now().Add(cfg.Grace)
	for time.Now().Before(graceEnd) && tally.settled.Load() < int64(cfg.Subscribers) && !child.exited() {
		time.Sleep(20 * time.Millisecond)
	}
	st.CPU = cpu.since()
	closing := time.Now()
	tally.closing.Store(closing.UnixNano())
	if err := child.stop(); err != nil {
		return st, err
	}
	cfg.Progress("live: the subscriber process closed its connections and ended in %s", time.Since(closing).Round(time.Millisecond))

	tally.stats(&st, st.Produced)
	var kafkaMs []float64
	for seq := range st.Produced {
		if at := p.reached[seq].Load(); at != 0 {
			kafkaMs = append(kafkaMs, ms(time.Duration(at-p.produced[seq].Load())))
		}
	}
	st.Kafka, st.Produce = distOf(kafkaMs), distOf(produceMs)
	delivered, dropped := p.hub.Stats()
	cfg.Progress("live: %d changes, hub delivered %d and dropped %d subscribers; %d messages received", st.Produced, delivered, dropped, len(tally.total))
	return st, nil
}

// produceChanges hands count task.updated events to the producer at rate, one at a
// time, each titled with its sequence number and the time it was handed over, and
// returns how long each call took (until Kafka acknowledged it).
func (p *livePipeline) produceChanges(ctx context.Context, producer *kafka.Producer, t Target, count int, rate float64) ([]float64, error) {
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	out := make([]float64, 0, count)
	for seq := range count {
		if d := time.Until(start.Add(time.Duration(seq) * interval)); d > 0 {
			select {
			case <-ctx.Done():
				return out, ctx.Err()
			case <-time.After(d):
			}
		}
		now := time.Now()
		data, _ := json.Marshal(schema.TaskData{TaskID: fmt.Sprintf("bench-query-task-%d", seq%liveTasks),
			Title: fmt.Sprintf("%s%d %d", titlePrefix, seq, now.UnixNano()), Status: "in_progress", Assignee: t.AgentID})
		ev := schema.Event{ID: schema.NewID(), Type: schema.TypeTaskUpdated, Time: now.UTC().Truncate(time.Millisecond),
			OrgID: t.Org, RoomID: t.Room, Actor: schema.Party{ID: t.AgentID, Type: schema.ActorAgent, Handle: t.AgentHandle},
			Source: "bench-query", SchemaVersion: schema.Version, Data: data}
		p.produced[seq].Store(now.UnixNano())
		if err := producer.Produce(ctx, []schema.Event{ev}); err != nil {
			return out, err
		}
		out = append(out, ms(time.Since(now)))
	}
	return out, nil
}
