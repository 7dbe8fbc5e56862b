package prices

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/store"
)

// RunNow records a reprice job as running in this process and runs it to its end
// (`bandplane reprice`: the job is in the jobs table like any other, and cfg.OnProgress
// sees each day). If ctx ends first, the job is put back in the queue at its last
// checkpoint, for a serve's runner to finish, and RunNow returns it with ctx's error.
func (s *Service) RunNow(ctx context.Context, by, org, agent string, from, to time.Time) (Job, error) {
	j, err := s.request(ctx, by, org, agent, from, to, true)
	if err != nil {
		return Job{}, err
	}
	if err := s.audit(ctx, event(TypeJobStarted, j.Org, s.cfg.Runner, j.ID, s.cfg.Now(), JobEventData{Job: j})); err != nil {
		s.requeue(&runState{job: j})
		return j, err
	}
	return s.execute(ctx, j)
}

// claim takes the next job to run (claimOrder): a queued one, or a running one whose
// heartbeat is older than StaleAfter (its runner died). Two runners may claim one job
// at once; each checkpoint re-reads the job and the one that no longer owns it stops,
// so a job runs at least once, and the work of a day is idempotent. Two runners may
// also claim two jobs of overlapping scope at once: each re-reads the queue after its
// claim, and one that sees the other's backs off (both may, and try again at the next
// poll), so that two such jobs never run together.
func (s *Service) claim(ctx context.Context) (Job, bool, error) {
	rows, err := s.queue(ctx)
	if err != nil {
		return Job{}, false, err
	}
	now := s.stamp()
	for _, r := range claimOrder(rows, now, s.cfg.StaleAfter, s.lastClaims()) {
		j := jobOf(r)
		resumed := j.State == JobRunning || !j.Cursor.IsZero()
		if j.State == JobRunning {
			s.log.Warn("resuming a reprice job whose runner went silent", "job_id", j.ID, "runner", j.Runner,
				"heartbeat_at", j.HeartbeatAt, "cursor", j.Cursor)
		}
		j.State, j.Runner, j.HeartbeatAt = JobRunning, s.cfg.Runner, now
		if j.StartedAt.IsZero() {
			j.StartedAt = now
		}
		if err := s.st.InsertJob(ctx, j.row(s.nextVersion())); err != nil {
			return Job{}, false, err
		}
		after, err := s.queue(ctx)
		if err != nil {
			return Job{}, false, err
		}
		i := slices.IndexFunc(after, func(a store.JobRow) bool { return a.ID == j.ID })
		if i < 0 || after[i].Runner != s.cfg.Runner || after[i].State != string(JobRunning) {
			continue // another runner took it, or it was cancelled
		}
		if o := overlapping(after, j.Org, j.ID, now, s.cfg.StaleAfter); o != nil {
			back := jobOf(r)
			back.State, back.Runner = JobQueued, ""
			if err := s.st.InsertJob(ctx, back.row(s.nextVersion())); err != nil {
				return Job{}, false, err
			}
			s.log.Info("a reprice job of overlapping scope started elsewhere at the same time; this one waits", "job_id", j.ID,
				"other_job_id", o.ID, "other_runner", o.Runner)
			continue
		}
		s.claimedBy(j.Org, now, after)
		if err := s.audit(ctx, event(TypeJobStarted, j.Org, s.cfg.Runner, j.ID, now, JobEventData{Job: j, Resumed: resumed})); err != nil {
			s.requeue(&runState{job: j})
			return Job{}, false, err
		}
		return j, true, nil
	}
	return Job{}, false, nil
}

// run executes a claimed job for Run.
func (s *Service) run(ctx context.Context, j Job) {
	if _, err := s.execute(ctx, j); err != nil && ctx.Err() == nil {
		s.log.Warn("reprice job stopped", "job_id", j.ID, "err", err)
	}
}

// runState is a running job as its runner holds it; mu guards it against the
// heartbeat.
type runState struct {
	mu   sync.Mutex
	job  Job
	stop string // why it must stop: "cancelled", "lost" (another runner has it)
}

// errStopped ends a job that was cancelled or taken over.
var errStopped = errors.New("job stopped")

// execute runs a job this process has claimed, from its cursor to its end.
func (s *Service) execute(ctx context.Context, j Job) (Job, error) {
	rs := &runState{job: j}
	hbCtx, stopHB := context.WithCancel(ctx)
	var hb sync.WaitGroup
	hb.Go(func() { s.heartbeat(hbCtx, rs) })
	err := s.work(ctx, rs)
	stopHB()
	hb.Wait()

	rs.mu.Lock()
	defer rs.mu.Unlock()
	j = rs.job
	switch {
	case err == nil:
		j.State, j.FinishedAt, j.HeartbeatAt = JobDone, s.stamp(), s.stamp()
	case errors.Is(err, errStopped):
		s.log.Info("reprice job stopped", "job_id", j.ID, "reason", rs.stop)
		s.progress(j)
		return j, fmt.Errorf("reprice job %s: %s", j.ID, rs.stop)
	case ctx.Err() != nil:
		// A stop: back in the queue at the last checkpoint, resumed by the next runner.
		rs.job = j
		s.requeueLocked(rs)
		j.State = JobQueued
		s.progress(j)
		return j, fmt.Errorf("reprice job %s interrupted at %s, queued again: %w", j.ID, j.Cursor.Format(time.RFC3339), ctx.Err())
	default:
		j.State, j.FinishedAt, j.Error = JobFailed, s.stamp(), err.Error()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if aerr := s.audit(fctx, event(TypeJobFinished, j.Org, s.cfg.Runner, j.ID, j.FinishedAt, JobEventData{Job: j})); aerr != nil {
		// Not recorded as finished without its event: it stays running, and is resumed
		// (and finishes at once) when its heartbeat is stale.
		s.log.Warn("cannot write the end of a reprice job to the trail; it will be finished again", "job_id", j.ID, "err", aerr)
		return j, aerr
	}
	if werr := s.st.InsertJob(fctx, j.row(s.finalVersion())); werr != nil {
		return j, werr
	}
	s.m.jobs.WithLabelValues(string(j.State)).Inc()
	s.log.Info("reprice job finished", "job_id", j.ID, "state", j.State, "org_id", j.Org, "catalog_version", j.CatalogVersion,
		"rows_scanned", j.RowsScanned, "rows_changed", j.RowsChanged, "err", j.Error)
	s.progress(j)
	if j.State == JobFailed {
		return j, fmt.Errorf("reprice job %s failed: %s", j.ID, j.Error)
	}
	return j, nil
}

func (s *Service) progress(j Job) {
	if s.cfg.OnProgress != nil {
		s.cfg.OnProgress(j)
	}
}

// work reprices the job's days from its cursor on, checkpointing after each day.
func (s *Service) work(ctx context.Context, rs *runState) error {
	rs.mu.Lock()
	j := rs.job
	rs.mu.Unlock()
	if j.CatalogVersion == 0 { // pinned at the first start: a resumed job keeps its prices
		// The newest version stored, not this process's copy (refreshed every 2 s): a
		// price set through another process just before must be the one applied.
		if err := s.Refresh(ctx); err != nil {
			return fmt.Errorf("cannot read the newest price catalog before repricing: %w", err)
		}
		j.CatalogVersion = s.CurrentVersion()
		if j.CatalogVersion == 0 {
			return errors.New("the price catalog is not stored in ClickHouse yet")
		}
	}
	cat, err := s.catalogAt(ctx, j.CatalogVersion)
	if err != nil {
		return err
	}
	dir, err := s.directory(ctx)
	if err != nil {
		return err
	}
	rs.mu.Lock()
	rs.job.CatalogVersion = j.CatalogVersion
	rs.mu.Unlock()
	if err := s.checkpoint(ctx, rs, nil); err != nil {
		return err
	}
	for i, d := range days(j.From, j.To) {
		if !j.Cursor.IsZero() && !d[1].After(j.Cursor) {
			continue // done before an interruption
		}
		start := d[0]
		if j.Cursor.After(start) {
			start = j.Cursor
		}
		began := time.Now()
		var day ingest.RepriceResult
		var orgs []string
		err := s.retry(ctx, func() error {
			day = ingest.RepriceResult{}
			orgs = []string{j.Org}
			if j.Org == "*" {
				var err error
				if orgs, err = s.st.UsageOrgs(ctx, start, d[1]); err != nil {
					return err
				}
			}
			for _, org := range orgs {
				res, err := ingest.RepriceRange(ctx, s.st, dir, cat, org, j.Agent, start, d[1])
				if err != nil {
					return err
				}
				day.Scanned += res.Scanned
				day.Changed += res.Changed
				day.CostBefore += res.CostBefore
				day.CostAfter += res.CostAfter
				day.StillUnpriced += res.StillUnpriced
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.m.rowsChanged.Add(float64(day.Changed))
		s.log.Debug("reprice job day done", "job_id", j.ID, "day", d[0], "orgs", len(orgs), "rows_scanned", day.Scanned,
			"rows_changed", day.Changed, "took", time.Since(began))
		j.Cursor = d[1]
		if err := s.checkpoint(ctx, rs, func(p *Job) {
			p.Cursor, p.DaysDone = d[1], i+1
			p.RowsScanned += uint64(day.Scanned)
			p.RowsChanged += uint64(day.Changed)
			p.StillUnpriced += uint64(day.StillUnpriced)
			p.CostBefore = p.CostBefore.Add(decimal.New(day.CostBefore, -6))
			p.CostAfter = p.CostAfter.Add(decimal.New(day.CostAfter, -6))
		}); err != nil {
			return err
		}
		rs.mu.Lock()
		snap := rs.job
		rs.mu.Unlock()
		s.progress(snap)
	}
	return nil
}

// retryTries bounds the tries of one day of a job: with the default back-off (1 s,
// doubled up to a minute) a ClickHouse outage of some four minutes fails the job.
const retryTries = 8

// retry runs a day's work until it succeeds, backing off between tries; a stop, an
// error no retry can pass (store.Permanent) or the last try's error ends it.
func (s *Service) retry(ctx context.Context, f func() error) error {
	wait := s.cfg.Retry
	var err error
	for try := 1; ; try++ {
		if err = f(); err == nil || ctx.Err() != nil || store.Permanent(err) || try == retryTries {
			return err
		}
		s.log.Warn("reprice job day failed, will retry", "err", err, "try", try, "wait", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}

// checkpoint applies update to the job and writes it with a fresh heartbeat, unless
// the job was cancelled or taken over since (errStopped).
func (s *Service) checkpoint(ctx context.Context, rs *runState, update func(*Job)) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.stop != "" {
		return errStopped
	}
	if err := s.owned(ctx, rs); err != nil {
		return err
	}
	if update != nil {
		update(&rs.job)
	}
	rs.job.HeartbeatAt = s.stamp()
	return s.st.InsertJob(ctx, rs.job.row(s.nextVersion()))
}

// owned checks that the stored job is still this runner's and running; rs.mu is held.
func (s *Service) owned(ctx context.Context, rs *runState) error {
	rows, err := s.st.Jobs(ctx, store.JobFilter{ID: rs.job.ID})
	if err != nil {
		return err
	}
	switch {
	case len(rows) == 0:
		rs.stop = "its row is gone"
	case rows[0].State == string(JobCancelled):
		rs.stop = "cancelled: " + rows[0].Error
	case JobState(rows[0].State).Finished():
		rs.stop = "already " + rows[0].State
	case rows[0].Runner != s.cfg.Runner:
		rs.stop = "taken over by runner " + rows[0].Runner
	default:
		return nil
	}
	return errStopped
}

// heartbeat writes the job's heartbeat every Heartbeat until ctx ends, and notices a
// cancellation (the day being repriced is finished first: work stops at its next
// checkpoint).
func (s *Service) heartbeat(ctx context.Context, rs *runState) {
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.checkpoint(ctx, rs, nil); err != nil && !errors.Is(err, errStopped) && ctx.Err() == nil {
			s.log.Warn("cannot write a reprice job's heartbeat", "job_id", rs.job.ID, "err", err)
		}
	}
}

// requeue puts a job this process was running back in the queue at its checkpoint.
func (s *Service) requeue(rs *runState) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s.requeueLocked(rs)
}

func (s *Service) requeueLocked(rs *runState) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rs.stop != "" || s.owned(ctx, rs) != nil {
		return
	}
	j := rs.job
	j.State, j.Runner = JobQueued, ""
	if err := s.st.InsertJob(ctx, j.row(s.nextVersion())); err != nil {
		s.log.Warn("cannot put an interrupted reprice job back in the queue; it is resumed when its heartbeat is stale",
			"job_id", j.ID, "err", err)
	}
}
