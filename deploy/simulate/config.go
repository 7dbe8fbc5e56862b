package simulate

import (
	"errors"
	"math"
	"time"
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
	return errors.Join(errs...)
}
