package query_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/work"
)

// workEvents builds event rows the way ingest stores them; BatchInsert derives the
// work-status rows from them.
type workEvents struct {
	org  string
	rows []store.EventRow
}

func (w *workEvents) add(id, typ string, at time.Time, room, actor, actorType string, data any) {
	b, _ := json.Marshal(data)
	w.rows = append(w.rows, store.EventRow{ID: id, Type: typ, Time: at, OrgID: w.org, RoomID: room, ActorID: actor,
		ActorType: actorType, Data: string(b), SchemaVersion: 1, IngestedAt: at})
}

func TestIntegrationWorkStatus(t *testing.T) {
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, table := range []string{"tasks", "room_activity", "attention", "tool_calls", "rooms", "events"} {
		require.NoError(t, conn.Exec(ctx, "SYSTEM STOP MERGES "+db+"."+table))
	}
	st := store.New(conn, db)
	q := query.New(conn, db)
	// Every read is given Now: a fixed instant, so that the windows and today's counts
	// the reads apply are the ones the test expects whenever it runs. The millisecond
	// part shows where a read keeps whole seconds only.
	now := time.Date(2025, 3, 20, 12, 34, 56, 789_000_000, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }

	// Directory: a person and two agents of org-a.
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Directory: []store.DirectoryRow{
		{Kind: "user", ID: "u-lead", OrgID: "org-a", Handle: "lead", Name: "Lea Lead", Version: 1},
		{Kind: "agent", ID: "a-coder", OrgID: "org-a", Handle: "lead/coder", Name: "Coder", OwnerID: "u-lead", Version: 1},
		{Kind: "agent", ID: "a-writer", OrgID: "org-a", Handle: "lead/writer", Name: "Writer", OwnerID: "u-lead", Version: 1},
	}}))

	a := &workEvents{org: "org-a"}
	a.add("room-1-added", schema.TypeRoomAdded, ago(3*time.Hour), "r1", "a-coder", "agent", schema.RoomData{Title: "Webhooks"})
	// t1: in progress, its assignee silent for 20 minutes: stuck.
	a.add("t1-c", schema.TypeTaskCreated, ago(2*time.Hour), "r1", "u-lead", "user", schema.TaskData{TaskID: "t1", Title: "Fix retries", Status: "open", Assignee: "a-coder"})
	a.add("t1-u", schema.TypeTaskUpdated, ago(40*time.Minute), "r1", "u-lead", "user", schema.TaskData{TaskID: "t1", Title: "Fix retries", Status: "in_progress", Assignee: "a-coder"})
	a.add("coder-msg", schema.TypeMessageCreated, ago(20*time.Minute), "r1", "a-coder", "agent", schema.MessageData{Content: "Working on the retry loop"})
	// t2: in progress, its assignee posted 2 minutes ago: not stuck.
	a.add("t2-u", schema.TypeTaskUpdated, ago(50*time.Minute), "r1", "u-lead", "user", schema.TaskData{TaskID: "t2", Title: "Write docs", Status: "in_progress", Assignee: "a-writer"})
	a.add("writer-tool", schema.TypeToolCall, ago(2*time.Minute), "r1", "a-writer", "agent", schema.ToolCallData{ToolName: "search", ToolCallID: "call-1"})
	// t3: done long ago: not listed.
	a.add("t3-u", schema.TypeTaskUpdated, ago(48*time.Hour), "r1", "u-lead", "user", schema.TaskData{TaskID: "t3", Title: "Old", Status: "done", Assignee: "a-writer"})
	// Attention: q1 answered by the lead; q2 waits; q3 closed by the asker's task update.
	a.add("q1", schema.TypeAttention, ago(30*time.Minute), "r1", "a-coder", "agent", schema.MessageData{Content: "@lead approve?", Mentions: []schema.Mention{{ID: "u-lead", Handle: "lead"}}})
	a.add("lead-reply", schema.TypeMessageCreated, ago(25*time.Minute), "r1", "u-lead", "user", schema.MessageData{Content: "Approved"})
	a.add("q2", schema.TypeAttention, ago(3*time.Minute), "r1", "a-writer", "agent", schema.MessageData{Content: "@lead merge now?", Mentions: []schema.Mention{{ID: "a-writer"}, {ID: "u-lead", Handle: "lead"}}})
	a.add("q3", schema.TypeAttention, ago(15*time.Minute), "r1", "a-writer", "agent", schema.MessageData{Content: "@lead which format?", Mentions: []schema.Mention{{ID: "u-lead"}}})
	a.add("t2-u2", schema.TypeTaskUpdated, ago(5*time.Minute), "r1", "u-lead", "user", schema.TaskData{TaskID: "t2", Title: "Write docs", Status: "in_progress", Assignee: "a-writer"})
	// The tool call gets no result: open. Another one has an error result.
	a.add("coder-call", schema.TypeToolCall, ago(time.Hour), "r1", "a-coder", "agent", schema.ToolCallData{ToolName: "run_tests", ToolCallID: "call-2"})
	a.add("coder-result", schema.TypeToolResult, ago(59*time.Minute), "r1", "a-coder", "agent", schema.ToolResultData{ToolName: "run_tests", ToolCallID: "call-2", IsError: true})
	// Organization b's room and task never show in a's answers.
	b := &workEvents{org: "org-b"}
	b.add("b-task", schema.TypeTaskUpdated, ago(time.Hour), "r1", "u-b", "user", schema.TaskData{TaskID: "tb", Title: "B's", Status: "in_progress", Assignee: "a-b"})
	b.add("b-q", schema.TypeAttention, ago(time.Hour), "r1", "a-b", "agent", schema.MessageData{Content: "b asks"})

	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: append(a.rows, b.rows...)}))
	// A replay of the whole trail, in another part, changes nothing.
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: a.rows}))

	check := func(ws query.WorkStatus) {
		t.Helper()
		require.Len(t, ws.Rooms, 1)
		r := ws.Rooms[0]
		require.Equal(t, "r1", r.RoomID)
		byID := map[string]work.Task{}
		for _, tk := range r.Tasks {
			byID[tk.ID] = tk
		}
		require.Len(t, byID, 2, "t3 is done since long: %+v", r.Tasks)
		require.True(t, byID["t1"].Stuck, "t1: %+v", byID["t1"])
		require.Equal(t, ago(20*time.Minute), byID["t1"].LastActivity, "the assignee's message is its last activity")
		require.Equal(t, ago(5*time.Minute), byID["t1"].StuckSince)
		require.False(t, byID["t2"].Stuck, "t2: %+v", byID["t2"])
		require.Equal(t, ago(2*time.Minute), byID["t2"].LastActivity)
		require.Len(t, r.Attention, 1, "%+v", r.Attention)
		require.Equal(t, "q2", r.Attention[0].ID)
		require.Equal(t, "u-lead", r.Attention[0].AddressedTo, "the first person mentioned, not the agent before it")
		require.Len(t, r.Agents, 2)
		require.Equal(t, "a-writer", r.Agents[0].AgentID, "latest activity first")
		require.Equal(t, "a-coder", r.Agents[1].AgentID)
		require.Equal(t, "Working on the retry loop", r.Agents[1].LastMessage)
		require.Equal(t, uint64(1), r.Agents[1].MessagesToday, "its message of 12:14 today (UTC)")
	}
	ws, err := q.WorkStatus(ctx, query.WorkQuery{OrgID: "org-a", Now: now})
	require.NoError(t, err)
	check(ws)
	ws, err = q.WorkStatus(ctx, query.WorkQuery{OrgID: "org-a", RoomID: "r1", Now: now})
	require.NoError(t, err)
	check(ws)

	// A longer stuck time: nothing is stuck.
	ws, err = q.WorkStatus(ctx, query.WorkQuery{OrgID: "org-a", Now: now, StuckAfter: time.Hour})
	require.NoError(t, err)
	for _, tk := range ws.Rooms[0].Tasks {
		require.False(t, tk.Stuck, "%+v", tk)
	}

	// Organization b sees its own room r1 only (same room id, other tenant).
	ws, err = q.WorkStatus(ctx, query.WorkQuery{OrgID: "org-b", Now: now})
	require.NoError(t, err)
	require.Len(t, ws.Rooms, 1)
	require.Len(t, ws.Rooms[0].Tasks, 1)
	require.Equal(t, "tb", ws.Rooms[0].Tasks[0].ID)
	require.Len(t, ws.Rooms[0].Attention, 1, "b's request names nobody and no person posted")

	// Agents: the coder's call-1 is the writer's; call-2 has a result (an error).
	agents, err := q.Agents(ctx, query.AgentQuery{OrgID: "org-a", Now: now})
	require.NoError(t, err)
	require.Len(t, agents, 2)
	require.Equal(t, "lead/coder", agents[0].Handle)
	require.Empty(t, agents[0].OpenToolCalls)
	require.Equal(t, uint64(1), agents[0].ToolResults)
	require.Equal(t, uint64(1), agents[0].ToolErrors)
	require.Len(t, agents[1].OpenToolCalls, 1)
	require.Equal(t, "call-1", agents[1].OpenToolCalls[0].ID)
	require.Equal(t, uint64(0), agents[1].ToolResults)

	// Rooms, with names and counts.
	rooms, err := q.Rooms(ctx, query.RoomQuery{OrgID: "org-a", Now: now})
	require.NoError(t, err)
	require.Len(t, rooms, 1)
	require.Equal(t, query.Room{ID: "r1", Name: "Webhooks", LastActivity: ago(2 * time.Minute).Truncate(time.Second), OpenTasks: 2, StuckTasks: 1, OpenAttention: 1},
		withoutMs(rooms[0]))
	names, err := q.RoomNames(ctx, "org-b", []string{"r1"})
	require.NoError(t, err)
	require.Empty(t, names, "org-a's room title is not org-b's")

	// The hub's seed: every organization's tasks in progress.
	seeded, err := q.TasksInProgress(ctx, now, work.DefaultStuckAfter, 100)
	require.NoError(t, err)
	require.Len(t, seeded, 3)
	seeded, err = q.TasksInProgress(ctx, now.Add(query.SeedWindow), work.DefaultStuckAfter, 100)
	require.NoError(t, err)
	require.Empty(t, seeded, "tasks not updated within the seed window are not followed")

	// Organization c: a request in a room quiet for more than a day still shows; a
	// request closed by the asker's task update stays closed when the task is
	// reassigned; two agents' tool calls with the same id do not pair.
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Directory: []store.DirectoryRow{
		{Kind: "agent", ID: "x1", OrgID: "org-c", Handle: "c/x1", Version: 1},
		{Kind: "agent", ID: "x2", OrgID: "org-c", Handle: "c/x2", Version: 1},
	}}))
	c := &workEvents{org: "org-c"}
	c.add("old-q", schema.TypeAttention, ago(26*time.Hour), "quiet", "x1", "agent", schema.MessageData{Content: "still there?"})
	c.add("q9", schema.TypeAttention, ago(10*time.Minute), "r3", "x1", "agent", schema.MessageData{Content: "go?"})
	c.add("t9-a", schema.TypeTaskUpdated, ago(5*time.Minute), "r3", "u", "user", schema.TaskData{TaskID: "t9", Status: "in_progress", Assignee: "x1"})
	c.add("t9-b", schema.TypeTaskUpdated, ago(time.Minute), "r3", "u", "user", schema.TaskData{TaskID: "t9", Status: "in_progress", Assignee: "x2"})
	c.add("x1-call", schema.TypeToolCall, ago(3*time.Minute), "r3", "x1", "agent", schema.ToolCallData{ToolName: "a", ToolCallID: "call_0"})
	c.add("x2-call", schema.TypeToolCall, ago(3*time.Minute), "r3", "x2", "agent", schema.ToolCallData{ToolName: "b", ToolCallID: "call_0"})
	c.add("x2-res", schema.TypeToolResult, ago(2*time.Minute), "r3", "x2", "agent", schema.ToolResultData{ToolName: "b", ToolCallID: "call_0"})
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: c.rows}))
	ws, err = q.WorkStatus(ctx, query.WorkQuery{OrgID: "org-c", Now: now})
	require.NoError(t, err)
	open := map[string]string{}
	for _, r := range ws.Rooms {
		for _, a := range r.Attention {
			open[a.ID] = r.RoomID
		}
	}
	require.Equal(t, map[string]string{"old-q": "quiet"}, open, "q9 was closed by x1's task update before the reassignment")
	agents, err = q.Agents(ctx, query.AgentQuery{OrgID: "org-c", Now: now})
	require.NoError(t, err)
	require.Len(t, agents, 2)
	require.Len(t, agents[0].OpenToolCalls, 1, "x1's call_0 is not x2's")
	require.Empty(t, agents[1].OpenToolCalls)

	// Hostile input.
	_, err = q.WorkStatus(ctx, query.WorkQuery{})
	require.True(t, errors.Is(err, schema.ErrInvalid), "%v", err)
	_, err = q.Agents(ctx, query.AgentQuery{OrgID: "org-a", Limit: query.MaxListLimit + 1})
	require.True(t, errors.Is(err, schema.ErrInvalid), "%v", err)
	_, err = q.Rooms(ctx, query.RoomQuery{OrgID: "org-a", Limit: -1})
	require.True(t, errors.Is(err, schema.ErrInvalid), "%v", err)
}

// withoutMs drops the sub-second part of a room's last activity (room lists read it
// at second precision).
func withoutMs(r query.Room) query.Room {
	r.LastActivity = r.LastActivity.Truncate(time.Second)
	return r
}

func TestWorkQueryRefusesHostileInput(t *testing.T) {
	q := query.New(nil, "db") // refused before any read
	for _, wq := range []query.WorkQuery{
		{OrgID: "org-a", RoomID: strings.Repeat("r", 257)},
		{OrgID: "org-a", StuckAfter: -time.Second},
		{RoomID: "r1"},
	} {
		_, err := q.WorkStatus(context.Background(), wq)
		require.True(t, errors.Is(err, schema.ErrInvalid), "%+v: %v", wq, err)
	}
}
