package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Rollup keeps the hourly cost rollup current: the consumer marks the hours each batch
// touched, and Run rebuilds them from usage facts every interval. It also reprices the
// unpriced usage of agents whose registration arrived after their usage.
type Rollup struct {
	store    *store.Store
	dir      *directory.Directory
	catalog  pricing.Source
	interval time.Duration
	log      *slog.Logger
	m        *Metrics

	mu     sync.Mutex
	dirty  map[store.HourKey]bool
	agents map[AgentKey]bool
}

// AgentKey names a registered agent: the organization that registered it and its id.
// A late reprice is of one agent so named, never of an agent id alone: usage of
// another organization may name the same id.
type AgentKey struct{ OrgID, AgentID string }

// NewRollup returns a Rollup that reprices with the catalog cat gives at each tick.
func NewRollup(st *store.Store, dir *directory.Directory, cat pricing.Source, interval time.Duration, log *slog.Logger, m *Metrics) *Rollup {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	return &Rollup{store: st, dir: dir, catalog: cat, interval: interval, log: log.With("component", "rollup"), m: m,
		dirty: map[store.HourKey]bool{}, agents: map[AgentKey]bool{}}
}

// Mark records work for the next tick; it matches Config.AfterFlush.
func (r *Rollup) Mark(hours []store.HourKey, reprice []AgentKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range hours {
		r.dirty[h] = true
	}
	for _, a := range reprice {
		r.agents[a] = true
	}
}

// CatchUp marks the hours a previous process may have left unbuilt (it stopped
// between writing a batch and rebuilding the batch's hours).
func (r *Rollup) CatchUp(ctx context.Context) error {
	hours, err := r.store.StaleHours(ctx, time.Minute+2*r.interval)
	if err != nil {
		return err
	}
	r.Mark(hours, nil)
	if len(hours) > 0 {
		r.log.Info("rebuilding rollup hours written since the last rebuild", "hours", len(hours))
	}
	// Days whose hours were rebuilt after them (a stop between the two writes): rebuilt
	// now, from the hours (the last 35 days: a reprice rebuilds the days it touches).
	days, err := r.store.StaleDays(ctx, time.Now().Add(-35*24*time.Hour))
	if err != nil {
		return err
	}
	for _, d := range days {
		if err := r.store.RefreshDays(ctx, d.OrgID, []time.Time{d.Day}); err != nil {
			return err
		}
	}
	if len(days) > 0 {
		r.log.Info("rebuilt daily rollup days older than their hours", "days", len(days))
	}
	return nil
}

// CatchUpEvery is how often Run looks for hours another process left unbuilt: with
// several ingest processes in one group, one that dies between storing a batch (and
// committing it) and rebuilding the batch's hours leaves them to nobody, since the
// records are not delivered again. It is less than CatchUp's margin (a minute and two
// intervals), so every such hour is found by the next look of a process still running.
// A look reads usage's version column (not in the primary key): measured on 18.16, about
// 1.9M usage rows in 0.17 s, so at billions of rows per shard it must be narrowed
// (deploy/README.md, "Running on a cluster", capacity model).
const CatchUpEvery = 30 * time.Second

// Run catches up, then rebuilds marked hours every interval until ctx ends, then once
// more; it catches up again every CatchUpEvery.
func (r *Rollup) Run(ctx context.Context) error {
	catchUp := func() {
		if err := r.CatchUp(ctx); err != nil && ctx.Err() == nil {
			r.m.RollupErrors.Inc()
			r.log.Warn("cannot find stale rollup hours; rebuilding only what this process writes", "err", err)
		}
	}
	catchUp()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	c := time.NewTicker(CatchUpEvery)
	defer c.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			return r.Flush(fctx)
		case <-c.C:
			catchUp()
		case <-t.C:
			if err := r.Flush(ctx); err != nil && ctx.Err() == nil {
				r.m.RollupErrors.Inc()
				r.log.Warn("cannot rebuild rollup, will retry", "err", err)
			}
		}
	}
}

// Flush does the pending work now. What fails stays marked.
func (r *Rollup) Flush(ctx context.Context) error {
	r.mu.Lock()
	agents := r.agents
	r.agents = map[AgentKey]bool{}
	r.mu.Unlock()
	var errs []error
	for a := range agents {
		// The agent's usage is its organization's and the unattributed usage of its id
		// (registeredModel says why); no other organization's is read.
		orgs := []string{a.OrgID}
		if a.OrgID != "" {
			orgs = append(orgs, "")
		}
		res, err := Reprice(ctx, r.store, r.dir, r.catalog.Current(), store.UsageFilter{OrgIDs: orgs, AgentID: a.AgentID, UnpricedOnly: true})
		if err != nil {
			r.Mark(nil, []AgentKey{a})
			errs = append(errs, fmt.Errorf("cannot reprice usage of agent %q of org %q: %w", a.AgentID, a.OrgID, err))
			continue
		}
		r.m.Repriced.Add(float64(res.Changed))
		if res.Changed > 0 {
			r.log.Info("repriced usage of a newly registered agent", "org_id", a.OrgID, "agent_id", a.AgentID, "rows", res.Changed)
		}
	}
	r.mu.Lock()
	byOrg := map[string][]store.HourKey{}
	for k := range r.dirty {
		byOrg[k.OrgID] = append(byOrg[k.OrgID], k)
	}
	r.dirty = map[store.HourKey]bool{}
	r.mu.Unlock()
	// One organization at a time, so that one that fails does not hold back the others.
	for org, keys := range byOrg {
		err := r.store.RefreshRollup(ctx, keys)
		switch {
		case err == nil:
		case store.Permanent(err):
			// Retrying cannot help (the caps on tokens and prices make an overflow
			// impossible, so this is a bug or a hand-edited table): say so loudly and
			// drop the hours rather than retry them every tick forever.
			r.m.RollupErrors.Inc()
			r.log.Error("clickhouse refuses the rollup rebuild; these hours stay as they are until a reprice rebuilds them",
				"err", err, "org_id", org, "hours", len(keys))
		default:
			r.Mark(keys, nil)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RepriceResult says what a reprice changed.
type RepriceResult struct {
	Scanned        int    `json:"scanned"`
	Changed        int    `json:"changed"`
	CostBefore     int64  `json:"cost_micros_before"`
	CostAfter      int64  `json:"cost_micros_after"`
	StillUnpriced  int    `json:"still_unpriced"`
	CatalogVersion string `json:"catalog_version"`
	HoursRebuilt   int    `json:"hours_rebuilt"`
}

// Reprice recomputes the cost of the usage facts that f selects with the catalog src
// gives now (each row at the price in effect at its time; and, for usage whose model
// was unknown, with the model of its agent as registered in its organization,
// registeredModel), writes the rows that changed with a higher version so they replace
// the old ones, and rebuilds the rollup hours they fall in. Running it twice changes
// nothing the second time. Ingest uses it for the usage of late registrations; reprice
// jobs use RepriceRange, which never leaves an hour half rewritten.
func Reprice(ctx context.Context, st *store.Store, dir *directory.Directory, src pricing.Source, f store.UsageFilter) (RepriceResult, error) {
	cat := src.Current()
	res := RepriceResult{CatalogVersion: cat.Version()}
	hours := map[store.HourKey]bool{}
	err := st.ScanUsage(ctx, f, 50000, func(rows []store.UsageRow) error {
		var changed []store.UsageRow
		for _, old := range rows {
			res.Scanned++
			res.CostBefore += old.CostMicros
			nr := old
			if m, ok := registeredModel(dir, nr); ok {
				nr.Model = m
			}
			nr = PriceUsage(cat, nr, nil)
			nr.Version = max(nr.Version, old.Version+1) // replaces old even behind a clock ahead of ours
			res.CostAfter += nr.CostMicros
			if !nr.Priced {
				res.StillUnpriced++
			}
			if nr.Model == old.Model && nr.CostMicros == old.CostMicros && nr.Priced == old.Priced &&
				nr.Currency == old.Currency && nr.CatalogVersion == old.CatalogVersion {
				continue
			}
			changed = append(changed, nr)
			hours[store.HourKey{OrgID: nr.OrgID, Hour: nr.Time.Truncate(time.Hour)}] = true
		}
		if err := st.InsertUsage(ctx, changed); err != nil {
			return err
		}
		res.Changed += len(changed)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("cannot reprice: %w", err)
	}
	keys := make([]store.HourKey, 0, len(hours))
	for k := range hours {
		keys = append(keys, k)
	}
	res.HoursRebuilt = len(keys)
	if err := st.RefreshRollup(ctx, keys); err != nil {
		return res, fmt.Errorf("repriced %d rows but cannot rebuild the rollup: %w", res.Changed, err)
	}
	return res, nil
}

// RepriceRange reprices the usage of one organization (org "" is the unattributed
// usage) in [from, to), of one agent unless agent is "", with cat: each row at the
// price in effect at its time, usage of model "unknown" with the model of its agent as
// registered in its organization when there is one now (registeredModel). It is the
// unit of work of a reprice job:
//
//   - the usage is read (FINAL) in time order and the rows that change are written in
//     one insert per repriceChunk rows, cut at an hour's end (a day is one partition, and
//     an insert into one partition is one part, seen whole or not at all): a reader of
//     usage FINAL, and so a rollup rebuilt by ingest meanwhile, sees each hour (for a
//     range of a day of at most repriceChunk changed rows, the whole range) wholly at
//     its old prices or wholly at its new ones; only an hour of more than repriceChunk
//     changed rows of one organization is written in several inserts;
//   - each rewritten row keeps its key (org, time, event id) and gets a higher version,
//     so it replaces the old row (ReplacingMergeTree(version)): never a second row;
//   - then the rollup of every hour in the range that has usage (changed or not: a run
//     interrupted before its rebuild is finished by the next) is rebuilt from usage
//     FINAL, hourly then daily, one insert each for a day of one organization.
//
// A row is rewritten only when its model, cost, currency or pricedness change: a row
// whose cost is the same keeps the catalog version that priced it, which priced it
// alike. A row priced by a newer catalog version than cat's (ingest priced it after a
// later price change) is left as it is: a reprice never takes a row back to older
// prices. Running it twice changes nothing the second time.
func RepriceRange(ctx context.Context, st *store.Store, dir *directory.Directory, cat *pricing.Catalog, org, agent string, from, to time.Time) (RepriceResult, error) {
	res := RepriceResult{CatalogVersion: cat.Version()}
	catNum, catNumbered := catalogNumber(cat.Version())
	var hours []store.HourKey
	seen := map[time.Time]bool{}
	var pending []store.UsageRow // changed rows of whole hours, not written yet
	flush := func() error {
		if err := st.InsertUsage(ctx, pending); err != nil {
			return err
		}
		res.Changed += len(pending)
		pending = nil
		return nil
	}
	err := st.ScanUsageHours(ctx, org, agent, from, to, repriceChunk, func(hour time.Time, rows []store.UsageRow) error {
		if !seen[hour] {
			seen[hour] = true
			hours = append(hours, store.HourKey{OrgID: org, Hour: hour})
		}
		var changed []store.UsageRow
		for _, old := range rows {
			res.Scanned++
			res.CostBefore += old.CostMicros
			if n, ok := catalogNumber(old.CatalogVersion); ok && catNumbered && n > catNum {
				res.CostAfter += old.CostMicros
				if !old.Priced {
					res.StillUnpriced++
				}
				continue
			}
			nr := old
			if m, ok := registeredModel(dir, nr); ok {
				nr.Model = m
			}
			nr = PriceUsage(cat, nr, nil)
			nr.Version = max(nr.Version, old.Version+1)
			res.CostAfter += nr.CostMicros
			if !nr.Priced {
				res.StillUnpriced++
			}
			if nr.Model == old.Model && nr.CostMicros == old.CostMicros && nr.Priced == old.Priced && nr.Currency == old.Currency {
				continue
			}
			changed = append(changed, nr)
		}
		if len(pending)+len(changed) > repriceChunk {
			if err := flush(); err != nil {
				return err
			}
		}
		pending = append(pending, changed...)
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		// What was rewritten is rebuilt now if the server lets us, so that the rollup
		// agrees with usage; the caller runs the range again in any case.
		if len(hours) > 0 {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			_ = st.RefreshRollup(rctx, hours)
			cancel()
		}
		return res, fmt.Errorf("cannot reprice usage of org %q from %s: %w", org, from.UTC().Format(time.RFC3339), err)
	}
	res.HoursRebuilt = len(hours)
	if err := st.RefreshRollup(ctx, hours); err != nil {
		return res, fmt.Errorf("repriced %d rows of org %q but cannot rebuild the rollup: %w", res.Changed, org, err)
	}
	return res, nil
}

// registeredModel is the model the directory gives usage row r whose own model is
// unknown: that of the agent r names, as registered in r's organization. A row without
// organization ("") was stored so because its agent was not registered when it arrived
// (ingest/README.md, "Delivery and counting"), and the registration is what attributes an
// agent's events: such a row is the agent's wherever the directory now registers it,
// and takes that entry's model (it keeps org "", part of its key, so that a replay
// still collapses with it). A row of any other organization that names the same agent
// id is that organization's, not the registered agent's: it keeps model unknown.
func registeredModel(dir *directory.Directory, r store.UsageRow) (string, bool) {
	if r.Model != Unknown && r.Model != "" {
		return "", false
	}
	a, ok := dir.Agent(r.AgentID)
	if !ok || a.Model == "" || (r.OrgID != "" && r.OrgID != a.OrgID) {
		return "", false
	}
	return a.Model, true
}

// repriceChunk bounds the usage rows of one hour RepriceRange holds and writes at once.
const repriceChunk = 200_000

// catalogNumber reads a catalog version kept in ClickHouse ("1", "2", …; ingest/prices);
// a file catalog's version ("2026-11-01") is not one, and counts as older than all.
func catalogNumber(v string) (uint64, bool) {
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}
