package work_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/work"
)

var t0 = time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)

func data(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestTaskStuck(t *testing.T) {
	tk := work.Task{Status: "in_progress", LastActivity: t0.Add(-15 * time.Minute)}
	tk.SetStuck(t0, 15*time.Minute)
	require.True(t, tk.Stuck)
	require.Equal(t, t0, tk.StuckSince)
	tk.Touch(t0.Add(-14 * time.Minute))
	tk.SetStuck(t0, 15*time.Minute)
	require.False(t, tk.Stuck)
	tk.Touch(t0.Add(-time.Hour)) // older activity moves nothing
	require.Equal(t, t0.Add(-14*time.Minute), tk.LastActivity)
	for _, s := range []string{"open", "blocked", "done", ""} {
		tk := work.Task{Status: s, LastActivity: t0.Add(-time.Hour)}
		tk.SetStuck(t0, time.Minute)
		require.False(t, tk.Stuck, s)
	}
	deleted := work.Task{Status: "in_progress", Deleted: true, LastActivity: t0.Add(-time.Hour)}
	deleted.SetStuck(t0, time.Minute)
	require.False(t, deleted.Stuck, "a deleted task is never stuck")
}

func TestStatuses(t *testing.T) {
	for _, s := range []string{"in_progress", "In Progress", " working ", "DOING"} {
		require.True(t, work.InProgress(s), s)
		require.False(t, work.Finished(s), s)
	}
	for _, s := range []string{"done", " Completed", "CANCELED"} {
		require.True(t, work.Finished(s), s)
		require.False(t, work.InProgress(s), s)
	}
	for _, s := range []string{"", "open", "blocked", "in-progress", "done!"} {
		require.False(t, work.InProgress(s), s)
		require.False(t, work.Finished(s), s)
	}
	require.Equal(t, "('done', 'closed')", work.SQLList([]string{"done", "closed"}))
}

func TestTaskOf(t *testing.T) {
	d := data(t, schema.TaskData{TaskID: "t1", Title: strings.Repeat("é", 600), Status: "in_progress", Assignee: "a1",
		Extra: json.RawMessage(`{"inserted_at":"2025-12-31T09:00:00Z"}`)})
	tk, ok := work.TaskOf(schema.TypeTaskUpdated, t0, "r1", d)
	require.True(t, ok)
	require.Equal(t, "t1", tk.ID)
	require.Equal(t, "r1", tk.RoomID)
	require.Equal(t, "a1", tk.AssigneeID)
	require.Len(t, []rune(tk.Title), work.MaxTitle, "cut in characters, not bytes")
	require.Equal(t, time.Date(2025, 12, 31, 9, 0, 0, 0, time.UTC), tk.CreatedAt, "the platform's inserted_at")
	require.Equal(t, t0, tk.UpdatedAt)
	require.Equal(t, t0, tk.LastActivity)
	require.False(t, tk.Deleted)

	created, ok := work.TaskOf(schema.TypeTaskCreated, t0, "r1", data(t, schema.TaskData{TaskID: "t2"}))
	require.True(t, ok)
	require.Equal(t, t0, created.CreatedAt, "a task.created without inserted_at was created when it happened")
	updated, ok := work.TaskOf(schema.TypeTaskUpdated, t0, "r1", data(t, schema.TaskData{TaskID: "t2"}))
	require.True(t, ok)
	require.True(t, updated.CreatedAt.IsZero(), "unknown")
	deleted, ok := work.TaskOf(schema.TypeTaskDeleted, t0, "r1", data(t, schema.TaskData{TaskID: "t2"}))
	require.True(t, ok)
	require.True(t, deleted.Deleted)

	// Hostile or foreign input yields no task.
	for name, c := range map[string]struct {
		typ  string
		data []byte
	}{
		"another type":       {schema.TypeMessageCreated, d},
		"no task id":         {schema.TypeTaskUpdated, data(t, schema.TaskData{Status: "done"})},
		"a task id too long": {schema.TypeTaskUpdated, data(t, schema.TaskData{TaskID: strings.Repeat("x", schema.MaxIDBytes+1)})},
		"not JSON":           {schema.TypeTaskUpdated, []byte(`{"task_id":`)},
		"too deep":           {schema.TypeTaskUpdated, []byte(`{"task_id":"t","extra":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`)},
		"bad inserted_at":    {schema.TypeTaskCreated, []byte(`{"task_id":"t","extra":{"inserted_at":"yesterday"}}`)},
	} {
		tk, ok := work.TaskOf(c.typ, t0, "r1", c.data)
		if name == "bad inserted_at" {
			require.True(t, ok, name)
			require.Equal(t, t0, tk.CreatedAt, "%s: an unreadable inserted_at is ignored", name)
			continue
		}
		require.False(t, ok, name)
	}
}

func TestAttention(t *testing.T) {
	mentions := []schema.Mention{{ID: "a2"}, {ID: ""}, {ID: "p1"}, {ID: "p2"}}
	for i := range 20 {
		mentions = append(mentions, schema.Mention{ID: "m" + string(rune('a'+i))})
	}
	a, ok := work.AttentionOf("e1", "r1", "a1", "reviewer", t0, data(t, schema.MessageData{Content: strings.Repeat("?", 2000), Mentions: mentions}))
	require.True(t, ok)
	require.Len(t, a.Mentions, work.MaxMentions)
	require.Equal(t, []string{"a2", "p1", "p2"}, a.Mentions[:3], "empty mentions are dropped")
	require.Len(t, a.Question, work.MaxQuestion)
	require.Equal(t, t0, a.Since)

	a.Address(func(id string) bool { return id == "p1" || id == "p2" })
	require.Equal(t, "p1", a.AddressedTo, "the first person mentioned")
	require.False(t, a.Answers("p2", t0.Add(time.Minute)), "another person's reply")
	require.False(t, a.Answers("p1", t0), "a reply at the same instant")
	require.True(t, a.Answers("p1", t0.Add(time.Millisecond)))
	require.False(t, a.Resumes("a2", t0.Add(time.Minute)), "another agent's task")
	require.False(t, a.Resumes("a1", t0.Add(-time.Minute)), "an update before the request")
	require.True(t, a.Resumes("a1", t0.Add(time.Minute)))

	require.True(t, a.Open(time.Time{}, time.Time{}))
	require.True(t, a.Open(t0, t0), "closing events at the same instant do not close it")
	require.False(t, a.Open(t0.Add(time.Millisecond), time.Time{}))
	require.False(t, a.Open(time.Time{}, t0.Add(time.Second)))

	a.Address(func(string) bool { return false })
	require.Empty(t, a.AddressedTo)
	require.True(t, a.Answers("anyone", t0.Add(time.Second)), "a request that addresses nobody is answered by any person")

	for name, c := range map[string]struct {
		room string
		data []byte
	}{
		"no room":  {"", data(t, schema.MessageData{Content: "?"})},
		"not JSON": {"r1", []byte("{")},
	} {
		_, ok := work.AttentionOf("e", c.room, "a1", "", t0, c.data)
		require.False(t, ok, name)
	}
	empty, ok := work.AttentionOf("e", "r1", "", "", t0, data(t, schema.MessageData{}))
	require.True(t, ok)
	require.False(t, empty.Resumes("", t0.Add(time.Hour)), "no asker: no task resumes it")
}

func TestActive(t *testing.T) {
	require.True(t, work.Active("agent"))
	require.True(t, work.Active("user"))
	require.False(t, work.Active("system"))
	require.False(t, work.Active(""))
}

func TestStopOf(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	s, ok := work.StopOf(at, []byte(`{"decision":"send_message","allow":false,"reasons":[{"code":"loop","message":"loop: chain depth 13 is past max_chain_depth 12"}]}`))
	require.True(t, ok)
	assert.Equal(t, work.Stop{Kind: work.StopLoop, At: at, Reason: "loop: chain depth 13 is past max_chain_depth 12"}, s)
	assert.True(t, s.Holds(time.Time{}))
	assert.True(t, s.Holds(at.Add(-time.Second)), "a message before the stop")
	assert.False(t, s.Holds(at), "a message at the stop's time is not before it")
	assert.False(t, s.Holds(at.Add(time.Second)), "the agent posted again")
	assert.False(t, work.Stop{}.Holds(time.Time{}))

	long, ok := work.StopOf(at, []byte(`{"decision":"send_message","allow":false,"reasons":[{"code":"loop","message":"`+strings.Repeat("é", 400)+`"}]}`))
	require.True(t, ok)
	assert.Equal(t, work.MaxStopReason, utf8.RuneCountInString(long.Reason))

	for name, data := range map[string]string{
		"allowed":          `{"decision":"send_message","allow":true,"reasons":[{"code":"loop"}]}`,
		"a budget":         `{"decision":"send_message","allow":false,"reasons":[{"code":"budget_exceeded","message":"loop"}]}`,
		"another decision": `{"decision":"add_participant","allow":false,"reasons":[{"code":"loop"}]}`,
		"not json":         `{"decision":"send_message","allow":false,"reasons":[{"code":"loop"}`,
		"reasons a string": `{"decision":"send_message","allow":false,"reasons":"loop"}`,
		"code in input":    `{"decision":"send_message","allow":false,"reasons":[{"code":"suspended"}],"input":{"code":"loop"}}`,
		"empty":            ``,
	} {
		_, ok := work.StopOf(at, []byte(data))
		assert.False(t, ok, name)
	}
}
