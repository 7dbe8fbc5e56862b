// Command bandplane is the control plane's one binary. Each subcommand wires the
// components it needs; flags and environment are read here and nowhere else. serve
// runs its components (ingest, policy, live, the API, sealing) through one lifecycle
// (serve_lifecycle.go), each built in a serve_*.go file of its own.
//
// It may import every folder (deploy/layers).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// env is what a subcommand gets from the process: its streams and a logger.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
	// flagSets, when set, records every flag set newFlagSet makes: config-reference
	// runs each command with -h to read its flags without running it.
	flagSets *flagSetLog
}

// exitError carries a non-zero exit status without printing anything more: the
// subcommand has already reported what went wrong.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

type runFunc = func(ctx context.Context, e *env, args []string) error

type command struct {
	summary string
	run     runFunc
	// subs are a group's subcommands (`keys create`), which run dispatches to; usage
	// is the group's usage text. config-reference walks the same table.
	subs   map[string]runFunc
	usage  string
	hidden bool // left out of the command list and the configuration reference
}

// commands is filled by each subcommand's file in its init, so that adding a command
// touches one file only.
var commands = map[string]command{}

func register(name, summary string, run runFunc) {
	commands[name] = command{summary: summary, run: run}
}

// registerGroup registers a command made of subcommands: `bandplane NAME SUB [flags]`
// runs subs[SUB]; without SUB, or with an unknown one, it prints usage and exits 2;
// -h prints usage and exits 0.
func registerGroup(name, summary, usage string, subs map[string]runFunc) {
	commands[name] = group(name, summary, usage, subs)
}

// group is the command registerGroup registers.
func group(name, summary, usage string, subs map[string]runFunc) command {
	return command{summary: summary, subs: subs, usage: usage, run: func(ctx context.Context, e *env, args []string) error {
		if len(args) == 0 {
			fmt.Fprint(e.stderr, usage)
			return exitError{code: 2}
		}
		if run, ok := subs[args[0]]; ok {
			return run(ctx, e, args[1:])
		}
		switch args[0] {
		case "-h", "--help", "help":
			fmt.Fprint(e.stderr, usage)
			return exitError{code: 0}
		}
		fmt.Fprintf(e.stderr, "bandplane %s: unknown command %q\n\n%s", name, args[0], usage)
		return exitError{code: 2}
	}}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: bandplane <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'bandplane <command> -h' for a command's flags.")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "bandplane: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, log: newLogger(stderr)}
	if err := cmd.run(ctx, e, args[1:]); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		fmt.Fprintf(stderr, "bandplane %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// printJSON writes v as one JSON line: what every command prints on stdout.
func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func newLogger(w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if v := os.Getenv("BANDPLANE_LOG_LEVEL"); v != "" {
		_ = level.UnmarshalText([]byte(v))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
