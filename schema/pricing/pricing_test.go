package pricing

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bandplane/bandplane/schema"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func i64(v int64) *int64 { return &v }

func TestDefaultCatalog(t *testing.T) {
	c := Default()
	assert.Equal(t, "2026-11-01", c.Version())
	assert.Equal(t, "USD", c.Currency())
	for _, m := range []string{
		"claude-opus-4-5", "claude-sonnet-4-5", "claude-haiku-4-5",
		"gpt-5", "gpt-5-mini", "gpt-5.4-mini", "gpt-4.1", "gpt-4o", "o3", "o4-mini",
		"gemini-2.5-pro", "gemini-2.5-flash",
	} {
		_, ok := c.Lookup(m)
		assert.True(t, ok, m)
	}
	assert.IsNonDecreasing(t, c.Models())
}

func TestCostExact(t *testing.T) {
	c := Default()
	cases := []struct {
		name  string
		model string
		u     schema.UsageData
		want  int64
	}{
		// 1000×3 + 500×15 + 2000×0.30 + 100×3.75 = 3000 + 7500 + 600 + 375
		{"sonnet all kinds", "claude-sonnet-4-5", schema.UsageData{InputTokens: 1000, OutputTokens: 500, CacheReadTokens: 2000, CacheWriteTokens: 100}, 11475},
		// dated alias resolves to the same prices
		{"alias", "claude-sonnet-4-5-20250929", schema.UsageData{InputTokens: 1000, OutputTokens: 500, CacheReadTokens: 2000, CacheWriteTokens: 100}, 11475},
		{"case-insensitive", "Claude-Sonnet-4-5", schema.UsageData{InputTokens: 1}, 3},
		// 12345×0.75 + 678×4.5 + 10000×0.075 = 9258.75 + 3051 + 750 = 13059.75 → 13060
		{"gpt-5.4-mini", "gpt-5.4-mini", schema.UsageData{InputTokens: 12345, OutputTokens: 678, CacheReadTokens: 10000}, 13060},
		// 0.05 × 9 = 0.45 → 0; 0.05 × 10 = 0.5 → 1 (half up)
		{"round down", "gpt-5-nano", schema.UsageData{InputTokens: 9}, 0},
		{"round half up", "gpt-5-nano", schema.UsageData{InputTokens: 10}, 1},
		// rounded once per event: 6×0.05 + 40×0.005 = 0.3 + 0.2 = 0.5 → 1
		// (per-kind rounding would give 0 + 0)
		{"round once", "gpt-5-nano", schema.UsageData{InputTokens: 6, CacheReadTokens: 40}, 1},
		// reasoning tokens are inside output tokens: not billed again. 100 × 75 = 7500
		{"reasoning not rebilled", "claude-opus-4-1", schema.UsageData{OutputTokens: 100, ReasoningTokens: i64(80)}, 7500},
		// 1 200 000 × 1.25 + 340 000 × 10 = 1 500 000 + 3 400 000
		{"gemini pro", "gemini-2.5-pro", schema.UsageData{InputTokens: 1_200_000, OutputTokens: 340_000}, 4_900_000},
		// large but representable: 10^12 output tokens × 75 = 7.5e13 micros
		{"large", "claude-opus-4-1", schema.UsageData{OutputTokens: 1_000_000_000_000}, 75_000_000_000_000},
		{"zero usage", "gpt-4o", schema.UsageData{}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := c.Cost(tc.model, tc.u)
			require.True(t, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCostUnpriced(t *testing.T) {
	c := Default()
	for _, tc := range []struct {
		model string
		u     schema.UsageData
	}{
		{"", schema.UsageData{InputTokens: 100}},
		{"no-such-model", schema.UsageData{InputTokens: 100}},
		{"gpt-4o", schema.UsageData{InputTokens: -1}},
		{"claude-opus-4-1", schema.UsageData{OutputTokens: math.MaxInt64}}, // overflows
	} {
		got, ok := c.Cost(tc.model, tc.u)
		assert.False(t, ok, tc.model)
		assert.Zero(t, got, tc.model)
	}
}

func TestReasoningBilledSeparately(t *testing.T) {
	c, err := Parse([]byte(`{"version":"v1","currency":"EUR","models":[
		{"model":"r1","input_per_mtok":1,"output_per_mtok":"2","reasoning_per_mtok":"2.5","effective":"2026-01-01"}]}`))
	require.NoError(t, err)
	assert.Equal(t, "EUR", c.Currency())
	// 10×1 + 10×2 + 4×2.5 = 40; cache kinds fall back to the input price: + 5×1
	got, ok := c.Cost("r1", schema.UsageData{InputTokens: 10, OutputTokens: 10, CacheReadTokens: 5, ReasoningTokens: i64(4)})
	require.True(t, ok)
	assert.Equal(t, int64(45), got)
}

func TestParseErrors(t *testing.T) {
	_, err := Parse([]byte(`{"currency":"USD","models":[
		{"model":"a","input_per_mtok":"-1","output_per_mtok":"1","effective":"2026-01-01"},
		{"model":"b","input_per_mtok":"1.2.3","output_per_mtok":"1","effective":"2026-01-01"},
		{"model":"c","input_per_mtok":"1","output_per_mtok":"1","effective":"01/02/2026"},
		{"model":"d","input_per_mtok":"1","output_per_mtok":"1","effective":"2026-01-01"},
		{"model":"d","input_per_mtok":"1","output_per_mtok":"1","effective":"2026-01-01"},
		{"model":"e","input_per_mtok":"1","effective":"2026-01-01"},
		{"model":"f","input_per_mtok":"0.0000000001","output_per_mtok":"1","effective":"2026-01-01"},
		{"model":"g","input_per_mtok":"1","output_per_mtok":"1","cache_read_per_mtok":"x","effective":"2026-01-01", "aliases":["a"]}
	]}`))
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{
		"version: missing",
		`model "a": input_per_mtok: "-1" is negative`,
		`model "b": input_per_mtok: "1.2.3" is not a decimal`,
		`model "c": effective: "01/02/2026" is not a YYYY-MM-DD date`,
		`model "d": duplicate model "d"`,
		`model "e": output_per_mtok: missing`,
		`model "f": input_per_mtok: "0.0000000001" has more than 9 decimal places`,
		`model "g": cache_read_per_mtok: "x" is not a decimal`,
		`model "g": duplicate model "a"`,
	} {
		assert.Contains(t, msg, want)
	}

	_, err = Parse([]byte(`not json`))
	assert.ErrorContains(t, err, "invalid catalog JSON")
	_, err = Parse([]byte(`{"version":"1","currency":"USD","models":[]}`))
	assert.ErrorContains(t, err, "models: empty")
}

func TestPriceCap(t *testing.T) {
	model := func(field, price string) string {
		prices := map[string]string{"input_per_mtok": "1", "output_per_mtok": "1"}
		prices[field] = price
		var b strings.Builder
		b.WriteString(`{"version":"v","currency":"USD","models":[{"model":"m","effective":"2026-01-01"`)
		for k, v := range prices {
			b.WriteString(`,"` + k + `":` + v)
		}
		b.WriteString(`}]}`)
		return b.String()
	}
	for _, field := range []string{"input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok", "reasoning_per_mtok"} {
		for _, ok := range []string{`"1000000"`, `"1000000.000000000"`, `1000000`, `"999999.999999999"`, `1e6`} {
			_, err := Parse([]byte(model(field, ok)))
			assert.NoError(t, err, "%s %s", field, ok)
		}
		for _, bad := range []string{`"1000000.000000001"`, `"1000001"`, `1e7`, `"99999999999999999999999"`} {
			_, err := Parse([]byte(model(field, bad)))
			s := strings.Trim(bad, `"`) // the text as the error quotes it
			assert.EqualError(t, err, fmt.Sprintf(`model "m": %s: %q is above the cap of 1000000 per million tokens`, field, s), "%s %s", field, bad)
		}
	}
}

// TestCostAtTheCaps: the dearest report the limits allow (every count at
// schema.MaxTokens, every price at MaxPricePerMillion, reasoning billed apart) is priced
// exactly, with no overflow path, and fits a usage row's Decimal(18,6).
func TestCostAtTheCaps(t *testing.T) {
	const max = `"1000000"`
	c, err := Parse([]byte(`{"version":"v","currency":"USD","models":[
		{"model":"dear","input_per_mtok":` + max + `,"output_per_mtok":` + max + `,"cache_read_per_mtok":` + max + `,"cache_write_per_mtok":` + max + `,"reasoning_per_mtok":` + max + `,"effective":"2026-01-01"},
		{"model":"dear-no-reasoning","input_per_mtok":` + max + `,"output_per_mtok":` + max + `,"cache_read_per_mtok":` + max + `,"cache_write_per_mtok":` + max + `,"effective":"2026-01-01"}]}`))
	require.NoError(t, err)
	n := int64(schema.MaxTokens)
	u := schema.UsageData{InputTokens: n, OutputTokens: n, CacheReadTokens: n, CacheWriteTokens: n, ReasoningTokens: &n}

	got, ok := c.Cost("dear", u)
	require.True(t, ok, "priced")
	// 5 kinds × 10^9 tokens × 10^6 units / 10^6 tokens = 5·10^9 units = 5·10^15 micro-units.
	assert.Equal(t, int64(5_000_000_000_000_000), got)
	const decimal18x6 = 1_000_000_000_000_000_000 // Decimal(18,6) holds less than 10^12 units: 10^18 micro-units
	assert.Less(t, got, int64(decimal18x6))

	got, ok = c.Cost("dear-no-reasoning", u)
	require.True(t, ok, "priced")
	assert.Equal(t, int64(4_000_000_000_000_000), got, "reasoning inside output: not billed again")

	// One token at the cap price is exactly one currency unit: 10^6 micro-units.
	got, ok = c.Cost("dear", schema.UsageData{OutputTokens: 1})
	require.True(t, ok)
	assert.Equal(t, int64(1_000_000), got)
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.json")
	require.NoError(t, os.WriteFile(p, []byte(`{"version":"x","currency":"USD","models":[{"model":"m","input_per_mtok":"1","output_per_mtok":"2","effective":"2026-01-01"}]}`), 0o644))
	c, err := Load(p)
	require.NoError(t, err)
	assert.Equal(t, "x", c.Version())
	assert.Equal(t, []string{"m"}, c.Models())

	_, err = Load(filepath.Join(dir, "missing.json"))
	assert.Error(t, err)
}
