package pricing

import (
	"testing"

	"github.com/bandplane/bandplane/schema"
)

func BenchmarkCost(b *testing.B) {
	c := Default()
	u := schema.UsageData{InputTokens: 12345, OutputTokens: 678, CacheReadTokens: 10000, CacheWriteTokens: 512}
	var sink int64
	b.ReportAllocs()
	for b.Loop() {
		m, _ := c.Cost("claude-sonnet-4-5-20250929", u)
		sink += m
	}
	_ = sink
}

func BenchmarkCostUnknownModel(b *testing.B) {
	c := Default()
	u := schema.UsageData{InputTokens: 12345}
	b.ReportAllocs()
	for b.Loop() {
		c.Cost("Some-Unknown-Model", u)
	}
}
