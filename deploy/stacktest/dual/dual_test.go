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
	assert.Equal(t, [][]string{{"x\ty\\z\n", dual.Null}, {"", "1"}}, r.Rows)
	r, err = dual.ParseTSV([]byte("s\nString\n\\\\N\n"))
	require.NoError(t, err)
	assert.Equal(t, `\N`, r.Rows[0][0], "the string \\N is not NULL")

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
	// Decimal text is compared as written: the 26.9 engine keeps the scale's zeros.
	assert.False(t, dual.Equal("SELECT c", res("Decimal(18, 6)", "1.500000"), res("Decimal(18, 6)", "1.5")))
	assert.True(t, dual.Equal("SELECT c", res("Decimal(18, 6)", "1.500000"), res("Decimal(18, 6)", "1.500000")))
	// The zero DateTime and Date, in date columns (also nested) only.
	assert.True(t, dual.Equal("SELECT c", res("DateTime('UTC')", "0000-00-00 00:00:00"), res("DateTime('UTC')", "1970-01-01 00:00:00")))
	assert.True(t, dual.Equal("SELECT c", res("Date", "0000-00-00"), res("Date", "1970-01-01")))
	assert.True(t, dual.Equal("SELECT c", res("Nullable(DateTime)", "0000-00-00 00:00:00"), res("Nullable(DateTime)", "1970-01-01 00:00:00")))
	assert.True(t, dual.Equal("SELECT c", res("Array(Date)", "['0000-00-00']"), res("Array(Date)", "['1970-01-01']")))
	assert.False(t, dual.Equal("SELECT c", res("String", "0000-00-00 00:00:00"), res("String", "1970-01-01 00:00:00")),
		"toString of a zero DateTime differs between the versions: data, not normalised")
	assert.False(t, dual.Equal("SELECT c", res("Tuple(String, DateTime)", "('0000-00-00','0000-00-00 00:00:00')"),
		res("Tuple(String, DateTime)", "('1970-01-01','1970-01-01 00:00:00')")), "a tuple with a string is left alone")
	assert.False(t, dual.Equal("SELECT c", res("DateTime", "2026-01-01 00:00:00"), res("DateTime", "1970-01-01 00:00:00")))
	// NULL is not the string \N.
	assert.False(t, dual.Equal("SELECT c", res("Nullable(String)", dual.Null), res("Nullable(String)", `\N`)))
	// Rows are a multiset; the types must agree; volatile statements compare columns only.
	assert.True(t, dual.Equal("SELECT c", res("UInt8", "1", "2"), res("UInt8", "2", "1")))
	assert.False(t, dual.Equal("SELECT c", res("UInt8", "1", "1"), res("UInt8", "1")))
	assert.False(t, dual.Equal("SELECT c", res("UInt8", "1"), res("UInt16", "1")))
	assert.True(t, dual.Equal("SELECT now() - max(t)", res("Int32", "1"), res("Int32", "2")))
	assert.False(t, dual.Equal("SELECT c FROM t WHERE id = 'now() or today()'", res("Int32", "1"), res("Int32", "2")),
		"a bound value that reads now() does not make the statement volatile")
	assert.True(t, dual.Equal(`SELECT now() FROM t WHERE id = 'it\'s'`, res("DateTime", "1"), res("DateTime", "2")))
	assert.Contains(t, dual.Diff("SELECT c", res("UInt8", "1"), res("UInt8", "2")), "only in the first (1): 1")
}
