// Package worktest holds the table of work-status cases that every derivation of work
// status runs: the live hub (graph) and the SQL reads of the work tables (query), so
// that both apply schema/work's rules the same way.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package worktest

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/work"
)

// Start is the instant every case's times count from.
var Start = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// StuckAfter is the stuck time every case is judged with.
const StuckAfter = work.DefaultStuckAfter

// The directory of every case: two people and two agents.
const (
	Lead   = "p-lead"
	Other  = "p-other"
	Coder  = "a-coder"
	Writer = "a-writer"
)

// Party is a directory entry of the cases.
type Party struct {
	ID, Handle string
	Person     bool
}

// Directory lists the parties every case's organization knows.
var Directory = []Party{{Lead, "lead", true}, {Other, "other", true}, {Coder, "lead/coder", false}, {Writer, "lead/writer", false}}

// Event is one event of a case, At after Start.
type Event struct {
	ID    string
	Type  string
	At    time.Duration
	Room  string
	Actor string
	Data  any
}

// ActorType is the event's actor's type by the directory.
func (e Event) ActorType() schema.ActorType {
	for _, p := range Directory {
		if p.Person && strings.HasSuffix(e.Actor, p.ID) { // a Scoped id ends with the case's
			return schema.ActorUser
		}
	}
	return schema.ActorAgent
}

// Canonical is the event as the pipeline hands it on, in organization org.
func (e Event) Canonical(org string) *schema.Event {
	b, err := json.Marshal(e.Data)
	if err != nil {
		panic(err) // the cases' data are plain structs
	}
	return &schema.Event{ID: e.ID, Type: e.Type, Time: Start.Add(e.At), OrgID: org, RoomID: e.Room,
		Actor: schema.Party{ID: e.Actor, Type: e.ActorType()}, Source: "worktest", SchemaVersion: 1, Data: b}
}

// Scoped is the case with every party id (actors, mentions, assignees, whom a request
// addresses) prefixed, and the directory to go with it: the directory's ids are global,
// so cases that share one store need ids of their own.
func (c Case) Scoped(prefix string) (Case, []Party) {
	id := func(s string) string {
		if s == "" {
			return ""
		}
		return prefix + s
	}
	out := Case{Name: c.Name, Now: c.Now}
	for _, e := range c.Events {
		e.Actor = id(e.Actor)
		switch d := e.Data.(type) {
		case schema.TaskData:
			d.Assignee = id(d.Assignee)
			e.Data = d
		case schema.MessageData:
			ms := make([]schema.Mention, len(d.Mentions))
			for i, m := range d.Mentions {
				m.ID = id(m.ID)
				ms[i] = m
			}
			d.Mentions = ms
			e.Data = d
		}
		out.Events = append(out.Events, e)
	}
	out.Want.InProgress = c.Want.InProgress
	if c.Want.Open != nil {
		out.Want.Open = map[string]string{}
		for k, v := range c.Want.Open {
			out.Want.Open[k] = id(v)
		}
	}
	var dir []Party
	for _, p := range Directory {
		p.ID = id(p.ID)
		dir = append(dir, p)
	}
	return out, dir
}

// Want is the work status a case ends in, as of its Now.
type Want struct {
	// InProgress maps each task in progress to whether it is stuck.
	InProgress map[string]bool
	// Open maps each open request for attention to the person it addresses ("" for
	// nobody).
	Open map[string]string
}

// Case is events in the order they arrive, and the status they leave at Now (after
// Start). The live hub applies events as they arrive: a closing event that arrives
// before the request or task event it would close (a reply before an older request, an
// assignee's activity before an older task event) closes nothing there, while the
// work tables, read whole, apply it; such orders are not among the cases, and graph's
// README says so.
type Case struct {
	Name   string
	Events []Event
	Now    time.Duration
	Want   Want
}

func task(id, typ string, at time.Duration, room, status, assignee string) Event {
	return Event{ID: id, Type: typ, At: at, Room: room, Actor: Lead, Data: schema.TaskData{TaskID: "t1", Title: "Fix retries", Status: status, Assignee: assignee}}
}

func taskN(n string, e Event) Event {
	d := e.Data.(schema.TaskData)
	d.TaskID = n
	e.Data = d
	return e
}

func msg(id string, at time.Duration, room, actor string) Event {
	return Event{ID: id, Type: schema.TypeMessageCreated, At: at, Room: room, Actor: actor, Data: schema.MessageData{Content: "on it"}}
}

func ask(id string, at time.Duration, room, asker string, mentions ...string) Event {
	d := schema.MessageData{Content: "approve?"}
	for _, m := range mentions {
		d.Mentions = append(d.Mentions, schema.Mention{ID: m})
	}
	return Event{ID: id, Type: schema.TypeAttention, At: at, Room: room, Actor: asker, Data: d}
}

const m = time.Minute

// Cases are the work-status cases.
var Cases = []Case{
	{Name: "the assignee's recent activity keeps a task from being stuck",
		Events: []Event{task("t1-c", schema.TypeTaskCreated, 0, "r1", "in_progress", Coder), msg("c1", 10*m, "r1", Coder)},
		Now:    20 * m, Want: Want{InProgress: map[string]bool{"t1": false}}},
	{Name: "a task in progress whose assignee is silent is stuck",
		Events: []Event{task("t1-c", schema.TypeTaskCreated, 0, "r1", "in_progress", Coder)},
		Now:    20 * m, Want: Want{InProgress: map[string]bool{"t1": true}}},
	{Name: "another actor's activity does not count",
		Events: []Event{task("t1-c", schema.TypeTaskCreated, 0, "r1", "in_progress", Coder), msg("w1", 10*m, "r1", Writer)},
		Now:    20 * m, Want: Want{InProgress: map[string]bool{"t1": true}}},
	{Name: "the assignee's activity in another room does not count",
		Events: []Event{task("t1-c", schema.TypeTaskCreated, 0, "r1", "in_progress", Coder), msg("c1", 10*m, "r2", Coder)},
		Now:    20 * m, Want: Want{InProgress: map[string]bool{"t1": true}}},
	{Name: "a status spelled another way is the same status",
		Events: []Event{task("t1-c", schema.TypeTaskCreated, 0, "r1", " In Progress ", Coder)},
		Now:    20 * m, Want: Want{InProgress: map[string]bool{"t1": true}}},
	{Name: "finished and deleted tasks are not in progress",
		Events: []Event{
			task("t1-c", schema.TypeTaskCreated, 0, "r1", "in_progress", Coder), task("t1-d", schema.TypeTaskUpdated, 5*m, "r1", "done", Coder),
			taskN("t2", task("t2-c", schema.TypeTaskCreated, 0, "r1", "in_progress", Writer)),
			taskN("t2", task("t2-x", schema.TypeTaskDeleted, 5*m, "r1", "in_progress", Writer)),
			taskN("t3", task("t3-c", schema.TypeTaskCreated, 0, "r1", "open", Writer)),
		},
		Now: 20 * m, Want: Want{}},
	{Name: "the latest event wins whatever order events arrive in",
		Events: []Event{task("t1-d", schema.TypeTaskUpdated, 10*m, "r1", "done", Coder), task("t1-p", schema.TypeTaskUpdated, 5*m, "r1", "in_progress", Coder)},
		Now:    30 * m, Want: Want{}},
	{Name: "a request answered by the person it addresses is closed",
		Events: []Event{ask("q1", 0, "r1", Coder, Writer, Lead), msg("l1", 5*m, "r1", Lead)},
		Now:    10 * m, Want: Want{}},
	{Name: "a request answered by another person stays open",
		Events: []Event{ask("q1", 0, "r1", Coder, Writer, Lead), msg("o1", 5*m, "r1", Other)},
		Now:    10 * m, Want: Want{Open: map[string]string{"q1": Lead}}},
	{Name: "a request that addresses nobody is answered by any person",
		Events: []Event{ask("q1", 0, "r1", Coder, Writer), msg("o1", 5*m, "r1", Other)},
		Now:    10 * m, Want: Want{}},
	{Name: "an agent's message answers no request",
		Events: []Event{ask("q1", 0, "r1", Coder), msg("w1", 5*m, "r1", Writer)},
		Now:    10 * m, Want: Want{Open: map[string]string{"q1": ""}}},
	{Name: "a reply in another room answers no request",
		Events: []Event{ask("q1", 0, "r1", Coder, Lead), msg("l1", 5*m, "r2", Lead)},
		Now:    10 * m, Want: Want{Open: map[string]string{"q1": Lead}}},
	{Name: "a message before the request, or at its instant, does not answer it",
		Events: []Event{msg("l0", 0, "r1", Lead), ask("q1", 5*m, "r1", Coder, Lead), msg("l1", 5*m, "r1", Lead)},
		Now:    10 * m, Want: Want{Open: map[string]string{"q1": Lead}}},
	{Name: "an update of the asker's task closes its request",
		Events: []Event{ask("q1", 0, "r1", Coder, Lead), task("t1-u", schema.TypeTaskUpdated, 5*m, "r1", "in_progress", Coder)},
		Now:    10 * m, Want: Want{InProgress: map[string]bool{"t1": false}}},
	{Name: "an update of another agent's task does not",
		Events: []Event{ask("q1", 0, "r1", Coder, Lead), task("t1-u", schema.TypeTaskUpdated, 5*m, "r1", "in_progress", Writer)},
		Now:    10 * m, Want: Want{InProgress: map[string]bool{"t1": false}, Open: map[string]string{"q1": Lead}}},
	{Name: "an update of the asker's task in another room does not",
		Events: []Event{ask("q1", 0, "r1", Coder, Lead), task("t1-u", schema.TypeTaskUpdated, 5*m, "r2", "open", Coder)},
		Now:    10 * m, Want: Want{Open: map[string]string{"q1": Lead}}},
	{Name: "a request delivered again after its answer stays answered",
		Events: []Event{ask("q1", 0, "r1", Coder, Lead), msg("l1", 5*m, "r1", Lead), ask("q1", 0, "r1", Coder, Lead)},
		Now:    10 * m, Want: Want{}},
	{Name: "a request delivered twice is one request",
		Events: []Event{ask("q1", 0, "r1", Coder, Lead), ask("q1", 0, "r1", Coder, Lead)},
		Now:    10 * m, Want: Want{Open: map[string]string{"q1": Lead}}},
}
