package dashboards

import (
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	t0 = time.Date(2014, 11, 12, 11, 45, 26, 371e6, time.UTC)
	t1 = time.Date(2015, 11, 12, 11, 45, 26, 371e6, time.UTC)
)

func one(name, v string) Variable { return Variable{Name: name, Values: []string{v}} }

func allOf(name string, options ...string) Variable {
	return Variable{Name: name, All: true, Values: []string{AllValue}, Options: options}
}

// The backend macros, as pkg/macros of the plugin (v4) writes them.
func TestBackendMacros(t *testing.T) {
	r := Request{From: t0, To: t1, Interval: 20 * time.Second}
	for in, want := range map[string]string{
		"WHERE $__timeFilter(time)":                     "WHERE time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)",
		"WHERE $__timeFilter( time )":                   "WHERE time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)",
		"bar > $__fromTime":                             "bar > toDateTime(1415792726)",
		"bar < ($__toTime)":                             "bar < (toDateTime(1447328726))",
		"intDiv(x, $__interval_s)":                      "intDiv(x, 20)",
		"$__timeFilter_ms(t)":                           "t >= fromUnixTimestamp64Milli(1415792726371) AND t <= fromUnixTimestamp64Milli(1447328726371)",
		"$__dateFilter(d)":                              "d >= toDate('2014-11-12') AND d <= toDate('2015-11-12')",
		"$__timeInterval(c)":                            "toStartOfInterval(toDateTime(c), INTERVAL 20 second)",
		"$__fromTime AND $__fromTime":                   "toDateTime(1415792726) AND toDateTime(1415792726)",
		"toStartOfHour($__fromTime) AND h <= $__toTime": "toStartOfHour(toDateTime(1415792726)) AND h <= toDateTime(1447328726)",
		"SELECT '$__unknown'":                           "SELECT '$__unknown'",
		"$__timeFrom(t)":                                "t >= '2014-11-12T11:45:26Z'",
	} {
		got, err := r.Backend(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	r.Interval = 0
	got, err := r.Backend("$__interval_s")
	require.NoError(t, err)
	assert.Equal(t, "1", got, "an interval below a second is 1 (math.Max(seconds, 1))")
}

// A macro without arguments followed by "(" before ")" takes everything up to the
// matching ")" as its arguments: the trap the dashboards' ($__toTime) form avoids.
func TestBackendMacroSwallowsTheNextParentheses(t *testing.T) {
	r := Request{From: t0, To: t1}
	got, err := r.Backend("h <= $__toTime AND f(x)")
	require.NoError(t, err)
	assert.Equal(t, "h <= toDateTime(1447328726)", got, "the plugin replaces `$__toTime AND f(x)` whole")

	_, err = r.Backend("h <= $__toTime AND $__timeFilter(t)")
	assert.ErrorContains(t, err, "depends on the order", "the result would depend on the plugin's map order")

	_, err = r.Backend("$__timeFilter(a, b)")
	assert.ErrorContains(t, err, "expected 1 argument, received 2")
}

// $__conditionalAll, as CHDatasource.applyConditionalAll.
func TestConditionalAll(t *testing.T) {
	cond := "$__conditionalAll(org_id = decodeURLComponent('${org:percentencode}'), $org)"
	for _, tc := range []struct {
		name string
		v    Variable
		want string
	}{
		{"all", allOf("org", "a", "b"), "1=1"},
		{"empty", one("org", ""), "1=1"},
		{"one", one("org", "a'b"), "org_id = decodeURLComponent('a%27b')"},
		{"several", Variable{Name: "org", Values: []string{"a", "b"}, Multi: true}, "org_id = decodeURLComponent('%7Ba%2Cb%7D')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Request{Vars: []Variable{tc.v}}.Frontend("WHERE " + cond + " AND " + cond)
			require.NoError(t, err)
			assert.Equal(t, "WHERE "+tc.want+" AND "+tc.want, got)
		})
	}

	r := Request{Vars: []Variable{allOf("a"), one("b", "x")}}
	got, err := r.Frontend("$__conditionalAll(f(a, b) = 1, ${a}) AND $__conditionalAll(x IN (1, 2), $b)")
	require.NoError(t, err)
	assert.Equal(t, "1=1 AND x IN (1, 2)", got, "commas and parentheses nested in the condition; ${var} form")

	got, err = Request{Vars: []Variable{one("a", "x")}}.Frontend("$__conditionalAll(a = 1, 2, $a)")
	require.NoError(t, err)
	assert.Equal(t, "$__conditionalAll(a = 1, 2, x)", got, "three arguments: the plugin leaves the macro alone (the variable is still replaced)")

	got, err = Request{}.Frontend("$__conditionalAll(a = 1, $nosuch)")
	require.NoError(t, err)
	assert.Equal(t, "a = 1", got, "an unknown variable keeps the condition")
}

// The phrase goes back with String.prototype.replace: $& $' $` $$ mean something there.
func TestJSReplaceFirst(t *testing.T) {
	assert.Equal(t, "x[ab]y ab", jsReplaceFirst("xaby ab", "ab", "[$&]"))
	assert.Equal(t, "x[y]y", jsReplaceFirst("xaby", "ab", "[$']"))
	assert.Equal(t, "x[x]y", jsReplaceFirst("xaby", "ab", "[$`]"))
	assert.Equal(t, "x$y", jsReplaceFirst("xaby", "ab", "$$"))
	assert.Equal(t, "x${v}$1y", jsReplaceFirst("xaby", "ab", "${v}$1"))
	assert.Equal(t, "no match", jsReplaceFirst("no match", "zz", "$&"))
}

// Formats, against grafana/scenes' formatRegistry.test.ts where it has examples.
func TestFormats(t *testing.T) {
	multi := func(vals ...string) Variable { return Variable{Name: "v", Values: vals, Multi: true} }
	for _, tc := range []struct {
		v    Variable
		sql  string
		want string
	}{
		{multi("foo()bar BAZ", "test2"), "${v:percentencode}", "%7Bfoo%28%29bar%20BAZ%2Ctest2%7D"},
		{multi("test", "test'2"), "${v:singlequote}", `'test','test\'2'`},
		{one("v", "test'value"), "${v:sqlstring}", `'test''value'`},
		{one("v", `test"value`), "${v:sqlstring}", `'test\"value'`},
		{multi("test", `test"2`), "${v:doublequote}", `"test","test\"2"`},
		{multi("a", "b"), "${v:csv}", "a,b"},
		{multi("a", "b"), "${v:raw}", "a,b"},
		{multi("a", "b"), "${v:pipe}", "a|b"},
		{multi("a", "b"), "$v", "'a','b'"},
		{multi("a", "b"), "${v}", "'a','b'"},
		{one("v", "a'b"), "$v", "a'b"},
		{one("v", "x"), "[[v]]", "x"},
		{Variable{Name: "v", Values: []string{"a"}, Texts: []string{"A"}}, "${v:text}", "A"},
		{allOf("v", "a", "b"), "${v:text}", "All"},
		{allOf("v", "a", "b"), "${v:percentencode}", "%7Ba%2Cb%7D"},
		{allOf("v", "a", "b"), "$v", "'a','b'"},
		{Variable{Name: "v", All: true, AllValueCustom: ".*"}, "${v:percentencode}", ".%2A"},
		{Variable{Name: "v", All: true, AllValueCustom: ".*"}, "${v:singlequote}", ".*"},
		{one("v", "é€ !'()*~-_."), "${v:percentencode}", "%C3%A9%E2%82%AC%20%21%27%28%29%2A~-_."},
		{one("v", "x"), "$vv ${w} $__fromTime", "$vv ${w} $__fromTime"},
	} {
		got, err := Request{Vars: []Variable{tc.v}}.Frontend(tc.sql)
		require.NoError(t, err, tc.sql)
		assert.Equal(t, tc.want, got, "%s with %+v", tc.sql, tc.v)
	}
	_, err := Request{Vars: []Variable{one("v", "\xff")}}.Frontend("${v:percentencode}")
	assert.ErrorContains(t, err, "not valid UTF-8")
	_, err = Request{Vars: []Variable{one("v", "x")}}.Frontend("${v:lucene}")
	assert.ErrorContains(t, err, "not modelled")
}

// queryparam differs between Grafana releases; in older scenes releases a ' comes
// through unescaped, which is why no dashboard puts it in SQL.
func TestQueryParamStyles(t *testing.T) {
	v := []Variable{one("org", "a'b c,$&=")}
	for style, want := range map[QueryParamStyle]string{
		QueryParamLegacy:     "var-org=a%27b%20c%2C%24%26%3D",
		QueryParamURLSync:    "var-org=a%27b%20c,$%26%3D",
		QueryParamURLSyncOld: "var-org=a'b%20c,$%26%3D",
	} {
		got, err := Request{Vars: v, QueryParam: style}.Frontend("${org:queryparam}")
		require.NoError(t, err)
		assert.Equal(t, want, got, "style %d", style)
	}
	got, err := Request{Vars: []Variable{allOf("org", "a")}}.Frontend("${org:queryparam}")
	require.NoError(t, err)
	assert.Equal(t, "var-org=$__all", got)
	got, err = Request{Vars: []Variable{allOf("org", "a")}, QueryParam: QueryParamLegacy}.Frontend("${org:queryparam}")
	require.NoError(t, err)
	assert.Equal(t, "var-org=All", got)
	got, err = Request{Vars: []Variable{{Name: "org", Values: []string{"a", "b"}, Multi: true}}}.Frontend("${org:queryparam}")
	require.NoError(t, err)
	assert.Equal(t, "var-org=a&var-org=b", got)
}

// Why the dashboards do not quote with singlequote: an id ending in a backslash ends
// the literal early, and the rest of the value becomes SQL.
func TestSingleQuoteDoesNotProtectABackslash(t *testing.T) {
	got, err := Request{Vars: []Variable{one("org", `x\' OR 1=1 --`)}}.Frontend("org_id IN (${org:singlequote})")
	require.NoError(t, err)
	assert.Equal(t, `org_id IN ('x\\' OR 1=1 --')`, got, "ClickHouse reads 'x\\\\' as the literal x\\, then OR 1=1")

	got, err = Request{Vars: []Variable{one("org", `x\' OR 1=1 --`)}}.Frontend(is("org_id", "org"))
	require.NoError(t, err)
	assert.Equal(t, "org_id = decodeURLComponent('x%5C%27%20OR%201%3D1%20--')", got)
}

func TestExpandRunsBothSteps(t *testing.T) {
	r := Request{From: t0, To: t1, Interval: time.Hour, Vars: []Variable{one("org", "o")}}
	got, err := r.Expand("SELECT " + bucket("t") + " AS b FROM x WHERE " + is("org_id", "org") + " AND " + timeFilter("t") + " AND h <= " + toTime)
	require.NoError(t, err)
	want := "SELECT toDateTime(intDiv(toUInt32(t), (3600)) * (3600), 'UTC') AS b FROM x WHERE org_id = decodeURLComponent('o')" +
		" AND t >= toDateTime(1415792726) AND t <= toDateTime(1447328726) AND h <= (toDateTime(1447328726))"
	assert.Equal(t, want, got)
	assert.False(t, strings.Contains(got, "$"))
}

// VariableSQL reads a variable's stored query as the strictest plugin releases do: the
// object's rawSql, never a plain string.
func TestVariableSQL(t *testing.T) {
	q := variableQuery("SELECT 1")
	got, ok := VariableSQL(&q)
	assert.True(t, ok)
	assert.Equal(t, "SELECT 1", got)
	s := "SELECT 1"
	for _, bad := range []*dashboard.StringOrMap{
		nil,
		{String: &s}, // CHVariableSupport.query reading target.rawSql gives nothing for it
		{Map: map[string]any{"refId": "var"}},
		{Map: map[string]any{"editorType": "builder", "rawSql": "SELECT 1"}},
		{Map: map[string]any{"rawSql": ""}},
	} {
		_, ok := VariableSQL(bad)
		assert.False(t, ok, "%+v", bad)
	}
	_, ok = VariableSQL(&dashboard.StringOrMap{Map: map[string]any{"rawSql": "SELECT 1"}})
	assert.True(t, ok, "no editorType: metricFindQuery runs it as SQL")
}
