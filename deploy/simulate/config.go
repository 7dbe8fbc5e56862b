package simulate

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bandplane/bandplane/schema"
)

// Config is one simulation. Each field maps 1:1 to a flag of `bandplane simulate`; the
// flag's name is in the field's comment and in Validate's messages.
type Config struct {
	// Seed seeds every random choice (--seed). The same Config, Start included, yields
	// byte-identical lines.
	Seed int64
	// Orgs is the number of organizations (--orgs, >= 1).
	Orgs int
	// OwnersPerOrg is the number of human accounts per organization (--owners-per-org, >= 1).
	OwnersPerOrg int
	// AgentsPerOwner is the number of agents each generated owner has (--agents-per-owner, >= 1).
	AgentsPerOwner int
	// Rooms is the number of chat rooms (--rooms, >= 1). The first is always "Webhook
	// Retries", the second (when there are two or more) the talkative agent's own room.
	Rooms int
	// Events is the number of lines to emit, directory included (--events, >= 0);
	// 0 means until Duration has passed.
	Events int
	// Rate paces the run in events per second of wall-clock time (--rate, >= 0); 0 sends
	// as fast as the sink accepts.
	Rate float64
	// Duration bounds the run's wall-clock time (--duration, >= 0); 0 means no bound.
	// With Events and Duration both 0 the run goes on until its context is cancelled.
	Duration time.Duration
	// Start is the timestamp of the first event (--start, RFC 3339); simulated time then
	// advances at the pace of a busy workspace, independent of Rate. The zero value
	// means the time Run starts, truncated to the second (not reproducible); then, with
	// a Rate, simulated time never runs ahead of the wall clock (a live workload).
	Start time.Time
	// BatchSize is the most lines handed to the Sink in one Send (--batch-size, >= 1).
	// With a Rate, batches are also capped at a tenth of a second's worth of events.
	BatchSize int

	// Agents act only when a message mentions them (or a schedule starts them), so
	// every execution has a trigger and a chain of them leads back to an initiator
	// (schema/cause). The fields below shape those chains; their shares are in [0, 1].

	// Loops is the share of conversations that run away: two agents hand over to each
	// other 8 to 20 times before one answers the person who asked (--loops).
	Loops float64
	// ExplicitTriggers is the share of executions whose frames name their trigger
	// (metadata.trigger_message_id) (--explicit-triggers). Scheduled executions always
	// name theirs (metadata.trigger_source "schedule"): nothing in the room could tell.
	ExplicitTriggers float64
	// LateTriggers is the share of the executions a person's message starts whose
	// trigger is named too, but whose triggering message comes in the stream after the
	// events it caused, and after those of the hand-overs they led to (its time is
	// before them) (--late-triggers). The executions neither share takes name no
	// trigger: bandplane infers it from the room's mentions.
	// ExplicitTriggers + LateTriggers must be <= 1.
	LateTriggers float64
	// Overlap is the share of executions during which a person mentions the agent
	// again, so that the agent's second execution waits for its first to finish: the
	// case that inference from mentions gets wrong (--overlap).
	Overlap float64
	// Truth, when set, is told how each event came to be, as the simulator made it: the
	// ground truth that the links bandplane derives are measured against. It is the one
	// field without a flag. Run calls it from its goroutine, once for each event of an
	// agent's execution (messages, thoughts, tool calls and results, errors, requests
	// for attention, progress notes, usage) and each person's new message, in stream
	// order, after the sink accepted the event's batch. Edits and the room,
	// participant, contact, task and directory events get none.
	Truth func(Truth)
}

// Truth is how one event came to be.
type Truth struct {
	// EventID is the id bandplane gives the event (schema.Decode's: a frame's is
	// derived from its content).
	EventID string
	// Initiator is the root of the event's chain: the person whose message started it,
	// or a system outside chat (Type schema.ActorSystem, ID "schedule"). Handle is
	// empty.
	Initiator schema.Party
	// TriggerMessageID is the platform's id of the message that started the event's
	// execution; empty at a root (a person's message) and for a system's trigger.
	TriggerMessageID string
	// Depth is 0 for a person's message, 1 for an execution it (or a schedule) started,
	// and one more for each hand-over.
	Depth int
	// Explicit says that every trigger from the root to the event was sent, in time or
	// late (cause.Link.Explicit, once late triggers are resolved).
	Explicit bool
	// Late says that the event's trigger is sent but its message comes after the event
	// in the stream.
	Late bool
	// Ambiguous says that inference from mentions cannot get the event's link right: a
	// person mentioned the agent again while an execution whose trigger was not sent
	// still ran (Overlap), before this event, in its execution or one up its chain.
	// Only explicit triggers make such links exact.
	Ambiguous bool
}

// DefaultConfig is the configuration of a plain `bandplane simulate`.
func DefaultConfig() Config {
	return Config{
		Seed:           1,
		Orgs:           3,
		OwnersPerOrg:   3,
		AgentsPerOwner: 3,
		Rooms:          8,
		Events:         10000,
		Rate:           0,
		Duration:       0,
		BatchSize:      500,

		Loops:            0.01,
		ExplicitTriggers: 0.3,
		LateTriggers:     0.03,
		Overlap:          0.005,
	}
}

// maxAgents bounds the generated directory.
const maxAgents = 100_000

// Validate reports every invalid field at once, each naming its flag.
func (c Config) Validate() error {
	var errs []error
	if c.Orgs < 1 {
		errs = append(errs, errors.New("--orgs must be >= 1"))
	}
	if c.OwnersPerOrg < 1 {
		errs = append(errs, errors.New("--owners-per-org must be >= 1"))
	}
	if c.AgentsPerOwner < 1 {
		errs = append(errs, errors.New("--agents-per-owner must be >= 1"))
	}
	if c.Orgs >= 1 && c.OwnersPerOrg >= 1 && c.AgentsPerOwner >= 1 &&
		float64(c.Orgs)*float64(c.OwnersPerOrg)*float64(c.AgentsPerOwner) > maxAgents {
		errs = append(errs, errors.New("--orgs × --owners-per-org × --agents-per-owner must be <= 100000"))
	}
	if c.Rooms < 1 {
		errs = append(errs, errors.New("--rooms must be >= 1"))
	}
	if c.Events < 0 {
		errs = append(errs, errors.New("--events must be >= 0"))
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, errors.New("--rate must be a finite number >= 0"))
	}
	if c.Duration < 0 {
		errs = append(errs, errors.New("--duration must be >= 0"))
	}
	if c.BatchSize < 1 {
		errs = append(errs, errors.New("--batch-size must be >= 1"))
	}
	for _, f := range [...]struct {
		flag  string
		share float64
	}{{"--loops", c.Loops}, {"--explicit-triggers", c.ExplicitTriggers}, {"--late-triggers", c.LateTriggers}, {"--overlap", c.Overlap}} {
		if !(f.share >= 0 && f.share <= 1) { // NaN fails both
			errs = append(errs, fmt.Errorf("%s must be in [0, 1], got %v", f.flag, f.share))
		}
	}
	if c.ExplicitTriggers+c.LateTriggers > 1 {
		errs = append(errs, fmt.Errorf("--explicit-triggers + --late-triggers must be <= 1, got %v + %v", c.ExplicitTriggers, c.LateTriggers))
	}
	return errors.Join(errs...)
}
