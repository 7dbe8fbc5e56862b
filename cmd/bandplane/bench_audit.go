package main

import (
	"context"
	"fmt"

	"github.com/bandplane/bandplane/deploy/bench/auditbench"
)

func runBenchAudit(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench audit", "[flags]  (needs `make up`)")
	var st stackFlags
	st.register(fs)
	cfg := auditbench.Config{}
	fs.IntVar(&cfg.Events, "events", 100_000, "stored events, over --orgs organizations and the last day")
	fs.IntVar(&cfg.Orgs, "orgs", 3, "organizations (the export takes the first one's: events/orgs of them)")
	fs.IntVar(&cfg.DataBytes, "data-bytes", 250, "about how large each event's data is")
	fs.BoolVar(&cfg.KeepData, "keep", false, "keep the benchmark database (<clickhouse-db>_bench_audit) and topics")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg.Brokers, cfg.ClickHouse, cfg.Logger = st.brokers(), st.ch, e.log
	cfg.Progress = func(format string, a ...any) { fmt.Fprintf(e.stderr, "bench audit: "+format+"\n", a...) }
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	res, err := auditbench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, res)
}
