package layers

import (
	"bufio"
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module is the module path every package of the repository has.
const module = "github.com/bandplane/bandplane/"

// floor is each top-level folder's floor (doc.go).
var floor = map[string]int{
	"schema": 0,
	"ingest": 1, "policy": 1, "query": 1,
	"graph": 2, "dashboards": 2,
	"deploy": 3,
	"cmd":    4,
}

// top is the top-level folder of a package path relative to the module.
func top(pkg string) string {
	t, _, _ := strings.Cut(pkg, "/")
	return t
}

// imports lists every package of the module with the module's packages it imports.
// Tests' imports are left out: a test may use the fixtures of deploy/stacktest and
// the simulator's data on any floor.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-f",
		`{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"...")
	cmd.Dir = root(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	got := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		pkg := strings.TrimPrefix(f[0], module)
		var deps []string
		for _, d := range f[1:] {
			if rel, ok := strings.CutPrefix(d, module); ok && rel != pkg {
				deps = append(deps, rel)
			}
		}
		slices.Sort(deps)
		got[pkg] = slices.Compact(deps)
	}
	require.NoError(t, sc.Err())
	return got
}

// root is the module's root directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "go.mod"))
	require.NoError(t, err, "the module root is two folders up")
	return dir
}

// violations lists each import that runs upward or sideways across floors.
func violations(deps map[string][]string) []string {
	var out []string
	for pkg, ds := range deps {
		f, ok := floor[top(pkg)]
		if !ok {
			out = append(out, fmt.Sprintf("%s: top-level folder %q has no floor (doc.go)", pkg, top(pkg)))
			continue
		}
		for _, d := range ds {
			df, ok := floor[top(d)]
			switch {
			case top(d) == top(pkg):
			case !ok:
				out = append(out, fmt.Sprintf("%s imports %s: folder %q has no floor", pkg, d, top(d)))
			case df > f:
				out = append(out, fmt.Sprintf("%s (floor %d) imports %s (floor %d): upward", pkg, f, d, df))
			case df == f:
				out = append(out, fmt.Sprintf("%s imports %s: sideways on floor %d", pkg, d, f))
			}
		}
	}
	slices.Sort(out)
	return out
}

// No package imports one on its own floor in another folder, or above it.
func TestNoImportRunsUpward(t *testing.T) {
	deps := imports(t)
	require.Contains(t, deps, "cmd/bandplane", "go list found the module's packages")
	assert.Empty(t, violations(deps))
}

// The rule itself: upward and sideways imports are found, downward ones are not.
func TestViolationsFindsUpwardAndSidewaysImports(t *testing.T) {
	got := violations(map[string][]string{
		"schema/store":   {"schema", "ingest"},
		"policy/replica": {"schema/kafka", "ingest/x"},
		"graph":          {"query", "policy"},
		"cmd/bandplane":  {"graph", "deploy/bench"},
		"tools/x":        {"schema"},
	})
	assert.Equal(t, []string{
		"policy/replica imports ingest/x: sideways on floor 1",
		"schema/store (floor 0) imports ingest (floor 1): upward",
		`tools/x: top-level folder "tools" has no floor (doc.go)`,
	}, got)
}

// TestLinesPerFolder logs each top-level folder's hand-written Go lines (tests and
// generated code apart) and fails when one holds more than a quarter of them.
func TestLinesPerFolder(t *testing.T) {
	r := root(t)
	lines := map[string]int{}
	tests := map[string]int{}
	total := 0
	for dir := range floor {
		err := filepath.WalkDir(filepath.Join(r, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if generated(b) {
				return nil
			}
			n := bytes.Count(b, []byte("\n"))
			if strings.HasSuffix(path, "_test.go") {
				tests[dir] += n
				return nil
			}
			lines[dir] += n
			total += n
			return nil
		})
		require.NoError(t, err)
	}
	dirs := make([]string, 0, len(lines))
	for d := range floor {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		share := float64(lines[d]) / float64(total)
		t.Logf("%-11s %6d lines (%4.1f %%), %6d in tests", d+"/", lines[d], 100*share, tests[d])
		assert.LessOrEqual(t, share, 0.25, "%s/ holds more than a quarter of the hand-written code", d)
	}
	t.Logf("%-11s %6d lines", "total", total)
}

// generated says whether a Go file says it is generated (the Go convention's line).
func generated(b []byte) bool {
	for line := range bytes.Lines(b) {
		if bytes.HasPrefix(line, []byte("// Code generated ")) && bytes.HasSuffix(bytes.TrimSpace(line), []byte("DO NOT EDIT.")) {
			return true
		}
		if bytes.HasPrefix(line, []byte("package ")) {
			return false
		}
	}
	return false
}

// Every package's doc comment says what it may import (the rule of its floor, naming
// this package), so that a reader learns the rule where the package begins. Generated
// packages are left out.
func TestPackageDocsSayWhatTheyMayImport(t *testing.T) {
	r := root(t)
	for pkg := range imports(t) {
		if pkg == "graph/generated" || pkg == "graph/model" {
			continue
		}
		doc := packageDoc(t, filepath.Join(r, filepath.FromSlash(pkg)))
		assert.NotEmpty(t, doc, "%s has no package doc comment", pkg)
		if doc != "" {
			assert.Contains(t, doc, "(deploy/layers)", "%s: its doc comment does not say what it may import", pkg)
		}
	}
}

// packageDoc is the package doc comment of the Go package in dir (tests apart).
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.PackageClauseOnly|parser.ParseComments)
		require.NoError(t, err)
		if f.Doc != nil {
			return f.Doc.Text()
		}
	}
	return ""
}
