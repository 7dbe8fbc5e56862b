package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"
)

var rollupDay0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func rollupHour(n int) time.Time { return rollupDay0.Add(time.Duration(n) * time.Hour) }

func hourRow(hour time.Time, model string, events, version uint64) rollupRow {
	return rollupRow{key: rollupKey{hour: hour, model: model}, events: events, in: 10 * events,
		cost: decimal.NewFromInt(int64(events)), currency: "USD", version: version}
}

// The day is built from the hours this process has just written, not from a read that
// a lagging replica answered (an hour missing there, or an older version of it), unless
// the read holds a newer rebuild of that hour.
func TestWithWrittenTakesTheHoursJustWritten(t *testing.T) {
	h := rollupHour
	models := func(rows []rollupRow) map[string]string {
		out := map[string]string{}
		for _, r := range rows {
			out[r.key.hour.Format("15")+" "+r.key.model] = fmt.Sprintf("%d@%d", r.events, r.version)
		}
		return out
	}
	written := &writtenHours{version: 100, hours: map[time.Time]bool{h(1): true, h(2): true, h(25): true},
		rows: []rollupRow{hourRow(h(1), "m3", 1, 0), hourRow(h(1), "unknown", 0, 0), hourRow(h(2), "new", 2, 0), hourRow(h(25), "tomorrow", 9, 0)}}

	// Hour 1 read back at an older version (the reprice not yet replicated), hour 2
	// missing from the replica, hour 3 not rebuilt here.
	read := []rollupRow{hourRow(h(1), "unknown", 1, 90), hourRow(h(3), "other", 3, 50)}
	got := withWritten(rollupDay0, read, written)
	assert.Equal(t, map[string]string{"01 m3": "1@100", "01 unknown": "0@100", "02 new": "2@100", "03 other": "3@50"}, models(got),
		"the hours written replace the hours read, at the version written; another day's hour is left out")

	// Another process rebuilt hour 1 since (a newer version read): its rows stand.
	read = []rollupRow{hourRow(h(1), "later", 4, 101)}
	got = withWritten(rollupDay0, read, written)
	assert.Equal(t, map[string]string{"01 later": "4@101", "02 new": "2@100"}, models(got))

	// Without hours written (RefreshDays, StaleDays' catch-up) the read is the day.
	read = []rollupRow{hourRow(h(1), "unknown", 1, 90)}
	assert.Equal(t, read, withWritten(rollupDay0, read, nil))
}

// rows renders an insert into usage_rollup as grain, bucket, model, events and version.
func rows(rs []rollupRow) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s %s %s %d@%d", r.grain, r.key.hour.Format("02T15"), r.key.model, r.events, r.version))
	}
	return out
}

// A day's insert: the hours summed per group at the day's version, zeros for groups the
// day lost, and only the hours usage_rollup has not seen, whole, with zeros for the
// groups they lost.
func TestRollupDayWritesTheDayAndTheHoursItHasNotSeen(t *testing.T) {
	h := rollupHour
	hours := []rollupRow{
		hourRow(h(1), "m1", 2, 50), hourRow(h(1), "m2", 0, 40), // hour 1: held at 50 already
		hourRow(h(2), "m1", 3, 70), hourRow(h(2), "m3", 1, 70), // hour 2: rebuilt since the copy (60)
		hourRow(h(3), "m1", 1, 80), // hour 3: never copied
	}
	held := held{
		day:   map[rollupKey]bool{{hour: rollupDay0, model: "m1"}: true, {hour: rollupDay0, model: "gone"}: true},
		hours: map[rollupKey]bool{{hour: h(1), model: "m1"}: true, {hour: h(2), model: "m1"}: true, {hour: h(2), model: "gone"}: true},
		hour:  map[time.Time]uint64{h(1): 50, h(2): 60},
	}
	got := rollupDay(rollupDay0, 99, hours, held)
	assert.Equal(t, []string{
		"day 01T00 m1 6@99", "day 01T00 m2 0@99", "day 01T00 m3 1@99", "day 01T00 gone 0@99",
		"hour 01T02 m1 3@70", "hour 01T02 m3 1@70", "hour 01T03 m1 1@80", "hour 01T02 gone 0@70",
	}, rows(got))
	for _, r := range got {
		if r.grain == grainDay && r.key.model == "m1" {
			assert.Equal(t, uint64(60), r.in, "the day sums every column")
			assert.Equal(t, "6", r.cost.String())
			assert.Equal(t, "USD", r.currency)
		}
		if r.events == 0 {
			assert.Empty(t, r.currency, "a zeroed group's row says nothing of the currency")
		}
	}

	// Nothing rebuilt since the last insert: the day again, no hour.
	held.hour[h(2)], held.hour[h(3)] = 70, 80
	assert.Equal(t, []string{"day 01T00 m1 6@100", "day 01T00 m2 0@100", "day 01T00 m3 1@100", "day 01T00 gone 0@100"},
		rows(rollupDay(rollupDay0, 100, hours, held)))

	// A day whose hours are gone altogether (every group zeroed): zeros only.
	assert.Equal(t, []string{"day 01T00 gone 0@101", "day 01T00 m1 0@101"},
		rows(rollupDay(rollupDay0, 101, nil, held)))
}
