package querybench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/graph/wsclient"
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
	// closing is set when the benchmark closes the connections: errors after it are
	// its own doing.
	closing atomic.Bool
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

func parseTitle(title string) (seq int, produced int64, ok bool) {
	rest, found := strings.CutPrefix(title, titlePrefix)
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, " ")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.Atoi(a)
	p, err2 := strconv.ParseInt(b, 10, 64)
	return s, p, err1 == nil && err2 == nil && s >= 0
}

// LiveStats explain the subscriber figures.
type LiveStats struct {
	Subscribers int
	Produced    int
	Total       Dist // produce → each subscriber
	Produce     Dist // the producer's call (until Kafka acknowledged)
	Kafka       Dist // produce → the live reader hands it to the hub
	FanOut      Dist // the hub → each subscriber (gqlgen, WebSocket, client)
	Slow        int  // subscriptions ended with SLOW_SUBSCRIBER
	Broken      int  // ended otherwise (connection errors)
	Missing     int  // subscribers that missed at least one change
	Dropped     int
	Connect     time.Duration // dialling and subscribing every subscriber
	CPU         CPUUse        // while the changes were produced and received
}

// subscriber is one WebSocket connection with one workStatusChanged subscription.
type subscriber struct {
	conn     *wsclient.Conn
	ch       <-chan wsclient.Message
	got      []bool
	received atomic.Int64
	lat      []float64 // produce → receive, ms
	fan      []float64 // hub → receive, ms
	code     string    // the error code that ended it, if any (read after the reader ends)
	ended    atomic.Bool
}

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

	wsURL := "ws" + strings.TrimPrefix(url, "http")
	cfg.Progress("live: connecting %d WebSocket subscribers to workStatusChanged of org %s", cfg.Subscribers, t.Org)
	connectStart := time.Now()
	subs := make([]*subscriber, cfg.Subscribers)
	n := len(p.reached)
	var dialErr atomic.Value
	sem := make(chan struct{}, 32)
	var dials sync.WaitGroup
	for i := range subs {
		sem <- struct{}{}
		dials.Go(func() {
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			c, err := wsclient.Dial(dctx, wsURL, token)
			if err != nil {
				dialErr.CompareAndSwap(nil, fmt.Errorf("subscriber %d: %w", i, err))
				return
			}
			_, ch, err := c.Subscribe(dctx, workSubscription, map[string]any{"org": t.Org}, 64)
			if err != nil {
				_ = c.Close() // the subscribe error is the one reported
				dialErr.CompareAndSwap(nil, fmt.Errorf("subscriber %d: %w", i, err))
				return
			}
			subs[i] = &subscriber{conn: c, ch: ch, got: make([]bool, n), lat: make([]float64, 0, n), fan: make([]float64, 0, n)}
		})
	}
	dials.Wait()
	defer func() {
		for _, s := range subs {
			if s != nil {
				_ = s.conn.Close()
			}
		}
	}()
	if err, _ := dialErr.Load().(error); err != nil {
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

	var readers sync.WaitGroup
	for _, s := range subs {
		readers.Go(func() { s.read(p) })
	}

	count := min(int(cfg.Rate*cfg.LiveDuration.Seconds()), n)
	cfg.Progress("live: %d subscribers connected in %s; producing %d task changes at %g/s to %s",
		cfg.Subscribers, st.Connect.Round(time.Millisecond), count, cfg.Rate, cfg.Topic)
	cpu := sampleCPU()
	produceMs, err := p.produceChanges(ctx, producer, t, count, cfg.Rate)
	if err != nil {
		return st, err
	}
	st.Produced = len(produceMs)
	// Wait for every subscriber to have every change, or the grace period.
	graceEnd := time.Now().Add(cfg.Grace)
	for time.Now().Before(graceEnd) && !allReceived(subs, st.Produced) {
		time.Sleep(20 * time.Millisecond)
	}
	st.CPU = cpu.since()
	p.closing.Store(true)
	for _, s := range subs {
		_ = s.conn.Close()
	}
	readers.Wait()

	var all, fan []float64
	for _, s := range subs {
		all, fan = append(all, s.lat...), append(fan, s.fan...)
		switch {
		case s.code == "SLOW_SUBSCRIBER":
			st.Slow++
		case s.code != "":
			st.Broken++
		}
		missed := false
		for seq := range st.Produced {
			if !s.got[seq] {
				missed = true
				break
			}
		}
		if missed {
			st.Missing++
		}
		if s.code != "" || missed {
			st.Dropped++
		}
	}
	var kafkaMs []float64
	for seq := range st.Produced {
		if at := p.reached[seq].Load(); at != 0 {
			kafkaMs = append(kafkaMs, ms(time.Duration(at-p.produced[seq].Load())))
		}
	}
	st.Total, st.FanOut, st.Kafka, st.Produce = distOf(all), distOf(fan), distOf(kafkaMs), distOf(produceMs)
	delivered, dropped := p.hub.Stats()
	cfg.Progress("live: %d changes, hub delivered %d and dropped %d subscribers; %d messages received", st.Produced, delivered, dropped, len(all))
	return st, nil
}

// read receives s's messages until the subscription ends.
func (s *subscriber) read(p *livePipeline) {
	for m := range s.ch {
		now := time.Now().UnixNano()
		if m.Err != nil || len(m.Errors) > 0 {
			if !p.closing.Load() && s.code == "" {
				s.code = "BROKEN"
				if len(m.Errors) > 0 && m.Errors[0].Code() != "" {
					s.code = m.Errors[0].Code()
				}
				s.ended.Store(true)
			}
			continue
		}
		seq, produced, ok := titleOf(m.Data)
		if !ok || seq >= len(s.got) || s.got[seq] {
			continue
		}
		s.got[seq] = true
		s.received.Add(1)
		s.lat = append(s.lat, ms(time.Duration(now-produced)))
		if at := p.reached[seq].Load(); at != 0 {
			s.fan = append(s.fan, ms(time.Duration(now-at)))
		}
	}
}

// titleKey starts the title of a benchmark change in a message's data.
var titleKey = []byte(`"title":"` + titlePrefix)

// titleOf reads the sequence number and produce time from a message's data. It looks
// for the title in the JSON rather than decoding it: the subscribers share the two
// cores with the server they measure, so their side is kept lean (as bench policy's
// load generator), and gqlgen writes the title as is (digits and spaces need no
// escaping).
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
	return parseTitle(string(rest[:end]))
}

func allReceived(subs []*subscriber, n int) bool {
	for _, s := range subs {
		if !s.ended.Load() && int(s.received.Load()) < n {
			return false
		}
	}
	return true
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
