package replay_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

type tarFile struct {
	name string
	body []byte
	typ  byte
}

func tarball(t *testing.T, gz bool, files ...tarFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w *tar.Writer
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = tar.NewWriter(zw)
	} else {
		w = tar.NewWriter(&buf)
	}
	for _, f := range files {
		typ := f.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: typ}
		if typ == tar.TypeSymlink {
			h.Linkname, h.Size = "/etc/passwd", 0
		}
		require.NoError(t, w.WriteHeader(h))
		if typ == tar.TypeReg {
			_, err := w.Write(f.body)
			require.NoError(t, err)
		}
	}
	require.NoError(t, w.Close())
	if zw != nil {
		require.NoError(t, zw.Close())
	}
	return buf.Bytes()
}

func defaultBundle(t *testing.T) []tarFile {
	t.Helper()
	var out []tarFile
	require.NoError(t, fs.WalkDir(policy.DefaultBundle(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(policy.DefaultBundle(), p)
		out = append(out, tarFile{name: p, body: b})
		return err
	}))
	return out
}

func TestReadTarballRefusesHostileArchives(t *testing.T) {
	ok := tarFile{name: "x.rego", body: []byte("package x\n")}
	many := []tarFile{}
	for i := range replay.MaxBundleFiles + 1 {
		many = append(many, tarFile{name: strings.Repeat("a", 1+i%50) + string(rune('a'+i%26)) + strings.Repeat("b", i/26) + ".rego", body: []byte("package x\n")})
	}
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"traversal":     {tarball(t, false, tarFile{name: "../../etc/x.rego", body: []byte("x")}), "a relative path inside the bundle"},
		"absolute":      {tarball(t, false, tarFile{name: "/etc/x.rego", body: []byte("x")}), "a relative path inside the bundle"},
		"a link":        {tarball(t, false, tarFile{name: "x.rego", typ: tar.TypeSymlink}), "only regular files and folders"},
		"another file":  {tarball(t, false, tarFile{name: "run.sh", body: []byte("#!/bin/sh")}), ".rego files and data.json files only"},
		"twice":         {tarball(t, false, ok, ok), "in the tarball twice"},
		"too many":      {tarball(t, true, many...), "more than 256 files"},
		"a gzip bomb":   {tarball(t, true, tarFile{name: "big.rego", body: make([]byte, replay.MaxBundleBytes+1)}), "bytes unpacked"},
		"not a tar":     {[]byte("hello, this is not a tarball at all, just text"), "not a tar archive"},
		"broken gzip":   {[]byte{0x1f, 0x8b, 0, 1, 2}, "not a gzip stream"},
		"empty":         {tarball(t, false), "holds no policy file"},
		"too large":     {make([]byte, replay.MaxTarballBytes+1), "more than 1048576"},
		"truncated tar": {tarball(t, false, tarFile{name: "x.rego", body: make([]byte, 2000)})[:1000], `"x.rego": cannot unpack: unexpected EOF`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			err := replay.ReadTarball(tc.b, dir)
			require.Error(t, err)
			assert.ErrorIs(t, err, schema.ErrInvalid)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// blocked is a Source whose decisions wait until released: a job that stays running.
type blocked struct {
	replay.Source
	release chan struct{}
}

func (b blocked) Decisions(ctx context.Context, from, to time.Time, org string) (replay.Cursor, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return b.Source.Decisions(ctx, from, to, org)
}

func TestJobsRunPerOrganizationWithinTheirShare(t *testing.T) {
	release := make(chan struct{})
	jobs := replay.NewJobs(t.Context(), replay.JobsConfig{Source: blocked{Source: trail(t), release: release}, Baseline: policy.DefaultBundle})
	admin := keys.Key{ID: "k-acme", Org: "acme", Role: keys.RoleAdmin}
	b := tarball(t, true, defaultBundle(t)...)
	job, err := jobs.Start(admin, "acme", b, day, day.Add(24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, replay.JobRunning, job.State)
	assert.Contains(t, job.Digest, "sha256:")
	assert.True(t, job.Scoped, "an organization's key replays over its own trail only")

	_, err = jobs.Start(admin, "acme", b, day, day.Add(24*time.Hour))
	assert.ErrorIs(t, err, schema.ErrTooMany, "one replay of a key at once")
	assert.ErrorContains(t, err, "--max-policy-replays-per-key")
	_, err = jobs.Start(keys.Key{ID: "k-acme-2", Org: "acme", Role: keys.RoleAdmin}, "acme", b, day, day.Add(24*time.Hour))
	assert.ErrorContains(t, err, "--max-policy-replays-per-org", "one replay of an organization at once")
	ops := keys.Key{ID: "k-ops", Org: keys.PlatformOrg, Role: keys.RoleAdmin}
	platform, err := jobs.Start(ops, "acme", b, day, day.Add(24*time.Hour))
	require.NoError(t, err, "the platform's place is its own")
	assert.False(t, platform.Scoped, "a platform key's replay reads the whole trail")
	_, err = jobs.Start(admin, "acme", b, day.Add(time.Hour), day)
	assert.ErrorIs(t, err, schema.ErrInvalid)
	_, ok := jobs.Get(keys.Key{ID: "k-globex", Org: "globex", Role: keys.RoleAdmin}, "globex", job.ID)
	assert.False(t, ok, "another organization's job is not found")

	close(release)
	require.Eventually(t, func() bool {
		j, _ := jobs.Get(admin, "acme", job.ID)
		return j.State != replay.JobRunning
	}, 30*time.Second, 20*time.Millisecond)
	done, ok := jobs.Get(admin, "acme", job.ID)
	require.True(t, ok)
	require.Equal(t, replay.JobDone, done.State, done.Error)
	assert.Equal(t, 1, done.Result.Decisions)
	assert.Equal(t, 1, done.Result.Unchanged)
	assert.Zero(t, done.Result.OutOfScope, "the decision reads acme's own state only")
	require.Eventually(t, func() bool {
		j, _ := jobs.Get(ops, "acme", platform.ID)
		return j.State != replay.JobRunning
	}, 30*time.Second, 20*time.Millisecond)
	mine, ok := jobs.Get(ops, "acme", platform.ID)
	require.True(t, ok, "a platform key reads its job on an organization by naming it")
	assert.Equal(t, replay.JobDone, mine.State, mine.Error)
	_, ok = jobs.Get(admin, "acme", platform.ID)
	assert.False(t, ok, "a platform key's job read the whole trail: the organization does not see it")
	_, ok = jobs.Get(keys.Key{ID: "k-globex", Org: "globex", Role: keys.RoleAdmin}, "acme", job.ID)
	assert.False(t, ok, "a key of another organization naming this one finds nothing")
	every, err := jobs.Start(ops, keys.PlatformOrg, b, day, day.Add(24*time.Hour))
	require.NoError(t, err)
	assert.Empty(t, every.Org, "orgId '*' replays every organization's decisions")
	all := waitFinished(t, jobs, ops, keys.PlatformOrg, every.ID)
	require.Equal(t, replay.JobDone, all.State, all.Error)
	assert.Equal(t, 1, all.Result.Decisions)

	// A bundle that fails its checks fails its job, which says why.
	bad := append(defaultBundle(t), tarFile{name: "leak.rego", body: []byte("package bandplane.leak\n\nx := http.send({})\n")})
	job, err = jobs.Start(admin, "acme", tarball(t, false, bad...), day, day.Add(24*time.Hour))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		j, _ := jobs.Get(admin, "acme", job.ID)
		return j.State == replay.JobFailed
	}, 30*time.Second, 20*time.Millisecond)
	failed, _ := jobs.Get(admin, "acme", job.ID)
	assert.Contains(t, failed.Error, "calls http.send")
	assert.False(t, errors.Is(err, schema.ErrTooMany))
}

// waitFinished waits for job id of org to end and returns it.
func waitFinished(t *testing.T, jobs *replay.Jobs, by keys.Key, org, id string) replay.Job {
	t.Helper()
	require.Eventually(t, func() bool {
		j, _ := jobs.Get(by, org, id)
		return j.State != replay.JobRunning
	}, 30*time.Second, 5*time.Millisecond)
	j, _ := jobs.Get(by, org, id)
	return j
}

func TestJobsRunOneCoreAndCodesOnlyWithinTheirTime(t *testing.T) {
	var got replay.Config
	ran := make(chan struct{}, 1)
	jobs := replay.NewJobs(t.Context(), replay.JobsConfig{Source: trail(t), Baseline: policy.DefaultBundle, MaxDuration: 50 * time.Millisecond,
		Run: func(ctx context.Context, cfg replay.Config) (*replay.Result, error) {
			got = cfg
			ran <- struct{}{}
			// A candidate slow on every decision: the job's deadline ends it.
			<-ctx.Done()
			return nil, ctx.Err()
		}})
	admin := keys.Key{ID: "k-acme", Org: "acme", Role: keys.RoleAdmin}
	job, err := jobs.Start(admin, "acme", tarball(t, true, defaultBundle(t)...), day, day.Add(24*time.Hour))
	require.NoError(t, err)
	failed := waitFinished(t, jobs, admin, "acme", job.ID)
	<-ran
	assert.Equal(t, 1, got.Workers, "a job's evaluations run one at a time")
	assert.True(t, got.CodesOnly, "a job keeps reason codes only")
	assert.Equal(t, replay.JobFailed, failed.State)
	assert.Contains(t, failed.Error, "ran longer than 50ms (--policy-replay-timeout)")
	_, err = jobs.Start(admin, "acme", tarball(t, true, defaultBundle(t)...), day, day.Add(24*time.Hour))
	assert.NoError(t, err, "the stopped job gave its place back")
}

func TestJobsOfATenantNeedAServingBundle(t *testing.T) {
	jobs := replay.NewJobs(t.Context(), replay.JobsConfig{Source: trail(t)}) // serve --no-policy
	b := tarball(t, true, defaultBundle(t)...)
	_, err := jobs.Start(keys.Key{ID: "k-acme", Org: "acme", Role: keys.RoleAdmin}, "acme", b, day, day.Add(24*time.Hour))
	assert.ErrorIs(t, err, schema.ErrUnavailable)
	assert.ErrorContains(t, err, "--no-policy")
	ops := keys.Key{ID: "k-ops", Org: keys.PlatformOrg, Role: keys.RoleAdmin}
	job, err := jobs.Start(ops, "acme", b, day, day.Add(24*time.Hour))
	require.NoError(t, err, "a platform key's replay compares with the recorded answers only")
	assert.Equal(t, replay.JobDone, waitFinished(t, jobs, ops, "acme", job.ID).State)
}

func TestJobsKeptPerOrganization(t *testing.T) {
	now := day
	jobs := replay.NewJobs(t.Context(), replay.JobsConfig{Source: trail(t), Baseline: policy.DefaultBundle, KeepPerOrg: 2,
		Now: func() time.Time { now = now.Add(time.Second); return now },
		Run: func(context.Context, replay.Config) (*replay.Result, error) { return &replay.Result{}, nil }})
	b := tarball(t, true, defaultBundle(t)...)
	key := func(org string) keys.Key { return keys.Key{ID: "k-" + org, Org: org, Role: keys.RoleAdmin} }
	start := func(org string) string {
		t.Helper()
		job, err := jobs.Start(key(org), org, b, day, day.Add(24*time.Hour))
		require.NoError(t, err)
		waitFinished(t, jobs, key(org), org, job.ID)
		return job.ID
	}
	globex := start("globex")
	var acme []string
	for range 5 {
		acme = append(acme, start("acme"))
	}
	_, ok := jobs.Get(key("globex"), "globex", globex)
	assert.True(t, ok, "acme's jobs do not push out globex's")
	for i, id := range acme {
		_, ok := jobs.Get(key("acme"), "acme", id)
		assert.Equal(t, i >= 3, ok, "acme keeps its two newest jobs: job %d", i)
	}
}

func TestJobsRefusedForTheServerSayNotHowManyOthersRun(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	jobs := replay.NewJobs(t.Context(), replay.JobsConfig{Source: blocked{Source: trail(t), release: release}, Baseline: policy.DefaultBundle,
		Limits: replay.JobLimits{Total: 2}})
	b := tarball(t, true, defaultBundle(t)...)
	_, err := jobs.Start(keys.Key{ID: "k-globex", Org: "globex", Role: keys.RoleAdmin}, "globex", b, day, day.Add(24*time.Hour))
	require.NoError(t, err)
	_, err = jobs.Start(keys.Key{ID: "k-acme", Org: "acme", Role: keys.RoleAdmin}, "acme", b, day, day.Add(24*time.Hour))
	require.ErrorIs(t, err, schema.ErrTooMany)
	assert.ErrorContains(t, err, "(--max-policy-replays)")
	assert.NotRegexp(t, `[0-9]`, err.Error(), "how many replays other organizations run is theirs")
}
