package store_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/store"
)

// rollupGroups reads usage_rollup's groups of org at grain, each group's newest row
// (as the cost reads take it), with events: "bucket owner agent model events cost".
func rollupGroups(ctx context.Context, t *testing.T, conn driver.Conn, db, grain, org string) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT bucket, owner_id, agent_id, model, events, toString(cost) FROM (SELECT bucket, owner_id, agent_id,
		model, events, cost FROM `+db+`.usage_rollup WHERE grain = ? AND org_id = ?
		ORDER BY version DESC LIMIT 1 BY grain, bucket, `+store.RollupGroup+`) WHERE events > 0`, grain, org)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var at time.Time
		var owner, agent, model, cost string
		var events uint64
		require.NoError(t, rows.Scan(&at, &owner, &agent, &model, &events, &cost))
		out = append(out, fmt.Sprintf("%s %s %s %s %d %s", at.UTC().Format("02T15"), owner, agent, model, events, cost))
	}
	require.NoError(t, rows.Err())
	slices.Sort(out)
	return out
}

// rawGroups is the same from usage FINAL, the raw facts.
func rawGroups(ctx context.Context, t *testing.T, conn driver.Conn, db, grain, org string) []string {
	t.Helper()
	bucket := "toStartOfHour(time)"
	if grain == "day" {
		bucket = "toStartOfDay(time)"
	}
	rows, err := conn.Query(ctx, `SELECT `+bucket+` AS b, owner_id, agent_id, model, count(), toString(sum(cost))
		FROM `+db+`.usage FINAL WHERE org_id = ? GROUP BY b, owner_id, agent_id, model`, org)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var at time.Time
		var owner, agent, model, cost string
		var events uint64
		require.NoError(t, rows.Scan(&at, &owner, &agent, &model, &events, &cost))
		out = append(out, fmt.Sprintf("%s %s %s %s %d %s", at.UTC().Format("02T15"), owner, agent, model, events, cost))
	}
	require.NoError(t, rows.Err())
	slices.Sort(out)
	return out
}

// The rollup stays exact when a process stops between its writes: after usage_hourly
// and before usage_rollup (the next rebuild of the hour copies it, and zeroes the group
// the copy still holds although usage_hourly has no row with events for it any more),
// and when usage_rollup is lost altogether (StaleDays finds the days, RefreshDays
// writes them with their hours).
func TestIntegrationRollupSurvivesAStopBetweenItsWrites(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx := context.Background()
	st := store.New(conn, db)
	hour := time.Date(2026, 10, 5, 9, 0, 0, 0, time.UTC)
	usage := func(agent, model string, micros int64, version uint64) store.UsageRow {
		return store.UsageRow{EventID: "u1", Time: hour.Add(10 * time.Minute), OrgID: "o1", OwnerID: "p1", AgentID: agent,
			Model: model, InputTokens: 100, CostMicros: micros, Currency: "USD", Priced: micros > 0, Version: version}
	}
	keys := []store.HourKey{{OrgID: "o1", Hour: hour}}
	require.NoError(t, st.InsertUsage(ctx, []store.UsageRow{usage("a1", "unknown", 0, 1)}))
	require.NoError(t, st.RefreshRollup(ctx, keys))
	assert.Equal(t, []string{"05T09 p1 a1 unknown 1 0.000000"}, rollupGroups(ctx, t, conn, db, "hour", "o1"))

	// A reprice moves the event to agent a2 and model m1, and a process rebuilds the
	// hour in usage_hourly (a1's group zeroed there) and stops before usage_rollup: as
	// that process wrote it.
	require.NoError(t, st.InsertUsage(ctx, []store.UsageRow{usage("a2", "m1", 5000, 2)}))
	v := uint64(time.Now().UnixNano())
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".usage_hourly (hour, org_id, owner_id, agent_id, model, events, input_tokens, cost, currency, version)")
	require.NoError(t, err)
	require.NoError(t, b.Append(hour, "o1", "p1", "a1", "unknown", uint64(0), uint64(0), decimal.Zero, "", v))
	require.NoError(t, b.Append(hour, "o1", "p1", "a2", "m1", uint64(1), uint64(100), decimal.RequireFromString("0.005"), "USD", v))
	require.NoError(t, b.Send())
	stale, err := st.StaleDays(ctx, hour.Add(-24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, []store.DayKey{{OrgID: "o1", Day: hour.Truncate(24 * time.Hour)}}, stale, "the day is older than its hours")

	// The next rebuild of the hour no longer lists a1's group (zero in usage_hourly):
	// usage_rollup still holds it with its event, and must lose it.
	require.NoError(t, st.RefreshRollup(ctx, keys))
	want := []string{"05T09 p1 a2 m1 1 0.005000"}
	assert.Equal(t, want, rollupGroups(ctx, t, conn, db, "hour", "o1"))
	assert.Equal(t, rawGroups(ctx, t, conn, db, "hour", "o1"), rollupGroups(ctx, t, conn, db, "hour", "o1"))
	assert.Equal(t, rawGroups(ctx, t, conn, db, "day", "o1"), rollupGroups(ctx, t, conn, db, "day", "o1"))

	// usage_rollup lost: the days are stale, and rebuilding them brings the hours back.
	stacktest.Truncate(t, conn, db, "usage_rollup")
	stale, err = st.StaleDays(ctx, hour.Add(-24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []store.DayKey{{OrgID: "o1", Day: hour.Truncate(24 * time.Hour)}}, stale)
	require.NoError(t, st.RefreshDays(ctx, "o1", []time.Time{stale[0].Day}))
	assert.Equal(t, want, rollupGroups(ctx, t, conn, db, "hour", "o1"))
	assert.Equal(t, rawGroups(ctx, t, conn, db, "day", "o1"), rollupGroups(ctx, t, conn, db, "day", "o1"))
	stale, err = st.StaleDays(ctx, hour.Add(-24*time.Hour))
	require.NoError(t, err)
	assert.Empty(t, stale)

	// A refresh with nothing rebuilt since writes the day again and no hour.
	var before uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage_rollup WHERE grain = 'hour'").Scan(&before))
	require.NoError(t, st.RefreshDays(ctx, "o1", []time.Time{hour.Truncate(24 * time.Hour)}))
	var after uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage_rollup WHERE grain = 'hour'").Scan(&after))
	assert.Equal(t, before, after, "hours usage_rollup holds at their version already are not written again")
}
