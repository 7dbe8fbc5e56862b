package query_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/store"
)

// A page of large events is refused by ClickHouse before its rows reach the process
// when it would pass the response's budget; the reads of one response share it.
func TestIntegrationResponseBudget(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	big := `{"content":"` + strings.Repeat("x", 256<<10) + `"}` // 256 KiB
	var events []store.EventRow
	for i := range 8 { // 2 MiB of data
		events = append(events, store.EventRow{ID: fmt.Sprintf("big-%d", i), Type: "message.created", Time: base.Add(time.Duration(i) * time.Minute),
			OrgID: "org-a", RoomID: "r1", ActorID: "a1", ActorType: "agent", Data: big, SchemaVersion: 1, IngestedAt: base.Add(time.Hour)})
	}
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: events}))
	q := query.New(conn, db)
	page := query.AuditQuery{OrgID: "org-a", From: base, To: base.Add(time.Hour), Limit: 100}

	_, err := q.AuditEvents(query.WithResponseBudget(ctx, 1<<20), page)
	require.Error(t, err)
	assert.True(t, query.IsResponseTooLarge(err), "%v", err)
	assert.ErrorIs(t, err, query.ErrResponseTooLarge)

	got, err := q.AuditEvents(query.WithResponseBudget(ctx, 16<<20), page)
	require.NoError(t, err, "within the budget")
	assert.Len(t, got.Events, 8)

	got, err = q.AuditEvents(ctx, page)
	require.NoError(t, err, "a read without a budget (the export, the CLI) is not bounded here")
	assert.Len(t, got.Events, 8)

	// Two reads of one response: the second gets what the first left.
	shared := query.WithResponseBudget(ctx, 3<<20)
	_, err = q.AuditEvents(shared, page)
	require.NoError(t, err)
	_, err = q.AuditEvents(shared, page)
	require.Error(t, err, "2 MiB and 2 MiB do not fit in 3 MiB")
	assert.True(t, query.IsResponseTooLarge(err), "%v", err)
}
