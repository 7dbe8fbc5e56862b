package store

import (
	"context"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"golang.org/x/sync/errgroup"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/work"
)

// Work status tables (schema/chdb/migrations/003_work.sql): tasks, room_activity,
// attention, tool_calls and rooms. Their rows are derived from the event rows of a
// batch alone (WorkOf, by the rules of schema/work), each with the event's time in
// milliseconds as its version, so that the latest event wins whatever order rows
// arrive in and a replay rewrites an equal row: they are as replay-safe as the trail
// itself.

// TaskRow is the state of a task after one task event.
type TaskRow struct {
	OrgID, TaskID, RoomID, Title, Status, AssigneeID, ActorID string
	CreatedAt, UpdatedAt                                      time.Time
	Deleted                                                   bool
	EventID                                                   string
	Version                                                   uint64
}

// ActivityRow is an actor's latest event (Kind "event") or message (Kind "message")
// in a room.
type ActivityRow struct {
	OrgID, RoomID, ActorID, Kind, ActorType, ActorHandle string
	Time                                                 time.Time
	Type, Text, EventID                                  string
	Version                                              uint64
}

// AttentionRow is one request for a human's attention.
type AttentionRow struct {
	OrgID, RoomID, EventID string
	Time                   time.Time
	AskerID, AskerHandle   string
	Mentions               []string
	Question               string
	Version                uint64
}

// ToolCallRow is a tool call (Kind "call") or a tool result (Kind "result").
type ToolCallRow struct {
	OrgID, CallID, Kind, AgentID, RoomID, ToolName string
	Time                                           time.Time
	IsError                                        bool
	EventID                                        string
	Version                                        uint64
}

// RoomRow is a room's title (Kind "title") or its deletion (Kind "deleted").
type RoomRow struct {
	OrgID, RoomID, Kind, Title string
	Time                       time.Time
	EventID                    string
	Version                    uint64
}

// Work is the work-status rows of a batch.
type Work struct {
	Tasks     []TaskRow
	Activity  []ActivityRow
	Attention []AttentionRow
	ToolCalls []ToolCallRow
	Rooms     []RoomRow
}

func (w *Work) empty() bool {
	return len(w.Tasks)+len(w.Activity)+len(w.Attention)+len(w.ToolCalls)+len(w.Rooms) == 0
}

// version orders the rows of one key: the event's time in milliseconds, then its
// Kafka offset (modulo 10^6: the events of one room share a partition).
func version(t time.Time, offset int64) uint64 {
	return uint64(max(t.UnixMilli(), 0))*1_000_000 + uint64(max(offset, 0)%1_000_000)
}

// WorkOf derives the work-status rows of events. Events without an organization
// (stored unattributed) have none. A payload that does not decode contributes no row
// of its kind (the event itself was validated before it got here). Within the batch
// only the latest row of each key is kept.
func WorkOf(events []EventRow) Work {
	var w Work
	activity := map[[4]string]int{}
	keep := func(r ActivityRow) {
		k := [4]string{r.OrgID, r.RoomID, r.ActorID, r.Kind}
		if i, ok := activity[k]; ok {
			if w.Activity[i].Version <= r.Version {
				w.Activity[i] = r
			}
			return
		}
		activity[k] = len(w.Activity)
		w.Activity = append(w.Activity, r)
	}
	for i := range events {
		e := &events[i]
		if e.OrgID == "" {
			continue
		}
		v := version(e.Time, e.Offset)
		if e.RoomID != "" && e.ActorID != "" && work.Active(e.ActorType) {
			keep(ActivityRow{OrgID: e.OrgID, RoomID: e.RoomID, ActorID: e.ActorID, Kind: "event", ActorType: e.ActorType,
				ActorHandle: e.ActorHandle, Time: e.Time, Type: e.Type, EventID: e.ID, Version: v})
		}
		switch e.Type {
		case schema.TypeMessageCreated:
			// The text is read below, of the latest message per key only: most of a
			// batch is messages, and decoding each would cost more than the insert.
			if e.RoomID != "" && e.ActorID != "" {
				keep(ActivityRow{OrgID: e.OrgID, RoomID: e.RoomID, ActorID: e.ActorID, Kind: "message", ActorType: e.ActorType,
					ActorHandle: e.ActorHandle, Time: e.Time, Type: e.Type, Text: e.Data, EventID: e.ID, Version: v})
			}
		case schema.TypeAttention:
			if a, ok := work.AttentionOf(e.ID, e.RoomID, e.ActorID, e.ActorHandle, e.Time, []byte(e.Data)); ok {
				w.Attention = append(w.Attention, AttentionRow{OrgID: e.OrgID, RoomID: a.RoomID, EventID: a.ID, Time: a.Since,
					AskerID: a.AskerID, AskerHandle: a.AskerHandle, Mentions: a.Mentions, Question: a.Question, Version: v})
			}
		case schema.TypeTaskCreated, schema.TypeTaskUpdated, schema.TypeTaskDeleted:
			if t, ok := work.TaskOf(e.Type, e.Time, e.RoomID, []byte(e.Data)); ok {
				r := TaskRow{OrgID: e.OrgID, TaskID: t.ID, RoomID: t.RoomID, Title: t.Title, Status: t.Status,
					AssigneeID: t.AssigneeID, ActorID: e.ActorID, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Deleted: t.Deleted,
					EventID: e.ID, Version: v}
				w.Tasks = append(w.Tasks, r)
				if r.AssigneeID != "" && e.RoomID != "" {
					keep(ActivityRow{OrgID: e.OrgID, RoomID: e.RoomID, ActorID: r.AssigneeID, Kind: "task", ActorType: "agent",
						Time: e.Time, Type: e.Type, EventID: e.ID, Version: v})
				}
			}
		case schema.TypeToolCall:
			var d schema.ToolCallData
			if schema.DecodeData([]byte(e.Data), &d) == nil && d.ToolCallID != "" {
				w.ToolCalls = append(w.ToolCalls, ToolCallRow{OrgID: e.OrgID, CallID: d.ToolCallID, Kind: "call", AgentID: e.ActorID,
					RoomID: e.RoomID, ToolName: d.ToolName, Time: e.Time, EventID: e.ID, Version: v})
			}
		case schema.TypeToolResult:
			var d schema.ToolResultData
			if len(e.Data) > 0 && schema.DecodeData([]byte(e.Data), &d) == nil { // a result without data has no row
				id := d.ToolCallID
				if id == "" {
					id = "event:" + e.ID
				}
				w.ToolCalls = append(w.ToolCalls, ToolCallRow{OrgID: e.OrgID, CallID: id, Kind: "result", AgentID: e.ActorID,
					RoomID: e.RoomID, ToolName: d.ToolName, Time: e.Time, IsError: d.IsError, EventID: e.ID, Version: v})
			}
		case schema.TypeRoomAdded:
			var d schema.RoomData
			if schema.DecodeData([]byte(e.Data), &d) == nil && e.RoomID != "" && d.Title != "" {
				w.Rooms = append(w.Rooms, RoomRow{OrgID: e.OrgID, RoomID: e.RoomID, Kind: "title", Title: work.Cut(d.Title, work.MaxTitle), Time: e.Time, EventID: e.ID, Version: v})
			}
		case schema.TypeRoomDeleted:
			if e.RoomID != "" {
				w.Rooms = append(w.Rooms, RoomRow{OrgID: e.OrgID, RoomID: e.RoomID, Kind: "deleted", Time: e.Time, EventID: e.ID, Version: v})
			}
		}
	}
	for i := range w.Activity {
		if a := &w.Activity[i]; a.Kind == "message" {
			var d schema.MessageData
			if schema.DecodeData([]byte(a.Text), &d) != nil {
				d.Content = ""
			}
			a.Text = work.Cut(d.Content, work.MaxActivityText)
		}
	}
	return w
}

// insertWork writes the work-status rows derived from the batch's events: the tool
// calls (the most rows) beside the other tables, which are written one after another.
func (s *Store) insertWork(ctx context.Context, w Work) error {
	if w.empty() {
		return nil
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return s.send(ctx, "tool_calls", "org_id, agent_id, call_id, kind, room_id, tool_name, time, time_ms, is_error, event_id, version",
			len(w.ToolCalls), func(i int) uint32 { return MonthPartition(w.ToolCalls[i].Time) }, func(b driver.Batch, i int) error {
				r := &w.ToolCalls[i]
				return b.Append(r.OrgID, r.AgentID, r.CallID, r.Kind, r.RoomID, work.Cut(r.ToolName, 256), r.Time, ms(r.Time), b2u(r.IsError), r.EventID, r.Version)
			})
	})
	g.Go(func() error { return s.insertStatus(ctx, w) })
	return g.Wait()
}

// insertStatus writes the tasks, room activity, attention and rooms of w.
func (s *Store) insertStatus(ctx context.Context, w Work) error {
	if err := s.send(ctx, "tasks", "org_id, task_id, room_id, title, status, assignee_id, actor_id, created_at, updated_at, updated_ms, deleted, event_id, version",
		len(w.Tasks), nil, func(b driver.Batch, i int) error {
			r := &w.Tasks[i]
			return b.Append(r.OrgID, r.TaskID, r.RoomID, r.Title, r.Status, r.AssigneeID, r.ActorID, clampTime(r.CreatedAt), r.UpdatedAt,
				ms(r.UpdatedAt), b2u(r.Deleted), r.EventID, r.Version)
		}); err != nil {
		return err
	}
	if err := s.send(ctx, "room_activity", "org_id, room_id, actor_id, kind, actor_type, actor_handle, time, time_ms, type, text, event_id, version",
		len(w.Activity), nil, func(b driver.Batch, i int) error {
			r := &w.Activity[i]
			return b.Append(r.OrgID, r.RoomID, r.ActorID, r.Kind, StoredActorType(r.ActorType), r.ActorHandle, r.Time, ms(r.Time),
				r.Type, r.Text, r.EventID, r.Version)
		}); err != nil {
		return err
	}
	if err := s.send(ctx, "attention", "org_id, room_id, event_id, time, time_ms, asker_id, asker_handle, mentions, question, version",
		len(w.Attention), func(i int) uint32 { return MonthPartition(w.Attention[i].Time) }, func(b driver.Batch, i int) error {
			r := &w.Attention[i]
			mentions := r.Mentions
			if mentions == nil {
				mentions = []string{}
			}
			return b.Append(r.OrgID, r.RoomID, r.EventID, r.Time, ms(r.Time), r.AskerID, r.AskerHandle, mentions, r.Question, r.Version)
		}); err != nil {
		return err
	}
	return s.send(ctx, "rooms", "org_id, room_id, kind, title, time, event_id, version", len(w.Rooms), nil, func(b driver.Batch, i int) error {
		r := &w.Rooms[i]
		return b.Append(r.OrgID, r.RoomID, r.Kind, r.Title, r.Time, r.EventID, r.Version)
	})
}

// clampTime maps the zero time (unknown) to the epoch, DateTime's zero.
func clampTime(t time.Time) time.Time {
	if t.IsZero() || t.Before(time.Unix(0, 0)) {
		return time.Unix(0, 0).UTC()
	}
	return t
}
