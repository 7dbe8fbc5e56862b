package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/querybench"
	"github.com/bandplane/bandplane/schema/chdb"
)

// The goals of `bench query` on the 2-core machine (the issue's), for the summary.
const (
	goalCostP99Ms          = 100
	goalInitiatorCostP99Ms = 100
	goalOverhead           = 1.2
	goalAuditP99Ms         = 200
)

// goalSubscriberP99Ms is the p99 goal of n subscribers, produce to subscriber, with
// none dropped: 100 ms up to 1,000 subscribers, 500 ms up to 10,000, none beyond.
func goalSubscriberP99Ms(n int) (float64, bool) {
	switch {
	case n <= 1000:
		return 100, true
	case n <= 10_000:
		return 500, true
	}
	return 0, false
}

// subscribersCommand is the hidden command `bench query` runs its own binary with for
// its subscribers' process: they get their own CPU, so that the server's is measured
// on its own. The spec (with the key's token) comes on stdin.
const subscribersCommand = "bench-query-subscribers"

func init() {
	commands[subscribersCommand] = command{hidden: true, run: runBenchQuerySubscribers,
		summary: "the WebSocket subscribers of `bench query`, which runs this command itself"}
}

func runBenchQuerySubscribers(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q: `bench query` sends the spec on stdin", args)
	}
	return querybench.RunSubscribers(ctx, e.stdin, e.stdout, e.stderr)
}

func runBenchQuery(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench query", "[flags]  (needs `make up`)")
	def := chdb.DefaultConfig()
	cfg := querybench.Config{ClickHouse: def}
	kafkaList := fs.String("kafka", envOr("BANDPLANE_KAFKA", "127.0.0.1:19092"), "Kafka bootstrap brokers, comma-separated (env BANDPLANE_KAFKA)")
	fs.StringVar(&cfg.ClickHouse.Addr, "clickhouse", envOr("BANDPLANE_CLICKHOUSE", def.Addr), "ClickHouse native address host:port (env BANDPLANE_CLICKHOUSE)")
	fs.StringVar(&cfg.ClickHouse.User, "clickhouse-user", envOr("BANDPLANE_CLICKHOUSE_USER", def.User), "ClickHouse user")
	cfg.ClickHouse.Password = os.Getenv("BANDPLANE_CLICKHOUSE_PASSWORD")
	fs.DurationVar(&cfg.ClickHouse.ReadTimeout, "clickhouse-timeout", 5*time.Minute, "ClickHouse read timeout (the rollup rebuild after a load reads whole days)")
	fs.StringVar(&cfg.ClickHouse.Database, "db", "bandplane_bench_query", "the benchmark's own database: kept between runs, dropped and loaded again when it does not hold the events asked for")
	fs.StringVar(&cfg.Topic, "topic", "bandplane.bench.query", "Kafka topic of the live phase (created if missing; the live reader starts at its newest offset)")
	fs.IntVar(&cfg.Partitions, "partitions", 4, "partitions of --topic when it is created")
	fs.IntVar(&cfg.Events, "events", 10_000_000, "events in the database")
	fs.IntVar(&cfg.Distinct, "distinct", 200_000, "of them simulated (the rest repeat them in order with fresh ids and times: the simulator makes about 7,000 events/s here)")
	fs.Int64Var(&cfg.Seed, "seed", 1, "simulator seed")
	fs.IntVar(&cfg.Days, "days", 30, "the events are spread evenly over this many days, ending at load time; the reads cover them")
	fs.BoolVar(&cfg.Reload, "reload", false, "load the events again even when --db holds them")
	fs.IntVar(&cfg.BatchSize, "batch-size", 100_000, "rows per ClickHouse insert while loading")
	fs.DurationVar(&cfg.Settle, "settle", 5*time.Minute, "longest wait for ClickHouse's background merges in --db before measuring (0: do not wait)")
	fs.IntVar(&cfg.Queries, "queries", 200, "measured runs of each read (GraphQL, Querier, names lookup, interleaved)")
	fs.IntVar(&cfg.Warmup, "warmup", 20, "unmeasured runs of each read before")
	fs.IntVar(&cfg.Subscribers, "subscribers", 1000, "concurrent WebSocket subscribers to workStatusChanged")
	fs.Float64Var(&cfg.Rate, "rate", 20, "work-status changes produced to Kafka per second")
	fs.DurationVar(&cfg.LiveDuration, "live-duration", 30*time.Second, "how long the changes are produced")
	fs.DurationVar(&cfg.Grace, "grace", 10*time.Second, "how long after the last change subscribers may take before what they miss counts as dropped")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.Brokers, cfg.Logger = splitBrokers(*kafkaList), e.log
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find this binary to run the subscribers with: %w", err)
	}
	cfg.SubscriberCommand = []string{exe, subscribersCommand}
	if *cpuprofile != "" {
		// The subscribers' process profiles itself, beside the run's profile.
		cfg.SubscriberCPUProfile = *cpuprofile + ".subscribers"
	}
	cfg.Progress = func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench: "+format+"\n", a...) }
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	rep, err := querybench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := printJSON(e.stdout, rep.Result); err != nil {
		return err
	}
	writeQuerySummary(e.stderr, rep)
	return nil
}

// writeQuerySummary tells a person what the JSON line means and where the time goes.
func writeQuerySummary(w io.Writer, r querybench.Report) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	how := fmt.Sprintf("loaded by this run in %.0f s", r.Load.Seconds)
	if r.Reused {
		how = fmt.Sprintf("reused, loaded %s in %.0f s", r.Load.LoadedAt.Format(time.RFC3339), r.Load.Seconds)
	}
	p("bench query: %d events over the %s to %s window (%s); data ready after %s, measured in %s",
		r.Events, r.Target.From.Format(time.DateOnly), r.Target.To.Format(time.DateOnly), how,
		r.LoadWall.Round(time.Second), r.MeasureWall.Round(time.Second))

	c := r.Cost
	p("costs by agent and model with names, org %s (%d rows, %d named), %d runs:", r.Target.Org, c.Rows, c.Named, c.GraphQL.N)
	p("  GraphQL             p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms   goal p99 <= %d ms: %s", c.GraphQL.P50, c.GraphQL.P99, c.GraphQL.Max, goalCostP99Ms, met(c.GraphQL.P99 <= goalCostP99Ms))
	p("  Querier.Costs       p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms   (the SQL and the scan, names not included)", c.SQL.P50, c.SQL.P99, c.SQL.Max)
	p("  names lookup        p50 %7.2f ms  p99 %7.2f ms                  (Querier.Names, which the resolver adds)", c.Names.P50, c.Names.P99)
	failures(p, "costs", c.GraphQL, c.SQL, c.Names)
	p("  %s", cpuLine(c.CPU, "server and client"))
	p("  overhead %.2fx (goal <= %.1fx: %s): of the %.2f ms p50 difference, the names lookup is %.2f ms, HTTP + key lookup + gqlgen + JSON the other %.2f ms",
		r.OverheadRatio, goalOverhead, met(r.OverheadRatio <= goalOverhead), c.GraphQL.P50-c.SQL.P50, c.Names.P50, c.GraphQL.P50-c.SQL.P50-c.Names.P50)

	ic := r.InitiatorCost
	p("costs by initiator with names (%d rows, %d named), %d runs:", ic.Rows, ic.Named, ic.GraphQL.N)
	p("  GraphQL             p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms   goal p99 <= %d ms: %s", ic.GraphQL.P50, ic.GraphQL.P99, ic.GraphQL.Max, goalInitiatorCostP99Ms, met(ic.GraphQL.P99 <= goalInitiatorCostP99Ms))
	p("  Querier.Costs       p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms", ic.SQL.P50, ic.SQL.P99, ic.SQL.Max)
	failures(p, "costs by initiator", ic.GraphQL, ic.SQL, ic.Names)

	a := r.Audit
	p("audit page (message.created in room %s, 100 newest), %d events (%d named), %d runs:", r.Target.Room, a.Rows, a.Named, a.GraphQL.N)
	p("  GraphQL             p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms   goal p99 <= %d ms: %s", a.GraphQL.P50, a.GraphQL.P99, a.GraphQL.Max, goalAuditP99Ms, met(a.GraphQL.P99 <= goalAuditP99Ms))
	p("  Querier.AuditEvents p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms", a.SQL.P50, a.SQL.P99, a.SQL.Max)
	p("  names lookups       p50 %7.2f ms  p99 %7.2f ms                  (Names and RoomNames)", a.Names.P50, a.Names.P99)
	p("  GraphQL - Querier p50: %.2f ms, of which names %.2f ms", a.GraphQL.P50-a.SQL.P50, a.Names.P50)
	failures(p, "audit", a.GraphQL, a.SQL, a.Names)
	p("  %s", cpuLine(a.CPU, "server and client"))

	if len(r.Server) > 0 {
		p("ClickHouse's own time per statement (system.query_log, both paths and warm-ups):")
		for _, s := range r.Server {
			p("  %-26s n=%-5d p50 %5.0f ms  p99 %5.0f ms   reads %s rows, %s", s.Kind, s.N, s.P50, s.P99, humanCount(s.ReadRows), humanBytes(s.ReadBytes))
		}
	}

	l := r.Live
	p("live: %d subscribers in a process of their own (connected in %s), %d changes at the given rate:", l.Subscribers, l.Connect.Round(time.Millisecond), l.Produced)
	goal := "no goal above 10,000 subscribers"
	if g, ok := goalSubscriberP99Ms(l.Subscribers); ok {
		goal = fmt.Sprintf("goal p99 <= %.0f ms with 0 dropped: %s", g, met(l.Total.P99 <= g && l.Dropped == 0))
	}
	p("  produce -> subscriber  %s   %s", hop(l.Total), goal)
	p("    producer call        %s   (until Kafka acknowledged; within the next hop)", hop(l.Produce))
	p("    produce -> hub       %s   (Kafka, the live reader's fetch and decode)", hop(l.Kafka))
	p("    hub -> subscriber    %s   (hub fan-out, gqlgen, WebSocket, the subscriber's read)", hop(l.FanOut))
	p("  dropped %d (slow %d, broken %d, missed a change %d)", l.Dropped, l.Slow, l.Broken, l.Missing)
	p("  %s", liveCPULine(l.CPU))
}

// hop is one hop's latencies, aligned.
func hop(d querybench.Dist) string {
	return fmt.Sprintf("p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms", d.P50, d.P99, d.Max)
}

// liveCPULine says where the cores went during the live phase: the server's process,
// the subscribers' and the rest of the machine.
func liveCPULine(u querybench.CPUUse) string {
	own := fmt.Sprintf("the server process (GraphQL, live reader, hub, producer) %.2f, the subscriber process %.2f", u.Self, u.Subscribers)
	if u.Machine == 0 {
		return "cores used: " + own
	}
	return fmt.Sprintf("the machine was %.2f cores busy: %s, everything else (ClickHouse, Kafka, other work) %.2f",
		u.Machine, own, max(u.Machine-u.Self-u.Subscribers, 0))
}

// cpuLine says how busy the machine was: on a shared machine, what the rest of it did
// is part of every figure.
func cpuLine(u querybench.CPUUse, self string) string {
	if u.Machine == 0 {
		return fmt.Sprintf("this process (%s) used %.2f cores", self, u.Self)
	}
	return fmt.Sprintf("the machine was %.2f cores busy: this process (%s) %.2f, everything else (ClickHouse, Kafka, other work) %.2f",
		u.Machine, self, u.Self, max(u.Machine-u.Self, 0))
}

// failures reports the runs of a read that failed (they count with the time they took).
func failures(p func(string, ...any), read string, gql, sql, names querybench.Dist) {
	for _, f := range []struct {
		path string
		d    querybench.Dist
	}{{"GraphQL", gql}, {"Querier", sql}, {"names lookup", names}} {
		if f.d.Failed > 0 {
			p("  %s through %s: %d of %d runs failed, counted with the time they took; first: %s", read, f.path, f.d.Failed, f.d.N, f.d.Err)
		}
	}
}

func humanCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func humanBytes(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.0f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}
