package simulate

import (
	"context"
	"testing"

	"github.com/bandplane/bandplane/schema/pricing"
)

// BenchmarkRun measures the generator with what Run adds (decoding every line, the
// summary), into a sink that drops the lines: the ceiling of every benchmark that loads
// simulated traffic.
func BenchmarkRun(b *testing.B) {
	cfg := testConfig(50_000)
	drop := SinkFunc(func(context.Context, [][]byte) error { return nil })
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Run(context.Background(), cfg, drop, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*float64(cfg.Events)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkNext measures the generator alone.
func BenchmarkNext(b *testing.B) {
	cfg := testConfig(0)
	g := newGenerator(cfg, pricing.Default(), cfg.Start)
	b.ReportAllocs()
	for b.Loop() {
		g.next()
	}
}
