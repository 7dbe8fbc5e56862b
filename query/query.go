// Package query owns bandplane's tenant-scoped reads from ClickHouse: cost attribution
// from the hourly rollup and the compliance audit trail. Every query is scoped to one
// organization and reads its replacing tables with FINAL, so a replayed or repriced
// event is counted once. SQL is built by plain query structs (toSQL) that are tested
// without a database; everything here runs on ClickHouse 18.16 and current releases.
package query

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Querier runs queries against one database.
type Querier struct {
	conn driver.Conn
	db   string
}

// New returns a Querier reading tables as db.table.
func New(conn driver.Conn, db string) *Querier { return &Querier{conn: conn, db: db} }

// FieldError is a problem with one field of a query: the caller's mistake, safe to show
// to the caller as is (the API reports it as a bad input, not an internal error).
type FieldError struct {
	Field string // snake_case name of the field, e.g. "group_by"
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// ErrTimeout matches (errors.Is) a query that did not finish before its context's
// deadline, whether the client gave up or ClickHouse stopped it (max_execution_time).
var ErrTimeout = errors.New("query took longer than its deadline")

// timeoutExceeded is ClickHouse's TIMEOUT_EXCEEDED (max_execution_time).
const timeoutExceeded = 159

// withDeadline passes ctx's deadline on to ClickHouse as max_execution_time (whole
// seconds, rounded up), so that a query the client gives up on does not keep running
// on the server.
func withDeadline(ctx context.Context) context.Context {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx
	}
	secs := max(1, int(math.Ceil(time.Until(deadline).Seconds())))
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_execution_time": secs}))
}

// queryErr wraps err of the query described by what, as ErrTimeout when the deadline
// ended it.
func queryErr(ctx context.Context, err error, what string) error {
	var ex *clickhouse.Exception
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded ||
		errors.As(err, &ex) && ex.Code == timeoutExceeded {
		return fmt.Errorf("%s: %w (%v)", what, ErrTimeout, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// IsInvalid reports whether err (or any error joined in it) is a FieldError.
func IsInvalid(err error) bool {
	var fe *FieldError
	return errors.As(err, &fe)
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
