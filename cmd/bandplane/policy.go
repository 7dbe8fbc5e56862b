package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
)

func init() {
	registerGroup("policy", "evaluate a policy decision offline (`policy eval`); replay the trail's decisions with a candidate bundle (`policy replay`)",
		"usage: bandplane policy eval --directory FILE --decision NAME --input JSON\n       bandplane policy replay "+policyReplayUsage+"\n",
		map[string]runFunc{"eval": runPolicyEval, "replay": runPolicyReplay})
}

// policyFlags configure the policy side of `serve`.
type policyFlags struct {
	disabled bool
	dir      string
	group    string
	failOpen string
	resTTL   time.Duration
	peers    string
	self     string
	// The replay gate of hot reloads: the largest flip ratio a new bundle may have over
	// the decisions of the last gateWindow (negative: no gate).
	maxFlipRatio float64
	gateWindow   time.Duration
	// replayMaxMemory bounds each replay's process (the gate's, the API's jobs'); 0
	// runs replays in this process, without a bound.
	replayMaxMemory int64
}

func (p *policyFlags) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.BoolVar(&p.disabled, "no-policy", false, "do not serve policy decisions")
	fs.StringVar(&p.dir, "policy-dir", envOr("BANDPLANE_POLICY_DIR", ""), "policy folder (Rego, tests, data.json), watched for changes (default: the built-in bundle)")
	fs.StringVar(&p.group, "policy-group", "policy-"+host, "consumer group of this process's policy replica (one per process)")
	fs.DurationVar(&p.resTTL, "reservation-ttl", policy.DefaultReservationTTL, "how long a send_message estimate stays reserved against its budgets when no usage report of its execution settles it")
	fs.StringVar(&p.failOpen, "fail-open", "", "comma-separated decisions that may grant access when their audit event cannot be written (default: none, all fail closed)")
	fs.StringVar(&p.peers, "policy-peers", envOr("BANDPLANE_POLICY_PEERS", ""), "comma-separated base URLs of every policy replica of the deployment, the same list on each (env BANDPLANE_POLICY_PEERS); organizations are sharded over them and a send_message of another replica's organization is answered 421 with its owner (default: this process is the only replica)")
	fs.StringVar(&p.self, "policy-self", envOr("BANDPLANE_POLICY_SELF", ""), "this replica's own base URL in --policy-peers (env BANDPLANE_POLICY_SELF)")
	fs.Float64Var(&p.maxFlipRatio, "policy-max-flip-ratio", -1, "before a hot reload, replay the decisions of the last --policy-gate-window with the new bundle and refuse it (audited as policy.reload_refused) when more than this share of them flip, 0..1 (default: no gate)")
	fs.DurationVar(&p.gateWindow, "policy-gate-window", 24*time.Hour, "how far back the replay gate of --policy-max-flip-ratio replays")
	fs.Int64Var(&p.replayMaxMemory, "policy-replay-max-memory", defaultReplayMaxMemory, "bytes of memory each policy replay (the reload gate's, startPolicyReplay's) may take, in a process of its own that is stopped at the bound (at least 64 MiB; 0: replays run in this process, unbounded)")
}

// gate is the replay gate of hot reloads, nil without --policy-max-flip-ratio.
func (p *policyFlags) gate(run replayRunFunc, conn driver.Conn, db string, cat pricing.Source, log *slog.Logger) (func(context.Context, fs.FS) error, error) {
	if p.maxFlipRatio < 0 {
		return nil, nil
	}
	if p.maxFlipRatio > 1 {
		return nil, fmt.Errorf("--policy-max-flip-ratio must be between 0 and 1 (a share of the decisions), got %g", p.maxFlipRatio)
	}
	if p.gateWindow <= 0 {
		return nil, fmt.Errorf("--policy-gate-window must be > 0, got %s", p.gateWindow)
	}
	return func(ctx context.Context, bundle fs.FS) error {
		to := time.Now().UTC()
		from := to.Add(-p.gateWindow)
		res, err := run(ctx, replay.Config{Source: replay.ClickHouse{Conn: conn, Database: db}, Bundle: bundle,
			From: from, To: to, Catalog: cat, Logger: log})
		if err != nil {
			return fmt.Errorf("the replay gate cannot replay the last %s with the new bundle: %w", p.gateWindow, err)
		}
		if res.Ratio() > p.maxFlipRatio {
			return &api.GateRefusal{Revision: res.Bundle.Revision, From: from, To: to, Decisions: res.Decisions,
				AllowToDeny: res.AllowToDeny, DenyToAllow: res.DenyToAllow, FlipRatio: res.Ratio(), MaxRatio: p.maxFlipRatio}
		}
		log.Info("the replay gate passes the new policy bundle", "policy_revision", res.Bundle.Revision, "decisions", res.Decisions,
			"allow_to_deny", res.AllowToDeny, "deny_to_allow", res.DenyToAllow, "flip_ratio", res.Ratio())
		return nil
	}, nil
}

// shards is the assignment of organizations to the replicas of --policy-peers, or nil
// without it (one replica: every organization is this process's).
func (p *policyFlags) shards() (*shard.Shards, error) {
	var peers []string
	for _, u := range strings.Split(p.peers, ",") {
		if u = strings.TrimSpace(u); u != "" {
			peers = append(peers, u)
		}
	}
	if len(peers) == 0 {
		if strings.TrimSpace(p.self) != "" {
			return nil, fmt.Errorf("--policy-self %q needs --policy-peers (env BANDPLANE_POLICY_PEERS), the list of every replica it is one of", p.self)
		}
		return nil, nil
	}
	if strings.TrimSpace(p.self) == "" {
		return nil, errors.New("--policy-peers needs --policy-self (env BANDPLANE_POLICY_SELF): this replica's own entry of the list")
	}
	s, err := shard.New(shard.Config{Peers: peers, Self: strings.TrimSpace(p.self)})
	if err != nil {
		return nil, fmt.Errorf("invalid --policy-peers %q / --policy-self %q: %w", p.peers, p.self, err)
	}
	return s, nil
}

// maxWindow is the largest quota window (window_seconds) of the bundle's policy data,
// 0 when it names none: how far back a restarted replica reads decisions.
func maxWindow(bundle fs.FS) (time.Duration, error) {
	raw, err := fs.ReadFile(bundle, "data.json")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var doc struct {
		Quotas struct {
			Defaults struct {
				WindowSeconds int64 `json:"window_seconds"`
			} `json:"defaults"`
			Orgs, Agents map[string]struct {
				WindowSeconds int64 `json:"window_seconds"`
			}
		} `json:"quotas"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return 0, fmt.Errorf("cannot read the quota windows of data.json: %w", err)
	}
	w := doc.Quotas.Defaults.WindowSeconds
	for _, m := range []map[string]struct {
		WindowSeconds int64 `json:"window_seconds"`
	}{doc.Quotas.Orgs, doc.Quotas.Agents} {
		for _, q := range m {
			w = max(w, q.WindowSeconds)
		}
	}
	return time.Duration(w) * time.Second, nil
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
	st stackFlags, cat pricing.Source, auditor *kafka.Producer, auth keys.Authenticator, trail replica.Trail,
	registrations *directory.Directory) (*policyServer, error) {
	if p.disabled {
		return nil, nil
	}
	shards, err := p.shards()
	if err != nil {
		return nil, err
	}
	started := time.Now()
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
	run, err := replayRunner(st, p.replayMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("--policy-replay-max-memory: %w", err)
	}
	gate, err := p.gate(run, conn, st.ch.Database, cat, log)
	if err != nil {
		return nil, err
	}
	a, err := api.New(api.Config{Engine: eng, Auditor: auditor, FailOpen: failOpen, Auth: auth,
		BundleDir: p.dir, Shards: shards, Gate: gate, Logger: log, Registerer: reg})
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
	bundle := policy.DefaultBundle()
	if p.dir != "" {
		bundle = os.DirFS(p.dir)
	}
	window, err := maxWindow(bundle)
	if err != nil {
		return nil, fmt.Errorf("cannot use --policy-dir %q: %w", p.dir, err)
	}
	r, err := replica.New(replica.Config{Directory: dir, Registrations: registrations, Ledger: eng.Ledger(), Catalog: cat, Conn: conn,
		Database: st.ch.Database, Brokers: st.brokers(), Topic: st.topic, GroupID: p.group, Logger: log,
		Limiter: eng.Limiter(), Owns: shards.Owns, RestoreWindow: window, Started: started, Trail: trail})
	if err != nil {
		return nil, err
	}
	if shards != nil {
		log.Info("policy replica of a sharded deployment", "self", shards.Self(), "peers", strings.Join(shards.Peers(), ","))
	}
	return &policyServer{engine: eng, api: a, replica: r}, nil
}

func runPolicyEval(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "policy eval", "--directory FILE --decision NAME --input JSON")
	var p policyFlags
	dirFile := fs.String("directory", "", "directory file (JSON, see policy/README.md); required")
	decision := fs.String("decision", "", "peer_visible | add_participant | contact_request | send_message; required")
	input := fs.String("input", "", "the decision's input as JSON, or @FILE; required")
	fs.StringVar(&p.dir, "policy-dir", "", "policy folder (default: the built-in bundle)")
	if err := parse(fs, args); err != nil {
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
