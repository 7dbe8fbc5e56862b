// Package replay re-evaluates the policy decisions of the audit trail with a candidate
// bundle, each against the state its live decision saw, and counts what the candidate
// would have decided otherwise: `bandplane policy replay`, before a bundle goes live.
//
// The state is rebuilt from the trail (event sourcing), never taken from the live
// process. Every record of the events topic that the policy side reads (governance,
// budgets, usage, and the decisions themselves) is applied, in each partition's order,
// to a fresh directory and ledger through the policy replica's own Apply. A decision
// records the replica's position (policy.Position: the next offset of each partition)
// at the moment it read the directory, so before a decision the replay applies exactly
// the records below that position: the directory, contacts, room membership,
// suspensions and pending requests it reads are the live decision's. The engine's
// clock is set to the decision's recorded time, so send_message's rate limiter and
// budgets see what the live ones did: the limiter is rebuilt by the replayed
// decisions themselves (from a warm-up before the range), the budgets and spend by the
// budget and usage events, the reservations by the replayed send_message decisions.
// What the candidate decides otherwise changes what it reserves and takes from then
// on, as it would have live: a lower rate limit flips the decisions above it, and no
// more.
//
// Exact for one policy replica; with several (policy/shard), each decision is exact
// for its own replica's position only if the replicas read the topic in step (the
// replay applies the largest position seen so far, never goes back). Decisions without
// a recorded position (before the field existed) are replayed at the position of the
// decision before them and counted in Result.Approximate.
//
// It may import schema/ and its own folder's packages only (deploy/layers).
package replay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
)

// Config of one replay.
type Config struct {
	// Source reads the trail; Bundle is the candidate (a directory of .rego files and
	// data.json, as serve's --policy-dir).
	Source Source
	Bundle fs.FS
	// The decisions replayed: From ≤ time < To, of Org only when set (a tenant replays
	// its own decisions; the state is everybody's, as the live decisions read it), of
	// Kinds only when set.
	From, To time.Time
	Org      string
	Kinds    []string
	// Scoped, with Org, cuts the state to Org's own trail (the records of organization
	// Org: what its keys read in the audit trail) and replays Org's decisions only, so
	// that nothing a tenant's candidate reads, and so nothing it answers, is another
	// organization's. A decision that read another organization's state live is then
	// not replayed as it was: Baseline (the bundle serving, required) decides every
	// read-only decision too, and one whose recorded answer it does not give again on
	// the cut state is counted in Result.OutOfScope instead of being compared.
	Scoped   bool
	Baseline fs.FS
	// Warmup is how long before From decisions are replayed without being counted, to
	// rebuild the rate limiter and the reservations open at From (default
	// DefaultWarmup: the policy data's largest rate window, and the reservations' TTL,
	// are far shorter).
	Warmup time.Duration
	// Examples is how many decisions of each flip class are kept (default 10).
	Examples int
	// EvalTimeout bounds one evaluation (default 1 s): a candidate that takes longer is
	// an error of the replay, not a deny.
	EvalTimeout time.Duration
	// Workers is how many evaluations run at once (default GOMAXPROCS); serve's jobs
	// take one core each.
	Workers int
	// CodesOnly keeps, in the examples, each answer's reason codes without their
	// messages: at most MaxExampleReasons of them, each cut to MaxReasonCodeBytes.
	// That bounds what serve keeps of a job for a day, whatever a candidate's reasons
	// hold.
	CodesOnly bool
	Catalog   pricing.Source
	Logger    *slog.Logger
	// Progress is called every ProgressEvery decisions and at the end (nil: never).
	Progress      func(p Progress)
	ProgressEvery int
}

// scope is the organization whose records alone the source reads: a scoped replay's
// (the source leaves the others' rows unread, and the ClickHouse source reads them by
// the table's key, whose first column is the organization: how long a tenant's replay
// takes does not follow how much another organization did), "" otherwise.
func (c Config) scope() string {
	if c.Scoped {
		return c.Org
	}
	return ""
}

// Bounds of an example's answer under Config.CodesOnly: the reasons beyond
// MaxExampleReasons are one last code, "… N more"; a longer code ends in "…".
const (
	MaxExampleReasons  = 16
	MaxReasonCodeBytes = 128
)

// Defaults of Config.
const (
	DefaultWarmup      = 2 * time.Hour
	DefaultExamples    = 10
	DefaultEvalTimeout = time.Second
)

// Progress is where a replay stands.
type Progress struct {
	Decisions int           // replayed so far, counted ones
	Records   int           // records of the trail applied so far
	Elapsed   time.Duration // since the first decision of the range
	PerSecond float64
	// Fraction is how far through the range the last decision's time is, 0..1.
	Fraction float64
	ETA      time.Duration
}

// Counts are the outcomes of a set of decisions.
type Counts struct {
	Decisions     int `json:"decisions"`
	Unchanged     int `json:"unchanged"`
	AllowToDeny   int `json:"allow_to_deny"`
	DenyToAllow   int `json:"deny_to_allow"`
	ReasonChanged int `json:"reason_changed"`
}

// Flips is the number of decisions the candidate decides otherwise.
func (c Counts) Flips() int { return c.AllowToDeny + c.DenyToAllow }

// Ratio is Flips over Decisions (0 with none).
func (c Counts) Ratio() float64 {
	if c.Decisions == 0 {
		return 0
	}
	return float64(c.Flips()) / float64(c.Decisions)
}

// Answer is one side of a replayed decision.
type Answer struct {
	Allow   bool            `json:"allow"`
	Reasons []policy.Reason `json:"reasons"`
}

// Party is a party of a decision, with its handle when the directory of the moment
// has one.
type Party struct {
	ID     string `json:"id"`
	Handle string `json:"handle,omitempty"`
}

// Example is one decision the candidate decides otherwise.
type Example struct {
	DecisionID string    `json:"decision_id"`
	Time       time.Time `json:"time"`
	Kind       string    `json:"kind"`
	Org        string    `json:"org,omitempty"`
	// Actor is who asked about (the sending or adding agent, the requester); Other the
	// candidate peer, participant or the handle asked for; Room the room.
	Actor     Party  `json:"actor"`
	Other     *Party `json:"other,omitempty"`
	Room      string `json:"room,omitempty"`
	Live      Answer `json:"live"`
	Candidate Answer `json:"candidate"`
}

// Bundle names the candidate: its policy revision (the hash every decision records)
// and the digest of all its files.
type Bundle struct {
	Revision string `json:"revision"`
	Digest   string `json:"digest"`
}

// Result is the JSON document `bandplane policy replay` prints.
type Result struct {
	Counts
	ByKind   map[string]*Counts `json:"by_kind"`
	ByOrg    map[string]*Counts `json:"by_org"`
	Examples struct {
		AllowToDeny   []Example `json:"allow_to_deny"`
		DenyToAllow   []Example `json:"deny_to_allow"`
		ReasonChanged []Example `json:"reason_changed"`
	} `json:"examples"`
	Bundle Bundle    `json:"bundle"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	// Approximate counts the decisions replayed without a recorded position (see the
	// package comment); Skipped those that could not be read at all, with the first
	// reason.
	Approximate int `json:"approximate"`
	// OutOfScope counts, in a scoped replay, the decisions not compared: their recorded
	// answer depends on state outside the organization's trail, or on rules other than
	// the baseline's (see Config.Scoped).
	OutOfScope int    `json:"out_of_scope,omitempty"`
	Skipped    int    `json:"skipped"`
	SkipReason string `json:"skip_reason,omitempty"`
	Records    int    `json:"records"` // records of the trail applied
	// State says, per decision kind, where the state it is replayed against comes from.
	State map[string]string `json:"state"`
}

// StateSources says where each decision kind's state comes from (Result.State).
var StateSources = map[string]string{
	policy.PeerVisible:    "event-sourced: the directory, contacts and room membership, applied up to the decision's recorded position",
	policy.AddParticipant: "event-sourced: the directory, contacts and room membership (the facts), applied up to the decision's recorded position",
	policy.ContactRequest: "event-sourced: the directory, contacts and pending requests, applied up to the decision's recorded position",
	policy.SendMessage: "event-sourced: the directory up to the decision's recorded position; budgets and spend from the budget and usage events; " +
		"rates and reservations from the replayed decisions themselves (from the warm-up on), at the decision's recorded clock",
}

// Source reads the trail in the order the replay needs.
type Source interface {
	// Partitions are the partitions of the events topic the trail holds (records of
	// organization org, when org is not "").
	Partitions(ctx context.Context, org string) ([]int, error)
	// Records streams the records of one partition that the policy side reads, in
	// offset order; of organization org only, when org is not "".
	Records(ctx context.Context, partition int, org string) (Cursor, error)
	// Decisions streams the policy.decided events with from ≤ time < to, by time; of
	// organization org only, when org is not "".
	Decisions(ctx context.Context, from, to time.Time, org string) (Cursor, error)
}

// Cursor is a stream of records.
type Cursor interface {
	// Next returns the next record; ok is false at the end.
	Next() (r Record, ok bool, err error)
	Close() error
}

// Record is one event of the trail and where it sits in the topic.
type Record struct {
	Event     schema.Event
	Partition int
	Offset    int64
}

// Run replays the decisions of cfg's range with cfg's bundle.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Source == nil || cfg.Bundle == nil {
		return nil, errors.New("replay: a source and a bundle are required")
	}
	if cfg.Scoped && (cfg.Org == "" || cfg.Baseline == nil) {
		return nil, errors.New("replay: a scoped replay needs an organization and a baseline bundle")
	}
	if !cfg.From.Before(cfg.To) {
		return nil, fmt.Errorf("replay: --from (%s) must be before --to (%s)", cfg.From.Format(time.RFC3339), cfg.To.Format(time.RFC3339))
	}
	for _, k := range cfg.Kinds {
		if _, ok := StateSources[k]; !ok {
			return nil, fmt.Errorf("replay: unknown decision kind %q (known: %s)", k, strings.Join(slices.Sorted(maps.Keys(StateSources)), ", "))
		}
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = DefaultWarmup
	}
	if cfg.Examples <= 0 {
		cfg.Examples = DefaultExamples
	}
	if cfg.EvalTimeout <= 0 {
		cfg.EvalTimeout = DefaultEvalTimeout
	}
	if cfg.Catalog == nil {
		cfg.Catalog = pricing.Default()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 10_000
	}
	digest, err := Digest(cfg.Bundle)
	if err != nil {
		return nil, err
	}
	s, err := newState(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer s.close()
	res := &Result{ByKind: map[string]*Counts{}, ByOrg: map[string]*Counts{}, From: cfg.From.UTC(), To: cfg.To.UTC(),
		Bundle: Bundle{Revision: s.engine.Revision(), Digest: digest}, State: StateSources}
	if cfg.Scoped {
		res.State = map[string]string{}
		for kind, from := range StateSources {
			res.State[kind] = "the organization's own trail only (scoped): " + from
		}
	}
	decisions, err := cfg.Source.Decisions(ctx, cfg.From.Add(-cfg.Warmup), cfg.To, cfg.scope())
	if err != nil {
		return nil, err
	}
	defer func() { _ = decisions.Close() }()
	workers := cfg.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	s.startWorkers(ctx, workers)
	began := time.Time{}
	for {
		rec, ok, err := decisions.Next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		counted := !rec.Event.Time.Before(cfg.From)
		if counted && began.IsZero() {
			began = time.Now()
		}
		before := res.Decisions
		if err := s.replay(ctx, &rec, counted, res); err != nil {
			return nil, err
		}
		if res.Decisions != before && cfg.Progress != nil && res.Decisions%cfg.ProgressEvery == 0 {
			cfg.Progress(progress(res, s, began, rec.Event.Time, cfg))
		}
	}
	if err := s.drain(res); err != nil {
		return nil, err
	}
	for _, list := range []*[]Example{&res.Examples.AllowToDeny, &res.Examples.DenyToAllow, &res.Examples.ReasonChanged} {
		s.trim(list)
	}
	res.Records = s.records
	if cfg.Progress != nil {
		p := progress(res, s, began, cfg.To, cfg)
		p.Fraction, p.ETA = 1, 0
		cfg.Progress(p)
	}
	return res, nil
}

func progress(res *Result, s *state, began, at time.Time, cfg Config) Progress {
	p := Progress{Decisions: res.Decisions, Records: s.records}
	if !began.IsZero() {
		p.Elapsed = time.Since(began)
	}
	if p.Elapsed > 0 {
		p.PerSecond = float64(res.Decisions) / p.Elapsed.Seconds()
	}
	if span := cfg.To.Sub(cfg.From); span > 0 {
		p.Fraction = min(1, max(0, float64(at.Sub(cfg.From))/float64(span)))
	}
	if p.Fraction > 0 && p.Elapsed > 0 {
		p.ETA = time.Duration(float64(p.Elapsed) * (1 - p.Fraction) / p.Fraction)
	}
	return p
}

// state is the rebuilt policy state and the candidate engine that decides against it.
type state struct {
	cfg    Config
	dir    *policy.Directory
	engine *policy.Engine
	// baseline, in a scoped replay, is the serving bundle deciding on the same state:
	// the check that a decision's recorded answer comes from the organization's trail.
	baseline *policy.Engine
	replica  *replica.Replica
	now      atomic.Int64 // the engine's clock (Unix ns): the send_message being replayed's time

	// Decisions of the kinds that read the directory only (every kind but send_message)
	// are evaluated by workers, in parallel, while the directory stands still; the
	// replay waits for them (drain) before it applies a record that changes the
	// directory. send_message, which reads and changes the limiter and the ledger, is
	// evaluated in order by the replay itself, as are the records that change those.
	jobs     chan job
	outcomes chan outcome
	inflight int
	workers  sync.WaitGroup

	partitions []int
	cursors    map[int]Cursor
	pending    map[int]*Record // the next record of each partition, read but not applied
	applied    policy.Position // the next offset of each partition not applied
	records    int
}

func newState(ctx context.Context, cfg Config) (*state, error) {
	s := &state{cfg: cfg, dir: policy.NewDirectory(), cursors: map[int]Cursor{}, pending: map[int]*Record{}, applied: policy.Position{}}
	clock := func() time.Time { return time.Unix(0, s.now.Load()).UTC() }
	ledger := policy.NewLedger(0)
	var err error
	s.engine, err = policy.New(ctx, policy.Config{Directory: s.dir, Bundle: cfg.Bundle, Limiter: policy.NewLimiter(), Ledger: ledger, Now: clock})
	if err != nil {
		return nil, fmt.Errorf("the candidate bundle is refused: %w", err)
	}
	if cfg.Scoped {
		// Its limiter and ledger are its own and stay empty: it decides the read-only
		// kinds only, which read neither.
		if s.baseline, err = policy.New(ctx, policy.Config{Directory: s.dir, Bundle: cfg.Baseline, Now: clock}); err != nil {
			return nil, fmt.Errorf("the baseline bundle is refused: %w", err)
		}
	}
	s.replica, err = replica.New(replica.Config{Directory: s.dir, Registrations: directory.New(), Ledger: ledger, Catalog: cfg.Catalog,
		Logger: cfg.Logger, Now: clock})
	if err != nil {
		return nil, err
	}
	if s.partitions, err = cfg.Source.Partitions(ctx, cfg.scope()); err != nil {
		return nil, err
	}
	for _, p := range s.partitions {
		c, err := cfg.Source.Records(ctx, p, cfg.scope())
		if err != nil {
			s.close()
			return nil, err
		}
		s.cursors[p] = c
	}
	return s, nil
}

func (s *state) close() {
	if s.jobs != nil {
		close(s.jobs)
		s.workers.Wait()
	}
	for _, c := range s.cursors {
		_ = c.Close()
	}
}

// job is a decision for a worker; outcome its answer, and its example when it flips.
type job struct {
	rec         Record
	live        api.DecidedData
	in          any
	counted     bool
	approximate bool
}

type outcome struct {
	job
	class   class
	example *Example
	err     error
}

func (s *state) startWorkers(ctx context.Context, n int) {
	s.jobs, s.outcomes = make(chan job, 4*n), make(chan outcome, 4*n)
	for range n {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			for j := range s.jobs {
				s.outcomes <- s.evaluate(ctx, j)
			}
		}()
	}
}

// evaluate decides a job's decision with the candidate and compares the answers.
func (s *state) evaluate(ctx context.Context, j job) outcome {
	ectx, cancel := context.WithTimeout(ctx, s.cfg.EvalTimeout)
	d, err := s.engine.Decide(ectx, j.live.Decision, j.in)
	late := errors.Is(ectx.Err(), context.DeadlineExceeded)
	cancel()
	o := outcome{job: j}
	if s.baseline != nil && j.live.Decision != policy.SendMessage && err == nil && !late {
		bctx, cancel := context.WithTimeout(ctx, s.cfg.EvalTimeout)
		b, berr := s.baseline.Decide(bctx, j.live.Decision, j.in)
		cancel()
		if berr != nil || compare(j.live, b) != classUnchanged {
			o.class = classOutOfScope
			return o
		}
	}
	switch {
	case err != nil:
		o.err = fmt.Errorf("decision %s: the candidate cannot evaluate it: %w", j.rec.Event.ID, err)
		return o
	case late && ctx.Err() == nil:
		// The engine answers a policy that runs out of time with a deny: the replay
		// refuses the candidate instead of counting flips it never decided.
		o.err = fmt.Errorf("decision %s (%s): the candidate took longer than %s (--eval-timeout) to decide it", j.rec.Event.ID, j.live.Decision, s.cfg.EvalTimeout)
		return o
	}
	if o.class = compare(j.live, d); o.class != classUnchanged && j.counted {
		ex := s.example(&j.rec, &j.live, j.in, d)
		o.example = &ex
	}
	return o
}

// collect counts an outcome.
func (s *state) collect(res *Result, o outcome) error {
	s.inflight--
	if o.err != nil {
		return o.err
	}
	if !o.counted || (s.cfg.Org != "" && o.rec.Event.OrgID != s.cfg.Org) {
		return nil
	}
	if o.class == classOutOfScope {
		res.OutOfScope++
		return nil
	}
	if o.approximate {
		res.Approximate++
	}
	for _, c := range []*Counts{&res.Counts, counts(res.ByKind, o.live.Decision), counts(res.ByOrg, orgKey(o.rec.Event.OrgID))} {
		c.Decisions++
		switch o.class {
		case classUnchanged:
			c.Unchanged++
		case classAllowToDeny:
			c.AllowToDeny++
		case classDenyToAllow:
			c.DenyToAllow++
		case classReasonChanged:
			c.ReasonChanged++
		}
	}
	if o.example != nil {
		// The workers finish out of order: keep the earliest examples, a bounded few.
		list := s.examples(res, o.class)
		if *list = append(*list, *o.example); len(*list) > 2*s.cfg.Examples {
			s.trim(list)
		}
	}
	return nil
}

// trim keeps the cfg.Examples earliest examples of a list.
func (s *state) trim(list *[]Example) {
	slices.SortFunc(*list, func(a, b Example) int {
		if c := a.Time.Compare(b.Time); c != 0 {
			return c
		}
		return strings.Compare(a.DecisionID, b.DecisionID)
	})
	*list = (*list)[:min(len(*list), s.cfg.Examples)]
}

// drain waits for the workers' decisions in flight and counts them.
func (s *state) drain(res *Result) error {
	var first error
	for s.inflight > 0 {
		if err := s.collect(res, <-s.outcomes); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// advanceTo applies, in each partition, the records below pos: the first time, the
// state at the start of the replay, in bulk.
func (s *state) advanceTo(ctx context.Context, pos policy.Position, res *Result) error {
	if s.records > 0 {
		return s.advance(ctx, pos, res)
	}
	var err error
	if berr := s.dir.Bulk(ctx, func() { err = s.advance(ctx, pos, res) }); berr != nil {
		return fmt.Errorf("cannot build the policy state: %w", berr)
	}
	return err
}

// advance applies, in each partition, the records below pos; before a record that
// changes the directory, it waits for the workers' decisions in flight.
func (s *state) advance(ctx context.Context, pos policy.Position, res *Result) error {
	for _, p := range s.partitions {
		target, ok := pos[p]
		if !ok || target <= s.applied[p] {
			continue
		}
		for {
			r := s.pending[p]
			if r == nil {
				next, ok, err := s.cursors[p].Next()
				if err != nil {
					return fmt.Errorf("cannot read partition %d of the trail: %w", p, err)
				}
				if !ok {
					break
				}
				r = &next
			}
			if r.Offset >= target {
				s.pending[p] = r
				break
			}
			s.pending[p] = nil
			if s.cfg.Scoped && r.Event.OrgID != s.cfg.Org {
				s.applied[p] = r.Offset + 1
				continue
			}
			if s.inflight > 0 && slices.Contains(schema.GovernanceTypes, r.Event.Type) {
				if err := s.drain(res); err != nil {
					return err
				}
			}
			if err := s.replica.Apply(ctx, &r.Event); err != nil {
				s.cfg.Logger.Debug("skipping a record the policy state cannot apply", "event_id", r.Event.ID, "err", err)
			}
			s.records++
			s.applied[p] = r.Offset + 1
		}
		s.applied[p] = max(s.applied[p], target)
	}
	return nil
}

// replay evaluates one recorded decision against the state at its position and, when
// counted, compares the answers (the workers' later, see collect).
func (s *state) replay(ctx context.Context, rec *Record, counted bool, res *Result) error {
	// Another organization's decision is not counted, nor is a failure to read it;
	// only its send_message changes the state (the limiter, the ledger) that later
	// decisions read, and a scoped replay holds none of that organization's state.
	foreign := s.cfg.Org != "" && rec.Event.OrgID != s.cfg.Org
	if foreign && s.cfg.Scoped {
		return nil
	}
	counted = counted && !foreign
	var live api.DecidedData
	if err := schema.DecodeData(rec.Event.Data, &live); err != nil {
		return s.skip(res, counted, fmt.Sprintf("decision %s: cannot read its data: %v", rec.Event.ID, err))
	}
	if len(s.cfg.Kinds) > 0 && !slices.Contains(s.cfg.Kinds, live.Decision) {
		return nil
	}
	if foreign && live.Decision != policy.SendMessage {
		return nil
	}
	in, err := api.Input(live.Decision, live.Input)
	if err != nil {
		return s.skip(res, counted, fmt.Sprintf("decision %s: %v", rec.Event.ID, err))
	}
	j := job{rec: *rec, live: live, in: in, counted: counted, approximate: len(live.Position) == 0}
	// The clock is the decision's time from here on: the records below its position
	// are applied at it (the live replica applied them before the decision), and
	// send_message decides at it.
	at := live.DecidedAt
	if at.IsZero() {
		at = rec.Event.Time
	}
	s.now.Store(at.UnixNano())
	if !j.approximate {
		if err := s.advanceTo(ctx, live.Position, res); err != nil {
			return err
		}
	}
	// Take what the workers finished meanwhile, so that their queue never fills.
	for s.inflight > 0 {
		select {
		case o := <-s.outcomes:
			if err := s.collect(res, o); err != nil {
				return err
			}
			continue
		default:
		}
		break
	}
	if live.Decision != policy.SendMessage {
		// Fewer in flight than the outcomes' buffer holds: no worker ever waits to
		// hand an outcome over, so the queue always moves.
		for s.inflight >= cap(s.outcomes)-1 {
			if err := s.collect(res, <-s.outcomes); err != nil {
				return err
			}
		}
		s.inflight++
		s.jobs <- j
		return nil
	}
	s.inflight++
	return s.collect(res, s.evaluate(ctx, j))
}

func (s *state) skip(res *Result, counted bool, reason string) error {
	if counted {
		if res.Skipped++; res.SkipReason == "" {
			res.SkipReason = reason
		}
	}
	return nil
}

type class int

const (
	classUnchanged class = iota
	classAllowToDeny
	classDenyToAllow
	classReasonChanged
	classOutOfScope // a scoped replay's decision its baseline does not reproduce
)

// compare classes a replayed decision: an answer flipped, or the same answer with
// other reason codes (the messages may carry times, such as when to retry).
func compare(live api.DecidedData, d policy.Decision) class {
	switch {
	case live.Allow && !d.Allow:
		return classAllowToDeny
	case !live.Allow && d.Allow:
		return classDenyToAllow
	case !slices.Equal(codes(live.Reasons), codes(d.Reasons)):
		return classReasonChanged
	}
	return classUnchanged
}

func codes(rs []policy.Reason) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Code)
	}
	sort.Strings(out)
	return out
}

func counts(m map[string]*Counts, k string) *Counts {
	c := m[k]
	if c == nil {
		c = &Counts{}
		m[k] = c
	}
	return c
}

// orgKey is the by_org key of an event's organization.
func orgKey(org string) string {
	if org == "" {
		return "(none)"
	}
	return org
}

// examples is the list of examples of a flip class.
func (s *state) examples(res *Result, c class) *[]Example {
	switch c {
	case classAllowToDeny:
		return &res.Examples.AllowToDeny
	case classDenyToAllow:
		return &res.Examples.DenyToAllow
	}
	return &res.Examples.ReasonChanged
}

// example is a flipped decision, its parties named by the directory of the moment.
func (s *state) example(rec *Record, live *api.DecidedData, in any, d policy.Decision) Example {
	ex := Example{DecisionID: rec.Event.ID, Time: rec.Event.Time.UTC(), Kind: live.Decision, Org: rec.Event.OrgID,
		Live: Answer{Allow: live.Allow, Reasons: live.Reasons}, Candidate: Answer{Allow: d.Allow, Reasons: d.Reasons}}
	if s.cfg.CodesOnly {
		ex.Live.Reasons, ex.Candidate.Reasons = codesOnly(live.Reasons), codesOnly(d.Reasons)
	}
	switch v := in.(type) {
	case *policy.PeerInput:
		ex.Actor, ex.Room = s.party(v.Agent), v.Room
		if v.Candidate != "" {
			p := s.party(v.Candidate)
			ex.Other = &p
		}
	case *policy.AddInput:
		ex.Actor, ex.Room = s.party(v.Actor), v.Room
		p := s.party(v.Participant)
		ex.Other = &p
	case *policy.ContactInput:
		ex.Actor = s.party(v.From)
		p := Party{Handle: strings.TrimPrefix(v.Handle, "@")}
		if id, ok := s.dir.ResolveHandle(v.Handle); ok {
			p.ID = id
		}
		ex.Other = &p
	case *policy.MessageInput:
		ex.Actor, ex.Room = s.party(v.Agent), v.Room
	}
	return ex
}

// codesOnly is rs without messages, within MaxExampleReasons and MaxReasonCodeBytes
// (Config.CodesOnly).
func codesOnly(rs []policy.Reason) []policy.Reason {
	out := make([]policy.Reason, 0, min(len(rs), MaxExampleReasons+1))
	for i, r := range rs {
		if i == MaxExampleReasons {
			out = append(out, policy.Reason{Code: fmt.Sprintf("… %d more", len(rs)-i)})
			break
		}
		code := r.Code
		if len(code) > MaxReasonCodeBytes {
			code = strings.ToValidUTF8(code[:MaxReasonCodeBytes-len("…")], "") + "…"
		}
		out = append(out, policy.Reason{Code: code})
	}
	return out
}

// party names an agent by the handle the directory of the moment gives it.
func (s *state) party(id string) Party {
	p := Party{ID: id}
	if a, ok := s.dir.Agent(id); ok {
		p.Handle = a.Handle
	}
	return p
}
