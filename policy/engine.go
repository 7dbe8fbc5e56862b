package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/bandplane/bandplane/schema"
)

//go:embed rego/*.rego rego/data.json
var embedded embed.FS

// DefaultBundle is the policy bundle compiled into the binary: the Rego policies, their
// tests and data.json.
func DefaultBundle() fs.FS {
	sub, err := fs.Sub(embedded, "rego")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}

// Config configures an Engine.
type Config struct {
	// Directory is the replica the policies read. Required.
	Directory *Directory
	// Bundle holds the policies (*.rego), their tests (*_test.rego) and policy data
	// (data.json). Nil means DefaultBundle().
	Bundle fs.FS
	// Limiter and Ledger enforce send_message quotas and budgets. Nil means new empty
	// ones (the ledger with DefaultReservationTTL).
	Limiter *Limiter
	Ledger  *Ledger
	// Now is the clock of the limiter and budgets. Nil means time.Now.
	Now func() time.Time
}

// Validate reports what is missing.
func (c *Config) Validate() error {
	var errs []error
	if c.Directory == nil {
		errs = append(errs, errors.New("policy: no directory"))
	}
	return errors.Join(errs...)
}

// Engine evaluates the decisions against the directory with one compiled policy
// revision at a time. Decide is safe for concurrent use; Reload swaps the revision
// atomically, and a decision runs entirely on the revision it started with.
type Engine struct {
	dir     *Directory
	limiter *Limiter
	ledger  *Ledger
	now     func() time.Time

	rev      atomic.Pointer[revision]
	reloadMu sync.Mutex
}

// revision is an immutable compiled bundle with one prepared query per decision.
type revision struct {
	hash     string
	files    fstest.MapFS // the bundle's .rego and data.json files, as read
	compiler *ast.Compiler
	queries  map[string]rego.PreparedEvalQuery
	coverage float64
	tests    int
}

// New loads, compiles and tests the bundle, and prepares the decisions. It refuses a
// bundle whose Rego tests fail.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cannot create policy engine: %w", err)
	}
	e := &Engine{dir: cfg.Directory, limiter: cfg.Limiter, ledger: cfg.Ledger, now: cfg.Now}
	if e.limiter == nil {
		e.limiter = NewLimiter()
	}
	if e.ledger == nil {
		e.ledger = NewLedger(0)
	}
	if e.now == nil {
		e.now = time.Now
	}
	b := cfg.Bundle
	if b == nil {
		b = DefaultBundle()
	}
	rev, err := e.build(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("cannot create policy engine: %w", err)
	}
	e.rev.Store(rev)
	return e, nil
}

// Directory returns the directory the engine reads.
func (e *Engine) Directory() *Directory { return e.dir }

// Limiter returns the rate limiter of send_message.
func (e *Engine) Limiter() *Limiter { return e.limiter }

// Ledger returns the spend, reservations and budgets send_message checks.
func (e *Engine) Ledger() *Ledger { return e.ledger }

// Release gives back the reservation of a granted send_message decision that is not
// used after all (its audit event could not be written); see Ledger.Release.
func (e *Engine) Release(d *Decision) { e.release(d, e.now()) }

func (e *Engine) release(d *Decision, now time.Time) {
	if d.ReservationID != "" {
		e.ledger.Release(d.ReservationID, now)
		d.ReservationID, d.ReservationExpires = "", time.Time{}
	}
}

// Compiler returns the compiled policies of the revision serving now, for tools that
// evaluate the bundle directly (bench policy times the bare OPA evaluation with it).
func (e *Engine) Compiler() *ast.Compiler { return e.rev.Load().compiler }

// EvalInput returns input as decision name evaluates it: converted to OPA's value, with
// the facts the engine adds from the directory (see facts.go).
func (e *Engine) EvalInput(name string, input any) (ast.Value, error) {
	v, err := inputValue(input)
	if err != nil {
		return nil, err
	}
	_, shared := input.(ast.Value) // every other input was converted into a new value
	return e.dir.withFacts(name, v, !shared, name == SendMessage && chainChecked(input))
}

// Revision returns the hash of the bundle serving decisions.
func (e *Engine) Revision() string { return e.rev.Load().hash }

// Bundle returns the files of the revision serving now (its .rego and data.json files):
// what a replay compares a candidate's answers with. Each call gets its own copy, so no
// caller can change another's, or the revision's.
func (e *Engine) Bundle() fs.FS {
	out := fstest.MapFS{}
	for name, f := range e.rev.Load().files {
		out[name] = &fstest.MapFile{Data: bytes.Clone(f.Data), Mode: f.Mode}
	}
	return out
}

// Reload compiles and tests the bundle and, if both succeed, makes it serve the next
// decisions; decisions in flight finish on the old revision. On error the old revision
// keeps serving. It returns the new revision hash.
func (e *Engine) Reload(ctx context.Context, bundle fs.FS) (string, error) {
	return e.ReloadChecked(ctx, bundle, nil)
}

// ReloadChecked is Reload with check (nil: none) asked, once the bundle has compiled and
// passed its tests, whether it may serve: its error refuses the bundle as a failed
// build does, and is returned wrapped.
func (e *Engine) ReloadChecked(ctx context.Context, bundle fs.FS, check func(context.Context, fs.FS) error) (string, error) {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	rev, err := e.build(ctx, bundle)
	if err == nil && check != nil {
		err = check(ctx, bundle)
	}
	if err != nil {
		return "", fmt.Errorf("cannot reload policy bundle (keeping %s): %w", e.Revision(), err)
	}
	e.rev.Store(rev)
	return rev.hash, nil
}

// Decide evaluates the named decision. input is a PeerInput, AddInput, ContactInput,
// MessageInput (or a pointer to one), a map[string]any, json.RawMessage or ast.Value.
// An evaluation error or an undefined result is a deny with reason eval_error or
// undefined, not a Go error; the error is only for an unknown name or an input that
// cannot be converted.
//
// The decision records what a replay needs to reproduce it exactly: the directory's
// Position, which stands still from the facts to the limiter and ledger (no record is
// applied meanwhile, see Directory), and DecidedAt, the one reading of the engine's
// clock that the limiter and the ledger use.
func (e *Engine) Decide(ctx context.Context, name string, input any) (Decision, error) {
	rev := e.rev.Load()
	q, ok := rev.queries[name]
	if !ok {
		return Decision{}, fmt.Errorf("cannot decide %q: unknown decision (known: %s)", name, strings.Join(decisionNames, ", "))
	}
	e.dir.applyMu.RLock()
	defer e.dir.applyMu.RUnlock()
	now := e.now()
	v, err := e.EvalInput(name, input)
	if err != nil {
		return Decision{}, fmt.Errorf("cannot decide %s: %w", name, err)
	}
	d := Decision{DecisionID: schema.NewID(), Name: name, PolicyRevision: rev.hash,
		Position: e.dir.positionLocked(), DecidedAt: now}
	rs, err := q.Eval(ctx, rego.EvalParsedInput(v), rego.EvalGenerateJSON(astResult), noMetrics)
	switch {
	case err != nil:
		// A policy that fails to evaluate is a decision that allows nothing, its
		// reason the error.
		d.Reasons = []Reason{{Code: CodeEvalError, Message: err.Error()}}
		return d, nil
	case len(rs) == 0 || len(rs[0].Expressions) == 0:
		d.Reasons = []Reason{{Code: CodeUndefined, Message: name + " is undefined for this input"}}
		return d, nil
	}
	decode(&d, rs[0].Expressions[0].Value.(*ast.Term).Value)
	if name == SendMessage && d.Allow {
		e.enforce(&d, v, now)
	}
	return d, nil
}

// noMetrics spares each evaluation the metrics OPA would otherwise allocate for it (the
// engine reads none).
var noMetrics = rego.EvalMetrics(metrics.NoOp())

// astResult keeps a result as OPA's AST term; decode reads it without the conversion to
// Go maps and slices that OPA does by default.
func astResult(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }

// PeerVisible is Decide(ctx, "peer_visible", in).
func (e *Engine) PeerVisible(ctx context.Context, in PeerInput) (Decision, error) {
	return e.Decide(ctx, PeerVisible, in)
}

// AddParticipant is Decide(ctx, "add_participant", in).
func (e *Engine) AddParticipant(ctx context.Context, in AddInput) (Decision, error) {
	return e.Decide(ctx, AddParticipant, in)
}

// ContactRequest is Decide(ctx, "contact_request", in).
func (e *Engine) ContactRequest(ctx context.Context, in ContactInput) (Decision, error) {
	return e.Decide(ctx, ContactRequest, in)
}

// SendMessage is Decide(ctx, "send_message", in).
func (e *Engine) SendMessage(ctx context.Context, in MessageInput) (Decision, error) {
	return e.Decide(ctx, SendMessage, in)
}

// enforce applies the quota the policy returned: the budgets first (Ledger.Reserve:
// the organization's, owner's, agent's and room's, day and month, the initiator's of
// the input's chain, and the quota's daily defaults where no day budget is set),
// reserving the estimate; then the per-agent-room and per-agent rates, which give the
// reservation back when they deny. now is the decision's one clock reading, so a replay
// at DecidedAt takes exactly what the decision took.
func (e *Engine) enforce(d *Decision, input ast.Value, now time.Time) {
	q := d.Quota
	if q == nil {
		return
	}
	tokens, cost := messageAmounts(input)
	room := roomOf(input)
	ch := Charge{Org: d.Org, Owner: d.Owner, Agent: d.Agent, Room: room, Tokens: tokens, CostMicros: cost}
	if id, typ := chainInitiator(input); id != "" {
		if org, ok := e.dir.InitiatorOrg(id, typ, d.Org); ok {
			ch.Initiator, ch.InitiatorOrg = id, org
		}
	}
	res, denied := e.ledger.Reserve(d.DecisionID, ch,
		stringField(input, "execution_id"), DefaultLimits{
			AgentTokens: q.TokensPerDayAgent, OwnerTokens: q.TokensPerDayOwner, OrgTokens: q.TokensPerDayOrg,
			AgentCost: q.CostMicrosPerDayAgent, OwnerCost: q.CostMicrosPerDayOwner, OrgCost: q.CostMicrosPerDayOrg,
		}, now)
	if denied != nil {
		e.deny(d, CodeBudgetExceeded, denied.RetryAfter, denied.Message)
		return
	}
	if res != nil {
		d.ReservationID, d.ReservationExpires = res.ID, res.Expires
	}
	window := time.Duration(q.WindowSeconds) * time.Second
	roomKey := RoomRateKey(d.Agent, room)
	if ok, retry := e.limiter.Allow(roomKey, int(q.MessagesPerWindowAgentRoom), window, now); !ok {
		e.release(d, now)
		e.deny(d, CodeRateLimited, retry,
			fmt.Sprintf("agent %s may post %d messages per %s in this room", d.Agent, q.MessagesPerWindowAgentRoom, window))
		return
	}
	if ok, retry := e.limiter.Allow(AgentRateKey(d.Agent), int(q.MessagesPerWindowAgent), window, now); !ok {
		e.limiter.undo(roomKey, int(q.MessagesPerWindowAgentRoom), window)
		e.release(d, now)
		e.deny(d, CodeRateLimited, retry,
			fmt.Sprintf("agent %s may post %d messages per %s", d.Agent, q.MessagesPerWindowAgent, window))
	}
}

// over reports whether spending add on top of spent passes limit (0 = unlimited). With
// nothing to add, reaching the limit is enough. It never computes spent+add, which
// could wrap: an estimate of math.MaxInt64 tokens is over any limit, never under it.
func over(spent, add, limit int64) bool {
	if limit <= 0 {
		return false
	}
	if spent >= limit {
		return true
	}
	return add > 0 && add > limit-spent
}

func (e *Engine) deny(d *Decision, code string, retry time.Duration, msg string) {
	d.Allow = false
	d.Reasons = []Reason{{Code: code, Message: msg}}
	d.RetryAfterMs = max(1, (retry.Nanoseconds()+int64(time.Millisecond)-1)/int64(time.Millisecond))
}

func roomOf(v ast.Value) string { return stringField(v, "room") }

// stringField is the string field k of an input object, or "".
func stringField(v ast.Value, k string) string {
	if o, ok := v.(ast.Object); ok {
		if t := o.Get(str(k)); t != nil {
			if s, ok := t.Value.(ast.String); ok {
				return string(s)
			}
		}
	}
	return ""
}

// build loads, compiles, tests and prepares a bundle.
func (e *Engine) build(ctx context.Context, fsys fs.FS) (*revision, error) {
	b, err := loadBundle(fsys)
	if err != nil {
		return nil, err
	}
	report, err := b.test(ctx)
	if err != nil {
		return nil, err
	}
	compiler := newCompiler()
	if compiler.Compile(b.modules(false)); compiler.Failed() {
		return nil, fmt.Errorf("cannot compile policy bundle: %w", compiler.Errors)
	}
	rev := &revision{hash: b.hash, files: b.files, compiler: compiler, queries: map[string]rego.PreparedEvalQuery{},
		coverage: report.Coverage, tests: report.Passed}
	for _, name := range decisionNames {
		ref := ast.MustParseRef("data.bandplane." + name + ".decision")
		if len(compiler.GetRulesExact(ref)) == 0 {
			return nil, fmt.Errorf("cannot prepare decision %s: the bundle has no rule %s", name, ref)
		}
		pq, err := rego.New(
			rego.ParsedQuery(ast.NewBody(ast.NewExpr(ast.NewTerm(ref)))),
			rego.Compiler(compiler),
			rego.Store(e.dir.store),
			// A builtin error is an evaluation error (a deny with eval_error), not
			// a silently undefined expression.
			rego.StrictBuiltinErrors(true),
		).PrepareForEval(ctx)
		if err != nil {
			return nil, fmt.Errorf("cannot prepare decision %s: %w", name, err)
		}
		rev.queries[name] = pq
	}
	return rev, nil
}

// policyBundle is a parsed bundle.
type policyBundle struct {
	hash     string
	files    fstest.MapFS
	policies map[string]*ast.Module // file name -> module, without tests
	tests    map[string]*ast.Module
	data     map[string]*ast.Module // generated from data.json files
}

func (b *policyBundle) modules(withTests bool) map[string]*ast.Module {
	out := map[string]*ast.Module{}
	for _, m := range []map[string]*ast.Module{b.policies, b.data} {
		for k, v := range m {
			out[k] = v
		}
	}
	if withTests {
		for k, v := range b.tests {
			out[k] = v
		}
	}
	return out
}

// loadBundle reads *.rego and data.json files. The hash covers exactly those files,
// sorted by name: name, length and content of each.
func loadBundle(fsys fs.FS) (*policyBundle, error) {
	b := &policyBundle{files: fstest.MapFS{}, policies: map[string]*ast.Module{}, tests: map[string]*ast.Module{}, data: map[string]*ast.Module{}}
	var names []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".rego") || path.Base(p) == "data.json") {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list policy bundle: %w", err)
	}
	if len(names) == 0 {
		return nil, errors.New("cannot load policy bundle: no .rego files")
	}
	slices.Sort(names)
	h := sha256.New()
	for _, name := range names {
		src, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("cannot read policy file %s: %w", name, err)
		}
		var n [8]byte
		h.Write([]byte(name))
		binary.BigEndian.PutUint64(n[:], uint64(len(src)))
		h.Write(n[:])
		h.Write(src)
		b.files[name] = &fstest.MapFile{Data: src, Mode: 0o444}
		if path.Base(name) == "data.json" {
			mods, err := dataModules(name, src)
			if err != nil {
				return nil, err
			}
			for k, m := range mods {
				b.data[k] = m
			}
			continue
		}
		m, err := ast.ParseModuleWithOpts(name, string(src), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, fmt.Errorf("cannot parse policy file %s: %w", name, err)
		}
		if strings.HasSuffix(name, "_test.rego") {
			b.tests[name] = m
		} else {
			b.policies[name] = m
		}
	}
	b.hash = hex.EncodeToString(h.Sum(nil))
	return b, nil
}

var ident = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// dataModules turns a data.json into Rego modules, so the policy data is compiled into
// the revision instead of living in the shared store: a revision is then immutable, and
// a decision never mixes one revision's rules with another's data. The directory of
// the file is its data path (as in OPA bundles); each top-level key becomes a package
// and each key below it a rule: {"quotas": {"defaults": {...}}} is data.quotas.defaults.
func dataModules(name string, src []byte) (map[string]*ast.Module, error) {
	var doc map[string]map[string]json.RawMessage
	if err := json.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("cannot parse policy data %s (want an object of objects): %w", name, err)
	}
	var prefix []string
	if dir := path.Dir(name); dir != "." {
		prefix = strings.Split(dir, "/")
	}
	out := map[string]*ast.Module{}
	for pkg, rules := range doc {
		segs := append(slices.Clone(prefix), pkg)
		var sb strings.Builder
		sb.WriteString("package " + strings.Join(segs, ".") + "\n\n")
		for _, k := range slices.Sorted(maps.Keys(rules)) {
			if !ident.MatchString(k) || ast.IsKeyword(k) {
				return nil, fmt.Errorf("cannot use policy data key %q in %s: not a Rego identifier", k, name)
			}
			sb.WriteString(k + " := " + string(rules[k]) + "\n\n")
		}
		for _, s := range segs {
			if !ident.MatchString(s) || ast.IsKeyword(s) {
				return nil, fmt.Errorf("cannot use policy data path %q in %s: not a Rego identifier", s, name)
			}
		}
		file := name + "#" + pkg + ".rego"
		m, err := ast.ParseModuleWithOpts(file, sb.String(), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, fmt.Errorf("cannot convert policy data %s: %w", name, err)
		}
		out[file] = m
	}
	return out, nil
}

// TestReport is the outcome of a bundle's Rego tests.
type TestReport struct {
	Passed   int      `json:"passed"`
	Failed   []string `json:"failed,omitempty"` // package.rule: reason
	Coverage float64  `json:"coverage"`         // % of policy lines (tests and data excluded)
	// NotCovered lists policy lines no test reached, as file:line.
	NotCovered []string `json:"not_covered,omitempty"`
}

// TestBundle runs a bundle's Rego tests through OPA's test runner and measures line
// coverage of the policies. It returns an error when a test fails or errs.
func TestBundle(ctx context.Context, fsys fs.FS) (TestReport, error) {
	b, err := loadBundle(fsys)
	if err != nil {
		return TestReport{}, err
	}
	return b.test(ctx)
}

func (b *policyBundle) test(ctx context.Context) (TestReport, error) {
	if err := b.checkBuiltins(); err != nil {
		return TestReport{}, err
	}
	cov := cover.New()
	runner := tester.NewRunner().
		SetDefaultRegoVersion(ast.RegoV1).
		SetCompiler(newCompiler()).
		SetCoverageQueryTracer(cov).
		SetModules(b.modules(true)).
		SetTimeout(10 * time.Second)
	ch, err := runner.RunTests(ctx, nil)
	if err != nil {
		return TestReport{}, fmt.Errorf("cannot compile policy bundle with its tests: %w", err)
	}
	var rep TestReport
	for r := range ch {
		switch {
		case r.Skip:
		case r.Error != nil:
			rep.Failed = append(rep.Failed, fmt.Sprintf("%s.%s: %v", r.Package, r.Name, r.Error))
		case r.Fail:
			rep.Failed = append(rep.Failed, fmt.Sprintf("%s.%s: failed", r.Package, r.Name))
		default:
			rep.Passed++
		}
	}
	slices.Sort(rep.Failed)
	cr := cov.Report(b.policies)
	var covered, notCovered int
	for file := range b.policies {
		fr, ok := cr.Files[file]
		if !ok {
			continue
		}
		covered += fr.CoveredLines
		notCovered += fr.NotCoveredLines
		for _, r := range fr.NotCovered {
			for line := r.Start.Row; line <= r.End.Row; line++ {
				rep.NotCovered = append(rep.NotCovered, fmt.Sprintf("%s:%d", file, line))
			}
		}
	}
	if covered+notCovered > 0 {
		rep.Coverage = 100 * float64(covered) / float64(covered+notCovered)
	}
	slices.Sort(rep.NotCovered)
	rep.NotCovered = slices.Compact(rep.NotCovered)
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("cannot accept policy bundle: %d Rego tests failed: %s", len(rep.Failed), strings.Join(rep.Failed, "; "))
	}
	return rep, nil
}
