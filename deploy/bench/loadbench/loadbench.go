// Package loadbench measures fair share on the real stack (`bandplane bench load`): a
// `bandplane serve` child process on a database and topic of the run's own, the
// latencies of legitimate clients of one tenant (collector posts, a cost query, an
// audit page, WebSocket subscribers, policy decisions) alone, then again while hostile
// clients run beside them (idle WebSocket upgrades, slow-trickle collector bodies,
// another tenant's key reading its largest events in a loop, requests without a key),
// and the ratio of each figure under attack to alone. It owns the benchmark's world,
// its clients, the hostile clients' process (RunHostile) and the report; serve is the
// binary's, run as a child so that the server's CPU is its own, and the hostile
// clients run in another child so that they share no Go scheduler with the
// legitimate ones the benchmark times.
//
// It may import any folder but cmd/ (deploy/layers).
package loadbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/bandplane/bandplane/schema/chdb"
)

// The hostile clients (Config.Hostile), by the name --hostile takes.
const (
	HostileIdle    = "idle-websockets" // upgrades that never send connection_init
	HostileTrickle = "trickle"         // collector bodies of a few bytes a second, one tenant key
	HostileAudit   = "audit"           // another tenant's key reading its largest events in a loop
	HostileKeyless = "keyless"         // requests without a key
)

// HostileKinds lists every hostile client, in the order they start.
var HostileKinds = []string{HostileIdle, HostileTrickle, HostileAudit, HostileKeyless}

// ParseHostile reads --hostile: "all", "none", or a comma-separated list of
// HostileKinds. "none" makes the attack phase a second alone phase: its ratios are
// the machine's noise.
func ParseHostile(s string) ([]string, error) {
	switch strings.TrimSpace(s) {
	case "all":
		return slices.Clone(HostileKinds), nil
	case "none":
		return []string{}, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(HostileKinds, k) {
			return nil, fmt.Errorf("--hostile: unknown hostile client %q (all, none, or a comma-separated list of %s)", k, strings.Join(HostileKinds, ", "))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// Config of one run.
type Config struct {
	// ServeCommand runs `bandplane serve`: the binary and its arguments up to the
	// flags (bandplane passes its own binary and "serve").
	ServeCommand []string
	// HostileCommand runs the hostile process (RunHostile): bandplane passes its own
	// binary and a hidden command.
	HostileCommand []string
	// ServeArgs are more flags for serve (--serve-arg), after the benchmark's own.
	ServeArgs  []string
	ClickHouse chdb.Config // Database is ignored: the run makes bench_load_<stamp>
	Brokers    []string

	Duration    time.Duration // each phase's measured window, over all its rounds (--duration)
	Rounds      int           // alone and attack phases, alternating, of Duration/Rounds each (--rounds)
	Warmup      time.Duration // unmeasured load before it (--warmup)
	Subscribers int           // WebSocket subscribers (--subscribers)
	Hostile     []string      // the hostile clients of the attack phase (--hostile)
	AuditLoops  int           // the hostile tenant's concurrent auditEvents loops (--hostile-audit-loops)
	KeepData    bool          // keep the database, the topics and serve's log (--keep)

	Logger   *slog.Logger
	Progress func(format string, args ...any)
}

// Bounds of the configuration, each a flag's.
const (
	minDuration    = time.Second
	maxDuration    = time.Hour
	maxWarmup      = 10 * time.Minute
	maxSubscribers = 1000
	maxRounds      = 20
	// maxAuditLoops is serve's default --graphql-max-concurrent-per-key twice over:
	// more loops than that are refused at once by the server and measure nothing new.
	maxAuditLoops = 8
)

// serveOwnFlags are the serve flags the benchmark sets itself: given again through
// --serve-arg, the last would win and the benchmark would talk to another server, or
// read another database, than the one it made.
var serveOwnFlags = []string{"listen", "metrics-listen", "clickhouse", "clickhouse-db", "clickhouse-user", "kafka",
	"topic", "dlq-topic", "group", "policy-group", "cluster", "insert-quorum", "no-policy", "no-live", "no-consumer"}

// Validate reports every invalid field at once, each naming its flag.
func (c *Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Duration >= minDuration && c.Duration <= maxDuration, "--duration must be %s to %s, got %s", minDuration, maxDuration, c.Duration)
	check(c.Rounds >= 1 && c.Rounds <= maxRounds, "--rounds must be 1 to %d, got %d", maxRounds, c.Rounds)
	check(c.Rounds < 1 || c.Duration/time.Duration(max(c.Rounds, 1)) >= minDuration, "--duration %s over --rounds %d leaves less than %s a round", c.Duration, c.Rounds, minDuration)
	check(c.Warmup >= 0 && c.Warmup <= maxWarmup, "--warmup must be 0 to %s, got %s", maxWarmup, c.Warmup)
	check(c.Subscribers >= 1 && c.Subscribers <= maxSubscribers, "--subscribers must be 1 to %d, got %d", maxSubscribers, c.Subscribers)
	check(c.AuditLoops >= 1 && c.AuditLoops <= maxAuditLoops, "--hostile-audit-loops must be 1 to %d, got %d", maxAuditLoops, c.AuditLoops)
	check(len(c.Brokers) > 0, "no kafka brokers (--kafka)")
	check(len(c.ServeCommand) > 0 && c.ServeCommand[0] != "", "no command to run serve with (Config.ServeCommand)")
	check(len(c.HostileCommand) > 0 && c.HostileCommand[0] != "", "no command to run the hostile clients with (Config.HostileCommand)")
	for _, k := range c.Hostile {
		check(slices.Contains(HostileKinds, k), "--hostile: unknown hostile client %q", k)
	}
	for _, a := range c.ServeArgs {
		name, ok := flagName(a)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("--serve-arg %q is not a flag (-name or --name[=value]): give each flag of serve, with its value after '=', as one --serve-arg", a))
		case slices.Contains(serveOwnFlags, name):
			errs = append(errs, fmt.Errorf("--serve-arg %q: the benchmark sets serve's --%s itself", a, name))
		}
	}
	db := c.ClickHouse
	db.Database = "bench_load_check" // the run's own; only the rest is the caller's
	if err := db.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// flagName is the name of a command-line flag ("--name=v", "-name"), and false when a
// is not one.
func flagName(a string) (string, bool) {
	if !strings.HasPrefix(a, "-") {
		return "", false
	}
	name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	name, _, _ = strings.Cut(name, "=")
	if name == "" || strings.HasPrefix(name, "-") || strings.ContainsAny(name, " \t\r\n") {
		return "", false
	}
	return name, true
}

// Report is the Result with what explains it, for the human summary.
type Report struct {
	Result
	Database, Topic string
	ServeLog        string // serve's output, when kept (--keep, or a failed run)
	Seeded          Seeded
	Refusals        []Refusals
	SubscriberEnds  map[string]int // subscriptions the server ended, by phase and reason
	Changes         map[string]int // task changes produced in each phase's measured window
	Setup           time.Duration  // making the stack, starting serve, seeding
}

// Seeded is what the run loaded before measuring.
type Seeded struct {
	EventsA     int // org-a's events
	LargeEvents int // org-h's large messages
	LargeBytes  int // the content of each
	AuditLimit  int // events of each hostile auditEvents page
}

// Run makes the stack, starts serve, seeds it, then measures alone and under attack.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	// Every WebSocket, hostile or not, is a file here and one in serve (which inherits
	// the raised limit).
	if err := raiseFileLimit(2*(cfg.Subscribers+idleUpgrades) + 1024); err != nil {
		return Report{}, err
	}
	start := time.Now()
	st, err := newStack(ctx, &cfg)
	if err != nil {
		return Report{}, err
	}
	rep.Database, rep.Topic = st.names.db, st.names.topic
	// A failed run keeps serve's log (not the data): the error points to it.
	defer func() { rep.ServeLog = st.close(ctx, cfg.KeepData, err != nil) }()
	cfg.Progress("database %s, topic %s; serve's output goes to %s", st.names.db, st.names.topic, st.logPath)
	if err := st.startServer(ctx); err != nil {
		return rep, err
	}
	cfg.Progress("serve is ready at %s (pid %d)", st.url, st.pid())
	if rep.Seeded, err = st.seed(ctx); err != nil {
		return rep, err
	}
	rep.Setup = time.Since(start)

	b := newBench(&cfg, st)
	defer b.close()
	// The phases alternate, round after round, so that what the machine does besides
	// (ClickHouse's merges, Kafka's flushes, another process) falls on both alike.
	alone, attack := newPhase(phaseAlone), newPhase(phaseAttack)
	var rounds [2][]phaseResult
	for r := range cfg.Rounds {
		for i, p := range []*phase{alone, attack} {
			var hostile []string
			if p == attack {
				hostile = cfg.Hostile
			}
			res, err := b.phase(ctx, p, r, hostile)
			if err != nil {
				return rep, err
			}
			rounds[i] = append(rounds[i], res)
		}
	}
	aloneRes, attackRes := combine(rounds[0]), combine(rounds[1])
	rep.Result = buildResult(alone, attack)
	rep.DurationS, rep.Subscribers, rep.Rounds = cfg.Duration.Seconds(), cfg.Subscribers, cfg.Rounds
	rep.ServerCPUCores = CPU{Alone: aloneRes.cpu.server, Attack: attackRes.cpu.server}
	rep.BenchCPUCores = CPU{Alone: aloneRes.cpu.self, Attack: attackRes.cpu.self}
	rep.HostileCPUCores = attackRes.cpu.hostile
	rep.MachineCPUCores = CPU{Alone: aloneRes.cpu.machine, Attack: attackRes.cpu.machine}
	rep.Hostile = attackRes.hostile
	rep.Hostile.Kinds = append([]string{}, cfg.Hostile...)
	rep.Refusals = append(refusalsOf(alone), refusalsOf(attack)...)
	rep.SubscriberEnds = map[string]int{}
	for _, p := range []phaseResult{aloneRes, attackRes} {
		for reason, n := range p.ends {
			rep.SubscriberEnds[p.samples.name+": "+reason] += n
		}
	}
	rep.Changes = map[string]int{phaseAlone: aloneRes.changes, phaseAttack: attackRes.changes}
	return rep, nil
}

// raiseFileLimit raises this process's soft limit of open files to its hard limit and
// says when even that is under need.
func raiseFileLimit(need int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("cannot read the open-file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	if uint64(need) > lim.Cur {
		return fmt.Errorf("the benchmark needs about %d open files (a WebSocket is one on each side) but may open %d (RLIMIT_NOFILE; hard limit %d): raise it (ulimit -n) or ask for fewer --subscribers",
			need, lim.Cur, lim.Max)
	}
	return nil
}
