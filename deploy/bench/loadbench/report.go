package loadbench

import (
	"math"
	"sort"
	"sync"
	"time"
)

// The legitimate figures, in the order the summary lists them.
const (
	KindCollector = "collector_post"      // POST /v1/events of 20 events, org-a's ingest key
	KindCosts     = "costs_query"         // GraphQL costs by agent and model, org-a's viewer key
	KindAudit     = "audit_page"          // GraphQL auditEvents, 100 newest messages, org-a's compliance key
	KindPolicy    = "policy_decision"     // POST /v1/decisions/peer_visible, the platform's router key
	KindDelivery  = "subscriber_delivery" // a task change produced to Kafka until each subscriber reads it
	KindConnect   = "subscriber_connect"  // a subscriber's upgrade, connection_init, ack and subscribe
)

// GoalRatio is the goal of every legitimate p99 under attack over alone.
const GoalRatio = 2.0

const (
	phaseAlone    = "alone"
	phaseAttack   = "attack"
	ratioDigits   = 3
	latencyDigits = 2
)

// Kinds lists the legitimate figures.
var Kinds = []string{KindCollector, KindCosts, KindAudit, KindPolicy, KindDelivery, KindConnect}

// samples are one phase's observations of one legitimate figure. A refused request
// (an error status or a GraphQL error, a transport error, a timeout, a change a
// subscriber never got) is counted, never timed: a fast refusal must not pass for a
// fast answer.
type samples struct {
	mu      sync.Mutex
	ms      []float64
	refused int
	reasons map[string]int
	first   map[string]string // the first error of each reason, for the summary
	skipped int               // ticks that found every client of the figure busy
}

func newSamples() *samples {
	return &samples{reasons: map[string]int{}, first: map[string]string{}}
}

func (s *samples) ok(d time.Duration) {
	s.mu.Lock()
	s.ms = append(s.ms, float64(d.Microseconds())/1000)
	s.mu.Unlock()
}

// refuse counts n refusals under reason (a short class: "HTTP 429", "TOO_MANY_REQUESTS",
// "timeout"); detail is the first one's error.
func (s *samples) refuse(reason, detail string, n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.refused += n
	s.reasons[reason] += n
	if _, ok := s.first[reason]; !ok {
		s.first[reason] = detail
	}
	s.mu.Unlock()
}

func (s *samples) skip() {
	s.mu.Lock()
	s.skipped++
	s.mu.Unlock()
}

// phase holds every figure's samples of one phase; the map is fixed at creation.
type phase struct {
	name  string
	kinds map[string]*samples
}

func newPhase(name string) *phase {
	p := &phase{name: name, kinds: map[string]*samples{}}
	for _, k := range Kinds {
		p.kinds[k] = newSamples()
	}
	return p
}

// PhaseStats are one figure's latencies in one phase, in milliseconds, over the
// answered requests; Refused counts the others.
type PhaseStats struct {
	N       int     `json:"n"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	Refused int     `json:"refused"`
}

// statsOf summarizes latencies (nearest rank: the smallest value with at least q of
// the values at or below it).
func statsOf(ms []float64, refused int) PhaseStats {
	st := PhaseStats{N: len(ms), Refused: refused}
	if len(ms) == 0 {
		return st
	}
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	st.P50Ms = round(quantile(s, 0.50), latencyDigits)
	st.P99Ms = round(quantile(s, 0.99), latencyDigits)
	st.MaxMs = round(s[len(s)-1], latencyDigits)
	return st
}

func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// Figure is one legitimate figure alone and under attack. Ratio is the attack p99
// over the alone p99 (the goal's measure), P50Ratio the same of the medians; each is
// null when a phase answered nothing to compare.
type Figure struct {
	Alone    PhaseStats `json:"alone"`
	Attack   PhaseStats `json:"attack"`
	Ratio    *float64   `json:"ratio"`
	P50Ratio *float64   `json:"p50_ratio"`
}

func figureOf(alone, attack PhaseStats) Figure {
	return Figure{Alone: alone, Attack: attack, Ratio: ratio(attack.P99Ms, alone.P99Ms, alone.N, attack.N),
		P50Ratio: ratio(attack.P50Ms, alone.P50Ms, alone.N, attack.N)}
}

func ratio(attack, alone float64, nAlone, nAttack int) *float64 {
	if nAlone == 0 || nAttack == 0 || alone <= 0 {
		return nil
	}
	r := round(attack/alone, ratioDigits)
	return &r
}

// CPU is cores used on average over each phase's measured window.
type CPU struct {
	Alone  float64 `json:"alone"`
	Attack float64 `json:"attack"`
}

// Result is the JSON line of `bandplane bench load`.
//
//   - legit: each legitimate figure alone and under attack, and their ratios;
//   - worst_ratio: the largest p99 ratio of the figures, worst its figure;
//     unmeasured names the figures whose ratio is null (a phase answered none of
//     them), which worst_ratio cannot cover;
//   - legit_refused: legitimate requests refused or timed out under attack, of every
//     figure (legit_refused_alone: the same without attack);
//   - goal_met: worst_ratio <= 2.0, every ratio measured, nothing refused under attack;
//   - *_cpu_cores: cores busy during each measured window: the server process (from
//     /proc/<pid>/stat), this process (the legitimate clients), the hostile clients'
//     process (attack only), and the whole machine (ClickHouse, Kafka and everything
//     else too; 0 when unknown).
type Result struct {
	DurationS         float64           `json:"duration_s"`
	Rounds            int               `json:"rounds"`
	Subscribers       int               `json:"subscribers"`
	Legit             map[string]Figure `json:"legit"`
	WorstRatio        float64           `json:"worst_ratio"`
	Worst             string            `json:"worst"`
	Unmeasured        []string          `json:"unmeasured,omitempty"`
	LegitRefused      int               `json:"legit_refused"`
	LegitRefusedAlone int               `json:"legit_refused_alone"`
	GoalMet           bool              `json:"goal_met"`
	ServerCPUCores    CPU               `json:"server_cpu_cores"`
	BenchCPUCores     CPU               `json:"bench_cpu_cores"`
	HostileCPUCores   float64           `json:"hostile_cpu_cores"`
	MachineCPUCores   CPU               `json:"machine_cpu_cores"`
	Hostile           HostileStats      `json:"hostile"`
}

// HostileStats count what the hostile clients did over the attack phase (its
// warm-up included) and what the server answered them.
type HostileStats struct {
	Kinds []string `json:"kinds"` // the hostile clients that ran
	// Idle upgrades: answered 101 and then never sent connection_init, refused (503,
	// the pending bound), ended by the server (its init timeout).
	IdleUpgrades  int64   `json:"idle_upgrades"`
	IdleRefused   int64   `json:"idle_refused"`
	IdleClosed    int64   `json:"idle_closed_by_server"`
	TrickleHeld   int64   `json:"trickle_held"`    // bodies the collector kept reading for more than 2 s
	TrickleRefuse int64   `json:"trickle_refused"` // answered 429 before the body
	AuditPages    int64   `json:"audit_pages"`     // auditEvents pages of the large events answered
	AuditRefused  int64   `json:"audit_refused"`   // answered with an error
	AuditMiB      float64 `json:"audit_mib"`       // bytes of those answers
	KeylessSent   int64   `json:"keyless_sent"`
	KeylessPerS   float64 `json:"keyless_per_s"`
	KeylessErrors int64   `json:"keyless_errors"` // transport errors (the connection is dialled again)
}

// add sums two rounds' counts; KeylessPerS adds up too, for the caller to average.
func (h HostileStats) add(o HostileStats) HostileStats {
	h.IdleUpgrades += o.IdleUpgrades
	h.IdleRefused += o.IdleRefused
	h.IdleClosed += o.IdleClosed
	h.TrickleHeld += o.TrickleHeld
	h.TrickleRefuse += o.TrickleRefuse
	h.AuditPages += o.AuditPages
	h.AuditRefused += o.AuditRefused
	h.AuditMiB += o.AuditMiB
	h.KeylessSent += o.KeylessSent
	h.KeylessPerS += o.KeylessPerS
	h.KeylessErrors += o.KeylessErrors
	return h
}

// legitRefusals sums the refused requests of every figure in both phases.
func legitRefusals(legit map[string]Figure) (alone, attack int) {
	for _, f := range legit {
		alone += f.Alone.Refused
		attack += f.Attack.Refused
	}
	return alone, attack
}

// worstOf is the largest measured p99 ratio and its figure, and the figures without a
// ratio, in Kinds order (figures Kinds does not name after them, by name).
func worstOf(legit map[string]Figure) (worst float64, kind string, unmeasured []string) {
	for _, k := range orderedKinds(legit) {
		f := legit[k]
		if f.Ratio == nil {
			unmeasured = append(unmeasured, k)
			continue
		}
		if kind == "" || *f.Ratio > worst {
			worst, kind = *f.Ratio, k
		}
	}
	return worst, kind, unmeasured
}

func orderedKinds(legit map[string]Figure) []string {
	var out []string
	known := map[string]bool{}
	for _, k := range Kinds {
		known[k] = true
		if _, ok := legit[k]; ok {
			out = append(out, k)
		}
	}
	var rest []string
	for k := range legit {
		if !known[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

// buildResult compares the two phases' samples figure by figure.
func buildResult(alone, attack *phase) Result {
	res := Result{Legit: map[string]Figure{}}
	for _, k := range Kinds {
		a, b := alone.kinds[k], attack.kinds[k]
		res.Legit[k] = figureOf(statsOf(a.ms, a.refused), statsOf(b.ms, b.refused))
	}
	res.fill()
	return res
}

// fill derives the summary fields from Legit.
func (r *Result) fill() {
	r.WorstRatio, r.Worst, r.Unmeasured = worstOf(r.Legit)
	r.LegitRefusedAlone, r.LegitRefused = legitRefusals(r.Legit)
	r.GoalMet = r.Worst != "" && len(r.Unmeasured) == 0 && r.WorstRatio <= GoalRatio && r.LegitRefused == 0
}

// Refusals are one figure's refusals in one phase by reason, with the first error of
// each, for the summary.
type Refusals struct {
	Kind, Phase string
	Reasons     map[string]int
	First       map[string]string
	Skipped     int
}

func refusalsOf(p *phase) []Refusals {
	var out []Refusals
	for _, k := range Kinds {
		s := p.kinds[k]
		if s.refused == 0 && s.skipped == 0 {
			continue
		}
		out = append(out, Refusals{Kind: k, Phase: p.name, Reasons: s.reasons, First: s.first, Skipped: s.skipped})
	}
	return out
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}
