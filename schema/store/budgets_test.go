package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/schema"
)

func TestBudgetsOf(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ev := func(id, typ, org, source, data string, t time.Time, off int64) EventRow {
		return EventRow{ID: id, Type: typ, OrgID: org, Source: source, Data: data, Time: t, Offset: off}
	}
	set := `{"id":"bud_1","org":"org-a","scope":"org","scope_id":"org-a","period":"day","tokens":5,"hard":true}`
	rows := BudgetsOf([]EventRow{
		ev("e1", schema.TypeBudgetSet, "org-a", "bandplane-policy", set, at, 7),
		ev("e2", schema.TypeBudgetDeleted, "org-a", "bandplane-policy", set, at.Add(time.Second), 8),
		ev("e0", schema.TypeBudgetSet, "org-a", "bandplane-policy", set, at.Add(-time.Second), 9),           // older, later in the batch
		ev("f1", schema.TypeBudgetSet, "org-a", "router", `{"id":"bud_2","org":"org-a"}`, at, 10),           // not bandplane's
		ev("f2", schema.TypeBudgetSet, "org-a", "bandplane-policy", `{"id":"bud_3","org":"org-b"}`, at, 11), // another org's budget
		ev("f3", schema.TypeBudgetSet, "org-a", "bandplane-policy", `{"org":"org-a"}`, at, 12),              // no id
		ev("f4", schema.TypeBudgetSet, "org-a", "bandplane-policy", `{bad`, at, 13),
		ev("m1", schema.TypeMessageCreated, "org-a", "bandplane-policy", set, at, 14),
	})
	assert.Equal(t, []BudgetRow{{OrgID: "org-a", BudgetID: "bud_1", Deleted: true, Data: set, UpdatedAt: at.Add(time.Second),
		EventID: "e2", Version: version(at.Add(time.Second), 8)}}, rows, "the latest change of the budget, only bandplane's own")
}
