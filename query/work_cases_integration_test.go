package query_test

import (
	"context"
	"fmt"
	"strings"
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
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// One database for every case, each in an organization of its own with party ids
	// of its own (directory ids are global: one agent, one row).
	var batch store.Batch
	cases := make([]worktest.Case, len(worktest.Cases))
	for i, c := range worktest.Cases {
		org := fmt.Sprintf("org-case-%02d", i)
		scoped, dir := c.Scoped(fmt.Sprintf("c%02d-", i))
		cases[i] = scoped
		for _, p := range dir {
			kind := "agent"
			if p.Person {
				kind = "user"
			}
			batch.Directory = append(batch.Directory, store.DirectoryRow{Kind: kind, ID: p.ID, OrgID: org, Handle: p.Handle, Name: p.Handle, Version: 1})
		}
		for n, e := range scoped.Events {
			ev := e.Canonical(org)
			batch.Events = append(batch.Events, store.EventRow{ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, RoomID: ev.RoomID,
				ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type), Data: string(ev.Data), SchemaVersion: 1, IngestedAt: ev.Time,
				Offset: int64(n)})
		}
	}
	// Event ids repeat across cases: each case's are its own.
	for i := range batch.Events {
		batch.Events[i].ID = batch.Events[i].OrgID + "/" + batch.Events[i].ID
	}
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &batch))
	q := query.New(conn, db)

	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ws, err := q.WorkStatus(ctx, query.WorkQuery{OrgID: fmt.Sprintf("org-case-%02d", i), Now: worktest.Start.Add(c.Now), StuckAfter: worktest.StuckAfter})
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
					got.Open[strings.TrimPrefix(a.ID, fmt.Sprintf("org-case-%02d/", i))] = a.AddressedTo
				}
			}
			require.Equal(t, c.Want, got)
		})
	}
}
