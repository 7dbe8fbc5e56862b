package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// In a test binary, `bench query` runs the test binary for its subscribers' process
// (os.Executable): this init runs the hidden command there instead of the tests,
// before the testing package reads its flags. It calls the command's function itself,
// as the commands table may not be filled yet (each file's init fills its entries).
func init() {
	if len(os.Args) < 2 || os.Args[1] != subscribersCommand {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, log: newLogger(os.Stderr)}
	err := runBenchQuerySubscribers(ctx, e, os.Args[2:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bandplane %s: %v\n", subscribersCommand, err)
		os.Exit(1)
	}
	os.Exit(0)
}
