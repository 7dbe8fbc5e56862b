package store

import (
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
)

// The day is built from the hours this process has just written, not from a read that
// a lagging replica answered (an hour missing there, or an older version of it), unless
// the read holds a newer rebuild of that hour.
func TestWithWrittenTakesTheHoursJustWritten(t *testing.T) {
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	row := func(hour time.Time, model string, events uint64) rollupRow {
		return rollupRow{key: rollupKey{hour: hour, model: model}, events: events, cost: decimal.NewFromInt(int64(events))}
	}
	models := func(rows []rollupRow) map[string]uint64 {
		out := map[string]uint64{}
		for _, r := range rows {
			out[r.key.hour.Format("15")+" "+r.key.model] += r.events
		}
		return out
	}
	written := &writtenHours{version: 100, hours: map[time.Time]bool{h(1): true, h(2): true, h(25): true},
		rows: []rollupRow{row(h(1), "m3", 1), row(h(1), "unknown", 0), row(h(2), "new", 2), row(h(25), "tomorrow", 9)}}

	// Hour 1 read back at an older version (the reprice not yet replicated), hour 2
	// missing from the replica, hour 3 not rebuilt here.
	read := []rollupRow{row(h(1), "unknown", 1), row(h(3), "other", 3)}
	got := withWritten(day, read, map[time.Time]uint64{h(1): 90, h(3): 50}, written)
	assert.Equal(t, map[string]uint64{"01 m3": 1, "01 unknown": 0, "02 new": 2, "03 other": 3}, models(got),
		"the hours written replace the hours read; another day's hour is left out")

	// Another process rebuilt hour 1 since (a newer version read): its rows stand.
	read = []rollupRow{row(h(1), "later", 4)}
	got = withWritten(day, read, map[time.Time]uint64{h(1): 101}, written)
	assert.Equal(t, map[string]uint64{"01 later": 4, "02 new": 2}, models(got))

	// Without hours written (RefreshDays, StaleDays' catch-up) the read is the day.
	read = []rollupRow{row(h(1), "unknown", 1)}
	assert.Equal(t, read, withWritten(day, read, map[time.Time]uint64{h(1): 90}, nil))
}
