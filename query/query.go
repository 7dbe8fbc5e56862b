// Package query owns bandplane's tenant-scoped reads from ClickHouse: cost attribution
// from the hourly rollup and the compliance audit trail. Every query is scoped to one
// organization and reads its replacing tables with FINAL, so a replayed or repriced
// event is counted once. SQL is built by plain query structs (toSQL) that are tested
// without a database; everything here runs on ClickHouse 18.16 and current releases.
package query

import (
	"errors"
	"fmt"
	"strings"

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
