package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/cause"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
)

// TestIntegrationInitiatorsReconcileWithTruth sends two seeded workloads through the
// collector of a real `bandplane serve` and reconciles the chain that ingest stored on
// every usage row (usage FINAL) with the simulator's ground truth (Config.Truth):
//
//   - the default traffic: every explicit link right (the late ones once their trigger
//     came), inferred links at least 99 % right, each wrong one a case the truth calls
//     ambiguous; the figures are logged;
//   - traffic with many late triggers and no overlap, where every link must be right:
//     the events a late trigger caused are re-attributed from pending to the trigger's
//     initiator, and costs grouped by INITIATOR equal, per organization and initiator,
//     the sum of the usage the truth gives that initiator, to the micro.
func TestIntegrationInitiatorsReconcileWithTruth(t *testing.T) {
	began := time.Now()
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	admin := s.key(t, "platform-admin", keys.PlatformOrg, keys.RoleAdmin)
	srv := s.serve(t)
	t.Logf("serve ready after %s", time.Since(began).Round(time.Millisecond))

	plain := simulate.DefaultConfig()
	plain.Seed, plain.Events = 20261202, 6000
	late := simulate.DefaultConfig()
	late.Seed, late.Events = 20261203, 4000
	late.Overlap, late.LateTriggers, late.Loops = 0, 0.3, 0.05

	runs := map[string]irRun{}
	for name, cfg := range map[string]simulate.Config{"default": plain, "late": late} {
		runs[name] = irSend(t, s, srv, platform, cfg)
	}

	// The default traffic.
	r := runs["default"]
	sc := irReconcile(t, r, irStored(t, s, r))
	t.Logf("default traffic, %d usage events: explicit links right %s (late %s), inferred links right %s",
		sc.usage, sc.Explicit, sc.Late, sc.Inferred)
	assert.Empty(t, sc.Unexplained, "links wrong where inference is not ambiguous")
	assert.Equal(t, sc.Explicit.N, sc.Explicit.OK, "explicit links right: %s", sc.Explicit)
	assert.Positive(t, sc.Late.N, "the default traffic has late triggers")
	assert.Positive(t, sc.Inferred.N, "the default traffic has inferred links")
	assert.GreaterOrEqual(t, sc.Inferred.Share(), 0.99, "inferred links right: %s", sc.Inferred)

	// Many late triggers: every link right, and the rollup by initiator exact.
	r = runs["late"]
	rows := irStored(t, s, r)
	sc = irReconcile(t, r, rows)
	t.Logf("late-trigger traffic, %d usage events: explicit links right %s (late %s), inferred links right %s",
		sc.usage, sc.Explicit, sc.Late, sc.Inferred)
	assert.Empty(t, sc.Unexplained, "every link right")
	require.Greater(t, sc.Late.N, 50, "the traffic has many late triggers")
	assert.Equal(t, sc.Late.N, sc.Late.OK, "late links right: %s", sc.Late)

	want := map[string]irSpend{} // org/initiator → spend, by the truth
	for _, tr := range r.usage {
		row := rows[tr.EventID]
		k := row.org + "/" + tr.Initiator.ID
		sp := want[k]
		sp.Events++
		sp.CostMicros += row.costMicros
		want[k] = sp
	}
	from, to := r.start.Add(-time.Hour), time.Now().UTC().Add(time.Hour)
	var got map[string]irSpend
	ok := stacktest.Eventually(t, 30*time.Second, 250*time.Millisecond, func() bool {
		got = map[string]irSpend{}
		for _, org := range r.sim.orgs {
			var d struct {
				Costs struct {
					Rows []struct {
						InitiatorID *string
						Events      int64
						Cost        *string
					}
					Truncated bool
				}
			}
			recAsk(t, srv, admin, irCostsQuery, map[string]any{"org": org, "from": from.Format(time.RFC3339), "to": to.Format(time.RFC3339)}, &d)
			require.False(t, d.Costs.Truncated, "costs of %s truncated", org)
			for _, row := range d.Costs.Rows {
				k := org + "/" + recStr(row.InitiatorID)
				sp := got[k]
				sp.Events += row.Events
				if row.Cost != nil {
					sp.CostMicros += recMicros(t, *row.Cost)
				}
				got[k] = sp
			}
		}
		return cmp.Equal(want, got)
	})
	assert.True(t, ok, "costs by INITIATOR differ from the truth's sums (-want +got):\n%s", cmp.Diff(want, got))
	t.Logf("costs by INITIATOR equal the truth's sums for %d organization/initiator pairs, %s after serve started", len(want), time.Since(began).Round(time.Millisecond))
	srv.alive()
}

// irRun is one workload sent: the simulator's run and its truth.
type irRun struct {
	sim    recSim
	start  time.Time
	truths map[string]simulate.Truth // by event id
	usage  []simulate.Truth          // of the usage events, in stream order
}

// irSend sends cfg's workload through the collector, starting early enough for its
// last event to be in the past (a dry run measures its span), and waits until ingest
// stored every event.
func irSend(t *testing.T, s *stack, srv *server, token string, cfg simulate.Config) irRun {
	t.Helper()
	cfg.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dry := recRun(t, cfg, simulate.SinkFunc(func(context.Context, [][]byte) error { return nil }))
	span := dry.last.Sub(cfg.Start)
	cfg.Start = time.Now().UTC().Add(-max(span+5*time.Minute, 2*time.Hour)).Truncate(time.Second)
	r := irRun{start: cfg.Start, truths: map[string]simulate.Truth{}}
	var order []simulate.Truth
	cfg.Truth = func(tr simulate.Truth) {
		r.truths[tr.EventID] = tr
		order = append(order, tr)
	}
	usage := map[string]bool{}
	post := simulate.NewHTTPSink(srv.url, token)
	r.sim = recRun(t, cfg, simulate.SinkFunc(func(ctx context.Context, lines [][]byte) error {
		if err := post.Send(ctx, lines); err != nil {
			return err
		}
		for _, l := range lines {
			if ev, err := schema.Decode(l); err == nil && ev.Type == schema.TypeUsageReported {
				usage[ev.ID] = true
			}
		}
		return nil
	}))
	require.Equal(t, cfg.Events, r.sim.sum.Events)
	for _, tr := range order {
		if usage[tr.EventID] {
			r.usage = append(r.usage, tr)
		}
	}
	require.Len(t, r.usage, r.sim.sum.UsageEvents, "every usage event has a truth")
	recWaitStored(t, s, r.sim.ids)
	return r
}

// irRow is a usage row's organization, chain as stored, and cost.
type irRow struct {
	org        string
	chain      store.Chain
	costMicros int64
}

// irStored waits until every usage event of r has its row, none of them pending any
// more (each late trigger came, and re-attributed what it caused), and returns them.
func irStored(t *testing.T, s *stack, r irRun) map[string]irRow {
	t.Helper()
	ids := make([]string, 0, len(r.usage))
	for _, tr := range r.usage {
		ids = append(ids, tr.EventID)
	}
	var rows map[string]irRow
	pending := 0
	var err error
	ok := stacktest.Eventually(t, 40*time.Second, 250*time.Millisecond, func() bool {
		rows, pending, err = irReadUsage(s, ids)
		return err == nil && len(rows) == len(ids) && pending == 0
	})
	if !ok {
		var still []string
		for _, tr := range r.usage {
			if row, ok := rows[tr.EventID]; ok && row.chain.Link == cause.SourcePending && len(still) < 5 {
				still = append(still, fmt.Sprintf("%s (%+v, truth %+v)", tr.EventID, row, tr))
			}
		}
		require.Failf(t, "usage rows missing or pending", "usage FINAL holds %d of the %d usage rows, %d of them pending (%v): %s",
			len(rows), len(ids), pending, err, strings.Join(still, "; "))
	}
	return rows
}

func irReadUsage(s *stack, ids []string) (map[string]irRow, int, error) {
	q, err := s.conn.Query(context.Background(), `SELECT event_id, org_id, initiator_id, initiator_type, trigger_id, chain_depth, link, cost
		FROM `+s.db+`.usage FINAL WHERE has(?, event_id)`, ids)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = q.Close() }()
	rows := map[string]irRow{}
	pending := 0
	for q.Next() {
		var id string
		var cost decimal.Decimal
		var r irRow
		if err := q.Scan(&id, &r.org, &r.chain.InitiatorID, &r.chain.InitiatorType, &r.chain.TriggerID, &r.chain.Depth, &r.chain.Link, &cost); err != nil {
			return nil, 0, err
		}
		r.costMicros = cost.Shift(6).IntPart() // Decimal(38, 6): exact
		if r.chain.Link == cause.SourcePending {
			pending++
		}
		rows[id] = r
	}
	return rows, pending, q.Err()
}

type irScores struct {
	simulate.Tally
	usage int
}

type irSpend struct{ Events, CostMicros int64 }

// irReconcile compares each usage row's chain with the truth: initiator, trigger,
// depth and whether the link is explicit.
func irReconcile(t *testing.T, r irRun, rows map[string]irRow) irScores {
	t.Helper()
	var sc irScores
	for _, tr := range r.usage {
		row, ok := rows[tr.EventID]
		require.True(t, ok, "usage row of %s", tr.EventID)
		sc.usage++
		sc.Add(tr, row.chain)
	}
	return sc
}

const irCostsQuery = `query($org: ID, $from: Time!, $to: Time!) {
  costs(orgId: $org, from: $from, to: $to, groupBy: [INITIATOR], limit: 500) {
    rows { initiatorId events cost currency }
    truncated
  }
}`
