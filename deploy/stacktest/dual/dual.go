// Package dual runs bandplane's SQL on both ClickHouse generations it supports: the
// local ClickHouse 18.16 server (deploy/local, over its HTTP interface, as text) and
// ClickHouse 26.9 as the in-process engine of the `chdb-core` Python package (the only
// current ClickHouse these machines can get; deploy/local/chdb.sh keeps its project-local
// virtual environment). Test-only.
//
// A Recorder wraps the driver.Conn the code under test uses: every statement it sends
// is recorded with the exact text the server received (read back from system.query_log
// by query id) and every batch insert with its rows, so Replay can run the same
// statements on the same data on the other engine and report where they differ.
//
// It may import any folder but cmd/ (deploy/layers).
package dual

import (
	"context"
	"strings"
)

// Column is one result column: its name and ClickHouse type as the engine reports them.
type Column struct{ Name, Type string }

// Result is a query's result as text: the values in ClickHouse's TabSeparated text
// form, unescaped.
type Result struct {
	Columns []Column
	Rows    [][]string
}

// Engine runs SQL text on one ClickHouse.
type Engine interface {
	// Name says which ClickHouse, with its version(), e.g. "clickhouse-server 18.16.1".
	Name() string
	// Exec runs a statement that returns no rows (DDL, INSERT … SELECT, ALTER).
	Exec(ctx context.Context, sql string) error
	// Query runs a SELECT (without a FORMAT clause) and returns its rows as text; ext
	// are external tables sent with it.
	Query(ctx context.Context, sql string, ext ...External) (*Result, error)
	// Insert runs insert ("INSERT INTO db.t (a, b)") with rows in TabSeparated text.
	Insert(ctx context.Context, insert string, tsv []byte) error
}

// External is an external table sent with a query: its name, structure ("id String,
// n UInt32") and rows as TabSeparated text.
type External struct {
	Name, Structure string
	TSV             []byte
}

// ColumnNames are r's column names in order.
func (r *Result) ColumnNames() []string {
	out := make([]string, len(r.Columns))
	for i, c := range r.Columns {
		out[i] = c.Name
	}
	return out
}

// String is r as TSV with a header line (for failure messages).
func (r *Result) String() string {
	var b strings.Builder
	for i, c := range r.Columns {
		if i > 0 {
			b.WriteByte('\t')
		}
		b.WriteString(c.Name + " " + c.Type)
	}
	for _, row := range r.Rows {
		b.WriteByte('\n')
		b.WriteString(strings.Join(row, "\t"))
	}
	return b.String()
}
