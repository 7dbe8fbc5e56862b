package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// deniedBuiltins are the OPA builtins no bundle may call, in its policies or its tests,
// and why: a bundle is code that serve compiles and runs (on reload, and replayed over
// the trail before it goes live), so it may neither reach outside the process nor
// allocate without bound, and a decision must follow from its input, the directory
// and the engine's clock alone, or no replay could reproduce it. A bundle that names
// one is refused before anything of it is evaluated, its tests included.
var deniedBuiltins = map[string]string{
	"http.send":          "reaches the network",
	"net.lookup_ip_addr": "reaches the network (DNS)",
	"opa.runtime":        "reads the process's environment and configuration",
	"time.now_ns":        "reads the wall clock, which no replay of the decision reproduces",
	"rand.intn":          "is random, which no replay of the decision reproduces",
	"uuid.rfc4122":       "is random, which no replay of the decision reproduces",
	"numbers.range":      "builds a list as long as its arguments ask, which no time bound stops before memory runs out",
	"numbers.range_step": "builds a list as long as its arguments ask, which no time bound stops before memory runs out",
	"net.cidr_expand":    "builds a set as large as its network, which no time bound stops before memory runs out",
}

// capabilities are OPA's builtins less the denied ones, and no network for the
// compiler itself (remote JSON schemas): the compiler then refuses a call to a denied
// builtin even if checkBuiltins missed it.
var capabilities = sync.OnceValue(func() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	c.Builtins = slices.DeleteFunc(slices.Clone(c.Builtins), func(b *ast.Builtin) bool {
		_, denied := deniedBuiltins[b.Name]
		return denied
	})
	c.AllowNet = []string{}
	return c
})

// Every builtin OPA itself calls nondeterministic (the clock, randomness, the network,
// what its JSON schema refs load) is denied too, with the reason no replay could
// reproduce it.
func init() {
	for _, b := range ast.CapabilitiesForThisVersion().Builtins {
		if _, listed := deniedBuiltins[b.Name]; !listed && b.Nondeterministic {
			deniedBuiltins[b.Name] = "is nondeterministic (the clock, randomness or what it loads), which no replay of the decision reproduces"
		}
	}
	// JSON schemas may $ref local files, which OPA loads whatever AllowNet says.
	for _, name := range []string{"json.match_schema", "json.verify_schema"} {
		deniedBuiltins[name] = "loads what its schema's $ref names, local files included"
	}
}

// newCompiler is the compiler of every bundle: Rego v1, the capabilities above.
func newCompiler() *ast.Compiler {
	return ast.NewCompiler().WithDefaultRegoVersion(ast.RegoV1).WithCapabilities(capabilities())
}

// checkBuiltins refuses a bundle whose modules call a denied builtin, naming each call
// by file and line.
func (b *policyBundle) checkBuiltins() error {
	var found []string
	for _, m := range b.modules(true) {
		ast.WalkTerms(m, func(t *ast.Term) bool {
			var op ast.Ref
			switch v := t.Value.(type) {
			case ast.Call:
				op, _ = v[0].Value.(ast.Ref)
			case ast.Ref:
				op = v // a builtin named as a function value or by `with`
			}
			if op == nil {
				return false
			}
			if why, denied := deniedBuiltins[op.String()]; denied {
				loc := "?"
				if t.Location != nil {
					loc = fmt.Sprintf("%s:%d", t.Location.File, t.Location.Row)
				}
				found = append(found, fmt.Sprintf("%s calls %s, which %s", loc, op, why))
			}
			return false
		})
		for _, e := range exprs(m) {
			if !e.IsCall() {
				continue
			}
			op := e.Operator()
			if why, denied := deniedBuiltins[op.String()]; denied {
				loc := "?"
				if e.Location != nil {
					loc = fmt.Sprintf("%s:%d", e.Location.File, e.Location.Row)
				}
				found = append(found, fmt.Sprintf("%s calls %s, which %s", loc, op, why))
			}
		}
	}
	if len(found) == 0 {
		return nil
	}
	slices.Sort(found)
	found = slices.Compact(found)
	return errors.New("cannot accept policy bundle: " + strings.Join(found, "; "))
}

// exprs are a module's expressions.
func exprs(m *ast.Module) []*ast.Expr {
	var out []*ast.Expr
	ast.WalkExprs(m, func(e *ast.Expr) bool {
		out = append(out, e)
		return false
	})
	return out
}
