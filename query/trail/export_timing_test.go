package trail

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

// Run with: BANDPLANE_INTEGRATION=1 go test -run '^$' -bench Export100k -benchtime 1x ./query/trail/

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

const exportBenchRows = 100_000

// exportBenchTrail is a sealed trail of 100k events of three organizations over the
// last day, ~250 bytes of data each, ingested a minute ago.
func exportBenchTrail(b *testing.B) (*trail, time.Time) {
	b.Helper()
	tr := newTrail(b)
	now := time.Now().UTC()
	pad := strings.Repeat("x", 200)
	for off := 0; off < exportBenchRows; off += 20_000 {
		rs := rows(fmt.Sprintf("bench%d", off), 20_000, orgs3, now.Add(-24*time.Hour).Add(time.Duration(off)*time.Second/2), now.Add(-time.Minute))
		for i := range rs {
			rs[i].Data = fmt.Sprintf(`{"content":"message %d %s"}`, i, pad)
		}
		tr.store(rs)
	}
	tr.seal()
	return tr, now
}

// One organization's third of the 100k-event trail, exported as NDJSON: events/s
// (the scan of its log, the reads and the proofs) and the heap it needs, the file's
// size and the proofs' bytes per event, then the file verified offline.
func BenchmarkExport100k(b *testing.B) {
	stacktest.Require(b)
	tr, now := exportBenchTrail(b)
	x := tr.exporter()
	sel := Selection{Org: orgs3[0], From: now.Add(-25 * time.Hour).Truncate(time.Second), To: now}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		stop := peakHeap()
		start := time.Now()
		e, err := x.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
		require.NoError(b, err)
		prepared := time.Since(start)
		st, err := e.Stream(ctx, io.Discard, nil)
		require.NoError(b, err)
		took := time.Since(start)
		peak := stop()
		b.StopTimer()
		var buf bytes.Buffer // the same export again, kept to verify it
		e, err = x.Prepare(ctx, ExportRequest{Selection: sel, Encoding: EncodingNDJSON})
		require.NoError(b, err)
		_, err = e.Stream(ctx, &buf, nil)
		require.NoError(b, err)
		var proofChars, proofs int
		for _, l := range lines(buf.Bytes()) {
			if i := bytes.Index(l, []byte(`,"proof":"`)); i >= 0 && bytes.HasPrefix(l, []byte(`{"kind":"event"`)) {
				p := l[i+len(`,"proof":"`):]
				proofChars += bytes.IndexByte(p, '"')
				proofs++
			}
		}
		b.StartTimer()
		b.ReportMetric(float64(st.Total)/took.Seconds(), "events/s")
		b.ReportMetric(prepared.Seconds()*1000, "prepare-ms")
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(st.Bytes)/(1<<20), "file-MiB")
		b.ReportMetric(float64(base64.StdEncoding.DecodedLen(proofChars))/float64(proofs), "proof-bytes/event")
		b.ReportMetric(float64(proofChars)/float64(proofs), "proof-chars/event")
		runtime.GC()
		stop = peakHeap()
		start = time.Now()
		rep, err := VerifyExport(ctx, bytes.NewReader(buf.Bytes()), int64(buf.Len()), ExportVerifyOptions{Anchors: tr.anchors()})
		took = time.Since(start)
		peak = stop()
		require.NoError(b, err)
		require.True(b, rep.OK(), "%+v", rep.Problems)
		b.ReportMetric(float64(rep.Events)/took.Seconds(), "verified-events/s")
		b.ReportMetric(float64(peak)/(1<<20), "verify-peak-heap-MiB")
	}
}

// The offline verifier alone, on an export built in memory (no database): 33,000
// events of ~250 bytes of data, as one organization's third of the 100k trail.
func BenchmarkVerifyExport33k(b *testing.B) {
	f := newExportFixture(b, 0)
	f.sel.Types = []string{}
	pad := strings.Repeat("x", 200)
	for i := range 33_000 {
		f.rows = append(f.rows, exportRow(fmt.Sprintf("bench-%05d", i), "message.created", exportBase.Add(time.Duration(i)*100*time.Millisecond),
			fmt.Sprintf(`{"content":"message %d %s"}`, i, pad)))
	}
	buf := f.build(b, EncodingNDJSON)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		rep, err := VerifyExport(context.Background(), bytes.NewReader(buf), int64(len(buf)), f.opts(0))
		require.NoError(b, err)
		require.True(b, rep.OK(), "%+v", rep.Problems)
		b.ReportMetric(float64(rep.Events)/time.Since(start).Seconds(), "verified-events/s")
	}
}
