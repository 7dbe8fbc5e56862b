package policybench

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
)

// ReplayResult is the replay benchmark: a simulated day of decisions of every kind on
// the setup's directory, made live by an engine that a replica feeds record by record
// (so each decision records its position, as serve's do), then replayed from those
// records with the same bundle.
type ReplayResult struct {
	Decisions int `json:"replay_decisions"`
	Records   int `json:"replay_records"` // of the trail applied, decisions included
	// DecisionsPerS is over the decisions' own time, from the first to the last;
	// SetupSeconds is what comes before: the candidate's checks (its Rego tests, the
	// builtins) and the state at the start of the day.
	DecisionsPerS float64 `json:"replay_decisions_per_s"`
	Seconds       float64 `json:"replay_s"`
	SetupSeconds  float64 `json:"replay_setup_s"`
	// Flips and ReasonChanged of a self-replay: both 0 when the state is rebuilt exactly.
	Flips         int `json:"replay_flips"`
	ReasonChanged int `json:"replay_reason_changed"`
}

const replayPartitions = 4

// trail builds the records of the benchmark, partition by partition with increasing
// offsets, the way the events topic holds them.
type trail struct {
	records []replay.Record
	offsets [replayPartitions]int64
}

func (t *trail) add(key string, ev schema.Event) replay.Record {
	h := fnv.New32a()
	h.Write([]byte(key))
	p := int(h.Sum32() % replayPartitions)
	r := replay.Record{Event: ev, Partition: p, Offset: t.offsets[p]}
	t.offsets[p]++
	t.records = append(t.records, r)
	return r
}

// replayDay is the simulated day.
var replayDay = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)

// Replay makes n decisions over one simulated day and times their replay.
func (s *Setup) Replay(ctx context.Context, n int) (ReplayResult, error) {
	records, err := s.SimulateDay(ctx, n)
	if err != nil {
		return ReplayResult{}, err
	}
	start := time.Now()
	var last replay.Progress
	res, err := replay.Run(ctx, replay.Config{Source: &replay.Memory{Trail: records}, Bundle: policy.DefaultBundle(),
		From: replayDay, To: replayDay.Add(24 * time.Hour), Warmup: time.Minute, Progress: func(p replay.Progress) { last = p }})
	if err != nil {
		return ReplayResult{}, err
	}
	secs := time.Since(start).Seconds()
	return ReplayResult{Decisions: res.Decisions, Records: res.Records, Seconds: secs, DecisionsPerS: float64(res.Decisions) / last.Elapsed.Seconds(),
		SetupSeconds: secs - last.Elapsed.Seconds(), Flips: res.Flips(), ReasonChanged: res.ReasonChanged}, nil
}

// SimulateDay makes n decisions of every kind over one simulated day on the setup's
// directory, live, and returns the trail they leave: the directory's records, the
// changes during the day and the decisions, each with the position it read.
func (s *Setup) SimulateDay(ctx context.Context, n int) ([]replay.Record, error) {
	day := replayDay
	var tr trail
	at := day.Add(-time.Hour)
	ev := func(typ, org, room string, actor schema.Party, subject *schema.Party, data any) schema.Event {
		raw, _ := json.Marshal(data)
		return schema.Event{ID: schema.NewID(), Type: typ, Time: at, OrgID: org, RoomID: room, Actor: actor, Subject: subject,
			Source: "bench", SchemaVersion: schema.Version, Data: raw}
	}
	sys := schema.Party{ID: "router", Type: schema.ActorSystem}
	for _, p := range s.Snapshot.People {
		sub := schema.Party{ID: p.ID, Type: schema.ActorUser}
		tr.add(p.Org, ev(schema.TypeUserRegistered, p.Org, "", sys, &sub, schema.UserData{Handle: p.Handle}))
	}
	for _, a := range s.Snapshot.Agents {
		sub := schema.Party{ID: a.ID, Type: schema.ActorAgent}
		tr.add(a.Org, ev(schema.TypeAgentRegistered, a.Org, "", schema.Party{ID: a.Owner, Type: schema.ActorUser}, &sub,
			schema.AgentData{Handle: a.Handle, OwnerID: a.Owner, Model: a.Model, PersonalRegistryAccess: a.RegistryAccess,
				SharedWithOrg: a.SharedWithOrg, Global: a.Global, Listed: a.Listed, Suspended: a.Suspended}))
	}
	for _, c := range s.Snapshot.Contacts {
		sub := schema.Party{ID: c[1], Type: schema.ActorAgent}
		tr.add(c[0], ev(schema.TypeContactAdded, "", "", schema.Party{ID: c[0], Type: schema.ActorAgent}, &sub, schema.ContactData{}))
	}
	for _, room := range s.rooms {
		for _, m := range s.Snapshot.Rooms[room] {
			sub := schema.Party{ID: m, Type: schema.ActorAgent}
			tr.add(room, ev(schema.TypeParticipantAdded, "", room, sys, &sub, schema.ParticipantData{ParticipantID: m}))
		}
	}

	// The live side: a directory that a replica feeds record by record.
	now := day
	clock := func() time.Time { return now }
	dir := policy.NewDirectory()
	ledger := policy.NewLedger(0)
	rep, err := replica.New(replica.Config{Directory: dir, Registrations: directory.New(), Ledger: ledger, Catalog: pricing.Default(), Now: clock})
	if err != nil {
		return nil, err
	}
	applied := 0
	apply := func() {
		for ; applied < len(tr.records); applied++ {
			r := tr.records[applied]
			dir.Applying(r.Partition, r.Offset+1, func() { _ = rep.Apply(ctx, &r.Event) })
		}
	}
	if err := dir.Bulk(ctx, apply); err != nil {
		return nil, err
	}
	engine, err := policy.New(ctx, policy.Config{Directory: dir, Ledger: ledger, Limiter: policy.NewLimiter(), Now: clock})
	if err != nil {
		return nil, err
	}
	agents := s.Snapshot.Agents
	step := 24 * time.Hour / time.Duration(n)
	for i := range n {
		now = day.Add(time.Duration(i) * step)
		at = now.Truncate(time.Millisecond)
		if i%500 == 499 {
			// The directory changes during the day: someone joins a room.
			room := s.rooms[s.rng.IntN(len(s.rooms))]
			sub := schema.Party{ID: agents[s.rng.IntN(len(agents))].ID, Type: schema.ActorAgent}
			tr.add(room, ev(schema.TypeParticipantAdded, "", room, sys, &sub, schema.ParticipantData{ParticipantID: sub.ID}))
			apply()
		}
		room := s.rooms[s.rng.IntN(len(s.rooms))]
		members := s.Snapshot.Rooms[room]
		member := members[1+s.rng.IntN(len(members)-1)] // an agent (the first member is a person)
		other := agents[s.rng.IntN(len(agents))]
		var name string
		var in any
		switch i % 10 {
		case 0, 1, 2:
			name, in = policy.PeerVisible, &policy.PeerInput{Agent: member, Candidate: other.ID}
		case 3, 4:
			name, in = policy.AddParticipant, &policy.AddInput{Actor: member, Room: room, Participant: other.ID}
		case 5:
			name, in = policy.ContactRequest, &policy.ContactInput{From: member, Handle: "@" + other.Handle}
		default:
			name, in = policy.SendMessage, &policy.MessageInput{Agent: member, Room: room, Tokens: 100, ExecutionID: fmt.Sprintf("exec-%d", i)}
		}
		d, err := engine.Decide(ctx, name, in)
		if err != nil {
			return nil, err
		}
		input, _ := json.Marshal(in)
		data, _ := json.Marshal(api.DecidedData{Decision: name, Allow: d.Allow, Reasons: d.Reasons, PolicyRevision: d.PolicyRevision,
			Input: input, Position: d.Position, DecidedAt: d.DecidedAt})
		org := ""
		if a, ok := dir.Agent(member); ok {
			org = a.Org
		}
		e := ev(schema.TypePolicyDecided, org, room, schema.Party{ID: member, Type: schema.ActorAgent}, nil, json.RawMessage(data))
		e.ID, e.Source = d.DecisionID, api.SourcePolicy
		tr.add(room, e)
		apply()
	}

	return tr.records, nil
}
