package pricing

import (
	"strings"
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

// BenchmarkParsePriceRefused is the cost of refusing hostile prices: each is refused at
// once, whatever it says (1e-2147483648 would make a naive rounding check compute
// 10^2147483648).
func BenchmarkParsePriceRefused(b *testing.B) {
	for name, s := range map[string]string{"exponent": "1e1000", "negative-exponent": "1e-2147483648",
		"above-cap": "99999999999999999999999", "too-long": strings.Repeat("9", 100)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParsePrice(s); err == nil {
					b.Fatal("accepted")
				}
			}
		})
	}
}
