package pricing

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
)

func day(s string) time.Time {
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		panic(err)
	}
	return t
}

// A model listed with several effective times is priced, at each instant, with the
// entry whose effective time is the latest at or before it; before the first one it is
// unpriced.
func TestEffectiveTimeSelection(t *testing.T) {
	c, err := Parse([]byte(`{"version":"v","currency":"USD","models":[
		{"model":"m","aliases":["m-2026"],"input_per_mtok":"2","output_per_mtok":"2","effective":"2026-03-01"},
		{"model":"m","aliases":["m-latest"],"input_per_mtok":"1","output_per_mtok":"1","effective":"2026-01-01"},
		{"model":"m","input_per_mtok":"3","output_per_mtok":"3","effective":"2026-06-01T12:00:00Z"},
		{"model":"other","input_per_mtok":"9","output_per_mtok":"9","effective":"2026-01-01"}]}`))
	require.NoError(t, err)
	u := schema.UsageData{InputTokens: 1_000_000}
	for _, tc := range []struct {
		at     time.Time
		want   int64
		priced bool
	}{
		{day("2025-12-31").Add(23*time.Hour + 59*time.Minute + 59*time.Second), 0, false}, // before the first entry
		{day("2026-01-01"), 1_000_000, true},                                              // at an effective time: that entry
		{day("2026-02-28"), 1_000_000, true},
		{day("2026-03-01").Add(-time.Nanosecond), 1_000_000, true},
		{day("2026-03-01"), 2_000_000, true},
		{day("2026-06-01").Add(12*time.Hour - time.Second), 2_000_000, true},
		{day("2026-06-01").Add(12 * time.Hour), 3_000_000, true},
		{day("2030-01-01"), 3_000_000, true}, // after the last: the last
	} {
		got, ok := c.CostAt("m", tc.at, u)
		assert.Equal(t, tc.priced, ok, "%s", tc.at)
		assert.Equal(t, tc.want, got, "%s", tc.at)
		// Aliases of any entry name the model, whatever the entry in effect.
		for _, alias := range []string{"m-2026", "M-LATEST"} {
			got, ok = c.CostAt(alias, tc.at, u)
			assert.Equal(t, tc.priced, ok, "%s %s", alias, tc.at)
			assert.Equal(t, tc.want, got, "%s %s", alias, tc.at)
		}
	}
	// Cost is CostAt now: the newest entry here.
	got, ok := c.Cost("m", u)
	require.True(t, ok)
	assert.Equal(t, int64(3_000_000), got)

	h := c.History("m-latest")
	require.Len(t, h, 3, "the history, whichever name asks")
	assert.True(t, h[0].Effective.Before(h[1].Effective) && h[1].Effective.Before(h[2].Effective), "oldest first")
	for _, p := range h {
		assert.Equal(t, []string{"m-2026", "m-latest"}, p.Aliases, "every entry carries every alias")
	}
	assert.Equal(t, []string{"m", "other"}, c.Models(), "a model is listed once")
	assert.Len(t, c.Prices(), 4)
	canon, ok := c.Canonical("M-2026")
	assert.True(t, ok)
	assert.Equal(t, "m", canon)
	_, ok = c.Canonical("nope")
	assert.False(t, ok)

	// A model whose only price takes effect later is unpriced now, not priced early.
	c, err = Parse([]byte(`{"version":"v","currency":"USD","models":[
		{"model":"soon","input_per_mtok":"1","output_per_mtok":"1","effective":"2100-01-01T00:00:00Z"}]}`))
	require.NoError(t, err)
	_, ok = c.Cost("soon", u)
	assert.False(t, ok, "no price is in effect yet")
	_, ok = c.Lookup("soon")
	assert.False(t, ok)
}

func TestNewRefusesInconsistentEntries(t *testing.T) {
	base := Price{Model: "m", Input: 1, Output: 1, Effective: day("2026-01-01")}
	with := func(f func(*Price)) Price { p := base; f(&p); return p }
	for _, tc := range []struct {
		name   string
		prices []Price
		want   string
	}{
		{"same effective twice", []Price{base, base}, `duplicate model "m" at effective 2026-01-01T00:00:00Z`},
		{"alias of another model", []Price{base, {Model: "n", Aliases: []string{"m"}, Input: 1, Output: 1, Effective: day("2026-01-01")}}, `duplicate model "m"`},
		{"model named like an alias", []Price{with(func(p *Price) { p.Aliases = []string{"x"} }), {Model: "x", Input: 1, Output: 1, Effective: day("2026-01-01")}}, `duplicate model "x" (an alias of "m")`},
		{"negative", []Price{with(func(p *Price) { p.Output = -1 })}, "output_per_mtok: -0.000000001 is outside [0, 1000000]"},
		{"above the cap", []Price{with(func(p *Price) { p.CacheRead = MaxPriceNanos + 1 })}, "cache_read_per_mtok: 1000000.000000001 is outside"},
		{"no effective", []Price{with(func(p *Price) { p.Effective = time.Time{} })}, "effective: missing"},
		{"blank model", []Price{with(func(p *Price) { p.Model = " m" })}, "model: empty or with spaces around it"},
		{"empty alias", []Price{with(func(p *Price) { p.Aliases = []string{" "} })}, "aliases: empty alias"},
	} {
		_, err := New("1", "USD", tc.prices)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err := New("", "", nil)
	assert.ErrorContains(t, err, "version: missing")
	assert.ErrorContains(t, err, "currency: missing")
	assert.ErrorContains(t, err, "models: empty")

	c, err := New("7", "EUR", []Price{base, with(func(p *Price) { p.Effective = day("2026-02-01"); p.Input = 5 })})
	require.NoError(t, err)
	assert.Equal(t, "7", c.Version())
	assert.Equal(t, "EUR", c.Currency())
	p, ok := c.PriceAt("m", day("2026-02-02"))
	require.True(t, ok)
	assert.Equal(t, int64(5), p.Input)
}

func TestParsePrice(t *testing.T) {
	for s, want := range map[string]int64{
		"0": 0, "3": 3_000_000_000, "3.00": 3_000_000_000, "0.075": 75_000_000, "0.000000001": 1,
		"1000000": MaxPriceNanos, "1e6": MaxPriceNanos, "2.5E-1": 250_000_000, " 1.5 ": 1_500_000_000,
		"1.2000000000000": 1_200_000_000, // more decimals, all zeros: exact
	} {
		got, err := ParsePrice(s)
		if assert.NoError(t, err, "%q", s) {
			assert.Equal(t, want, got, "%q", s)
		}
	}
	long := strings.Repeat("9", 100)
	for s, want := range map[string]string{
		"":                        "is not a decimal",
		"-1":                      `"-1" is negative`,
		"-0.5":                    "is negative",
		"1.2.3":                   "is not a decimal",
		"NaN":                     "is not a decimal",
		"Infinity":                "is not a decimal",
		"0x10":                    "is not a decimal",
		"1_000":                   "is not a decimal",
		"1,5":                     "is not a decimal",
		"+1":                      "is not a decimal",
		".5":                      "is not a decimal",
		"１":                       "is not a decimal", // a full-width digit
		"1e1000":                  "is not a decimal", // an exponent of four digits
		"1e-2147483648":           "is not a decimal", // would make the rounding check compute 10^2147483648
		"0.0000000001":            "has more than 9 decimal places",
		"1e-10":                   "has more than 9 decimal places",
		"1000000.000000001":       "is above the cap of 1000000",
		"1e7":                     "is above the cap",
		long:                      "is longer than 64 characters",
		"3\x00":                   "is not a decimal",
		"99999999999999999999999": "is above the cap",
	} {
		_, err := ParsePrice(s)
		assert.ErrorContains(t, err, want, "%q", s)
	}
	assert.Equal(t, "3", FormatPrice(3_000_000_000))
	assert.Equal(t, "0.075", FormatPrice(75_000_000))
	assert.Equal(t, "0", FormatPrice(0))
}

// Live hands out whole catalogs: a reader sees the old one or the new one, never nil.
func TestLiveSwap(t *testing.T) {
	a, b := Default(), mustParse(t, `{"version":"2","currency":"USD","models":[{"model":"m","input_per_mtok":"1","output_per_mtok":"1","effective":"2026-01-01"}]}`)
	l := NewLive(a)
	var src Source = l
	assert.Same(t, a, src.Current())
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			c := src.Current()
			if c != a && c != b {
				t.Error("Current is neither catalog")
				return
			}
		}
	})
	for i := 0; i < 1000; i++ {
		if i%2 == 0 {
			l.Set(b)
		} else {
			l.Set(a)
		}
	}
	l.Set(nil) // ignored
	close(stop)
	wg.Wait()
	assert.Same(t, a, l.Current())
	assert.Panics(t, func() { NewLive(nil) })
}

func mustParse(t *testing.T, s string) *Catalog {
	t.Helper()
	c, err := Parse([]byte(s))
	require.NoError(t, err)
	return c
}
