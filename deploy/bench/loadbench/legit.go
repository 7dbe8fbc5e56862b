package loadbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/schema"
)

// The legitimate load, per second, and how many requests of each figure may be in
// flight at once. It is a tenant's steady use, not a stress: on the 2-core machine the
// server idles through most of it alone, so that what the attack adds shows. The
// collector's two stay within serve's --max-uploads-per-key, each read's within
// --graphql-max-concurrent-per-key.
const (
	collectorRate    = 10
	collectorWorkers = 2
	collectorEvents  = 20
	costsRate        = 4
	costsWorkers     = 2
	auditRate        = 4
	auditWorkers     = 2
	policyRate       = 50
	policyWorkers    = 4
	// changeRate task changes a second are produced to Kafka, each read by every
	// subscriber.
	changeRate = 5
	// subscriberDials connect at once: under serve's 16 upgrades of one address waiting
	// for their init.
	subscriberDials = 8
	// deliveryGrace is how long after a phase's last change its subscribers may take
	// before what they have not read counts as refused.
	deliveryGrace = 5 * time.Second
	// hostileLead is how long the hostile clients run before the legitimate ones
	// start: the attack is in place when they arrive.
	hostileLead = time.Second
	// requestTimeout ends a legitimate request the server does not answer (it counts
	// as refused); the server's own query deadline is 10 s.
	requestTimeout = 20 * time.Second
)

// bench runs the phases over one stack.
type bench struct {
	cfg     *Config
	st      *stack
	wsURL   string
	clients map[string]*http.Client
	// measuring is the phase whose window is open; nil while warming up and between
	// phases. A request is counted in the phase of its start.
	measuring atomic.Pointer[phase]
	changes   *changeLog
	posts     atomic.Int64 // collector posts, for their events' ids
}

func newBench(cfg *Config, st *stack) *bench {
	b := &bench{cfg: cfg, st: st, wsURL: "ws" + strings.TrimPrefix(st.url, "http") + "/graphql", clients: map[string]*http.Client{},
		changes: newChangeLog(2*int(changeRate*cfg.Duration.Seconds()) + 64)}
	for k, n := range map[string]int{KindCollector: collectorWorkers, KindCosts: costsWorkers, KindAudit: auditWorkers, KindPolicy: policyWorkers} {
		b.clients[k] = &http.Client{Timeout: requestTimeout,
			Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true, IdleConnTimeout: time.Minute}}
	}
	return b
}

func (b *bench) close() {
	for _, c := range b.clients {
		c.CloseIdleConnections()
	}
}

// phaseResult is what one phase measured.
type phaseResult struct {
	samples *phase
	cpu     cpuUse
	hostile HostileStats
	ends    map[string]int
	changes int
}

// phase runs one round of a phase, its samples going to p: the hostile clients (none
// alone), then the legitimate ones, the subscribers connecting, the warm-up, and the
// measured window (Config.Duration over Config.Rounds).
func (b *bench) phase(ctx context.Context, p *phase, r int, hostile []string) (res phaseResult, err error) {
	res.samples = p
	name := fmt.Sprintf("%s %d/%d", p.name, r+1, b.cfg.Rounds)
	window := b.cfg.Duration / time.Duration(b.cfg.Rounds)
	hostilePID := 0
	if len(hostile) > 0 {
		h, err := startHostileProcess(b.cfg, b.st, hostile)
		if err != nil {
			return res, err
		}
		hostilePID = h.pid()
		b.cfg.Progress("%s: the hostile clients (%s) run from 127.0.0.2 in a process of their own (pid %d)", name, strings.Join(hostile, ", "), hostilePID)
		defer func() {
			var herr error
			if res.hostile, herr = h.stop(); err == nil {
				err = herr
			}
		}()
		if err := sleep(ctx, hostileLead); err != nil {
			return res, err
		}
		if !h.alive() {
			_, herr := h.stop()
			if herr == nil {
				herr = errors.New("it exited")
			}
			return res, fmt.Errorf("the hostile process ended before the attack: %w", herr)
		}
	}
	stopLegit := b.startLegit(ctx)
	defer stopLegit()
	subs := b.connect(ctx, p)
	defer func() { res.ends = subs.close() }()
	b.cfg.Progress("%s: %d of %d subscribers connected; %s warm-up, then %s measured", name, subs.n(), b.cfg.Subscribers, b.cfg.Warmup, window)
	if err := sleep(ctx, b.cfg.Warmup); err != nil {
		return res, err
	}
	cpu := sampleCPU(b.st.pid(), hostilePID)
	b.measuring.Store(p)
	first := b.changes.len()
	err = b.produceChanges(ctx, p, window)
	b.measuring.Store(nil)
	res.cpu = cpu.cores()
	last := b.changes.len()
	res.changes = last - first
	if err != nil {
		return res, err
	}
	stopLegit()
	subs.settle(b.changes, first, last, deliveryGrace)
	if missing := b.changes.missing(first, last, subs.n()); missing > 0 {
		p.kinds[KindDelivery].refuse("not delivered", fmt.Sprintf("%d subscriber deliveries of %d changes not read %s after the phase", missing, last-first, deliveryGrace), missing)
	}
	b.st.saveMetrics(ctx, fmt.Sprintf("%s-%d", p.name, r+1))
	if !b.st.alive() {
		return res, fmt.Errorf("serve exited during the %s phase (%s); its output:\n%s", name, b.st.exitStatus(), b.st.logTail(4000))
	}
	b.cfg.Progress("%s: done (cores: serve %.2f, the legitimate clients %.2f, the hostile ones %.2f, the machine %.2f)",
		name, res.cpu.server, res.cpu.self, res.cpu.hostile, res.cpu.machine)
	return res, nil
}

// combine sums the rounds of one phase: counts add up, CPU figures are the rounds'
// mean (each round measures a window of the same length).
func combine(rounds []phaseResult) phaseResult {
	out := phaseResult{ends: map[string]int{}}
	if len(rounds) == 0 {
		return out
	}
	n := float64(len(rounds))
	for _, r := range rounds {
		out.samples = r.samples
		out.cpu.server += r.cpu.server / n
		out.cpu.hostile += r.cpu.hostile / n
		out.cpu.self += r.cpu.self / n
		out.cpu.machine += r.cpu.machine / n
		out.hostile = out.hostile.add(r.hostile)
		for reason, k := range r.ends {
			out.ends[reason] += k
		}
		out.changes += r.changes
	}
	out.hostile.KeylessPerS = round(out.hostile.KeylessPerS/n, 1)
	out.cpu = cpuUse{server: round(out.cpu.server, 2), hostile: round(out.cpu.hostile, 2), self: round(out.cpu.self, 2), machine: round(out.cpu.machine, 2)}
	return out
}

// loop is one paced legitimate figure.
type loop struct {
	kind    string
	rate    float64
	workers int
	do      func(ctx context.Context, i int) error
}

// startLegit runs the paced legitimate requests until stop is called. A tick that
// finds every client of its figure busy is skipped (and counted): a slow server shows
// in the latencies, not in a queue of the client's. stop lets the requests in flight
// finish: they were started in a phase and are counted in it. It may be called more
// than once.
func (b *bench) startLegit(ctx context.Context) (stop func()) {
	loops := []loop{
		{KindCollector, collectorRate, collectorWorkers, b.collectorPost},
		{KindCosts, costsRate, costsWorkers, b.costsQuery},
		{KindAudit, auditRate, auditWorkers, b.auditPage},
		{KindPolicy, policyRate, policyWorkers, b.decide},
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range loops {
		work := make(chan int)
		for range l.workers {
			wg.Go(func() {
				for i := range work {
					b.timed(l.kind, func() error { return l.do(ctx, i) })
				}
			})
		}
		wg.Go(func() {
			defer close(work)
			t := time.NewTicker(time.Duration(float64(time.Second) / l.rate))
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case <-t.C:
				}
				select {
				case work <- i:
				default:
					if p := b.measuring.Load(); p != nil {
						p.kinds[l.kind].skip()
					}
				}
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// timed runs one legitimate request and counts it in the phase measured when it
// started, if any.
func (b *bench) timed(kind string, do func() error) {
	p := b.measuring.Load()
	start := time.Now()
	err := do()
	took := time.Since(start)
	if p == nil {
		return
	}
	if err != nil {
		r := asRefusal(err)
		p.kinds[kind].refuse(r.reason, r.detail, 1)
		return
	}
	p.kinds[kind].ok(took)
}

func (b *bench) collectorPost(ctx context.Context, _ int) error {
	n := b.posts.Add(1)
	now := time.Now()
	evs := make([]schema.Event, collectorEvents)
	for i := range evs {
		evs[i] = activityA(fmt.Sprintf("bench-load-a-live-%d-%d", n, i), i, now)
	}
	return postEvents(ctx, b.clients[KindCollector], b.st.url, b.st.tokens.aIngest, ndjson(evs), len(evs))
}

func (b *bench) costsQuery(ctx context.Context, _ int) error {
	from, to := costWindow(time.Now())
	var d costsData
	if err := postGraphQL(ctx, b.clients[KindCosts], b.st.url, b.st.tokens.aViewer, costsQuery, map[string]any{"from": from, "to": to}, &d); err != nil {
		return err
	}
	if len(d.Costs.Rows) == 0 {
		return &refusal{reason: "empty answer", detail: "costs returned no rows"}
	}
	return nil
}

func (b *bench) auditPage(ctx context.Context, _ int) error {
	var d auditData
	if err := postGraphQL(ctx, b.clients[KindAudit], b.st.url, b.st.tokens.aCompliance, auditQuery, nil, &d); err != nil {
		return err
	}
	if len(d.AuditEvents.Events) == 0 {
		return &refusal{reason: "empty answer", detail: "auditEvents returned no events"}
	}
	return nil
}

func (b *bench) decide(ctx context.Context, i int) error {
	return postDecision(ctx, b.clients[KindPolicy], b.st.url, b.st.tokens.router, decisionBody(i))
}

// changeLog is every task change the run produced: when, in which measured phase (nil
// outside one), and how many subscribers read it.
type changeLog struct {
	items []change
	next  atomic.Int64
}

type change struct {
	produced atomic.Int64 // Unix ns, just before it was handed to the producer
	phase    atomic.Pointer[phase]
	received atomic.Int32
}

func newChangeLog(n int) *changeLog { return &changeLog{items: make([]change, n)} }

func (l *changeLog) len() int { return int(l.next.Load()) }

// add takes the next change's number, -1 when the log is full.
func (l *changeLog) add(p *phase, at time.Time) int {
	seq := int(l.next.Load())
	if seq >= len(l.items) {
		return -1
	}
	c := &l.items[seq]
	c.produced.Store(at.UnixNano())
	c.phase.Store(p)
	l.next.Store(int64(seq + 1))
	return seq
}

// deliver counts change seq read by a subscriber at at, timing it in its phase.
func (l *changeLog) deliver(seq int, at time.Time) {
	if seq < 0 || seq >= l.len() {
		return
	}
	c := &l.items[seq]
	c.received.Add(1)
	if p := c.phase.Load(); p != nil {
		p.kinds[KindDelivery].ok(time.Duration(at.UnixNano() - c.produced.Load()))
	}
}

// missing is how many of n subscribers' reads of changes [first, last) never came.
func (l *changeLog) missing(first, last, n int) int {
	m := 0
	for i := first; i < last; i++ {
		m += max(n-int(l.items[i].received.Load()), 0)
	}
	return m
}

// produceChanges produces task changes at changeRate for d, each titled with its
// number, through the platform's producer (the path the routing core's events take);
// the live reader of serve fans them out to the subscribers.
func (b *bench) produceChanges(ctx context.Context, p *phase, d time.Duration) error {
	interval := time.Second / changeRate
	start := time.Now()
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		if due.Sub(start) >= d {
			return sleep(ctx, time.Until(start.Add(d)))
		}
		if err := sleep(ctx, time.Until(due)); err != nil {
			return err
		}
		now := time.Now()
		seq := b.changes.add(p, now)
		if seq < 0 {
			return fmt.Errorf("more than %d task changes: the change log is full", len(b.changes.items))
		}
		a := agentA(0)
		data := schema.TaskData{TaskID: "bench-load-task-" + strconv.Itoa(seq%10), Title: titlePrefix + strconv.Itoa(seq), Status: "in_progress", Assignee: a.ID}
		ev := event(fmt.Sprintf("bench-load-change-%d", seq), schema.TypeTaskUpdated, now, orgA, roomA(0), a, nil, data)
		if err := b.st.producer.Produce(ctx, []schema.Event{ev}); err != nil {
			return fmt.Errorf("cannot produce task change %d: %w", seq, err)
		}
	}
}

// titlePrefix starts every benchmark task's title; the change's number follows.
const titlePrefix = "bench-load change "

var titleKey = []byte(`"title":"` + titlePrefix)

// changeOf reads a change's number from a message's data: the title is found in the
// JSON rather than decoded (gqlgen writes digits and spaces as they are).
func changeOf(data []byte) (int, bool) {
	i := bytes.Index(data, titleKey)
	if i < 0 {
		return 0, false
	}
	rest := data[i+len(titleKey):]
	n := 0
	for n < len(rest) && n < 10 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n == len(rest) || rest[n] != '"' {
		return 0, false
	}
	seq, err := strconv.Atoi(string(rest[:n]))
	return seq, err == nil
}

// subscribers are one phase's WebSocket subscribers.
type subscribers struct {
	conns   []*wsclient.Conn
	readers sync.WaitGroup
	closing atomic.Bool
	mu      sync.Mutex
	ends    map[string]int // subscriptions ended by the server, by reason
}

func (s *subscribers) n() int { return len(s.conns) }

// connect dials the subscribers, subscriberDials at once, each a key's of
// subscribersPerKey, timing each from the dial to its subscribe written. An upgrade
// refused (503) or an init refused counts as refused and is tried again after a
// second, for up to 30 s; a subscriber that never connects is left out.
func (b *bench) connect(ctx context.Context, p *phase) *subscribers {
	s := &subscribers{ends: map[string]int{}}
	conns := make([]*wsclient.Conn, b.cfg.Subscribers)
	sem := make(chan struct{}, subscriberDials)
	var wg sync.WaitGroup
	for i := range b.cfg.Subscribers {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			token := b.st.tokens.aSubscribers[i/subscribersPerKey]
			giveUp := time.Now().Add(30 * time.Second)
			for ctx.Err() == nil {
				start := time.Now()
				conn, ch, err := dialSubscriber(ctx, b.wsURL, token)
				if err == nil {
					p.kinds[KindConnect].ok(time.Since(start))
					conns[i] = conn
					s.readers.Go(func() { s.read(ch, b.changes) })
					return
				}
				r := asRefusal(err)
				p.kinds[KindConnect].refuse(r.reason, r.detail, 1)
				if time.Now().After(giveUp) || sleep(ctx, time.Second) != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, c := range conns {
		if c != nil {
			s.conns = append(s.conns, c)
		}
	}
	b.waitRegistered(ctx, len(s.conns))
	return s
}

func dialSubscriber(ctx context.Context, url, token string) (*wsclient.Conn, <-chan wsclient.Message, error) {
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	conn, err := wsclient.Dial(dctx, url, token)
	if err != nil {
		reason := "refused"
		switch {
		case strings.Contains(err.Error(), "(HTTP "):
			// wsclient names the status of a refused upgrade in its message only.
			i := strings.Index(err.Error(), "(HTTP ")
			reason = strings.TrimSuffix(err.Error()[i+1:], ")")
		case dctx.Err() != nil:
			reason = "timeout"
		case strings.Contains(err.Error(), "refused at init"):
			reason = "refused at init"
		}
		return nil, nil, &refusal{reason: reason, detail: err.Error()}
	}
	_, ch, err := conn.Subscribe(dctx, workSubscription, nil, 64)
	if err != nil {
		_ = conn.Close() // the subscribe error is the one reported
		return nil, nil, &refusal{reason: "subscribe", detail: err.Error()}
	}
	return conn, ch, nil
}

// waitRegistered waits, up to 10 s, until serve's hub holds n subscriptions
// (bandplane_live_subscriptions): Subscribe returns once its request is written.
func (b *bench) waitRegistered(ctx context.Context, n int) {
	deadline := time.Now().Add(10 * time.Second)
	c := &http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		if got, ok := b.st.gauge(ctx, c, "bandplane_live_subscriptions"); ok && got >= float64(n) {
			return
		}
		if sleep(ctx, 50*time.Millisecond) != nil {
			return
		}
	}
	b.cfg.Progress("the hub did not report %d subscriptions within 10 s; measuring anyway", n)
}

// gauge reads one unlabelled metric of serve's /metrics.
func (s *stack) gauge(ctx context.Context, c *http.Client, name string) (float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.metricsAddr+"/metrics", nil)
	if err != nil {
		return 0, false
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close() //nolint:errcheck // read below; the rest is not needed
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// read delivers one subscriber's changes until its subscription ends; an end the
// server chose (an error, SLOW_SUBSCRIBER, a broken connection) is counted.
func (s *subscribers) read(ch <-chan wsclient.Message, log *changeLog) {
	ended := false
	for m := range ch {
		now := time.Now()
		if m.Err != nil || len(m.Errors) > 0 {
			if !ended && !s.closing.Load() {
				ended = true
				reason := "broken"
				if len(m.Errors) > 0 && m.Errors[0].Code() != "" {
					reason = m.Errors[0].Code()
				}
				s.mu.Lock()
				s.ends[reason]++
				s.mu.Unlock()
			}
			continue
		}
		if seq, ok := changeOf(m.Data); ok {
			log.deliver(seq, now)
		}
	}
}

// settle waits until every subscriber has read changes [first, last), or grace has
// passed.
func (s *subscribers) settle(log *changeLog, first, last int, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && log.missing(first, last, s.n()) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
}

// close closes every connection, a few at a time (each waits for the server's close
// frame), and returns the ends the server chose.
func (s *subscribers) close() map[string]int {
	s.closing.Store(true)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, c := range s.conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = c.Close() // done with either way
		})
	}
	wg.Wait()
	s.readers.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ends
}
