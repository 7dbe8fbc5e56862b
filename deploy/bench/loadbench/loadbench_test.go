package loadbench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/bench/cpustat"
	"github.com/bandplane/bandplane/schema/chdb"
)

// phaseWith builds a phase whose figures answered in the given milliseconds and
// refused as many as given.
func phaseWith(name string, ms map[string][]float64, refused map[string]int) *phase {
	p := newPhase(name)
	for k, v := range ms {
		for _, x := range v {
			p.kinds[k].ok(time.Duration(x * float64(time.Millisecond)))
		}
	}
	for k, n := range refused {
		p.kinds[k].refuse("HTTP 429", "too many", n)
	}
	return p
}

// hundred is 1..100 ms: p50 50, p99 99, max 100.
func hundred(scale float64) []float64 {
	out := make([]float64, 100)
	for i := range out {
		out[i] = float64(i+1) * scale
	}
	return out
}

func TestStatsOfIsNearestRank(t *testing.T) {
	st := statsOf(hundred(1), 3)
	assert.Equal(t, PhaseStats{N: 100, P50Ms: 50, P99Ms: 99, MaxMs: 100, Refused: 3}, st)
	assert.Equal(t, PhaseStats{N: 1, P50Ms: 7, P99Ms: 7, MaxMs: 7}, statsOf([]float64{7}, 0))
	assert.Equal(t, PhaseStats{Refused: 2}, statsOf(nil, 2), "nothing answered: no latency, not zero latency")
}

func TestBuildResultRatiosWorstAndRefused(t *testing.T) {
	alone := map[string][]float64{}
	attack := map[string][]float64{}
	for _, k := range Kinds {
		alone[k], attack[k] = hundred(1), hundred(1.5) // every figure 1.5x slower under attack
	}
	attack[KindCosts] = hundred(2.5)
	res := buildResult(phaseWith(phaseAlone, alone, map[string]int{KindPolicy: 1}),
		phaseWith(phaseAttack, attack, map[string]int{KindCollector: 4, KindConnect: 2}))

	costs := res.Legit[KindCosts]
	require.NotNil(t, costs.Ratio)
	assert.InDelta(t, 2.5, *costs.Ratio, 1e-9, "attack p99 / alone p99")
	require.NotNil(t, costs.P50Ratio)
	assert.InDelta(t, 2.5, *costs.P50Ratio, 1e-9)
	assert.InDelta(t, 1.5, *res.Legit[KindAudit].Ratio, 1e-9)
	assert.InDelta(t, 2.5, res.WorstRatio, 1e-9)
	assert.Equal(t, KindCosts, res.Worst)
	assert.Equal(t, 6, res.LegitRefused, "refused under attack, every figure")
	assert.Equal(t, 1, res.LegitRefusedAlone)
	assert.Equal(t, 4, res.Legit[KindCollector].Attack.Refused)
	assert.Equal(t, 100, res.Legit[KindCollector].Attack.N, "refusals are counted, not timed")
	assert.False(t, res.GoalMet)
	assert.Empty(t, res.Unmeasured)

	// The JSON line carries each figure alone and under attack with its ratio.
	b, err := json.Marshal(res)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(b, &back))
	for _, k := range []string{"legit", "worst_ratio", "worst", "legit_refused", "legit_refused_alone", "goal_met", "server_cpu_cores", "hostile"} {
		assert.Contains(t, back, k)
	}
	fig := back["legit"].(map[string]any)[KindCosts].(map[string]any)
	assert.Equal(t, 2.5, fig["ratio"])
	assert.Equal(t, 99.0, fig["alone"].(map[string]any)["p99_ms"])
	assert.Equal(t, 247.5, fig["attack"].(map[string]any)["p99_ms"])
}

func TestGoalMetOnlyWithinRatioAndNothingRefused(t *testing.T) {
	ms := map[string][]float64{}
	for _, k := range Kinds {
		ms[k] = hundred(1)
	}
	attack := map[string][]float64{}
	for _, k := range Kinds {
		attack[k] = hundred(2) // exactly the goal
	}
	res := buildResult(phaseWith(phaseAlone, ms, nil), phaseWith(phaseAttack, attack, nil))
	assert.InDelta(t, 2.0, res.WorstRatio, 1e-9)
	assert.True(t, res.GoalMet, "a ratio of 2.0 is within the goal")
	assert.Zero(t, res.LegitRefused)

	// One refusal is enough to miss it, even with every ratio within.
	res = buildResult(phaseWith(phaseAlone, ms, nil), phaseWith(phaseAttack, attack, map[string]int{KindDelivery: 1}))
	assert.False(t, res.GoalMet)
	assert.Equal(t, 1, res.LegitRefused)
}

func TestUnansweredPhaseHasNoRatio(t *testing.T) {
	ms := map[string][]float64{}
	for _, k := range Kinds {
		ms[k] = hundred(1)
	}
	attack := map[string][]float64{}
	for _, k := range Kinds {
		attack[k] = hundred(1.2)
	}
	delete(attack, KindAudit) // every audit page refused under attack
	delete(ms, KindConnect)   // and no subscriber connected alone
	res := buildResult(phaseWith(phaseAlone, ms, nil), phaseWith(phaseAttack, attack, map[string]int{KindAudit: 40}))
	assert.Nil(t, res.Legit[KindAudit].Ratio)
	assert.Nil(t, res.Legit[KindConnect].Ratio)
	assert.Equal(t, []string{KindAudit, KindConnect}, res.Unmeasured, "in the figures' order")
	assert.InDelta(t, 1.2, res.WorstRatio, 1e-9, "the worst of the measured ratios")
	assert.False(t, res.GoalMet, "a figure without a ratio cannot meet the goal")
	assert.Equal(t, 40, res.LegitRefused)

	b, err := json.Marshal(res.Legit[KindAudit])
	require.NoError(t, err)
	assert.Contains(t, string(b), `"ratio":null`)
}

func TestWorstOfWithNothingMeasured(t *testing.T) {
	worst, kind, unmeasured := worstOf(map[string]Figure{KindCosts: {}, "zz-other": {}})
	assert.Zero(t, worst)
	assert.Empty(t, kind)
	assert.Equal(t, []string{KindCosts, "zz-other"}, unmeasured)
}

func TestRatioRefusesZeroBaseline(t *testing.T) {
	assert.Nil(t, ratio(5, 0, 10, 10), "an alone p99 of 0 ms has no ratio")
	assert.Nil(t, ratio(5, 1, 0, 10))
	assert.Nil(t, ratio(5, 1, 10, 0))
	r := ratio(1, 3, 1, 1)
	require.NotNil(t, r)
	assert.Equal(t, 0.333, *r)
}

func validConfig() Config {
	return Config{ServeCommand: []string{"/bin/bandplane", "serve"}, HostileCommand: []string{"/bin/bandplane", "bench-load-hostile"}, ClickHouse: chdb.DefaultConfig(), Brokers: []string{"127.0.0.1:19092"},
		Duration: 10 * time.Second, Warmup: time.Second, Subscribers: 100, Hostile: HostileKinds, AuditLoops: 1, Rounds: 2}
}

func TestValidateRefusesHostileValues(t *testing.T) {
	ok := validConfig()
	require.NoError(t, ok.Validate())
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"negative duration":       {func(c *Config) { c.Duration = -time.Second }, "--duration must be"},
		"zero duration":           {func(c *Config) { c.Duration = 0 }, "--duration must be"},
		"sub-second duration":     {func(c *Config) { c.Duration = 999 * time.Millisecond }, "--duration must be"},
		"a day":                   {func(c *Config) { c.Duration = 24 * time.Hour }, "--duration must be"},
		"negative warmup":         {func(c *Config) { c.Warmup = -1 }, "--warmup must be"},
		"endless warmup":          {func(c *Config) { c.Warmup = 1 << 62 }, "--warmup must be"},
		"no subscribers":          {func(c *Config) { c.Subscribers = 0 }, "--subscribers must be"},
		"negative subscribers":    {func(c *Config) { c.Subscribers = -100 }, "--subscribers must be"},
		"a million subscribers":   {func(c *Config) { c.Subscribers = 1_000_000 }, "--subscribers must be"},
		"no audit loop":           {func(c *Config) { c.AuditLoops = 0 }, "--hostile-audit-loops must be"},
		"no rounds":               {func(c *Config) { c.Rounds = 0 }, "--rounds must be"},
		"a thousand rounds":       {func(c *Config) { c.Rounds = 1000 }, "--rounds must be"},
		"rounds under a second":   {func(c *Config) { c.Duration, c.Rounds = 3*time.Second, 4 }, "less than 1s a round"},
		"many audit loops":        {func(c *Config) { c.AuditLoops = 1 << 30 }, "--hostile-audit-loops must be"},
		"no brokers":              {func(c *Config) { c.Brokers = nil }, "no kafka brokers"},
		"no serve command":        {func(c *Config) { c.ServeCommand = nil }, "no command to run serve"},
		"empty serve binary":      {func(c *Config) { c.ServeCommand = []string{""} }, "no command to run serve"},
		"no hostile command":      {func(c *Config) { c.HostileCommand = nil }, "no command to run the hostile clients"},
		"unknown hostile":         {func(c *Config) { c.Hostile = []string{"dos"} }, `unknown hostile client "dos"`},
		"serve-arg not a flag":    {func(c *Config) { c.ServeArgs = []string{"rm -rf /"} }, "is not a flag"},
		"serve-arg empty":         {func(c *Config) { c.ServeArgs = []string{""} }, "is not a flag"},
		"serve-arg bare dashes":   {func(c *Config) { c.ServeArgs = []string{"--"} }, "is not a flag"},
		"serve-arg triple dash":   {func(c *Config) { c.ServeArgs = []string{"---listen=x"} }, "is not a flag"},
		"serve-arg listen":        {func(c *Config) { c.ServeArgs = []string{"--listen=0.0.0.0:80"} }, "sets serve's --listen itself"},
		"serve-arg one dash db":   {func(c *Config) { c.ServeArgs = []string{"-clickhouse-db=prod"} }, "sets serve's --clickhouse-db itself"},
		"serve-arg topic":         {func(c *Config) { c.ServeArgs = []string{"--topic", "bandplane.events"} }, "sets serve's --topic itself"},
		"serve-arg no policy":     {func(c *Config) { c.ServeArgs = []string{"--no-policy"} }, "sets serve's --no-policy itself"},
		"clickhouse address":      {func(c *Config) { c.ClickHouse.Addr = "nohost" }, "not host:port"},
		"clickhouse cluster":      {func(c *Config) { c.ClickHouse.Cluster = "x; DROP DATABASE y" }, "not a plain identifier"},
		"clickhouse read timeout": {func(c *Config) { c.ClickHouse.ReadTimeout = 0 }, "read timeout"},
	} {
		t.Run(name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// Every problem at once.
	c := validConfig()
	c.Duration, c.Subscribers, c.ServeArgs = 0, 0, []string{"--group=x"}
	err := c.Validate()
	require.Error(t, err)
	for _, want := range []string{"--duration", "--subscribers", "--group"} {
		assert.Contains(t, err.Error(), want)
	}
	// The database is the run's own: whatever the caller's config names is not checked.
	c = validConfig()
	c.ClickHouse.Database = "not an identifier"
	assert.NoError(t, c.Validate())
	// Other flags of serve pass, with their value after '=' or as is.
	c = validConfig()
	c.ServeArgs = []string{"--graphql-clickhouse-conns=8", "-rollup-interval=1s", "--stuck-after", "--key-refresh=2s"}
	assert.NoError(t, c.Validate())
}

func TestParseHostile(t *testing.T) {
	got, err := ParseHostile("all")
	require.NoError(t, err)
	assert.Equal(t, HostileKinds, got)
	got, err = ParseHostile("none")
	require.NoError(t, err)
	assert.Empty(t, got)
	got, err = ParseHostile(" audit, keyless ,audit")
	require.NoError(t, err)
	assert.Equal(t, []string{HostileAudit, HostileKeyless}, got, "trimmed, once each")
	for _, bad := range []string{"", ",", "audit,", "AUDIT", "all,audit", "none,keyless", "trickle;keyless"} {
		_, err := ParseHostile(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestChangeOfReadsTheTitleOnly(t *testing.T) {
	data := []byte(`{"workStatusChanged":{"kind":"TASK","eventId":"e","task":{"id":"t","title":"bench-load change 1234"}}}`)
	seq, ok := changeOf(data)
	require.True(t, ok)
	assert.Equal(t, 1234, seq)
	for _, bad := range []string{
		`{"task":{"title":"bench-load change "}}`,
		`{"task":{"title":"bench-load change 12x"}}`,
		`{"task":{"title":"bench-load change 12`,
		`{"task":{"title":"bench-load change 99999999999999999999"}}`,
		`{"task":{"title":"other 12"}}`,
		``,
	} {
		_, ok := changeOf([]byte(bad))
		assert.False(t, ok, "%s", bad)
	}
}

func TestChangeLogCountsMissingDeliveries(t *testing.T) {
	l := newChangeLog(3)
	p := newPhase(phaseAttack)
	at := time.Now()
	for range 3 {
		require.GreaterOrEqual(t, l.add(p, at), 0)
	}
	assert.Equal(t, -1, l.add(p, at), "full")
	l.deliver(0, at.Add(10*time.Millisecond))
	l.deliver(0, at.Add(20*time.Millisecond))
	l.deliver(2, at.Add(30*time.Millisecond))
	l.deliver(7, at) // not a change of the log: ignored
	l.deliver(-1, at)
	assert.Equal(t, 2*3-3, l.missing(0, 3, 2), "two subscribers, three changes, three reads")
	st := statsOf(p.kinds[KindDelivery].ms, 0)
	assert.Equal(t, 3, st.N)
	assert.Equal(t, 30.0, st.MaxMs)
}

func TestParseProcStat(t *testing.T) {
	line := []byte("4242 (bandplane (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 12 0 100 0 0")
	d, ok := cpustat.ParseProcStat(line)
	require.True(t, ok)
	assert.Equal(t, 3*time.Second, d, "utime 250 + stime 50 ticks")
	for _, bad := range []string{"", "4242 bandplane S 1", "4242 (x) S 1 2", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 a b"} {
		_, ok := cpustat.ParseProcStat([]byte(bad))
		assert.False(t, ok, "%q", bad)
	}
}

func TestNamesArePlainAndPrefixed(t *testing.T) {
	n := newNames(time.Date(2026, 12, 3, 4, 5, 6, 0, time.UTC))
	assert.True(t, strings.HasPrefix(n.db, "bench_load_20261203_040506_"), n.db)
	assert.True(t, strings.HasPrefix(n.topic, "bench-load-20261203-040506-"), n.topic)
	c := chdb.DefaultConfig()
	c.Database = n.db
	assert.NoError(t, c.Validate(), "a ClickHouse identifier")
	assert.Equal(t, []string{n.topic, n.topic + ".dlq", n.topic + ".stored", n.topic + ".checkpoints"}, n.topics())
	assert.NotEqual(t, n, newNames(time.Date(2026, 12, 3, 4, 5, 6, 0, time.UTC)), "two runs of one second differ")
}

func TestServeEnvKeepsOnlyThePassword(t *testing.T) {
	t.Setenv("BANDPLANE_POLICY_PEERS", "http://elsewhere")
	t.Setenv("BANDPLANE_AUDIT_KEY", "/secret")
	t.Setenv("BANDPLANE_CLICKHOUSE_PASSWORD", "pw")
	env := strings.Join(serveEnv(), "\n")
	assert.NotContains(t, env, "BANDPLANE_POLICY_PEERS")
	assert.NotContains(t, env, "BANDPLANE_AUDIT_KEY")
	assert.Contains(t, env, "BANDPLANE_CLICKHOUSE_PASSWORD=pw")
}

func TestSeedFitsTheServersBounds(t *testing.T) {
	// Each hostile page fits serve's default response budget, so each is answered.
	assert.LessOrEqual(t, auditLimit*largeBytes, responseCap*9/10)
	assert.Positive(t, auditLimit)
	assert.GreaterOrEqual(t, largeEvents, auditLimit)
	for _, ev := range append(append(directory(time.Now()), seedA(time.Now())[:10]...), seedH(time.Now())[:2]...) {
		require.NoError(t, ev.Validate(), ev.ID)
	}
	// The legitimate tenant's subscribers need a key per subscribersPerKey.
	c := validConfig()
	assert.Equal(t, 4, (c.Subscribers+subscribersPerKey-1)/subscribersPerKey)
}

func TestErrorsKeyFindsTheListAcrossWrites(t *testing.T) {
	answer := `{"data":null,"errors":[{"message":"x"}]}`
	for cut := range len(answer) + 1 {
		var e errorsKey
		_, _ = e.Write([]byte(answer[:cut]))
		_, _ = e.Write([]byte(answer[cut:]))
		assert.True(t, e.found, "cut at %d", cut)
	}
	// Written a byte at a time, too.
	var e errorsKey
	for i := range len(answer) {
		_, _ = e.Write([]byte{answer[i]})
	}
	assert.True(t, e.found)
	var clean errorsKey
	_, _ = clean.Write([]byte(`{"data":{"auditEvents":{"events":[{"id":"a","data":"errors"}]}}}`))
	assert.False(t, clean.found)
}

func TestHostileSpecIsValidated(t *testing.T) {
	ok := HostileSpec{Addr: "127.0.0.1:8080", Kinds: HostileKinds, AuditLoops: 1}
	require.NoError(t, ok.validate())
	for name, spec := range map[string]HostileSpec{
		"no address":     {Kinds: HostileKinds, AuditLoops: 1},
		"not host:port":  {Addr: "127.0.0.1", AuditLoops: 1},
		"unknown client": {Addr: "127.0.0.1:1", Kinds: []string{"flood"}, AuditLoops: 1},
		"no audit loop":  {Addr: "127.0.0.1:1", AuditLoops: 0},
		"too many loops": {Addr: "127.0.0.1:1", AuditLoops: maxAuditLoops + 1},
	} {
		assert.Error(t, spec.validate(), name)
	}
	// A spec that is not one is refused before anything starts.
	var out strings.Builder
	err := RunHostile(t.Context(), strings.NewReader("{\"addr\": 1}\n"), &out)
	require.Error(t, err)
	assert.Empty(t, out.String())
	err = RunHostile(t.Context(), strings.NewReader(""), &out)
	assert.ErrorContains(t, err, "no hostile spec")
}

func TestRunHostileWithNoClientsReportsZeros(t *testing.T) {
	// stdin ends after the spec: the process stops at once and reports its counts.
	var out strings.Builder
	require.NoError(t, RunHostile(t.Context(), strings.NewReader(`{"addr":"127.0.0.1:1","kinds":[],"audit_loops":1}`+"\n"), &out))
	var st HostileStats
	require.NoError(t, json.Unmarshal([]byte(out.String()), &st))
	assert.Zero(t, st.KeylessSent)
}
