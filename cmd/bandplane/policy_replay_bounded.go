package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema/pricing"
)

// A replay evaluates a candidate bundle's Rego, which may be a tenant's. One builtin
// call (a nested replace, numbers.range) can allocate gigabytes in a single step, which
// no evaluation deadline stops. So a bounded replay runs in a child process of its
// own: the hidden command below, whose address space is capped (RLIMIT_AS) and whose
// Go heap is held under the same figure. At the bound the child dies. The process that
// asked, serve or the CLI, reports it and keeps running.

// replayChildCommand is the hidden command a bounded replay runs its own binary with.
// The spec comes on stdin; progress lines (replayProgressPrefix, then JSON) and errors
// go to stderr; the result document goes to stdout.
const (
	replayChildCommand   = "policy-replay-child"
	replayProgressPrefix = "replay-progress "
	// DefaultReplayMaxMemory bounds a bounded replay's child process: its Go heap, and
	// its address space beyond what it held when it started.
	defaultReplayMaxMemory = 2 << 30
	// maxReplayResult bounds the result document read back from the child.
	maxReplayResult = 64 << 20
)

func init() {
	commands[replayChildCommand] = command{hidden: true, run: runPolicyReplayChild,
		summary: "one bounded policy replay (serve's jobs and gate and `policy replay` run this command themselves)"}
}

// replayRunFunc runs one replay: replay.Run, or boundedReplays.Run.
type replayRunFunc = func(context.Context, replay.Config) (*replay.Result, error)

// replayRunner runs replays in child processes bounded to maxMemory bytes, or in this
// process, unbounded, with 0.
func replayRunner(st stackFlags, maxMemory int64) (replayRunFunc, error) {
	if maxMemory == 0 {
		return replay.Run, nil
	}
	b, err := newBoundedReplays(st, maxMemory)
	if err != nil {
		return nil, err
	}
	return b.Run, nil
}

// replaySpec is what a child replays: replay.Config without the parts that cannot
// cross a process (the source is the child's ClickHouse, the bundles are folders).
type replaySpec struct {
	Bundle      string        `json:"bundle"`
	Baseline    string        `json:"baseline,omitempty"`
	From        time.Time     `json:"from"`
	To          time.Time     `json:"to"`
	Org         string        `json:"org,omitempty"`
	Scoped      bool          `json:"scoped,omitempty"`
	Kinds       []string      `json:"kinds,omitempty"`
	Examples    int           `json:"examples,omitempty"`
	Warmup      time.Duration `json:"warmup,omitempty"`
	EvalTimeout time.Duration `json:"eval_timeout,omitempty"`
	// Workers, when set, is also the child's GOMAXPROCS: a job's replay takes that many
	// cores at most.
	Workers   int          `json:"workers,omitempty"`
	CodesOnly bool         `json:"codes_only,omitempty"`
	MaxMemory int64        `json:"max_memory"`
	Catalog   *catalogSpec `json:"catalog,omitempty"`
}

// catalogSpec is a price catalog as it crosses to the child: the replica prices usage
// with it, as the live one did.
type catalogSpec struct {
	Version  string          `json:"version"`
	Currency string          `json:"currency"`
	Prices   []pricing.Price `json:"prices"`
}

// boundedReplays runs replays in child processes that read ClickHouse through st (the
// password, BANDPLANE_CLICKHOUSE_PASSWORD, is in the environment they inherit).
type boundedReplays struct {
	st        stackFlags
	maxMemory int64
	exe       string
}

func newBoundedReplays(st stackFlags, maxMemory int64) (*boundedReplays, error) {
	if maxMemory < 64<<20 {
		return nil, fmt.Errorf("the memory bound of a policy replay must be at least 64 MiB, got %d bytes", maxMemory)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find this binary to run policy replays with: %w", err)
	}
	return &boundedReplays{st: st, maxMemory: maxMemory, exe: exe}, nil
}

// Run replays cfg in a child process; cfg.Source is not used (the child reads the
// trail from ClickHouse), nor cfg.Logger.
func (b *boundedReplays) Run(ctx context.Context, cfg replay.Config) (*replay.Result, error) {
	dir, err := os.MkdirTemp("", "bandplane-replay-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	spec := replaySpec{Bundle: filepath.Join(dir, "bundle"), From: cfg.From, To: cfg.To, Org: cfg.Org, Scoped: cfg.Scoped, Kinds: cfg.Kinds,
		Examples: cfg.Examples, Warmup: cfg.Warmup, EvalTimeout: cfg.EvalTimeout, Workers: cfg.Workers, CodesOnly: cfg.CodesOnly, MaxMemory: b.maxMemory}
	if err := writeFolder(cfg.Bundle, spec.Bundle); err != nil {
		return nil, err
	}
	if cfg.Baseline != nil {
		spec.Baseline = filepath.Join(dir, "baseline")
		if err := writeFolder(cfg.Baseline, spec.Baseline); err != nil {
			return nil, err
		}
	}
	if cfg.Catalog != nil {
		c := cfg.Catalog.Current()
		spec.Catalog = &catalogSpec{Version: c.Version(), Currency: c.Currency(), Prices: c.Prices()}
	}
	in, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, b.exe, replayChildCommand,
		"--clickhouse", b.st.ch.Addr, "--clickhouse-db", b.st.ch.Database, "--clickhouse-user", b.st.ch.User,
		"--clickhouse-timeout", b.st.ch.ReadTimeout.String(), "--cluster", b.st.ch.Cluster)
	cmd.Stdin = bytes.NewReader(in)
	out := &limitedBuffer{max: maxReplayResult}
	cmd.Stdout = out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start the policy replay's process: %w", err)
	}
	failure := readChildStderr(stderr, cfg.Progress)
	werr := cmd.Wait()
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case werr != nil && failure.outOfMemory:
		return nil, fmt.Errorf("the replay needed more than its memory bound (%d MiB) and was stopped: the candidate's evaluation allocates without bound", b.maxMemory>>20)
	case werr != nil && failure.message != "":
		return nil, errors.New(failure.message)
	case werr != nil:
		return nil, fmt.Errorf("the policy replay's process failed (%w): %s", werr, finalLine(failure.tail))
	case out.over:
		return nil, fmt.Errorf("the policy replay's result is larger than %d MiB", maxReplayResult>>20)
	}
	var res replay.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("cannot read the policy replay's result: %w", err)
	}
	return &res, nil
}

// childFailure is what a child's stderr said: its error line, whether the runtime ran
// out of memory (its goroutine dump follows, longer than the tail kept), and the last
// bytes.
type childFailure struct {
	message     string
	outOfMemory bool
	tail        string
}

func readChildStderr(r io.Reader, progress func(replay.Progress)) childFailure {
	var f childFailure
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	const keep = 16 << 10
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, replayProgressPrefix); ok {
			var p replay.Progress
			if progress != nil && json.Unmarshal([]byte(rest), &p) == nil {
				progress(p)
			}
			continue
		}
		if strings.HasPrefix(line, "fatal error:") && strings.Contains(line, "out of memory") {
			f.outOfMemory = true
		}
		if rest, ok := strings.CutPrefix(line, "bandplane "+replayChildCommand+": "); ok && f.message == "" {
			f.message = rest
		}
		if f.tail += line + "\n"; len(f.tail) > keep {
			f.tail = f.tail[len(f.tail)-keep:]
		}
	}
	_, _ = io.Copy(io.Discard, r)
	return f
}

func finalLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// limitedBuffer keeps up to max bytes and notes whether more came.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.Len(); len(p) > room {
		l.over = true
		l.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return l.Buffer.Write(p)
}

// writeFolder writes a bundle's .rego and data.json files into a new folder.
func writeFolder(fsys fs.FS, dir string) error {
	return fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(p, ".rego") && filepath.Base(p) != "data.json") {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o600)
	})
}

// runPolicyReplayChild is the hidden command: it bounds its own memory, then replays.
func runPolicyReplayChild(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, replayChildCommand, "(the spec as JSON on stdin)")
	var st stackFlags
	st.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	fail := func(err error) error {
		fmt.Fprintf(e.stderr, "bandplane %s: %v\n", replayChildCommand, err)
		return exitError{code: 1}
	}
	raw, err := io.ReadAll(io.LimitReader(e.stdin, 64<<20))
	if err != nil {
		return fail(err)
	}
	var spec replaySpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fail(fmt.Errorf("cannot read the replay's spec: %w", err))
	}
	if spec.MaxMemory > 0 {
		if err := boundMemory(spec.MaxMemory); err != nil {
			return fail(err)
		}
	}
	if spec.Workers > 0 {
		runtime.GOMAXPROCS(spec.Workers)
	}
	cfg := replay.Config{Bundle: os.DirFS(spec.Bundle), From: spec.From, To: spec.To, Org: spec.Org, Scoped: spec.Scoped, Kinds: spec.Kinds,
		Examples: spec.Examples, Warmup: spec.Warmup, EvalTimeout: spec.EvalTimeout, Workers: spec.Workers, CodesOnly: spec.CodesOnly, Logger: e.log}
	if spec.Baseline != "" {
		cfg.Baseline = os.DirFS(spec.Baseline)
	}
	if c := spec.Catalog; c != nil {
		cat, err := pricing.New(c.Version, c.Currency, c.Prices)
		if err != nil {
			return fail(fmt.Errorf("cannot read the replay's price catalog: %w", err))
		}
		cfg.Catalog = cat
	}
	last := time.Time{}
	cfg.Progress = func(p replay.Progress) {
		if time.Since(last) < 500*time.Millisecond && p.Fraction < 1 {
			return
		}
		last = time.Now()
		b, _ := json.Marshal(p)
		fmt.Fprintf(e.stderr, "%s%s\n", replayProgressPrefix, b)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = conn.Close() }()
	cfg.Source = replay.ClickHouse{Conn: conn, Database: st.ch.Database}
	res, err := replay.Run(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	return printJSON(e.stdout, res)
}

// boundMemory caps this process: its Go heap at limit (the collector works harder near
// it) and its address space at what it maps now plus limit, so that one allocation
// past it fails at once instead of growing the machine's memory.
func boundMemory(limit int64) error {
	debug.SetMemoryLimit(limit)
	now, err := mappedBytes()
	if err != nil {
		return err
	}
	as := uint64(now + limit)
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: as, Max: as}); err != nil {
		return fmt.Errorf("cannot bound the replay's memory (RLIMIT_AS): %w", err)
	}
	return nil
}

// mappedBytes is the process's virtual size (VmSize of /proc/self/status).
func mappedBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("cannot read this process's size: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmSize:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cannot read this process's size from %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("cannot read this process's size: no VmSize in /proc/self/status")
}
