package ingest

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/schema"
)

func TestTruncateUTF8(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"},  // é is 2 bytes: never half of it
		{"a€b", 3, "a"}, // € is 3 bytes
		{"a😀", 4, "a"},  // 😀 is 4 bytes
		{"a😀", 5, "a😀"},
		{"\xff\xfe\xfd\xfc\xfb", 3, "\xff\xfe\xfd"}, // not UTF-8: cut at the byte
		{"é", 0, ""},
	} {
		got := truncateUTF8(tc.in, tc.n)
		assert.Equal(t, tc.want, got, "%q to %d", tc.in, tc.n)
		assert.LessOrEqual(t, len(got), tc.n)
		if utf8.ValidString(tc.in) {
			assert.True(t, utf8.ValidString(got), "%q to %d", tc.in, tc.n)
		}
	}
	long := strings.Repeat("é", MaxReasonBytes)
	assert.Len(t, truncateUTF8(long, MaxReasonBytes), MaxReasonBytes)
	assert.Len(t, truncateUTF8("x"+long, MaxReasonBytes), MaxReasonBytes-1)
}

func TestClampTime(t *testing.T) {
	assert.Equal(t, schema.MinTime, clampTime(time.Time{}))
	assert.Equal(t, schema.MinTime, clampTime(time.Unix(-1, 0)))
	assert.Equal(t, time.Date(2105, 12, 31, 23, 59, 59, 0, time.UTC), clampTime(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)))
	in := time.Date(2026, 11, 2, 10, 0, 0, 0, time.FixedZone("x", 3600))
	assert.Equal(t, in.UTC(), clampTime(in))
	assert.Equal(t, time.UTC, clampTime(in).Location())
}
