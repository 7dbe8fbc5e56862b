package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

func TestBenchQueryRefusesBadFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"bench", "query", "--events", "10", "--subscribers", "0", "--rate", "0"}, strings.NewReader(""), &out, &errOut)
	assert.Equal(t, 1, code)
	for _, msg := range []string{"--events must be >= 1000, got 10", "--subscribers must be >= 1, got 0", "--rate must be > 0, got 0"} {
		assert.Contains(t, errOut.String(), msg)
	}
	assert.Empty(t, out.String())
}

// TestIntegrationBenchQuery runs `bench query` on a tiny load against the real stack:
// the JSON line has every key, with sane numbers; a second run reuses the events.
func TestIntegrationBenchQuery(t *testing.T) {
	stacktest.Require(t)
	_, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 2)
	args := []string{"bench", "query", "--db", db, "--topic", topic, "--partitions", "2",
		"--kafka", strings.Join(stacktest.Brokers(), ","), "--clickhouse", stacktest.ClickHouseAddr(),
		"--events", "20000", "--distinct", "5000", "--settle", "20s",
		"--warmup", "2", "--subscribers", "8", "--rate", "20", "--live-duration", "2s", "--grace", "10s"}

	var out, errOut bytes.Buffer
	code := run(append(args, "--queries", "10"), strings.NewReader(""), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	res := decodeLine(t, out.Bytes())

	want := []string{"events", "load_seconds", "cost_p50_ms", "cost_p99_ms", "cost_sql_p50_ms", "cost_sql_p99_ms", "overhead_ratio",
		"audit_p99_ms", "audit_sql_p99_ms", "initiator_cost_p99_ms", "initiator_cost_sql_p99_ms", "subscribers", "subscriber_p50_ms", "subscriber_p99_ms", "subscriber_dropped",
		"server_cpu_cores", "subscriber_cpu_cores", "machine_cpu_cores"}
	var got []string
	for k := range res {
		got = append(got, k)
	}
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got)

	assert.Equal(t, 20000.0, res["events"])
	assert.Positive(t, res["load_seconds"])
	for _, k := range []string{"cost", "audit", "subscriber"} {
		p99 := res[k+"_p99_ms"]
		assert.Positive(t, p99, k)
		assert.Less(t, p99, 10_000.0, k) // tiny data: anything near the 10 s query deadline is broken
	}
	assert.Positive(t, res["cost_p50_ms"])
	assert.GreaterOrEqual(t, res["cost_p99_ms"], res["cost_p50_ms"])
	assert.GreaterOrEqual(t, res["cost_sql_p99_ms"], res["cost_sql_p50_ms"])
	assert.Positive(t, res["cost_sql_p50_ms"])
	assert.Positive(t, res["audit_sql_p99_ms"])
	assert.InDelta(t, res["cost_p50_ms"]/res["cost_sql_p50_ms"], res["overhead_ratio"], 0.01)
	assert.GreaterOrEqual(t, res["subscriber_p99_ms"], res["subscriber_p50_ms"])
	assert.Positive(t, res["subscriber_p50_ms"])
	assert.Equal(t, 8.0, res["subscribers"])
	assert.Zero(t, res["subscriber_dropped"], errOut.String())
	// The server's CPU is its own: the subscribers ran in another process (this test
	// binary again), whose figure may round to 0 at 8 subscribers.
	assert.Positive(t, res["server_cpu_cores"])
	assert.GreaterOrEqual(t, res["subscriber_cpu_cores"], 0.0)
	assert.Contains(t, errOut.String(), "live: subscriber process: 8 subscribed in ")
	for _, hop := range []string{"produce -> subscriber", "producer call", "produce -> hub", "hub -> subscriber"} {
		assert.Regexp(t, regexp.QuoteMeta(hop)+` +p50 +[0-9.]+ ms  p99 +[0-9.]+ ms`, errOut.String())
	}
	// Every cost row and audit event of the simulated world has a name from its directory.
	m := regexp.MustCompile(`\((\d+) rows, (\d+) named\)`).FindStringSubmatch(errOut.String())
	require.Len(t, m, 3, errOut.String())
	assert.Equal(t, m[1], m[2])
	assert.NotEqual(t, "0", m[1])
	assert.Contains(t, errOut.String(), "100 events (100 named)")
	assert.Contains(t, errOut.String(), "live: 40 changes, hub delivered 320 and dropped 0 subscribers; 320 messages received")

	// The second run finds the events and loads nothing.
	out.Reset()
	errOut.Reset()
	code = run(append(args, "--queries", "3"), strings.NewReader(""), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	res = decodeLine(t, out.Bytes())
	assert.Equal(t, 20000.0, res["events"])
	assert.Zero(t, res["load_seconds"])
	assert.Contains(t, errOut.String(), "reusing 20000 events of seed 1 in "+db)
}

func decodeLine(t *testing.T, b []byte) map[string]float64 {
	t.Helper()
	require.Equal(t, 1, bytes.Count(b, []byte("\n")), "one line: %s", b)
	var res map[string]float64
	require.NoError(t, json.Unmarshal(b, &res), string(b))
	return res
}
