package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// A component is one part of serve (ingest, policy, live, the API's listeners,
// sealing, and the jobs that keep keys and prices current). serve builds each, then
// runComponents runs them: it starts every component's work, /readyz asks their
// ready, and they stop in stage order.
type component struct {
	name  string
	stage stage
	// run does the component's work until ctx ends. An error ends the process: serve
	// stops every component and returns it.
	run func(ctx context.Context) error
	// ready says why the component does not serve yet ("" once it does); nil: always
	// ready.
	ready func() string
}

// stage is when a component stops. The shutdown order is written here once: intake
// first, so that nothing new arrives; then ingest, whose consumer flushes and commits
// while the rollup catches up, together with the readers and jobs that live as long;
// then sealing, whose last seal covers ingest's last flush. The clients the components
// share close after all of them (serve's deferred closes).
type stage int

const (
	stageIntake stage = iota
	stageIngest
	stageSeal
	stages
)

// runComponents runs cs until ctx ends or one of them fails, then stops them stage by
// stage, waiting for each stage's components before the next stage is stopped. It
// returns the first component's error, if one failed.
func runComponents(ctx context.Context, log *slog.Logger, cs []*component) error {
	errc := make(chan error, len(cs))
	var cancel [stages]context.CancelFunc
	var ctxs [stages]context.Context
	var running [stages]sync.WaitGroup
	for s := range stages {
		// Each stage outlives ctx until it is stopped in turn.
		ctxs[s], cancel[s] = context.WithCancel(context.WithoutCancel(ctx))
		defer cancel[s]()
	}
	for _, c := range cs {
		running[c.stage].Go(func() {
			if err := c.run(ctxs[c.stage]); err != nil {
				errc <- fmt.Errorf("%s: %w", c.name, err)
			}
		})
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-errc:
		log.Error("stopping after error", "err", runErr)
	}
	for s := range stages {
		cancel[s]()
		running[s].Wait()
	}
	log.Info("stopped")
	return runErr
}

// notReady lists why components do not serve yet, in their order.
func notReady(cs []*component) []string {
	var out []string
	for _, c := range cs {
		if c.ready == nil {
			continue
		}
		if why := c.ready(); why != "" {
			out = append(out, c.name+": "+why)
		}
	}
	return out
}
