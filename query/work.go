package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/ext"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/work"
	"github.com/shopspring/decimal"
)

// Work status (graph/README.md, "Work status") reads the tables ingest keeps
// (schema/chdb/migrations/003_work.sql): the latest state of tasks, who did what last
// in each room, the requests for a human's attention. Nothing here scans the trail,
// except today's message counts and the window's loop stops (denied send_message
// decisions) of the rooms asked about, of one organization, by the events table's
// primary key.

// Work status bounds. The rules and windows are schema/work's.
const (
	// MaxWorkRooms bounds the rooms of one workStatus answer (Truncated beyond).
	MaxWorkRooms = 200
	// maxWorkRows bounds each table read of one answer.
	maxWorkRows = 20000
)

// ActiveAgent is an agent active in a room within ActiveWindow.
type ActiveAgent struct {
	AgentID, Handle string
	LastActivity    time.Time
	LastMessageAt   time.Time // zero when it posted no message
	LastMessage     string
	MessagesToday   uint64
	CostToday       decimal.Decimal
	Currency        string
	// Stop is the policy's stop on the agent in the room (work.StopLoop), when its
	// latest stop there came after its latest message; zero otherwise.
	Stop work.Stop
}

// RoomWork is the work status of one room.
type RoomWork struct {
	RoomID       string
	Tasks        []work.Task
	Attention    []work.Attention
	Agents       []ActiveAgent
	LastActivity time.Time
}

// WorkQuery asks for the work status of one room of OrgID, or of its rooms with work.
type WorkQuery struct {
	OrgID, RoomID string
	Now           time.Time     // zero: the Querier's clock (time.Now)
	StuckAfter    time.Duration // zero: work.DefaultStuckAfter
}

// WorkStatus is the answer to a WorkQuery.
type WorkStatus struct {
	Rooms     []RoomWork
	Truncated bool
	AsOf      time.Time
}

// normalize checks q and applies its defaults; now is the Now of a query without one.
func (q *WorkQuery) normalize(now time.Time) error {
	errs := checkOrg(nil, q.OrgID)
	if len(q.RoomID) > 256 {
		errs = append(errs, fieldErr("room_id", "longer than 256 bytes"))
	}
	if q.StuckAfter < 0 {
		errs = append(errs, fieldErr("stuck_after", "must not be negative"))
	}
	if q.Now.IsZero() {
		q.Now = now
	}
	q.Now = q.Now.UTC()
	if q.StuckAfter == 0 {
		q.StuckAfter = work.DefaultStuckAfter
	}
	return errors.Join(errs...)
}

// workSQL holds the SQL of the work-status reads, one place for all of them. Filters
// on columns outside a table's sorting key are evaluated after FINAL (WHERE, not
// PREWHERE), except time bounds on tables whose version grows with time, which pick
// the same latest row before or after.
type workSQL struct{ db string }

// activeRooms: rooms with activity in the window, latest first.
func (s workSQL) activeRooms() string {
	return "SELECT room_id, max(time) AS last FROM " + s.db + ".room_activity" +
		" WHERE org_id = ? AND time >= ? GROUP BY room_id ORDER BY last DESC, room_id LIMIT ?"
}

// attentionRooms: rooms with requests for attention in the window, latest first.
func (s workSQL) attentionRooms() string {
	return "SELECT room_id, max(time) AS last FROM " + s.db + ".attention" +
		" WHERE org_id = ? AND time >= ? GROUP BY room_id ORDER BY last DESC, room_id LIMIT ?"
}

func (s workSQL) openTaskRooms() string {
	return "SELECT DISTINCT room_id FROM " + s.db + ".tasks FINAL WHERE org_id = ? AND deleted = 0 AND room_id != '' AND NOT has(?, " + work.StatusKeySQL + ") LIMIT ?"
}

func (s workSQL) tasks() string {
	return "SELECT task_id, room_id, title, status, assignee_id, created_at, updated_at, updated_ms" +
		" FROM " + s.db + ".tasks FINAL WHERE org_id = ? AND room_id IN (SELECT id FROM " + idsTable + ")" +
		" AND deleted = 0 AND (NOT has(?, " + work.StatusKeySQL + ") OR updated_at >= ?) ORDER BY updated_at DESC, task_id LIMIT ?"
}

// activity reads every actor's latest event, message and task update in the rooms,
// newest first (a cut keeps the newest).
func (s workSQL) activity() string {
	return "SELECT room_id, actor_id, toString(kind), toString(actor_type), actor_handle, time, time_ms, text" +
		" FROM " + s.db + ".room_activity FINAL WHERE org_id = ? AND room_id IN (SELECT id FROM " + idsTable + ")" +
		" ORDER BY time DESC, time_ms DESC LIMIT ?"
}

func (s workSQL) attention() string {
	return "SELECT event_id, room_id, asker_id, asker_handle, mentions, question, time, time_ms" +
		" FROM " + s.db + ".attention FINAL WHERE org_id = ? AND room_id IN (SELECT id FROM " + idsTable + ") AND time >= ?" +
		" ORDER BY time DESC, time_ms DESC, event_id DESC LIMIT ?"
}

// messagesToday counts message.created per room and actor since the start of the
// day; uniqExact over the replacing key counts a replay once without FINAL.
func (s workSQL) messagesToday() string {
	return "SELECT room_id, actor_id, uniqExact(id, time) FROM " + s.db + ".events" +
		" WHERE org_id = ? AND time >= ? AND type = 'message.created' AND room_id IN (SELECT id FROM " + idsTable + ")" +
		" GROUP BY room_id, actor_id"
}

// stops reads the denied send_message decisions of the window that may be stops
// (work.StopSQL; work.StopOf decides), newest first, by the events table's primary key.
func (s workSQL) stops() string {
	return "SELECT room_id, actor_id, source, time, time_ms, data FROM " + s.db + ".events" +
		" WHERE org_id = ? AND time >= ? AND room_id IN (SELECT id FROM " + idsTable + ") AND " + work.StopSQL +
		" ORDER BY time DESC, time_ms DESC LIMIT ?"
}

func (s workSQL) costToday() string {
	return "SELECT room_id, agent_id, currency, sum(cost) AS total_cost, sum(events) AS total_events FROM " + s.db + ".usage_hourly FINAL" +
		" WHERE org_id = ? AND hour >= ? AND room_id IN (SELECT id FROM " + idsTable + ")" +
		" GROUP BY room_id, agent_id, currency HAVING total_events > 0"
}

// WorkStatus reads the work status of q.RoomID, or of the organization's rooms with
// work (at most MaxWorkRooms, latest activity first, then rooms with open tasks).
func (qr *Querier) WorkStatus(ctx context.Context, q WorkQuery) (WorkStatus, error) {
	if err := q.normalize(qr.now()); err != nil {
		return WorkStatus{}, err
	}
	out := WorkStatus{AsOf: q.Now}
	rooms := []string{q.RoomID}
	last := map[string]time.Time{}
	if q.RoomID == "" {
		var err error
		rooms, last, out.Truncated, err = qr.roomsWithWork(ctx, q)
		if err != nil {
			return WorkStatus{}, err
		}
	}
	byRoom, cut, err := qr.roomWork(ctx, q, rooms)
	if err != nil {
		return WorkStatus{}, err
	}
	out.Truncated = out.Truncated || cut
	for _, id := range rooms {
		w := byRoom[id]
		if q.RoomID == "" && len(w.Tasks)+len(w.Attention)+len(w.Agents) == 0 {
			continue
		}
		if w.LastActivity.IsZero() {
			w.LastActivity = last[id]
		}
		out.Rooms = append(out.Rooms, *w)
	}
	return out, nil
}

// roomsWithWork lists the rooms with activity in the window (latest first), then
// those with unfinished tasks, then those with requests for attention in
// work.AttentionWindow, at most MaxWorkRooms (truncated beyond).
func (qr *Querier) roomsWithWork(ctx context.Context, q WorkQuery) ([]string, map[string]time.Time, bool, error) {
	s := workSQL{qr.db}
	last := map[string]time.Time{}
	var rooms []string
	add := func(id string, t time.Time) {
		if _, ok := last[id]; !ok {
			rooms, last[id] = append(rooms, id), t
		}
	}
	for _, r := range []struct {
		sql, what string
		args      []any
		timed     bool
	}{
		{s.activeRooms(), "the active rooms", []any{q.OrgID, q.Now.Add(-work.ActiveWindow), MaxWorkRooms + 1}, true},
		{s.openTaskRooms(), "the rooms with open tasks", []any{q.OrgID, work.FinishedStatuses, MaxWorkRooms + 1}, false},
		{s.attentionRooms(), "the rooms with requests for attention", []any{q.OrgID, q.Now.Add(-work.AttentionWindow), MaxWorkRooms + 1}, true},
	} {
		rows, err := qr.conn.Query(ctx, r.sql, r.args...)
		if err != nil {
			return nil, nil, false, queryErr(ctx, err, fmt.Sprintf("cannot list %s of org %q in %s", r.what, q.OrgID, qr.db))
		}
		var ids []string
		var times []time.Time
		for rows.Next() {
			var id string
			var t time.Time
			dest := []any{&id}
			if r.timed {
				dest = append(dest, &t)
			}
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return nil, nil, false, fmt.Errorf("cannot read %s of org %q: %w", r.what, q.OrgID, err)
			}
			ids, times = append(ids, id), append(times, t.UTC())
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, false, queryErr(ctx, err, fmt.Sprintf("cannot read %s of org %q", r.what, q.OrgID))
		}
		if !r.timed {
			slices.Sort(ids)
		}
		for i, id := range ids {
			add(id, times[i])
		}
	}
	truncated := len(rooms) > MaxWorkRooms
	if truncated {
		rooms = rooms[:MaxWorkRooms]
	}
	return rooms, last, truncated, nil
}

// roomWork reads tasks, attention and active agents of the given rooms; truncated
// says a table read held more than maxWorkRows rows (the newest are kept).
func (qr *Querier) roomWork(ctx context.Context, q WorkQuery, rooms []string) (map[string]*RoomWork, bool, error) {
	s := workSQL{qr.db}
	byRoom := make(map[string]*RoomWork, len(rooms))
	for _, id := range rooms {
		byRoom[id] = &RoomWork{RoomID: id, Tasks: []work.Task{}, Attention: []work.Attention{}, Agents: []ActiveAgent{}}
	}
	if len(rooms) == 0 {
		return byRoom, false, nil
	}
	ictx, err := withIDs(ctx, uniqueIDs(rooms))
	if err != nil {
		return nil, false, fmt.Errorf("cannot build the room table: %w", err)
	}
	what := func(verb string) string { return fmt.Sprintf("cannot %s of org %q in %s", verb, q.OrgID, qr.db) }

	// Activity first: it decides the tasks' last activity and the requests' closing.
	type act struct {
		any, msg, task          time.Time
		actorType, handle, text string
	}
	acts := map[[2]string]*act{}
	truncated := false
	rows, err := qr.conn.Query(ictx, s.activity(), q.OrgID, maxWorkRows+1)
	if err != nil {
		return nil, false, queryErr(ctx, err, what("read room activity"))
	}
	for n := 0; rows.Next(); n++ {
		if n == maxWorkRows {
			truncated = true
			break
		}
		var room, actor, kind, actorType, handle, text string
		var t time.Time
		var ms uint16
		if err := rows.Scan(&room, &actor, &kind, &actorType, &handle, &t, &ms, &text); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("%s: %w", what("read room activity"), err)
		}
		k := [2]string{room, actor}
		a := acts[k]
		if a == nil {
			a = &act{}
			acts[k] = a
		}
		t = withMs(t, ms)
		switch kind {
		case "message":
			a.msg, a.text = t, text
			a.actorType, a.handle = actorType, handle
		case "task": // the actor was the assignee; its type is not known from this row
			a.task = t
		default:
			a.any = t
			a.actorType, a.handle = actorType, handle
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, queryErr(ctx, err, what("read room activity"))
	}

	rows, err = qr.conn.Query(ictx, s.tasks(), q.OrgID, work.FinishedStatuses, q.Now.Add(-work.ActiveWindow), maxWorkRows+1)
	if err != nil {
		return nil, false, queryErr(ctx, err, what("read tasks"))
	}
	for n := 0; rows.Next(); n++ {
		if n == maxWorkRows {
			truncated = true
			break
		}
		var t work.Task
		var ms uint16
		if err := rows.Scan(&t.ID, &t.RoomID, &t.Title, &t.Status, &t.AssigneeID, &t.CreatedAt, &t.UpdatedAt, &ms); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("%s: %w", what("read tasks"), err)
		}
		t.UpdatedAt = withMs(t.UpdatedAt, ms)
		if t.CreatedAt.Unix() <= 0 {
			t.CreatedAt = time.Time{}
		} else {
			t.CreatedAt = t.CreatedAt.UTC()
		}
		t.LastActivity = t.UpdatedAt
		if a := acts[[2]string{t.RoomID, t.AssigneeID}]; a != nil && a.any.After(t.LastActivity) {
			t.LastActivity = a.any
		}
		t.SetStuck(q.Now, q.StuckAfter)
		if w := byRoom[t.RoomID]; w != nil {
			w.Tasks = append(w.Tasks, t)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, queryErr(ctx, err, what("read tasks"))
	}

	since := q.Now.Add(-work.AttentionWindow)
	var asks []work.Attention
	rows, err = qr.conn.Query(ictx, s.attention(), q.OrgID, since, maxWorkRows+1)
	if err != nil {
		return nil, false, queryErr(ctx, err, what("read attention requests"))
	}
	for n := 0; rows.Next(); n++ {
		if n == maxWorkRows {
			truncated = true
			break
		}
		var a work.Attention
		var ms uint16
		if err := rows.Scan(&a.ID, &a.RoomID, &a.AskerID, &a.AskerHandle, &a.Mentions, &a.Question, &a.Since, &ms); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("%s: %w", what("read attention requests"), err)
		}
		a.Since = withMs(a.Since, ms)
		asks = append(asks, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, queryErr(ctx, err, what("read attention requests"))
	}
	var mentioned []string
	for _, a := range asks {
		mentioned = append(mentioned, a.Mentions...)
	}
	people, err := qr.kinds(ctx, q.OrgID, mentioned)
	if err != nil {
		return nil, false, err
	}
	personReplied := map[string]time.Time{} // room → the latest message of any person
	for k, x := range acts {
		if x.actorType == "user" && x.msg.After(personReplied[k[0]]) {
			personReplied[k[0]] = x.msg
		}
	}
	for _, a := range asks {
		a.Address(func(id string) bool { return people[id] == "user" })
		var replied time.Time
		if a.AddressedTo != "" {
			if x := acts[[2]string{a.RoomID, a.AddressedTo}]; x != nil {
				replied = x.msg
			}
		} else {
			replied = personReplied[a.RoomID]
		}
		var askerTask time.Time
		if x := acts[[2]string{a.RoomID, a.AskerID}]; x != nil {
			askerTask = x.task
		}
		if !a.Open(replied, askerTask) {
			continue
		}
		byRoom[a.RoomID].Attention = append(byRoom[a.RoomID].Attention, a)
	}

	today := q.Now.Truncate(24 * time.Hour)
	for k, a := range acts {
		w := byRoom[k[0]]
		if w == nil {
			continue
		}
		if a.any.After(w.LastActivity) {
			w.LastActivity = a.any
		}
		if a.actorType != "agent" || a.any.Before(q.Now.Add(-work.ActiveWindow)) {
			continue
		}
		w.Agents = append(w.Agents, ActiveAgent{AgentID: k[1], Handle: a.handle, LastActivity: a.any, LastMessageAt: a.msg,
			LastMessage: a.text, CostToday: decimal.Zero})
	}
	stops, cut, err := qr.stops(ictx, q)
	if err != nil {
		return nil, false, queryErr(ctx, err, what("read the policy's stops"))
	}
	truncated = truncated || cut
	for k, st := range stops {
		w := byRoom[k[0]]
		var last time.Time
		if a := acts[k]; a != nil {
			last = a.msg
		}
		if w == nil || !st.Holds(last) {
			continue
		}
		i := slices.IndexFunc(w.Agents, func(a ActiveAgent) bool { return a.AgentID == k[1] })
		if i < 0 {
			// Stopped before it did anything else in the window that counts as activity.
			w.Agents = append(w.Agents, ActiveAgent{AgentID: k[1], LastActivity: st.At, CostToday: decimal.Zero})
			i = len(w.Agents) - 1
		}
		w.Agents[i].Stop = st
	}
	agentIdx := map[[2]string]*ActiveAgent{}
	for _, w := range byRoom {
		slices.SortFunc(w.Agents, func(x, y ActiveAgent) int { return y.LastActivity.Compare(x.LastActivity) })
		for i := range w.Agents {
			agentIdx[[2]string{w.RoomID, w.Agents[i].AgentID}] = &w.Agents[i]
		}
	}
	if len(agentIdx) > 0 {
		rows, err = qr.conn.Query(ictx, s.messagesToday(), q.OrgID, today)
		if err != nil {
			return nil, false, queryErr(ctx, err, what("count today's messages"))
		}
		for rows.Next() {
			var room, actor string
			var n uint64
			if err := rows.Scan(&room, &actor, &n); err != nil {
				rows.Close()
				return nil, false, fmt.Errorf("%s: %w", what("count today's messages"), err)
			}
			if a := agentIdx[[2]string{room, actor}]; a != nil {
				a.MessagesToday = n
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, false, queryErr(ctx, err, what("count today's messages"))
		}
		rows, err = qr.conn.Query(ictx, s.costToday(), q.OrgID, today)
		if err != nil {
			return nil, false, queryErr(ctx, err, what("sum today's cost"))
		}
		for rows.Next() {
			var room, agent, currency string
			var cost decimal.Decimal
			var events uint64
			if err := rows.Scan(&room, &agent, &currency, &cost, &events); err != nil {
				rows.Close()
				return nil, false, fmt.Errorf("%s: %w", what("sum today's cost"), err)
			}
			// Amounts of two currencies are never added: an agent charged in two (a
			// catalog that changed its currency today) shows the larger amount.
			if a := agentIdx[[2]string{room, agent}]; a != nil && (a.Currency == "" || cost.GreaterThan(a.CostToday)) {
				a.CostToday, a.Currency = cost, currency
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, false, queryErr(ctx, err, what("sum today's cost"))
		}
	}
	return byRoom, truncated, nil
}

// stops returns the latest stop of each agent in the rooms of ictx within
// work.ActiveWindow, from bandplane's own policy.decided events, and whether the read
// was cut at maxWorkRows (the newest are kept).
func (qr *Querier) stops(ictx context.Context, q WorkQuery) (map[[2]string]work.Stop, bool, error) {
	rows, err := qr.conn.Query(ictx, workSQL{qr.db}.stops(), q.OrgID, q.Now.Add(-work.ActiveWindow), maxWorkRows+1)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	out := map[[2]string]work.Stop{}
	for n := 0; rows.Next(); n++ {
		if n == maxWorkRows {
			return out, true, nil
		}
		var room, agent, source, data string
		var t time.Time
		var ms uint16
		if err := rows.Scan(&room, &agent, &source, &t, &ms, &data); err != nil {
			return nil, false, err
		}
		k := [2]string{room, agent}
		if _, seen := out[k]; seen || !schema.OwnSource(source) {
			continue
		}
		if st, ok := work.StopOf(withMs(t, ms), []byte(data)); ok {
			out[k] = st
		}
	}
	return out, false, rows.Err()
}

// kinds returns the directory kind ("agent" or "user") of each id of orgID it knows.
func (qr *Querier) kinds(ctx context.Context, orgID string, ids []string) (map[string]string, error) {
	ids = uniqueIDs(ids)
	out := map[string]string{}
	for len(ids) > 0 {
		n := min(len(ids), MaxNames)
		names, err := qr.Names(ctx, orgID, ids[:n])
		if err != nil {
			return nil, err
		}
		for id, p := range names {
			out[id] = p.Kind
		}
		ids = ids[n:]
	}
	return out, nil
}

func withMs(t time.Time, ms uint16) time.Time {
	return t.UTC().Add(time.Duration(ms) * time.Millisecond)
}

// OrgTask is a task of an organization.
type OrgTask struct {
	OrgID string
	Task  work.Task
}

// SeedWindow is how recently a task in progress must have been updated for the live
// hub to follow it from the start (an older one has long been stuck).
const SeedWindow = 7 * 24 * time.Hour

func (s workSQL) inProgress() string {
	return "SELECT org_id, task_id, room_id, title, status, assignee_id, created_at, updated_at, updated_ms FROM " + s.db + ".tasks FINAL" +
		" WHERE deleted = 0 AND has(?, " + work.StatusKeySQL + ") AND updated_at >= ? ORDER BY updated_at DESC LIMIT ?"
}

func (s workSQL) assigneeActivity() string {
	return "SELECT org_id, room_id, actor_id, max(toUInt64(time) * 1000 + time_ms) FROM " + s.db + ".room_activity" +
		" WHERE kind = 'event' AND (org_id, room_id, actor_id) IN (SELECT org, room, actor FROM " + partiesTable + ")" +
		" GROUP BY org_id, room_id, actor_id"
}

// partiesTable is the external table of (org, room, actor) triples.
const partiesTable = "_bandplane_parties"

// TasksInProgress lists up to limit tasks in progress of every organization updated
// within SeedWindow, latest first, each
// with its last activity (its assignee's latest event in the room, or its update). It
// is not tenant-scoped: serve seeds its live hub with it, nothing answers a client
// with it.
func (qr *Querier) TasksInProgress(ctx context.Context, now time.Time, stuckAfter time.Duration, limit int) ([]OrgTask, error) {
	s := workSQL{qr.db}
	rows, err := qr.conn.Query(ctx, s.inProgress(), work.InProgressStatuses, now.Add(-SeedWindow).UTC(), limit)
	if err != nil {
		return nil, queryErr(ctx, err, "cannot list the tasks in progress in "+qr.db+".tasks")
	}
	var out []OrgTask
	for rows.Next() {
		var o OrgTask
		t := &o.Task
		var ms uint16
		if err := rows.Scan(&o.OrgID, &t.ID, &t.RoomID, &t.Title, &t.Status, &t.AssigneeID, &t.CreatedAt, &t.UpdatedAt, &ms); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cannot read the tasks in progress: %w", err)
		}
		t.UpdatedAt = withMs(t.UpdatedAt, ms)
		t.CreatedAt = t.CreatedAt.UTC()
		if t.CreatedAt.Unix() <= 0 {
			t.CreatedAt = time.Time{}
		}
		t.LastActivity = t.UpdatedAt
		out = append(out, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, "cannot read the tasks in progress")
	}
	if len(out) > 0 {
		tbl, err := ext.NewTable(partiesTable, ext.Column("org", "String"), ext.Column("room", "String"), ext.Column("actor", "String"))
		if err != nil {
			return nil, err
		}
		for _, o := range out {
			if err := tbl.Append(o.OrgID, o.Task.RoomID, o.Task.AssigneeID); err != nil {
				return nil, fmt.Errorf("cannot build the parties table: %w", err)
			}
		}
		last := map[[3]string]time.Time{}
		rows, err := qr.conn.Query(chdb.WithExternalTable(ctx, tbl), s.assigneeActivity())
		if err != nil {
			return nil, queryErr(ctx, err, "cannot read the assignees' activity in "+qr.db+".room_activity")
		}
		for rows.Next() {
			var org, room, actor string
			var msec uint64
			if err := rows.Scan(&org, &room, &actor, &msec); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cannot read the assignees' activity: %w", err)
			}
			last[[3]string{org, room, actor}] = time.UnixMilli(int64(msec)).UTC()
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, queryErr(ctx, err, "cannot read the assignees' activity")
		}
		for i := range out {
			t := &out[i].Task
			if a := last[[3]string{out[i].OrgID, t.RoomID, t.AssigneeID}]; a.After(t.LastActivity) {
				t.LastActivity = a
			}
		}
	}
	for i := range out {
		out[i].Task.SetStuck(now.UTC(), stuckAfter)
	}
	return out, nil
}
