package api

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// SetBudget validates b, records it as a budget.set event (the trail and every policy
// replica learn it from there) and puts it in force here at once. An organization's key
// sets budgets of its own organization only; the scope's agent or owner must be
// registered in it (a room is any room id: its spend counts only usage of the
// organization). An initiator is any id: a person or an agent registered in the
// organization (whose budget counts what they set going anywhere), or else a system's
// source ("schedule", "webhook:github"), counting what it sets going in the
// organization; like a room, it is not looked up, so that the answer tells nothing of
// other organizations. The answer is the budget as stored.
func (a *API) SetBudget(ctx context.Context, by keys.Key, b policy.Budget) (policy.Budget, error) {
	if !by.MayActOn(b.Org) {
		return policy.Budget{}, fmt.Errorf("%w: key %s (%s) of organization %s may not set budgets of organization %q", schema.ErrForbidden, by.ID, by.Role, by.Org, b.Org)
	}
	b.Normalize()
	b.UpdatedAt, b.UpdatedBy = time.Now().UTC(), by.ID
	if err := b.Validate(); err != nil {
		return policy.Budget{}, fmt.Errorf("%w: %w", schema.ErrInvalid, err)
	}
	if b.Scope == policy.ScopeAgent || b.Scope == policy.ScopeOwner {
		if org, ok := a.cfg.Engine.Directory().OrgOf(b.ScopeID); !ok || org != b.Org {
			// The same answer for another organization's id: no existence oracle.
			return policy.Budget{}, fmt.Errorf("%w: %s %q is not registered in organization %s", schema.ErrNotFound, b.Scope, b.ScopeID, b.Org)
		}
	}
	ledger := a.cfg.Engine.Ledger()
	if _, exists := ledger.Budget(b.ID); !exists && ledger.Count(b.Org) >= policy.MaxBudgetsPerOrg {
		return policy.Budget{}, fmt.Errorf("%w: organization %s has %d budgets, the most it may have; delete one first", schema.ErrInvalid, b.Org, policy.MaxBudgetsPerOrg)
	}
	if err := a.record(ctx, budgetEvent(schema.TypeBudgetSet, b, by)); err != nil {
		return policy.Budget{}, fmt.Errorf("%w; the budget is not set", err)
	}
	a.cfg.Engine.Ledger().Set(b, time.Now())
	a.log.Info("budget set", "budget_id", b.ID, "org", b.Org, "scope", b.Scope, "scope_id", b.ScopeID, "period", b.Period,
		"tokens", b.Tokens, "cost_micros", b.CostMicros, "hard", b.Hard, "key_id", by.ID)
	return b, nil
}

// DeleteBudget removes the budget id of org, recorded as budget.deleted.
func (a *API) DeleteBudget(ctx context.Context, by keys.Key, org, id string) (policy.Budget, error) {
	if !by.MayActOn(org) {
		return policy.Budget{}, fmt.Errorf("%w: key %s (%s) of organization %s may not delete budgets of organization %q", schema.ErrForbidden, by.ID, by.Role, by.Org, org)
	}
	b, ok := a.cfg.Engine.Ledger().Budget(id)
	if !ok || b.Org != org {
		return policy.Budget{}, fmt.Errorf("%w: organization %s has no budget %q", schema.ErrNotFound, org, id)
	}
	b.UpdatedAt, b.UpdatedBy = time.Now().UTC(), by.ID
	if err := a.record(ctx, budgetEvent(schema.TypeBudgetDeleted, b, by)); err != nil {
		return policy.Budget{}, fmt.Errorf("%w; the budget stays", err)
	}
	a.cfg.Engine.Ledger().Delete(id, b.UpdatedAt)
	a.log.Info("budget deleted", "budget_id", id, "org", org, "key_id", by.ID)
	return b, nil
}

// Budgets returns org's budgets with their spend, reservations and projection now.
func (a *API) Budgets(org string) []policy.BudgetStatus {
	return a.cfg.Engine.Ledger().Budgets(org, time.Now())
}

// record writes bandplane's own events to the trail, waiting for Kafka's
// acknowledgement; without an auditor (the CLI's offline engine) nothing is written.
func (a *API) record(ctx context.Context, events ...schema.Event) error {
	if a.cfg.Auditor == nil {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, a.cfg.AuditTimeout)
	defer cancel()
	if err := a.cfg.Auditor.Produce(actx, events); err != nil {
		a.auditErrs.Inc()
		// The cause (broker addresses, Kafka's own words) goes to the log, not to the caller.
		a.log.Error("cannot write bandplane's own events to the trail", "type", events[0].Type, "event_id", events[0].ID, "err", err)
		return fmt.Errorf("%w: cannot record the change in the audit trail (Kafka does not acknowledge; the server log says why)", schema.ErrUnavailable)
	}
	return nil
}

// BudgetEvent is the budget.set or budget.deleted event of b, by the key by: the budget
// is the data. The CLI writes the same events.
func BudgetEvent(typ string, b policy.Budget, by keys.Key) schema.Event {
	return budgetEvent(typ, b, by)
}

func budgetEvent(typ string, b policy.Budget, by keys.Key) schema.Event {
	data, _ := json.Marshal(b)
	return schema.Event{
		ID: schema.NewID(), Type: typ, Time: b.UpdatedAt, OrgID: b.Org,
		Actor:   operator(by),
		Subject: &schema.Party{ID: b.ScopeID, Type: budgetSubject(b.Scope)},
		Source:  SourcePolicy, SchemaVersion: schema.Version, Data: data,
	}
}

func budgetSubject(s policy.BudgetScope) schema.ActorType {
	switch s {
	case policy.ScopeAgent:
		return schema.ActorAgent
	case policy.ScopeOwner, policy.ScopeInitiator: // an initiator is most often a person
		return schema.ActorUser
	}
	return schema.ActorSystem
}

// CrossedData is the data of budget.crossed.
type CrossedData = policy.Crossing

// RunCrossings writes a budget.crossed event for every crossing the ledger reports,
// until ctx ends. Decisions never wait for it: the ledger drops crossings when this
// falls behind (counted), and a failed write is logged and retried once.
func (a *API) RunCrossings(ctx context.Context) {
	ch := a.cfg.Engine.Ledger().Crossings()
	for {
		select {
		case <-ctx.Done():
			return
		case x := <-ch:
			ev := crossedEvent(x)
			err := a.record(ctx, ev)
			if err != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				err = a.record(ctx, ev)
			}
			if err != nil {
				a.log.Error("cannot record a budget crossing", "budget_id", x.Budget.ID, "threshold", x.Threshold, "err", err)
				continue
			}
			a.log.Info("budget crossed", "budget_id", x.Budget.ID, "org", x.Budget.Org, "threshold", x.Threshold, "hard", x.Budget.Hard)
		}
	}
}

func crossedEvent(x policy.Crossing) schema.Event {
	data, _ := json.Marshal(x)
	return schema.Event{
		ID: schema.NewID(), Type: schema.TypeBudgetCrossed, Time: x.At, OrgID: x.Budget.Org,
		Actor:   schema.Party{ID: SourcePolicy, Type: schema.ActorSystem},
		Subject: &schema.Party{ID: x.Budget.ScopeID, Type: budgetSubject(x.Budget.Scope)},
		Source:  SourcePolicy, SchemaVersion: schema.Version, Data: data,
	}
}

// SetSuspended suspends or resumes an agent for an operator, with the semantics of
// POST /v1/agents/{id}/suspend|resume (which go through it): the directory changes at
// once (the next decision sees it), the change is recorded as agent.suspended or
// agent.resumed (bandplane's own types, which the replicas replay: the suspension
// survives restarts and no agent.updated from the platform lifts it), and a
// suspension also sends the routing core an agent.control stop event. A resume that
// cannot be recorded is undone (no unaudited grant); a suspension stays in force
// either way. It returns the ids of the events written.
func (a *API) SetSuspended(ctx context.Context, by keys.Key, id string, suspended bool, reason string) (policy.Agent, []string, error) {
	dir := a.cfg.Engine.Directory()
	ag, ok := dir.Agent(id)
	if !ok || !by.MayActOn(ag.Org) {
		// The same answer for another organization's agent: no existence oracle.
		return policy.Agent{}, nil, fmt.Errorf("%w: agent %q is not in the directory of this key's organization", schema.ErrNotFound, id)
	}
	if len(reason) > MaxReasonBytes {
		return policy.Agent{}, nil, fmt.Errorf("%w: reason is %d bytes long, more than %d", schema.ErrInvalid, len(reason), MaxReasonBytes)
	}
	if !utf8.ValidString(reason) {
		return policy.Agent{}, nil, fmt.Errorf("%w: reason is not valid UTF-8", schema.ErrInvalid)
	}
	if err := dir.Suspend(ctx, id, suspended); err != nil {
		return policy.Agent{}, nil, err
	}
	events := []schema.Event{operatorAction(ag, suspended, reason, by)}
	if suspended {
		events = append(events, agentControl(ag, "stop", reason, by))
	}
	if err := a.record(ctx, events...); err != nil {
		if !suspended {
			_ = dir.Suspend(context.WithoutCancel(ctx), id, true)
		}
		return policy.Agent{}, nil, fmt.Errorf("%w (the agent is suspended)", err)
	}
	a.log.Info("agent suspension changed by operator", "agent_id", id, "suspended", suspended, "reason", reason, "key_id", by.ID)
	ag, _ = dir.Agent(id)
	return ag, eventIDs(events), nil
}
