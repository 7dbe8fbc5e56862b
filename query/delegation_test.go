package query

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/schema"
)

func TestDelegationQueryValidate(t *testing.T) {
	to := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		q    DelegationQuery
		want string
	}{
		{DelegationQuery{OrgID: "o", ExecutionID: "x"}, ""},
		{DelegationQuery{OrgID: "o", MessageID: "m", From: to.Add(-MaxDelegationRange), To: to}, ""},
		{DelegationQuery{ExecutionID: "x"}, "org_id: required"},
		{DelegationQuery{OrgID: "o"}, "execution_id: one of execution_id and message_id is required"},
		{DelegationQuery{OrgID: "o", ExecutionID: "x", MessageID: "m"}, "message_id: give execution_id or message_id, not both"},
		{DelegationQuery{OrgID: "o", ExecutionID: strings.Repeat("x", 257)}, "execution_id: must be at most 256 bytes, got 257"},
		{DelegationQuery{OrgID: "o", MessageID: "m", From: to, To: to}, "to: must be after from"},
		{DelegationQuery{OrgID: "o", MessageID: "m", From: to.Add(-MaxDelegationRange - time.Hour), To: to}, "from: the range is 745h0m0s; at most 744h0m0s"},
	} {
		err := c.q.Validate()
		if c.want == "" {
			assert.NoError(t, err, "%+v", c.q)
			continue
		}
		assert.EqualError(t, err, c.want)
		assert.True(t, errors.Is(err, schema.ErrInvalid), "%v is schema.ErrInvalid", err)
	}
}

func TestCrossOwnerFilterSelectsOtherOwnersOnKeyColumns(t *testing.T) {
	w := &where{}
	CostFilter{CrossOwner: true, OwnerIDs: []string{"bob"}}.add(w)
	assert.Equal(t, "has(?, owner_id) AND owner_id != initiator_owner AND initiator_owner != ''", w.String())
}
