package dual_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/schema/store"
)

// The cause links ingest stores and reads back (its warm start, a late trigger's
// rewrite of causes and usage) on the same simulated traffic, on 18.16 and on 26.9.
func TestIntegrationCorpusCauses(t *testing.T) {
	ctx := context.Background()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	loadSimulated(t, rec, 2000)
	st := store.New(rec, db)

	recent, err := st.RecentCauses(ctx, time.Now().Add(-3*time.Hour), 100_000)
	require.NoError(t, err)
	require.NotEmpty(t, recent, "the simulated messages have links")
	var ids []string
	for _, r := range recent {
		assert.NotEmpty(t, r.MessageID, "RecentCauses reads messages and pending links")
	}
	from, to := time.Now().Add(-3*time.Hour), time.Now().Add(time.Hour) // the simulated traffic's range
	var n uint64
	require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT count() FROM "+db+".usage FINAL WHERE link != ''").Scan(&n))
	assert.NotZero(t, n, "usage carries its chain")
	rows, err := rec.Conn.Query(ctx, "SELECT event_id FROM "+db+".usage FINAL ORDER BY time, event_id LIMIT 20")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	causes, err := st.CausesOfEvents(ctx, ids, from, to)
	require.NoError(t, err)
	usage, err := st.UsageOfEvents(ctx, ids, from, to)
	require.NoError(t, err)
	require.Len(t, usage, len(ids))
	require.Len(t, causes, len(ids), "every usage event has its cause row")
	byID := map[string]store.Chain{}
	for _, c := range causes {
		c.Chain.TriggerEventID = "" // usage keeps the platform's id of the trigger only
		byID[c.EventID] = c.Chain
	}
	for _, u := range usage {
		assert.Equal(t, byID[u.EventID], u.Chain, "usage %s carries the chain of its cause row", u.EventID)
	}

	// A rewrite at a higher version is what FINAL reads after.
	for i := range causes {
		causes[i].Chain.InitiatorID, causes[i].Version = "rewritten", causes[i].Version+1
	}
	require.NoError(t, st.InsertCauses(ctx, causes))
	again, err := st.CausesOfEvents(ctx, ids, from, to)
	require.NoError(t, err)
	require.Len(t, again, len(ids))
	for _, c := range again {
		assert.Equal(t, "rewritten", c.Chain.InitiatorID)
	}

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps", len(steps))
}
