package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// In a test binary, the commands that run their own binary for a child process (`bench
// query` for its subscribers, a bounded policy replay) run the test binary
// (os.Executable): this init runs the hidden command there instead of the tests,
// before the testing package reads its flags. It calls the command's function itself,
// as the commands table may not be filled yet (each file's init fills its entries).
func init() {
	if len(os.Args) < 2 {
		return
	}
	run, ok := map[string]runFunc{subscribersCommand: runBenchQuerySubscribers, replayChildCommand: runPolicyReplayChild}[os.Args[1]]
	if !ok {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, log: newLogger(os.Stderr)}
	err := run(ctx, e, os.Args[2:])
	stop()
	var exit exitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &exit):
		os.Exit(exit.code)
	}
	fmt.Fprintf(os.Stderr, "bandplane %s: %v\n", os.Args[1], err)
	os.Exit(1)
}
