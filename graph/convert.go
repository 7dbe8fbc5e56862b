package graph

import (
	"context"
	"time"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/work"
)

// names are the handles and names of the parties and rooms of one answer.
type names struct {
	parties map[string]query.Party
	rooms   map[string]string
}

// lookupNames reads, in org's directory and room events only, the names of the
// given party and room ids (in chunks of query.MaxNames).
func (r *Resolver) lookupNames(ctx context.Context, org string, ids, rooms []string) (names, error) {
	n := names{parties: map[string]query.Party{}, rooms: map[string]string{}}
	for len(ids) > 0 {
		k := min(len(ids), query.MaxNames)
		got, err := r.q.Names(ctx, org, ids[:k])
		if err != nil {
			return names{}, err
		}
		for id, p := range got {
			n.parties[id] = p
		}
		ids = ids[k:]
	}
	if len(rooms) > 0 {
		got, err := r.q.RoomNames(ctx, org, rooms)
		if err != nil {
			return names{}, err
		}
		n.rooms = got
	}
	return n, nil
}

// party sets handle and name from the directory entry of id, if there is one. A nil
// names (live payloads) sets nothing.
func (n *names) party(id string, handle, display **string) {
	if n == nil {
		return
	}
	if p, ok := n.parties[id]; ok && id != "" {
		if handle != nil {
			*handle = &p.Handle
		}
		if display != nil {
			*display = &p.Name
		}
	}
}

func (n *names) room(id string) *string {
	if n == nil {
		return nil
	}
	if t, ok := n.rooms[id]; ok && id != "" {
		return &t
	}
	return nil
}

func tokens(t query.Tokens) *model.Tokens {
	return &model.Tokens{Input: int64(t.Input), Output: int64(t.Output), CacheRead: int64(t.CacheRead),
		CacheWrite: int64(t.CacheWrite), Reasoning: int64(t.Reasoning), Total: int64(t.Total())}
}

func money(d decimal.Decimal) string { return d.StringFixed(6) }

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func taskModel(t work.Task, n *names) model.Task {
	m := model.Task{ID: t.ID, RoomID: t.RoomID, Title: t.Title, Status: t.Status, AssigneeID: t.AssigneeID,
		CreatedAt: optTime(t.CreatedAt), UpdatedAt: t.UpdatedAt, LastActivity: t.LastActivity, Stuck: t.Stuck}
	if t.Stuck {
		m.StuckSince = optTime(t.StuckSince)
	}
	n.party(t.AssigneeID, &m.AssigneeHandle, &m.AssigneeName)
	return m
}

func attentionModel(a work.Attention, n *names, now time.Time) model.AttentionRequest {
	m := model.AttentionRequest{ID: a.ID, RoomID: a.RoomID, AskedBy: a.AskerID, Question: a.Question, Since: a.Since,
		AgeSeconds: int64(max(now.Sub(a.Since), 0) / time.Second), AddressedTo: optString(a.AddressedTo)}
	n.party(a.AskerID, &m.AskedByHandle, &m.AskedByName)
	if m.AskedByHandle == nil && a.AskerHandle != "" {
		h := a.AskerHandle
		m.AskedByHandle = &h
	}
	if a.AddressedTo != "" {
		n.party(a.AddressedTo, &m.AddressedToHandle, &m.AddressedToName)
	}
	m.RoomName = n.room(a.RoomID)
	return m
}

func decisionModel(d query.PolicyDecision, n *names) model.PolicyDecision {
	m := model.PolicyDecision{ID: d.ID, Time: d.Time, Decision: d.Decision, Allowed: d.Allowed, Revision: d.Revision,
		InputDigest: d.InputDigest, Input: d.Input, AgentID: d.AgentID, RoomID: d.RoomID, RequestedBy: optString(d.RequestedBy),
		Reasons: make([]model.DecisionReason, len(d.Reasons))}
	for i, r := range d.Reasons {
		m.Reasons[i] = model.DecisionReason{Code: r.Code, Message: r.Message}
	}
	if d.RetryAfterMs > 0 {
		v := d.RetryAfterMs
		m.RetryAfterMs = &v
	}
	n.party(d.AgentID, &m.AgentHandle, nil)
	m.RoomName = n.room(d.RoomID)
	return m
}

func costRow(r query.CostRow, groupBy []string, n *names) model.CostRow {
	out := model.CostRow{
		Events: int64(r.Events), PricedEvents: int64(r.Events - r.UnpricedEvents), UnpricedEvents: int64(r.UnpricedEvents),
		Tokens: tokens(r.Tokens), UnpricedTokens: tokens(r.UnpricedTokens), Currency: r.Currency,
	}
	if r.Events > r.UnpricedEvents {
		c := money(r.Cost)
		out.Cost = &c
	}
	// Only grouped keys are set: an empty owner of a grouped row ("" in the table) is
	// a value, an ungrouped one is null.
	for _, d := range groupBy {
		switch d {
		case query.DimOwner:
			out.OwnerID = &r.OwnerID
			n.party(r.OwnerID, &out.OwnerHandle, &out.OwnerName)
		case query.DimAgent:
			out.AgentID = &r.AgentID
			n.party(r.AgentID, &out.AgentHandle, &out.AgentName)
		case query.DimRoom:
			out.RoomID = &r.RoomID
			out.RoomName = n.room(r.RoomID)
		case query.DimModel:
			out.Model = &r.Model
		case query.DimHour:
			out.Hour = &r.Hour
		case query.DimDay:
			out.Day = &r.Day
		case query.DimInitiator:
			out.InitiatorID = &r.InitiatorID
			n.party(r.InitiatorID, &out.InitiatorHandle, &out.InitiatorName)
		case query.DimInitiatorOwner:
			out.InitiatorOwnerID = &r.InitiatorOwnerID
		case query.DimChainDepth:
			d := int(r.ChainDepth)
			out.ChainDepth = &d
		}
	}
	return out
}

func auditEvent(e query.Event, n *names) model.AuditEvent {
	m := model.AuditEvent{
		ID: e.ID, Type: e.Type, Time: e.Time, OrgID: e.OrgID, RoomID: e.RoomID,
		ActorID: e.ActorID, ActorType: e.ActorType, ActorHandle: e.ActorHandle, OwnerID: e.OwnerID,
		SubjectID: e.SubjectID, SubjectType: e.SubjectType, SubjectHandle: e.SubjectHandle,
		ExecutionID: e.ExecutionID, Source: e.Source, SchemaVersion: int(e.SchemaVersion), Data: e.Data,
		IngestedAt: e.IngestedAt, KafkaPartition: int(e.KafkaPartition), KafkaOffset: e.KafkaOffset,
	}
	n.party(e.ActorID, nil, &m.ActorName)
	m.RoomName = n.room(e.RoomID)
	return m
}

// links are the GraphQL values of a link's source (schema/cause).
var links = map[string]model.CauseLink{"explicit": model.CauseLinkExplicit, "inferred": model.CauseLinkInferred, "pending": model.CauseLinkPending}

func delegation(d query.Delegation, n *names) *model.Delegation {
	out := &model.Delegation{InitiatorID: d.InitiatorID, InitiatorType: d.InitiatorType, InitiatorOwnerID: optString(d.InitiatorOwner),
		Hops: make([]model.DelegationHop, len(d.Hops)), Triggered: make([]model.DelegationHop, len(d.Triggered)), Truncated: d.Truncated}
	n.party(d.InitiatorID, &out.InitiatorHandle, &out.InitiatorName)
	for i, h := range d.Hops {
		out.Hops[i] = hop(h, n)
	}
	for i, h := range d.Triggered {
		out.Triggered[i] = hop(h, n)
	}
	return out
}

func hop(h query.Hop, n *names) model.DelegationHop {
	m := model.DelegationHop{Depth: h.Depth, TriggerMessageID: optString(h.TriggerID), TriggerEventID: optString(h.TriggerEventID),
		SenderID: optString(h.SenderID), AgentID: optString(h.AgentID), ExecutionID: optString(h.ExecutionID), Link: links[h.Link],
		Time: h.Time, Events: int64(h.Events), Currency: optString(h.Currency), Outside: h.Outside}
	if m.Link == "" {
		m.Link = model.CauseLinkInferred
	}
	if h.Events > 0 {
		c := money(h.Cost)
		m.Cost = &c
	}
	n.party(h.SenderID, &m.SenderHandle, &m.SenderName)
	n.party(h.AgentID, &m.AgentHandle, &m.AgentName)
	return m
}
