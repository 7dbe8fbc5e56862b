package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/store"
)

func row(id, org string, at time.Time) store.EventRow {
	return store.EventRow{ID: id, Type: "message.created", Time: at, OrgID: org, RoomID: "r", ActorID: "u", ActorType: "user",
		OwnerID: "u", Source: "test", SchemaVersion: 1, Data: `{"content":"` + id + `"}`, IngestedAt: at.Add(time.Second).Truncate(time.Second)}
}

func TestIntegrationStoredEventsFindsRowsByReplacingKey(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	ctx := context.Background()
	at := time.Date(2026, 11, 2, 10, 0, 0, 250e6, time.UTC)
	a, b := row("a", "o1", at), row("b", "o2", at.Add(time.Hour))
	b.ActorType, b.SubjectID, b.SubjectType, b.ExecutionID, b.Partition, b.Offset = "", "agent-1", "agent", "x1", 3, 42
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{a, b, row("c", "o1", at)}}))

	got, err := st.StoredEvents(ctx, []store.EventKey{
		store.KeyOf(&a), store.KeyOf(&b),
		{OrgID: "o2", Time: at.Unix(), ID: "a"},       // same id and time, other organization
		{OrgID: "o1", Time: at.Unix() + 1, ID: "a"},   // same id, another second
		{OrgID: "o1", Time: at.Unix(), ID: "missing"}, // nothing stored
		store.KeyOf(&a), // asked twice
	})
	require.NoError(t, err)
	require.Len(t, got, 2)
	byID := map[string]store.EventRow{}
	for _, r := range got {
		byID[r.ID] = r
	}
	ga, gb := byID["a"], byID["b"]
	assert.Equal(t, a.ContentDigest(), ga.ContentDigest(), "every content column reads back as written")
	assert.Equal(t, b.ContentDigest(), gb.ContentDigest())
	assert.Equal(t, a.Time, byID["a"].Time, "milliseconds included")
	assert.Equal(t, "u", byID["a"].OwnerID)
	assert.Equal(t, a.IngestedAt, byID["a"].IngestedAt)
	assert.Equal(t, int32(3), byID["b"].Partition)
	assert.Equal(t, int64(42), byID["b"].Offset)

	none, err := st.StoredEvents(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, none)

	// Hostile ids travel as data, not as query text.
	evil := row(`x'); DROP TABLE events; --`, "o1", at)
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{evil}}))
	got, err = st.StoredEvents(ctx, []store.EventKey{store.KeyOf(&evil)})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, evil.ID, got[0].ID)
}

// lookupFixture stores 1M events and returns the keys of a fresh batch of 20,000 (the
// common case: nothing is found) among which one is a replay.
func lookupFixture(tb testing.TB) (*store.Store, []store.EventKey) {
	conn, db := stacktest.Database(tb)
	ctx := context.Background()
	start := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	require.NoError(tb, conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.events (id, type, time, org_id, data)
		SELECT concat('ev-', toString(number)), 'message.created', toDateTime(%d + intDiv(number, 300)), concat('org-', toString(number %% 10)), '{"content":"some text of a message"}'
		FROM numbers(1000000)`, db, start.Unix())))
	last := start.Add(1000000 / 300 * time.Second)
	keys := make([]store.EventKey, 20000)
	for i := range keys {
		keys[i] = store.EventKey{OrgID: fmt.Sprintf("org-%d", i%10), Time: last.Unix() - int64(i%60), ID: fmt.Sprintf("new-%d", i)}
	}
	keys[0] = store.EventKey{OrgID: "org-0", Time: start.Unix(), ID: "ev-0"} // one replay
	return store.New(conn, db), keys
}

// TestIntegrationStoredEventsLookupAmongMany: a batch of 20,000 keys against a table of
// 1M rows finds the one replay among them (BenchmarkStoredEventsLookup times it).
func TestIntegrationStoredEventsLookupAmongMany(t *testing.T) {
	st, keys := lookupFixture(t)
	got, err := st.StoredEvents(context.Background(), keys)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "ev-0", got[0].ID)
}

func TestIntegrationInsertSplitsByPartition(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var b store.Batch
	for d := range 250 {
		at := start.Add(time.Duration(d) * 24 * time.Hour)
		b.Events = append(b.Events, row(fmt.Sprintf("e%d", d), "o", at))
		b.Usage = append(b.Usage, store.UsageRow{EventID: fmt.Sprintf("e%d", d), Time: at, OrgID: "o", Model: "m", Currency: "USD", Version: 1})
	}
	for m := range 250 { // months: 250 partitions of dead_letters
		b.DeadLetters = append(b.DeadLetters, store.DeadLetter{Time: start.AddDate(0, m, 0), Topic: "t", Offset: int64(m), Raw: "x", Stage: "decode", Reason: "r", RawBytes: 1})
	}
	require.NoError(t, st.BatchInsert(ctx, &b))
	for _, tc := range []struct {
		table string
		rows  uint64
	}{{"events", 250}, {"usage", 250}, {"dead_letters", 250}} {
		var n uint64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+"."+tc.table).Scan(&n))
		assert.Equal(t, tc.rows, n, tc.table)
		// Parts written by one INSERT share its block number: count inserts and the
		// partitions each touched.
		rows, err := conn.Query(ctx, "SELECT min_block_number, uniqExact(partition) FROM system.parts WHERE database = ? AND table = ? AND active GROUP BY min_block_number", db, tc.table)
		require.NoError(t, err)
		blocks := 0
		for rows.Next() {
			var block int64
			var parts uint64
			require.NoError(t, rows.Scan(&block, &parts))
			assert.LessOrEqual(t, parts, uint64(store.MaxPartitionsPerBlock), "%s: insert %d", tc.table, block)
			blocks++
		}
		require.NoError(t, rows.Err())
		rows.Close()
		assert.GreaterOrEqual(t, blocks, 3, tc.table)
	}
}

func TestIntegrationStartUpStateIsBoundedByHorizon(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	old, recent := row("old", "", now.Add(-3*time.Hour)), row("new", "", now.Add(-time.Minute))
	old.ActorID, recent.ActorID = "agent-old", "agent-new"
	old.IngestedAt, recent.IngestedAt = now.Add(-3*time.Hour), now.Add(-time.Minute)
	attributed := row("attr", "o", now)
	attributed.ActorID = "agent-attributed"
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{
		Events: []store.EventRow{old, recent, attributed},
		Usage: []store.UsageRow{
			{EventID: "u-old", Time: now, AgentID: "agent-old", Model: "unknown", Version: uint64(now.Add(-3 * time.Hour).UnixNano())},
			{EventID: "u-new", Time: now, AgentID: "agent-new", Model: "unknown", Version: uint64(now.Add(-time.Minute).UnixNano())},
			{EventID: "u-priced", Time: now, AgentID: "agent-priced", Model: "m", Priced: true, Version: uint64(now.UnixNano())},
		},
	}))
	late, err := st.UnattributedParties(ctx, now.Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, map[string]time.Time{"agent-new": recent.IngestedAt}, late)
	unpriced, err := st.UnpricedAgents(ctx, now.Add(-time.Hour))
	require.NoError(t, err)
	require.Len(t, unpriced, 1)
	assert.WithinDuration(t, now.Add(-time.Minute), unpriced["agent-new"], time.Millisecond)
	all, err := st.UnattributedParties(ctx, time.Time{})
	require.NoError(t, err)
	assert.Len(t, all, 2)
}

func TestIntegrationScanUsageReadsOnlyTheNamedOrganizations(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	ctx := context.Background()
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	u := func(id, org, agent string) store.UsageRow {
		return store.UsageRow{EventID: id, Time: at, OrgID: org, AgentID: agent, Model: "unknown", Version: 1}
	}
	require.NoError(t, st.InsertUsage(ctx, []store.UsageRow{
		u("mine", "o1", "a1"), u("none", "", "a1"), u("other", "o2", "a1"), u("other-agent", "o1", "a2"),
	}))
	scan := func(f store.UsageFilter) []string {
		var ids []string
		require.NoError(t, st.ScanUsage(ctx, f, 10, func(rows []store.UsageRow) error {
			for _, r := range rows {
				ids = append(ids, r.EventID)
			}
			return nil
		}))
		return ids
	}
	assert.ElementsMatch(t, []string{"mine", "none"}, scan(store.UsageFilter{OrgIDs: []string{"o1", ""}, AgentID: "a1", UnpricedOnly: true}))
	assert.ElementsMatch(t, []string{"none"}, scan(store.UsageFilter{OrgIDs: []string{""}, AgentID: "a1"}))
	assert.ElementsMatch(t, []string{"mine", "other-agent"}, scan(store.UsageFilter{OrgIDs: []string{"o1"}}))
	assert.ElementsMatch(t, []string{"mine", "none", "other", "other-agent"}, scan(store.UsageFilter{}), "no organization named: all of them")
}

func TestIntegrationPermanentOnTheRealServer(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	ctx := context.Background()
	require.NoError(t, conn.Exec(ctx, "ALTER TABLE "+db+".events ADD COLUMN poison UInt8 MATERIALIZED throwIf(room_id = 'poison-room')"))
	bad := row("p", "o", time.Now().UTC())
	bad.RoomID = "poison-room"
	err := st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{row("ok", "o", time.Now().UTC()), bad}})
	require.Error(t, err)
	assert.True(t, store.Permanent(err), "%v", err)
	assert.Contains(t, err.Error(), "throwIf")

	bad.ActorType = "robot" // not in the Enum8: the client refuses it
	err = st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{bad}})
	require.Error(t, err)
	assert.True(t, store.Permanent(err), "%v", err)

	err = store.New(conn, db+"_missing").BatchInsert(ctx, &store.Batch{Events: []store.EventRow{row("x", "o", time.Now().UTC())}})
	require.Error(t, err)
	assert.False(t, store.Permanent(err), "a missing database is the operator's to fix, never the data's: %v", err)
}
