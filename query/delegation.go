package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/schema"
)

// Delegation chains, from the links ingest keeps (causes, schema/cause): the hops from
// an execution or a message back to its initiator, with what each hop spent.

// Delegation bounds.
const (
	// MaxDelegationHops bounds the hops walked back: a runaway loop is cut there, and
	// the answer says so (Truncated).
	MaxDelegationHops = 64
	// MaxDelegationRange bounds [From, To): each hop is one read of causes over it.
	MaxDelegationRange = 31 * 24 * time.Hour
	// DefaultDelegationRange is the range without From: the week before To.
	DefaultDelegationRange = 7 * 24 * time.Hour
)

// DelegationQuery asks for the chain of one execution or one message (exactly one of
// them) of OrgID, looked up in [From, To) (defaults: the week before now).
type DelegationQuery struct {
	OrgID                  string
	ExecutionID, MessageID string
	From, To               time.Time
}

// Hop is one step of a chain: the execution of Agent that the message TriggerID, sent
// by Sender, started. The root hop has no trigger: its Sender is the initiator.
type Hop struct {
	Depth                     int
	TriggerID, TriggerEventID string    // empty at the root
	SenderID, SenderType      string    // who sent the trigger (at the root: the initiator)
	AgentID, ExecutionID      string    // the agent whose execution this is ("" at a person's root)
	Link                      string    // explicit | inferred | pending
	Time                      time.Time // when the step began (one a message started: its first usage)
	// What the execution spent: the usage whose trigger is this hop's, by this agent.
	Events   uint64
	Cost     decimal.Decimal
	Currency string
	// Outside says that the trigger is not in the organization's own trail (a message
	// of another organization, through an approved contact): it is not followed, and
	// the hop shows only what the organization's own rows hold.
	Outside bool
}

// Delegation is a chain, root first.
type Delegation struct {
	InitiatorID, InitiatorType, InitiatorOrg, InitiatorOwner string
	Hops                                                     []Hop
	// Triggered are the executions the asked-for message started (a message query
	// only), with what each spent.
	Triggered []Hop
	// Truncated says that the walk stopped at MaxDelegationHops.
	Truncated bool
}

// Validate reports every problem of the query at once.
func (q *DelegationQuery) Validate() error {
	errs := checkOrg(nil, q.OrgID)
	switch {
	case q.ExecutionID == "" && q.MessageID == "":
		errs = append(errs, fieldErr("execution_id", "one of execution_id and message_id is required"))
	case q.ExecutionID != "" && q.MessageID != "":
		errs = append(errs, fieldErr("message_id", "give execution_id or message_id, not both"))
	}
	for _, f := range []struct{ name, v string }{{"execution_id", q.ExecutionID}, {"message_id", q.MessageID}} {
		if len(f.v) > 256 {
			errs = append(errs, fieldErr(f.name, "must be at most 256 bytes, got %d", len(f.v)))
		}
	}
	if !q.From.IsZero() && !q.To.IsZero() {
		if !q.To.After(q.From) {
			errs = append(errs, fieldErr("to", "must be after from"))
		} else if q.To.Sub(q.From) > MaxDelegationRange {
			errs = append(errs, fieldErr("from", "the range is %s; at most %s", q.To.Sub(q.From), MaxDelegationRange))
		}
	}
	return errors.Join(errs...)
}

// causeRow is what a hop needs of a row of causes.
type causeRow struct {
	eventID, typ, actorID, actorType, executionID, messageID string
	triggerID, triggerEventID                                string
	initiatorID, initiatorType, initiatorOrg, initiatorOwner string
	depth                                                    uint16
	link                                                     string
	at                                                       time.Time
}

const causeReadCols = "event_id, type, actor_id, actor_type, execution_id, message_id, trigger_id, trigger_event_id, " +
	"initiator_id, initiator_type, initiator_org, initiator_owner, depth, link, time"

// Delegation walks back from q's execution or message to its initiator.
func (qr *Querier) Delegation(ctx context.Context, q DelegationQuery) (Delegation, error) {
	if q.To.IsZero() {
		q.To = qr.now().UTC()
	}
	if q.From.IsZero() {
		q.From = q.To.Add(-DefaultDelegationRange)
	}
	if err := q.Validate(); err != nil {
		return Delegation{}, err
	}
	start, err := qr.startCause(ctx, q)
	if err != nil {
		return Delegation{}, err
	}
	out := Delegation{InitiatorID: start.initiatorID, InitiatorType: start.initiatorType,
		InitiatorOrg: start.initiatorOrg, InitiatorOwner: start.initiatorOwner}
	// The hops from the start up, each the execution its trigger message started.
	var hops []Hop
	at := start
	for {
		h := Hop{Depth: int(at.depth), TriggerID: at.triggerID, TriggerEventID: at.triggerEventID, Link: at.link, Time: at.at,
			ExecutionID: at.executionID, Cost: decimal.Zero}
		if at.actorType == "agent" {
			h.AgentID = at.actorID
		}
		if at.triggerID == "" { // the root: its own actor (or the system) set it going
			h.SenderID, h.SenderType = at.initiatorID, at.initiatorType
			hops = append(hops, h)
			break
		}
		if len(hops) == MaxDelegationHops {
			out.Truncated = true
			break
		}
		if at.link == "pending" { // the trigger has not arrived: nothing to follow yet
			hops = append(hops, h)
			break
		}
		trigger, found, err := qr.causeOf(ctx, q, at.triggerEventID, at.triggerID, at.at)
		if err != nil {
			return Delegation{}, err
		}
		if !found {
			h.Outside = true
			hops = append(hops, h)
			break
		}
		h.SenderID, h.SenderType = trigger.actorID, trigger.actorType
		hops = append(hops, h)
		at = trigger
	}
	for i, j := 0, len(hops)-1; i < j; i, j = i+1, j-1 {
		hops[i], hops[j] = hops[j], hops[i]
	}
	out.Hops = hops
	triggers := make([]string, 0, len(hops)+1)
	for _, h := range hops {
		if h.TriggerID != "" {
			triggers = append(triggers, h.TriggerID)
		}
	}
	if q.MessageID != "" {
		triggers = append(triggers, start.messageID)
	}
	spent, err := qr.spentBy(ctx, q, triggers, hops[0].Time)
	if err != nil {
		return Delegation{}, err
	}
	for i := range out.Hops {
		h := &out.Hops[i]
		if s, ok := spent[hopKey{h.TriggerID, h.AgentID}]; ok {
			h.Events, h.Cost, h.Currency = s.Events, s.Cost, s.Currency
		}
	}
	if q.MessageID != "" {
		for k, s := range spent {
			if k.trigger == start.messageID {
				out.Triggered = append(out.Triggered, Hop{Depth: int(start.depth) + 1, TriggerID: start.messageID,
					TriggerEventID: start.eventID, SenderID: start.actorID, SenderType: start.actorType, AgentID: k.agent,
					Time: s.First.UTC(), Events: s.Events, Cost: s.Cost, Currency: s.Currency, Link: s.Link})
			}
		}
		sortHops(out.Triggered)
	}
	return out, nil
}

// startCause reads the cause row the query starts from: a message's own, or the first
// of an execution's events.
func (qr *Querier) startCause(ctx context.Context, q DelegationQuery) (causeRow, error) {
	cond, arg, what := "execution_id = ?", q.ExecutionID, "execution "+q.ExecutionID
	if q.MessageID != "" {
		cond, arg, what = "(message_id = ? OR (event_id = ? AND message_id != ''))", q.MessageID, "message "+q.MessageID
	}
	args := []any{q.OrgID, q.From.UTC(), q.To.UTC(), arg}
	if q.MessageID != "" {
		args = append(args, q.MessageID)
	}
	rows, err := qr.causes(ctx, q, "org_id = ? AND time >= ? AND time < ? AND "+cond+" ORDER BY time, time_ms, event_id LIMIT 1", args...)
	if err != nil {
		return causeRow{}, err
	}
	if len(rows) == 0 {
		return causeRow{}, fmt.Errorf("%s of org %q: %w between %s and %s (from and to widen the search)", what, q.OrgID, schema.ErrNotFound,
			q.From.UTC().Format(time.RFC3339), q.To.UTC().Format(time.RFC3339))
	}
	return rows[0], nil
}

// causeOf reads the cause row of a trigger message, by its event id or the platform's
// message id, at or before the time of the execution it started. found is false when
// the organization's trail does not hold it.
func (qr *Querier) causeOf(ctx context.Context, q DelegationQuery, eventID, messageID string, before time.Time) (causeRow, bool, error) {
	from := before.Add(-MaxDelegationRange)
	rows, err := qr.causes(ctx, q, "org_id = ? AND time >= ? AND time <= ? AND message_id != '' AND (event_id = ? OR message_id = ?) ORDER BY time, time_ms, event_id LIMIT 1",
		q.OrgID, from.UTC(), before.UTC(), eventID, messageID)
	if err != nil || len(rows) == 0 {
		return causeRow{}, false, err
	}
	return rows[0], true, nil
}

func (qr *Querier) causes(ctx context.Context, q DelegationQuery, where string, args ...any) ([]causeRow, error) {
	rows, err := qr.conn.Query(ctx, "SELECT "+causeReadCols+", time_ms FROM "+qr.db+".causes FINAL WHERE "+where, args...)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the delegation chain of org %q from %s.causes", q.OrgID, qr.db))
	}
	defer rows.Close()
	var out []causeRow
	for rows.Next() {
		var c causeRow
		var ms uint16
		if err := rows.Scan(&c.eventID, &c.typ, &c.actorID, &c.actorType, &c.executionID, &c.messageID, &c.triggerID, &c.triggerEventID,
			&c.initiatorID, &c.initiatorType, &c.initiatorOrg, &c.initiatorOwner, &c.depth, &c.link, &c.at, &ms); err != nil {
			return nil, fmt.Errorf("cannot read the delegation chain of org %q: %w", q.OrgID, err)
		}
		c.at = c.at.UTC().Add(time.Duration(ms) * time.Millisecond)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the delegation chain of org %q", q.OrgID))
	}
	return out, nil
}

type hopKey struct{ trigger, agent string }

type hopSpend struct {
	Events   uint64
	Cost     decimal.Decimal
	Currency string
	Link     string
	First    time.Time // the first usage event's
}

// spentBy sums the usage of the organization whose trigger is one of triggers, per
// trigger and agent: usage from the chain's first hop on, within MaxDelegationRange of
// it.
func (qr *Querier) spentBy(ctx context.Context, q DelegationQuery, triggers []string, first time.Time) (map[hopKey]hopSpend, error) {
	out := map[hopKey]hopSpend{}
	if len(triggers) == 0 {
		return out, nil
	}
	from := first.Add(-time.Hour) // the root's own events may precede its first hop's
	to := earlier(from.Add(MaxDelegationRange), qr.now().UTC().Add(time.Hour))
	rows, err := qr.conn.Query(ctx, "SELECT trigger_id, agent_id, count(), sum(cost), any(currency), any(link), min(time) FROM "+qr.db+
		".usage FINAL WHERE org_id = ? AND time >= ? AND time < ? AND has(?, trigger_id) GROUP BY trigger_id, agent_id",
		q.OrgID, from.UTC(), to, triggers)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the spend of the delegation chain of org %q from %s.usage", q.OrgID, qr.db))
	}
	defer rows.Close()
	for rows.Next() {
		var k hopKey
		var s hopSpend
		if err := rows.Scan(&k.trigger, &k.agent, &s.Events, &s.Cost, &s.Currency, &s.Link, &s.First); err != nil {
			return nil, fmt.Errorf("cannot read the spend of the delegation chain of org %q: %w", q.OrgID, err)
		}
		out[k] = s
	}
	return out, rows.Err()
}

// sortHops orders the executions one message started: the most expensive first.
func sortHops(hops []Hop) {
	slices.SortFunc(hops, func(a, b Hop) int {
		if c := b.Cost.Cmp(a.Cost); c != 0 {
			return c
		}
		return strings.Compare(a.AgentID, b.AgentID)
	})
}
