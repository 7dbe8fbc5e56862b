package prices

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"
	"unicode"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
)

// KindReprice is the kind of a reprice job.
const KindReprice = "reprice"

// JobState is where a job is: queued → running → done | failed | cancelled (a running
// job interrupted by a stop goes back to queued at its last checkpoint).
type JobState string

const (
	JobQueued    JobState = "queued"
	JobRunning   JobState = "running"
	JobDone      JobState = "done"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
)

// Finished says whether the job will not run again.
func (s JobState) Finished() bool { return s == JobDone || s == JobFailed || s == JobCancelled }

// Bounds of a reprice request.
const (
	MaxRepriceRange = 400 * 24 * time.Hour // the events retention
	DefaultJobLimit = 50
	MaxJobLimit     = 1000
	maxErrorBytes   = 1024
)

// MinRepriceFrom is the earliest time a reprice may start from.
var MinRepriceFrom = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Job is a background job as the API shows it. A reprice job recomputes the cost of
// the usage of Org ('*': every organization) in [From, To) with catalog version
// CatalogVersion (pinned when it first starts; 0 until then), one UTC day at a time:
// every day before Cursor is repriced and its rollup rebuilt.
type Job struct {
	ID             string          `json:"id"`
	Org            string          `json:"org"`
	Kind           string          `json:"kind"`
	Agent          string          `json:"agent,omitempty"` // only this agent's usage (the CLI's --agent)
	From           time.Time       `json:"from"`
	To             time.Time       `json:"to"`
	State          JobState        `json:"state"`
	CatalogVersion uint64          `json:"catalog_version"`
	Cursor         time.Time       `json:"cursor,omitzero"`
	DaysDone       int             `json:"days_done"`
	DaysTotal      int             `json:"days_total"`
	RowsScanned    uint64          `json:"rows_scanned"`
	RowsChanged    uint64          `json:"rows_changed"`
	StillUnpriced  uint64          `json:"still_unpriced"`
	CostBefore     decimal.Decimal `json:"cost_before"` // of the rows scanned, in the catalog's currency
	CostAfter      decimal.Decimal `json:"cost_after"`
	RequestedBy    string          `json:"requested_by"`
	RequestedAt    time.Time       `json:"requested_at"`
	StartedAt      time.Time       `json:"started_at,omitzero"`
	FinishedAt     time.Time       `json:"finished_at,omitzero"`
	HeartbeatAt    time.Time       `json:"heartbeat_at,omitzero"`
	Runner         string          `json:"runner,omitempty"`
	Error          string          `json:"error,omitempty"`
}

func jobOf(r store.JobRow) Job {
	return Job{ID: r.ID, Org: r.OrgID, Kind: r.Kind, Agent: r.AgentID, From: r.From, To: r.To, State: JobState(r.State),
		CatalogVersion: r.CatalogVersion, Cursor: r.Cursor, DaysDone: int(r.DaysDone), DaysTotal: int(r.DaysTotal),
		RowsScanned: r.RowsScanned, RowsChanged: r.RowsChanged, StillUnpriced: r.StillUnpriced,
		CostBefore: r.CostBefore, CostAfter: r.CostAfter, RequestedBy: r.RequestedBy, RequestedAt: r.RequestedAt,
		StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, HeartbeatAt: r.HeartbeatAt, Runner: r.Runner, Error: r.Error}
}

func (j Job) row(version uint64) store.JobRow {
	return store.JobRow{ID: j.ID, OrgID: j.Org, Kind: j.Kind, AgentID: j.Agent, From: j.From, To: j.To, State: string(j.State),
		CatalogVersion: j.CatalogVersion, Cursor: j.Cursor, DaysDone: uint32(j.DaysDone), DaysTotal: uint32(j.DaysTotal),
		RowsScanned: j.RowsScanned, RowsChanged: j.RowsChanged, StillUnpriced: j.StillUnpriced,
		CostBefore: j.CostBefore, CostAfter: j.CostAfter, RequestedBy: j.RequestedBy, RequestedAt: j.RequestedAt,
		StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, HeartbeatAt: j.HeartbeatAt, Runner: j.Runner,
		Error: truncate(j.Error, maxErrorBytes), Version: version}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 { // not inside a UTF-8 sequence
		n--
	}
	return s[:n]
}

// days are the UTC day segments of [from, to): the first and last may be partial.
func days(from, to time.Time) [][2]time.Time {
	var out [][2]time.Time
	for d := from; d.Before(to); {
		next := d.Truncate(24 * time.Hour).Add(24 * time.Hour)
		if next.After(to) {
			next = to
		}
		out = append(out, [2]time.Time{d, next})
		d = next
	}
	return out
}

// scopesOverlap says whether jobs of organizations a and b could reprice the same rows.
func scopesOverlap(a, b string) bool { return a == b || a == keys.PlatformOrg || b == keys.PlatformOrg }

var jobIDRe = regexp.MustCompile(`^[0-9a-f-]{1,64}$`)

// checkRequest validates a reprice request and returns its range to the second.
func (s *Service) checkRequest(by, org, agent string, from, to time.Time) (time.Time, time.Time, error) {
	var errs []error
	if err := checkBy(by); err != nil {
		errs = append(errs, err)
	}
	if org == "" {
		errs = append(errs, fieldErr("org", "required (an organization id, or '*' for every organization)"))
	} else if err := keys.ValidateOrg(org); err != nil {
		errs = append(errs, fieldErr("org", "%v", err))
	}
	if len(agent) > schema.MaxIDBytes {
		errs = append(errs, fieldErr("agent", "%d bytes is longer than the limit of %d", len(agent), schema.MaxIDBytes))
	} else if slices.ContainsFunc([]rune(agent), unicode.IsControl) {
		errs = append(errs, fieldErr("agent", "has a control character"))
	}
	now := s.stamp()
	from, to = from.UTC().Truncate(time.Second), to.UTC().Truncate(time.Second)
	switch {
	case from.IsZero() || to.IsZero():
		if from.IsZero() {
			errs = append(errs, fieldErr("from", "required"))
		}
		if to.IsZero() {
			errs = append(errs, fieldErr("to", "required"))
		}
	case !to.After(from):
		errs = append(errs, fieldErr("to", "must be after from (from %s, to %s)", from.Format(time.RFC3339), to.Format(time.RFC3339)))
	case to.Sub(from) > MaxRepriceRange:
		errs = append(errs, fieldErr("to", "the range is %.1f days, more than the %d a job may reprice", to.Sub(from).Hours()/24, int(MaxRepriceRange/(24*time.Hour))))
	case from.Before(MinRepriceFrom):
		errs = append(errs, fieldErr("from", "%s is before %s", from.Format(time.RFC3339), MinRepriceFrom.Format(time.DateOnly)))
	case to.After(now.Add(24 * time.Hour)):
		errs = append(errs, fieldErr("to", "%s is more than a day ahead of now", to.Format(time.RFC3339)))
	}
	return from, to, errors.Join(errs...)
}

// StartReprice asks for a reprice job: the usage of org (an organization id, or
// keys.PlatformOrg for every organization) in [from, to) (to the second, at most
// MaxRepriceRange, not before MinRepriceFrom nor more than a day ahead) recomputed with
// the newest catalog version when the job starts, by a runner of a `bandplane serve`.
// by needs role admin, and may reprice its own organization (a platform key: any, or
// all). The job waits in the queue while a job that could reprice the same rows runs
// (one of its organization, or of every organization). Each organization, each
// requester and the queue as a whole hold at most their share of the queued and
// running jobs (Config.MaxJobsPerOrg, MaxJobsPerKey, MaxJobs; the platform keeps one
// organization's share): a request over one is schema.ErrTooMany naming the bound.
func (s *Service) StartReprice(ctx context.Context, by keys.Key, org string, from, to time.Time) (Job, error) {
	switch {
	case !by.Has(keys.RoleAdmin):
		return Job{}, fmt.Errorf("%w: starting a reprice job needs role admin (key %s has role %s)", schema.ErrForbidden, by.ID, by.Role)
	case org == keys.PlatformOrg && !by.Platform():
		return Job{}, fmt.Errorf("%w: only a platform key may reprice every organization", schema.ErrForbidden)
	case org != keys.PlatformOrg && org != "" && !by.MayActOn(org):
		return Job{}, fmt.Errorf("%w: key %s of organization %q may not reprice organization %q", schema.ErrForbidden, by.ID, by.Org, org)
	}
	return s.Enqueue(ctx, by.ID, org, "", from, to)
}

// Enqueue is StartReprice for a trusted caller, with agent ("" any) narrowing the job
// to one agent's usage.
func (s *Service) Enqueue(ctx context.Context, by, org, agent string, from, to time.Time) (Job, error) {
	return s.request(ctx, by, org, agent, from, to, false)
}

// request records a new reprice job, queued, or (claim) running in this process; a job
// to run at once is schema.ErrConflict while one of overlapping scope runs.
func (s *Service) request(ctx context.Context, by, org, agent string, from, to time.Time, claim bool) (Job, error) {
	from, to, err := s.checkRequest(by, org, agent, from, to)
	if err != nil {
		return Job{}, err
	}
	s.jobsMu.Lock()
	defer s.jobsMu.Unlock()
	rows, err := s.queue(ctx)
	if err != nil {
		return Job{}, err
	}
	now := s.stamp()
	j := Job{ID: schema.NewID(), Org: org, Kind: KindReprice, Agent: agent, From: from, To: to, State: JobQueued,
		DaysTotal: len(days(from, to)), RequestedBy: by, RequestedAt: now, CostBefore: decimal.Zero, CostAfter: decimal.Zero}
	if claim {
		j.State, j.Runner, j.StartedAt, j.HeartbeatAt = JobRunning, s.cfg.Runner, now, now
	}
	if err := s.admit(rows, j, false, claim, now); err != nil {
		return Job{}, err
	}
	if err := s.audit(ctx, event(TypeJobQueued, org, by, j.ID, now, JobEventData{Job: j})); err != nil {
		return Job{}, err
	}
	if err := s.st.InsertJob(ctx, j.row(s.nextVersion())); err != nil {
		return Job{}, err
	}
	// Another process may have asked meanwhile: the older requests keep their places,
	// and a job to run at once gives way to one of overlapping scope started meanwhile.
	if rows, err := s.queue(ctx); err == nil {
		if err := s.admit(rows, j, true, claim, now); err != nil {
			j.State, j.FinishedAt, j.Error = JobCancelled, now, "refused once recorded, another request having come first: "+err.Error()
			_ = s.audit(ctx, event(TypeJobFinished, org, Source, j.ID, now, JobEventData{Job: j}))
			_ = s.st.InsertJob(ctx, j.row(s.finalVersion()))
			return Job{}, err
		}
	}
	s.log.Info("reprice job queued", "job_id", j.ID, "org_id", org, "from", from, "to", to, "by", by)
	return j, nil
}

// admit says whether job j may be among the unfinished jobs rows (recorded: j is one
// of them already): a share of the queue refuses it (schema.ErrTooMany), or, to run at
// once (claim), a live running job could reprice the same rows (schema.ErrConflict
// naming it).
func (s *Service) admit(rows []store.JobRow, j Job, recorded, claim bool, now time.Time) error {
	lim := s.cfg.queueLimits()
	jr := j.row(0)
	if refused := queueRefusal(lim, ahead(rows, jr, recorded), jr); refused != nil {
		return refusalErr(lim, j, refused)
	}
	if !claim {
		return nil
	}
	if r := overlapping(rows, j.Org, j.ID, now, s.cfg.StaleAfter); r != nil {
		return fmt.Errorf("%w: reprice job %s of organization %q is %s (requested by %s at %s): wait for it to finish, or cancel it",
			schema.ErrConflict, r.ID, r.OrgID, r.State, r.RequestedBy, r.RequestedAt.Format(time.RFC3339))
	}
	return nil
}

// Jobs lists the jobs of org, newest request first (limit 0: DefaultJobLimit, at most
// MaxJobLimit). org is the caller key's organization: keys.PlatformOrg lists every
// job; an organization sees its own jobs only, not those of every organization (their
// counts are the platform's).
func (s *Service) Jobs(ctx context.Context, org string, limit int) ([]Job, error) {
	var errs []error
	if org == "" {
		errs = append(errs, fieldErr("org", "required"))
	}
	if limit < 0 || limit > MaxJobLimit {
		errs = append(errs, fieldErr("limit", "must be between 1 and %d, got %d", MaxJobLimit, limit))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = DefaultJobLimit
	}
	f := store.JobFilter{Limit: limit}
	if org != keys.PlatformOrg {
		f.Orgs = []string{org}
	}
	rows, err := s.st.Jobs(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]Job, 0, len(rows))
	for _, r := range rows {
		out = append(out, jobOf(r))
	}
	return out, nil
}

// Job returns one job of org (keys.PlatformOrg: any job); another organization's job
// is schema.ErrNotFound, like one that does not exist.
func (s *Service) Job(ctx context.Context, org, id string) (Job, error) {
	if org == "" {
		return Job{}, fieldErr("org", "required")
	}
	if !jobIDRe.MatchString(id) {
		return Job{}, fieldErr("id", "%q is not a job id", cut(id))
	}
	f := store.JobFilter{ID: id}
	if org != keys.PlatformOrg {
		f.Orgs = []string{org}
	}
	rows, err := s.st.Jobs(ctx, f)
	if err != nil {
		return Job{}, err
	}
	if len(rows) == 0 {
		return Job{}, fmt.Errorf("%w: no job %s", schema.ErrNotFound, id)
	}
	return jobOf(rows[0]), nil
}

// CancelJob cancels a queued or running job of by's organization (a platform key: any
// job); by needs role admin. A running job stops after the day it is repricing (each
// day is left wholly repriced or untouched); the days before its cursor keep their new
// prices. A finished job is schema.ErrConflict.
func (s *Service) CancelJob(ctx context.Context, by keys.Key, id string) (Job, error) {
	if !by.Has(keys.RoleAdmin) {
		return Job{}, fmt.Errorf("%w: cancelling a job needs role admin (key %s has role %s)", schema.ErrForbidden, by.ID, by.Role)
	}
	if by.Org == "" {
		return Job{}, fmt.Errorf("%w: key %s has no organization", schema.ErrForbidden, by.ID)
	}
	if _, err := s.Job(ctx, by.Org, id); err != nil {
		return Job{}, err
	}
	return s.Cancel(ctx, by.ID, id)
}

// Cancel is CancelJob for a trusted caller (`bandplane reprice --cancel`).
func (s *Service) Cancel(ctx context.Context, by, id string) (Job, error) {
	if err := checkBy(by); err != nil {
		return Job{}, err
	}
	j, err := s.Job(ctx, keys.PlatformOrg, id)
	if err != nil {
		return Job{}, err
	}
	if j.State.Finished() {
		return j, fmt.Errorf("%w: job %s is already %s", schema.ErrConflict, id, j.State)
	}
	now := s.stamp()
	j.State, j.FinishedAt, j.Error = JobCancelled, now, "cancelled by "+by
	if err := s.audit(ctx, event(TypeJobFinished, j.Org, by, j.ID, now, JobEventData{Job: j})); err != nil {
		return Job{}, err
	}
	if err := s.st.InsertJob(ctx, j.row(s.finalVersion())); err != nil {
		return Job{}, err
	}
	s.log.Info("reprice job cancelled", "job_id", j.ID, "by", by)
	return j, nil
}
