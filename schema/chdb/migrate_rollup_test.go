package chdb_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
)

// Migration 008 fills usage_rollup from the rollups an earlier bandplane wrote, every
// row with its version: each group's newest row there is the row FINAL reads from
// usage_hourly and usage_daily, a day older than its hours stays stale (StaleDays), and
// running the migration again changes nothing.
func TestIntegrationMigrationFillsTheRollup(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx := context.Background()
	day := time.Date(2026, 9, 14, 0, 0, 0, 0, time.UTC)
	hour := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	// What an earlier bandplane wrote: hours rebuilt twice (a reprice moved agent a1's
	// event to a2 at version 20, leaving a1 zeroed), the day at version 21 from them,
	// and the next day's hour rebuilt (version 40) after its day (version 30).
	type row struct {
		at             time.Time
		agent          string
		events, micros uint64
		version        uint64
	}
	write := func(table, timeCol string, rows []row) {
		b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+"."+table+" ("+timeCol+", org_id, owner_id, agent_id, model, events, input_tokens, cost, currency, version)")
		require.NoError(t, err)
		for _, r := range rows {
			currency := "USD"
			if r.events == 0 {
				currency = ""
			}
			require.NoError(t, b.Append(r.at, "o1", "p1", r.agent, "m1", r.events, 10*r.events, decimal.New(int64(r.micros), -6), currency, r.version))
		}
		require.NoError(t, b.Send())
	}
	write("usage_hourly", "hour", []row{
		{hour(3), "a1", 2, 500, 10}, {hour(5), "a1", 1, 100, 10},
		{hour(3), "a1", 0, 0, 20}, {hour(3), "a2", 2, 900, 20},
		{hour(30), "a1", 4, 40, 40},
	})
	write("usage_daily", "day", []row{
		{day, "a1", 3, 600, 11},
		{day, "a1", 1, 100, 21}, {day, "a2", 2, 900, 21},
		{day.Add(24 * time.Hour), "a1", 3, 30, 30},
	})

	ms, err := chdb.Migrations()
	require.NoError(t, err)
	var m008 []string
	for _, m := range ms {
		if m.Version == 8 {
			m008 = m.Statements
		}
	}
	require.Len(t, m008, 3, "008: the table, the hours, the days")
	for range 2 {
		for _, s := range m008 {
			require.NoError(t, conn.Exec(ctx, strings.ReplaceAll(s, "{db}", db)))
		}
		assert.Equal(t, final(ctx, t, conn, "SELECT hour, agent_id, events, toString(cost), version FROM "+db+".usage_hourly FINAL"),
			newest(ctx, t, conn, db, "hour"), "the hours")
		assert.Equal(t, final(ctx, t, conn, "SELECT day, agent_id, events, toString(cost), version FROM "+db+".usage_daily FINAL"),
			newest(ctx, t, conn, db, "day"), "the days")
		stale, err := store.New(conn, db).StaleDays(ctx, day)
		require.NoError(t, err)
		assert.Equal(t, []store.DayKey{{OrgID: "o1", Day: day.Add(24 * time.Hour)}}, stale, "the day older than its hour")
	}
}

// final reads sql's rows (bucket, agent, events, cost, version) as sorted lines.
func final(ctx context.Context, t *testing.T, conn driver.Conn, sql string) []string {
	t.Helper()
	rows, err := conn.Query(ctx, sql)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var at time.Time
		var agent, cost string
		var events, version uint64
		require.NoError(t, rows.Scan(&at, &agent, &events, &cost, &version))
		out = append(out, fmt.Sprintf("%s %s %d %s @%d", at.UTC().Format(time.RFC3339), agent, events, cost, version))
	}
	require.NoError(t, rows.Err())
	slices.Sort(out)
	return out
}

// newest reads usage_rollup's rows of grain as the cost reads take them: each group's
// row of the highest version.
func newest(ctx context.Context, t *testing.T, conn driver.Conn, db, grain string) []string {
	t.Helper()
	return final(ctx, t, conn, "SELECT bucket, agent_id, events, toString(cost), version FROM "+db+".usage_rollup WHERE grain = '"+grain+
		"' ORDER BY version DESC LIMIT 1 BY grain, bucket, owner_id, agent_id, room_id, model")
}
