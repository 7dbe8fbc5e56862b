package query

import (
	"context"
	"errors"
	"time"
)

// CrossOwnerQuery asks for the spend of OrgID over [From, To) that one owner's requests
// caused on another owner's agents. With OwnerID, both directions of that owner: the
// spend on its agents that others caused, and the spend its requests caused on others'
// agents; without, every such pair of owners (CausedByOthers).
type CrossOwnerQuery struct {
	OrgID    string
	From, To time.Time
	OwnerID  string
	Limit    int // pairs per list; 0: DefaultCostLimit
}

// CrossOwnerSpend is the answer: rows with OwnerID (whose agents spent) and
// InitiatorOwnerID (whose request set it going) and their sums, most expensive first.
type CrossOwnerSpend struct {
	CausedByOthers  []CostRow
	CausedForOthers []CostRow
	Truncated       bool
}

func (q CrossOwnerQuery) costs() CostQuery {
	return CostQuery{OrgID: q.OrgID, From: q.From, To: q.To, GroupBy: []string{DimOwner, DimInitiatorOwner},
		Filter: CostFilter{CrossOwner: true}, Limit: q.Limit}
}

// Validate reports every problem of the query at once.
func (q CrossOwnerQuery) Validate() error {
	var errs []error
	if err := q.costs().Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(q.OwnerID) > 256 {
		errs = append(errs, fieldErr("owner_id", "must be at most 256 bytes, got %d", len(q.OwnerID)))
	}
	return errors.Join(errs...)
}

// CrossOwnerSpend reads q from the rollup, like Costs.
func (qr *Querier) CrossOwnerSpend(ctx context.Context, q CrossOwnerQuery) (CrossOwnerSpend, error) {
	if err := q.Validate(); err != nil {
		return CrossOwnerSpend{}, err
	}
	cq := q.costs()
	var out CrossOwnerSpend
	by := cq
	if q.OwnerID != "" {
		by.Filter.OwnerIDs = []string{q.OwnerID}
	}
	rep, err := qr.Costs(ctx, by)
	if err != nil {
		return out, err
	}
	out.CausedByOthers, out.Truncated = rep.Rows, rep.Truncated
	if q.OwnerID == "" {
		out.CausedForOthers = []CostRow{}
		return out, nil
	}
	caused := cq
	caused.Filter.InitiatorOwnerIDs = []string{q.OwnerID}
	if rep, err = qr.Costs(ctx, caused); err != nil {
		return out, err
	}
	out.CausedForOthers, out.Truncated = rep.Rows, out.Truncated || rep.Truncated
	return out, nil
}
