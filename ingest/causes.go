package ingest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/cause"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/store"
)

// Causes is what the consumer needs of ClickHouse to keep events' links across
// restarts and late triggers (schema/store).
type Causes interface {
	RecentCauses(ctx context.Context, since time.Time, limit int) ([]store.CauseRow, error)
	CausesOfEvents(ctx context.Context, ids []string, from, to time.Time) ([]store.CauseRow, error)
	UsageOfEvents(ctx context.Context, ids []string, from, to time.Time) ([]store.UsageRow, error)
	InsertUsage(ctx context.Context, rows []store.UsageRow) error
	InsertCauses(ctx context.Context, rows []store.CauseRow) error
}

// NewTracker is the cause tracker of ingest: the directory tells each party's
// organization and accountable person.
func NewTracker(dir *directory.Directory) *cause.Tracker {
	return cause.New(func(p schema.Party) (string, string) {
		switch p.Type {
		case schema.ActorAgent:
			if a, ok := dir.Agent(p.ID); ok {
				return a.OrgID, a.OwnerID
			}
		case schema.ActorUser:
			if pp, ok := dir.Person(p.ID); ok {
				return pp.OrgID, p.ID
			}
			return "", p.ID
		}
		return "", ""
	}, 0, 0)
}

// WarmTracker gives t what ingest stored within the horizon before now: the events
// still pending on an explicit trigger, then the messages, so that a restarted
// consumer infers the triggers of the executions they started and resolves the
// pending links whose trigger was stored before it stopped. It returns the messages
// read and those resolutions (relink stores them).
func WarmTracker(ctx context.Context, t *cause.Tracker, c Causes, now time.Time) (int, []cause.Resolution, error) {
	rows, err := c.RecentCauses(ctx, now.Add(-cause.DefaultHorizon), cause.DefaultMaxMessages)
	if err != nil {
		return 0, nil, err
	}
	for i := range rows {
		if r := &rows[i]; r.Chain.Link == cause.SourcePending {
			t.Await(cause.Pending{EventID: r.EventID, OrgID: r.OrgID, Room: r.RoomID, Agent: r.ActorID, ExecutionID: r.ExecutionID,
				Trigger: r.Chain.TriggerID, Time: r.Time})
		}
	}
	var res []cause.Resolution
	messages := 0
	for i := range rows {
		if r := &rows[i]; r.MessageID != "" {
			messages++
			res = append(res, t.Remember(cause.Message{OrgID: r.OrgID, Room: r.RoomID, EventID: r.EventID, MessageID: r.MessageID, Time: r.Time, Mentions: r.Mentions, Link: linkOf(r.Chain)})...)
		}
	}
	return messages, res, nil
}

// ChainOf is a link as stored.
func ChainOf(l cause.Link) store.Chain {
	return store.Chain{TriggerID: l.Trigger, TriggerEventID: l.TriggerEvent, InitiatorID: l.Initiator.ID,
		InitiatorType: string(l.Initiator.Type), InitiatorOrg: l.InitiatorOrg, InitiatorOwner: l.InitiatorOwner,
		Depth: uint16(min(l.Depth, 1<<16-1)), Link: l.Source()}
}

func linkOf(c store.Chain) cause.Link {
	return cause.Link{Trigger: c.TriggerID, TriggerEvent: c.TriggerEventID,
		Initiator:    schema.Party{ID: c.InitiatorID, Type: schema.ActorType(c.InitiatorType)},
		InitiatorOrg: c.InitiatorOrg, InitiatorOwner: c.InitiatorOwner, Depth: int(c.Depth),
		Explicit: c.Link == cause.SourceExplicit || c.Link == cause.SourcePending, Pending: c.Link == cause.SourcePending}
}

// causeRow is the stored link of an event.
func causeRow(ev *schema.Event, o cause.Observation) store.CauseRow {
	r := store.CauseRow{EventID: ev.ID, Time: ev.Time, Type: ev.Type, OrgID: ev.OrgID, RoomID: ev.RoomID,
		ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type), ExecutionID: ev.ExecutionID, Chain: ChainOf(o.Link)}
	if o.Message != nil {
		r.MessageID, r.Mentions = o.Message.MessageID, o.Message.Mentions
	}
	return r
}

// relinkChunk is the most events relink reads at once: their ids are bound into the
// query text, which ClickHouse bounds (max_query_size, 256 KiB; an id is at most
// schema.MaxIDBytes).
const relinkChunk = 256

// relink rewrites the stored usage and cause rows of events whose pending link a late
// trigger resolved, at higher versions, and returns the hours of usage it rewrote.
// The resolutions of events in the same batch were applied before it was stored.
// Each row is matched by organization and event id, the key of the trail: an event id
// that another organization also uses is not touched. The rows are read in chunks of
// nearby times and written back in one insert per table.
func relink(ctx context.Context, c Causes, res []cause.Resolution, now time.Time) ([]store.HourKey, error) {
	res = slices.Clone(res)
	slices.SortFunc(res, func(a, b cause.Resolution) int { return a.Time.Compare(b.Time) })
	type key struct{ org, id string }
	by := make(map[key]cause.Link, len(res))
	for _, r := range res {
		by[key{r.OrgID, r.EventID}] = r.Link
	}
	v := uint64(now.UnixNano())
	var causes []store.CauseRow
	var usage []store.UsageRow
	for lo := 0; lo < len(res); lo += relinkChunk {
		chunk := res[lo:min(lo+relinkChunk, len(res))]
		ids := make([]string, 0, len(chunk))
		for _, r := range chunk {
			ids = append(ids, r.EventID)
		}
		from, to := chunk[0].Time.Add(-time.Second), chunk[len(chunk)-1].Time.Add(time.Second)
		cs, err := c.CausesOfEvents(ctx, ids, from, to)
		if err != nil {
			return nil, fmt.Errorf("cannot relink %d events a late trigger resolved: %w", len(res), err)
		}
		for _, r := range cs {
			if l, ok := by[key{r.OrgID, r.EventID}]; ok {
				r.Chain, r.Version = ChainOf(l), max(v, r.Version+1)
				causes = append(causes, r)
			}
		}
		us, err := c.UsageOfEvents(ctx, ids, from, to)
		if err != nil {
			return nil, fmt.Errorf("cannot relink %d events a late trigger resolved: %w", len(res), err)
		}
		for _, r := range us {
			if l, ok := by[key{r.OrgID, r.EventID}]; ok {
				r.Chain, r.Version = ChainOf(l), max(v, r.Version+1)
				usage = append(usage, r)
			}
		}
	}
	if err := c.InsertCauses(ctx, causes); err != nil {
		return nil, fmt.Errorf("cannot relink %d events a late trigger resolved: %w", len(causes), err)
	}
	if err := c.InsertUsage(ctx, usage); err != nil {
		return nil, fmt.Errorf("cannot relink %d usage rows a late trigger resolved: %w", len(usage), err)
	}
	return usageHours(usage), nil
}
