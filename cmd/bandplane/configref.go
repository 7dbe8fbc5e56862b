package main

// config-reference writes the configuration reference in README.md: every command's
// flags and every BANDPLANE_* environment variable. Nothing in it is written by hand:
//
//   - the commands and subcommands come from the command table (register,
//     registerGroup), and each one's flags from running it with -h while newFlagSet
//     records its flag set (with -h, parse stops every command before it does any work;
//     the walk checks that it did);
//   - which variable sets which flag's default is found by setting each variable to a
//     sentinel and seeing which defaults change, so a usage text that says
//     "(env BANDPLANE_X)" is checked, not believed;
//   - the variables read by Go code come from the sources of the packages the binary is
//     built from (the imports of cmd/bandplane, transitively; _test.go files and
//     test-only packages such as deploy/stacktest are not part of it), and those of the
//     deploy scripts from their header comments.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func init() {
	commands["config-reference"] = command{hidden: true, run: runConfigReference,
		summary: "write the configuration reference (flags, environment) into README.md"}
}

const (
	configRefBegin = "<!-- config-reference:begin -->"
	configRefEnd   = "<!-- config-reference:end -->"
	// configRefCommand regenerates the reference; failures name it.
	configRefCommand = "make generate (or: go run ./cmd/bandplane config-reference)"
	// mainPackage is the binary's package, relative to the module root: the product
	// code whose environment is documented is what it imports.
	mainPackage = "cmd/bandplane"
)

// envMeanings says what a variable means when nothing else does: no flag's default
// reads it and no deploy script documents it. The reference fails when a variable
// lacks a meaning, and when an entry here is no longer needed.
var envMeanings = map[string]string{
	"BANDPLANE_CLICKHOUSE_PASSWORD": "ClickHouse password of every command that connects to ClickHouse (no flag, so that it stays out of the process list)",
	"BANDPLANE_LOG_LEVEL":           "level of the JSON log lines on stderr: debug, info (default), warn or error",
}

func runConfigReference(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "config-reference", "[--root DIR] [--check]")
	root := fs.String("root", "", "the module's root folder (default: the nearest folder up from here holding go.mod)")
	check := fs.Bool("check", false, "write nothing; exit 1 if README.md's configuration reference is stale")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *root == "" {
		r, err := findModuleRoot()
		if err != nil {
			return err
		}
		*root = r
	}
	region, err := configReference(ctx, commands, *root)
	if err != nil {
		return err
	}
	path := filepath.Join(*root, "README.md")
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	updated, err := replaceRegion(string(old), region)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if *check {
		if updated != string(old) {
			fmt.Fprintf(e.stderr, "bandplane config-reference: %s: the configuration reference is stale: run %s\n", path, configRefCommand)
			return exitError{code: 1}
		}
		return nil
	}
	if updated == string(old) {
		return nil
	}
	return os.WriteFile(path, []byte(updated), 0o644)
}

// configReference is the text between the README's markers: the reference of cmds,
// with the environment found in the sources under root. It fails, listing every
// problem, when the reference would be wrong or incomplete.
func configReference(ctx context.Context, cmds map[string]command, root string) (string, error) {
	src, err := scanSources(root)
	if err != nil {
		return "", err
	}
	scripts, err := scanScripts(root)
	if err != nil {
		return "", err
	}
	ref := collect(ctx, cmds, src)
	ref.addEnv(src, scripts, envMeanings)
	if len(ref.problems) > 0 {
		return "", fmt.Errorf("the configuration reference cannot be made:\n  %s", strings.Join(ref.problems, "\n  "))
	}
	return ref.render(), nil
}

func findModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod in the working directory or above it (give --root)")
		}
		dir = up
	}
}

// replaceRegion puts region between the markers of readme.
func replaceRegion(readme, region string) (string, error) {
	i := strings.Index(readme, configRefBegin)
	j := strings.Index(readme, configRefEnd)
	if i < 0 || j < i || strings.Count(readme, configRefBegin) != 1 || strings.Count(readme, configRefEnd) != 1 {
		return "", fmt.Errorf("want one %s followed by one %s", configRefBegin, configRefEnd)
	}
	return readme[:i+len(configRefBegin)] + "\n" + region + readme[j:], nil
}

// regionOf is the text between the markers of readme, as replaceRegion writes it.
func regionOf(readme string) (string, bool) {
	i := strings.Index(readme, configRefBegin)
	j := strings.Index(readme, configRefEnd)
	if i < 0 || j < i {
		return "", false
	}
	return strings.TrimPrefix(readme[i+len(configRefBegin):j], "\n"), true
}

// flagSetLog records the flag sets newFlagSet makes while a command runs with -h.
type flagSetLog struct{ sets []*loggedFlagSet }

type loggedFlagSet struct {
	name, args string
	fs         *flag.FlagSet
	helped     bool // parse saw -h: the command got as far as parsing, and stopped there
}

func (l *flagSetLog) add(name, args string, fs *flag.FlagSet) {
	s := &loggedFlagSet{name: name, args: args, fs: fs}
	fs.Usage = func() { s.helped = true }
	l.sets = append(l.sets, s)
}

// helpRun is what one command path did with -h.
type helpRun struct {
	path string
	sets []*loggedFlagSet
	err  error // -h did more than print usage and exit 0
}

type commandPath struct {
	path string
	run  runFunc
}

// commandPaths are every command and subcommand of cmds that takes flags itself, in
// order; hidden commands are left out.
func commandPaths(cmds map[string]command) []commandPath {
	var out []commandPath
	for _, name := range slices.Sorted(mapKeys(cmds)) {
		c := cmds[name]
		if c.hidden {
			continue
		}
		if len(c.subs) == 0 {
			out = append(out, commandPath{name, c.run})
			continue
		}
		for _, sub := range slices.Sorted(mapKeys(c.subs)) {
			out = append(out, commandPath{name + " " + sub, c.subs[sub]})
		}
	}
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// helpWalk runs every command path with -h, on a cancelled context and with nothing
// on stdin, recording its flag sets: a command that does anything before parsing its
// flags fails there (or writes to stdout, or makes a flag set it does not parse) and is
// reported.
func helpWalk(ctx context.Context, cmds map[string]command) []helpRun {
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	var runs []helpRun
	for _, p := range commandPaths(cmds) {
		runs = append(runs, helpOne(ctx, p))
	}
	return runs
}

func helpOne(ctx context.Context, p commandPath) (r helpRun) {
	r.path = p.path
	var stdout bytes.Buffer
	log := &flagSetLog{}
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: io.Discard,
		log: slog.New(slog.DiscardHandler), flagSets: log}
	defer func() {
		if v := recover(); v != nil {
			r.err = fmt.Errorf("panicked: %v", v)
		}
	}()
	err := p.run(ctx, e, []string{"-h"})
	r.sets = log.sets
	var ee exitError
	switch {
	case err != nil && !(errors.As(err, &ee) && ee.code == 0):
		r.err = fmt.Errorf("returned %v", err)
	case stdout.Len() > 0:
		r.err = fmt.Errorf("wrote %q to stdout", firstLine(stdout.String()))
	}
	for _, s := range r.sets {
		if r.err == nil && !s.helped {
			r.err = fmt.Errorf("made flag set %q but did not parse -h with it", s.name)
		}
	}
	return r
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// flagDoc is one flag of one command.
type flagDoc struct {
	Name, Default, Usage string
	Env                  []string // variables that set its default (found by setting them)
	Fallback             []string // variables its usage names that the command reads itself, not through the default
}

type commandDoc struct {
	Path, Args string
	Flags      []flagDoc
	NoFlagSet  bool // the command makes no flag set through newFlagSet: it takes no flags
}

type envDoc struct {
	Name    string
	ReadIn  []string
	Meaning string
}

type reference struct {
	Commands []commandDoc
	Env      []envDoc
	problems []string
}

func (r *reference) problemf(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// sentinels are the values each variable is set to, in turn, to see which defaults it
// changes: one that is no number or duration, and ones that parse as either, for a
// default that keeps its built-in value when the variable does not parse.
var sentinels = []string{"configref-sentinel", "7919", "79m"}

// envClaim finds the variables a usage text says a flag reads ("(env BANDPLANE_X)",
// "; env BANDPLANE_X", "(default: env BANDPLANE_X)").
var envClaim = regexp.MustCompile("\\benv[ :]+`?(BANDPLANE_[A-Z0-9_]+)")

// collect documents the flags of every command path of cmds; src says which variables
// exist and which command functions read which.
func collect(ctx context.Context, cmds map[string]command, src sourceScan) *reference {
	ref := &reference{}
	restore := pinEnv()
	defer restore()
	base := helpWalk(ctx, cmds)
	for _, run := range base {
		if run.err != nil {
			ref.problemf("bandplane %s -h %v: -h must stop at parsing, before any work (see parse)", run.path, run.err)
		}
	}
	if len(ref.problems) > 0 {
		return ref
	}
	defaults := defaultsOf(base)
	setBy := map[string]map[string][]string{} // path → flag → variables
	for _, v := range slices.Sorted(mapKeys(src.vars)) {
		var failed error
		worked := false
		for _, s := range sentinels {
			os.Setenv(v, s)
			runs := helpWalk(ctx, cmds)
			os.Unsetenv(v)
			if err := firstErr(runs); err != nil {
				failed = err
				continue
			}
			worked = true
			for path, flags := range defaultsOf(runs) {
				for name, def := range flags {
					if def == defaults[path][name] {
						continue
					}
					if setBy[path] == nil {
						setBy[path] = map[string][]string{}
					}
					if !slices.Contains(setBy[path][name], v) {
						setBy[path][name] = append(setBy[path][name], v)
					}
				}
			}
		}
		if !worked {
			ref.problemf("with %s set, %v", v, failed)
		}
	}
	host, _ := os.Hostname()
	for _, run := range base {
		doc := commandDoc{Path: run.path, NoFlagSet: len(run.sets) == 0}
		if len(run.sets) > 1 {
			ref.problemf("bandplane %s makes %d flag sets; the reference documents commands with one", run.path, len(run.sets))
		}
		for _, s := range run.sets {
			if s.name != run.path {
				ref.problemf("bandplane %s names its flag set %q: its usage would say `bandplane %s`", run.path, s.name, s.name)
			}
			doc.Args = s.args
			s.fs.VisitAll(func(f *flag.Flag) {
				fd := flagDoc{Name: f.Name, Default: placeholders(f.DefValue, host), Usage: f.Usage, Env: setBy[run.path][f.Name]}
				slices.Sort(fd.Env)
				if strings.TrimSpace(f.Usage) == "" {
					ref.problemf("bandplane %s --%s has no description: give it a usage text", run.path, f.Name)
				}
				for _, m := range envClaim.FindAllStringSubmatch(f.Usage, -1) {
					v := m[1]
					switch {
					case slices.Contains(fd.Env, v):
					case slices.Contains(src.flagSetReads[s.name], v):
						fd.Fallback = append(fd.Fallback, v)
					default:
						ref.problemf("bandplane %s --%s: its usage says env %s, but %s does not set its default and the command does not read it",
							run.path, f.Name, v, v)
					}
				}
				doc.Flags = append(doc.Flags, fd)
			})
		}
		ref.Commands = append(ref.Commands, doc)
	}
	for _, b := range src.bareFlagSets {
		ref.problemf("%s: flags on a flag set not made by newFlagSet are not in the reference (use newFlagSet)", b)
	}
	return ref
}

func firstErr(runs []helpRun) error {
	for _, r := range runs {
		if r.err != nil {
			return fmt.Errorf("bandplane %s -h %v", r.path, r.err)
		}
	}
	return nil
}

func defaultsOf(runs []helpRun) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, r := range runs {
		flags := map[string]string{}
		for _, s := range r.sets {
			s.fs.VisitAll(func(f *flag.Flag) { flags[f.Name] = f.DefValue })
		}
		out[r.path] = flags
	}
	return out
}

// pinEnv unsets every BANDPLANE_* variable and sets USER and HOME to placeholders, so
// that the defaults documented are the built-in ones whatever the environment of the
// run; the returned func puts the environment back.
func pinEnv() (restore func()) {
	saved := map[string]*string{}
	keep := func(k string) {
		if _, done := saved[k]; done {
			return
		}
		if v, ok := os.LookupEnv(k); ok {
			saved[k] = &v
		} else {
			saved[k] = nil
		}
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "BANDPLANE_") {
			keep(k)
			os.Unsetenv(k)
		}
	}
	for _, k := range []string{"USER", "HOME"} {
		keep(k)
		os.Setenv(k, "$"+k)
	}
	return func() {
		for k, v := range saved {
			if v == nil {
				os.Unsetenv(k)
			} else {
				os.Setenv(k, *v)
			}
		}
	}
}

// placeholders replaces this machine's host name at the end of a default
// ("policy-HOST", "$USER@HOST") by <hostname>.
func placeholders(def, host string) string {
	if host == "" || !strings.HasSuffix(def, host) {
		return def
	}
	rest := strings.TrimSuffix(def, host)
	if rest == "" || strings.HasSuffix(rest, "-") || strings.HasSuffix(rest, "@") {
		return rest + "<hostname>"
	}
	return def
}

// addEnv documents every variable: those the product's Go code reads and those the
// deploy scripts document; meanings are what envMeanings is to the real commands.
func (r *reference) addEnv(src sourceScan, scripts []scriptVar, meanings map[string]string) {
	names := map[string]bool{}
	for v := range src.vars {
		names[v] = true
	}
	byScript := map[string][]scriptVar{}
	for _, s := range scripts {
		names[s.Name] = true
		byScript[s.Name] = append(byScript[s.Name], s)
	}
	defaults, fallbacks := map[string][]flagUse{}, map[string][]flagUse{}
	usages := map[string]map[string]int{}
	for _, c := range r.Commands {
		for _, f := range c.Flags {
			for _, v := range f.Env {
				defaults[v] = append(defaults[v], flagUse{c.Path, f.Name})
			}
			for _, v := range f.Fallback {
				fallbacks[v] = append(fallbacks[v], flagUse{c.Path, f.Name})
			}
			for _, v := range append(slices.Clone(f.Env), f.Fallback...) {
				if usages[v] == nil {
					usages[v] = map[string]int{}
				}
				usages[v][withoutEnvClaim(f.Usage, v)]++
			}
		}
	}
	for _, v := range slices.Sorted(mapKeys(names)) {
		d := envDoc{Name: v}
		for _, loc := range src.vars[v] {
			d.ReadIn = append(d.ReadIn, "`"+loc.file+"` ("+loc.fn+")")
		}
		d.ReadIn = slices.Compact(d.ReadIn)
		var meaning []string
		if u := mostCommon(usages[v]); u != "" {
			meaning = append(meaning, u)
		}
		if sets := flagUses(defaults[v]); sets != "" {
			meaning = append(meaning, "default of "+sets)
		}
		if sets := flagUses(fallbacks[v]); sets != "" {
			meaning = append(meaning, "read when "+sets+" is not given")
		}
		docs := map[string]bool{}
		for _, s := range byScript[v] {
			d.ReadIn = append(d.ReadIn, "`"+s.Script+"`")
			docs[s.Meaning] = true
		}
		if len(docs) == 1 && len(meaning) == 0 {
			meaning = append(meaning, byScript[v][0].Meaning)
		} else {
			for _, s := range byScript[v] {
				meaning = append(meaning, "`"+filepath.Base(s.Script)+"`: "+s.Meaning)
			}
		}
		if m, ok := meanings[v]; ok {
			if len(meaning) > 0 {
				r.problemf("envMeanings[%s] (configref.go) is not needed any more: its meaning comes from a flag or a deploy script; remove it", v)
			}
			meaning = append(meaning, m)
		}
		if len(meaning) == 0 {
			r.problemf("%s is read in %s but no flag or deploy script header says what it means: add it to envMeanings (configref.go)",
				v, strings.Join(d.ReadIn, ", "))
		}
		d.Meaning = strings.Join(meaning, "; ")
		r.Env = append(r.Env, d)
	}
	for v := range meanings {
		if !names[v] {
			r.problemf("envMeanings[%s] (configref.go): no product code reads %s any more; remove it", v, v)
		}
	}
	sort.Strings(r.problems)
}

type flagUse struct{ path, flag string }

// flagUses says which flags of which commands a variable reaches:
// "`--kafka` (audit seal, serve)".
func flagUses(uses []flagUse) string {
	byFlag := map[string][]string{}
	for _, u := range uses {
		byFlag[u.flag] = append(byFlag[u.flag], u.path)
	}
	var parts []string
	for _, f := range slices.Sorted(mapKeys(byFlag)) {
		if paths := byFlag[f]; len(paths) > 4 {
			parts = append(parts, fmt.Sprintf("`--%s` (%d commands)", f, len(paths)))
		} else {
			parts = append(parts, "`--"+f+"` ("+strings.Join(paths, ", ")+")")
		}
	}
	return strings.Join(parts, ", ")
}

// mostCommon is the most common text, the shortest of the most common ones (the
// least particular to one command).
func mostCommon(counts map[string]int) string {
	best, n := "", 0
	for _, s := range slices.Sorted(mapKeys(counts)) {
		if c := counts[s]; c > n || c == n && len(s) < len(best) {
			best, n = s, c
		}
	}
	return best
}

// withoutEnvClaim is a usage text without its mention of v, as the meaning of v.
func withoutEnvClaim(usage, v string) string {
	q := regexp.QuoteMeta(v)
	re := regexp.MustCompile(`\s*\((?:default: )?env ` + q + `\)|\s*[;,]\s*env ` + q + `\b`)
	return strings.TrimSpace(re.ReplaceAllString(usage, ""))
}

// sharedMin is how many commands must have a flag, the same in every way, for it to
// be documented once among the shared flags rather than in each command.
const sharedMin = 3

func (f flagDoc) key() string {
	return strings.Join([]string{f.Name, f.Default, f.Usage, strings.Join(f.Env, ","), strings.Join(f.Fallback, ",")}, "\x00")
}

// render writes the reference as Markdown.
func (r *reference) render() string {
	users := map[string][]string{} // flag key → the commands that have it
	docs := map[string]flagDoc{}
	for _, c := range r.Commands {
		for _, f := range c.Flags {
			users[f.key()] = append(users[f.key()], c.Path)
			docs[f.key()] = f
		}
	}
	var shared []string
	for k, paths := range users {
		if len(paths) >= sharedMin {
			shared = append(shared, k)
		}
	}
	sort.Strings(shared)
	var b strings.Builder
	b.WriteString("Generated from the flag sets and the sources by `make generate` (`go run ./cmd/bandplane config-reference`); " +
		"`go test ./cmd/bandplane` fails when it is stale. An environment variable beside a flag sets that flag's default " +
		"(the flag overrides it); \"fallback\": the command reads the variable itself when the flag is not given.\n\n")
	b.WriteString("### Flags shared by several commands\n\n")
	b.WriteString("| flag | default | environment | description | commands |\n|---|---|---|---|---|\n")
	for _, k := range shared {
		f := docs[k]
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s | %s |\n", f.Name, codeCell(f.Default), envCell(f), textCell(f.Usage), strings.Join(users[k], ", "))
	}
	b.WriteString("\n### Flags by command\n\n")
	for _, c := range r.Commands {
		fmt.Fprintf(&b, "#### `bandplane %s`\n\n", c.Path)
		if c.Args != "" {
			fmt.Fprintf(&b, "%s\n\n", code("bandplane "+c.Path+" "+strings.TrimSpace(c.Args)))
		}
		var own, common []flagDoc
		for _, f := range c.Flags {
			if len(users[f.key()]) >= sharedMin {
				common = append(common, f)
			} else {
				own = append(own, f)
			}
		}
		if len(c.Flags) == 0 {
			b.WriteString("No flags.\n\n")
			continue
		}
		if len(own) > 0 {
			b.WriteString("| flag | default | environment | description |\n|---|---|---|---|\n")
			for _, f := range own {
				fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", f.Name, codeCell(f.Default), envCell(f), textCell(f.Usage))
			}
			b.WriteString("\n")
		}
		if len(common) > 0 {
			var names []string
			for _, f := range common {
				names = append(names, "`--"+f.Name+"`")
			}
			fmt.Fprintf(&b, "[Shared flags](#flags-shared-by-several-commands): %s.\n\n", strings.Join(names, ", "))
		}
	}
	b.WriteString("### Environment variables\n\n")
	b.WriteString("Read by the product's Go code (the packages `bandplane` is built from; tests and `deploy/stacktest` are left out) " +
		"or documented in a deploy script's header.\n\n")
	b.WriteString("| variable | read in | meaning |\n|---|---|---|\n")
	for _, d := range r.Env {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", d.Name, strings.Join(d.ReadIn, ", "), textCell(d.Meaning))
	}
	b.WriteString("\n")
	return b.String()
}

func envCell(f flagDoc) string {
	var env []string
	for _, v := range f.Env {
		env = append(env, "`"+v+"`")
	}
	for _, v := range f.Fallback {
		env = append(env, "`"+v+"` (fallback)")
	}
	return strings.Join(env, ", ")
}

// code is s as inline code outside a table.
func code(s string) string {
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

// codeCell is a default as inline code in a table cell (empty: nothing).
func codeCell(s string) string {
	if s == "" {
		return ""
	}
	s = strings.ReplaceAll(s, "|", `\|`)
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

// textCell is prose in a table cell: no line breaks, pipes escaped, and no HTML (a
// usage text's <topic> must show, not vanish as a tag). Code spans are left alone but
// for their pipes.
func textCell(s string) string {
	var b strings.Builder
	code := false
	for _, r := range strings.Join(strings.Fields(s), " ") {
		switch {
		case r == '`':
			code = !code
			b.WriteRune(r)
		case r == '|':
			b.WriteString(`\|`)
		case r == '<' && !code:
			b.WriteString("&lt;")
		case r == '>' && !code:
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// sourceScan is what the product's Go sources say about the environment.
type sourceScan struct {
	vars         map[string][]location // BANDPLANE_* variable → where it is read
	flagSetReads map[string][]string   // newFlagSet name → variables the function making it reads
	bareFlagSets []string              // where flags are defined on a flag set newFlagSet did not make
}

type location struct{ file, fn string }

// envName is what a variable name looks like: the whole string literal.
var envName = regexp.MustCompile(`^BANDPLANE_[A-Z0-9_]+$`)

// flagDefiners are the flag.FlagSet methods that define a flag.
var flagDefiners = map[string]bool{
	"Bool": true, "BoolVar": true, "BoolFunc": true, "Duration": true, "DurationVar": true, "Float64": true, "Float64Var": true,
	"Func": true, "Int": true, "IntVar": true, "Int64": true, "Int64Var": true, "String": true, "StringVar": true, "TextVar": true,
	"Uint": true, "UintVar": true, "Uint64": true, "Uint64Var": true, "Var": true,
}

// scanSources reads the Go files the binary is built from (mainPackage and the
// module's packages it imports, transitively, with the build constraints of this
// platform; no _test.go files). A BANDPLANE_* string literal counts as a read of that
// variable where it is an argument of a call (os.Getenv, os.LookupEnv, envOr, any
// helper) or the value of a constant or variable (a name later passed to one).
func scanSources(root string) (sourceScan, error) {
	src := sourceScan{vars: map[string][]location{}, flagSetReads: map[string][]string{}}
	module, err := modulePath(root)
	if err != nil {
		return src, err
	}
	fset := token.NewFileSet()
	seen := map[string]bool{mainPackage: true}
	queue := []string{mainPackage}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		pkg, err := build.Default.ImportDir(filepath.Join(root, filepath.FromSlash(dir)), 0)
		if err != nil {
			var noGo *build.NoGoError
			if errors.As(err, &noGo) {
				continue
			}
			return src, fmt.Errorf("cannot read package %s: %w", dir, err)
		}
		for _, imp := range pkg.Imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if ok && !seen[rel] {
				seen[rel] = true
				queue = append(queue, rel)
			}
		}
		for _, name := range append(slices.Clone(pkg.GoFiles), pkg.CgoFiles...) {
			rel := dir + "/" + name
			f, err := parser.ParseFile(fset, filepath.Join(root, filepath.FromSlash(rel)), nil, parser.SkipObjectResolution)
			if err != nil {
				return src, err
			}
			src.scanFile(rel, f, dir == mainPackage)
		}
	}
	for v := range src.vars {
		sort.Slice(src.vars[v], func(i, j int) bool {
			a, b := src.vars[v][i], src.vars[v][j]
			return a.file < b.file || a.file == b.file && a.fn < b.fn
		})
		src.vars[v] = slices.Compact(src.vars[v])
	}
	sort.Strings(src.bareFlagSets)
	return src, nil
}

func modulePath(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", filepath.Join(root, "go.mod"))
}

func (src *sourceScan) scanFile(rel string, f *ast.File, isMain bool) {
	for _, decl := range f.Decls {
		fn := "package level"
		if fd, ok := decl.(*ast.FuncDecl); ok {
			fn = funcName(fd)
		}
		var read, setNames []string
		bare := map[string]bool{}
		ast.Inspect(decl, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				for _, a := range n.Args {
					if v := envLiteral(a); v != "" {
						read = append(read, v)
					}
				}
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "newFlagSet" && len(n.Args) >= 2 {
					if lit, ok := n.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if s, err := strconv.Unquote(lit.Value); err == nil {
							setNames = append(setNames, s)
						}
					}
				}
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && flagDefiners[sel.Sel.Name] {
					if id, ok := sel.X.(*ast.Ident); ok && bare[id.Name] && len(n.Args) > 0 {
						name := "?"
						if s := stringLit(n.Args[0]); s != "" {
							name = s
						} else if len(n.Args) > 1 {
							if s := stringLit(n.Args[1]); s != "" {
								name = s
							}
						}
						src.bareFlagSets = append(src.bareFlagSets, fmt.Sprintf("%s (%s) --%s", rel, fn, name))
					}
				}
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if isMain && fn != "newFlagSet" && isFlagNewFlagSet(rhs) && i < len(n.Lhs) {
						if id, ok := n.Lhs[i].(*ast.Ident); ok {
							bare[id.Name] = true
						}
					}
				}
			case *ast.ValueSpec:
				for _, val := range n.Values {
					if v := envLiteral(val); v != "" {
						read = append(read, v)
					}
				}
			}
			return true
		})
		for _, v := range read {
			src.vars[v] = append(src.vars[v], location{rel, fn})
		}
		for _, s := range setNames {
			src.flagSetReads[s] = append(src.flagSetReads[s], read...)
		}
	}
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

func isFlagNewFlagSet(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "NewFlagSet" {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "flag"
}

func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return s
}

func envLiteral(e ast.Expr) string {
	if s := stringLit(e); envName.MatchString(s) {
		return s
	}
	return ""
}

// scriptVar is a variable a deploy script documents in its header comment.
type scriptVar struct {
	Name, Script, Meaning string
}

// scriptVarLine is a header line documenting a variable: "#   BANDPLANE_X   meaning".
var scriptVarLine = regexp.MustCompile(`^#(\s+)(BANDPLANE_[A-Z0-9_]+)\s+(\S.*)$`)

// scanScripts reads the header comments of the shell scripts under deploy/.
func scanScripts(root string) ([]scriptVar, error) {
	var out []scriptVar
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".sh") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out = append(out, parseScriptHeader(filepath.ToSlash(rel), b)...)
		return nil
	})
	return out, err
}

// parseScriptHeader reads the variables documented in the leading comment of a
// script: lines "#   BANDPLANE_X   meaning", continued by lines indented further.
func parseScriptHeader(script string, b []byte) []scriptVar {
	var out []scriptVar
	indent := -1 // of the variable being read; -1: none
	sc := bufio.NewScanner(bytes.NewReader(b))
	for first := true; sc.Scan(); first = false {
		line := strings.TrimRight(sc.Text(), " \t")
		if first && strings.HasPrefix(line, "#!") {
			continue
		}
		if !strings.HasPrefix(line, "#") {
			break
		}
		if m := scriptVarLine.FindStringSubmatch(line); m != nil {
			out = append(out, scriptVar{Name: m[2], Script: script, Meaning: m[3]})
			indent = len(m[1])
			continue
		}
		text := strings.TrimPrefix(line, "#")
		rest := strings.TrimLeft(text, " \t")
		if indent >= 0 && rest != "" && len(text)-len(rest) > indent {
			out[len(out)-1].Meaning += " " + rest
			continue
		}
		indent = -1
	}
	return out
}
