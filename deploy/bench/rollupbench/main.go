// Command rollupbench measures the 30-day cost read of `bandplane bench query` (costs by
// agent and model of the organization with the most groups) against the read it
// replaces, side by side on the same data and interleaved, so that a noisy machine
// slows both alike:
//
//   - before: usage_daily FINAL for the whole days UNION ALL usage_hourly FINAL for
//     the edge hours, the statement bandplane ran before usage_rollup;
//   - after: the statement (*query.Querier).Costs runs now (each group's newest row of
//     usage_rollup, without FINAL), alone, and Costs itself (that statement, the
//     reprice jobs read beside it, and the scan).
//
// It checks that both answer the same rows, then prints the latencies measured here,
// ClickHouse's own (system.query_log) and what the tables hold. Run it on the database
// `bandplane bench query` loaded (deploy/bench/querybench), migrated to this build:
//
//	go run ./deploy/bench/rollupbench --db bandplane_bench_query
//
// A database loaded by this build has no usage_daily rows: they are made from
// usage_hourly first, as migration 004 made them. --churn rebuilds each organization's
// newest hour that many times before measuring (as ingest does every rollup interval),
// and rewrites its day in usage_daily as the earlier build did, so that both tables
// hold the fresh parts of a live deployment.
//
// It may import any folder but cmd/ (deploy/layers).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
)

func main() {
	cfg := chdb.DefaultConfig()
	flag.StringVar(&cfg.Addr, "clickhouse", cfg.Addr, "ClickHouse native address host:port")
	flag.StringVar(&cfg.Database, "db", "bandplane_bench_query", "the database `bandplane bench query` loaded")
	days := flag.Int("days", 30, "the days of the read, ending at the hour after the newest usage")
	queries := flag.Int("queries", 200, "measured runs of each read")
	warmup := flag.Int("warmup", 20, "unmeasured runs of each read before")
	churn := flag.Int("churn", 0, "rebuilds of each organization's newest hour before measuring")
	flag.Parse()
	if err := run(cfg, *days, *queries, *warmup, *churn); err != nil {
		fmt.Fprintln(os.Stderr, "rollupbench:", err)
		os.Exit(1)
	}
}

func run(cfg chdb.Config, days, queries, warmup, churn int) error {
	if days < 2 || queries < 1 || warmup < 0 || churn < 0 {
		return errors.New("--days must be at least 2, --queries at least 1, --warmup and --churn at least 0")
	}
	ctx := context.Background()
	cfg.ReadTimeout = 5 * time.Minute
	conn, err := chdb.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	db := cfg.Database
	if err := chdb.CheckVersion(ctx, conn, db); err != nil {
		return err
	}
	if err := fillDaily(ctx, conn, db); err != nil {
		return err
	}
	if churn > 0 {
		if err := rebuildNewest(ctx, conn, db, churn); err != nil {
			return err
		}
	}
	t, err := pick(ctx, conn, db, days)
	if err != nil {
		return err
	}
	if err := describe(ctx, conn, db, t); err != nil {
		return err
	}

	rec := &recording{Conn: conn}
	q := query.New(rec, db)
	cq := query.CostQuery{OrgID: t.org, From: t.from, To: t.to, GroupBy: []string{query.DimAgent, query.DimModel}}
	rep, err := q.Costs(ctx, cq)
	if err != nil {
		return err
	}
	afterSQL, afterArgs, ok := rec.costStatement()
	if !ok {
		return errors.New("no statement of query.Costs read usage_rollup")
	}
	beforeSQL, beforeArgs := beforeStatement(db, t.org, t.from, t.to)
	before, err := costRows(ctx, conn, "", beforeSQL, beforeArgs)
	if err != nil {
		return fmt.Errorf("the read before: %w", err)
	}
	if a, b := lines(rep.Rows), lines(before); !slices.Equal(a, b) {
		return fmt.Errorf("the reads disagree: %d rows after, %d before; after %q, before %q", len(a), len(b), head(a), head(b))
	}
	fmt.Printf("both reads answer the same %d rows (agent × model × currency), total cost %s\n", len(before), total(before))

	run := fmt.Sprintf("rollupbench-%d-", time.Now().UnixNano())
	reads := []struct {
		name string
		do   func(id string) error
	}{
		{"before: usage_daily FINAL ∪ usage_hourly FINAL", func(id string) error {
			_, err := costRows(ctx, conn, id, beforeSQL, beforeArgs)
			return err
		}},
		{"after: usage_rollup, newest row per group", func(id string) error {
			_, err := costRows(ctx, conn, id, afterSQL, afterArgs)
			return err
		}},
		{"after: Querier.Costs (statement, jobs, scan)", func(string) error {
			_, err := q.Costs(ctx, cq)
			return err
		}},
	}
	took := make([][]float64, len(reads))
	for i := range warmup + queries {
		for k := range reads {
			j := (k + i) % len(reads) // each read goes first as often as the others
			id := fmt.Sprintf("%s%d-%d", run, j, i)
			start := time.Now()
			if err := reads[j].do(id); err != nil {
				return fmt.Errorf("%s: %w", reads[j].name, err)
			}
			if i >= warmup {
				took[j] = append(took[j], float64(time.Since(start).Microseconds())/1000)
			}
		}
	}
	server, err := serverTimes(ctx, conn, run)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rollupbench: cannot read system.query_log:", err)
	}
	fmt.Printf("\n%d runs of each, interleaved, after %d warm-up runs (ms; server: system.query_log's query_duration_ms)\n", queries, warmup)
	fmt.Printf("  %-48s %8s %8s %8s   %s\n", "", "p50", "p99", "max", "server p50 / p99, rows read, memory")
	for j, r := range reads {
		s := append([]float64(nil), took[j]...)
		sort.Float64s(s)
		srv := "(two statements)"
		if st, ok := server[j]; ok {
			srv = st
		}
		fmt.Printf("  %-48s %8.2f %8.2f %8.2f   %s\n", r.name, quantile(s, 0.5), quantile(s, 0.99), s[len(s)-1], srv)
	}
	return nil
}

// target is the read measured, as `bandplane bench query` chooses it.
type target struct {
	org      string
	groups   uint64
	from, to time.Time
}

func pick(ctx context.Context, conn driver.Conn, db string, days int) (target, error) {
	var t target
	if err := conn.QueryRow(ctx, "SELECT org_id, uniqExact(agent_id, model) AS g FROM "+db+".usage_hourly GROUP BY org_id ORDER BY g DESC, org_id LIMIT 1").
		Scan(&t.org, &t.groups); err != nil {
		return t, fmt.Errorf("cannot choose the organization: %w", err)
	}
	var end time.Time
	if err := conn.QueryRow(ctx, "SELECT max(time) FROM "+db+".usage").Scan(&end); err != nil {
		return t, err
	}
	t.to = end.UTC().Truncate(time.Hour).Add(time.Hour)
	t.from = t.to.Add(-time.Duration(days) * 24 * time.Hour)
	return t, nil
}

// describe prints what the tables hold, in all and in the read's range.
func describe(ctx context.Context, conn driver.Conn, db string, t target) error {
	var usage, hourly, daily, hours, dayRows uint64
	for _, c := range []struct {
		sql  string
		dest *uint64
	}{
		{"SELECT count() FROM " + db + ".usage FINAL", &usage},
		{"SELECT count() FROM " + db + ".usage_hourly FINAL", &hourly},
		{"SELECT count() FROM " + db + ".usage_daily FINAL", &daily},
		{"SELECT count() FROM " + db + ".usage_rollup FINAL WHERE grain = 'hour'", &hours},
		{"SELECT count() FROM " + db + ".usage_rollup FINAL WHERE grain = 'day'", &dayRows},
	} {
		if err := conn.QueryRow(ctx, c.sql).Scan(c.dest); err != nil {
			return fmt.Errorf("%s: %w", c.sql, err)
		}
	}
	fmt.Printf("%s: %d usage rows; usage_hourly %d rows, usage_daily %d; usage_rollup %d hour rows, %d day rows\n",
		db, usage, hourly, daily, hours, dayRows)
	rows, err := conn.Query(ctx, "SELECT table, count(), sum(rows) FROM system.parts WHERE active AND database = ? AND table IN ('usage_hourly', 'usage_daily', 'usage_rollup') GROUP BY table ORDER BY table", db)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var table string
		var parts, n uint64
		if err := rows.Scan(&table, &parts, &n); err != nil {
			return err
		}
		fmt.Printf("  %-13s %3d active parts, %d rows (before merges collapse versions)\n", table, parts, n)
	}
	fmt.Printf("read: org %s (%d agent × model groups), %s to %s\n", t.org, t.groups, t.from.Format(time.RFC3339), t.to.Format(time.RFC3339))
	return rows.Err()
}

// beforeStatement is the cost read by agent and model as bandplane ran it before
// usage_rollup: the whole days from usage_daily FINAL, the edge hours from usage_hourly
// FINAL. The range is whole hours.
func beforeStatement(db, org string, from, to time.Time) (string, []any) {
	firstDay, lastDay := from.Truncate(24*time.Hour), to.Truncate(24*time.Hour)
	if firstDay.Before(from) {
		firstDay = firstDay.Add(24 * time.Hour)
	}
	const cols = "owner_id, agent_id, room_id, model, currency, events, unpriced_events, input_tokens, output_tokens," +
		" cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens, unpriced_output_tokens," +
		" unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost"
	src := "(SELECT hour, " + cols + " FROM " + db + ".usage_hourly FINAL WHERE org_id = ? AND ((hour >= ? AND hour < ?) OR (hour >= ? AND hour < ?))" +
		" UNION ALL SELECT day AS hour, " + cols + " FROM " + db + ".usage_daily FINAL WHERE org_id = ? AND day >= ? AND day < ?) AS rollup"
	return "SELECT agent_id, model, currency, " + sums + " FROM " + src +
			" GROUP BY agent_id, model, currency HAVING total_events > 0 ORDER BY total_cost DESC, agent_id, model, currency LIMIT 1001",
		[]any{org, from, firstDay, lastDay, to, org, firstDay, lastDay}
}

const sums = "sum(events) AS total_events, sum(unpriced_events) AS total_unpriced," +
	" sum(input_tokens) AS total_input, sum(output_tokens) AS total_output," +
	" sum(cache_read_tokens) AS total_cache_read, sum(cache_write_tokens) AS total_cache_write," +
	" sum(reasoning_tokens) AS total_reasoning," +
	" sum(unpriced_input_tokens) AS total_u_input, sum(unpriced_output_tokens) AS total_u_output," +
	" sum(unpriced_cache_read_tokens) AS total_u_cache_read, sum(unpriced_cache_write_tokens) AS total_u_cache_write," +
	" sum(unpriced_reasoning_tokens) AS total_u_reasoning, sum(cost) AS total_cost"

// costRows runs a cost read by agent and model (query id id, unless "") and scans its
// rows as Costs does.
func costRows(ctx context.Context, conn driver.Conn, id, sql string, args []any) ([]query.CostRow, error) {
	if id != "" {
		ctx = clickhouse.Context(ctx, clickhouse.WithQueryID(id), clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []query.CostRow
	for rows.Next() {
		var r query.CostRow
		t, u := &r.Tokens, &r.UnpricedTokens
		if err := rows.Scan(&r.AgentID, &r.Model, &r.Currency, &r.Events, &r.UnpricedEvents, &t.Input, &t.Output, &t.CacheRead,
			&t.CacheWrite, &t.Reasoning, &u.Input, &u.Output, &u.CacheRead, &u.CacheWrite, &u.Reasoning, &r.Cost); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func lines(rows []query.CostRow) []string {
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, fmt.Sprintf("%s %s %s %d %d %+v %+v %s", r.AgentID, r.Model, r.Currency, r.Events, r.UnpricedEvents,
			r.Tokens, r.UnpricedTokens, r.Cost.StringFixed(6)))
	}
	slices.Sort(out)
	return out
}

func head(s []string) []string { return s[:min(len(s), 3)] }

func total(rows []query.CostRow) string {
	by := map[string]decimal.Decimal{}
	for _, r := range rows {
		by[r.Currency] = by[r.Currency].Add(r.Cost)
	}
	var out []string
	for c, v := range by {
		out = append(out, v.StringFixed(2)+" "+c)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

func quantile(sorted []float64, q float64) float64 {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(i, 0)]
}

// recording is a connection that keeps the statements and arguments sent through it.
type recording struct {
	driver.Conn
	mu    sync.Mutex // Costs reads the reprice jobs beside its statement
	calls []call
}

type call struct {
	sql  string
	args []any
}

func (r *recording) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	r.mu.Lock()
	r.calls = append(r.calls, call{sql, args})
	r.mu.Unlock()
	return r.Conn.Query(ctx, sql, args...)
}

// costStatement is the statement over usage_rollup the recorded Costs ran.
func (r *recording) costStatement() (string, []any, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.calls {
		if strings.Contains(c.sql, ".usage_rollup") {
			return c.sql, c.args, true
		}
	}
	return "", nil, false
}

// serverTimes reads ClickHouse's account of the statements of this run by read: p50
// and p99 duration, mean rows read and peak memory.
func serverTimes(ctx context.Context, conn driver.Conn, run string) (map[int]string, error) {
	if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT toUInt32(splitByChar('-', substring(query_id, length(?) + 1))[1]) AS j,
		quantile(0.5)(query_duration_ms), quantile(0.99)(query_duration_ms), avg(read_rows), avg(memory_usage)
		FROM system.query_log WHERE event_date >= yesterday() AND type = 2 AND startsWith(query_id, ?) GROUP BY j ORDER BY j`, run, run)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var j uint32
		var p50, p99, read, mem float64
		if err := rows.Scan(&j, &p50, &p99, &read, &mem); err != nil {
			return nil, err
		}
		out[int(j)] = fmt.Sprintf("%.0f / %.0f ms, %.0f rows, %.0f MiB", p50, p99, read, mem/(1<<20))
	}
	return out, rows.Err()
}

// fillDaily makes usage_daily from usage_hourly when it is empty (a database loaded by
// a build that writes usage_rollup instead), as migration 004 did.
func fillDaily(ctx context.Context, conn driver.Conn, db string) error {
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage_daily").Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	fmt.Printf("%s.usage_daily is empty: made from usage_hourly, as migration 004 made it\n", db)
	return conn.Exec(ctx, `INSERT INTO `+db+`.usage_daily (day, org_id, owner_id, agent_id, room_id, model, events, unpriced_events,
		input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens,
		unpriced_output_tokens, unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost, currency, version)
		SELECT toStartOfDay(hour) AS d, org_id, owner_id, agent_id, room_id, model, sum(events), sum(unpriced_events),
		sum(input_tokens), sum(output_tokens), sum(cache_read_tokens), sum(cache_write_tokens), sum(reasoning_tokens),
		sum(unpriced_input_tokens), sum(unpriced_output_tokens), sum(unpriced_cache_read_tokens),
		sum(unpriced_cache_write_tokens), sum(unpriced_reasoning_tokens), sum(cost), any(currency), max(version)
		FROM (SELECT * FROM `+db+`.usage_hourly FINAL) AS h WHERE events > 0
		GROUP BY d, org_id, owner_id, agent_id, room_id, model`)
}

// rebuildNewest rebuilds each organization's newest hour n times through the store (its
// hour in usage_hourly, its day with the hour in usage_rollup) and writes its day into
// usage_daily again at a newer version each time, as the earlier build's rebuild did.
func rebuildNewest(ctx context.Context, conn driver.Conn, db string, n int) error {
	rows, err := conn.Query(ctx, "SELECT org_id, max(hour) FROM "+db+".usage_hourly GROUP BY org_id ORDER BY org_id")
	if err != nil {
		return err
	}
	var keys []store.HourKey
	for rows.Next() {
		var k store.HourKey
		if err := rows.Scan(&k.OrgID, &k.Hour); err != nil {
			rows.Close()
			return err
		}
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	st := store.New(conn, db)
	start := time.Now()
	for i := range n {
		if err := st.RefreshRollup(ctx, keys); err != nil {
			return err
		}
		for _, k := range keys {
			if err := conn.Exec(ctx, `INSERT INTO `+db+`.usage_daily SELECT day, org_id, owner_id, agent_id, room_id, model, events,
				unpriced_events, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens,
				unpriced_output_tokens, unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost, currency,
				version + ? FROM (SELECT * FROM `+db+`.usage_daily FINAL WHERE org_id = ? AND day = ?) AS d`, uint64(i+1), k.OrgID, k.Hour.Truncate(24*time.Hour)); err != nil {
				return err
			}
		}
	}
	fmt.Printf("churn: each organization's newest hour rebuilt %d times in %s\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}
