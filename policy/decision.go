package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

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
	// CodeLoop is send_message's loop guard (rego/send_message.rego): the chain of
	// the sending agent's execution is deeper than its quota's max_chain_depth, or two
	// agents have handed over to each other more than max_handoffs times in a row. Its
	// message starts with "loop:".
	CodeLoop = "loop"
	// CodeInitiatorBudgetElsewhere is a send_message whose initiator's hard budget is
	// held by another policy replica (policy/api; README.md, "Budgets by initiator").
	CodeInitiatorBudgetElsewhere = "initiator_budget_elsewhere"
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
	// MaxChainDepth and MaxHandoffs are the loop guard's: the deepest execution in a
	// chain of mentions, and the most handoffs in a row between two agents, that may
	// post (policy, not Go, enforces them).
	MaxChainDepth int64 `json:"max_chain_depth,omitempty"`
	MaxHandoffs   int64 `json:"max_handoffs,omitempty"`
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
	// ReservationID names the estimate a granted send_message reserved against its
	// budgets (the decision id), until the usage report of its execution settles it or
	// ReservationExpires passes.
	ReservationID      string    `json:"reservation_id,omitempty"`
	ReservationExpires time.Time `json:"reservation_expires,omitzero"`

	// Position and DecidedAt are for the audit trail, not the caller: the directory's
	// position in the events topic when the decision read it (nil for a directory not
	// kept from the topic) and the engine's clock at the decision. A replay applies the
	// records below Position to a fresh directory and decides again at DecidedAt.
	Position  Position  `json:"-"`
	DecidedAt time.Time `json:"-"`
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

// MessageInput asks send_message whether Agent may post in Room. Tokens and
// CostMicros, when known, are the estimate checked against the budgets and reserved on
// them; ExecutionID names the execution whose usage report settles the reservation.
type MessageInput struct {
	Agent       string `json:"agent"`
	Room        string `json:"room"`
	Tokens      int64  `json:"tokens,omitempty"`
	CostMicros  int64  `json:"cost_micros,omitempty"`
	ExecutionID string `json:"execution_id,omitempty"`
	// Chain, when the routing core knows it, is where the sending agent's execution
	// stands in its chain of mentions: the loop guard reads it, and its initiator's
	// budgets are reserved on too.
	Chain *Chain `json:"chain,omitempty"`
}

// Chain is the chain of mentions an agent's execution belongs to (schema/cause derives
// the same figures from the trail).
type Chain struct {
	// Depth is the execution's depth: 1 when a person's (or a system's) message
	// started it, its trigger's depth plus one after that; 0 for the root's own.
	Depth int64 `json:"depth"`
	// Initiator is the id of the person, agent or system at the root of the chain;
	// InitiatorType says which ("user", "agent" or "system"). Both or neither.
	Initiator     string `json:"initiator,omitempty"`
	InitiatorType string `json:"initiator_type,omitempty"`
	// Handoffs is how many times in a row the same two agents have handed over to each
	// other, without a person in between, ending with this execution.
	Handoffs int64 `json:"handoffs"`
}

// Bounds of a Chain.
const (
	MaxChainDepth    = 1000
	MaxChainHandoffs = 1000
	// MaxInitiatorBytes is the longest initiator id (an event id's bound, schema.MaxIDBytes).
	MaxInitiatorBytes = 256
)

// InitiatorTypes are the kinds of initiator a Chain names.
var InitiatorTypes = []string{"user", "agent", "system"}

// Validate reports every problem of c, each naming its input field:
// "input.chain.depth: must be 0..1000, got -1".
func (c *Chain) Validate() error {
	var errs []error
	if c.Depth < 0 || c.Depth > MaxChainDepth {
		errs = append(errs, fmt.Errorf("input.chain.depth: must be 0..%d, got %d", MaxChainDepth, c.Depth))
	}
	if c.Handoffs < 0 || c.Handoffs > MaxChainHandoffs {
		errs = append(errs, fmt.Errorf("input.chain.handoffs: must be 0..%d, got %d", MaxChainHandoffs, c.Handoffs))
	}
	switch {
	case len(c.Initiator) > MaxInitiatorBytes:
		errs = append(errs, fmt.Errorf("input.chain.initiator: must be at most %d bytes, got %d", MaxInitiatorBytes, len(c.Initiator)))
	case !utf8.ValidString(c.Initiator):
		errs = append(errs, errors.New("input.chain.initiator: must be valid UTF-8"))
	default:
		for i := 0; i < len(c.Initiator); i++ {
			if c.Initiator[i] < 0x20 || c.Initiator[i] == 0x7f {
				errs = append(errs, fmt.Errorf("input.chain.initiator: must not hold control characters, got one at byte %d", i))
				break
			}
		}
	}
	switch {
	case c.Initiator != "" && c.InitiatorType == "":
		errs = append(errs, errors.New("input.chain.initiator_type: missing (user, agent or system: the kind of input.chain.initiator)"))
	case c.Initiator == "" && c.InitiatorType != "":
		errs = append(errs, errors.New("input.chain.initiator: missing (input.chain.initiator_type names the kind of an initiator)"))
	}
	if c.InitiatorType != "" && !slices.Contains(InitiatorTypes, c.InitiatorType) {
		t := c.InitiatorType
		if len(t) > 32 {
			t = t[:32] + "…"
		}
		errs = append(errs, fmt.Errorf("input.chain.initiator_type: must be user, agent or system, got %q", t))
	}
	return errors.Join(errs...)
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
		o := ast.NewObject(
			ast.Item(str("agent"), str(in.Agent)),
			ast.Item(str("room"), str(in.Room)),
			ast.Item(str("tokens"), ast.InternedTerm(int(in.Tokens))),
			ast.Item(str("cost_micros"), ast.InternedTerm(int(in.CostMicros))),
		)
		if in.ExecutionID != "" {
			o.Insert(str("execution_id"), str(in.ExecutionID))
		}
		if c := in.Chain; c != nil {
			co := ast.NewObject(
				ast.Item(str("depth"), ast.InternedTerm(int(c.Depth))),
				ast.Item(str("handoffs"), ast.InternedTerm(int(c.Handoffs))),
			)
			if c.Initiator != "" {
				co.Insert(str("initiator"), str(c.Initiator))
			}
			if c.InitiatorType != "" {
				co.Insert(str("initiator_type"), str(c.InitiatorType))
			}
			o.Insert(keyChain, ast.NewTerm(co))
		}
		return o, nil
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

var (
	keyChain         = ast.InternedTerm("chain")
	keyInitiator     = ast.InternedTerm("initiator")
	keyInitiatorType = ast.InternedTerm("initiator_type")
)

// chainInitiator reads input.chain.initiator and initiator_type of a send_message
// input ("" when absent or not strings).
func chainInitiator(v ast.Value) (id, typ string) {
	o, ok := v.(ast.Object)
	if !ok {
		return "", ""
	}
	t := o.Get(keyChain)
	if t == nil {
		return "", ""
	}
	c, ok := t.Value.(ast.Object)
	if !ok {
		return "", ""
	}
	return stringAt(c, keyInitiator), stringAt(c, keyInitiatorType)
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

// decode fills d from the policy's decision object, read straight from the AST (the
// evaluation skips OPA's conversion to Go maps) in one pass over its keys. A result that
// is not an object or lacks a boolean allow is an undefined decision: deny.
func decode(d *Decision, v ast.Value) {
	m, ok := v.(ast.Object)
	if !ok {
		d.Reasons = []Reason{{Code: CodeUndefined, Message: fmt.Sprintf("%s returned %s, not an object", d.Name, ast.ValueName(v))}}
		return
	}
	hasAllow := false
	m.Foreach(func(k, t *ast.Term) {
		key, _ := k.Value.(ast.String)
		switch v := t.Value; key {
		case "allow":
			b, ok := v.(ast.Boolean)
			d.Allow, hasAllow = bool(b), ok
		case "reasons":
			if rs, ok := v.(*ast.Array); ok {
				d.Reasons = make([]Reason, 0, rs.Len())
				rs.Foreach(func(t *ast.Term) {
					if r, ok := t.Value.(ast.Object); ok {
						d.Reasons = append(d.Reasons, Reason{Code: getString(r, "code"), Message: getString(r, "message")})
					}
				})
			}
		case "is_contact":
			b, _ := v.(ast.Boolean)
			d.IsContact = bool(b)
		case "reason":
			d.Via = asString(v)
		case "peers":
			if ps, ok := v.(*ast.Array); ok {
				d.Peers = make([]Peer, 0, ps.Len())
				ps.Foreach(func(t *ast.Term) {
					if p, ok := t.Value.(ast.Object); ok {
						d.Peers = append(d.Peers, Peer{ID: getString(p, "id"), Kind: getString(p, "kind"),
							Handle: getString(p, "handle"), IsContact: getBool(p, "is_contact"), Reason: getString(p, "reason")})
					}
				})
				slices.SortFunc(d.Peers, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
			}
		case "status":
			d.Status = asString(v)
		case "http_status":
			d.HTTPStatus = int(asInt(v))
		case "code":
			d.Code = asString(v)
		case "message":
			d.Message = asString(v)
		case "recipient":
			d.Recipient = asString(v)
		case "request_id":
			d.RequestID = asString(v)
		case "agent":
			d.Agent = asString(v)
		case "owner":
			d.Owner = asString(v)
		case "org":
			d.Org = asString(v)
		case "quota":
			if q, ok := v.(ast.Object); ok {
				d.Quota = &Quota{
					WindowSeconds:              getInt(q, "window_seconds"),
					MessagesPerWindowAgent:     getInt(q, "messages_per_window_agent"),
					MessagesPerWindowAgentRoom: getInt(q, "messages_per_window_agent_room"),
					TokensPerDayAgent:          getInt(q, "tokens_per_day_agent"),
					TokensPerDayOwner:          getInt(q, "tokens_per_day_owner"),
					TokensPerDayOrg:            getInt(q, "tokens_per_day_org"),
					CostMicrosPerDayAgent:      getInt(q, "cost_micros_per_day_agent"),
					CostMicrosPerDayOwner:      getInt(q, "cost_micros_per_day_owner"),
					CostMicrosPerDayOrg:        getInt(q, "cost_micros_per_day_org"),
					MaxChainDepth:              getInt(q, "max_chain_depth"),
					MaxHandoffs:                getInt(q, "max_handoffs"),
				}
			}
		}
	})
	if !hasAllow {
		*d = Decision{DecisionID: d.DecisionID, Name: d.Name, PolicyRevision: d.PolicyRevision,
			Position: d.Position, DecidedAt: d.DecidedAt,
			Reasons: []Reason{{Code: CodeUndefined, Message: d.Name + " returned no boolean allow"}}}
		return
	}
	if d.Reasons == nil {
		d.Reasons = []Reason{}
	}
}

// get is o[key], or nil.
func get(o ast.Object, key string) ast.Value {
	if t := o.Get(ast.InternedTerm(key)); t != nil {
		return t.Value
	}
	return nil
}

func getString(o ast.Object, key string) string { return asString(get(o, key)) }

func getBool(o ast.Object, key string) bool {
	b, _ := get(o, key).(ast.Boolean)
	return bool(b)
}

func getInt(o ast.Object, key string) int64 { return asInt(get(o, key)) }

func asString(v ast.Value) string {
	s, _ := v.(ast.String)
	return string(s)
}

// asInt is v as an integer; a fraction is truncated, anything else is 0.
func asInt(v ast.Value) int64 {
	n, ok := v.(ast.Number)
	if !ok {
		return 0
	}
	if i, ok := n.Int64(); ok {
		return i
	}
	if f, ok := n.Float64(); ok {
		return int64(f)
	}
	return 0
}
