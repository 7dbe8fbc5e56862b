package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// cli runs a bandplane command in-process against the stack.
func (s *stack) cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db,
		"--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic)
	code = run(args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// usageLine is a canonical usage.reported of 1M input and 1M output tokens of model.
func priceUsageLine(id, org, model string, at time.Time) string {
	return `{"id":"` + id + `","type":"usage.reported","time":"` + at.UTC().Format(time.RFC3339Nano) + `","org_id":"` + org +
		`","room_id":"room-p","actor":{"id":"agent-p","type":"agent"},"source":"test","data":{"model":"` + model +
		`","input_tokens":1000000,"output_tokens":1000000}}`
}

type storedUsage struct {
	cost    decimal.Decimal
	version string
}

func (s *stack) usage(t *testing.T, id string) (storedUsage, bool) {
	var u storedUsage
	err := s.conn.QueryRow(context.Background(), "SELECT cost, catalog_version FROM "+s.db+".usage FINAL WHERE event_id = ?", id).Scan(&u.cost, &u.version)
	return u, err == nil
}

// A price set with `bandplane prices set` while `bandplane serve` runs prices the usage
// that serve ingests after its next catalog refresh, without a restart; the price.set event
// lands in the trail with who set it; usage stored before keeps its price.
func TestIntegrationPriceChangeReachesRunningIngest(t *testing.T) {
	s := newStack(t)
	token := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	srv := s.serve(t)

	code, a := srv.post(token, priceUsageLine("use-before", "acme", "gpt-5-mini", time.Now()))
	require.Equal(t, 200, code, "%+v", a)
	var before storedUsage
	require.True(t, stacktest.Eventually(t, 20*time.Second, 100*time.Millisecond, func() bool {
		var ok bool
		before, ok = s.usage(t, "use-before")
		return ok
	}), "the first usage is stored")
	assert.Equal(t, "2.250000", before.cost.StringFixed(6), "the seed's gpt-5-mini: 0.25 + 2.00 per million")
	assert.Equal(t, "1", before.version)

	code, out, errOut := s.cli(t, "prices", "set", "--model", "gpt-5-mini", "--input", "0.5", "--output", "4", "--by", "price-admin")
	require.Equal(t, 0, code, errOut)
	var set prices.PriceVersion
	require.NoError(t, json.Unmarshal([]byte(out), &set))
	assert.Equal(t, uint64(2), set.CatalogVersion)
	setAt := time.Now()

	// Usage after the change, one event every 200 ms, until one is priced with it (the
	// test logs how soon; ingest re-reads the catalog every 2 s).
	var latency time.Duration
	for i := 0; latency == 0; i++ {
		require.Less(t, time.Since(setAt), time.Minute, "no usage priced with the new price after a minute")
		id := fmt.Sprintf("use-after-%d", i)
		code, _ := srv.post(token, priceUsageLine(id, "acme", "gpt-5-mini", time.Now()))
		require.Equal(t, 200, code)
		require.True(t, stacktest.Eventually(t, 10*time.Second, 50*time.Millisecond, func() bool {
			u, ok := s.usage(t, id)
			if ok && u.version == "2" {
				assert.Equal(t, "4.500000", u.cost.StringFixed(6))
				latency = time.Since(setAt)
			}
			return ok
		}), "usage %s is stored", id)
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("new price in use %s after `prices set`", latency)
	after, _ := s.usage(t, "use-before")
	assert.Equal(t, before, after, "usage stored before keeps its price until a reprice")

	require.True(t, stacktest.Eventually(t, 20*time.Second, 100*time.Millisecond, func() bool {
		var n uint64
		err := s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".events FINAL WHERE type = 'price.set' AND actor_id = 'price-admin' AND source = ?", prices.Source).Scan(&n)
		return err == nil && n == 1
	}), "the price.set event is in the trail")
	srv.alive()

	code, out, _ = s.cli(t, "prices", "list")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"model":"gpt-5-mini","aliases":["gpt-5-mini-2025-08-07"],"provider":"openai","currency":"USD","input_per_mtok":"0.5","output_per_mtok":"4"`)
	code, out, _ = s.cli(t, "prices", "list", "--table")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "MODEL")
	assert.Contains(t, out, "price-admin")
}

// `bandplane prices set` refuses bad values before it writes, naming the flag.
func TestIntegrationPricesSetRefusesBadInput(t *testing.T) {
	s := newStack(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "m", "--input", "-1", "--output", "1"}, `--input: "-1" is negative`},
		{[]string{"--model", "m", "--input", "1", "--output", "1", "--currency", "EUR"}, "--currency: EUR: the catalog's prices are in USD"},
		{[]string{"--model", "unknown", "--input", "1", "--output", "1"}, "--model: \"unknown\" is reserved"},
		{[]string{"--model", "m", "--input", "1", "--output", "1", "--effective", "1999-01-01"}, "--effective: 1999-01-01T00:00:00Z is outside"},
		{[]string{"--model", "m", "--input", "1", "--output", "1", "--effective", "tomorrow"}, `--effective: "tomorrow" is neither RFC 3339 nor YYYY-MM-DD`},
		{[]string{"--input", "1", "--output", "1"}, "--model is required"},
	} {
		code, out, errOut := s.cli(t, append([]string{"prices", "set"}, c.args...)...)
		assert.Equal(t, 2, code, "%q: %s", c.args, errOut)
		assert.Contains(t, errOut, c.want, "%q", c.args)
		assert.Empty(t, out)
	}
	var n uint64
	require.NoError(t, s.conn.QueryRow(context.Background(), "SELECT max(catalog_version) FROM "+s.db+".prices").Scan(&n))
	assert.Equal(t, uint64(1), n, "only the seed")
}

// `bandplane reprice` runs as a job of the jobs table; killed (SIGKILL) midway it
// leaves each hour at its old or new prices and every event counted once, the job
// unfinished (so cost answers say provisional), and the next runner resumes it from
// its checkpoint once its heartbeat is stale: the final sums are the new prices'.
func TestIntegrationRepriceKilledMidwayIsResumed(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	st := store.New(s.conn, s.db)
	seed := pricing.Default()
	const nDays = 12
	d0 := time.Now().UTC().Truncate(24 * time.Hour).Add(-20 * 24 * time.Hour)
	end := d0.Add(nDays * 24 * time.Hour)
	var rows []store.UsageRow
	for day := 0; day < nDays; day++ {
		for _, org := range []string{"acme", "globex"} {
			for i := 0; i < 12; i++ {
				at := d0.Add(time.Duration(day)*24*time.Hour + time.Duration(2*i)*time.Hour + 90*time.Second)
				rows = append(rows, ingest.PriceUsage(seed, store.UsageRow{EventID: fmt.Sprintf("%s-%d-%d", org, day, i), Time: at, OrgID: org,
					AgentID: "agent-" + org, Model: "claude-sonnet-4-5", InputTokens: uint64(1000 * (i + 1)), OutputTokens: 300}, nil))
			}
		}
	}
	require.NoError(t, st.InsertUsage(ctx, rows))
	var hours []store.HourKey
	for _, r := range rows {
		hours = append(hours, store.HourKey{OrgID: r.OrgID, Hour: r.Time.Truncate(time.Hour)})
	}
	require.NoError(t, st.RefreshRollup(ctx, hours))

	code, _, errOut := s.cli(t, "prices", "set", "--model", "claude-sonnet-4-5", "--input", "2", "--output", "10", "--cache-read", "0.2",
		"--effective", d0.Add(-24*time.Hour).Format(time.RFC3339), "--by", "price-admin")
	require.Equal(t, 0, code, errOut)
	svc, err := prices.New(ctx, prices.Config{Conn: s.conn, Database: s.db, ReadOnly: true})
	require.NoError(t, err)
	cur := svc.Live().Current()
	oldHour, newHour, newOrg := map[string]int64{}, map[string]int64{}, map[string]int64{}
	hk := func(org string, h time.Time) string { return org + "@" + h.UTC().Format(time.RFC3339) }
	for _, r := range rows {
		oldHour[hk(r.OrgID, r.Time.Truncate(time.Hour))] += r.CostMicros
		c := ingest.PriceUsage(cur, r, nil).CostMicros
		newHour[hk(r.OrgID, r.Time.Truncate(time.Hour))] += c
		newOrg[r.OrgID] += c
	}

	// The CLI's reprice in a process of its own, killed after its second day.
	cmd := exec.Command(bandplaneBinary(t), "reprice", "--from", d0.Format(time.RFC3339), "--to", end.Format(time.RFC3339), "--by", "ops",
		"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var seen []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.Contains(sc.Text(), fmt.Sprintf("day 2 of %d", nDays)) {
			require.NoError(t, cmd.Process.Kill())
			break
		}
	}
	_ = cmd.Wait()
	require.Contains(t, strings.Join(seen, "\n"), fmt.Sprintf("day 2 of %d", nDays), "the CLI prints its progress")

	jobs, err := svc.Jobs(ctx, keys.PlatformOrg, 10)
	require.NoError(t, err)
	require.Len(t, jobs, 1, "the CLI's reprice is a job like any other")
	job := jobs[0]
	require.Equal(t, prices.JobRunning, job.State, "killed: nobody marked it")
	assert.Equal(t, "ops", job.RequestedBy)
	assert.Equal(t, keys.PlatformOrg, job.Org)
	require.False(t, job.Cursor.Before(d0.Add(2*24*time.Hour)))
	require.True(t, job.Cursor.Before(end), "killed before its end (cursor %s)", job.Cursor)

	checkHours := func(final bool) {
		t.Helper()
		var n uint64
		require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM "+s.db+".usage FINAL").Scan(&n))
		require.Equal(t, uint64(len(rows)), n, "never a second row")
		got, err := s.conn.Query(ctx, `SELECT org_id, hour, sum(events), sum(cost) FROM (SELECT org_id, hour, events, cost FROM `+s.db+
			`.usage_hourly FINAL WHERE hour >= ? AND hour < ?) AS h GROUP BY org_id, hour`, d0, end)
		require.NoError(t, err)
		defer got.Close()
		seenHours := 0
		for got.Next() {
			var org string
			var h time.Time
			var events uint64
			var c decimal.Decimal
			require.NoError(t, got.Scan(&org, &h, &events, &c))
			k := hk(org, h)
			seenHours++
			require.Equal(t, uint64(1), events, "%s counts its event once", k)
			isOld, isNew := c.Equal(decimal.New(oldHour[k], -6)), c.Equal(decimal.New(newHour[k], -6))
			require.True(t, isNew || (!final && isOld), "%s: %s is neither the old %d nor the new %d", k, c, oldHour[k], newHour[k])
			if !final && h.Before(job.Cursor) {
				require.True(t, isNew, "%s before the cursor is repriced", k)
			}
		}
		require.NoError(t, got.Err())
		require.Equal(t, len(oldHour), seenHours)
	}
	checkHours(false)
	q := query.New(s.conn, s.db)
	rep, err := q.Costs(ctx, query.CostQuery{OrgID: "acme", From: d0, To: end})
	require.NoError(t, err)
	require.Len(t, rep.Repricing, 1)
	assert.Equal(t, job.ID, rep.Repricing[0].ID)
	assert.Equal(t, "running", rep.Repricing[0].State)

	// While it is unfinished, no other reprice of those organizations starts.
	code, _, errOut = s.cli(t, "reprice", "--org", "acme", "--from", d0.Format(time.RFC3339), "--to", end.Format(time.RFC3339))
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "conflict: reprice job "+job.ID)

	// The next runner (a serve's, here in-process) resumes it once its heartbeat is stale.
	auditor, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: s.topic, BatchSize: kafka.AuditBatchSize})
	require.NoError(t, err)
	defer func() { _ = auditor.Close() }()
	runner, err := prices.New(ctx, prices.Config{Conn: s.conn, Database: s.db, Auditor: auditor, Logger: stacktest.Logger(),
		Poll: 200 * time.Millisecond, Heartbeat: time.Second, StaleAfter: 3 * time.Second, Runner: "next-runner"})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = runner.Run(rctx) }()
	defer func() { stop(); <-done }()
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		job, err = runner.Job(ctx, keys.PlatformOrg, job.ID)
		return err == nil && job.State.Finished()
	}), "resumed and finished")
	require.Equal(t, prices.JobDone, job.State, job.Error)
	assert.Equal(t, "next-runner", job.Runner)
	assert.Equal(t, nDays, job.DaysDone)
	checkHours(true)
	for _, org := range []string{"acme", "globex"} {
		rep, err = q.Costs(ctx, query.CostQuery{OrgID: org, From: d0, To: end})
		require.NoError(t, err)
		require.Len(t, rep.Totals, 1)
		assert.Equal(t, uint64(nDays*12), rep.Totals[0].Events)
		assert.Equal(t, decimal.New(newOrg[org], -6).StringFixed(6), rep.Totals[0].Cost.StringFixed(6), org)
		assert.Empty(t, rep.Repricing)
	}
}
