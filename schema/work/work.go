// Package work owns the rules of work status, as pure functions from events: a task
// as its latest event left it and when it is stuck, whose events count as activity
// in a room, a request for a human's attention and when it is closed. Ingest writes
// the work tables with them (schema/store), the live hub follows tasks and requests
// with them (graph), and the API's reads apply the same rules to those tables
// (query); one table of cases (worktest) runs through the hub and through the SQL.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package work

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bandplane/bandplane/schema"
)

// Bounds on what work status keeps of an event, in characters (mentions in count).
const (
	MaxTitle        = 500
	MaxStatus       = 64
	MaxQuestion     = 1000
	MaxActivityText = 200
	MaxMentions     = 16
)

// Windows and defaults of work status.
const (
	// DefaultStuckAfter is how long a task in progress may go without activity before
	// it is stuck.
	DefaultStuckAfter = 15 * time.Minute
	// AttentionWindow is how long a request for attention is shown: an older one
	// unanswered is not shown as waiting.
	AttentionWindow = 30 * 24 * time.Hour
	// ActiveWindow is how recent an agent's activity in a room must be to list it as
	// active there, and a done task's update to still show it.
	ActiveWindow = 24 * time.Hour
)

// InProgressStatuses are the status keys (StatusKey) that mean someone is working on
// a task: the only ones that can be stuck.
var InProgressStatuses = []string{"in_progress", "inprogress", "working", "active", "started", "doing"}

// FinishedStatuses are the status keys (StatusKey) that are final.
var FinishedStatuses = []string{"done", "completed", "complete", "closed", "cancelled", "canceled", "resolved"}

// StatusKey is what a status is compared by: trimmed, lower case, spaces as
// underscores.
func StatusKey(status string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(status)), " ", "_")
}

// StatusKeySQL is StatusKey of a stored status column, in ClickHouse SQL (18.16 has
// no trimBoth; lower is ASCII-only there, as every listed status is).
const StatusKeySQL = `lower(replaceAll(replaceRegexpAll(status, '^\\s+|\\s+\\z', ''), ' ', '_'))`

// SQLList is statuses as a ClickHouse tuple literal, for SQL that is generated rather
// than sent with parameters (dashboards). The statuses are plain ASCII words.
func SQLList(statuses []string) string {
	return "('" + strings.Join(statuses, "', '") + "')"
}

// InProgress says whether a task status is one of InProgressStatuses.
func InProgress(status string) bool { return slices.Contains(InProgressStatuses, StatusKey(status)) }

// Finished says whether a task status is one of FinishedStatuses.
func Finished(status string) bool { return slices.Contains(FinishedStatuses, StatusKey(status)) }

// Cut returns the first n characters of s.
func Cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}

// Active says whether the events of an actor of this type count as activity in their
// room: an agent's or a person's do, the platform's and bandplane's own do not.
func Active(actorType string) bool {
	return actorType == string(schema.ActorAgent) || actorType == string(schema.ActorUser)
}

// Task is a task as its latest event left it.
type Task struct {
	ID, RoomID, Title, Status, AssigneeID string
	CreatedAt                             time.Time // zero when unknown
	UpdatedAt                             time.Time
	Deleted                               bool
	// LastActivity is the later of UpdatedAt and the assignee's latest activity in
	// the room (Touch).
	LastActivity time.Time
	Stuck        bool
	StuckSince   time.Time // LastActivity + the stuck time, when Stuck
}

// TaskOf is the task a task event (task.created, task.updated or task.deleted) at
// time at in room leaves; ok is false for another type, or data without a task id.
// CreatedAt is the platform's inserted_at when the payload carries it, else the time
// of a task.created.
func TaskOf(typ string, at time.Time, room string, data []byte) (t Task, ok bool) {
	if typ != schema.TypeTaskCreated && typ != schema.TypeTaskUpdated && typ != schema.TypeTaskDeleted {
		return Task{}, false
	}
	var d schema.TaskData
	if schema.DecodeData(data, &d) != nil || d.TaskID == "" || len(d.TaskID) > schema.MaxIDBytes {
		return Task{}, false
	}
	t = Task{ID: d.TaskID, RoomID: room, Title: Cut(d.Title, MaxTitle), Status: Cut(d.Status, MaxStatus), AssigneeID: d.Assignee,
		CreatedAt: insertedAt(d.Extra), UpdatedAt: at, LastActivity: at, Deleted: typ == schema.TypeTaskDeleted}
	if t.CreatedAt.IsZero() && typ == schema.TypeTaskCreated {
		t.CreatedAt = at
	}
	return t, true
}

// insertedAt reads the platform's inserted_at of a task from its payload's extra
// fields; zero when absent or unreadable.
func insertedAt(extra json.RawMessage) time.Time {
	if len(extra) == 0 {
		return time.Time{}
	}
	var x struct {
		InsertedAt string `json:"inserted_at"`
	}
	if json.Unmarshal(extra, &x) != nil || x.InsertedAt == "" {
		return time.Time{}
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999"} {
		if t, err := time.Parse(layout, x.InsertedAt); err == nil && t.Year() >= 1970 && t.Year() < 2106 {
			return t.UTC()
		}
	}
	return time.Time{}
}

// Touch records activity of the task's assignee in its room at at.
func (t *Task) Touch(at time.Time) {
	if at.After(t.LastActivity) {
		t.LastActivity = at
	}
}

// SetStuck decides the stuck flag as of now: in progress, and no activity for after.
func (t *Task) SetStuck(now time.Time, after time.Duration) {
	t.Stuck, t.StuckSince = false, time.Time{}
	if !t.Deleted && InProgress(t.Status) && !now.Before(t.LastActivity.Add(after)) {
		t.Stuck, t.StuckSince = true, t.LastActivity.Add(after)
	}
}

// Attention is a request for a human's attention (an event.attention).
type Attention struct {
	ID, RoomID, AskerID, AskerHandle string
	// AddressedTo is the first person the request mentions ("" when it names nobody the
	// directory knows as a person; see Address).
	AddressedTo string
	Mentions    []string // at most MaxMentions
	Question    string
	Since       time.Time
}

// AttentionOf is the request an event.attention with this id, room, asker, time and
// data makes; ok is false without a room or with data that does not decode.
func AttentionOf(id, room, askerID, askerHandle string, at time.Time, data []byte) (a Attention, ok bool) {
	var d schema.MessageData
	if room == "" || schema.DecodeData(data, &d) != nil {
		return Attention{}, false
	}
	a = Attention{ID: id, RoomID: room, AskerID: askerID, AskerHandle: askerHandle, Question: Cut(d.Content, MaxQuestion), Since: at}
	for _, m := range d.Mentions {
		if m.ID != "" && len(a.Mentions) < MaxMentions {
			a.Mentions = append(a.Mentions, m.ID)
		}
	}
	return a, true
}

// Address sets AddressedTo: the first of the mentions that person says is a person.
func (a *Attention) Address(person func(id string) bool) {
	a.AddressedTo = ""
	for _, m := range a.Mentions {
		if person(m) {
			a.AddressedTo = m
			return
		}
	}
}

// Answers says whether a message posted at at by a person closes the request: one the
// request addresses (any person, when it addresses nobody), after it was asked.
func (a *Attention) Answers(personID string, at time.Time) bool {
	return (a.AddressedTo == "" || a.AddressedTo == personID) && at.After(a.Since)
}

// Resumes says whether an update at at of a task assigned to assignee, in the
// request's room, closes it: the agent that asked took up its work again.
func (a *Attention) Resumes(assignee string, at time.Time) bool {
	return assignee != "" && assignee == a.AskerID && at.After(a.Since)
}

// Open applies both closing rules at once, to the latest of each kind of closing
// event: replied is the latest message of the person the request addresses (of any
// person, when it addresses nobody) in its room, askerTaskUpdate the latest update in
// its room of a task assigned to the agent that asked (zero: none).
func (a *Attention) Open(replied, askerTaskUpdate time.Time) bool {
	return !a.Answers(a.AddressedTo, replied) && !a.Resumes(a.AskerID, askerTaskUpdate)
}

// StopLoop is the stop the policy's loop guard puts on an agent in a room: its
// send_message was denied with the policy's code "loop" (policy.CodeLoop), past a
// chain's depth or a ping-pong between two agents. The board shows it as "stopped: loop".
const StopLoop = "loop"

// MaxStopReason bounds the reason of a stop kept, in characters.
const MaxStopReason = 300

// Stop is a stop of an agent in a room: which (StopLoop), since when, and the policy's
// message.
type Stop struct {
	Kind   string
	At     time.Time
	Reason string
}

// StopOf reads the data of a policy.decided event at time at: the stop a denied
// send_message puts on its agent in its room; ok is false for any other decision, an
// allowed one, or a deny for another reason (a rate or a budget waits, a loop does not).
func StopOf(at time.Time, data []byte) (s Stop, ok bool) {
	var d struct {
		Decision string `json:"decision"`
		Allow    bool   `json:"allow"`
		Reasons  []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"reasons"`
	}
	if schema.DecodeData(data, &d) != nil || d.Decision != "send_message" || d.Allow {
		return Stop{}, false
	}
	for _, r := range d.Reasons {
		if r.Code == StopLoop {
			return Stop{Kind: StopLoop, At: at, Reason: Cut(r.Message, MaxStopReason)}, true
		}
	}
	return Stop{}, false
}

// Holds says whether the stop still holds when the agent's latest message in the room
// was at lastMessage: a stop lasts until the agent posts there again (the policy let
// it: a person broke the loop, or a new chain began).
func (s Stop) Holds(lastMessage time.Time) bool {
	return s.Kind != "" && s.At.After(lastMessage)
}

// StopSQL is the filter of the events that may be stops, in ClickHouse SQL over the
// events table (StopOf decides): denied send_message decisions naming the loop code.
// visitParam* read the first key of the name at any depth: policy/api writes
// "decision" and "allow" first.
const StopSQL = `type = '` + schema.TypePolicyDecided + `' AND visitParamExtractString(data, 'decision') = 'send_message'` +
	` AND visitParamExtractBool(data, 'allow') = 0 AND position(data, '"code":"loop"') > 0`
