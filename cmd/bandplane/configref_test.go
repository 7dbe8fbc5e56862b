package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const repoRoot = "../.."

// TestConfigReferenceUpToDate regenerates the reference and compares it with
// CONFIG.md: a flag or variable added, changed or removed without regenerating fails
// here.
func TestConfigReferenceUpToDate(t *testing.T) {
	doc, err := configReference(context.Background(), commands, repoRoot)
	require.NoError(t, err)
	assert.Contains(t, doc, "### `bandplane normalize`\n\nNo flags.\n", "a command without flags is listed too")
	assert.True(t, strings.HasPrefix(doc, configRefHeader), "the file opens with its title")
	committed, err := os.ReadFile(filepath.Join(repoRoot, configRefFile))
	require.NoError(t, err, "run %s", configRefCommand)
	got := string(committed)
	if got == doc {
		return
	}
	want, have := strings.Split(doc, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(want) || i < len(have); i++ {
		w, h := lineAt(want, i), lineAt(have, i)
		if w != h {
			t.Fatalf("%s is stale: run %s\nfirst difference, line %d:\n  committed: %s\n  generated: %s",
				configRefFile, configRefCommand, i+1, h, w)
		}
	}
}

func lineAt(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end)"
}

// TestConfigReferenceListsEveryVariable reads CONFIG.md's own table: every variable
// the product's Go code reads and every one a deploy script documents has a row.
func TestConfigReferenceListsEveryVariable(t *testing.T) {
	src, err := scanSources(repoRoot)
	require.NoError(t, err)
	scripts, err := scanScripts(repoRoot)
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(repoRoot, configRefFile))
	require.NoError(t, err)
	rows := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if name, ok := strings.CutPrefix(line, "| `BANDPLANE_"); ok {
			name, _, _ = strings.Cut(name, "`")
			rows["BANDPLANE_"+name] = true
		}
	}
	// The ones everyone knows are read must be found, or the scan is broken.
	for _, v := range []string{"BANDPLANE_KAFKA", "BANDPLANE_CLICKHOUSE_PASSWORD", "BANDPLANE_LOG_LEVEL", "BANDPLANE_KEY"} {
		assert.Contains(t, src.vars, v)
	}
	assert.NotContains(t, src.vars, "BANDPLANE_INTEGRATION", "deploy/stacktest is test-only: not product code")
	for v, where := range src.vars {
		assert.True(t, rows[v], "%s is read in %v but missing from %s's environment table: run %s", v, where, configRefFile, configRefCommand)
	}
	require.NotEmpty(t, scripts)
	for _, s := range scripts {
		assert.True(t, rows[s.Name], "%s is documented in %s but missing from %s's environment table: run %s", s.Name, s.Script, configRefFile, configRefCommand)
	}
}

// TestConfigReferenceHelpTouchesNothing runs every real command with -h while every
// variable the code reads points at a listener: parsing -h must come before any
// connection (the walk's cancelled context catches the ones that honour it, the
// listener the others).
func TestConfigReferenceHelpTouchesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	accepted := make(chan string, 1024) // the remote address of each connection, in order
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr().String()
			_ = c.Close()
		}
	}()
	src, err := scanSources(repoRoot)
	require.NoError(t, err)
	for v := range src.vars {
		t.Setenv(v, ln.Addr().String())
	}
	runs := helpWalk(context.Background(), commands)
	paths := map[string]bool{}
	for _, r := range runs {
		paths[r.path] = true
		assert.NoError(t, r.err, "bandplane %s -h", r.path)
		for _, s := range r.sets {
			assert.True(t, s.helped, "bandplane %s: flag set %q", r.path, s.name)
		}
	}
	// A marker connection, made after the walk: the listener hands out connections in
	// the order they were made, so every connection a command made before it returns
	// has been accepted once the marker has. (A goroutine a command left behind could
	// still dial later; the walk's context is cancelled, which stops those that honour
	// it, and nothing can wait for the others.)
	marker, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer func() { _ = marker.Close() }()
	var others []string
	for done := false; !done; {
		select {
		case remote := <-accepted:
			if remote == marker.LocalAddr().String() {
				done = true
			} else {
				others = append(others, remote)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the marker connection was never accepted")
		}
	}
	assert.Empty(t, others, "bandplane … -h connected to %s", ln.Addr())
	for _, p := range []string{"serve", "normalize", "keys create", "audit export", "bench query", "policy eval", "budgets delete", "prices list"} {
		assert.True(t, paths[p], "%s not walked", p)
	}
	assert.False(t, paths["config-reference"], "hidden commands are not documented")
}

// TestConfigReferenceGroupsDispatchFromTheirTable: the subcommand table is the one the
// dispatcher runs, and each group's usage names every entry of it.
func TestConfigReferenceGroupsDispatchFromTheirTable(t *testing.T) {
	groups := 0
	for name, c := range commands {
		if len(c.subs) == 0 {
			continue
		}
		groups++
		for sub := range c.subs {
			assert.Contains(t, c.usage, sub, "bandplane %s's usage does not mention %s", name, sub)
			var stderr bytes.Buffer
			e := &env{stdin: strings.NewReader(""), stdout: &bytes.Buffer{}, stderr: &stderr, log: newLogger(&stderr), flagSets: &flagSetLog{}}
			err := c.run(context.Background(), e, []string{sub, "-h"})
			assert.Equal(t, exitError{code: 0}, err, "bandplane %s %s -h", name, sub)
			require.Len(t, e.flagSets.sets, 1, "bandplane %s %s", name, sub)
			assert.Equal(t, name+" "+sub, e.flagSets.sets[0].name)
		}
	}
	assert.GreaterOrEqual(t, groups, 6, "keys, audit, budgets, prices, bench, policy")

	var stderr strings.Builder
	assert.Equal(t, 2, run([]string{"bench", "nope"}, strings.NewReader(""), &bytes.Buffer{}, &stderr))
	assert.Contains(t, stderr.String(), `bandplane bench: unknown command "nope"`)
	stderr.Reset()
	assert.Equal(t, 0, run([]string{"policy", "-h"}, strings.NewReader(""), &bytes.Buffer{}, &stderr))
	assert.Contains(t, stderr.String(), "usage: bandplane policy eval")

	stderr.Reset()
	usage(&stderr)
	assert.NotContains(t, stderr.String(), "config-reference", "hidden from the command list")
	assert.Contains(t, stderr.String(), "serve")
}

// fakeFlags is a fake command: a flag set of name with the flags def defines.
func fakeFlags(name string, def func(fs *flag.FlagSet)) runFunc {
	return func(ctx context.Context, e *env, args []string) error {
		fs := newFlagSet(e, name, "[flags]")
		def(fs)
		return parse(fs, args)
	}
}

func TestConfigReferenceFindsWhichVariableSetsWhichFlag(t *testing.T) {
	cmds := map[string]command{
		// Says what it reads, and reads it.
		"honest": {run: fakeFlags("honest", func(fs *flag.FlagSet) {
			fs.String("addr", envOr("BANDPLANE_CONFIGREF_HONEST", "d"), "an address (env BANDPLANE_CONFIGREF_HONEST)")
		})},
		// Reads a variable without saying so: found all the same.
		"quiet": {run: fakeFlags("quiet", func(fs *flag.FlagSet) {
			fs.String("name", envOr("BANDPLANE_CONFIGREF_QUIET", "q"), "a name")
		})},
		// Reads a duration, keeping the built-in value when it does not parse: found by
		// the sentinel that parses.
		"parsed": {run: fakeFlags("parsed", func(fs *flag.FlagSet) {
			d := time.Second
			if v, err := time.ParseDuration(os.Getenv("BANDPLANE_CONFIGREF_DURATION")); err == nil {
				d = v
			}
			fs.Duration("every", d, "how often")
		})},
		// Reads it itself after parsing, as its usage says: a fallback.
		"fallback": {run: fakeFlags("fallback", func(fs *flag.FlagSet) {
			fs.String("key", "", "a key (default: env BANDPLANE_CONFIGREF_FALLBACK)")
		})},
		"group": group("group", "a group", "usage: group a|b\n", map[string]runFunc{
			"a": fakeFlags("group a", func(fs *flag.FlagSet) { fs.Bool("x", false, "x") }),
			"b": fakeFlags("group b", func(fs *flag.FlagSet) {}),
		}),
		// Takes no flags and makes no flag set (as normalize): still listed.
		"bare": {run: func(context.Context, *env, []string) error { return nil }},
		"hush": {hidden: true, run: fakeFlags("hush", func(fs *flag.FlagSet) { fs.Bool("y", false, "y") })},
	}
	t.Setenv("BANDPLANE_CONFIGREF_HONEST", "from the environment of the run") // never documented as the default
	src := sourceScan{
		vars: map[string][]location{
			"BANDPLANE_CONFIGREF_HONEST": {{"x.go", "honest"}}, "BANDPLANE_CONFIGREF_QUIET": {{"x.go", "quiet"}},
			"BANDPLANE_CONFIGREF_DURATION": {{"x.go", "parsed"}}, "BANDPLANE_CONFIGREF_FALLBACK": {{"x.go", "fallback"}},
		},
		flagSetReads: map[string][]string{"fallback": {"BANDPLANE_CONFIGREF_FALLBACK"}},
	}
	ref := collect(context.Background(), cmds, src)
	require.Empty(t, ref.problems)
	assert.Equal(t, "from the environment of the run", os.Getenv("BANDPLANE_CONFIGREF_HONEST"), "the environment is put back")

	docs := map[string]commandDoc{}
	var paths []string
	for _, c := range ref.Commands {
		docs[c.Path] = c
		paths = append(paths, c.Path)
	}
	assert.Equal(t, []string{"bare", "fallback", "group a", "group b", "honest", "parsed", "quiet"}, paths)
	assert.Equal(t, []flagDoc{{Name: "addr", Default: "d", Usage: "an address (env BANDPLANE_CONFIGREF_HONEST)", Env: []string{"BANDPLANE_CONFIGREF_HONEST"}}}, docs["honest"].Flags)
	assert.Equal(t, []string{"BANDPLANE_CONFIGREF_QUIET"}, docs["quiet"].Flags[0].Env)
	assert.Equal(t, []string{"BANDPLANE_CONFIGREF_DURATION"}, docs["parsed"].Flags[0].Env)
	assert.Equal(t, "1s", docs["parsed"].Flags[0].Default)
	assert.Empty(t, docs["fallback"].Flags[0].Env)
	assert.Equal(t, []string{"BANDPLANE_CONFIGREF_FALLBACK"}, docs["fallback"].Flags[0].Fallback)
	assert.True(t, docs["bare"].NoFlagSet)
	assert.Empty(t, docs["group b"].Flags)
	assert.False(t, docs["group b"].NoFlagSet)

	ref.addEnv(src, nil, nil)
	require.Empty(t, ref.problems)
	md := ref.render()
	assert.Contains(t, md, "### `bandplane bare`\n\nNo flags.\n")
	assert.Contains(t, md, "### `bandplane group b`\n\n`bandplane group b [flags]`\n\nNo flags.\n")
	assert.Contains(t, md, "| `--key` |  | `BANDPLANE_CONFIGREF_FALLBACK` (fallback) | a key (default: env BANDPLANE_CONFIGREF_FALLBACK) |")
	assert.Contains(t, md, "| `BANDPLANE_CONFIGREF_HONEST` | `x.go` (honest) | an address; default of `--addr` (honest) |")
	assert.Contains(t, md, "| `BANDPLANE_CONFIGREF_FALLBACK` | `x.go` (fallback) | a key; read when `--key` (fallback) is not given |")
	assert.NotContains(t, md, "hush")
}

// TestConfigReferenceReportsWhatWouldMislead: each fake command is wrong in one way,
// and the reference refuses to be made, saying which and why.
func TestConfigReferenceReportsWhatWouldMislead(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		run        runFunc
		reads      map[string][]string
		problem    string
	}{
		{"usage names a variable the default does not read", "liar", fakeFlags("liar", func(fs *flag.FlagSet) {
			fs.String("addr", "127.0.0.1:1", "an address (env BANDPLANE_CONFIGREF_LIAR)")
		}), nil, "bandplane liar --addr: its usage says env BANDPLANE_CONFIGREF_LIAR, but BANDPLANE_CONFIGREF_LIAR does not set its default and the command does not read it"},
		{"usage names a variable another command reads", "liar", fakeFlags("liar", func(fs *flag.FlagSet) {
			fs.String("addr", "", "an address (default: env BANDPLANE_CONFIGREF_LIAR)")
		}), map[string][]string{"someone else": {"BANDPLANE_CONFIGREF_LIAR"}}, "its usage says env BANDPLANE_CONFIGREF_LIAR"},
		{"empty description", "blank", fakeFlags("blank", func(fs *flag.FlagSet) { fs.Bool("b", false, " ") }), nil,
			"bandplane blank --b has no description"},
		{"work before parsing", "eager", func(ctx context.Context, e *env, args []string) error {
			if err := ctx.Err(); err != nil { // stands for a connection made before parse
				return fmt.Errorf("cannot connect: %w", err)
			}
			return parse(newFlagSet(e, "eager", ""), args)
		}, nil, "bandplane eager -h returned cannot connect: context canceled"},
		{"output before parsing", "chatty", func(ctx context.Context, e *env, args []string) error {
			fmt.Fprintln(e.stdout, `{"done":true}`)
			return parse(newFlagSet(e, "chatty", ""), args)
		}, nil, `bandplane chatty -h wrote "{\"done\":true}" to stdout`},
		{"flag set never parsed", "lazy", func(ctx context.Context, e *env, args []string) error {
			newFlagSet(e, "lazy", "")
			return exitError{code: 0}
		}, nil, `bandplane lazy -h made flag set "lazy" but did not parse -h with it`},
		{"panic", "boom", func(ctx context.Context, e *env, args []string) error { panic("boom") }, nil, "bandplane boom -h panicked: boom"},
		{"flag set named for another command", "cmd", fakeFlags("other", func(fs *flag.FlagSet) {}), nil,
			`bandplane cmd names its flag set "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := sourceScan{vars: map[string][]location{"BANDPLANE_CONFIGREF_LIAR": {{"x.go", "f"}}}, flagSetReads: tc.reads}
			ref := collect(context.Background(), map[string]command{tc.path: {run: tc.run}}, src)
			assert.Contains(t, strings.Join(ref.problems, "\n"), tc.problem)
		})
	}
}

func TestConfigReferenceVariablesNeedAMeaning(t *testing.T) {
	src := sourceScan{vars: map[string][]location{"BANDPLANE_CONFIGREF_MUTE": {{"x.go", "f"}}, "BANDPLANE_CONFIGREF_TOLD": {{"x.go", "g"}}}}
	ref := &reference{}
	ref.addEnv(src, []scriptVar{{Name: "BANDPLANE_CONFIGREF_SCRIPT", Script: "deploy/x.sh", Meaning: "a port (default 1)"}}, map[string]string{
		"BANDPLANE_CONFIGREF_TOLD":   "what it means",
		"BANDPLANE_CONFIGREF_SCRIPT": "said twice",
		"BANDPLANE_CONFIGREF_GONE":   "read no more",
	})
	assert.Equal(t, []string{
		"BANDPLANE_CONFIGREF_MUTE is read in `x.go` (f) but no flag or deploy script header says what it means: add it to envMeanings (configref.go)",
		"envMeanings[BANDPLANE_CONFIGREF_GONE] (configref.go): no product code reads BANDPLANE_CONFIGREF_GONE any more; remove it",
		"envMeanings[BANDPLANE_CONFIGREF_SCRIPT] (configref.go) is not needed any more: its meaning comes from a flag or a deploy script; remove it",
	}, ref.problems)
	require.Len(t, ref.Env, 3)
	assert.Equal(t, envDoc{Name: "BANDPLANE_CONFIGREF_TOLD", ReadIn: []string{"`x.go` (g)"}, Meaning: "what it means"}, ref.Env[2])
}

// TestConfigReferenceScanSources: what counts as product code and as a read.
func TestConfigReferenceScanSources(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	write("cmd/bandplane/main.go", `package main

import (
	"flag"
	"os"

	"example.com/m/lib"
)

func main() { _ = os.Getenv("BANDPLANE_MAIN"); lib.F() }

func runX(e *env, args []string) error {
	fs := newFlagSet(e, "x", "[flags]")
	fs.String("key", envOr("BANDPLANE_X_DEFAULT", ""), "a key")
	_ = os.Getenv("BANDPLANE_X_FALLBACK")
	return parse(fs, args)
}

func (s *stack) register(fs *flag.FlagSet) { _, _ = os.LookupEnv("BANDPLANE_METHOD") }

func runBare(args []string) {
	bare := flag.NewFlagSet("bare", flag.ContinueOnError)
	bare.Int("unseen", 0, "a flag config-reference cannot see")
}

var notARead = map[string]string{"BANDPLANE_MAP_KEY": "x"}

func message() string { return "set BANDPLANE_IN_PROSE to x" }
`)
	write("cmd/bandplane/main_test.go", `package main
import ("os"; _ "example.com/m/testonly")
var _ = os.Getenv("BANDPLANE_TEST_FILE")
`)
	write("cmd/bandplane/gen.go", "//go:build ignore\n\npackage main\nimport \"os\"\nvar _ = os.Getenv(\"BANDPLANE_IGNORED\")\n")
	write("lib/lib.go", "package lib\nimport \"os\"\nconst envName = \"BANDPLANE_CONST\"\nfunc F() string { return os.Getenv(envName) }\n")
	write("testonly/t.go", "package testonly\nimport \"os\"\nvar _ = os.Getenv(\"BANDPLANE_TEST_PACKAGE\")\n")
	write("unused/u.go", "package unused\nimport \"os\"\nvar _ = os.Getenv(\"BANDPLANE_UNUSED\")\n")

	src, err := scanSources(root)
	require.NoError(t, err)
	assert.Equal(t, map[string][]location{
		"BANDPLANE_MAIN":       {{"cmd/bandplane/main.go", "main"}},
		"BANDPLANE_X_DEFAULT":  {{"cmd/bandplane/main.go", "runX"}},
		"BANDPLANE_X_FALLBACK": {{"cmd/bandplane/main.go", "runX"}},
		"BANDPLANE_METHOD":     {{"cmd/bandplane/main.go", "stack.register"}},
		"BANDPLANE_CONST":      {{"lib/lib.go", "package level"}},
	}, src.vars)
	assert.Equal(t, map[string][]string{"x": {"BANDPLANE_X_DEFAULT", "BANDPLANE_X_FALLBACK"}}, src.flagSetReads)
	assert.Equal(t, []string{"cmd/bandplane/main.go (runBare) --unseen"}, src.bareFlagSets)
}

// TestConfigReferenceNoHiddenFlagSets: the real sources define flags only on flag
// sets newFlagSet made (normalize's own flag set has none).
func TestConfigReferenceNoHiddenFlagSets(t *testing.T) {
	src, err := scanSources(repoRoot)
	require.NoError(t, err)
	assert.Empty(t, src.bareFlagSets)
}

func TestParseScriptHeader(t *testing.T) {
	f := func(script, want string) {
		t.Helper()
		var got []string
		for _, v := range parseScriptHeader("deploy/x.sh", []byte(script)) {
			got = append(got, v.Name+"="+v.Meaning)
		}
		assert.Equal(t, want, strings.Join(got, "\n"))
	}
	f("#!/usr/bin/env bash\n# Does things under $BANDPLANE_STATE/x.\n#\n# Environment:\n"+
		"#   BANDPLANE_STATE     state folder (default: .local)\n"+
		"#   BANDPLANE_PORT      port (default 1)\n"+
		"#   BANDPLANE_DIR       a folder whose files are\n"+
		"#                       merged in\n"+
		"#\n# `status` exits 0.\nset -e\n# BANDPLANE_LATER   not in the header\n",
		"BANDPLANE_STATE=state folder (default: .local)\nBANDPLANE_PORT=port (default 1)\nBANDPLANE_DIR=a folder whose files are merged in")
	f("#!/bin/sh\nset -e\n#   BANDPLANE_X   after the header\n", "")
	f("#   BANDPLANE_X   no shebang\n# prose after it, not a continuation\n", "BANDPLANE_X=no shebang")
}

// TestConfigReferenceSync: --check never writes and calls a missing or different file
// stale; without it the file is written, and left alone when it is current.
func TestConfigReferenceSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "CONFIG.md")
	stale, err := syncReference(path, "new\n", true)
	require.NoError(t, err)
	assert.True(t, stale, "a missing file is stale")
	assert.NoFileExists(t, path, "--check writes nothing")

	stale, err = syncReference(path, "new\n", false)
	require.NoError(t, err)
	assert.False(t, stale)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "new\n", string(got))

	stale, err = syncReference(path, "new\n", true)
	require.NoError(t, err)
	assert.False(t, stale, "the file as generated is current")

	require.NoError(t, os.WriteFile(path, []byte("edited by hand\n"), 0o644))
	stale, err = syncReference(path, "new\n", true)
	require.NoError(t, err)
	assert.True(t, stale)
	got, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "edited by hand\n", string(got), "--check leaves a stale file as it is")

	_, err = syncReference(t.TempDir(), "new\n", false) // a folder: cannot be read as a file
	assert.ErrorContains(t, err, "cannot read the configuration reference")
}

func TestConfigReferenceMarkdown(t *testing.T) {
	assert.Equal(t, "dead-letter topic (default: &lt;topic&gt;.dlq)", textCell("dead-letter topic (default: <topic>.dlq)"))
	assert.Equal(t, `a \| b, `+"`<x\\|y>`", textCell("a | b,\n `<x|y>`"))
	assert.Equal(t, "``a`b``", strings.ReplaceAll(codeCell("a`b"), " ", ""))
	assert.Equal(t, "", codeCell(""))
	assert.Equal(t, "`` bench [flags] (needs `make up`) ``", code("bench [flags] (needs `make up`)"))

	assert.Equal(t, "policy-<hostname>", placeholders("policy-box1", "box1"))
	assert.Equal(t, "$USER@<hostname>", placeholders("$USER@box1", "box1"))
	assert.Equal(t, "bandplane.events", placeholders("bandplane.events", "events"))
	assert.Equal(t, "ab", placeholders("ab", "b"))

	assert.Equal(t, "Ed25519 key file; without it nothing", withoutEnvClaim("Ed25519 key file (env BANDPLANE_K); without it nothing", "BANDPLANE_K"))
	assert.Equal(t, "hosts (default: x)", withoutEnvClaim("hosts (default: x); env BANDPLANE_H", "BANDPLANE_H"))
	assert.Equal(t, "API key", withoutEnvClaim("API key (default: env BANDPLANE_KEY)", "BANDPLANE_KEY"))
}

// TestConfigReferenceCheck runs the hidden command as make generate does, with --check.
func TestConfigReferenceCheck(t *testing.T) {
	var stderr strings.Builder
	code := run([]string{"config-reference", "--root", repoRoot, "--check"}, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	assert.Equal(t, 0, code, "%s", stderr.String())
}
