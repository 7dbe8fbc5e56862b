package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stopRecorder records the order components stop in.
type stopRecorder struct {
	mu      sync.Mutex
	stopped []string
}

func (r *stopRecorder) part(name string, s stage, started *sync.WaitGroup) *component {
	started.Add(1)
	return &component{name: name, stage: s, run: func(ctx context.Context) error {
		started.Done()
		<-ctx.Done()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.stopped = append(r.stopped, name)
		return nil
	}}
}

// Components stop stage by stage, intake first and sealing last, whatever order they
// are listed in, and each stage is waited for before the next one stops.
func TestRunComponentsStopsInStageOrder(t *testing.T) {
	var rec stopRecorder
	var started sync.WaitGroup
	cs := []*component{
		rec.part("sealing", stageSeal, &started),
		rec.part("ingest", stageIngest, &started),
		rec.part("http", stageIntake, &started),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runComponents(ctx, slog.New(slog.DiscardHandler), cs) }()
	started.Wait()
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, []string{"http", "ingest", "sealing"}, rec.stopped)
}

// A component that fails stops every other one, and runComponents returns its error
// with its name.
func TestRunComponentsStopsOnAFailure(t *testing.T) {
	var rec stopRecorder
	var started sync.WaitGroup
	failing := &component{name: "policy", stage: stageIngest, run: func(context.Context) error {
		started.Wait()
		return errors.New("cannot start the policy replica: boom")
	}}
	cs := []*component{rec.part("http", stageIntake, &started), failing, rec.part("sealing", stageSeal, &started)}
	err := runComponents(context.Background(), slog.New(slog.DiscardHandler), cs)
	require.EqualError(t, err, "policy: cannot start the policy replica: boom")
	assert.Equal(t, []string{"http", "sealing"}, rec.stopped)
}

// notReady names each component that does not serve yet, with its reason, in order.
func TestNotReady(t *testing.T) {
	why := "still loading"
	cs := []*component{
		{name: "ingest", ready: func() string { return "" }},
		{name: "policy", ready: func() string { return why }},
		{name: "sealing"},
		{name: "live", ready: func() string { return "catching up" }},
	}
	assert.Equal(t, []string{"policy: still loading", "live: catching up"}, notReady(cs))
	why = ""
	assert.Equal(t, []string{"live: catching up"}, notReady(cs))
}
