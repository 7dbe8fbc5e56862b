package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema"
)

// BudgetRow is a budget after one budget.set or budget.deleted event
// (schema/chdb/migrations/005_budgets.sql). Data is the event's data: the budget as the
// policy side wrote it, which the policy replica decodes and checks again.
type BudgetRow struct {
	OrgID, BudgetID string
	Deleted         bool
	Data            string
	UpdatedAt       time.Time
	EventID         string
	Version         uint64
}

// BudgetsOf derives the budget rows of events: those of bandplane's own budget events
// (the collector refuses budget.* from every client) whose data names a budget of the
// event's organization. Within the batch only the latest row of each budget is kept.
func BudgetsOf(events []EventRow) []BudgetRow {
	var out []BudgetRow
	at := map[[2]string]int{}
	for i := range events {
		e := &events[i]
		if e.Type != schema.TypeBudgetSet && e.Type != schema.TypeBudgetDeleted || !schema.OwnSource(e.Source) || e.OrgID == "" {
			continue
		}
		var b struct {
			ID  string `json:"id"`
			Org string `json:"org"`
		}
		if json.Unmarshal([]byte(e.Data), &b) != nil || b.ID == "" || len(b.ID) > schema.MaxIDBytes || b.Org != e.OrgID {
			continue
		}
		r := BudgetRow{OrgID: e.OrgID, BudgetID: b.ID, Deleted: e.Type == schema.TypeBudgetDeleted, Data: e.Data,
			UpdatedAt: e.Time, EventID: e.ID, Version: version(e.Time, e.Offset)}
		k := [2]string{r.OrgID, r.BudgetID}
		if j, ok := at[k]; ok {
			if out[j].Version <= r.Version {
				out[j] = r
			}
			continue
		}
		at[k] = len(out)
		out = append(out, r)
	}
	return out
}

func (s *Store) insertBudgets(ctx context.Context, rows []BudgetRow) error {
	return s.send(ctx, "budgets", "org_id, budget_id, deleted, data, updated_at, event_id, version", len(rows), nil,
		func(b driver.Batch, i int) error {
			r := &rows[i]
			return b.Append(r.OrgID, r.BudgetID, b2u(r.Deleted), r.Data, r.UpdatedAt, r.EventID, r.Version)
		})
}

// Budgets returns the latest row of every budget (deleted ones included: the caller
// decides), of org or of every organization when org is "".
func (s *Store) Budgets(ctx context.Context, org string) ([]BudgetRow, error) {
	rows, err := s.conn.Query(ctx, `SELECT org_id, budget_id, deleted, data, updated_at, event_id, version
		FROM `+s.db+`.budgets FINAL WHERE ? = '' OR org_id = ? ORDER BY org_id, budget_id`, org, org)
	if err != nil {
		return nil, fmt.Errorf("cannot read budgets from %s.budgets: %w", s.db, err)
	}
	defer rows.Close()
	var out []BudgetRow
	for rows.Next() {
		var r BudgetRow
		var deleted uint8
		if err := rows.Scan(&r.OrgID, &r.BudgetID, &deleted, &r.Data, &r.UpdatedAt, &r.EventID, &r.Version); err != nil {
			return nil, fmt.Errorf("cannot read budgets: %w", err)
		}
		r.Deleted = deleted == 1
		out = append(out, r)
	}
	return out, rows.Err()
}
