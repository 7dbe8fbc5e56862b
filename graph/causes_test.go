package graph_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/query"
)

// Every argument of the initiator fields is bounded, and a bad one is refused as
// BAD_USER_INPUT naming it.
func TestCausationArgumentsAreBounded(t *testing.T) {
	fq := &fakeQuerier{}
	h := newHandler(fq)
	const rng = `from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z"`
	long := strings.Repeat("x", 257)
	for _, tc := range []struct{ name, q, want string }{
		{"grouped by initiator", `{ costs(orgId: "org-a", ` + rng + `, groupBy: [INITIATOR, INITIATOR_OWNER, CHAIN_DEPTH], filter: {initiatorIds: ["alice"], chainDepths: [0, 2]}) { rows { initiatorId initiatorHandle initiatorName initiatorOwnerId chainDepth } } }`, ""},
		{"negative depth", `{ costs(orgId: "org-a", ` + rng + `, filter: {chainDepths: [-1]}) { rows { cost } } }`, "filter.chain_depths: value 0 must be 0 to 65535, got -1"},
		{"depth past the column", `{ costs(orgId: "org-a", ` + rng + `, filter: {chainDepths: [65536]}) { rows { cost } } }`, "filter.chain_depths: value 0 must be 0 to 65535, got 65536"},
		{"empty initiator", `{ costs(orgId: "org-a", ` + rng + `, filter: {initiatorIds: [""]}) { rows { cost } } }`, "filter.initiator_ids: value 0 must be 1 to 256 bytes, got 0"},
		{"long initiator owner", `{ usageSeries(orgId: "org-a", ` + rng + `, interval: HOUR, split: INITIATOR, filter: {initiatorOwnerIds: ["` + long + `"]}) { key } }`, "filter.initiator_owner_ids: value 0 must be 1 to 256 bytes, got 257"},
		{"series by depth", `{ usageSeries(orgId: "org-a", ` + rng + `, interval: DAY, split: CHAIN_DEPTH) { key } }`, ""},
		{"delegation of nothing", `{ delegation(orgId: "org-a") { initiatorId } }`, "execution_id: one of execution_id and message_id is required"},
		{"delegation of both", `{ delegation(orgId: "org-a", executionId: "x", messageId: "m") { initiatorId } }`, "message_id: give execution_id or message_id, not both"},
		{"long execution", `{ delegation(orgId: "org-a", executionId: "` + long + `") { initiatorId } }`, "execution_id: must be at most 256 bytes, got 257"},
		{"delegation range", `{ delegation(orgId: "org-a", executionId: "x", from: "2025-01-01T00:00:00Z", to: "2025-03-01T00:00:00Z") { initiatorId } }`, "from: the range is 1416h0m0s; at most 744h0m0s"},
		{"cross-owner owner", `{ crossOwnerSpend(orgId: "org-a", ` + rng + `, ownerId: "` + long + `") { truncated } }`, "owner_id: must be at most 256 bytes, got 257"},
		{"cross-owner range", `{ crossOwnerSpend(orgId: "org-a", from: "2025-03-02T00:00:00Z", to: "2025-03-01T00:00:00Z") { truncated } }`, "to: must be after from (from 2025-03-02T00:00:00Z, to 2025-03-01T00:00:00Z)"},
		{"cross-owner limit", `{ crossOwnerSpend(orgId: "org-a", ` + rng + `, limit: 10001) { truncated } }`, "limit: must be between 1 and 10000, got 10001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, errs := post(t, h, gqlBody(tc.q), nil)
			require.Equal(t, http.StatusOK, status)
			if tc.want == "" {
				assert.Empty(t, errs)
				if tc.name == "grouped by initiator" {
					assert.Equal(t, []string{query.DimInitiator, query.DimInitiatorOwner, query.DimChainDepth}, fq.gotCost.GroupBy)
				}
				return
			}
			require.Len(t, errs, 1)
			assert.Equal(t, tc.want, errs[0].Message)
			assert.Equal(t, "BAD_USER_INPUT", errs[0].Extensions["code"])
		})
	}
}

// Another organization's key reads none of it.
func TestCausationFieldsAreTenantScoped(t *testing.T) {
	h := newHandler(&fakeQuerier{})
	for _, q := range []string{
		`{ delegation(orgId: "org-a", executionId: "x") { initiatorId } }`,
		`{ crossOwnerSpend(orgId: "org-a", from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { truncated } }`,
	} {
		_, errs := post(t, h, gqlBody(q), http.Header{"Authorization": {"Bearer tok-b-compliance"}})
		require.Len(t, errs, 1, q)
		assert.Equal(t, "FORBIDDEN", errs[0].Extensions["code"], q)
	}
}
