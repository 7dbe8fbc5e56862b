package query_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// TestIntegrationNames: ids are named from their own organization's directory only,
// the latest version of an entry wins, and unknown ids have no entry.
func TestIntegrationNames(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	dir := []store.DirectoryRow{
		{Kind: "agent", ID: "a1", OrgID: "org-a", Handle: "alice/old", Name: "Old", OwnerID: "u1", UpdatedAt: at, Version: 1},
		{Kind: "user", ID: "u1", OrgID: "org-a", Handle: "alice", Name: "Alice", UpdatedAt: at, Version: 1},
		{Kind: "agent", ID: "b1", OrgID: "org-b", Handle: "bob/bot", Name: "Bob's bot", OwnerID: "u2", UpdatedAt: at, Version: 1},
	}
	st := store.New(conn, db)
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Directory: dir}))
	renamed := dir[0]
	renamed.Handle, renamed.Name, renamed.Version = "alice/architect", "Architect", 2
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Directory: []store.DirectoryRow{renamed}}))

	q := query.New(conn, db)
	got, err := q.Names(ctx, "org-a", []string{"a1", "u1", "a1", "", "b1", "nobody"})
	require.NoError(t, err)
	assert.Equal(t, map[string]query.Party{
		"a1": {Kind: "agent", Handle: "alice/architect", Name: "Architect"},
		"u1": {Kind: "user", Handle: "alice", Name: "Alice"},
	}, got, "b1 is org-b's: not named for org-a")

	// As many ids as allowed, each as long as allowed: the query text does not grow.
	long := make([]string, query.MaxNames)
	for i := range long {
		long[i] = fmt.Sprintf("%0256d", i)
	}
	long[0] = "a1"
	got, err = q.Names(ctx, "org-a", long)
	require.NoError(t, err)
	assert.Len(t, got, 1)

	got, err = q.Names(ctx, "org-a", nil)
	require.NoError(t, err)
	assert.Empty(t, got)

	many := make([]string, query.MaxNames+1)
	for i := range many {
		many[i] = fmt.Sprintf("id-%d", i)
	}
	_, err = q.Names(ctx, "org-a", many)
	require.Error(t, err)
	assert.True(t, errors.Is(err, schema.ErrInvalid))
	assert.Contains(t, err.Error(), fmt.Sprintf("ids: %d ids to name; at most %d at once", query.MaxNames+1, query.MaxNames))

	_, err = q.Names(ctx, "", []string{"a1"})
	assert.EqualError(t, err, "org_id: required")
}
