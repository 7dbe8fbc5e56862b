package querybench

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childArg makes this test binary the subscribers' process, as bandplane's hidden
// command makes bandplane: startSubscribers runs a command, and this one is at hand.
const childArg = "querybench-test-subscribers"

func init() {
	if len(os.Args) < 2 || os.Args[1] != childArg {
		return
	}
	if err := RunSubscribers(context.Background(), os.Stdin, os.Stdout, os.Stderr); err != nil {
		_, _ = os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestSubscriberProcess runs the benchmark's side against a process of subscribers
// (this test binary) and the fake server: the records come into the tally, and stop
// ends the process cleanly.
func TestSubscriberProcess(t *testing.T) {
	const n = 6
	fake := &fakeGraphQL{t: t, subbed: make(chan struct{}, n)}
	srv := httptest.NewServer(fake)
	defer srv.Close()

	var mu sync.Mutex
	var progress []string
	cfg := &Config{SubscriberCommand: []string{os.Args[0], childArg}, Progress: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		progress = append(progress, format)
	}}
	const base = int64(1764600000000000000)
	produced, reached := times(2, base)
	tl := newTally(n, 2, produced, reached)
	spec := SubscriberSpec{URL: "ws" + strings.TrimPrefix(srv.URL, "http"), Token: "tok", Org: "org-a", Subscribers: n, Dials: 2, Buffer: 4}
	child, err := startSubscribers(context.Background(), cfg, spec, tl)
	require.NoError(t, err)
	defer child.kill()
	require.NoError(t, child.waitReady(context.Background(), time.Hour))
	for range n {
		<-fake.subbed
	}
	fake.mu.Lock()
	conns := fake.conns
	fake.mu.Unlock()
	for _, c := range conns {
		for _, title := range []string{"0 1764600000000000000", "1 1764600000001000000"} {
			fake.send(c, `{"id":"1","type":"next","payload":{"data":{"workStatusChanged":{"task":{"title":"`+titlePrefix+title+`"}}}}}`)
		}
	}
	for tl.settled.Load() < n && !child.exited() {
		time.Sleep(time.Millisecond) // waits for the records; the test's deadline bounds it
	}
	tl.closing.Store(time.Now().UnixNano())
	require.NoError(t, child.stop())
	assert.True(t, child.cmd.ProcessState.Success())

	var st LiveStats
	tl.stats(&st, 2)
	assert.Zero(t, st.Dropped)
	assert.Equal(t, 2*n, st.Total.N)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, progress, "live: subscriber process: %s")
}

// TestSubscriberProcessFails: a process that ends before it is ready says why.
func TestSubscriberProcessFails(t *testing.T) {
	cfg := &Config{SubscriberCommand: []string{os.Args[0], childArg}, Progress: func(string, ...any) {}}
	produced, reached := times(1, 0)
	spec := SubscriberSpec{URL: "ws://127.0.0.1:1/graphql", Token: "tok", Org: "org-a", Subscribers: 1, Dials: 1, Buffer: 1}
	child, err := startSubscribers(context.Background(), cfg, spec, newTally(1, 1, produced, reached))
	require.NoError(t, err)
	defer child.kill()
	err = child.waitReady(context.Background(), time.Hour)
	assert.ErrorContains(t, err, "the subscribers' process ended before its subscribers were ready (exit status 1)")
	assert.ErrorContains(t, err, "subscriber 0: cannot open a WebSocket to ws://127.0.0.1:1/graphql")
}
