package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bandplane/bandplane/schema/work"
)

// Directory listings: the agents and rooms of an organization.

// Listing limits.
const (
	DefaultListLimit = 500
	MaxListLimit     = 2000
	// ToolWindow is how far back agents' tool calls are read: a call older than it
	// without a result is not listed as open.
	ToolWindow = 24 * time.Hour
	// MaxOpenToolCalls bounds the open tool calls listed per agent.
	MaxOpenToolCalls = 50
)

// listLimit checks a listing's organization and limit, and returns the limit to
// use (DefaultListLimit for 0).
func listLimit(org string, limit int) (int, error) {
	errs := checkOrg(nil, org)
	errs = checkLimit(errs, limit, MaxListLimit)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if limit == 0 {
		limit = DefaultListLimit
	}
	return limit, nil
}

// ToolCall is a tool call without a result yet.
type ToolCall struct {
	ID, ToolName, RoomID string
	CalledAt             time.Time
}

// Agent is one agent of the directory with how its tools are doing over ToolWindow.
type Agent struct {
	ID, Handle, Name, OwnerID, Model string
	Suspended                        bool
	UpdatedAt                        time.Time
	OpenToolCalls                    []ToolCall
	ToolResults, ToolErrors          uint64
}

// AgentQuery lists the agents of OrgID, by handle.
type AgentQuery struct {
	OrgID string
	Limit int // 0: DefaultListLimit
	Now   time.Time
}

type agentSQL struct{ db string }

// list reads the directory's latest row of each agent, then keeps the organization's:
// the filter on org_id comes after FINAL, since an agent's latest registration may
// have moved it.
func (s agentSQL) list() string {
	return "SELECT id, handle, name, owner_id, model, suspended, updated_at FROM " + s.db + ".directory FINAL" +
		" WHERE kind = 'agent' AND org_id = ? ORDER BY handle, id LIMIT ?"
}

// toolStats: results and errors per agent within the window.
func (s agentSQL) toolStats() string {
	return "SELECT agent_id, count() AS results, countIf(is_error = 1) AS errors FROM " + s.db + ".tool_calls FINAL" +
		" WHERE org_id = ? AND kind = 'result' AND time >= ? AND agent_id IN (SELECT id FROM " + idsTable + ") GROUP BY agent_id"
}

// openCalls: calls of the window whose (agent, call_id) has no result row. No FINAL:
// a replayed row changes neither any() nor min() nor max().
func (s agentSQL) openCalls() string {
	return "SELECT agent_id, call_id, any(room_id) AS room, any(tool_name) AS tool, min(toUInt64(time) * 1000 + time_ms) AS called_ms" +
		" FROM " + s.db + ".tool_calls WHERE org_id = ? AND time >= ? AND agent_id IN (SELECT id FROM " + idsTable + ")" +
		" GROUP BY agent_id, call_id HAVING max(kind = 'result') = 0" +
		" ORDER BY called_ms, agent_id, call_id LIMIT ?"
}

// Agents lists the organization's agents with their open tool calls and tool results.
func (qr *Querier) Agents(ctx context.Context, q AgentQuery) ([]Agent, error) {
	var err error
	if q.Limit, err = listLimit(q.OrgID, q.Limit); err != nil {
		return nil, err
	}
	if q.Now.IsZero() {
		q.Now = qr.now()
	}
	s := agentSQL{qr.db}
	what := func(verb string) string { return fmt.Sprintf("cannot %s of org %q in %s", verb, q.OrgID, qr.db) }
	rows, err := qr.conn.Query(ctx, s.list(), q.OrgID, q.Limit)
	if err != nil {
		return nil, queryErr(ctx, err, what("list the agents"))
	}
	out := []Agent{}
	idx := map[string]int{}
	for rows.Next() {
		var a Agent
		var susp uint8
		if err := rows.Scan(&a.ID, &a.Handle, &a.Name, &a.OwnerID, &a.Model, &susp, &a.UpdatedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("%s: %w", what("list the agents"), err)
		}
		a.Suspended, a.UpdatedAt, a.OpenToolCalls = susp == 1, a.UpdatedAt.UTC(), []ToolCall{}
		idx[a.ID] = len(out)
		out = append(out, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, what("list the agents"))
	}
	if len(out) == 0 {
		return out, nil
	}
	ids := make([]string, len(out))
	for i := range out {
		ids[i] = out[i].ID
	}
	ictx, err := withIDs(ctx, uniqueIDs(ids))
	if err != nil {
		return nil, fmt.Errorf("cannot build the agent table: %w", err)
	}
	since := q.Now.Add(-ToolWindow).UTC()
	rows, err = qr.conn.Query(ictx, s.toolStats(), q.OrgID, since)
	if err != nil {
		return nil, queryErr(ctx, err, what("count tool results"))
	}
	for rows.Next() {
		var id string
		var results, errs uint64
		if err := rows.Scan(&id, &results, &errs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("%s: %w", what("count tool results"), err)
		}
		if i, ok := idx[id]; ok {
			out[i].ToolResults, out[i].ToolErrors = results, errs
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, what("count tool results"))
	}
	rows, err = qr.conn.Query(ictx, s.openCalls(), q.OrgID, since, MaxOpenToolCalls*len(out))
	if err != nil {
		return nil, queryErr(ctx, err, what("list open tool calls"))
	}
	for rows.Next() {
		var c ToolCall
		var agent string
		var msec uint64
		if err := rows.Scan(&agent, &c.ID, &c.RoomID, &c.ToolName, &msec); err != nil {
			rows.Close()
			return nil, fmt.Errorf("%s: %w", what("list open tool calls"), err)
		}
		c.CalledAt = time.UnixMilli(int64(msec)).UTC()
		if i, ok := idx[agent]; ok && len(out[i].OpenToolCalls) < MaxOpenToolCalls {
			out[i].OpenToolCalls = append(out[i].OpenToolCalls, c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, what("list open tool calls"))
	}
	return out, nil
}

// Room is one room of an organization.
type Room struct {
	ID, Name      string
	Closed        bool
	LastActivity  time.Time // zero when nothing happened there that ingest kept
	OpenTasks     int
	StuckTasks    int
	OpenAttention int
}

// RoomQuery lists the rooms of OrgID, latest activity first.
type RoomQuery struct {
	OrgID      string
	Limit      int // 0: DefaultListLimit
	Now        time.Time
	StuckAfter time.Duration
}

type roomSQL struct{ db string }

// titles: each room's latest title and deletion.
func (s roomSQL) titles() string {
	return "SELECT room_id, toString(kind), title, version FROM " + s.db + ".rooms FINAL WHERE org_id = ?" +
		" AND room_id IN (SELECT id FROM " + idsTable + ")"
}

func (s roomSQL) all() string {
	return "SELECT room_id, max(last) AS latest FROM (" +
		"SELECT room_id, max(time) AS last FROM " + s.db + ".room_activity WHERE org_id = ? GROUP BY room_id" +
		" UNION ALL SELECT room_id, max(time) AS last FROM " + s.db + ".rooms WHERE org_id = ? AND kind = 'title' GROUP BY room_id" +
		") AS r GROUP BY room_id ORDER BY latest DESC, room_id LIMIT ?"
}

// RoomNames returns the latest title of each room of orgID among ids that has one.
func (qr *Querier) RoomNames(ctx context.Context, orgID string, ids []string) (map[string]string, error) {
	info, err := qr.roomInfo(ctx, orgID, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(info))
	for id, r := range info {
		if r.Name != "" {
			out[id] = r.Name
		}
	}
	return out, nil
}

func (qr *Querier) roomInfo(ctx context.Context, orgID string, ids []string) (map[string]Room, error) {
	if err := errors.Join(checkOrg(nil, orgID)...); err != nil {
		return nil, err
	}
	ids = uniqueIDs(ids)
	out := make(map[string]Room, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), MaxNames)
		ictx, err := withIDs(ctx, ids[:n])
		if err != nil {
			return nil, fmt.Errorf("cannot build the room table: %w", err)
		}
		rows, err := qr.conn.Query(ictx, roomSQL{qr.db}.titles(), orgID)
		if err != nil {
			return nil, queryErr(ctx, err, fmt.Sprintf("cannot read room names of org %q in %s.rooms", orgID, qr.db))
		}
		versions := map[string][2]uint64{} // title, deleted
		for rows.Next() {
			var id, kind, title string
			var v uint64
			if err := rows.Scan(&id, &kind, &title, &v); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cannot read room names of org %q: %w", orgID, err)
			}
			r, vs := out[id], versions[id]
			r.ID = id
			if kind == "title" {
				r.Name, vs[0] = title, v
			} else {
				vs[1] = v
			}
			r.Closed = vs[1] > vs[0]
			out[id], versions[id] = r, vs
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, queryErr(ctx, err, fmt.Sprintf("cannot read room names of org %q", orgID))
		}
		ids = ids[n:]
	}
	return out, nil
}

// Rooms lists the organization's rooms (those with a title or kept activity), latest
// activity first, with their open and stuck tasks and waiting requests.
func (qr *Querier) Rooms(ctx context.Context, q RoomQuery) ([]Room, error) {
	var err error
	if q.Limit, err = listLimit(q.OrgID, q.Limit); err != nil {
		return nil, err
	}
	rows, err := qr.conn.Query(ctx, roomSQL{qr.db}.all(), q.OrgID, q.OrgID, q.Limit)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot list the rooms of org %q in %s", q.OrgID, qr.db))
	}
	var ids []string
	last := map[string]time.Time{}
	for rows.Next() {
		var id string
		var t time.Time
		if err := rows.Scan(&id, &t); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cannot list the rooms of org %q: %w", q.OrgID, err)
		}
		ids, last[id] = append(ids, id), t.UTC()
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot list the rooms of org %q", q.OrgID))
	}
	info, err := qr.roomInfo(ctx, q.OrgID, ids)
	if err != nil {
		return nil, err
	}
	wq := WorkQuery{OrgID: q.OrgID, Now: q.Now, StuckAfter: q.StuckAfter}
	if err := wq.normalize(qr.now()); err != nil {
		return nil, err
	}
	out := make([]Room, 0, len(ids))
	for start := 0; start < len(ids); start += MaxWorkRooms {
		chunk := ids[start:min(start+MaxWorkRooms, len(ids))]
		byRoom, _, err := qr.roomWork(ctx, wq, chunk)
		if err != nil {
			return nil, err
		}
		for _, id := range chunk {
			r := info[id]
			r.ID = id
			w := byRoom[id]
			r.LastActivity = last[id]
			if w.LastActivity.After(r.LastActivity) {
				r.LastActivity = w.LastActivity
			}
			for _, t := range w.Tasks {
				if !work.Finished(t.Status) {
					r.OpenTasks++
				}
				if t.Stuck {
					r.StuckTasks++
				}
			}
			r.OpenAttention = len(w.Attention)
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b Room) int { return b.LastActivity.Compare(a.LastActivity) })
	return out, nil
}
