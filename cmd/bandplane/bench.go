package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/bandplane/bandplane/deploy/bench"
)

func init() {
	registerGroup("bench", "measure the stack: `bench ingest`, `bench policy`, `bench query`, `bench audit`, `bench load` (see -h)", "usage: bandplane bench ingest|policy|query|audit|load [flags]\n",
		map[string]runFunc{"ingest": runBenchIngest, "policy": runBenchPolicy, "query": runBenchQuery, "audit": runBenchAudit, "load": runBenchLoad})
}

func runBenchIngest(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench ingest", "[flags]  (needs `make up`)")
	var st stackFlags
	st.register(fs)
	cfg := bench.Config{}
	fs.IntVar(&cfg.Events, "events", 1_000_000, "events in the workload")
	fs.Int64Var(&cfg.Seed, "seed", 1, "simulator seed")
	fs.IntVar(&cfg.BatchSize, "batch-size", 50000, "ClickHouse batch size, for both the raw inserts and the pipeline")
	fs.DurationVar(&cfg.BatchAge, "batch-age", 500*time.Millisecond, "pipeline batch age")
	fs.IntVar(&cfg.Partitions, "partitions", 4, "partitions of the benchmark topics")
	fs.DurationVar(&cfg.Freshness, "freshness", 20*time.Second, "how long the freshness phase produces")
	fs.DurationVar(&cfg.RollupInterval, "rollup-interval", 10*time.Second, "rollup rebuild interval, as serve's")
	fs.IntVar(&cfg.ProbeEvery, "probe-every", 100, "time every n-th event of the freshness phase")
	fs.BoolVar(&cfg.KeepData, "keep", false, "keep the benchmark databases")
	otlpOn := fs.Bool("otlp", false, "add the OTLP phase: usage reports through the native collector (POST /v1/events) and the OTLP receiver (POST /v1/traces), side by side, to queryable usage")
	fs.IntVar(&cfg.OTLPReports, "otlp-reports", 200_000, "usage reports of each pass of the OTLP phase (two rounds of each way, interleaved)")
	fs.IntVar(&cfg.OTLPBatch, "otlp-batch", 1000, "usage reports (events or spans) per request of the OTLP phase")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !*otlpOn {
		cfg.OTLPReports = 0
	}
	cfg.Brokers, cfg.ClickHouse, cfg.Logger = st.brokers(), st.ch, e.log
	cfg.Progress = func(format string, a ...any) {
		fmt.Fprintf(e.stderr, "bench: "+format+"\n", a...)
	}
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, res)
}

// startCPUProfile writes a CPU profile of the rest of the run to path (the benches'
// --cpuprofile); with an empty path it does nothing. Call stop when the run ends.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cannot create --cpuprofile file: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cannot start the CPU profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}
