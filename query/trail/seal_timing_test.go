package trail

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

// Run with: BANDPLANE_INTEGRATION=1 go test -run '^$' -bench . -benchtime 1x ./query/trail/

const benchRows = 100_000

// benchTrail is a database of 100k events of three organizations over the last day,
// ~250 bytes of data each, ingested a minute ago and noted.
func benchTrail(b *testing.B) *trail {
	b.Helper()
	tr := newTrail(b)
	now := time.Now().UTC()
	pad := strings.Repeat("x", 200)
	for off := 0; off < benchRows; off += 20_000 {
		rs := rows(fmt.Sprintf("bench%d", off), 20_000, orgs3, now.Add(-24*time.Hour).Add(time.Duration(off)*time.Second/2), now.Add(-time.Minute))
		for i := range rs {
			rs[i].Data = fmt.Sprintf(`{"content":"message %d %s"}`, i, pad)
		}
		tr.store(rs)
	}
	return tr
}

func BenchmarkSeal100k(b *testing.B) {
	stacktest.Require(b)
	for range b.N {
		b.StopTimer()
		tr := benchTrail(b)
		b.StartTimer()
		res := tr.seal()
		require.Equal(b, benchRows, res.Leaves)
		b.ReportMetric(float64(benchRows)/b.Elapsed().Seconds(), "events/s")
	}
}

// The steady state of serve: a run over a sealed 100k-row trail that finds 1,000 new rows.
func BenchmarkSealIncremental(b *testing.B) {
	stacktest.Require(b)
	tr := benchTrail(b)
	tr.seal()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		tr.store(rows(fmt.Sprintf("inc%d", i), 1000, orgs3, time.Now().UTC().Add(-time.Hour), time.Now().UTC().Add(-2*time.Second)))
		b.StartTimer()
		res := tr.seal()
		require.Equal(b, 1000, res.Leaves)
	}
}

func BenchmarkVerify100k(b *testing.B) {
	stacktest.Require(b)
	tr := benchTrail(b)
	tr.seal()
	b.ResetTimer()
	for range b.N {
		rep := tr.verify(Filter{})
		require.Empty(b, rep.Problems)
		require.Equal(b, benchRows, rep.SealedEvents)
	}
	b.ReportMetric(float64(benchRows*b.N)/b.Elapsed().Seconds(), "events/s")
}
