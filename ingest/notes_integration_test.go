package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// storedCopies reads the stored copies of r's key from ClickHouse, as ingest looks them up.
func storedCopies(t *testing.T, st *store.Store, r *store.EventRow) []store.EventRow {
	t.Helper()
	rows, err := st.StoredEvents(context.Background(), []store.EventKey{store.KeyOf(r)})
	require.NoError(t, err)
	return rows
}

// Hostile, against ClickHouse: an attacker edits a sealed row (ALTER TABLE … UPDATE of
// the columns the content digest leaves out) and waits for a redelivery of its record.
// Ingest reads the edited copy back, sees the record's content, and notes nothing of
// it: the edit never gets a leaf. The redelivery is not written again either.
func TestIntegrationEditedCopyIsNotNotedOnRedelivery(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	notes := &fakeNotes{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 1, notes })
	orig := eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"original"}`)
	h.send(0, orig)
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 30*time.Second, 10*time.Millisecond)
	sealed := notes.all()
	require.Len(t, sealed, 1)

	ctx := context.Background()
	require.NoError(t, conn.Exec(ctx, "ALTER TABLE "+db+".events UPDATE owner_id = 'mallory', ingested_at = ingested_at + 3600, "+
		"kafka_offset = kafka_offset + 100000 WHERE id = 'e1'"))
	require.True(t, stacktest.Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		var pending uint64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM system.mutations WHERE database = ? AND table = 'events' AND is_done = 0", db).Scan(&pending))
		return pending == 0
	}), "the mutation did not finish")
	probe := storedRow(t, orig, 0, 0)
	edited := storedCopies(t, st, &probe)
	require.Len(t, edited, 1)
	require.Equal(t, "mallory", edited[0].OwnerID, "the row is edited")

	h.offset[0] = 0 // the same record again: a redelivery
	h.send(0, orig)
	require.Eventually(t, func() bool { return counterValue(t, h.metrics.Records.WithLabelValues("replayed")) == 1 },
		30*time.Second, 10*time.Millisecond)
	assert.Equal(t, sealed, notes.all(), "nothing of the edited copy is noted")
	assert.Len(t, storedCopies(t, st, &probe), 1, "a replay is not written again")
}

// A crash between the insert and the notes (here: the notes never leave before the
// shutdown timeout ends the retries) leaves the row stored and the batch uncommitted.
// The redelivery finds the record's own copy in ClickHouse and notes it, with the
// ingested_at that insert stamped.
func TestIntegrationRowStoredButNotNotedIsNotedOnRedelivery(t *testing.T) {
	conn, db := stacktest.Database(t)
	st := store.New(conn, db)
	orig := eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"original"}`)
	probe := storedRow(t, orig, 0, 0)

	down := &fakeNotes{fail: 1 << 30}
	first := startWith(t, st, func(c *ingest.Config) {
		c.BatchSize, c.Notes, c.ShutdownTimeout = 1, down, 200*time.Millisecond
	})
	first.send(0, orig)
	require.True(t, stacktest.Eventually(t, 30*time.Second, 10*time.Millisecond, func() bool { return len(storedCopies(t, st, &probe)) == 1 }),
		"the row is not stored")
	first.stop()
	require.Zero(t, first.reader.commit(0), "not noted: not committed")
	require.Empty(t, down.all())
	stored := storedCopies(t, st, &probe)
	require.Len(t, stored, 1)

	notes := &fakeNotes{}
	again := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 1, notes })
	again.send(0, orig)
	require.Eventually(t, func() bool { return again.reader.commit(0) == 1 }, 30*time.Second, 10*time.Millisecond)
	got := notes.all()
	assert.Equal(t, []tlog.Leaf{tlog.LeafOf(&stored[0])}, got, "the stored row's leaf")
	require.Len(t, got, 1)
	assert.Equal(t, stored[0].IngestedAt, got[0].IngestedAt, "with the ingested_at of the insert that stored it")
	assert.Equal(t, "u1", stored[0].OwnerID, "the owner ingest writes for the record")
	assert.Len(t, storedCopies(t, st, &probe), 1, "a replay is not written again")
}
