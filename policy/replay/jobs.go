package replay

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/share"
)

// Bounds of a bundle sent as a tarball (the GraphQL mutation startPolicyReplay).
const (
	MaxTarballBytes = 1 << 20 // the tarball as sent, gzipped or not
	MaxBundleBytes  = 4 << 20 // its files, unpacked
	MaxBundleFiles  = 256
	// JobExamples is how many examples of each flip class a job keeps, for paging:
	// with Config.CodesOnly, a job's result stays within about 1.5 MB, and an
	// organization's kept jobs (DefaultKeepPerOrg) within about 30 MB.
	JobExamples = 100
)

// ReadTarball unpacks a bundle (a tar, gzipped or not, of .rego files and data.json
// files, in folders or not) into dir. Every bound is checked as it reads: the size
// unpacked, the number of files, their names (relative, no "..", no links), so no
// tarball writes outside dir or more than MaxBundleBytes into it.
func ReadTarball(b []byte, dir string) error {
	if len(b) > MaxTarballBytes {
		return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("the tarball is %d bytes, more than %d", len(b), MaxTarballBytes)}
	}
	var r io.Reader = bytes.NewReader(b)
	if len(b) >= 2 && b[0] == 0x1f && b[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return &schema.FieldError{Field: "bundle", Reason: "not a gzip stream: " + err.Error()}
		}
		defer func() { _ = zr.Close() }()
		r = zr
	}
	tr := tar.NewReader(io.LimitReader(r, MaxBundleBytes+64<<10)) // the tar's own headers besides
	files, total := 0, int64(0)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &schema.FieldError{Field: "bundle", Reason: "not a tar archive (or truncated): " + err.Error()}
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		switch {
		case h.Typeflag == tar.TypeDir:
			continue
		case h.Typeflag != tar.TypeReg:
			return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("%s: only regular files and folders may be in a bundle", quote(h.Name))}
		case name == "." || strings.HasPrefix(name, "/") || name == ".." || strings.HasPrefix(name, "../") || strings.Contains(name, "\\"):
			return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("%s: a file name must be a relative path inside the bundle", quote(h.Name))}
		case !strings.HasSuffix(name, ".rego") && path.Base(name) != "data.json":
			return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("%s: a bundle holds .rego files and data.json files only", quote(h.Name))}
		}
		if files++; files > MaxBundleFiles {
			return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("more than %d files", MaxBundleFiles)}
		}
		if total += h.Size; h.Size < 0 || total > MaxBundleBytes {
			return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("more than %d bytes unpacked", MaxBundleBytes)}
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("%s is in the tarball twice", quote(name))}
			}
			return err
		}
		_, err = io.Copy(f, io.LimitReader(tr, h.Size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("%s: cannot unpack: %v", quote(name), err)}
		}
	}
	if files == 0 {
		return &schema.FieldError{Field: "bundle", Reason: "the tarball holds no policy file"}
	}
	return nil
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// Job states.
const (
	JobRunning = "running"
	JobDone    = "done"
	JobFailed  = "failed"
)

// Job is one replay run in the background, as the API shows it.
type Job struct {
	ID, Org, RequestedBy string
	From, To             time.Time
	// Scoped says the replay reads the organization's own trail only (Config.Scoped):
	// a tenant's job; a platform key's reads the whole trail, as the CLI does.
	Scoped     bool
	CreatedAt  time.Time
	FinishedAt time.Time // zero while running
	State      string
	Error      string
	Digest     string
	Progress   Progress
	Result     *Result // once done
	// owner is the organization of the key that started it: its jobs are kept
	// within its KeepPerOrg.
	owner string
}

// JobsConfig configures Jobs.
type JobsConfig struct {
	Source Source
	// Baseline returns the bundle serving now, the baseline of a tenant's replay; nil
	// (no policy serves: serve --no-policy) refuses tenants' replays.
	Baseline func() fs.FS
	Catalog  pricing.Source
	Logger   *slog.Logger
	// Limits bound the jobs running at once.
	Limits JobLimits
	// Run runs one replay (default Run, in this process): serve's runs each in a
	// process of its own, with a memory bound.
	Run func(context.Context, Config) (*Result, error)
	// MaxDuration bounds how long one job runs (default DefaultMaxJobDuration,
	// --policy-replay-timeout): a candidate slow on every decision cannot hold its
	// organization's place for good.
	MaxDuration time.Duration
	// Keep is how long a finished job stays to be read (default 24 h); KeepPerOrg
	// bounds those kept of one organization (default DefaultKeepPerOrg; its oldest
	// finished go first), so that one organization's jobs never push out another's.
	Keep       time.Duration
	KeepPerOrg int
	Now        func() time.Time
}

// JobLimits bound the replays running at once: in all (--max-policy-replays; one place
// of two or more is the platform's keys' only), of one organization's keys
// (--max-policy-replays-per-org) and of one key (--max-policy-replays-per-key). Zero
// fields take the defaults.
type JobLimits struct {
	Total, PerOrg, PerKey int
}

// Defaults of JobLimits: a replay takes a core while it runs (its evaluations run
// one at a time).
const (
	DefaultMaxJobs       = 4
	DefaultMaxJobsPerOrg = 1
	DefaultMaxJobsPerKey = 1
)

// Defaults of JobsConfig.
const (
	DefaultMaxJobDuration = time.Hour
	DefaultKeepPerOrg     = 20
)

// Jobs runs replays in the background for the API: one organization's decisions each
// (a platform key's may name any), bounded like every shared resource.
type Jobs struct {
	cfg  JobsConfig
	ctx  context.Context
	pool *share.Pool

	mu   sync.Mutex
	jobs map[string]*Job
}

// NewJobs returns a registry whose jobs run until ctx ends.
func NewJobs(ctx context.Context, cfg JobsConfig) *Jobs {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 24 * time.Hour
	}
	if cfg.KeepPerOrg <= 0 {
		cfg.KeepPerOrg = DefaultKeepPerOrg
	}
	if cfg.MaxDuration <= 0 {
		cfg.MaxDuration = DefaultMaxJobDuration
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Run == nil {
		cfg.Run = Run
	}
	l := cfg.Limits
	if l.Total <= 0 {
		l.Total = DefaultMaxJobs
	}
	if l.PerOrg <= 0 {
		l.PerOrg = DefaultMaxJobsPerOrg
	}
	if l.PerKey <= 0 {
		l.PerKey = DefaultMaxJobsPerKey
	}
	return &Jobs{cfg: cfg, ctx: ctx, pool: share.Few(l.Total, l.PerOrg, l.PerKey, keys.PlatformOrg), jobs: map[string]*Job{}}
}

// Start unpacks the bundle and starts replaying org's decisions of [from, to) with it
// (org keys.PlatformOrg, or "", is every organization's, for a platform key). A tarball that cannot be
// unpacked is refused at once (schema.ErrInvalid), as are too many jobs of the key, the
// organization or in all (schema.ErrTooMany); a bundle whose checks fail (its Rego
// tests, the builtins) fails the job, which says why.
func (j *Jobs) Start(by keys.Key, org string, tarball []byte, from, to time.Time) (Job, error) {
	if !from.Before(to) {
		return Job{}, &schema.FieldError{Field: "from", Reason: fmt.Sprintf("%s is not before to (%s)", from.Format(time.RFC3339), to.Format(time.RFC3339))}
	}
	if to.Sub(from) > 31*24*time.Hour {
		return Job{}, &schema.FieldError{Field: "to", Reason: "a replay covers at most 31 days"}
	}
	// A tenant's candidate is code of the tenant's: it reads the tenant's own trail
	// only, so neither its reasons nor its answers can tell another organization's.
	// What it is compared with is the bundle serving.
	scoped := !by.Platform()
	if org == keys.PlatformOrg {
		org = ""
	}
	var baseline fs.FS
	if scoped {
		if j.cfg.Baseline != nil {
			baseline = j.cfg.Baseline()
		}
		if baseline == nil {
			return Job{}, fmt.Errorf("%w: this server serves no policy (--no-policy), and an organization's replay is compared with the bundle serving", schema.ErrUnavailable)
		}
	}
	release, refused := j.pool.Take(by.Org, by.ID)
	if refused != nil {
		// Not how many: the places of the whole server are shared, but how many other
		// organizations hold is theirs.
		msg := "the server runs as many policy replays as it may at once (--max-policy-replays); retry later"
		switch refused.Bound {
		case share.BoundClient:
			msg = fmt.Sprintf("%d policy replays of this key are running, the most one key runs at once (--max-policy-replays-per-key); retry when one ends", refused.Limit)
		case share.BoundGroup:
			msg = fmt.Sprintf("%d policy replays of organization %s are running, the most one organization runs at once (--max-policy-replays-per-org); retry when one ends", refused.Limit, by.Org)
		}
		return Job{}, fmt.Errorf("%w: %s", schema.ErrTooMany, msg)
	}
	dir, err := os.MkdirTemp("", "bandplane-replay-")
	if err != nil {
		release()
		return Job{}, err
	}
	done := func() { release(); _ = os.RemoveAll(dir) }
	if err := ReadTarball(tarball, dir); err != nil {
		done()
		return Job{}, err
	}
	bundle := os.DirFS(dir)
	digest, err := Digest(bundle)
	if err != nil {
		done()
		return Job{}, err
	}
	now := j.cfg.Now().UTC()
	job := &Job{ID: "replay-" + schema.NewID(), Org: org, RequestedBy: by.ID, From: from.UTC(), To: to.UTC(), Scoped: scoped, CreatedAt: now,
		State: JobRunning, Digest: digest, owner: by.Org}
	j.mu.Lock()
	j.sweepLocked(now, by.Org)
	j.jobs[job.ID] = job
	j.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(j.ctx, j.cfg.MaxDuration)
		res, err := j.cfg.Run(ctx, Config{Source: j.cfg.Source, Bundle: bundle, From: from, To: to, Org: org, Scoped: scoped, Baseline: baseline,
			Catalog: j.cfg.Catalog, Examples: JobExamples, Workers: 1, CodesOnly: true,
			Logger: j.cfg.Logger, ProgressEvery: 1000, Progress: func(p Progress) {
				j.mu.Lock()
				job.Progress = p
				j.mu.Unlock()
			}})
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("the replay ran longer than %s (--policy-replay-timeout) and was stopped; replay a shorter range", j.cfg.MaxDuration)
		}
		cancel()
		// The place is free before the job shows as ended: a client that starts the
		// next one when it sees this one end is not refused.
		done()
		j.mu.Lock()
		defer j.mu.Unlock()
		job.FinishedAt = j.cfg.Now().UTC()
		if err != nil {
			job.State, job.Error = JobFailed, err.Error()
			j.cfg.Logger.Warn("policy replay failed", "job", job.ID, "org", org, "err", err)
			return
		}
		job.State, job.Result = JobDone, res
	}()
	return j.view(job), nil
}

// Get returns job id of organization org to key by (org keys.PlatformOrg: any, for a
// platform key). A job of another organization is not found, nor, for an
// organization's key, a platform key's job on it: that one read the whole trail.
func (j *Jobs) Get(by keys.Key, org, id string) (Job, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	job, ok := j.jobs[id]
	switch {
	case !ok:
		return Job{}, false
	case by.Platform():
		ok = org == keys.PlatformOrg || job.Org == org
	default:
		ok = by.MayActOn(org) && job.Org == org && job.Scoped
	}
	if !ok {
		return Job{}, false
	}
	return *job, true
}

func (j *Jobs) view(job *Job) Job {
	j.mu.Lock()
	defer j.mu.Unlock()
	return *job
}

// sweepLocked forgets finished jobs older than Keep, and, to make room for a job that
// owner's key starts, owner's oldest finished beyond KeepPerOrg: another
// organization's stay.
func (j *Jobs) sweepLocked(now time.Time, owner string) {
	var oldest *Job
	kept := 0
	for id, job := range j.jobs {
		if job.State != JobRunning && now.Sub(job.FinishedAt) > j.cfg.Keep {
			delete(j.jobs, id)
			continue
		}
		if job.owner != owner {
			continue
		}
		kept++
		if job.State != JobRunning && (oldest == nil || job.FinishedAt.Before(oldest.FinishedAt)) {
			oldest = job
		}
	}
	if kept >= j.cfg.KeepPerOrg && oldest != nil {
		delete(j.jobs, oldest.ID)
	}
}
