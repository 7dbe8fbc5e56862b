package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/pricing"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/keys"
	"github.com/bandplane/bandplane/policy/replica"
)

func init() {
	register("policy", "evaluate a policy decision offline: `policy eval` (see -h)", runPolicy)
}

// policyFlags configure the policy side of `serve`.
type policyFlags struct {
	disabled bool
	dir      string
	group    string
	failOpen string
	resTTL   time.Duration
}

func (p *policyFlags) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.BoolVar(&p.disabled, "no-policy", false, "do not serve policy decisions")
	fs.StringVar(&p.dir, "policy-dir", envOr("BANDPLANE_POLICY_DIR", ""), "policy folder (Rego, tests, data.json), watched for changes (default: the built-in bundle)")
	fs.StringVar(&p.group, "policy-group", "policy-"+host, "consumer group of this process's policy replica (one per process)")
	fs.DurationVar(&p.resTTL, "reservation-ttl", policy.DefaultReservationTTL, "how long a send_message estimate stays reserved against its budgets when no usage report of its execution settles it")
	fs.StringVar(&p.failOpen, "fail-open", "", "comma-separated decisions that may grant access when their audit event cannot be written (default: none, all fail closed)")
}

func (p *policyFlags) engine(ctx context.Context, dir *policy.Directory) (*policy.Engine, error) {
	cfg := policy.Config{Directory: dir, Ledger: policy.NewLedger(p.resTTL)}
	if p.dir != "" {
		cfg.Bundle = os.DirFS(p.dir)
	}
	e, err := policy.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot load policies (--policy-dir %q): %w", p.dir, err)
	}
	return e, nil
}

// policyServer is the policy side of serve: the engine, its HTTP API and the replica
// that keeps its directory current.
type policyServer struct {
	engine  *policy.Engine
	api     *api.API
	replica *replica.Replica
}

// build returns the policy side of serve, or nil with --no-policy.
func (p *policyFlags) build(ctx context.Context, log *slog.Logger, reg prometheus.Registerer, conn driver.Conn,
	st stackFlags, cat pricing.Source, auditor *kafka.Producer, auth keys.Authenticator) (*policyServer, error) {
	if p.disabled {
		return nil, nil
	}
	dir := policy.NewDirectory()
	eng, err := p.engine(ctx, dir)
	if err != nil {
		return nil, err
	}
	failOpen := map[string]bool{}
	for _, n := range strings.Split(p.failOpen, ",") {
		if n = strings.TrimSpace(n); n != "" {
			failOpen[n] = true
		}
	}
	a, err := api.New(api.Config{Engine: eng, Auditor: auditor, FailOpen: failOpen, Auth: auth,
		BundleDir: p.dir, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	ledger := eng.Ledger()
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bandplane_policy_reservations", Help: "Unsettled send_message estimates reserved against budgets."},
			func() float64 { return float64(ledger.Reservations()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bandplane_policy_budget_crossings_dropped_total", Help: "Budget crossings not written because the writer fell behind."},
			func() float64 { return float64(ledger.Dropped()) }),
	)
	r, err := replica.New(replica.Config{Directory: dir, Ledger: eng.Ledger(), Catalog: cat, Conn: conn,
		Database: st.ch.Database, Brokers: st.brokers(), Topic: st.topic, GroupID: p.group, Logger: log})
	if err != nil {
		return nil, err
	}
	return &policyServer{engine: eng, api: a, replica: r}, nil
}

func runPolicy(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "eval" {
		fmt.Fprintln(e.stderr, "usage: bandplane policy eval --directory FILE --decision NAME --input JSON")
		return exitError{code: 2}
	}
	fs := newFlagSet(e, "policy eval", "--directory FILE --decision NAME --input JSON")
	var p policyFlags
	dirFile := fs.String("directory", "", "directory file (JSON, see policy/README.md); required")
	decision := fs.String("decision", "", "peer_visible | add_participant | contact_request | send_message; required")
	input := fs.String("input", "", "the decision's input as JSON, or @FILE; required")
	fs.StringVar(&p.dir, "policy-dir", "", "policy folder (default: the built-in bundle)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *dirFile == "" || *decision == "" || *input == "" {
		fs.Usage()
		return exitError{code: 2}
	}
	raw := []byte(*input)
	if name, ok := strings.CutPrefix(*input, "@"); ok {
		b, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("cannot read --input file: %w", err)
		}
		raw = b
	}
	in, err := api.Input(*decision, raw)
	if err != nil {
		return err
	}
	snap, err := policy.LoadDirectoryFile(*dirFile)
	if err != nil {
		return err
	}
	dir := policy.NewDirectory()
	if err := dir.Load(ctx, snap); err != nil {
		return fmt.Errorf("cannot load directory file %s: %w", *dirFile, err)
	}
	eng, err := p.engine(ctx, dir)
	if err != nil {
		return err
	}
	a, err := api.New(api.Config{Engine: eng})
	if err != nil {
		return err
	}
	d, err := a.Decide(ctx, *decision, in)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, d)
}
