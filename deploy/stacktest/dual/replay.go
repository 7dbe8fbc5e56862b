package dual

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/ext"
)

// replaySuffix names the database Replay fills on both engines: DB()+replaySuffix.
const replaySuffix = "_r"

// ReplayDB is the database Replay fills, on the 18.16 server and on the other engine.
func (r *Recorder) ReplayDB() string { return r.db + replaySuffix }

// Replay runs the recorded steps again, in the order they took effect, on a fresh
// database of the 18.16 server and on the same database of other (ClickHouse 26.9): the
// statements with the text the server logged, the batches with the rows they sent, the
// external tables with their rows. Every query's results on the two engines are
// compared after Normalize, and every statement must succeed on both or fail on both;
// each difference fails t, naming the call in bandplane's code and the SQL. It returns
// the steps with their texts; afterwards ReplayDB holds the same data on both engines.
func (r *Recorder) Replay(ctx context.Context, t testing.TB, other Engine) []*Step {
	t.Helper()
	srv := Server(t).(*server)
	steps := r.Steps()
	// A statement's row is logged when the server has finished it, which for the last
	// query read can be a moment after its caller returned: read the log again, briefly,
	// until it holds every statement that reached the server.
	var text, resultRows map[string]string
	var finished map[string]bool
	for try := 0; ; try++ {
		if err := srv.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
			t.Fatalf("SYSTEM FLUSH LOGS: %v", err)
		}
		logged, err := srv.Query(ctx, "SELECT query_id, query, toString(result_rows), toString(toUInt8(type)) FROM system.query_log "+
			"WHERE event_date >= yesterday() AND startsWith(query_id, '"+r.id+"') AND toUInt8(type) != 1")
		if err != nil {
			t.Fatalf("read the recorded statements from system.query_log: %v", err)
		}
		text, resultRows, finished = map[string]string{}, map[string]string{}, map[string]bool{}
		for _, row := range logged.Rows {
			text[row[0]], resultRows[row[0]], finished[row[0]] = row[1], row[2], row[3] == "2"
		}
		missing := false
		for _, s := range steps {
			if _, ok := text[s.QueryID]; s.Method != "Batch" && s.Err == nil && !ok {
				missing = true
				break
			}
		}
		if !missing || try == 20 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	db, rdb := r.db, r.ReplayDB()
	rename := func(sql string) string { return strings.ReplaceAll(sql, db, rdb) }
	for _, e := range []Engine{srv, other} {
		if err := e.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+rdb); err != nil {
			t.Fatalf("%s: create %s: %v", e.Name(), rdb, err)
		}
	}
	for _, s := range steps {
		if s.Method != "Batch" {
			sql, ok := text[s.QueryID]
			if !ok {
				if s.Err != nil { // refused before it reached the server (e.g. binding)
					continue
				}
				t.Errorf("step %d (%s %s): not in system.query_log", s.N, s.Method, s.Caller)
				continue
			}
			s.SQL = sql
			if finished[s.QueryID] { // a query that failed or was cancelled has no row count to match
				s.resultRows = resultRows[s.QueryID]
			}
			// A statement its caller cancelled counts only if the server finished it.
			if s.Err != nil && !finished[s.QueryID] && (errors.Is(s.Err, context.Canceled) || errors.Is(s.Err, context.DeadlineExceeded)) {
				continue
			}
		}
		r.replayStep(ctx, t, s, srv, other, rename)
	}
	return steps
}

func (r *Recorder) replayStep(ctx context.Context, t testing.TB, s *Step, srv *server, other Engine, rename func(string) string) {
	t.Helper()
	where := func() string {
		return fmt.Sprintf("step %d, %s at %s:\n%s\n", s.N, s.Method, s.Caller, clip(s.SQL, 2000))
	}
	switch s.Method {
	case "Batch":
		cols, err := transferColumns(ctx, srv, s.stage, s.columns)
		if err != nil {
			t.Errorf("%s%v", where(), err)
			return
		}
		tsv, err := srv.post(ctx, nil, "SELECT "+cols+" FROM "+s.stage+" FORMAT TabSeparated")
		if err != nil {
			t.Errorf("%sread the staged rows: %v", where(), err)
			return
		}
		errA, errB := srv.Insert(ctx, rename(s.SQL), tsv), other.Insert(ctx, rename(s.SQL), tsv)
		if compareErrs(t, where, &Step{}, srv, other, errA, errB) && errA == nil {
			markCompared(s.Caller, true)
		}
	case "Exec":
		errA, errB := srv.Exec(ctx, rename(s.SQL)), other.Exec(ctx, rename(s.SQL))
		if compareErrs(t, where, s, srv, other, errA, errB) && errA == nil {
			stopMerges(ctx, t, rename(s.SQL), srv, other)
			markCompared(s.Caller, true)
		}
	default:
		if s.extErr != nil {
			return // reported when recorded
		}
		a, errA := srv.Query(ctx, rename(s.SQL), s.external...)
		b, errB := other.Query(ctx, rename(s.SQL), s.external...)
		if !compareErrs(t, where, s, srv, other, errA, errB) || errA != nil {
			return
		}
		if d := Diff(s.SQL, a, b); d != "" {
			t.Errorf("%s%s vs %s: %s", where(), srv.Name(), other.Name(), d)
			return
		}
		fixed := !isVolatile(s.SQL)
		// The replay must be the recorded run: as many rows as the server returned then.
		if fixed && s.Err == nil && s.resultRows != "" && s.resultRows != fmt.Sprint(len(a.Rows)) {
			t.Errorf("%sthe replay is not the recorded run: %s rows then, %d on the replay", where(), s.resultRows, len(a.Rows))
			return
		}
		markCompared(s.Caller, fixed && len(a.Rows) > 0)
	}
}

var createTable = regexp.MustCompile(`(?is)^\s*CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?([A-Za-z0-9_.]+)`)

// stopMerges stops background merges of a table the statement created, on both
// engines: a read without FINAL of a ReplacingMergeTree counts the rows of the parts not
// merged yet, which depends on when each engine happened to merge. With every part
// kept, such a read sees every row on both, and FINAL still collapses them.
func stopMerges(ctx context.Context, t testing.TB, sql string, engines ...Engine) {
	t.Helper()
	m := createTable.FindStringSubmatch(sql)
	if m == nil || !strings.Contains(strings.ToUpper(sql), "MERGETREE") {
		return
	}
	for _, e := range engines {
		if err := e.Exec(ctx, "SYSTEM STOP MERGES "+m[2]); err != nil {
			t.Errorf("%s: SYSTEM STOP MERGES %s: %v", e.Name(), m[2], err)
		}
	}
}

// transferColumns is the select list that reads the staged columns as text both
// engines read back as the same values: 18.16 writes a zero DateTime or Date as
// 0000-00-00…, which 26.9 reads as a date in the current year (seen: 2026-01-01), so
// the zero DateTime and Date go as the epoch's text.
func transferColumns(ctx context.Context, srv *server, stage, columns string) (string, error) {
	db, table, _ := strings.Cut(stage, ".")
	r, err := srv.Query(ctx, "SELECT name, type FROM system.columns WHERE database = '"+db+"' AND table = '"+table+"'")
	if err != nil {
		return "", fmt.Errorf("the staged columns: %w", err)
	}
	types := map[string]string{}
	for _, row := range r.Rows {
		types[row[0]] = row[1]
	}
	var out []string
	for _, c := range strings.Split(columns, ",") {
		c = strings.TrimSpace(c)
		switch typ := types[c]; {
		case typ == "DateTime" || strings.HasPrefix(typ, "DateTime("):
			out = append(out, "if(toUInt32("+c+") = 0, '1970-01-01 00:00:00', toString("+c+"))")
		case typ == "Date":
			out = append(out, "if(toUInt16("+c+") = 0, '1970-01-01', toString("+c+"))")
		default:
			out = append(out, c)
		}
	}
	return strings.Join(out, ", "), nil
}

// compareErrs fails t when one engine refused what the other ran (or when the
// recorded run's outcome is not the replay's on 18.16); it reports whether both agree.
func compareErrs(t testing.TB, where func() string, s *Step, a, b Engine, errA, errB error) bool {
	t.Helper()
	if (errA == nil) != (errB == nil) {
		t.Errorf("%s%s: %v\n%s: %v", where(), a.Name(), errOrOK(errA), b.Name(), errOrOK(errB))
		return false
	}
	// A recorded call its caller cancelled (a pipeline stopping) says nothing of the SQL.
	if (s.Err == nil) != (errA == nil) && !errors.Is(s.Err, context.Canceled) && !errors.Is(s.Err, context.DeadlineExceeded) {
		t.Errorf("%srecorded run: %v, replay on %s: %v", where(), errOrOK(s.Err), a.Name(), errOrOK(errA))
		return false
	}
	return true
}

func errOrOK(err error) string {
	if err == nil {
		return "ok"
	}
	return clip(err.Error(), 600)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("… (%d bytes)", len(s))
}

// externals renders external tables as TabSeparated text. bandplane's are of String
// and unsigned integer columns; anything else is refused rather than rendered wrong.
func externals(tables []*ext.Table) ([]External, error) {
	var out []External
	for _, tbl := range tables {
		b := tbl.Block()
		var buf strings.Builder
		for i := 0; i < b.Rows(); i++ {
			for j, c := range b.Columns {
				if j > 0 {
					buf.WriteByte('\t')
				}
				switch v := c.Row(i, false).(type) {
				case string:
					buf.WriteString(EscapeTSV(v))
				case uint8, uint16, uint32, uint64, int8, int16, int32, int64:
					fmt.Fprint(&buf, v)
				default:
					return nil, fmt.Errorf("external table %s: column %s of type %s cannot be rendered (%T)", tbl.Name(), c.Name(), c.Type(), v)
				}
			}
			buf.WriteByte('\n')
		}
		out = append(out, External{Name: tbl.Name(), Structure: tbl.Structure(), TSV: []byte(buf.String())})
	}
	return out, nil
}

// Statements whose results may differ between two runs whatever the engine: the clock,
// randomness, the engine's own version and settings, and system tables of what each
// engine happens to be doing (merges, mutations, logs). Only their columns (names and
// types) are compared. system.parts is not among them: with merges stopped (stopMerges)
// the partitions and parts are the same on both.
var volatile = regexp.MustCompile(`(?i)\bnow\s*\(|\btoday\s*\(|\byesterday\s*\(|\brand(32|64)?\s*\(|generateUUID|\bversion\s*\(|\bsystem\.(merges|mutations|query_log|processes|settings)\b`)

// stringLiteral is a single-quoted ClickHouse string literal (with \-escapes).
var stringLiteral = regexp.MustCompile(`'(?:[^'\\]|\\.)*'`)

// isVolatile reports whether sql is a volatile statement, looking at its code only: a
// bound value that reads "now()" does not make a query volatile.
func isVolatile(sql string) bool {
	return volatile.MatchString(stringLiteral.ReplaceAllString(sql, "''"))
}

// Diff compares the results of sql on two engines after Normalize: column names and
// types, then the rows as a multiset (the order is the unit tests' business: a tie in
// ORDER BY may come out either way). "" when they agree.
func Diff(sql string, a, b *Result) string {
	a, b = Normalize(a), Normalize(b)
	if !slices.Equal(a.Columns, b.Columns) {
		return fmt.Sprintf("columns differ:\n  %v\n  %v", a.Columns, b.Columns)
	}
	if isVolatile(sql) {
		return ""
	}
	ra, rb := joinRows(a.Rows), joinRows(b.Rows)
	slices.Sort(ra)
	slices.Sort(rb)
	if slices.Equal(ra, rb) {
		return ""
	}
	onlyA, onlyB := minus(ra, rb), minus(rb, ra)
	return fmt.Sprintf("%d vs %d rows; only in the first (%d): %s; only in the second (%d): %s",
		len(ra), len(rb), len(onlyA), clip(strings.Join(head(onlyA, 5), " | "), 1500), len(onlyB), clip(strings.Join(head(onlyB, 5), " | "), 1500))
}

func joinRows(rows [][]string) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = strings.Join(r, "\t")
	}
	return out
}

func minus(a, b []string) []string {
	have := map[string]int{}
	for _, x := range b {
		have[x]++
	}
	var out []string
	for _, x := range a {
		if have[x] > 0 {
			have[x]--
		} else {
			out = append(out, x)
		}
	}
	return out
}

func head(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Equal reports whether two engines' results of sql agree after Normalize (see Diff).
func Equal(sql string, a, b *Result) bool { return Diff(sql, a, b) == "" }
