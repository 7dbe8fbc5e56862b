package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/bench/loadbench"
)

func loadFlags(t *testing.T, args ...string) (loadbench.Config, string, error) {
	t.Helper()
	var stderr bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &bytes.Buffer{}, stderr: &stderr, log: newLogger(&stderr)}
	cfg, _, err := benchLoadConfig(e, args)
	return cfg, stderr.String(), err
}

func TestBenchLoadFlagDefaults(t *testing.T) {
	t.Setenv("BANDPLANE_KAFKA", "")
	t.Setenv("BANDPLANE_CLICKHOUSE", "")
	cfg, _, err := loadFlags(t)
	require.NoError(t, err)
	assert.Equal(t, 30*time.Second, cfg.Duration)
	assert.Equal(t, 3, cfg.Rounds)
	assert.Equal(t, 100, cfg.Subscribers)
	assert.Equal(t, loadbench.HostileKinds, cfg.Hostile)
	assert.Equal(t, 1, cfg.AuditLoops)
	assert.False(t, cfg.KeepData)
	assert.Equal(t, []string{"127.0.0.1:19092"}, cfg.Brokers)
	assert.Equal(t, "127.0.0.1:19000", cfg.ClickHouse.Addr)
	require.Len(t, cfg.ServeCommand, 2)
	assert.Equal(t, "serve", cfg.ServeCommand[1], "this binary's serve")
	assert.Equal(t, []string{cfg.ServeCommand[0], hostileCommand}, cfg.HostileCommand, "and its hidden command")

	cfg, _, err = loadFlags(t, "--duration", "10s", "--subscribers", "7", "--keep", "--hostile", "audit,keyless",
		"--serve-arg=--graphql-clickhouse-conns=8", "--serve-arg", "--rollup-interval=1s", "--kafka", "h1:9092, h2:9092")
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, cfg.Duration)
	assert.Equal(t, 7, cfg.Subscribers)
	assert.True(t, cfg.KeepData)
	assert.Equal(t, []string{loadbench.HostileAudit, loadbench.HostileKeyless}, cfg.Hostile)
	assert.Equal(t, []string{"--graphql-clickhouse-conns=8", "--rollup-interval=1s"}, cfg.ServeArgs)
	assert.Equal(t, []string{"h1:9092", "h2:9092"}, cfg.Brokers)
}

func TestBenchLoadRefusesHostileFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"zero duration":       {[]string{"--duration", "0s"}, "--duration must be"},
		"negative duration":   {[]string{"--duration=-5s"}, "--duration must be"},
		"overlong duration":   {[]string{"--duration", "100h"}, "--duration must be"},
		"negative warmup":     {[]string{"--warmup=-1s"}, "--warmup must be"},
		"no subscribers":      {[]string{"--subscribers", "0"}, "--subscribers must be"},
		"too many":            {[]string{"--subscribers", "99999999"}, "--subscribers must be"},
		"no rounds":           {[]string{"--rounds", "0"}, "--rounds must be"},
		"rounds too short":    {[]string{"--duration", "5s", "--rounds", "10"}, "less than 1s a round"},
		"audit loops":         {[]string{"--hostile-audit-loops", "-3"}, "--hostile-audit-loops must be"},
		"unknown hostile":     {[]string{"--hostile", "slowloris"}, `unknown hostile client "slowloris"`},
		"empty hostile":       {[]string{"--hostile", ""}, "unknown hostile client"},
		"serve-arg listen":    {[]string{"--serve-arg=--listen=0.0.0.0:8080"}, "sets serve's --listen itself"},
		"serve-arg database":  {[]string{"--serve-arg=--clickhouse-db=bandplane"}, "sets serve's --clickhouse-db itself"},
		"serve-arg kafka":     {[]string{"--serve-arg=-kafka=elsewhere:9092"}, "sets serve's --kafka itself"},
		"serve-arg value":     {[]string{"--serve-arg", "8"}, "is not a flag"},
		"no brokers":          {[]string{"--kafka", " , "}, "no kafka brokers"},
		"bad clickhouse":      {[]string{"--clickhouse", "nohost"}, "not host:port"},
		"cluster injection":   {[]string{"--cluster", "c; DROP DATABASE bandplane"}, "not a plain identifier"},
		"positional argument": {[]string{"extra"}, "unexpected arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := loadFlags(t, tc.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// A database or topic flag of the other benches is not one of this one: the run
	// makes its own.
	for _, f := range []string{"--topic", "--clickhouse-db", "--dlq-topic"} {
		_, stderr, err := loadFlags(t, f, "bandplane")
		require.Error(t, err, f)
		assert.Contains(t, stderr, "flag provided but not defined", f)
	}
	// Through the command: refused before anything connects.
	var out, errOut bytes.Buffer
	code := run([]string{"bench", "load", "--duration", "0s", "--subscribers", "-1"}, strings.NewReader(""), &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Empty(t, out.String())
	assert.Contains(t, errOut.String(), "--duration must be")
	assert.Contains(t, errOut.String(), "--subscribers must be")
}

func TestWriteLoadSummary(t *testing.T) {
	r2, r3 := 1.2, 3.4
	var rep loadbench.Report
	rep.DurationS, rep.Subscribers = 10, 100
	rep.Legit = map[string]loadbench.Figure{
		loadbench.KindCosts: {Alone: loadbench.PhaseStats{N: 40, P50Ms: 30, P99Ms: 50}, Attack: loadbench.PhaseStats{N: 40, P50Ms: 40, P99Ms: 170}, Ratio: &r3, P50Ratio: &r2},
		loadbench.KindAudit: {Alone: loadbench.PhaseStats{N: 40, P50Ms: 30, P99Ms: 50}, Attack: loadbench.PhaseStats{Refused: 40}},
	}
	rep.WorstRatio, rep.Worst, rep.Unmeasured, rep.LegitRefused = 3.4, loadbench.KindCosts, []string{loadbench.KindAudit}, 40
	rep.Hostile.Kinds = []string{loadbench.HostileAudit}
	rep.Refusals = []loadbench.Refusals{{Kind: loadbench.KindAudit, Phase: "attack", Reasons: map[string]int{"TOO_MANY_REQUESTS": 40},
		First: map[string]string{"TOO_MANY_REQUESTS": "organization org-a already runs 16 queries"}}}
	var w bytes.Buffer
	writeLoadSummary(&w, rep)
	s := w.String()
	assert.Contains(t, s, "worst ratio 3.40 (costs_query)")
	assert.Contains(t, s, "refused under attack 40")
	assert.Contains(t, s, "NOT met")
	assert.Contains(t, s, "no ratio (a phase answered none): audit_page")
	assert.Contains(t, s, "attack audit_page: 40 TOO_MANY_REQUESTS (first: organization org-a already runs 16 queries)")
	assert.Contains(t, s, "0.0 / 0.0 (0) 40 refused")
}

func TestBenchLoadHostileTakesNoArguments(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, 1, run([]string{hostileCommand, "--kinds=all"}, strings.NewReader(""), &out, &errOut))
	assert.Contains(t, errOut.String(), "sends the spec on stdin")
	errOut.Reset()
	assert.Equal(t, 1, run([]string{hostileCommand}, strings.NewReader("not json\n"), &out, &errOut))
	assert.Contains(t, errOut.String(), "cannot decode the hostile spec")
	assert.Empty(t, out.String())
}
