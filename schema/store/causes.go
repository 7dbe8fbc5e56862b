package store

import (
	"context"
	"fmt"
	"time"
)

// CauseRow is one row of causes (migration 009): an event's link.
type CauseRow struct {
	EventID             string
	Time                time.Time
	Type, OrgID, RoomID string
	ActorID, ActorType  string
	ExecutionID         string
	MessageID           string   // a message's platform id
	Mentions            []string // the agents a message mentions
	Chain               Chain
	Version             uint64
}

const causeCols = "event_id, time, time_ms, type, org_id, room_id, actor_id, actor_type, execution_id, message_id, mentions, " +
	"trigger_id, trigger_event_id, initiator_id, initiator_type, initiator_org, initiator_owner, depth, link, version"

// InsertCauses writes events' links (ingest, and a late trigger's rewrite at a higher
// version), one INSERT per block of at most MaxPartitionsPerBlock days. A row of it
// goes with nearly every event, so it is appended column by column (sendColumns).
func (s *Store) InsertCauses(ctx context.Context, rows []CauseRow) error {
	return byDay(rows, func(r *CauseRow) time.Time { return r.Time }, func(block []CauseRow) error { return s.insertCauseBlock(ctx, block) })
}

func (s *Store) insertCauseBlock(ctx context.Context, rows []CauseRow) error {
	n := len(rows)
	var (
		id, typ, org, room, actor, actorType, exec, msg = strs(n), strs(n), strs(n), strs(n), strs(n), strs(n), strs(n), strs(n)
		trigger, triggerEvent, initiator, initiatorType = strs(n), strs(n), strs(n), strs(n)
		initiatorOrg, initiatorOwner, link              = strs(n), strs(n), strs(n)
		times                                           = make([]time.Time, n)
		millis, depth                                   = make([]uint16, n), make([]uint16, n)
		mentions                                        = make([][]string, n)
		version                                         = make([]uint64, n)
	)
	for i := range rows {
		r, c := &rows[i], &rows[i].Chain
		id[i], times[i], millis[i], typ[i], org[i], room[i] = r.EventID, r.Time, ms(r.Time), r.Type, r.OrgID, r.RoomID
		actor[i], actorType[i], exec[i], msg[i], mentions[i] = r.ActorID, r.ActorType, r.ExecutionID, r.MessageID, r.Mentions
		if mentions[i] == nil {
			mentions[i] = []string{}
		}
		trigger[i], triggerEvent[i], initiator[i], initiatorType[i] = c.TriggerID, c.TriggerEventID, c.InitiatorID, c.InitiatorType
		initiatorOrg[i], initiatorOwner[i], depth[i], link[i], version[i] = c.InitiatorOrg, c.InitiatorOwner, c.Depth, c.Link, r.Version
	}
	return s.sendColumns(ctx, "causes", causeCols, n, id, times, millis, typ, org, room, actor, actorType, exec, msg, mentions,
		trigger, triggerEvent, initiator, initiatorType, initiatorOrg, initiatorOwner, depth, link, version)
}

// RecentCauses reads the links of the messages stored since the given time, and of
// the events still pending on a trigger, oldest first: what the consumer's tracker
// knew before it started. It reads FINAL, so that a row a late trigger rewrote is read
// once, as rewritten.
func (s *Store) RecentCauses(ctx context.Context, since time.Time, limit int) ([]CauseRow, error) {
	return s.causes(ctx, "SELECT "+causeCols+" FROM "+s.db+".causes FINAL WHERE time >= ? AND (message_id != '' OR link = 'pending') ORDER BY time, time_ms, event_id LIMIT ?",
		since.UTC(), uint64(max(limit, 0)))
}

func (s *Store) causes(ctx context.Context, q string, args ...any) ([]CauseRow, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.causes: %w", s.db, err)
	}
	defer rows.Close()
	var out []CauseRow
	for rows.Next() {
		var r CauseRow
		var tms uint16
		c := &r.Chain
		if err := rows.Scan(&r.EventID, &r.Time, &tms, &r.Type, &r.OrgID, &r.RoomID, &r.ActorID, &r.ActorType, &r.ExecutionID, &r.MessageID, &r.Mentions,
			&c.TriggerID, &c.TriggerEventID, &c.InitiatorID, &c.InitiatorType, &c.InitiatorOrg, &c.InitiatorOwner, &c.Depth, &c.Link, &r.Version); err != nil {
			return nil, fmt.Errorf("cannot read %s.causes: %w", s.db, err)
		}
		r.Time = r.Time.UTC().Add(time.Duration(tms) * time.Millisecond)
		out = append(out, r)
	}
	return out, rows.Err()
}

// CausesOfEvents reads the current cause rows of the given events (a late trigger's
// rewrite), within [from, to) of their times, in every organization that has such an
// event id. It reads without FINAL, which would merge every row of the range, and
// keeps the newest version of each row itself, as FINAL would: the cost is the
// events asked for, not the range.
func (s *Store) CausesOfEvents(ctx context.Context, ids []string, from, to time.Time) ([]CauseRow, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.causes(ctx, "SELECT "+causeCols+" FROM "+s.db+".causes WHERE time >= ? AND time < ? AND has(?, event_id)",
		from.UTC(), to.UTC(), ids)
	if err != nil {
		return nil, err
	}
	return newest(rows, func(r *CauseRow) (rowKey, uint64) { return rowKey{r.OrgID, r.Time.Unix(), r.EventID}, r.Version }), nil
}

// UsageOfEvents reads the current usage facts of the given events (a late trigger's
// rewrite), within [from, to) of their times, as CausesOfEvents does.
func (s *Store) UsageOfEvents(ctx context.Context, ids []string, from, to time.Time) ([]UsageRow, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.conn.Query(ctx, "SELECT "+usageReadCols+" FROM "+s.db+".usage WHERE time >= ? AND time < ? AND has(?, event_id)",
		from.UTC(), to.UTC(), ids)
	if err != nil {
		return nil, fmt.Errorf("cannot read the usage of %d events from %s.usage: %w", len(ids), s.db, err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		r, err := scanUsage(rows)
		if err != nil {
			return nil, fmt.Errorf("cannot read %s.usage: %w", s.db, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.usage: %w", s.db, err)
	}
	return newest(out, func(r *UsageRow) (rowKey, uint64) { return rowKey{r.OrgID, r.Time.Unix(), r.EventID}, r.Version }), nil
}

// rowKey is a row's replacing key: its organization, second and event id.
type rowKey struct {
	org string
	sec int64
	id  string
}

// newest keeps the highest version of each row of rows, as a ReplacingMergeTree's
// FINAL does (of equal versions, either), in the order first read.
func newest[T any](rows []T, key func(*T) (rowKey, uint64)) []T {
	at := make(map[rowKey]int, len(rows))
	out := rows[:0:0]
	for i := range rows {
		k, v := key(&rows[i])
		if j, ok := at[k]; ok {
			if _, w := key(&out[j]); v >= w {
				out[j] = rows[i]
			}
			continue
		}
		at[k] = len(out)
		out = append(out, rows[i])
	}
	return out
}
