// Package policybench measures the policy engine for `bandplane bench policy`: a
// generated directory the size of a large platform, decision latencies through the
// engine, the bare OPA evaluation of the same query, and a reference CPU task timed in
// the same loop. It is a tool, not part of the policy API.
//
// It may import any folder but cmd/ (deploy/layers).
package policybench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/bandplane/bandplane/policy"
)

// LatencyResult is the in-process latency of one decision.
type LatencyResult struct {
	PerS  float64 `json:"per_s"`
	P50Us float64 `json:"p50_us"`
	P99Us float64 `json:"p99_us"`
}

// ReservingResult is the latency of send_message decisions that reserve, and how many
// were allowed (every one should be: the budgets and rates are far from reached).
type ReservingResult struct {
	LatencyResult
	Budgets int `json:"budgets"`
	Allowed int `json:"allowed"`
	// Ledger is Ledger.Reserve alone for the same charges: the reservation's own part
	// of the decision.
	Ledger LatencyResult `json:"ledger_reserve"`
}

// BareResult is the latency of the bare prepared OPA evaluation.
type BareResult struct {
	P50Us float64 `json:"p50_us"`
	P99Us float64 `json:"p99_us"`
}

// Result is what Run measured.
type Result struct {
	AddParticipant LatencyResult `json:"add_participant"`
	SendMessage    LatencyResult `json:"send_message"`
	// SendMessageReserving is send_message with an estimate reserved against three
	// budgets in scope (the agent's, its owner's and its organization's, per day), each
	// reservation settled by its usage report after the clock stops.
	SendMessageReserving ReservingResult `json:"send_message_reserving"`
	BareOPA              BareResult      `json:"bare_opa"`
	// OverheadRatio is add_participant p99 through Engine.Decide ÷ bare OPA p99.
	OverheadRatio float64 `json:"overhead_ratio"`
	// ReferenceCPU is a fixed CPU task (48 SHA-256 of one 1 KiB buffer, which stays in the
	// L1 cache; about as long as a decision) timed in the same loop: the tail the machine
	// itself adds to anything that short.
	ReferenceCPU BareResult `json:"reference_cpu"`
}

// Setup is the benchmark's directory and engine, and the inputs drawn from it. The
// CLI reuses it to drive the same directory over HTTP.
type Setup struct {
	Engine   *policy.Engine
	Snapshot policy.Snapshot
	rooms    []string // sorted room ids
	rng      *rand.Rand
}

// NewSetup builds a directory of agents agents (five per owner, 50 organizations),
// contacts random contacts and 500 rooms, and an engine on the built-in bundle.
func NewSetup(ctx context.Context, agents, contacts int) (*Setup, error) {
	if agents < 2 || contacts < 0 || contacts > agents*(agents-1)/2 {
		return nil, fmt.Errorf("cannot build policy benchmark directory: need agents >= 2 and 0 <= contacts <= agents*(agents-1)/2 (got %d agents, %d contacts)", agents, contacts)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	snap := benchDirectory(rng, agents, contacts)
	dir := policy.NewDirectory()
	if err := dir.Load(ctx, snap); err != nil {
		return nil, fmt.Errorf("cannot build policy benchmark directory: %w", err)
	}
	e, err := policy.New(ctx, policy.Config{Directory: dir})
	if err != nil {
		return nil, fmt.Errorf("cannot build policy benchmark engine: %w", err)
	}
	rooms := make([]string, 0, len(snap.Rooms))
	for r := range snap.Rooms {
		rooms = append(rooms, r)
	}
	slices.Sort(rooms)
	return &Setup{Engine: e, Snapshot: snap, rooms: rooms, rng: rng}, nil
}

// AddInputs returns n add_participant inputs: a member of a room adds a random agent (a
// sibling, a contact, a stranger, sometimes someone already in the room).
func (s *Setup) AddInputs(n int) []policy.AddInput {
	adds := make([]policy.AddInput, n)
	for i := range adds {
		room := s.rooms[s.rng.IntN(len(s.rooms))]
		members := s.Snapshot.Rooms[room]
		actor := members[s.rng.IntN(len(members))]
		adds[i] = policy.AddInput{Actor: actor, Room: room, Participant: s.Snapshot.Agents[s.rng.IntN(len(s.Snapshot.Agents))].ID}
	}
	return adds
}

// Run builds the benchmark directory (NewSetup), then measures n
// add_participant and n send_message decisions through the policy.Engine, and n bare prepared
// OPA evaluations of the same add_participant query on the same store and the same
// inputs, parsed and with their facts (facts.go) built before the clock runs.
func Run(ctx context.Context, agents, contacts int, n int) (Result, error) {
	if n < 1 {
		return Result{}, fmt.Errorf("cannot run policy benchmark: need n >= 1 (got %d)", n)
	}
	s, err := NewSetup(ctx, agents, contacts)
	if err != nil {
		return Result{}, fmt.Errorf("cannot run policy benchmark: %w", err)
	}
	return s.Measure(ctx, n)
}

// Measure measures n decisions of each kind on the setup's engine (see Run).
// add_participant decisions, bare evaluations of the same inputs and a fixed CPU task are
// timed in alternating blocks of benchBlock (about 15 ms each), so all three see the same
// machine (a noisy 2-vCPU VM here): the overhead ratio compares like with like, and the
// task's tail shows the machine's own. Within a block each runs as a tight loop, as a
// busy decision service does.
func (s *Setup) Measure(ctx context.Context, n int) (Result, error) {
	e := s.Engine
	dir := e.Directory()
	adds := s.AddInputs(n)
	msgs := make([]policy.MessageInput, n)
	for i, a := range adds {
		msgs[i] = policy.MessageInput{Agent: a.Actor, Room: a.Room, Tokens: 500, CostMicros: 1000}
	}
	var res Result

	pq, err := rego.New(rego.Query("data.bandplane.add_participant.decision"),
		rego.Compiler(e.Compiler()), rego.Store(dir.Store()), rego.StrictBuiltinErrors(true)).PrepareForEval(ctx)
	if err != nil {
		return res, fmt.Errorf("cannot prepare bare query: %w", err)
	}
	// The same inputs the engine evaluates, facts included, built before the clock runs.
	inputs := make([]ast.Value, n)
	for i, in := range adds {
		v, err := e.EvalInput(policy.AddParticipant, in)
		if err != nil {
			return res, fmt.Errorf("cannot build bare input: %w", err)
		}
		inputs[i] = v
	}
	bare := func(in ast.Value) error {
		rs, err := pq.Eval(ctx, rego.EvalParsedInput(in))
		if err == nil && len(rs) == 0 {
			err = fmt.Errorf("no result")
		}
		if err != nil {
			return fmt.Errorf("cannot evaluate bare query: %w", err)
		}
		return nil
	}
	for i := range min(n, 1000) { // warm up
		if _, err := e.AddParticipant(ctx, adds[i]); err != nil {
			return res, err
		}
		if err := bare(inputs[i]); err != nil {
			return res, err
		}
	}

	lat := make([]time.Duration, n)
	bareLat := make([]time.Duration, n)
	refLat := make([]time.Duration, n)
	refBuf := make([]byte, 1<<10)
	for lo := 0; lo < n; lo += benchBlock {
		hi := min(n, lo+benchBlock)
		for i := lo; i < hi; i++ {
			t0 := time.Now()
			if _, err := e.AddParticipant(ctx, adds[i]); err != nil {
				return res, err
			}
			lat[i] = time.Since(t0)
		}
		for i := lo; i < hi; i++ {
			t0 := time.Now()
			if err := bare(inputs[i]); err != nil {
				return res, err
			}
			bareLat[i] = time.Since(t0)
		}
		for i := lo; i < hi; i++ {
			t0 := time.Now()
			for range 48 {
				sha256.Sum256(refBuf)
			}
			refLat[i] = time.Since(t0)
		}
	}
	res.AddParticipant = latency(lat)
	b := latency(bareLat)
	res.BareOPA = BareResult{P50Us: b.P50Us, P99Us: b.P99Us}
	ref := latency(refLat)
	res.ReferenceCPU = BareResult{P50Us: ref.P50Us, P99Us: ref.P99Us}
	if b.P99Us > 0 {
		res.OverheadRatio = res.AddParticipant.P99Us / b.P99Us
	}

	for i, in := range msgs {
		t0 := time.Now()
		if _, err := e.SendMessage(ctx, in); err != nil {
			return res, err
		}
		lat[i] = time.Since(t0)
	}
	res.SendMessage = latency(lat)
	res.SendMessageReserving, err = s.reserving(ctx, n)
	return res, err
}

// reserving measures send_message with reservations: a fresh engine on the same
// directory (so the rates of the decisions above do not count), a hard day budget on
// every agent, owner and organization, and inputs that go round the (agent, room)
// memberships, so no rate is reached. Each decision carries an estimate and an
// execution id; its usage report settles it once the clock has stopped.
func (s *Setup) reserving(ctx context.Context, n int) (ReservingResult, error) {
	var res ReservingResult
	e, pairs, budgets, err := s.sendEngine(ctx, true)
	if err != nil {
		return res, err
	}
	res.Budgets = budgets
	dir, ledger, now := s.Engine.Directory(), e.Ledger(), time.Now()
	lat := make([]time.Duration, n)
	for i := range n {
		in := pairs[i%len(pairs)]
		in.ExecutionID = fmt.Sprintf("x%d", i)
		t0 := time.Now()
		d, err := e.SendMessage(ctx, in)
		lat[i] = time.Since(t0)
		if err != nil {
			return res, err
		}
		if d.Allow {
			res.Allowed++
			ledger.Spend(policy.Charge{Org: d.Org, Owner: d.Owner, Agent: d.Agent, Room: in.Room, Tokens: 450, CostMicros: 900}, in.ExecutionID, now, now)
		}
	}
	res.LatencyResult = latency(lat)
	def := policy.DefaultLimits{}
	for i := range n {
		in := pairs[i%len(pairs)]
		a, _ := dir.Agent(in.Agent)
		ch := policy.Charge{Org: a.Org, Owner: a.Owner, Agent: a.ID, Room: in.Room, Tokens: 500, CostMicros: 1000}
		exec := fmt.Sprintf("y%d", i)
		t0 := time.Now()
		_, denied := ledger.Reserve(exec, ch, exec, def, now)
		lat[i] = time.Since(t0)
		if denied == nil {
			ch.Tokens, ch.CostMicros = 450, 900
			ledger.Spend(ch, exec, now, now)
		}
	}
	res.Ledger = latency(lat)
	return res, nil
}

// sendEngine is a fresh engine on the setup's directory (so the rates of decisions
// measured before do not count) and the (agent, room) memberships its send_message
// inputs go round, each with an estimate. With budgets, every agent, owner and
// organization has a hard day budget no input reaches.
func (s *Setup) sendEngine(ctx context.Context, withBudgets bool) (e *policy.Engine, pairs []policy.MessageInput, budgets int, err error) {
	dir := s.Engine.Directory()
	ledger := policy.NewLedger(0)
	if e, err = policy.New(ctx, policy.Config{Directory: dir, Ledger: ledger}); err != nil {
		return nil, nil, 0, fmt.Errorf("cannot build the send_message engine: %w", err)
	}
	if withBudgets {
		now := time.Now()
		for _, a := range s.Snapshot.Agents {
			for _, sc := range []struct {
				scope policy.BudgetScope
				id    string
			}{{policy.ScopeAgent, a.ID}, {policy.ScopeOwner, a.Owner}, {policy.ScopeOrg, a.Org}} {
				b := policy.Budget{Org: a.Org, Scope: sc.scope, ScopeID: sc.id, Period: policy.PeriodDay, Tokens: policy.MaxBudget,
					CostMicros: policy.MaxBudget, Hard: true, UpdatedAt: now}
				b.Normalize()
				if _, dup := ledger.Budget(b.ID); !dup && ledger.Set(b, now) {
					budgets++
				}
			}
		}
	}
	for _, room := range s.rooms {
		for _, m := range s.Snapshot.Rooms[room] {
			if a, ok := dir.Agent(m); ok && !a.IsSuspended() {
				pairs = append(pairs, policy.MessageInput{Agent: m, Room: room, Tokens: 500, CostMicros: 1000})
			}
		}
	}
	if len(pairs) == 0 {
		return nil, nil, 0, fmt.Errorf("cannot measure send_message: no agent is in a room")
	}
	return e, pairs, budgets, nil
}

// latency summarizes one decision's latencies; per_s is decisions per second of
// evaluation time (one goroutine).
// benchBlock is how many samples of one kind Measure takes before switching.
const benchBlock = 500

func latency(lat []time.Duration) LatencyResult {
	s := slices.Clone(lat)
	slices.Sort(s)
	var total time.Duration
	for _, d := range s {
		total += d
	}
	us := func(q float64) float64 {
		return float64(s[min(len(s)-1, int(q*float64(len(s))))]) / float64(time.Microsecond)
	}
	return LatencyResult{PerS: float64(len(s)) / total.Seconds(), P50Us: us(0.50), P99Us: us(0.99)}
}

// benchDirectory: owners with five agents each, 50 organizations, 500 rooms of 6
// (an owner and its agents' neighbours), random flags and contacts.
func benchDirectory(rng *rand.Rand, agents, contacts int) policy.Snapshot {
	var s policy.Snapshot
	owners := max(1, agents/5)
	for i := range owners {
		s.People = append(s.People, policy.Person{ID: fmt.Sprintf("u%d", i), Handle: fmt.Sprintf("user%d", i), Org: fmt.Sprintf("org%d", i%50)})
	}
	for i := range agents {
		o := s.People[i%owners]
		s.Agents = append(s.Agents, policy.Agent{
			ID: fmt.Sprintf("a%d", i), Handle: fmt.Sprintf("%s/agent-%d", o.Handle, i), Owner: o.ID, Org: o.Org,
			RegistryAccess: rng.Float64() < 0.8, SharedWithOrg: rng.Float64() < 0.05, Global: rng.Float64() < 0.01,
			Listed: true, Suspended: rng.Float64() < 0.01,
		})
	}
	seen := map[[2]string]bool{}
	for len(s.Contacts) < contacts {
		a, b := s.Agents[rng.IntN(agents)].ID, s.Agents[rng.IntN(agents)].ID
		if a == b || seen[[2]string{a, b}] || seen[[2]string{b, a}] {
			continue
		}
		seen[[2]string{a, b}] = true
		s.Contacts = append(s.Contacts, [2]string{a, b})
	}
	s.Rooms = map[string][]string{}
	for r := range 500 {
		o := s.People[rng.IntN(owners)]
		members := []string{o.ID}
		for range 5 {
			members = append(members, s.Agents[rng.IntN(agents)].ID)
		}
		s.Rooms[fmt.Sprintf("room%d", r)] = members
	}
	return s
}
