package query

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// PlatformOrg, as the org of UnpricedModels, reads every organization (the caller must
// have checked that the key is a platform key, whose organization it is).
const PlatformOrg = "*"

// Bounds of UnpricedModels.
const (
	DefaultUnpricedLimit = 100
	MaxUnpricedLimit     = 1000
	MaxUnpricedRange     = 400 * 24 * time.Hour
)

// UnpricedModel is a model whose usage in a range has no price (unknown to the
// catalog, or used before its first effective time): what to set a price for.
type UnpricedModel struct {
	Model  string
	Events uint64 // unpriced usage events
	Tokens Tokens // their tokens
	// FirstSeen and LastSeen are the starts of the first and the last hour (UTC) with
	// unpriced usage of the model in the range: the rollup's grain.
	FirstSeen, LastSeen time.Time
}

// UnpricedModels lists the models with unpriced usage of org in [from, to) (widened
// to whole hours, at most MaxUnpricedRange), most unpriced events first, at most limit
// (0: DefaultUnpricedLimit); truncated says there were more. It reads usage_rollup like
// Costs: whole days and the edge hours, and for the days a model was first and last
// seen their hours. org PlatformOrg reads every organization (unattributed usage
// included).
func (qr *Querier) UnpricedModels(ctx context.Context, org string, from, to time.Time, limit int) ([]UnpricedModel, bool, error) {
	errs := checkOrg(nil, org)
	if from.IsZero() {
		errs = append(errs, fieldErr("from", "required"))
	}
	if to.IsZero() {
		errs = append(errs, fieldErr("to", "required"))
	}
	errs = checkRange(errs, from, to)
	if !from.IsZero() && to.Sub(from) > MaxUnpricedRange {
		errs = append(errs, fieldErr("to", "the range is %.1f days, more than %d", to.Sub(from).Hours()/24, int(MaxUnpricedRange/(24*time.Hour))))
	}
	errs = checkLimit(errs, limit, MaxUnpricedLimit)
	if err := errors.Join(errs...); err != nil {
		return nil, false, err
	}
	if limit == 0 {
		limit = DefaultUnpricedLimit
	}
	u := unpricedSQL{db: qr.db, org: org, from: from.UTC().Truncate(time.Hour), to: ceilHour(to)}
	sql, args := u.modelsSQL(limit)
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, false, queryErr(ctx, err, fmt.Sprintf("cannot query unpriced models of org %q from %s.usage_rollup", org, qr.db))
	}
	out := []UnpricedModel{}
	for rows.Next() {
		var m UnpricedModel
		t := &m.Tokens
		if err := rows.Scan(&m.Model, &m.Events, &t.Input, &t.Output, &t.CacheRead, &t.CacheWrite, &t.Reasoning, &m.FirstSeen, &m.LastSeen); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("cannot read unpriced models of org %q: %w", org, err)
		}
		m.FirstSeen, m.LastSeen = m.FirstSeen.UTC(), m.LastSeen.UTC()
		out = append(out, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, queryErr(ctx, err, fmt.Sprintf("cannot read unpriced models of org %q", org))
	}
	truncated := len(out) > limit
	if truncated {
		out = out[:limit]
	}
	if err := qr.refineSeen(ctx, u, out); err != nil {
		return nil, false, err
	}
	return out, truncated, nil
}

// unpricedSQL builds the reads of UnpricedModels over [from, to) (whole hours).
type unpricedSQL struct {
	db       string
	org      string
	from, to time.Time
}

// days is the range of whole days read as day rows (empty when none): rollupRange's.
func (u unpricedSQL) days() (time.Time, time.Time) {
	first, last := u.from.Truncate(24*time.Hour), u.to.Truncate(24*time.Hour)
	if first.Before(u.from) {
		first = first.Add(24 * time.Hour)
	}
	return first, last
}

func (u unpricedSQL) scope(w *where) *where {
	if u.org != PlatformOrg {
		w.add("org_id = ?", u.org)
	}
	return w
}

const unpricedCols = "model, unpriced_events, unpriced_input_tokens, unpriced_output_tokens, unpriced_cache_read_tokens," +
	" unpriced_cache_write_tokens, unpriced_reasoning_tokens"

// modelsSQL sums the unpriced usage per model. The condition on unpriced_events is
// applied to each group's newest row (in the outer query): before it, an older version
// of a row could pass where the newest would not.
func (u unpricedSQL) modelsSQL(limit int) (string, []any) {
	w := u.scope(&where{})
	rollupRange(w, u.from, u.to, false)
	return "SELECT model, sum(unpriced_events) AS total_unpriced, sum(unpriced_input_tokens) AS total_u_input," +
		" sum(unpriced_output_tokens) AS total_u_output, sum(unpriced_cache_read_tokens) AS total_u_cache_read," +
		" sum(unpriced_cache_write_tokens) AS total_u_cache_write, sum(unpriced_reasoning_tokens) AS total_u_reasoning," +
		" min(hour) AS first_bucket, max(hour) AS last_bucket" +
		" FROM " + latestRollup(u.db, costRollup, unpricedCols, w, u.org == PlatformOrg) + " WHERE unpriced_events > 0" +
		" GROUP BY model ORDER BY total_unpriced DESC, model LIMIT " + fmt.Sprint(limit+1), w.args
}

// refineSeen turns first and last seen days (from day rows) into the hours they are,
// reading the hour rows of those days only.
func (qr *Querier) refineSeen(ctx context.Context, u unpricedSQL, models []UnpricedModel) error {
	firstDay, lastDay := u.days()
	inDays := func(t time.Time) bool { return !t.Before(firstDay) && t.Before(lastDay) }
	var names []string
	dayRanges := map[time.Time]bool{}
	for _, m := range models {
		if inDays(m.FirstSeen) || inDays(m.LastSeen) {
			names = append(names, m.Model)
			for _, t := range []time.Time{m.FirstSeen, m.LastSeen} {
				if inDays(t) {
					dayRanges[t.Truncate(24*time.Hour)] = true
				}
			}
		}
	}
	if len(names) == 0 {
		return nil
	}
	w := u.scope(&where{})
	w.add("has(?, model)", names)
	var ors []string
	for d := range dayRanges {
		ors = append(ors, "(bucket >= ? AND bucket < ?)")
		w.args = append(w.args, d, d.Add(24*time.Hour))
	}
	w.conds = append(w.conds, "grain = 'hour' AND ("+strings.Join(ors, " OR ")+")")
	sql := "SELECT model, min(hour) AS first_hour, max(hour) AS last_hour FROM " +
		latestRollup(qr.db, costRollup, "model, unpriced_events", w, u.org == PlatformOrg) + " WHERE unpriced_events > 0 GROUP BY model"
	rows, err := qr.conn.Query(ctx, sql, w.args...)
	if err != nil {
		return queryErr(ctx, err, fmt.Sprintf("cannot query the unpriced hours of org %q from %s.usage_rollup", u.org, qr.db))
	}
	defer rows.Close()
	at := map[string]int{}
	for i, m := range models {
		at[m.Model] = i
	}
	for rows.Next() {
		var model string
		var first, last time.Time
		if err := rows.Scan(&model, &first, &last); err != nil {
			return fmt.Errorf("cannot read the unpriced hours of org %q: %w", u.org, err)
		}
		i, ok := at[model]
		if !ok {
			continue
		}
		m := &models[i]
		first, last = first.UTC(), last.UTC()
		// An hour of the model's first (last) day can only be at or after (before) the
		// day's start (end); hours of other days read here lie between the two.
		if inDays(m.FirstSeen) && first.Truncate(24*time.Hour).Equal(m.FirstSeen) {
			m.FirstSeen = first
		}
		if inDays(m.LastSeen) && last.Truncate(24*time.Hour).Equal(m.LastSeen) {
			m.LastSeen = last
		}
	}
	return rows.Err()
}

// RepriceJob is a reprice job whose range overlaps a cost answer's and that has not
// repriced all of that overlap (CostReport.Repricing).
type RepriceJob struct {
	ID       string
	State    string    // queued or running: the figures are provisional; failed or cancelled: see Cursor
	From, To time.Time // the job's range
	// Cursor: every day before it is repriced, with its rollup (zero: none yet). Days
	// from it on have the prices they had before the job.
	Cursor              time.Time
	DaysDone, DaysTotal uint32
}

// Provisional says whether the job may still change the figures (it is queued or
// running); a failed or cancelled job left the days from its cursor on unrepriced.
func (j RepriceJob) Provisional() bool { return j.State == "queued" || j.State == "running" }

// maxRepriceJobs bounds the jobs a cost answer lists.
const maxRepriceJobs = 20

// repricing lists the reprice jobs of org (or of every organization) overlapping [from,
// to) that have not repriced all of it: unfinished ones (queued or running), and
// failed or cancelled ones whose cursor stopped inside the overlap, unless a later job
// of org or every organization did all of that remainder (state done).
func (qr *Querier) repricing(ctx context.Context, org string, from, to time.Time) ([]RepriceJob, error) {
	rows, err := qr.conn.Query(ctx, `SELECT id, state, range_from, range_to, cursor, days_done, days_total, requested_at, agent_id
		FROM `+qr.db+`.jobs FINAL WHERE kind = 'reprice' AND has(?, org_id) AND range_from < ? AND range_to > ?
		ORDER BY requested_at, id`, []string{org, PlatformOrg}, to, from)
	if err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the reprice jobs of org %q from %s.jobs", org, qr.db))
	}
	defer rows.Close()
	type job struct {
		RepriceJob
		requested time.Time
		agent     string // "" for every agent of the organization
	}
	var all []job
	for rows.Next() {
		var j job
		if err := rows.Scan(&j.ID, &j.State, &j.From, &j.To, &j.Cursor, &j.DaysDone, &j.DaysTotal, &j.requested, &j.agent); err != nil {
			return nil, fmt.Errorf("cannot read the reprice jobs of org %q: %w", org, err)
		}
		j.From, j.To = j.From.UTC(), j.To.UTC()
		if j.Cursor.Unix() <= 0 {
			j.Cursor = time.Time{}
		} else {
			j.Cursor = j.Cursor.UTC()
		}
		all = append(all, j)
	}
	if err := rows.Err(); err != nil {
		return nil, queryErr(ctx, err, fmt.Sprintf("cannot read the reprice jobs of org %q", org))
	}
	out := []RepriceJob{}
	for i, j := range all {
		switch j.State {
		case "queued", "running":
		case "failed", "cancelled":
			// What the job left undone within the answer's range.
			left := j.From
			if j.Cursor.After(left) {
				left = j.Cursor
			}
			left, right := later(left, from), earlier(j.To, to)
			if !left.Before(right) {
				continue // it stopped after the answer's range
			}
			done := false
			for _, k := range all[i+1:] {
				// A later job covers it when it repriced at least the same agents.
				if k.State == "done" && (k.agent == "" || k.agent == j.agent) && !k.From.After(left) && !k.To.Before(right) {
					done = true
				}
			}
			if done {
				continue
			}
		default:
			continue
		}
		out = append(out, j.RepriceJob)
		if len(out) == maxRepriceJobs {
			break
		}
	}
	return out, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
