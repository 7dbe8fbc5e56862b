package store

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNewestKeepsTheHighestVersionOfEachRow(t *testing.T) {
	rows := []CauseRow{
		{EventID: "a", Version: 1, Type: "old"},
		{EventID: "b", Version: 5},
		{EventID: "a", Version: 3, Type: "new"},
		{EventID: "a", Version: 2, Type: "older"},
		{EventID: "a", OrgID: "other", Version: 1},
	}
	got := newest(rows, func(r *CauseRow) (rowKey, uint64) { return rowKey{r.OrgID, r.Time.Unix(), r.EventID}, r.Version })
	assert.Equal(t, []CauseRow{{EventID: "a", Version: 3, Type: "new"}, {EventID: "b", Version: 5}, {EventID: "a", OrgID: "other", Version: 1}}, got)
	assert.Empty(t, newest([]CauseRow{}, func(r *CauseRow) (rowKey, uint64) { return rowKey{}, 0 }))
}
