package dual_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
)

func TestParseTSV(t *testing.T) {
	r, err := dual.ParseTSV([]byte("a\tb\nString\tNullable(UInt8)\nx\\ty\\\\z\\n\t\\N\n\t1\n"))
	require.NoError(t, err)
	assert.Equal(t, []dual.Column{{Name: "a", Type: "String"}, {Name: "b", Type: "Nullable(UInt8)"}}, r.Columns)
	assert.Equal(t, [][]string{{"x\ty\\z\n", `\N`}, {"", "1"}}, r.Rows)

	r, err = dual.ParseTSV([]byte("n\nUInt64\n"))
	require.NoError(t, err)
	assert.Empty(t, r.Rows, "no rows")

	_, err = dual.ParseTSV([]byte("a\tb\nString\n"))
	assert.ErrorContains(t, err, "2 names but 1 types")
	_, err = dual.ParseTSV([]byte("a\nString\nx\ty\n"))
	assert.ErrorContains(t, err, "row 1 has 2 values, want 1")
	_, err = dual.ParseTSV([]byte("Code: 62. Syntax error"))
	assert.ErrorContains(t, err, "not TabSeparatedWithNamesAndTypes")
}

func TestEscapeTSVRoundTrips(t *testing.T) {
	for _, s := range []string{"", "plain", "tab\there", "nl\nand\\back", "cr\r", "nul\x00", "quote'", "ü"} {
		r, err := dual.ParseTSV([]byte("v\nString\n" + dual.EscapeTSV(s) + "\n"))
		require.NoError(t, err)
		assert.Equal(t, s, r.Rows[0][0], "%q", s)
	}
}

// The documented normalisations, each on the text both generations write.
func TestNormalize(t *testing.T) {
	res := func(typ string, vals ...string) *dual.Result {
		r := &dual.Result{Columns: []dual.Column{{Name: "c", Type: typ}}}
		for _, v := range vals {
			r.Rows = append(r.Rows, []string{v})
		}
		return r
	}
	// Decimal text: 18.16 keeps the scale's zeros, 26.9 drops them.
	assert.True(t, dual.Equal("SELECT c", res("Decimal(18, 6)", "1.500000", "2.000000", "-0.010000", "10.000000"),
		res("Decimal(18, 6)", "1.5", "2", "-0.01", "10")))
	assert.True(t, dual.Equal("SELECT c", res("Array(Decimal(38, 6))", "[1.500000,3.000000]"), res("Array(Decimal(38, 6))", "[1.5,3]")))
	assert.True(t, dual.Equal("SELECT c", res("Nullable(Decimal(18, 6))", `\N`), res("Nullable(Decimal(18, 6))", `\N`)))
	// Only in Decimal columns: a string that looks like one is data.
	assert.False(t, dual.Equal("SELECT c", res("String", "1.500000"), res("String", "1.5")))
	assert.False(t, dual.Equal("SELECT c", res("Decimal(18, 6)", "1.500001"), res("Decimal(18, 6)", "1.5")))
	// The zero DateTime and Date.
	assert.True(t, dual.Equal("SELECT c", res("DateTime('UTC')", "0000-00-00 00:00:00"), res("DateTime('UTC')", "1970-01-01 00:00:00")))
	assert.True(t, dual.Equal("SELECT c", res("Date", "0000-00-00"), res("Date", "1970-01-01")))
	assert.False(t, dual.Equal("SELECT c", res("DateTime", "2026-01-01 00:00:00"), res("DateTime", "1970-01-01 00:00:00")))
	// Rows are a multiset; the types must agree; volatile statements compare columns only.
	assert.True(t, dual.Equal("SELECT c", res("UInt8", "1", "2"), res("UInt8", "2", "1")))
	assert.False(t, dual.Equal("SELECT c", res("UInt8", "1", "1"), res("UInt8", "1")))
	assert.False(t, dual.Equal("SELECT c", res("UInt8", "1"), res("UInt16", "1")))
	assert.True(t, dual.Equal("SELECT now() - max(t)", res("Int32", "1"), res("Int32", "2")))
	assert.Contains(t, dual.Diff("SELECT c", res("UInt8", "1"), res("UInt8", "2")), "only in the first (1): 1")
}
