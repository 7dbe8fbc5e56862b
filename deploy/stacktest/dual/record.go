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
	"github.com/ClickHouse/clickhouse-go/v2/ext"
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

	external []*ext.Table
	stage    string // staging table of a batch
	columns  string // the batch's column list
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
		MaxOpenConns: 8,
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

// caller is the first frame outside this package: the call in bandplane's code.
func caller() string {
	pcs := make([]uintptr, 8)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if !strings.Contains(f.File, "/deploy/stacktest/dual/") {
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
	s := &Step{N: len(r.steps) + 1, Method: method, Caller: caller(), external: chdb.ExternalTables(ctx)}
	s.QueryID = fmt.Sprintf("%s%d", r.id, s.N)
	markSeen(s.Caller)
	r.steps = append(r.steps, s)
	return clickhouse.Context(ctx, clickhouse.WithQueryID(s.QueryID)), s
}

func (r *Recorder) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	ctx, s := r.begin(ctx, "Query")
	rows, err := r.Conn.Query(ctx, query, args...)
	s.Err = err
	return rows, err
}

func (r *Recorder) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	ctx, s := r.begin(ctx, "QueryRow")
	row := r.Conn.QueryRow(ctx, query, args...)
	s.Err = row.Err()
	return row
}

func (r *Recorder) Select(ctx context.Context, dest any, query string, args ...any) error {
	ctx, s := r.begin(ctx, "Select")
	s.Err = r.Conn.Select(ctx, dest, query, args...)
	return s.Err
}

func (r *Recorder) Exec(ctx context.Context, query string, args ...any) error {
	ctx, s := r.begin(ctx, "Exec")
	s.Err = r.Conn.Exec(ctx, query, args...)
	return s.Err
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
	real, err := r.Conn.PrepareBatch(ctx, query, opts...)
	if err != nil {
		return nil, err
	}
	// The rows the real batch sends must reach the staging table even if the caller
	// cancels right after its Send (a pipeline stopping).
	ctx = context.WithoutCancel(ctx)
	r.mu.Lock()
	n := len(r.steps) + 1
	r.mu.Unlock()
	s := &Step{Method: "Batch", Caller: caller(), SQL: "INSERT INTO " + m[1] + " (" + m[2] + ")", columns: m[2]}
	markSeen(s.Caller)
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

func (b *batch) Flush() error {
	if err := b.Batch.Flush(); err != nil {
		return err
	}
	return b.staged.Flush()
}

func (b *batch) Send() error {
	rows := b.Batch.Rows()
	err := b.Batch.Send()
	if err != nil {
		_ = b.staged.Abort()
		return err
	}
	if err := b.staged.Send(); err != nil {
		b.r.t.Errorf("dual: staging the rows of %s: %v", b.s.SQL, err)
		return nil
	}
	if rows > 0 {
		b.r.mu.Lock()
		b.s.N = len(b.r.steps) + 1
		b.r.steps = append(b.r.steps, b.s)
		b.r.mu.Unlock()
	}
	return nil
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
