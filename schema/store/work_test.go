package store_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/work"
)

func workRow(id, typ string, at time.Time, room, actor, actorType string, data any) store.EventRow {
	b, _ := json.Marshal(data)
	return store.EventRow{ID: id, Type: typ, Time: at, OrgID: "org-a", RoomID: room, ActorID: actor, ActorType: actorType, Data: string(b)}
}

func TestWorkOf(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	events := []store.EventRow{
		workRow("m1", schema.TypeMessageCreated, t0, "r1", "a1", "agent", schema.MessageData{Content: strings.Repeat("é", 300)}),
		workRow("m2", schema.TypeMessageCreated, t0.Add(time.Second), "r1", "a1", "agent", schema.MessageData{Content: "later"}),
		// Out of order within the batch: the older one does not win.
		workRow("m0", schema.TypeMessageCreated, t0.Add(-time.Second), "r1", "a1", "agent", schema.MessageData{Content: "earlier"}),
		workRow("tk", schema.TypeTaskUpdated, t0, "r1", "u1", "user", schema.TaskData{TaskID: "t1", Status: "in_progress", Assignee: "a1",
			Extra: json.RawMessage(`{"inserted_at":"2025-12-31T09:00:00.123456Z"}`)}),
		workRow("tc", schema.TypeTaskCreated, t0, "r1", "u1", "user", schema.TaskData{TaskID: "t2", Status: "open"}),
		workRow("td", schema.TypeTaskDeleted, t0, "r1", "u1", "user", schema.TaskData{TaskID: "t3"}),
		workRow("q", schema.TypeAttention, t0, "r1", "a1", "agent", schema.MessageData{Content: "ok?", Mentions: []schema.Mention{{ID: "u1"}, {ID: ""}}}),
		workRow("call", schema.TypeToolCall, t0, "r1", "a1", "agent", schema.ToolCallData{ToolName: "x", ToolCallID: "c1"}),
		workRow("call-noid", schema.TypeToolCall, t0, "r1", "a1", "agent", schema.ToolCallData{ToolName: "x"}),
		workRow("res-noid", schema.TypeToolResult, t0, "r1", "a1", "agent", schema.ToolResultData{IsError: true}),
		workRow("ra", schema.TypeRoomAdded, t0, "r1", "a1", "agent", schema.RoomData{Title: "Room one"}),
		workRow("rd", schema.TypeRoomDeleted, t0, "r2", "", "system", schema.RoomData{}),
		// Hostile: undecodable data and events without an organization add nothing.
		{ID: "bad", Type: schema.TypeTaskUpdated, Time: t0, OrgID: "org-a", Data: "{not json"},
		{ID: "noorg", Type: schema.TypeTaskUpdated, Time: t0, Data: `{"task_id":"t9"}`},
	}
	w := store.WorkOf(events)

	var msg, ev, task []store.ActivityRow
	for _, a := range w.Activity {
		switch a.Kind {
		case "message":
			msg = append(msg, a)
		case "task":
			task = append(task, a)
		default:
			ev = append(ev, a)
		}
	}
	require.Len(t, task, 1, "the assignee's task update: %+v", task)
	require.Equal(t, "a1", task[0].ActorID)
	require.Len(t, msg, 1)
	require.Equal(t, "later", msg[0].Text)
	require.Equal(t, uint64(t0.Add(time.Second).UnixMilli())*1_000_000, msg[0].Version)
	for _, a := range ev {
		if a.ActorID == "a1" {
			require.Equal(t, "m2", a.EventID, "the latest event of a1 in r1")
		}
	}
	require.Len(t, w.Tasks, 3)
	require.Equal(t, time.Date(2025, 12, 31, 9, 0, 0, 123456000, time.UTC), w.Tasks[0].CreatedAt, "from the platform's inserted_at")
	require.Equal(t, t0, w.Tasks[1].CreatedAt, "task.created without inserted_at: its time")
	require.True(t, w.Tasks[2].Deleted)
	require.Len(t, w.Attention, 1)
	require.Equal(t, []string{"u1"}, w.Attention[0].Mentions)
	require.Len(t, w.ToolCalls, 2, "a call without an id is not kept")
	require.Equal(t, "event:res-noid", w.ToolCalls[1].CallID)
	require.Equal(t, []store.RoomRow{
		{OrgID: "org-a", RoomID: "r1", Kind: "title", Title: "Room one", Time: t0, EventID: "ra", Version: uint64(t0.UnixMilli()) * 1_000_000},
		{OrgID: "org-a", RoomID: "r2", Kind: "deleted", Time: t0, EventID: "rd", Version: uint64(t0.UnixMilli()) * 1_000_000},
	}, w.Rooms)

	// Two messages of the same millisecond: the later Kafka offset wins.
	a, b := workRow("x1", schema.TypeMessageCreated, t0, "r1", "a1", "agent", schema.MessageData{Content: "first"}),
		workRow("x2", schema.TypeMessageCreated, t0, "r1", "a1", "agent", schema.MessageData{Content: "second"})
	a.Offset, b.Offset = 7, 8
	for _, order := range [][]store.EventRow{{a, b}, {b, a}} {
		for _, r := range store.WorkOf(order).Activity {
			if r.Kind == "message" {
				require.Equal(t, "second", r.Text)
			}
		}
	}

	// A long message is cut to MaxActivityText characters, not bytes.
	w = store.WorkOf(events[:1])
	require.Equal(t, work.MaxActivityText, len([]rune(w.Activity[1].Text)))
}

// A tool result without data, or with data that is no object, says nothing about a
// call: it has no row.
func TestWorkOfSkipsAToolResultWithoutData(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	for _, data := range []string{"", `"text"`} {
		ev := store.EventRow{ID: "res", Type: schema.TypeToolResult, Time: t0, OrgID: "org-a", RoomID: "r1", ActorID: "a1", ActorType: "agent", Data: data}
		require.Empty(t, store.WorkOf([]store.EventRow{ev}).ToolCalls, "data %q", data)
	}
}
