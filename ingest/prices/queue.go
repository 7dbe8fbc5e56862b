package prices

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
	"github.com/bandplane/bandplane/schema/store"
)

// Defaults of the reprice queue's shares (Config.MaxJobs, MaxJobsPerOrg, MaxJobsPerKey).
// One organization has at most 2 jobs queued or running, one key 1, all of them 32, of
// which tenants hold at most 30: the platform keeps one organization's share.
const (
	DefaultMaxJobs       = 32
	DefaultMaxJobsPerOrg = 2
	DefaultMaxJobsPerKey = 1
)

// maxQueueRows bounds the unfinished job rows one read of the queue takes: the shares
// keep far fewer in the table, and rows written there directly must not make a runner
// hold them all.
const maxQueueRows = 10_000

// queueLimits are the shares of the queue, defaults applied: places are the jobs
// queued or running, a group an organization (the platform's is keys.PlatformOrg), a
// client who asked (requested_by).
func (c Config) queueLimits() share.Limits {
	lim := share.Limits{Total: c.MaxJobs, PerGroup: c.MaxJobsPerOrg, PerClient: c.MaxJobsPerKey}
	if lim.Total == 0 {
		lim.Total = DefaultMaxJobs
	}
	if lim.PerGroup == 0 {
		lim.PerGroup = DefaultMaxJobsPerOrg
	}
	if lim.PerClient == 0 {
		lim.PerClient = DefaultMaxJobsPerKey
	}
	lim.Reserved = lim.PerGroup
	return lim
}

// queue reads the unfinished reprice jobs (queued or running), newest request first,
// leaving out the rows no request could have written (rowProblem): the jobs table is
// in ClickHouse, where rows can be written by others than this service, and a runner
// neither runs nor counts such a row.
func (s *Service) queue(ctx context.Context) ([]store.JobRow, error) {
	limit := max(maxQueueRows, 4*s.cfg.MaxJobs)
	rows, err := s.st.Jobs(ctx, store.JobFilter{Kind: KindReprice, States: []string{string(JobQueued), string(JobRunning)}, Limit: limit})
	if err != nil {
		return nil, err
	}
	if len(rows) == limit {
		s.warnQueue("the jobs table holds more unfinished reprice jobs than the queue's shares admit; the oldest are not seen",
			"read", limit, "max_jobs", s.cfg.MaxJobs)
	}
	out := rows[:0]
	bad, example, reason := 0, "", ""
	for _, r := range rows {
		if p := rowProblem(r); p != "" {
			bad, example, reason = bad+1, r.ID, p
			continue
		}
		out = append(out, r)
	}
	if bad > 0 {
		s.warnQueue("ignoring unfinished reprice job rows no request could have written (never run, never counted)",
			"rows", bad, "job_id", cut(example), "reason", reason)
	}
	return out, nil
}

// warnQueue logs a problem of the queue's rows at most once a minute: every poll
// reads them again.
func (s *Service) warnQueue(msg string, args ...any) {
	s.claimMu.Lock()
	if time.Since(s.queueWarn) < time.Minute {
		s.claimMu.Unlock()
		return
	}
	s.queueWarn = time.Now()
	s.claimMu.Unlock()
	s.log.Warn(msg, args...)
}

// rowProblem says why a job row is not one a request could have written ("" when it
// could): its id, organization, agent or requester would not pass checkRequest, or its
// range is longer than MaxRepriceRange or before MinRepriceFrom. The range bounds what
// running the row costs: at most MaxRepriceRange of days, whatever else the row says.
func rowProblem(r store.JobRow) string {
	switch {
	case !jobIDRe.MatchString(r.ID):
		return "not a job id"
	case keys.ValidateOrg(r.OrgID) != nil:
		return "not an organization"
	case len(r.AgentID) > schema.MaxIDBytes || strings.ContainsFunc(r.AgentID, unicode.IsControl):
		return "not an agent id"
	case checkBy(r.RequestedBy) != nil:
		return "not a requester"
	case r.From.Before(MinRepriceFrom) || !r.To.After(r.From) || r.To.Sub(r.From) > MaxRepriceRange:
		return "not a range a job may reprice"
	}
	return ""
}

// requestedBefore orders jobs by request: the time, then the id.
func requestedBefore(a, b store.JobRow) bool {
	return a.RequestedAt.Before(b.RequestedAt) || a.RequestedAt.Equal(b.RequestedAt) && a.ID < b.ID
}

func byRequest(a, b store.JobRow) int {
	switch {
	case requestedBefore(a, b):
		return -1
	case requestedBefore(b, a):
		return 1
	}
	return 0
}

// queueRefusal says which share of the queue refuses job j after the jobs ahead of it,
// each holding its place in the order they were requested (a row over a bound holds
// none).
func queueRefusal(lim share.Limits, ahead []store.JobRow, j store.JobRow) *share.Refusal {
	ahead = slices.Clone(ahead)
	slices.SortFunc(ahead, byRequest)
	pool := share.New(lim, keys.PlatformOrg)
	for _, r := range ahead {
		_, _ = pool.Take(r.OrgID, r.RequestedBy) // refused: a row over a bound holds no place
	}
	_, refused := pool.Take(j.OrgID, j.RequestedBy)
	return refused
}

// ahead are the unfinished jobs rows that come before job j in the queue. Before j is
// recorded, every one of them; once it is, those requested before it: every process
// decides alike from the same rows, so of two requests racing for the last place the
// older keeps it.
func ahead(rows []store.JobRow, j store.JobRow, recorded bool) []store.JobRow {
	out := make([]store.JobRow, 0, len(rows))
	for _, r := range rows {
		if r.ID != j.ID && (!recorded || requestedBefore(r, j)) {
			out = append(out, r)
		}
	}
	return out
}

// refusalErr is the error of a request a share of the queue refused.
func refusalErr(lim share.Limits, j Job, r *share.Refusal) error {
	switch r.Bound {
	case share.BoundClient:
		return fmt.Errorf("%w: requester %s already has %s queued or running; at most %d (MaxJobsPerKey): wait for one to finish, or cancel it",
			schema.ErrTooMany, j.RequestedBy, jobCount(r.Held), r.Limit)
	case share.BoundGroup:
		who := "organization " + j.Org
		if j.Org == keys.PlatformOrg {
			who = "the platform (jobs of every organization)"
		}
		return fmt.Errorf("%w: %s already has %s queued or running; at most %d (MaxJobsPerOrg): wait for one to finish, or cancel one",
			schema.ErrTooMany, who, jobCount(r.Held), r.Limit)
	}
	return fmt.Errorf("%w: %s of organizations are queued or running, the most the queue holds (MaxJobs %d, of which %d are the platform's); retry when one has finished",
		schema.ErrTooMany, jobCount(r.Held), lim.Total, lim.Reserved)
}

func jobCount(n int) string {
	if n == 1 {
		return "1 reprice job"
	}
	return fmt.Sprintf("%d reprice jobs", n)
}

// live says whether a running job's runner is alive: its heartbeat is younger than
// staleAfter. A heartbeat further ahead than staleAfter is no clock's skew, and keeps
// nothing alive (a row could otherwise hold its scope forever).
func live(r store.JobRow, now time.Time, staleAfter time.Duration) bool {
	d := now.Sub(r.HeartbeatAt)
	return r.State == string(JobRunning) && d < staleAfter && d > -staleAfter
}

// overlapping is the first live running job among rows, other than except, that could
// reprice rows of org's jobs.
func overlapping(rows []store.JobRow, org, except string, now time.Time, staleAfter time.Duration) *store.JobRow {
	for i, r := range rows {
		if r.ID != except && live(r, now, staleAfter) && scopesOverlap(r.OrgID, org) {
			return &rows[i]
		}
	}
	return nil
}

// claimOrder is the order in which a runner tries the jobs it may claim among the
// unfinished rows (queued ones, and running ones whose runner is silent). Each
// organization offers its oldest request; organizations take turns: an organization's
// turn is the later of its oldest request and the last time this runner claimed one of
// its jobs (last), the earliest turn first, the platform first among equals. So one
// that keeps its queue full runs one job, then waits for every organization that asked
// before that claim, the platform included.
//
// A job that could reprice the rows of a live running job is not offered (two jobs of
// overlapping scope never run at once). A tenant's is skipped; the platform's (every
// organization's, which overlaps each) stops the order there: the runners then start
// nothing after it, the running jobs end, and it starts. Without that, runners would
// keep starting tenants' jobs and it would never find the queue idle.
func claimOrder(rows []store.JobRow, now time.Time, staleAfter time.Duration, last map[string]time.Time) []store.JobRow {
	heads := map[string]store.JobRow{}
	for _, r := range rows {
		if live(r, now, staleAfter) {
			continue
		}
		if h, ok := heads[r.OrgID]; !ok || requestedBefore(r, h) {
			heads[r.OrgID] = r
		}
	}
	turn := func(r store.JobRow) time.Time {
		if t := last[r.OrgID]; t.After(r.RequestedAt) {
			return t
		}
		return r.RequestedAt
	}
	order := make([]store.JobRow, 0, len(heads))
	for _, h := range heads {
		order = append(order, h)
	}
	slices.SortFunc(order, func(a, b store.JobRow) int {
		if c := turn(a).Compare(turn(b)); c != 0 {
			return c
		}
		if pa, pb := a.OrgID == keys.PlatformOrg, b.OrgID == keys.PlatformOrg; pa != pb {
			if pa {
				return -1
			}
			return 1
		}
		return byRequest(a, b)
	})
	out := order[:0]
	for _, h := range order {
		if overlapping(rows, h.OrgID, h.ID, now, staleAfter) != nil {
			if h.OrgID == keys.PlatformOrg {
				break
			}
			continue
		}
		out = append(out, h)
	}
	return out
}

// claimedBy notes that this runner claimed a job of org, and forgets the
// organizations with no unfinished job (their next request is later than any claim
// remembered): what it keeps is bounded by the queue.
func (s *Service) claimedBy(org string, at time.Time, rows []store.JobRow) {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.lastClaim == nil {
		s.lastClaim = map[string]time.Time{}
	}
	keep := map[string]bool{org: true}
	for _, r := range rows {
		keep[r.OrgID] = true
	}
	for o := range s.lastClaim {
		if !keep[o] {
			delete(s.lastClaim, o)
		}
	}
	s.lastClaim[org] = at
}

// lastClaims is a copy of when this runner last claimed a job of each organization.
func (s *Service) lastClaims() map[string]time.Time {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	return maps.Clone(s.lastClaim)
}
