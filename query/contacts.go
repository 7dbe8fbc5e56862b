package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
)

// Contact request list sizes.
const (
	DefaultContactLimit = 100
	MaxContactLimit     = 1000
)

// contactRowLimit bounds the events a ContactRequests reads: a request is a handful of
// events, so this covers MaxContactLimit requests many times over, and a huge range
// cannot fill memory. The newest events are kept; reaching it sets Truncated.
const contactRowLimit = MaxContactLimit * 20

// contactStatuses are the statuses of a contact request; all but pending are final.
var contactStatuses = []string{"pending", "approved", "rejected", "cancelled"}

// defaultContactRange is the range of a ContactQuery without From.
const defaultContactRange = 30 * 24 * time.Hour

// ContactStep is one event of a request's history.
type ContactStep struct {
	Status  string
	Time    time.Time
	ActorID string // the event's actor: the recipient agent, for the platform's frames
	EventID string
}

// ContactRequest is one contact request, from the contact.request_received and
// contact.request_updated events of the range.
//
// Who is who: the platform sends both events on the recipient's channel
// (agent_contacts:<agent>, schema/band.go), so the event's actor is the agent that
// received the request (AgentID), and the requester is named only by its handle
// (FromHandle, a person or an agent of another owner; deploy/simulate/generate.go).
// The frames have no subject and do not say who answered. Following the platform's
// rules, approved and rejected are the recipient's answer (the agent itself or its
// owner on its behalf) and cancelled the requester's withdrawal, so DecidedBy is the
// recipient agent's id for approved and rejected, the requester's handle for
// cancelled, and "" while pending; a canonical event naming a subject (the party who
// answered) gives that subject's id instead.
type ContactRequest struct {
	RequestID, Status, FromHandle, ToHandle, Message, AgentID string
	// FirstSeen and LastChanged are the times of the oldest and the newest event of the
	// request in the range; Status is the newest event's.
	FirstSeen, LastChanged time.Time
	DecidedBy              string
	History                []ContactStep // oldest first, a replayed event once
}

// ContactQuery asks for the contact requests of one organization. Zero From/To: the
// last 30 days (To: now, From: To less 30 days). Only the events in [From, To) are
// read: a request's history and status are those of its events in the range.
type ContactQuery struct {
	OrgID    string
	From, To time.Time
	Status   string // pending | approved | rejected | cancelled (the latest status); "": any
	AgentID  string // the recipient agent
	Limit    int    // 0: DefaultContactLimit
}

// ContactPage lists requests, most recently changed first. Truncated says that more
// requests matched than Limit, or that the range held more events than a query reads
// (contactRowLimit): narrow the range to see the older ones.
type ContactPage struct {
	Requests  []ContactRequest
	Truncated bool
}

// Validate reports every problem of the query at once, each naming its field.
func (q ContactQuery) Validate() error {
	var errs []error
	errs = checkOrg(errs, q.OrgID)
	errs = checkRange(errs, q.From, q.To)
	if q.Status != "" && !slices.Contains(contactStatuses, q.Status) {
		errs = append(errs, fieldErr("status", "unknown status %q (want one of %s)", q.Status, strings.Join(contactStatuses, ", ")))
	}
	errs = checkID(errs, "agent_id", q.AgentID)
	errs = checkLimit(errs, q.Limit, MaxContactLimit)
	return errors.Join(errs...)
}

// window is the range a query reads, with the defaults applied: To now, From length
// before To. A From alone that is not before now is the caller's mistake.
func window(from, to, now time.Time, length time.Duration) (time.Time, time.Time, error) {
	if to.IsZero() {
		to = now
		if !from.IsZero() && !from.Before(now) {
			return time.Time{}, time.Time{}, fieldErr("from", "must be before to, which defaults to now (from %s, now %s)",
				from.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
		}
	}
	if from.IsZero() {
		from = to.Add(-length)
	}
	return from.UTC(), to.UTC(), nil
}

// ContactRequests lists q.OrgID's contact requests. It reads the request events
// through the audit trail's query (replays collapsed, at most contactRowLimit events,
// newest first) and groups them by request id here.
func (qr *Querier) ContactRequests(ctx context.Context, q ContactQuery) (ContactPage, error) {
	if err := q.Validate(); err != nil {
		return ContactPage{}, err
	}
	from, to, err := window(q.From, q.To, qr.now(), defaultContactRange)
	if err != nil {
		return ContactPage{}, err
	}
	aq := AuditQuery{OrgID: q.OrgID, From: from, To: to, ActorID: q.AgentID, Limit: contactRowLimit,
		Types: []string{schema.TypeContactRequestReceived, schema.TypeContactRequestUpdated}}
	page, err := qr.auditPage(ctx, auditSQL{db: qr.db, q: aq})
	if err != nil {
		return ContactPage{}, err
	}
	reqs, err := groupContacts(page.Events)
	if err != nil {
		return ContactPage{}, fmt.Errorf("cannot list contact requests of org %q: %w", q.OrgID, err)
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultContactLimit
	}
	out := ContactPage{Requests: []ContactRequest{}, Truncated: page.NextCursor != ""}
	for _, r := range reqs {
		if q.Status != "" && r.Status != q.Status {
			continue
		}
		if len(out.Requests) == limit {
			out.Truncated = true
			break
		}
		out.Requests = append(out.Requests, r)
	}
	return out, nil
}

// groupContacts folds request events (newest first, as read) into requests, most
// recently changed first (then by request id). An event without a request id is
// skipped; an event id seen before is a replay and counts once.
func groupContacts(events []Event) ([]ContactRequest, error) {
	byID := map[string]*ContactRequest{}
	var order []*ContactRequest
	seen := map[string]bool{}
	for i := len(events) - 1; i >= 0; i-- { // oldest first
		e := events[i]
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		var d schema.ContactData
		if err := schema.DecodeData([]byte(e.Data), &d); err != nil {
			return nil, fmt.Errorf("cannot decode the data of %s event %s: %w", e.Type, e.ID, err)
		}
		if d.RequestID == "" {
			continue
		}
		r := byID[d.RequestID]
		if r == nil {
			r = &ContactRequest{RequestID: d.RequestID, FirstSeen: e.Time}
			byID[d.RequestID] = r
			order = append(order, r)
		}
		status := d.Status
		if status == "" {
			// An update that does not restate the status keeps it; a request starts pending.
			status = r.Status
			if status == "" {
				status = "pending"
			}
		}
		r.History = append(r.History, ContactStep{Status: status, Time: e.Time, ActorID: e.ActorID, EventID: e.ID})
		r.Status, r.LastChanged = status, e.Time
		r.FromHandle = firstNonEmpty(r.FromHandle, d.FromHandle)
		r.ToHandle = firstNonEmpty(r.ToHandle, d.ToHandle)
		r.Message = firstNonEmpty(r.Message, d.Message)
		r.AgentID = firstNonEmpty(r.AgentID, e.ActorID)
		switch status {
		case "pending":
			r.DecidedBy = ""
		case "cancelled":
			r.DecidedBy = firstNonEmpty(e.SubjectID, r.FromHandle)
		default: // approved, rejected: the recipient's answer
			r.DecidedBy = firstNonEmpty(e.SubjectID, e.ActorID)
		}
	}
	out := make([]ContactRequest, len(order))
	for i, r := range order {
		out[i] = *r
	}
	slices.SortFunc(out, func(a, b ContactRequest) int {
		if c := b.LastChanged.Compare(a.LastChanged); c != 0 {
			return c
		}
		return strings.Compare(a.RequestID, b.RequestID)
	})
	return out, nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
