// Package query owns bandplane's tenant-scoped reads from ClickHouse: cost attribution
// from the cost rollup (usage_rollup: days and edge hours), the compliance audit trail
// (events, decisions, contact requests) and work status from the tables ingest keeps.
// Every query is scoped to one organization and counts a replayed or repriced event
// once: the cost reads and the audit pages take each key's newest row with LIMIT 1 BY
// on the replacing key (FINAL over a month costs seconds), the small state tables are
// read with FINAL. SQL is built by plain query
// structs that are tested without a database; everything here runs on ClickHouse 18.16
// and current releases.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package query

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/bandplane/bandplane/schema"
)

// Querier runs queries against one database.
type Querier struct {
	conn driver.Conn
	db   string
	// now is the clock of every default that depends on the time: a first audit page's
	// watermark, where its walk-back starts, the default ranges and the Now of the work
	// reads. Tests set it, so that what they expect is computed from the same instant.
	now func() time.Time
}

// New returns a Querier reading tables as db.table.
func New(conn driver.Conn, db string) *Querier {
	return &Querier{conn: budgetConn{conn}, db: db, now: time.Now}
}

// ErrTimeout matches (errors.Is) a query that did not finish before its context's
// deadline. clickhouse-go passes the deadline on: it sends max_execution_time (the time
// left + 5 s) with the query, and cancels the query on the server when ctx ends, so a
// query the client gave up on does not keep running there.
var ErrTimeout = errors.New("query took longer than its deadline")

// timeoutExceeded is ClickHouse's TIMEOUT_EXCEEDED (max_execution_time).
const timeoutExceeded = 159

// queryErr wraps err of the query described by what, as ErrTimeout when the deadline
// ended it.
func queryErr(ctx context.Context, err error, what string) error {
	var ex *clickhouse.Exception
	// The driver's read can hit the connection deadline (set from ctx) an instant
	// before ctx itself reports it: a passed deadline counts too.
	deadline, ok := ctx.Deadline()
	if errors.Is(err, context.DeadlineExceeded) || ok && !time.Now().Before(deadline) ||
		errors.As(err, &ex) && ex.Code == timeoutExceeded {
		return fmt.Errorf("%s: %w (%w)", what, ErrTimeout, err)
	}
	if IsResponseTooLarge(err) {
		return fmt.Errorf("%s: %w (%w)", what, ErrResponseTooLarge, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func fieldErr(field, format string, args ...any) error {
	return &schema.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// where collects AND-ed conditions and their arguments in order.
type where struct {
	conds []string
	args  []any
}

func (w *where) add(cond string, args ...any) {
	w.conds = append(w.conds, cond)
	w.args = append(w.args, args...)
}

func (w *where) String() string { return strings.Join(w.conds, " AND ") }

// Tokens counts tokens by kind.
type Tokens struct {
	Input, Output, CacheRead, CacheWrite, Reasoning uint64
}

// Total is the sum of the five kinds.
func (t Tokens) Total() uint64 {
	return t.Input + t.Output + t.CacheRead + t.CacheWrite + t.Reasoning
}

// Add returns t + o.
func (t Tokens) Add(o Tokens) Tokens {
	return Tokens{t.Input + o.Input, t.Output + o.Output, t.CacheRead + o.CacheRead, t.CacheWrite + o.CacheWrite, t.Reasoning + o.Reasoning}
}
