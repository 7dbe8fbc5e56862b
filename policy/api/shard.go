package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// Several replicas (policy/README.md, "Several replicas"): send_message takes from the limiter
// and reserves on the ledger, state that must live in one place per organization, so
// only the organization's owner (Config.Shards) decides it. The other decisions read
// the directory, which every replica holds whole, and are answered by any.

// OwnerHeader names the replica that owns the organization of a send_message decision:
// on a 421, where to ask; on a 200, the replica that answered (the client pins the
// agent to it).
const OwnerHeader = shard.OwnerHeader

// CodeMisdirected is the code of a 421 answer.
const CodeMisdirected = shard.CodeMisdirected

// MisdirectedError is Decide's answer to a send_message decision of an organization
// another replica owns: nothing was evaluated, audited or reserved here.
type MisdirectedError struct {
	Agent string
	Owner string // the owner's base URL
}

func (e *MisdirectedError) Error() string {
	return fmt.Sprintf("send_message decisions of agent %s are taken by the policy replica %s, which owns its organization; ask it", e.Agent, e.Owner)
}

// MisdirectedBody is the JSON body of a 421 answer.
type MisdirectedBody struct {
	keys.ErrorBody
	Owner   string `json:"owner"`
	Message string `json:"message"`
}

// misdirected refuses a stateful decision about an agent of an organization another
// replica owns. An agent this replica does not know is decided here: the policy denies
// it (unknown_agent) before anything is taken, and registeredMeanwhile catches the one
// that registers during the evaluation.
func (a *API) misdirected(in any) error {
	agent, _ := subjectOf(in)
	ag, ok := a.cfg.Engine.Directory().Agent(agent)
	if !ok || a.cfg.Shards.Owns(ag.Org) {
		return nil
	}
	return &MisdirectedError{Agent: agent, Owner: a.cfg.Shards.Owner(ag.Org)}
}

// registeredMeanwhile closes the race of an agent unknown when misdirected looked and
// registered (in another replica's organization) before the policy read the
// directory: the decision names that organization. Whatever it took is given back and
// it is answered 421 unaudited, as if the agent had been known from the start, so no
// replica but the owner ever grants a message of the organization.
func (a *API) registeredMeanwhile(d *policy.Decision, in any) error {
	if d.Org == "" || a.cfg.Shards.Owns(d.Org) {
		return nil
	}
	if d.Allow {
		a.giveBack(d, in)
	}
	return &MisdirectedError{Agent: d.Agent, Owner: a.cfg.Shards.Owner(d.Org)}
}

// initiatorElsewhere turns a granted send_message into a deny when its chain's
// initiator has a hard budget of an organization another replica owns. The
// reservations of that budget live in the owner's memory (only it decides the messages
// of the initiator's organization), so this replica cannot reserve on it: it would
// check the budget against its own reservations only, and N replicas could pass it N
// times. Rather than enforce a hard budget loosely, the decision is refused, and says
// why; what it took is given back. Spend is not the problem (every replica follows the
// stream, policy/replica), reservations are. A soft budget only alerts, so it does not
// refuse. With one replica (no Shards) every budget is held here and this never applies.
func (a *API) initiatorElsewhere(d *policy.Decision, in any) {
	m := messageOf(in)
	if !d.Allow || m == nil || m.Chain == nil || m.Chain.Initiator == "" {
		return
	}
	c := m.Chain
	org, ok := a.cfg.Engine.Directory().InitiatorOrg(c.Initiator, c.InitiatorType, d.Org)
	if !ok || a.cfg.Shards.Owns(org) {
		return
	}
	b, hard := a.cfg.Engine.Ledger().HardBudget(org, policy.ScopeInitiator, c.Initiator)
	if !hard {
		return
	}
	a.giveBack(d, in)
	d.Allow, d.RetryAfterMs = false, 0
	d.Reasons = []policy.Reason{{Code: policy.CodeInitiatorBudgetElsewhere, Message: fmt.Sprintf(
		"initiator %s has the hard budget %s of organization %s, whose reservations the policy replica %s holds; this replica (%s) decides agent %s of organization %s and does not reserve across replicas, so it refuses (policy/README.md, \"Budgets by initiator\")",
		c.Initiator, b.ID, org, a.cfg.Shards.Owner(org), a.cfg.Shards.Self(), d.Agent, d.Org)}}
}

// writeMisdirected answers 421 Misdirected Request with the owner, in a header and in
// the body. Only an authenticated, authorized request gets here (the router role,
// and an organization's key only for its own agents), so the owner of an organization
// is told only to who may ask about it.
func (a *API) writeMisdirected(w http.ResponseWriter, e *MisdirectedError) {
	w.Header().Set(OwnerHeader, e.Owner)
	keys.WriteJSON(w, http.StatusMisdirectedRequest, MisdirectedBody{
		ErrorBody: keys.ErrorBody{Error: e.Error(), Code: CodeMisdirected}, Owner: e.Owner, Message: e.Error(),
	})
}

// ownedCrossings writes budget.crossed only for organizations this replica owns. Every
// replica follows the whole stream, so each sees every organization's spend and would
// report the same crossing; the owner also holds the reservations, so its report is the
// one that counts them.
type ownedCrossings struct {
	Auditor
	shards *shard.Shards
}

func (o ownedCrossings) Produce(ctx context.Context, events []schema.Event) error {
	kept := events[:0:0]
	for _, ev := range events {
		if ev.Type == schema.TypeBudgetCrossed && !o.shards.Owns(ev.OrgID) {
			continue
		}
		kept = append(kept, ev)
	}
	if len(kept) == 0 {
		return nil
	}
	return o.Auditor.Produce(ctx, kept)
}
