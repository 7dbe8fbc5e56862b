package querybench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
)

func TestCopyIDUnique(t *testing.T) {
	seen := map[string]bool{}
	var ids []string
	for range 200 {
		ids = append(ids, schema.NewID())
	}
	ids = append(ids, "not-a-uuid")
	for _, id := range ids {
		for c := range 60 {
			got := copyID(id, c)
			require.False(t, seen[got], "copy %d of %s repeats %s", c, id, got)
			seen[got] = true
			if c == 0 {
				assert.Equal(t, id, got)
			} else if id != "not-a-uuid" {
				assert.Len(t, got, 36)
				assert.Equal(t, id[8:], got[8:])
			}
		}
	}
}

func TestParseTitle(t *testing.T) {
	seq, ns, ok := parseTitle(titlePrefix + "17 1764600000123456789")
	require.True(t, ok)
	assert.Equal(t, 17, seq)
	assert.Equal(t, int64(1764600000123456789), ns)
	for _, bad := range []string{"", "Fix the retry tests", titlePrefix + "17", titlePrefix + "x 1", titlePrefix + "-1 5"} {
		_, _, ok := parseTitle(bad)
		assert.False(t, ok, bad)
	}
}

func TestTitleOf(t *testing.T) {
	data := []byte(`{"workStatusChanged":{"kind":"TASK","task":{"id":"bench-query-task-3","title":"` + titlePrefix + `3 1764600000123456789","status":"in_progress"}}}`)
	seq, ns, ok := titleOf(data)
	require.True(t, ok)
	assert.Equal(t, 3, seq)
	assert.Equal(t, int64(1764600000123456789), ns)
	for _, bad := range []string{`{}`, `{"task":{"title":"Fix it"}}`, `{"task":{"title":"` + titlePrefix + `3 17`} {
		_, _, ok := titleOf([]byte(bad))
		assert.False(t, ok, bad)
	}
}

func TestDistOf(t *testing.T) {
	var v []float64
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}
	d := distOf(v)
	assert.Equal(t, Dist{N: 100, P50: 50, P99: 99, Max: 100}, d)
	assert.Equal(t, float64(100), v[0], "the input is not sorted in place")
	assert.Equal(t, Dist{}, distOf(nil))
}

func TestParseTitleBytes(t *testing.T) {
	seq, ns, ok := parseTitle([]byte(titlePrefix + "17 1764600000123456789"))
	require.True(t, ok)
	assert.Equal(t, 17, seq)
	assert.Equal(t, int64(1764600000123456789), ns)
	for _, bad := range []string{titlePrefix + "17 ", titlePrefix + " 17 5", titlePrefix + "1 2 3", titlePrefix + "1 99999999999999999999", titlePrefix + "+1 5"} {
		_, _, ok := parseTitle([]byte(bad))
		assert.False(t, ok, bad)
		_, _, ok = parseTitle(bad)
		assert.False(t, ok, bad)
	}
	data := []byte(`{"task":{"title":"` + titlePrefix + `3 1764600000123456789"}}`)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _, _ = titleOf(data) }), "titleOf allocates nothing")
}
