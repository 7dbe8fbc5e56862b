package ingest

import (
	"fmt"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/cause"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Unknown is the model of usage whose model nobody reported or registered.
const Unknown = "unknown"

// Enrich fills the organization from dir when the event has none, and returns the
// accountable person: an agent's owner, or the person who acted.
func Enrich(ev *schema.Event, dir *directory.Directory) (owner string) {
	p := party(ev)
	switch p.Type {
	case schema.ActorAgent:
		if a, ok := dir.Agent(p.ID); ok {
			owner = a.OwnerID
			if ev.OrgID == "" {
				ev.OrgID = a.OrgID
			}
		}
	case schema.ActorUser:
		owner = p.ID
		if pp, ok := dir.Person(p.ID); ok && ev.OrgID == "" {
			ev.OrgID = pp.OrgID
		}
	}
	return owner
}

// UsageRow builds the priced usage fact of a usage.reported event. The model is the
// event's, else the agent's registered one, else Unknown (then the row is unpriced).
func UsageRow(ev *schema.Event, owner string, dir *directory.Directory, cat *pricing.Catalog) (store.UsageRow, error) {
	var u schema.UsageData
	if err := schema.DecodeData(ev.Data, &u); err != nil {
		return store.UsageRow{}, fmt.Errorf("cannot decode usage: %w", err)
	}
	model := u.Model
	if model == "" {
		if a, ok := dir.Agent(ev.Actor.ID); ok {
			model = a.Model
		}
	}
	if model == "" {
		model = Unknown
	}
	return PriceUsage(cat, store.UsageRow{
		EventID: ev.ID, Time: ev.Time, OrgID: ev.OrgID, OwnerID: owner, AgentID: ev.Actor.ID,
		RoomID: ev.RoomID, ExecutionID: ev.ExecutionID, Model: model,
		InputTokens: uint64(u.InputTokens), OutputTokens: uint64(u.OutputTokens),
		CacheReadTokens: uint64(u.CacheReadTokens), CacheWriteTokens: uint64(u.CacheWriteTokens),
	}, u.ReasoningTokens), nil
}

// PriceUsage sets the cost, currency, catalog version and a fresh version of a usage
// row, with the model's price in effect at the row's time (pricing.Catalog.CostAt).
// Ingest and reprice price the same way through it.
func PriceUsage(cat *pricing.Catalog, r store.UsageRow, reasoning *int64) store.UsageRow {
	if reasoning != nil {
		r.Reasoning = uint64(*reasoning)
	} else if r.Reasoning > 0 {
		v := int64(r.Reasoning)
		reasoning = &v
	}
	r.CostMicros, r.Priced = cat.CostAt(r.Model, r.Time, schema.UsageData{
		InputTokens: int64(r.InputTokens), OutputTokens: int64(r.OutputTokens),
		CacheReadTokens: int64(r.CacheReadTokens), CacheWriteTokens: int64(r.CacheWriteTokens),
		ReasoningTokens: reasoning,
	})
	r.Currency, r.CatalogVersion = cat.Currency(), cat.Version()
	r.Version = uint64(time.Now().UnixNano())
	return r
}

// EventRow builds the audit-trail row of an event read from partition at offset. Its
// IngestedAt is the time it was built; the consumer sets it again at each insert
// attempt, so that it is when the row was written.
func EventRow(ev *schema.Event, owner string, partition int32, offset int64) store.EventRow {
	r := store.EventRow{
		ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, RoomID: ev.RoomID,
		ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type), ActorHandle: ev.Actor.Handle, OwnerID: owner,
		ExecutionID: ev.ExecutionID, Source: ev.Source, SchemaVersion: uint16(ev.SchemaVersion),
		Data: string(ev.Data), IngestedAt: time.Now().UTC(), Partition: partition, Offset: offset,
	}
	if ev.Subject != nil {
		r.SubjectID, r.SubjectType, r.SubjectHandle = ev.Subject.ID, string(ev.Subject.Type), ev.Subject.Handle
	}
	return r
}

// Rows is what ingest stores for one event, without Kafka coordinates: directory events
// update dir first, then the event is enriched and priced, and linked to its cause by
// tr (nil: unlinked, and no cause row). The benchmarks build their raw rows with it.
func Rows(ev *schema.Event, dir *directory.Directory, cat *pricing.Catalog, tr *cause.Tracker) (store.EventRow, *store.UsageRow, *store.CauseRow, error) {
	if schema.IsDirectoryType(ev.Type) {
		if _, err := dir.Apply(ev); err != nil {
			return store.EventRow{}, nil, nil, err
		}
	}
	owner := Enrich(ev, dir)
	var u *store.UsageRow
	if ev.Type == schema.TypeUsageReported {
		row, err := UsageRow(ev, owner, dir, cat)
		if err != nil {
			return store.EventRow{}, nil, nil, err
		}
		u = &row
	}
	var c *store.CauseRow
	if tr != nil {
		if o, ok := tr.Observe(ev, nil); ok {
			row := causeRow(ev, o)
			c = &row
			if u != nil {
				u.Chain = row.Chain
			}
		}
	}
	return EventRow(ev, owner, 0, 0), u, c, nil
}
