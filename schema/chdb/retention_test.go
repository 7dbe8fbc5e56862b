package chdb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema/chdb"
)

func TestIntegrationRetentionRecordsCuts(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx := context.Background()
	now := time.Now().UTC()
	day := func(ago int) time.Time { return now.AddDate(0, 0, -ago).Truncate(24 * time.Hour).Add(12 * time.Hour) }
	var rows []store.EventRow
	for i, ago := range []int{30, 20, 20, 1} {
		rows = append(rows, store.EventRow{ID: fmt.Sprintf("e%d", i), Type: "message.created", Time: day(ago),
			ActorID: "a", Source: "band", SchemaVersion: 1, IngestedAt: now})
	}
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: rows}))
	r := chdb.Retention{Events: 10 * 24 * time.Hour}
	count := func() uint64 {
		var n uint64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".events").Scan(&n))
		return n
	}

	// A dry run lists and records nothing.
	dropped, err := chdb.ApplyRetention(ctx, conn, db, r, now, true)
	require.NoError(t, err)
	assert.Len(t, dropped, 2)
	cuts, err := chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	assert.Empty(t, cuts)
	assert.Equal(t, uint64(4), count())

	dropped, err = chdb.ApplyRetention(ctx, conn, db, r, now, false)
	require.NoError(t, err)
	assert.Equal(t, []chdb.Dropped{
		{Table: "events", Partition: day(30).Format("20060102")},
		{Table: "events", Partition: day(20).Format("20060102")},
	}, dropped)
	assert.Equal(t, uint64(1), count())
	cuts, err = chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	require.Len(t, cuts, 1)
	// Every dropped row is older than before: the end of the newest dropped day.
	assert.Equal(t, chdb.Cut{Table: "events", Before: day(20).Truncate(24*time.Hour).AddDate(0, 0, 1),
		At: now.Truncate(time.Second), Partitions: 2}, cuts[0])
	other, err := chdb.RetentionCuts(ctx, conn, db, "usage")
	require.NoError(t, err)
	assert.Empty(t, other, "usage had nothing to drop")

	// Nothing left to drop: no new cut.
	dropped, err = chdb.ApplyRetention(ctx, conn, db, r, now.Add(time.Hour), false)
	require.NoError(t, err)
	assert.Empty(t, dropped)
	cuts, err = chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	assert.Len(t, cuts, 1)
}

func TestRetentionRefusesNegative(t *testing.T) {
	_, err := chdb.ApplyRetention(context.Background(), nil, "db", chdb.Retention{Events: -time.Hour}, time.Now(), true)
	assert.ErrorContains(t, err, "retention --events must not be negative")
}
