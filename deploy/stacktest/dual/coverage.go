package dual

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// CorpusDirs are the packages whose SQL the two-engine corpus must cover: every call
// there that sends SQL (CallSites) has to be made through a Recorder by some corpus
// test and compared on both engines with rows, so a new query cannot escape the
// comparison. Outside them only the benchmarks (deploy/bench, deploy/bench/policybench) and
// the test helpers (deploy/stacktest) send SQL.
var CorpusDirs = []string{
	"schema/chdb", "schema/store", "query/trail", "ingest/prices",
	"query", "policy/replica", "policy/replay", "schema/keys",
}

// compared holds the calls in bandplane's code (file:line) whose statements a Replay
// ran and compared on both engines: true once one of them had effect (a batch, a
// statement) or returned rows that were compared, false while all returned none.
var compared sync.Map

func markCompared(caller string, rows bool) {
	if rows {
		compared.Store(caller, true)
		return
	}
	compared.LoadOrStore(caller, false)
}

// Covered are the calls in bandplane's code (file:line) compared on both engines so far
// in this process, each true when some comparison had rows (see markCompared).
func Covered() map[string]bool {
	out := map[string]bool{}
	compared.Range(func(k, v any) bool { out[k.(string)] = v.(bool); return true })
	return out
}

// PassThrough are the files of connection wrappers: their calls forward another
// call's SQL (with settings added), so the call site is the wrapper's caller.
var PassThrough = []string{"query/budget.go"}

func passesThrough(file string) bool {
	for _, p := range PassThrough {
		if strings.HasSuffix(file, "/"+p) {
			return true
		}
	}
	return false
}

// sqlMethods are driver.Conn's methods that send SQL.
var sqlMethods = map[string]bool{"Query": true, "QueryRow": true, "Exec": true, "Select": true, "PrepareBatch": true}

// CallSites lists (as file:line relative to root) every call of a driver.Conn method
// that sends SQL in the non-test Go files of dirs: a method of sqlMethods called on a
// value named conn or Conn (bandplane's one spelling of a ClickHouse connection, e.g.
// qr.conn.Query, x.cfg.Conn.QueryRow).
func CallSites(root string, dirs []string) ([]string, error) {
	var out []string
	fset := token.NewFileSet()
	for _, d := range dirs {
		files, err := filepath.Glob(filepath.Join(root, d, "*.go"))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || passesThrough(f) {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			file, err := parser.ParseFile(fset, f, src, 0)
			if err != nil {
				return nil, err
			}
			rel, _ := filepath.Rel(root, f)
			ast.Inspect(file, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || !sqlMethods[sel.Sel.Name] || !isConn(sel.X) {
					return true
				}
				out = append(out, fmt.Sprintf("%s:%d", rel, fset.Position(sel.Sel.Pos()).Line))
				return true
			})
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func isConn(x ast.Expr) bool {
	switch v := x.(type) {
	case *ast.Ident:
		return v.Name == "conn" || v.Name == "Conn"
	case *ast.SelectorExpr:
		return v.Sel.Name == "conn" || v.Sel.Name == "Conn"
	}
	return false
}
