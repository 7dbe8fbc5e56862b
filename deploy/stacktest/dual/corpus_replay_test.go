package dual_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// What a policy replay reads of the trail, on 18.16 and on 26.9: the partitions, each
// partition's records of the policy side's types, and the decisions of a range, of
// every organization (the operator's replay) and of one (a tenant's scoped replay).
func TestIntegrationCorpusPolicyReplaySource(t *testing.T) {
	ctx := context.Background()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	loadSimulated(t, rec, 2000)
	var orgs []string
	rows, err := rec.Conn.Query(ctx, "SELECT DISTINCT org_id FROM "+db+".events WHERE org_id != '' ORDER BY org_id LIMIT 2")
	require.NoError(t, err)
	for rows.Next() {
		var org string
		require.NoError(t, rows.Scan(&org))
		orgs = append(orgs, org)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.Len(t, orgs, 2, "the simulated traffic has two organizations or more")
	now := time.Now().UTC().Truncate(time.Second)
	var decisions []store.EventRow
	for i, org := range []string{orgs[0], orgs[1], orgs[0]} {
		decisions = append(decisions, store.EventRow{ID: "decided-" + string(rune('a'+i)), Type: schema.TypePolicyDecided,
			Time: now.Add(time.Duration(i) * time.Second), OrgID: org, ActorID: "agent-" + org, ActorType: "agent", Source: "bandplane-policy",
			Data: `{"decision":"peer_visible","allow":true}`, SchemaVersion: 1, IngestedAt: now, Partition: 0, Offset: 1_000_000 + int64(i)})
	}
	require.NoError(t, store.New(rec, db).BatchInsert(ctx, &store.Batch{Events: decisions}))

	src := replay.ClickHouse{Conn: rec, Database: db}
	drain := func(c replay.Cursor, err error) []replay.Record {
		t.Helper()
		require.NoError(t, err)
		defer func() { _ = c.Close() }()
		var out []replay.Record
		for {
			r, ok, err := c.Next()
			require.NoError(t, err)
			if !ok {
				return out
			}
			out = append(out, r)
		}
	}
	parts, err := src.Partitions(ctx, "")
	require.NoError(t, err)
	require.NotEmpty(t, parts)
	own0, err := src.Partitions(ctx, orgs[0])
	require.NoError(t, err)
	require.NotEmpty(t, own0)
	assert.Subset(t, parts, own0)
	all, own := 0, 0
	for _, p := range parts {
		all += len(drain(src.Records(ctx, p, "")))
		for _, r := range drain(src.Records(ctx, p, orgs[0])) {
			assert.Equal(t, orgs[0], r.Event.OrgID)
			own++
		}
	}
	assert.Positive(t, own)
	assert.Greater(t, all, own, "the whole trail holds other organizations' records")

	from, to := now.Add(-time.Minute), now.Add(time.Minute)
	assert.Len(t, drain(src.Decisions(ctx, from, to, "")), 3)
	scoped := drain(src.Decisions(ctx, from, to, orgs[0]))
	require.Len(t, scoped, 2)
	for _, r := range scoped {
		assert.Equal(t, orgs[0], r.Event.OrgID)
	}

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps replayed on %s", len(steps), other.Name())
}
