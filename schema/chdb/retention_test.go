package chdb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
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

	// A dry run lists, and records nothing.
	res, err := chdb.ApplyRetention(ctx, conn, chdb.Config{Database: db}, r, now, chdb.RetentionOptions{DryRun: true})
	require.NoError(t, err)
	assert.Len(t, res.Dropped, 2)
	assert.Len(t, res.Cuts, 1, "the cut it would record")
	cuts, err := chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	assert.Empty(t, cuts)
	assert.Equal(t, uint64(4), count())

	// Sign sees the cut whole, before it is recorded; what it sets is stored.
	var signed []chdb.Cut
	sign := func(c *chdb.Cut) {
		signed = append(signed, *c)
		c.KeyID, c.Signature = "key-1", fmt.Sprintf("sig-%s-%d", c.Table, c.Partitions)
	}
	res, err = chdb.ApplyRetention(ctx, conn, chdb.Config{Database: db}, r, now, chdb.RetentionOptions{Sign: sign})
	require.NoError(t, err)
	assert.Equal(t, []chdb.Dropped{
		{Table: "events", Partition: day(30).Format("20060102")},
		{Table: "events", Partition: day(20).Format("20060102")},
	}, res.Dropped)
	assert.Equal(t, uint64(1), count())
	// Every dropped row is older than before: the end of the newest dropped day.
	want := chdb.Cut{Table: "events", Before: day(20).Truncate(24*time.Hour).AddDate(0, 0, 1), At: now.Truncate(time.Second), Partitions: 2}
	assert.Equal(t, []chdb.Cut{want}, signed)
	want.KeyID, want.Signature = "key-1", "sig-events-2"
	assert.Equal(t, []chdb.Cut{want}, res.Cuts)
	cuts, err = chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	assert.Equal(t, []chdb.Cut{want}, cuts)
	other, err := chdb.RetentionCuts(ctx, conn, db, "usage")
	require.NoError(t, err)
	assert.Empty(t, other, "usage had nothing to drop")

	// Nothing left to drop: no new cut.
	res, err = chdb.ApplyRetention(ctx, conn, chdb.Config{Database: db}, r, now.Add(time.Hour), chdb.RetentionOptions{Sign: sign})
	require.NoError(t, err)
	assert.Empty(t, res.Dropped)
	assert.Empty(t, res.Cuts)
	cuts, err = chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	assert.Len(t, cuts, 1)

	// Without Sign the cut is recorded unsigned.
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: []store.EventRow{{ID: "e9", Type: "message.created",
		Time: day(15), ActorID: "a", Source: "band", SchemaVersion: 1, IngestedAt: now}}}))
	res, err = chdb.ApplyRetention(ctx, conn, chdb.Config{Database: db}, r, now, chdb.RetentionOptions{})
	require.NoError(t, err)
	assert.Equal(t, []chdb.Dropped{{Table: "events", Partition: day(15).Format("20060102")}}, res.Dropped)
	cuts, err = chdb.RetentionCuts(ctx, conn, db, "events")
	require.NoError(t, err)
	require.Len(t, cuts, 2)
	assert.Empty(t, cuts[1].KeyID)
	assert.Empty(t, cuts[1].Signature)
}

func TestRetentionRefusesNegative(t *testing.T) {
	_, err := chdb.ApplyRetention(context.Background(), nil, chdb.Config{Database: "db"}, chdb.Retention{Events: -time.Hour}, time.Now(), chdb.RetentionOptions{DryRun: true})
	assert.ErrorContains(t, err, "retention --events must not be negative")
}

func TestRetentionRefusesBadDatabase(t *testing.T) {
	_, err := chdb.ApplyRetention(context.Background(), nil, chdb.Config{Database: "db; DROP TABLE x"}, chdb.DefaultRetention(), time.Now(), chdb.RetentionOptions{})
	assert.ErrorContains(t, err, `database name "db; DROP TABLE x" is not a plain identifier`)
}
