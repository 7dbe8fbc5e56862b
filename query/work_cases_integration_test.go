package query_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/work"
	"github.com/bandplane/bandplane/schema/work/worktest"
)

// TestIntegrationWorkCases runs the shared work-status cases through ingest's work
// tables and the SQL of WorkStatus. graph's
// TestHubWorkCases runs the same cases through the live hub.
func TestIntegrationWorkCases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// A database per case: directory ids are global (one agent, one row), and every
	// case's directory holds the same parties.
	for _, c := range worktest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			conn, db := stacktest.Database(t)
			st := store.New(conn, db)
			var batch store.Batch
			for _, p := range worktest.Directory {
				kind := "agent"
				if p.Person {
					kind = "user"
				}
				batch.Directory = append(batch.Directory, store.DirectoryRow{Kind: kind, ID: p.ID, OrgID: "org-a", Handle: p.Handle, Name: p.Handle, Version: 1})
			}
			for n, e := range c.Events {
				ev := e.Canonical("org-a")
				batch.Events = append(batch.Events, store.EventRow{ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, RoomID: ev.RoomID,
					ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type), Data: string(ev.Data), SchemaVersion: 1, IngestedAt: ev.Time,
					Offset: int64(n)})
			}
			require.NoError(t, st.BatchInsert(ctx, &batch))

			ws, err := query.New(conn, db).WorkStatus(ctx, query.WorkQuery{OrgID: "org-a", Now: worktest.Start.Add(c.Now), StuckAfter: worktest.StuckAfter})
			require.NoError(t, err)
			got := worktest.Want{}
			for _, r := range ws.Rooms {
				for _, tk := range r.Tasks {
					if !work.InProgress(tk.Status) {
						continue
					}
					if got.InProgress == nil {
						got.InProgress = map[string]bool{}
					}
					got.InProgress[tk.ID] = tk.Stuck
				}
				for _, a := range r.Attention {
					if got.Open == nil {
						got.Open = map[string]string{}
					}
					got.Open[a.ID] = a.AddressedTo
				}
			}
			require.Equal(t, c.Want, got)
		})
	}
}
