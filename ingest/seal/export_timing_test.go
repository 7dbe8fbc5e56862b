package seal

import (
	"bytes"
	"context"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

// Run with: BANDPLANE_INTEGRATION=1 go test -run '^$' -bench Export -benchtime 1x ./ingest/seal/

// peakHeap samples the heap in use until stop is called, and returns the highest.
func peakHeap() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// One organization's third of the 100k-event trail (~250 bytes of data each), sealed,
// exported as NDJSON: events/s and the heap the export needs (it does not grow with
// the rows), then the file verified offline.
func BenchmarkExport100k(b *testing.B) {
	stacktest.Require(b)
	key := testKey(b)
	conn, db := benchTrail(b)
	_, err := newSealer(b, conn, db, key, &fakeProducer{}).SealNow(context.Background())
	require.NoError(b, err)
	x := newTestExporter(b, conn, db, key, 0, 0)
	now := time.Now().UTC()
	sel := Selection{Org: orgs3[0], From: now.Add(-25 * time.Hour).Truncate(time.Second), To: now}
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		stop := peakHeap()
		start := time.Now()
		e, err := x.Prepare(context.Background(), ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
		require.NoError(b, err)
		st, err := e.Stream(context.Background(), io.Discard, nil)
		require.NoError(b, err)
		took := time.Since(start)
		peak := stop()
		b.StopTimer()
		var buf bytes.Buffer // the same export again, kept to verify it
		e, err = x.Prepare(context.Background(), ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
		require.NoError(b, err)
		_, err = e.Stream(context.Background(), &buf, nil)
		require.NoError(b, err)
		b.StartTimer()
		b.ReportMetric(float64(st.Total)/took.Seconds(), "events/s")
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(st.Bytes)/(1<<20), "file-MiB")
		start = time.Now()
		rep, err := VerifyExport(context.Background(), bytes.NewReader(buf.Bytes()), int64(buf.Len()), pubOf(key), ExportVerifyOptions{})
		require.NoError(b, err)
		require.True(b, rep.OK(), "%+v", rep.Problems)
		b.ReportMetric(float64(rep.Events)/time.Since(start).Seconds(), "verified-events/s")
	}
}
