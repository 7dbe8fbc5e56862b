package dual

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/chdb"
)

// Step is one thing the code sent: a statement (its text as the server logged it) or a
// batch insert (its INSERT and the rows, kept in a staging table on the server).
type Step struct {
	N       int
	Method  string // Query, QueryRow, Select, Exec or Batch
	Caller  string // file:line of the call in bandplane's code (relative to the repository)
	QueryID string
	SQL     string // the statement as the server received it (arguments bound)
	Err     error  // what the server said on the recorded run, nil if it succeeded

	external   []External
	extErr     error
	resultRows string // the rows the server returned on the recorded run (query_log)
	stage      string // staging table of a batch
	columns    string // the batch's column list
}

// Recorder is a driver.Conn that records every statement and batch the code under test
// sends through it to ClickHouse 18.16 (see Database).
type Recorder struct {
	driver.Conn
	t     testing.TB
	db    string
	stage string // the staging database of batches
	id    string // query-id prefix

	mu    sync.Mutex
	steps []*Step
	// gate orders statements and sends as they took effect: a statement holds it
	// shared while it starts (until the call returns), a batch's Send exclusively, so no
	// statement can see a batch's rows before the batch's step is recorded, nor miss
	// them after.
	gate    sync.RWMutex
	batches int
}

// Database creates a unique database on the local 18.16 and migrates it through a
// Recorder (so the migrations are the first recorded steps). Both databases (the test's
// and the batches' staging one) are dropped at cleanup.
func Database(t testing.TB) (*Recorder, string) {
	t.Helper()
	stacktest.Require(t)
	name := stacktest.Name(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{stacktest.ClickHouseAddr()},
		Auth:        clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout: 5 * time.Second, ReadTimeout: 60 * time.Second,
		// Room for the staging batches and query_log reads beside the code's own: a
		// statement waiting for a connection holds the gate shared.
		MaxOpenConns: 32,
		// Every statement lands in system.query_log with the text the server ran.
		Settings: clickhouse.Settings{"log_queries": 1},
	})
	if err != nil {
		t.Fatalf("open ClickHouse: %v", err)
	}
	r := &Recorder{Conn: conn, t: t, db: name, stage: "s" + name, id: name + "-"}
	if err := conn.Exec(ctx, "CREATE DATABASE "+r.stage); err != nil {
		t.Fatalf("create the staging database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for _, db := range []string{name, r.stage, name + replaySuffix} {
			_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db)
		}
		conn.Close()
	})
	if _, err := chdb.Migrate(ctx, r, name); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return r, name
}

// DB is the recorded database's name.
func (r *Recorder) DB() string { return r.db }

// Steps are the recorded steps in the order they took effect (the texts are filled in
// by Replay).
func (r *Recorder) Steps() []*Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Step(nil), r.steps...)
}

var repoRoot = stacktest.RepoRoot()

// caller is the first frame outside this package and outside the connection
// wrappers (PassThrough): the call in bandplane's code.
func caller() string {
	pcs := make([]uintptr, 8)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if !strings.Contains(f.File, "/deploy/stacktest/dual/") && !passesThrough(f.File) {
			if rel, err := filepath.Rel(repoRoot, f.File); err == nil {
				return fmt.Sprintf("%s:%d", rel, f.Line)
			}
			return fmt.Sprintf("%s:%d", f.File, f.Line)
		}
		if !more {
			return "?"
		}
	}
}

func (r *Recorder) begin(ctx context.Context, method string) (context.Context, *Step) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &Step{N: len(r.steps) + 1, Method: method, Caller: caller()}
	s.QueryID = fmt.Sprintf("%s%d", r.id, s.N)
	// The external tables as they are now: the caller may change them later.
	if s.external, s.extErr = externals(chdb.ExternalTables(ctx)); s.extErr != nil {
		r.t.Errorf("dual: step %d at %s: %v", s.N, s.Caller, s.extErr)
	}
	r.steps = append(r.steps, s)
	return clickhouse.Context(ctx, clickhouse.WithQueryID(s.QueryID)), s
}

func (r *Recorder) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	r.gate.RLock()
	defer r.gate.RUnlock()
	ctx, s := r.begin(ctx, "Query")
	rows, err := r.Conn.Query(ctx, query, args...)
	s.Err = err
	return rows, err
}

func (r *Recorder) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	r.gate.RLock()
	defer r.gate.RUnlock()
	ctx, s := r.begin(ctx, "QueryRow")
	row := r.Conn.QueryRow(ctx, query, args...)
	s.Err = row.Err()
	return row
}

func (r *Recorder) Select(ctx context.Context, dest any, query string, args ...any) error {
	r.gate.RLock()
	defer r.gate.RUnlock()
	ctx, s := r.begin(ctx, "Select")
	s.Err = r.Conn.Select(ctx, dest, query, args...)
	return s.Err
}

func (r *Recorder) Exec(ctx context.Context, query string, args ...any) error {
	r.gate.RLock()
	defer r.gate.RUnlock()
	ctx, s := r.begin(ctx, "Exec")
	s.Err = r.Conn.Exec(ctx, query, args...)
	if s.Err == nil {
		r.stopMerges(query)
	}
	return s.Err
}

// stopMerges stops the merges of a MergeTree table query created, as Replay does on
// both engines: reads without FINAL then see the same parts on the recorded run and on
// the replays.
func (r *Recorder) stopMerges(query string) {
	m := createTable.FindStringSubmatch(query)
	if m == nil || !strings.Contains(strings.ToUpper(query), "MERGETREE") {
		return
	}
	// A context of its own: the statement's carries its query id.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Conn.Exec(ctx, "SYSTEM STOP MERGES "+m[2]); err != nil {
		r.t.Errorf("dual: SYSTEM STOP MERGES %s: %v", m[2], err)
	}
}

func (r *Recorder) unsupported(method string) error {
	err := fmt.Errorf("dual.Recorder: %s is not recorded (bandplane does not use it); %s", method, caller())
	r.t.Error(err)
	return err
}

func (r *Recorder) AsyncInsert(context.Context, string, bool, ...any) error {
	return r.unsupported("AsyncInsert")
}

func (r *Recorder) InsertFormat(context.Context, string, string, io.Reader) error {
	return r.unsupported("InsertFormat")
}

func (r *Recorder) QueryFormat(context.Context, string, string, ...any) (io.ReadCloser, error) {
	return nil, r.unsupported("QueryFormat")
}

var insertRe = regexp.MustCompile(`(?is)^\s*INSERT\s+INTO\s+([A-Za-z0-9_.]+)\s*\(([^)]*)\)\s*(VALUES\s*)?$`)

// PrepareBatch prepares the batch on the test's table and the same rows into a staging
// table of the same columns (engine Log: kept as inserted, never merged away), which
// Replay reads back as TabSeparated text.
func (r *Recorder) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	m := insertRe.FindStringSubmatch(query)
	if m == nil {
		return nil, r.unsupported("a batch without an explicit column list (" + query + ")")
	}
	r.mu.Lock()
	r.batches++
	id := fmt.Sprintf("%sb%d", r.id, r.batches)
	r.mu.Unlock()
	real, err := r.Conn.PrepareBatch(clickhouse.Context(ctx, clickhouse.WithQueryID(id)), query, opts...)
	if err != nil {
		return nil, err
	}
	// The rows the real batch sends must reach the staging table even if the caller
	// cancels right after its Send (a pipeline stopping).
	ctx = context.WithoutCancel(ctx)
	r.mu.Lock()
	n := len(r.steps) + 1
	r.mu.Unlock()
	s := &Step{Method: "Batch", Caller: caller(), QueryID: id, SQL: "INSERT INTO " + m[1] + " (" + m[2] + ")", columns: m[2]}
	s.stage = fmt.Sprintf("%s.b%d_%d", r.stage, n, time.Now().UnixNano())
	if err := r.Conn.Exec(ctx, "CREATE TABLE "+s.stage+" AS "+m[1]+" ENGINE = Log"); err != nil {
		return nil, fmt.Errorf("dual: staging table for %s: %w", m[1], err)
	}
	staged, err := r.Conn.PrepareBatch(ctx, "INSERT INTO "+s.stage+" ("+m[2]+")")
	if err != nil {
		return nil, fmt.Errorf("dual: staging batch for %s: %w", m[1], err)
	}
	return &batch{Batch: real, staged: staged, r: r, s: s}, nil
}

// batch appends to the real batch and the staging one; it becomes a step when sent,
// which is when its rows become visible.
type batch struct {
	driver.Batch
	staged driver.Batch
	r      *Recorder
	s      *Step
}

func (b *batch) Append(v ...any) error {
	if err := b.Batch.Append(v...); err != nil {
		return err
	}
	return b.staged.Append(v...)
}

func (b *batch) AppendStruct(v any) error {
	if err := b.Batch.AppendStruct(v); err != nil {
		return err
	}
	return b.staged.AppendStruct(v)
}

func (b *batch) Column(i int) driver.BatchColumn {
	return column{b.Batch.Column(i), b.staged.Column(i)}
}

// Flush is refused: each flushed block is visible on the server at once, before the
// batch's step is recorded at Send, so the replay would put its rows too late.
// bandplane does not flush batches.
func (b *batch) Flush() error { return b.r.unsupported("Batch.Flush") }

// Send sends the real batch, then the staged copy, and records the step. A Send that
// failed may still have stored the rows (a cancelled context after the server took
// the block): the server's query_log says whether the insert finished.
func (b *batch) Send() error {
	b.r.gate.Lock()
	defer b.r.gate.Unlock()
	rows := b.Rows()
	err := b.Batch.Send()
	if err != nil && !b.r.committed(b.s.QueryID) {
		_ = b.staged.Abort()
		return err
	}
	if serr := b.staged.Send(); serr != nil {
		b.r.t.Errorf("dual: staging the rows of %s: %v", b.s.SQL, serr)
		return err
	}
	if rows > 0 {
		b.r.mu.Lock()
		b.s.N = len(b.r.steps) + 1
		b.r.steps = append(b.r.steps, b.s)
		b.r.mu.Unlock()
	}
	return err
}

// committed reports whether the server logged the statement of query id as finished.
// The server may still be finishing it when the client gives up, so it waits (up to
// 5 s) for the statement's end in query_log: finished, or failed.
func (r *Recorder) committed(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := r.Conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
			r.t.Errorf("dual: SYSTEM FLUSH LOGS: %v", err)
			return false
		}
		var finished, failed uint64
		if err := r.Conn.QueryRow(ctx, "SELECT countIf(type = 2), countIf(type > 2) FROM system.query_log "+
			"WHERE event_date >= yesterday() AND query_id = ?", id).Scan(&finished, &failed); err != nil {
			r.t.Errorf("dual: reading query_log: %v", err)
			return false
		}
		if finished+failed > 0 {
			return finished > 0
		}
	}
	return false
}

func (b *batch) Abort() error {
	_ = b.staged.Abort()
	return b.Batch.Abort()
}

func (b *batch) Close() error {
	_ = b.staged.Close()
	return b.Batch.Close()
}

type column struct{ real, staged driver.BatchColumn }

func (c column) Append(v any) error {
	if err := c.real.Append(v); err != nil {
		return err
	}
	return c.staged.Append(v)
}

func (c column) AppendRow(v any) error {
	if err := c.real.AppendRow(v); err != nil {
		return err
	}
	return c.staged.AppendRow(v)
}
