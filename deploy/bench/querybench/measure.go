package querybench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/query"
)

// queryTimeout is serve's --graphql-query-timeout: the SQL path gets the same deadline,
// which clickhouse-go passes to ClickHouse as max_execution_time on both paths.
const queryTimeout = 10 * time.Second

// costRead is one cost read the benchmark measures: its GraphQL document and the
// CostQuery grouping that Querier.Costs runs for it.
type costRead struct {
	name    string
	gql     string
	groupBy []string
}

var (
	costsByAgent = costRead{name: "costs", groupBy: []string{query.DimAgent, query.DimModel}, gql: `query($org: ID, $from: Time!, $to: Time!) {
  costs(orgId: $org, from: $from, to: $to, groupBy: [AGENT, MODEL]) {
    rows { agentId agentHandle agentName model cost currency tokens { total } }
    totals { cost }
  }
}`}
	// costsByInitiator answers "which requests cost us the most": every usage event
	// grouped by the person (or system) at the root of its delegation chain.
	costsByInitiator = costRead{name: "costs by initiator", groupBy: []string{query.DimInitiator}, gql: `query($org: ID, $from: Time!, $to: Time!) {
  costs(orgId: $org, from: $from, to: $to, groupBy: [INITIATOR]) {
    rows { agentId: initiatorId agentHandle: initiatorHandle agentName: initiatorName cost currency tokens { total } }
    totals { cost }
  }
}`}
)

const auditQuery = `query($org: ID, $room: ID) {
  auditEvents(orgId: $org, types: ["message.created"], roomId: $room, limit: 100) {
    events { id type time actorName }
    nextCursor
  }
}`

// Dist summarizes latencies in milliseconds.
type Dist struct {
	N             int
	P50, P99, Max float64
	// Failed runs (a timeout, an error) are in the latencies with the time they took;
	// Err is the first one's error.
	Failed int
	Err    string
}

func distOf(ms []float64) Dist {
	if len(ms) == 0 {
		return Dist{}
	}
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	return Dist{N: len(s), P50: round(quantile(s, 0.50), 2), P99: round(quantile(s, 0.99), 2), Max: round(s[len(s)-1], 2)}
}

// quantile of sorted s: the smallest value with at least q of the values at or
// below it.
func quantile(s []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ReadStats are one read's latencies through GraphQL, through the Querier, and of the
// names lookup the GraphQL resolver adds (Querier.Names, and RoomNames for the audit).
type ReadStats struct {
	GraphQL, SQL, Names Dist
	Rows                int // rows (or events) of an answer
	Named               int // of them with a name from the directory, through GraphQL
	CPU                 CPUUse
}

// logQueries makes ClickHouse log the statements of every request (system.query_log),
// for the breakdown of where the time goes; both paths pay the same for it.
func logQueries(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(logged(r.Context())))
	})
}

func logged(ctx context.Context) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
}

// gqlClient posts GraphQL queries with one API key over keep-alive connections.
type gqlClient struct {
	url, token string
	http       *http.Client
}

func newGQLClient(url, token string) *gqlClient {
	return &gqlClient{url: url, token: token, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}}
}

// post times one query, from writing the request to reading the whole answer, then
// decodes it into data (outside the time), failing on any GraphQL error.
func (c *gqlClient) post(ctx context.Context, q string, vars map[string]any, data any) (time.Duration, error) {
	body, err := json.Marshal(map[string]any{"query": q, "variables": vars})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return time.Since(start), fmt.Errorf("cannot post to %s: %w", c.url, err)
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close() // read to the end already
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("cannot read the answer of %s: %w", c.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return took, fmt.Errorf("%s answered %s: %.300s", c.url, resp.Status, raw)
	}
	var ans struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil {
		return took, fmt.Errorf("cannot decode the answer of %s: %w: %.300s", c.url, err, raw)
	}
	if len(ans.Errors) > 0 {
		return took, fmt.Errorf("graphql error: %s", ans.Errors[0].Message)
	}
	if err := json.Unmarshal(ans.Data, data); err != nil {
		return took, fmt.Errorf("cannot decode the data of %s: %w", c.url, err)
	}
	return took, nil
}

// timed runs f with the SQL path's context (logged, with serve's query deadline).
func timed(ctx context.Context, f func(ctx context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(logged(ctx), queryTimeout)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	return time.Since(start), err
}

// repeat runs each of steps warmup+n times, interleaved and in alternating order (so
// that noise from the rest of the machine and cache effects fall on every path alike),
// and returns the measured latencies of each. A failed run counts with the time it
// took (a read over the deadline is a slow read, not the end of the benchmark); a
// failure of the very first run means the setup is wrong and ends it.
func repeat(ctx context.Context, cfg *Config, what string, steps ...func(ctx context.Context) (time.Duration, error)) ([]Dist, error) {
	warmup, n := cfg.Warmup, cfg.Queries
	lat := make([][]float64, len(steps))
	out := make([]Dist, len(steps))
	told := time.Now()
	for i := range warmup + n {
		if time.Since(told) >= 30*time.Second {
			told = time.Now()
			cfg.Progress("%s: %d of %d runs", what, i, warmup+n)
		}
		for k := range steps {
			j := k
			if i%2 == 1 {
				j = len(steps) - 1 - k
			}
			d, err := steps[j](ctx)
			if err != nil {
				if i == 0 || ctx.Err() != nil {
					return nil, err
				}
				if i >= warmup {
					out[j].Failed++
				}
				if out[j].Err == "" {
					out[j].Err = err.Error()
				}
			}
			if i >= warmup {
				lat[j] = append(lat[j], ms(d))
			}
		}
	}
	for j := range steps {
		failed, first := out[j].Failed, out[j].Err
		out[j] = distOf(lat[j])
		out[j].Failed, out[j].Err = failed, first
	}
	return out, nil
}

func measureCosts(ctx context.Context, cfg *Config, url, token string, qr *query.Querier, t Target, read costRead) (ReadStats, error) {
	c := newGQLClient(url, token)
	vars := map[string]any{"org": t.Org, "from": t.From.Format(time.RFC3339), "to": t.To.Format(time.RFC3339)}
	q := query.CostQuery{OrgID: t.Org, From: t.From, To: t.To, GroupBy: read.groupBy}
	var st ReadStats
	var ids []string
	cpu := sampleCPU()
	cfg.Progress("%s: %d warm-up and %d measured runs each through GraphQL, through query.Querier.Costs, and of the names lookup", read.name, cfg.Warmup, cfg.Queries)
	lat, err := repeat(ctx, cfg, read.name,
		func(ctx context.Context) (time.Duration, error) {
			var data struct {
				Costs struct {
					Rows []struct {
						AgentID   string
						AgentName *string
					}
				}
			}
			d, err := c.post(ctx, read.gql, vars, &data)
			if err != nil {
				return d, fmt.Errorf("costs through GraphQL: %w", err)
			}
			st.Rows, st.Named = len(data.Costs.Rows), 0
			for _, r := range data.Costs.Rows {
				if r.AgentName != nil {
					st.Named++
				}
			}
			return d, nil
		},
		func(ctx context.Context) (time.Duration, error) {
			return timed(ctx, func(ctx context.Context) error {
				rep, err := qr.Costs(ctx, q)
				if err != nil {
					return fmt.Errorf("query.Querier.Costs: %w", err)
				}
				if ids == nil {
					for _, r := range rep.Rows {
						ids = append(ids, r.OwnerID, r.AgentID, r.InitiatorID)
					}
				}
				return nil
			})
		},
		func(ctx context.Context) (time.Duration, error) {
			return timed(ctx, func(ctx context.Context) error {
				if ids == nil {
					return nil // the first run: Costs has not named the ids yet
				}
				_, err := qr.Names(ctx, t.Org, ids)
				return err
			})
		})
	if err != nil {
		return st, err
	}
	st.GraphQL, st.SQL, st.Names, st.CPU = lat[0], lat[1], lat[2], cpu.since()
	if st.Rows == 0 {
		return st, fmt.Errorf("costs of org %s from %s to %s returned no rows: the rollup is empty", t.Org, t.From, t.To)
	}
	return st, nil
}

func measureAudit(ctx context.Context, cfg *Config, url, token string, qr *query.Querier, t Target) (ReadStats, error) {
	c := newGQLClient(url, token)
	vars := map[string]any{"org": t.Org, "room": t.Room}
	q := query.AuditQuery{OrgID: t.Org, Types: []string{"message.created"}, RoomID: t.Room, Limit: 100}
	var st ReadStats
	var actors, rooms []string
	cpu := sampleCPU()
	cfg.Progress("audit: %d warm-up and %d measured runs each through GraphQL, through query.Querier.AuditEvents, and of the names lookups", cfg.Warmup, cfg.Queries)
	lat, err := repeat(ctx, cfg, "audit",
		func(ctx context.Context) (time.Duration, error) {
			var data struct {
				AuditEvents struct {
					Events []struct {
						ID        string
						ActorName *string
					}
				}
			}
			d, err := c.post(ctx, auditQuery, vars, &data)
			if err != nil {
				return d, fmt.Errorf("auditEvents through GraphQL: %w", err)
			}
			st.Rows, st.Named = len(data.AuditEvents.Events), 0
			for _, e := range data.AuditEvents.Events {
				if e.ActorName != nil {
					st.Named++
				}
			}
			return d, nil
		},
		func(ctx context.Context) (time.Duration, error) {
			return timed(ctx, func(ctx context.Context) error {
				page, err := qr.AuditEvents(ctx, q)
				if err != nil {
					return fmt.Errorf("query.Querier.AuditEvents: %w", err)
				}
				if actors == nil {
					for _, e := range page.Events {
						actors, rooms = append(actors, e.ActorID), append(rooms, e.RoomID)
					}
				}
				return nil
			})
		},
		func(ctx context.Context) (time.Duration, error) {
			return timed(ctx, func(ctx context.Context) error {
				if actors == nil {
					return nil
				}
				if _, err := qr.Names(ctx, t.Org, actors); err != nil {
					return err
				}
				_, err := qr.RoomNames(ctx, t.Org, rooms)
				return err
			})
		})
	if err != nil {
		return st, err
	}
	st.GraphQL, st.SQL, st.Names, st.CPU = lat[0], lat[1], lat[2], cpu.since()
	if st.Rows == 0 {
		return st, fmt.Errorf("the audit page of room %s of org %s is empty", t.Room, t.Org)
	}
	return st, nil
}

// ServerStat is ClickHouse's own account of one kind of statement the reads ran.
type ServerStat struct {
	Kind      string
	N         int
	P50, P99  float64 // query_duration_ms
	ReadRows  float64 // mean rows read
	ReadBytes float64 // mean bytes read
}

// serverStats reads system.query_log for the statements run on db since then, by
// kind (both paths together: the same SQL costs ClickHouse the same).
func serverStats(ctx context.Context, conn driver.Conn, db string, since time.Time) ([]ServerStat, error) {
	if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		return nil, fmt.Errorf("cannot flush ClickHouse's logs: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT multiIf(
			query LIKE '%usage_hourly%HAVING total_unpriced%', 'costs: unpriced by model',
			query LIKE '%usage_hourly%GROUP BY currency HAVING%', 'costs: totals',
			query LIKE '%usage_hourly%', 'costs: rows',
			query LIKE '%.directory%', 'names (directory)',
			query LIKE '%.rooms%', 'room names',
			query LIKE '%.events%', 'audit page', 'other') AS kind,
		count(), quantile(0.5)(query_duration_ms), quantile(0.99)(query_duration_ms), avg(read_rows), avg(read_bytes)
		FROM system.query_log
		WHERE event_date >= toDate(?) AND event_time >= ? AND type = 2 AND query LIKE ?
		GROUP BY kind ORDER BY kind`, since.UTC(), since.UTC(), "%"+db+".%")
	if err != nil {
		return nil, fmt.Errorf("cannot read system.query_log: %w", err)
	}
	defer rows.Close()
	var out []ServerStat
	for rows.Next() {
		var s ServerStat
		var n uint64
		if err := rows.Scan(&s.Kind, &n, &s.P50, &s.P99, &s.ReadRows, &s.ReadBytes); err != nil {
			return nil, fmt.Errorf("cannot read system.query_log: %w", err)
		}
		s.N = int(n)
		out = append(out, s)
	}
	return out, rows.Err()
}
