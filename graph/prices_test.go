package graph_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// fakePrices records what it was asked; like the price service, only a platform key
// may change prices.
type fakePrices struct {
	gotOrg   string
	gotLimit int
	gotBy    keys.Key
}

func (f *fakePrices) UpsertPrice(_ context.Context, by keys.Key, p graph.PriceChange) (graph.PriceInfo, error) {
	f.gotBy = by
	if !by.Platform() {
		return graph.PriceInfo{}, fmt.Errorf("prices are every organization's: %w", schema.ErrForbidden)
	}
	return graph.PriceInfo{Model: p.Model, Currency: "USD", Input: p.Input, Output: p.Output, CatalogVersion: "2"}, nil
}

func (f *fakePrices) Prices(context.Context) ([]graph.PriceInfo, error) {
	return []graph.PriceInfo{{Model: "m", Currency: "USD", Input: "1", Output: "2", CatalogVersion: "1"}}, nil
}

func (f *fakePrices) StartReprice(_ context.Context, by keys.Key, org string, from, to time.Time) (graph.JobInfo, error) {
	f.gotBy, f.gotOrg = by, org
	return graph.JobInfo{ID: "job-1", Kind: "reprice", State: "queued", From: from, To: to, CreatedAt: from}, nil
}

func (f *fakePrices) Jobs(_ context.Context, org string, limit int) ([]graph.JobInfo, error) {
	f.gotOrg, f.gotLimit = org, limit
	return []graph.JobInfo{{ID: "job-1", Kind: "reprice", State: "running"}}, nil
}

func (f *fakePrices) UnpricedModels(_ context.Context, org string, _, _ time.Time, limit int) ([]graph.UnpricedInfo, error) {
	f.gotOrg, f.gotLimit = org, limit
	return []graph.UnpricedInfo{{Model: "new-model", Events: 3, Total: 30}}, nil
}

func TestPriceFields(t *testing.T) {
	fp := &fakePrices{}
	ks := fakeKeys{
		"tok-a-admin":   {ID: "k-a-admin", Org: "org-a", Role: keys.RoleAdmin},
		"tok-a-manager": {ID: "k-a-mgr", Org: "org-a", Role: keys.RoleManager},
		"tok-a-viewer":  {ID: "k-a-view", Org: "org-a", Role: keys.RoleViewer},
		"tok-admin":     {ID: "k-admin", Org: keys.PlatformOrg, Role: keys.RoleAdmin},
	}
	h := graph.NewHandler(&fakeQuerier{}, ks, graph.WithPrices(fp))

	// Happy: a platform admin sets a price without orgId; managers read jobs and models.
	a := ask(t, h, "tok-admin", `mutation { upsertPrice(price: {model: "m", input: "1.5", output: "6"}) { model input catalogVersion } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `{"model":"m","input":"1.5","catalogVersion":"2"}`, string(a.Data["upsertPrice"]))
	a = ask(t, h, "tok-a-manager", `{ jobs { id state } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `[{"id":"job-1","state":"RUNNING"}]`, string(a.Data["jobs"]))
	assert.Equal(t, [2]any{"org-a", graph.DefaultJobsLimit}, [2]any{fp.gotOrg, fp.gotLimit})
	a = ask(t, h, "tok-a-manager", `{ unpricedModels(limit: 5) { model events tokens { total } } }`)
	require.Empty(t, a.Errors)
	assert.Equal(t, 5, fp.gotLimit)
	a = ask(t, h, "tok-a-admin", `mutation { reprice(from: "2026-11-01T00:00:00Z", to: "2026-11-02T00:00:00Z") { id state } }`)
	require.Empty(t, a.Errors)
	assert.Equal(t, "org-a", fp.gotOrg, "an organization's admin reprices its own organization")

	// Hostile: wrong role, another tenant, out-of-range limits, an organization's admin
	// changing every tenant's prices.
	for name, tc := range map[string]struct{ token, q, code, msg string }{
		"org admin sets a price":  {"tok-a-admin", `mutation { upsertPrice(price: {model: "m", input: "1", output: "1"}) { model } }`, "FORBIDDEN", "every organization's"},
		"manager sets a price":    {"tok-a-manager", `mutation { upsertPrice(price: {model: "m", input: "1", output: "1"}) { model } }`, "FORBIDDEN", "needs one of admin"},
		"price aimed elsewhere":   {"tok-a-admin", `mutation { upsertPrice(orgId: "org-b", price: {model: "m", input: "1", output: "1"}) { model } }`, "FORBIDDEN", ""},
		"manager reprices":        {"tok-a-manager", `mutation { reprice(from: "2026-11-01T00:00:00Z", to: "2026-11-02T00:00:00Z") { id } }`, "FORBIDDEN", ""},
		"reprice another tenant":  {"tok-a-admin", `mutation { reprice(orgId: "org-b", from: "2026-11-01T00:00:00Z", to: "2026-11-02T00:00:00Z") { id } }`, "FORBIDDEN", ""},
		"viewer reads jobs":       {"tok-a-viewer", `{ jobs { id } }`, "FORBIDDEN", ""},
		"jobs of another tenant":  {"tok-a-manager", `{ jobs(orgId: "org-b") { id } }`, "FORBIDDEN", ""},
		"jobs limit too big":      {"tok-a-manager", `{ jobs(limit: 501) { id } }`, "BAD_USER_INPUT", "limit: must be between 1 and 500"},
		"jobs limit negative":     {"tok-a-manager", `{ jobs(limit: -1) { id } }`, "BAD_USER_INPUT", "limit: must be between 1 and 500"},
		"unpriced limit too big":  {"tok-a-manager", `{ unpricedModels(limit: 1001) { model } }`, "BAD_USER_INPUT", "limit: must be between 1 and 1000"},
		"platform jobs no orgId":  {"tok-admin", `{ jobs { id } }`, "BAD_USER_INPUT", "orgId"},
		"viewer reads the prices": {"tok-a-viewer", `{ prices { model } }`, "FORBIDDEN", ""},
	} {
		a := ask(t, h, tc.token, tc.q)
		assert.Equal(t, tc.code, code(a), "%s: %+v", name, a.Errors)
		if tc.msg != "" && len(a.Errors) > 0 {
			assert.True(t, strings.Contains(a.Errors[0].Message, tc.msg), "%s: %q", name, a.Errors[0].Message)
		}
		for field, v := range a.Data {
			assert.Equal(t, "null", string(v), "%s: %s has data", name, field)
		}
	}

	// Without the price service: UNAVAILABLE.
	off := graph.NewHandler(&fakeQuerier{}, ks)
	assert.Equal(t, "UNAVAILABLE", code(ask(t, off, "tok-a-manager", `{ jobs { id } }`)))
}
