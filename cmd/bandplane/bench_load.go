package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/loadbench"
	"github.com/bandplane/bandplane/schema/chdb"
)

// hostileCommand is the hidden command `bench load` runs its own binary with for its
// hostile clients' process: they then share no Go scheduler or heap with the
// legitimate clients it times. The spec (with the keys' tokens) comes on stdin.
const hostileCommand = "bench-load-hostile"

func init() {
	commands[hostileCommand] = command{hidden: true, run: runBenchLoadHostile,
		summary: "the hostile clients of `bench load`, which runs this command itself"}
}

func runBenchLoadHostile(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q: `bench load` sends the spec on stdin", args)
	}
	return loadbench.RunHostile(ctx, e.stdin, e.stdout)
}

func runBenchLoad(ctx context.Context, e *env, args []string) error {
	cfg, cpuprofile, err := benchLoadConfig(e, args)
	if err != nil {
		return err
	}
	cfg.Logger = e.log
	cfg.Progress = func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench load: "+format+"\n", a...) }
	stopProfile, err := startCPUProfile(cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	rep, err := loadbench.Run(ctx, cfg)
	if err != nil {
		if rep.ServeLog != "" {
			fmt.Fprintf(e.stderr, "bench load: serve's output is kept in %s\n", rep.ServeLog)
		}
		return err
	}
	if err := printJSON(e.stdout, rep.Result); err != nil {
		return err
	}
	writeLoadSummary(e.stderr, rep)
	return nil
}

// benchLoadConfig reads and checks the flags of `bench load`, without touching the
// stack.
func benchLoadConfig(e *env, args []string) (cfg loadbench.Config, cpuprofile string, err error) {
	fs := newFlagSet(e, "bench load", "[flags]  (needs `make up`)")
	// The connection flags of stackFlags, without the database and topic ones: the run
	// makes its own (bench_load_<stamp>, bench-load-<stamp>).
	def := chdb.DefaultConfig()
	cfg.ClickHouse = def
	kafkaList := fs.String("kafka", envOr("BANDPLANE_KAFKA", "127.0.0.1:19092"), "Kafka bootstrap brokers, comma-separated (env BANDPLANE_KAFKA)")
	fs.StringVar(&cfg.ClickHouse.Addr, "clickhouse", envOr("BANDPLANE_CLICKHOUSE", def.Addr), "ClickHouse native address host:port, or several comma-separated (env BANDPLANE_CLICKHOUSE)")
	fs.StringVar(&cfg.ClickHouse.User, "clickhouse-user", envOr("BANDPLANE_CLICKHOUSE_USER", def.User), "ClickHouse user (serve inherits the password of the environment)")
	cfg.ClickHouse.Password = os.Getenv("BANDPLANE_CLICKHOUSE_PASSWORD")
	fs.DurationVar(&cfg.ClickHouse.ReadTimeout, "clickhouse-timeout", def.ReadTimeout, "ClickHouse read timeout, the benchmark's and serve's")
	fs.StringVar(&cfg.ClickHouse.Cluster, "cluster", envOr("BANDPLANE_CLICKHOUSE_CLUSTER", ""), "ClickHouse cluster to make the run's database on, and serve's --cluster; empty: one server (env BANDPLANE_CLICKHOUSE_CLUSTER)")
	fs.IntVar(&cfg.ClickHouse.InsertQuorum, "insert-quorum", 2, "with --cluster: serve's --insert-quorum")
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long each phase (alone, then under attack) is measured, over all its rounds")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds of alone then under attack, each measuring --duration over --rounds: what the machine does besides falls on both phases alike")
	fs.DurationVar(&cfg.Warmup, "warmup", 3*time.Second, "how long each phase's load runs, unmeasured, once its subscribers are connected")
	fs.IntVar(&cfg.Subscribers, "subscribers", 100, "WebSocket subscribers to workStatusChanged of the legitimate tenant (25 to a viewer key)")
	hostile := fs.String("hostile", "all", "hostile clients of the attack phase: all, none (the attack phase measures the machine's noise), or a comma-separated list of "+
		strings.Join(loadbench.HostileKinds, ", "))
	fs.IntVar(&cfg.AuditLoops, "hostile-audit-loops", 1, "concurrent loops of the hostile tenant's key reading its largest events")
	fs.BoolVar(&cfg.KeepData, "keep", false, "keep the run's database (bench_load_<stamp>), topics (bench-load-<stamp>*) and serve's log and metrics")
	var serveArgs listFlag
	fs.Var(&serveArgs, "serve-arg", "one more flag for serve, as --name=value (repeatable), e.g. --serve-arg=--graphql-clickhouse-conns=8")
	fs.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of this process (the clients, not serve) to this file")
	if err := parse(fs, args); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.ServeArgs, cfg.Brokers = serveArgs, splitBrokers(*kafkaList)
	exe, exeErr := os.Executable()
	if exeErr != nil {
		exeErr = fmt.Errorf("cannot find this binary to run serve with: %w", exeErr)
	}
	cfg.ServeCommand, cfg.HostileCommand = []string{exe, "serve"}, []string{exe, hostileCommand}
	cfg.Hostile, err = loadbench.ParseHostile(*hostile)
	if err := errors.Join(exeErr, err, cfg.Validate()); err != nil {
		return cfg, "", err
	}
	return cfg, cpuprofile, nil
}

// writeLoadSummary tells a person what the JSON line means: each figure alone and
// under attack, the goal, where the cores went, what the hostile clients did and why
// anything was refused.
func writeLoadSummary(w io.Writer, r loadbench.Report) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("bench load: %s alone, then %s beside %s, in %d alternating rounds; %d subscribers; set up in %s (%d events of org-a, %d messages of %d KiB of org-h, hostile pages of %d)",
		time.Duration(r.DurationS*float64(time.Second)), time.Duration(r.DurationS*float64(time.Second)), hostileList(r.Hostile.Kinds),
		r.Rounds, r.Subscribers, r.Setup.Round(time.Second), r.Seeded.EventsA, r.Seeded.LargeEvents, r.Seeded.LargeBytes>>10, r.Seeded.AuditLimit)
	p("  %-20s %28s   %28s   %s", "figure", "alone p50 / p99 ms (n)", "attack p50 / p99 ms (n)", "p99 ratio")
	for _, k := range loadbench.Kinds {
		f, ok := r.Legit[k]
		if !ok {
			continue
		}
		p("  %-20s %28s   %28s   %s", k, phaseCell(f.Alone), phaseCell(f.Attack), ratioCell(f.Ratio))
	}
	met := "NOT met"
	if r.GoalMet {
		met = "met"
	}
	worst := "none measured"
	if r.Worst != "" {
		worst = fmt.Sprintf("%.2f (%s)", r.WorstRatio, r.Worst)
	}
	p("  worst ratio %s, legitimate requests refused under attack %d (alone %d): goal (every p99 ratio <= %.1f, nothing refused) %s",
		worst, r.LegitRefused, r.LegitRefusedAlone, loadbench.GoalRatio, met)
	if len(r.Unmeasured) > 0 {
		p("  no ratio (a phase answered none): %s", strings.Join(r.Unmeasured, ", "))
	}
	p("  cores alone / under attack: serve %.2f / %.2f; the legitimate clients %.2f / %.2f; the hostile clients - / %.2f; the machine %.2f / %.2f, of which ClickHouse, Kafka and other work %.2f / %.2f",
		r.ServerCPUCores.Alone, r.ServerCPUCores.Attack, r.BenchCPUCores.Alone, r.BenchCPUCores.Attack, r.HostileCPUCores,
		r.MachineCPUCores.Alone, r.MachineCPUCores.Attack,
		max(r.MachineCPUCores.Alone-r.ServerCPUCores.Alone-r.BenchCPUCores.Alone, 0),
		max(r.MachineCPUCores.Attack-r.ServerCPUCores.Attack-r.BenchCPUCores.Attack-r.HostileCPUCores, 0))
	p("  task changes: %d alone, %d under attack, each to every subscriber", r.Changes["alone"], r.Changes["attack"])
	h := r.Hostile
	p("  hostile: idle upgrades %d held (%d refused 503, %d ended by the server); trickle bodies %d held (%d refused 429); large pages %d answered (%.0f MiB, %d refused); keyless %d sent (%.0f/s, %d broken)",
		h.IdleUpgrades, h.IdleRefused, h.IdleClosed, h.TrickleHeld, h.TrickleRefuse, h.AuditPages, h.AuditMiB, h.AuditRefused, h.KeylessSent, h.KeylessPerS, h.KeylessErrors)
	for _, f := range r.Refusals {
		var parts []string
		for _, reason := range sortedKeys(f.Reasons) {
			parts = append(parts, fmt.Sprintf("%d %s (first: %.200s)", f.Reasons[reason], reason, f.First[reason]))
		}
		if f.Skipped > 0 {
			parts = append(parts, fmt.Sprintf("%d ticks skipped, every client busy", f.Skipped))
		}
		p("  %s %s: %s", f.Phase, f.Kind, strings.Join(parts, "; "))
	}
	for _, k := range sortedKeys(r.SubscriberEnds) {
		p("  subscriptions ended by the server, %s: %d", k, r.SubscriberEnds[k])
	}
	if r.ServeLog != "" {
		p("  serve's log and metrics: %s", r.ServeLog)
	}
}

func hostileList(kinds []string) string {
	if len(kinds) == 0 {
		return "no hostile client"
	}
	return strings.Join(kinds, ", ")
}

func phaseCell(s loadbench.PhaseStats) string {
	c := fmt.Sprintf("%.1f / %.1f (%d)", s.P50Ms, s.P99Ms, s.N)
	if s.Refused > 0 {
		c += fmt.Sprintf(" %d refused", s.Refused)
	}
	return c
}

func ratioCell(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *r)
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
