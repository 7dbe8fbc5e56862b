package graph

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// Prices is what the price and job fields read and change: the platform-wide price
// catalog in ClickHouse, its re-pricing jobs, and the usage nobody priced. serve
// adapts the price service to it. Errors matching schema.ErrInvalid are the caller's
// mistakes; schema.ErrForbidden, a key that may not do it.
type Prices interface {
	UpsertPrice(ctx context.Context, by keys.Key, p PriceChange) (PriceInfo, error)
	Prices(ctx context.Context) ([]PriceInfo, error)
	StartReprice(ctx context.Context, by keys.Key, org string, from, to time.Time) (JobInfo, error)
	Jobs(ctx context.Context, org string, limit int) ([]JobInfo, error)
	UnpricedModels(ctx context.Context, org string, from, to time.Time, limit int) ([]UnpricedInfo, error)
}

// WithPrices serves the price and job fields through p.
func WithPrices(p Prices) Option { return func(c *config) { c.prices = p } }

// PriceChange is a price to add; empty optional fields take their defaults.
type PriceChange struct {
	Model, Input, Output, CacheRead, CacheWrite, Currency string
	Effective                                             time.Time
}

// PriceInfo is one price of the catalog (decimal strings per million tokens).
type PriceInfo struct {
	Model, Currency, Input, Output, CacheRead, CacheWrite, CatalogVersion string
	Effective                                                             time.Time
}

// JobInfo is one background job.
type JobInfo struct {
	ID, Kind, State, CatalogVersion, RequestedBy, Error string
	From, To, CreatedAt, StartedAt, FinishedAt          time.Time
	DaysDone, DaysTotal                                 int
	RowsScanned, RowsChanged                            int64
}

// UnpricedInfo is a model with usage but no price.
type UnpricedInfo struct {
	Model                                                  string
	Events                                                 int64
	Input, Output, CacheRead, CacheWrite, Reasoning, Total int64
	FirstSeen, LastSeen                                    time.Time
}

// pricers may change prices (a platform key besides, checked by Prices) and start
// re-pricing; the catalog and the jobs are read by managers too.
var (
	pricers      = []keys.Role{keys.RoleAdmin}
	priceReaders = []keys.Role{keys.RoleManager, keys.RoleAdmin}
)

const pricesOff = "the price service"

// The limits of jobs and unpricedModels: default and most.
const (
	DefaultJobsLimit, MaxJobsLimit         = 50, 500
	DefaultUnpricedLimit, MaxUnpricedLimit = 100, 1000
)

// limitOf is a list field's limit: def when not given (or 0), else within 1..most.
func limitOf(limit *int, def, most int) (int, error) {
	n := deref(limit)
	if n == 0 {
		n = def
	}
	if n < 1 || n > most {
		return 0, &schema.FieldError{Field: "limit", Reason: fmt.Sprintf("must be between 1 and %d", most)}
	}
	return n, nil
}

func (r *Resolver) upsertPrice(ctx context.Context, orgID *string, in model.PriceInput) (*model.Price, error) {
	// Prices are every organization's: orgId names none (a platform key need not give
	// one; another organization's is refused as everywhere), and the price service
	// admits platform keys only.
	k, err := r.authorizeKey(ctx, orgID, pricers)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	if r.prices == nil {
		return nil, unavailable(ctx, pricesOff)
	}
	p := PriceChange{Model: in.Model, Input: in.Input, Output: in.Output, CacheRead: deref(in.CacheRead),
		CacheWrite: deref(in.CacheWrite), Currency: deref(in.Currency), Effective: deref(in.Effective)}
	got, err := r.prices.UpsertPrice(ctx, k, p)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	m := priceModel(got)
	return &m, nil
}

func (r *Resolver) listPrices(ctx context.Context, orgID *string) ([]model.Price, error) {
	_, done, err := r.begin(ctx, orgID, priceReaders)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	defer done()
	if r.prices == nil {
		return nil, unavailable(ctx, pricesOff)
	}
	ps, err := r.prices.Prices(ctx)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	out := make([]model.Price, len(ps))
	for i, p := range ps {
		out[i] = priceModel(p)
	}
	return out, nil
}

func priceModel(p PriceInfo) model.Price {
	return model.Price{Model: p.Model, Currency: p.Currency, Input: p.Input, Output: p.Output, CacheRead: p.CacheRead,
		CacheWrite: p.CacheWrite, Effective: p.Effective, CatalogVersion: p.CatalogVersion}
}

func (r *Resolver) reprice(ctx context.Context, orgID *string, from, to time.Time) (*model.Job, error) {
	k, org, err := r.authorize(ctx, orgID, pricers)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	if r.prices == nil {
		return nil, unavailable(ctx, pricesOff)
	}
	j, err := r.prices.StartReprice(ctx, k, org, from, to)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	m := jobModel(j)
	return &m, nil
}

func (r *Resolver) jobs(ctx context.Context, orgID *string, limit *int) ([]model.Job, error) {
	org, done, err := r.begin(ctx, orgID, priceReaders)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	defer done()
	if r.prices == nil {
		return nil, unavailable(ctx, pricesOff)
	}
	n, err := limitOf(limit, DefaultJobsLimit, MaxJobsLimit)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	js, err := r.prices.Jobs(ctx, org, n)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	out := make([]model.Job, len(js))
	for i, j := range js {
		out[i] = jobModel(j)
	}
	return out, nil
}

func jobModel(j JobInfo) model.Job {
	return model.Job{ID: j.ID, Kind: j.Kind, State: model.JobState(strings.ToUpper(j.State)), From: j.From, To: j.To,
		DaysDone: j.DaysDone, DaysTotal: j.DaysTotal, RowsScanned: j.RowsScanned, RowsChanged: j.RowsChanged,
		CatalogVersion: optString(j.CatalogVersion), RequestedBy: optString(j.RequestedBy), CreatedAt: j.CreatedAt,
		StartedAt: optTime(j.StartedAt), FinishedAt: optTime(j.FinishedAt), Error: optString(j.Error)}
}

func (r *Resolver) unpricedModels(ctx context.Context, orgID *string, from, to *time.Time, limit *int) ([]model.UnpricedModelUsage, error) {
	org, done, err := r.begin(ctx, orgID, priceReaders)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	defer done()
	if r.prices == nil {
		return nil, unavailable(ctx, pricesOff)
	}
	now := time.Now().UTC()
	f, t := deref(from), deref(to)
	if t.IsZero() {
		t = now
	}
	if f.IsZero() {
		f = t.Add(-30 * 24 * time.Hour)
	}
	n, err := limitOf(limit, DefaultUnpricedLimit, MaxUnpricedLimit)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	us, err := r.prices.UnpricedModels(ctx, org, f, t, n)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	out := make([]model.UnpricedModelUsage, len(us))
	for i, u := range us {
		out[i] = model.UnpricedModelUsage{Model: u.Model, Events: u.Events, FirstSeen: u.FirstSeen, LastSeen: u.LastSeen,
			Tokens: &model.Tokens{Input: u.Input, Output: u.Output, CacheRead: u.CacheRead, CacheWrite: u.CacheWrite,
				Reasoning: u.Reasoning, Total: u.Total}}
	}
	return out, nil
}
