package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
)

// Decision page sizes.
const (
	DefaultDecisionLimit = 100
	MaxDecisionLimit     = 1000
)

// decisionNames are the decisions the policy API makes (policy.PeerVisible, …; not
// imported: this package does not need OPA).
var decisionNames = []string{"peer_visible", "add_participant", "contact_request", "send_message"}

// Reason explains a decision: a stable machine code and a text for people.
type Reason struct{ Code, Message string }

// PolicyDecision is one decision of the policy API, as its policy.decided event
// recorded it (policy/api.DecidedData).
type PolicyDecision struct {
	ID       string // the decision id, which is the event's id
	Time     time.Time
	Decision string // peer_visible | add_participant | contact_request | send_message
	Allowed  bool
	Reasons  []Reason // never nil
	// Revision is the policy bundle's hash; InputDigest the SHA-256 (hex) of Input, the
	// canonical JSON of the question asked.
	Revision, InputDigest, Input string
	RetryAfterMs                 int64 // send_message denials: when to try again
	// AgentID is the agent decided about (the event's actor: send_message's and
	// peer_visible's agent, add_participant's actor, contact_request's requester),
	// RoomID its room, if the question named one, and RequestedBy the id of the API key
	// that asked ("" for the CLI).
	AgentID, RoomID, RequestedBy string
}

// DecisionQuery asks for the policy decisions of one organization, newest first. Zero
// values mean "any"; the range is [From, To) at millisecond precision. Paging works as
// for AuditQuery (the cursor is the same, with its watermark).
type DecisionQuery struct {
	OrgID    string
	From, To time.Time
	Decision string // one of the four decision names; "": all
	Outcome  string // "allowed", "denied"; "": both
	AgentID  string
	Limit    int    // 0: DefaultDecisionLimit
	Before   string // a previous page's NextCursor
}

// DecisionPage is one page of decisions; NextCursor is empty on the last page.
type DecisionPage struct {
	Decisions  []PolicyDecision
	NextCursor string
}

// Validate reports every problem of the query at once, each naming its field.
func (q DecisionQuery) Validate() error {
	var errs []error
	errs = checkOrg(errs, q.OrgID)
	errs = checkRange(errs, q.From, q.To)
	if q.Decision != "" && !slices.Contains(decisionNames, q.Decision) {
		errs = append(errs, fieldErr("decision", "unknown decision %q (want one of %s)", q.Decision, strings.Join(decisionNames, ", ")))
	}
	errs = checkOutcome(errs, q.Outcome)
	errs = checkID(errs, "agent_id", q.AgentID)
	errs = checkLimit(errs, q.Limit, MaxDecisionLimit)
	errs = checkCursor(errs, q.Before)
	return errors.Join(errs...)
}

// PolicyDecisions returns one page of q.OrgID's policy decisions, newest first. It is
// the audit trail's policy.decided events (AuditEvents, with the decision name as one
// more filter), each parsed by DecisionOf.
func (qr *Querier) PolicyDecisions(ctx context.Context, q DecisionQuery) (DecisionPage, error) {
	if err := q.Validate(); err != nil {
		return DecisionPage{}, err
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultDecisionLimit
	}
	aq := AuditQuery{OrgID: q.OrgID, From: q.From, To: q.To, ActorID: q.AgentID,
		Types: []string{schema.TypePolicyDecided}, Outcome: q.Outcome, Limit: limit, Before: q.Before}
	page, err := qr.auditPage(ctx, auditSQL{db: qr.db, q: aq, decision: q.Decision, asOf: asOfOf(q.Before, qr.now())})
	if err != nil {
		return DecisionPage{}, err
	}
	out := DecisionPage{Decisions: make([]PolicyDecision, 0, len(page.Events)), NextCursor: page.NextCursor}
	for _, e := range page.Events {
		d, err := DecisionOf(e)
		if err != nil {
			return DecisionPage{}, fmt.Errorf("cannot list policy decisions of org %q: %w", q.OrgID, err)
		}
		out.Decisions = append(out.Decisions, d)
	}
	return out, nil
}

// decidedData mirrors policy/api.DecidedData (not imported: it would bring OPA in);
// TestDecisionOfDecidedData keeps the two in step.
type decidedData struct {
	Decision string `json:"decision"`
	Allow    bool   `json:"allow"`
	Reasons  []struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"reasons"`
	PolicyRevision string          `json:"policy_revision"`
	InputDigest    string          `json:"input_digest"`
	Input          json.RawMessage `json:"input"`
	RetryAfterMs   int64           `json:"retry_after_ms"`
	RequestedBy    string          `json:"requested_by"`
}

// DecisionOf parses one stored policy.decided event (also used for live events).
func DecisionOf(e Event) (PolicyDecision, error) {
	if e.Type != schema.TypePolicyDecided {
		return PolicyDecision{}, fmt.Errorf("cannot read event %s as a policy decision: its type is %q, not %s", e.ID, e.Type, schema.TypePolicyDecided)
	}
	var d decidedData
	if err := schema.DecodeData([]byte(e.Data), &d); err != nil {
		return PolicyDecision{}, fmt.Errorf("cannot decode the data of policy decision %s: %w", e.ID, err)
	}
	p := PolicyDecision{
		ID: e.ID, Time: e.Time, Decision: d.Decision, Allowed: d.Allow, Reasons: make([]Reason, 0, len(d.Reasons)),
		Revision: d.PolicyRevision, InputDigest: d.InputDigest, Input: string(d.Input), RetryAfterMs: d.RetryAfterMs,
		AgentID: e.ActorID, RoomID: e.RoomID, RequestedBy: d.RequestedBy,
	}
	for _, r := range d.Reasons {
		p.Reasons = append(p.Reasons, Reason{Code: r.Code, Message: r.Message})
	}
	return p, nil
}
