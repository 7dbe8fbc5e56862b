package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Decision names, one Rego package each (data.bandplane.<name>.decision).
const (
	PeerVisible    = "peer_visible"
	AddParticipant = "add_participant"
	ContactRequest = "contact_request"
	SendMessage    = "send_message"
)

// Decisions lists the decision names a bundle must define.
var decisionNames = []string{PeerVisible, AddParticipant, ContactRequest, SendMessage}

// Reason codes the Go side adds; the policies add their own (see README.md).
const (
	CodeEvalError      = "eval_error"
	CodeUndefined      = "undefined"
	CodeRateLimited    = "rate_limited"
	CodeBudgetExceeded = "budget_exceeded"
)

// Reason explains a decision: a stable machine code and a text for people.
type Reason struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Peer is one visible peer in the list form of peer_visible.
type Peer struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"` // agent | person
	Handle    string `json:"handle"`
	IsContact bool   `json:"is_contact"`
	Reason    string `json:"reason"` // owner | contact | sibling | global | org_shared
}

// Quota is what send_message allows an agent; 0 means unlimited.
type Quota struct {
	WindowSeconds              int64 `json:"window_seconds"`
	MessagesPerWindowAgent     int64 `json:"messages_per_window_agent"`
	MessagesPerWindowAgentRoom int64 `json:"messages_per_window_agent_room"`
	TokensPerDayAgent          int64 `json:"tokens_per_day_agent"`
	TokensPerDayOwner          int64 `json:"tokens_per_day_owner"`
	TokensPerDayOrg            int64 `json:"tokens_per_day_org"`
	CostMicrosPerDayAgent      int64 `json:"cost_micros_per_day_agent"`
	CostMicrosPerDayOwner      int64 `json:"cost_micros_per_day_owner"`
	CostMicrosPerDayOrg        int64 `json:"cost_micros_per_day_org"`
}

// Decision is the answer to one question. Allow is false unless a policy granted it.
type Decision struct {
	DecisionID     string   `json:"decision_id"`
	Name           string   `json:"decision"`
	Allow          bool     `json:"allow"`
	Reasons        []Reason `json:"reasons"`
	PolicyRevision string   `json:"policy_revision"`
	RetryAfterMs   int64    `json:"retry_after_ms,omitempty"`

	// peer_visible (one candidate) and add_participant.
	IsContact bool   `json:"is_contact"`
	Via       string `json:"via,omitempty"` // the grant: owner|owned|contact|sibling|global|org_shared
	// peer_visible without a candidate: the visible peers not in the room, by id.
	Peers []Peer `json:"peers,omitempty"`

	// contact_request.
	Status     string `json:"status,omitempty"` // pending | approved
	HTTPStatus int    `json:"http_status,omitempty"`
	Code       string `json:"code,omitempty"`
	Message    string `json:"message,omitempty"`
	Recipient  string `json:"recipient,omitempty"`
	RequestID  string `json:"request_id,omitempty"` // the opposite request approved

	// send_message.
	Agent string `json:"agent,omitempty"`
	Owner string `json:"owner,omitempty"`
	Org   string `json:"org,omitempty"`
	Quota *Quota `json:"quota,omitempty"`
}

// PeerInput asks peer_visible about one Candidate, or for the list when it is empty.
type PeerInput struct {
	Agent     string `json:"agent"`
	Room      string `json:"room,omitempty"`
	Candidate string `json:"candidate,omitempty"`
}

// AddInput asks add_participant whether Actor may add Participant to Room.
type AddInput struct {
	Actor       string `json:"actor"`
	Room        string `json:"room"`
	Participant string `json:"participant"`
}

// ContactInput asks contact_request about a request from agent From to Handle as typed.
type ContactInput struct {
	From   string `json:"from"`
	Handle string `json:"handle"`
}

// MessageInput asks send_message whether Agent may post in Room; Tokens and
// CostMicros, when known, are checked against the daily budgets.
type MessageInput struct {
	Agent      string `json:"agent"`
	Room       string `json:"room"`
	Tokens     int64  `json:"tokens,omitempty"`
	CostMicros int64  `json:"cost_micros,omitempty"`
}

func str(s string) *ast.Term { return ast.StringTerm(s) }

// inputValue turns an input into an AST value without a JSON round trip for the typed
// inputs (the hot path).
func inputValue(input any) (ast.Value, error) {
	switch in := input.(type) {
	case PeerInput:
		o := ast.NewObject(ast.Item(str("agent"), str(in.Agent)))
		if in.Room != "" {
			o.Insert(str("room"), str(in.Room))
		}
		if in.Candidate != "" {
			o.Insert(str("candidate"), str(in.Candidate))
		}
		return o, nil
	case AddInput:
		return ast.NewObject(
			ast.Item(str("actor"), str(in.Actor)),
			ast.Item(str("room"), str(in.Room)),
			ast.Item(str("participant"), str(in.Participant)),
		), nil
	case ContactInput:
		return ast.NewObject(ast.Item(str("from"), str(in.From)), ast.Item(str("handle"), str(in.Handle))), nil
	case MessageInput:
		return ast.NewObject(
			ast.Item(str("agent"), str(in.Agent)),
			ast.Item(str("room"), str(in.Room)),
			ast.Item(str("tokens"), ast.InternedTerm(int(in.Tokens))),
			ast.Item(str("cost_micros"), ast.InternedTerm(int(in.CostMicros))),
		), nil
	case *PeerInput:
		return inputValue(*in)
	case *AddInput:
		return inputValue(*in)
	case *ContactInput:
		return inputValue(*in)
	case *MessageInput:
		return inputValue(*in)
	case ast.Value:
		return in, nil
	case json.RawMessage:
		v, err := ast.ValueFromReader(strings.NewReader(string(in)))
		if err != nil {
			return nil, fmt.Errorf("cannot parse input: %w", err)
		}
		return v, nil
	default:
		v, err := ast.InterfaceToValue(input)
		if err != nil {
			return nil, fmt.Errorf("cannot convert input %T: %w", input, err)
		}
		return v, nil
	}
}

// messageAmounts reads tokens and cost_micros from a send_message input.
func messageAmounts(v ast.Value) (tokens, cost int64) {
	o, ok := v.(ast.Object)
	if !ok {
		return 0, 0
	}
	get := func(k string) int64 {
		t := o.Get(str(k))
		if t == nil {
			return 0
		}
		n, ok := t.Value.(ast.Number)
		if !ok {
			return 0
		}
		i, ok := n.Int64()
		if !ok || i < 0 {
			return 0
		}
		return i
	}
	return get("tokens"), get("cost_micros")
}

// decode fills d from the policy's decision object. A result that is not an object or
// lacks a boolean allow is an undefined decision: deny.
func decode(d *Decision, v any) {
	m, ok := v.(map[string]any)
	if !ok {
		d.Reasons = []Reason{{Code: CodeUndefined, Message: fmt.Sprintf("%s returned %T, not an object", d.Name, v)}}
		return
	}
	allow, ok := m["allow"].(bool)
	if !ok {
		d.Reasons = []Reason{{Code: CodeUndefined, Message: d.Name + " returned no boolean allow"}}
		return
	}
	d.Allow = allow
	if rs, ok := m["reasons"].([]any); ok {
		d.Reasons = make([]Reason, 0, len(rs))
		for _, r := range rs {
			if rm, ok := r.(map[string]any); ok {
				d.Reasons = append(d.Reasons, Reason{Code: asString(rm["code"]), Message: asString(rm["message"])})
			}
		}
	}
	d.IsContact, _ = m["is_contact"].(bool)
	d.Via = asString(m["reason"])
	if ps, ok := m["peers"].([]any); ok {
		d.Peers = make([]Peer, 0, len(ps))
		for _, p := range ps {
			if pm, ok := p.(map[string]any); ok {
				ic, _ := pm["is_contact"].(bool)
				d.Peers = append(d.Peers, Peer{ID: asString(pm["id"]), Kind: asString(pm["kind"]),
					Handle: asString(pm["handle"]), IsContact: ic, Reason: asString(pm["reason"])})
			}
		}
		slices.SortFunc(d.Peers, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
	}
	d.Status = asString(m["status"])
	d.HTTPStatus = int(asInt(m["http_status"]))
	d.Code = asString(m["code"])
	d.Message = asString(m["message"])
	d.Recipient = asString(m["recipient"])
	d.RequestID = asString(m["request_id"])
	d.Agent = asString(m["agent"])
	d.Owner = asString(m["owner"])
	d.Org = asString(m["org"])
	if q, ok := m["quota"].(map[string]any); ok {
		d.Quota = &Quota{
			WindowSeconds:              asInt(q["window_seconds"]),
			MessagesPerWindowAgent:     asInt(q["messages_per_window_agent"]),
			MessagesPerWindowAgentRoom: asInt(q["messages_per_window_agent_room"]),
			TokensPerDayAgent:          asInt(q["tokens_per_day_agent"]),
			TokensPerDayOwner:          asInt(q["tokens_per_day_owner"]),
			TokensPerDayOrg:            asInt(q["tokens_per_day_org"]),
			CostMicrosPerDayAgent:      asInt(q["cost_micros_per_day_agent"]),
			CostMicrosPerDayOwner:      asInt(q["cost_micros_per_day_owner"]),
			CostMicrosPerDayOrg:        asInt(q["cost_micros_per_day_org"]),
		}
	}
	if d.Reasons == nil {
		d.Reasons = []Reason{}
	}
}

func asString(v any) string {
	s, _ := v.(string)
	return s
}

func asInt(v any) int64 {
	switch n := v.(type) {
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return i
		}
		if f, err := n.Float64(); err == nil {
			return int64(f)
		}
	case int64:
		return n
	case int:
		return int64(n)
	case float64:
		return int64(n)
	}
	return 0
}
