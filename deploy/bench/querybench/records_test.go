package querybench

import (
	"bytes"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/cpustat"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []record{
		{kind: recMessage, sub: 0, val: 0, at: 1764600000123456789},
		{kind: recMessage, sub: maxSubscribers - 1, val: 1<<32 - 1, at: -1},
		{kind: recEnded, sub: 9999, val: endSlow, at: 5},
		{kind: recReady, sub: 10000, at: int64(3 * time.Second)},
	} {
		var b [recordSize]byte
		r.put(&b)
		got, err := decodeRecord(&b)
		require.NoError(t, err)
		assert.Equal(t, r, got)
	}
	var b [recordSize]byte
	record{kind: 9, sub: 1}.put(&b)
	_, err := decodeRecord(&b)
	assert.ErrorContains(t, err, "unknown kind 9")
}

// stream encodes records as the subscribers' process writes them.
func stream(recs ...record) *bytes.Buffer {
	var buf bytes.Buffer
	for _, r := range recs {
		var b [recordSize]byte
		r.put(&b)
		buf.Write(b[:])
	}
	return &buf
}

// times makes the pipeline's produce and hub times of n changes: change seq is
// produced at base+seq ms and reaches the hub 5 ms later; the last one never does.
func times(n int, base int64) (produced, reached []atomic.Int64) {
	produced, reached = make([]atomic.Int64, n+4), make([]atomic.Int64, n+4)
	for seq := range n {
		produced[seq].Store(base + int64(seq)*int64(time.Millisecond))
		if seq < n-1 {
			reached[seq].Store(base + int64(seq)*int64(time.Millisecond) + int64(5*time.Millisecond))
		}
	}
	return produced, reached
}

func TestTallyStats(t *testing.T) {
	const base = int64(1764600000000000000)
	produced, reached := times(3, base)
	at := func(seq int, after time.Duration) int64 {
		return base + int64(seq)*int64(time.Millisecond) + int64(after)
	}
	tl := newTally(5, 3, produced, reached)

	var ready []int
	recs := stream(
		record{kind: recReady, sub: 5, at: int64(2 * time.Second)},
		// 0 reads everything, one change twice (the first read counts).
		record{kind: recMessage, sub: 0, val: 0, at: at(0, 10*time.Millisecond)},
		record{kind: recMessage, sub: 0, val: 1, at: at(1, 20*time.Millisecond)},
		record{kind: recMessage, sub: 0, val: 1, at: at(1, 90*time.Millisecond)},
		record{kind: recMessage, sub: 0, val: 2, at: at(2, 30*time.Millisecond)},
		// 1 misses change 1.
		record{kind: recMessage, sub: 1, val: 0, at: at(0, 40*time.Millisecond)},
		record{kind: recMessage, sub: 1, val: 2, at: at(2, 50*time.Millisecond)},
		// 2 is dropped as slow after one change, 3 breaks after reading all of them.
		record{kind: recMessage, sub: 2, val: 0, at: at(0, 60*time.Millisecond)},
		record{kind: recEnded, sub: 2, val: endSlow},
		record{kind: recEnded, sub: 2, val: endBroken}, // the first end counts
		record{kind: recMessage, sub: 3, val: 0, at: at(0, 10*time.Millisecond)},
		record{kind: recMessage, sub: 3, val: 1, at: at(1, 10*time.Millisecond)},
		record{kind: recMessage, sub: 3, val: 2, at: at(2, 10*time.Millisecond)},
		record{kind: recEnded, sub: 3, val: 7}, // an unknown code is a broken connection
		// 4 reads a change of no run of this benchmark's (past the produced ones).
		record{kind: recMessage, sub: 4, val: 3, at: at(3, time.Millisecond)},
	)
	require.NoError(t, readRecords(recs, tl, func(n int, took time.Duration) {
		ready = append(ready, n)
		assert.Equal(t, 2*time.Second, took)
	}))
	assert.Equal(t, []int{5}, ready)
	// 0 and 3 read all, 2 ended; 1 and 4 still wait.
	assert.Equal(t, int64(3), tl.settled.Load())

	// Once the benchmark closes, ends are its own doing; one before counts, however
	// late its record comes.
	tl.closing.Store(base + int64(time.Second))
	require.NoError(t, readRecords(stream(record{kind: recEnded, sub: 4, val: endBroken, at: base + int64(time.Second)}), tl, nil))
	require.NoError(t, readRecords(stream(record{kind: recEnded, sub: 1, val: endBroken, at: base + int64(time.Second) - 1}), tl, nil))

	assert.Equal(t, int64(4), tl.settled.Load(), "1 ended too")

	var st LiveStats
	tl.stats(&st, 3)
	assert.Equal(t, 1, st.Slow)
	assert.Equal(t, 2, st.Broken, "1 and 3")
	assert.Equal(t, 3, st.Missing, "1, 2 and 4")
	assert.Equal(t, 4, st.Dropped, "every one but 0")
	// Produce → read of each first read: 10, 20, 30, 40, 50, 60, 10, 10, 10 ms.
	assert.Equal(t, Dist{N: 9, P50: 20, P99: 60, Max: 60}, st.Total)
	// Hub → read, 5 ms less, of the changes that reached the hub (not the last).
	assert.Equal(t, Dist{N: 6, P50: 5, P99: 55, Max: 55}, st.FanOut)

	// Fewer changes produced than asked: only those are missed.
	var fewer LiveStats
	tl.stats(&fewer, 1)
	assert.Equal(t, 1, fewer.Missing, "only 4 missed change 0")
}

func TestReadRecordsRefusesBrokenStreams(t *testing.T) {
	produced, reached := times(2, 0)
	tl := newTally(2, 2, produced, reached)
	partial := stream(record{kind: recMessage, sub: 0, val: 0})
	partial.Truncate(recordSize - 3)
	assert.ErrorContains(t, readRecords(partial, tl, nil), "cannot read the subscribers' records")
	assert.ErrorContains(t, readRecords(stream(record{kind: recMessage, sub: 2, val: 0}), tl, nil), "record of subscriber 2 of 2")
	assert.ErrorContains(t, readRecords(stream(record{kind: 0, sub: 0}), tl, nil), "unknown kind 0")
}

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and a parenthesis; utime 250 and stime 50 ticks.
	line := []byte("4242 (bandplane (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 12 0 99 1000 200 18446744073709551615\n")
	d, ok := cpustat.ParseProcStat(line)
	require.True(t, ok)
	assert.Equal(t, 3*time.Second, d)
	for _, bad := range []string{"", "4242 bandplane S 1", "4242 (bandplane) S 1 2 3", "4242 (b) S 1 4242 4242 0 -1 4194560 1234 0 0 0 x 50 0"} {
		_, ok := cpustat.ParseProcStat([]byte(bad))
		assert.False(t, ok, bad)
	}
	// This process's own line reads.
	_, ok = cpustat.ProcessCPU(os.Getpid())
	assert.True(t, ok)
}

func TestFileLimitError(t *testing.T) {
	assert.NoError(t, fileLimitError(10_064, 20_000, 20_000, "the subscribers' process"))
	err := fileLimitError(10_512, 1024, 4096, "the benchmark's process")
	assert.ErrorContains(t, err, "the benchmark's process needs about 10512 open files")
	assert.ErrorContains(t, err, "may open 1024 (RLIMIT_NOFILE; hard limit 4096)")
}
