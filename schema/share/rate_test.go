package share_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/schema/share"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestRateRefusesAGroupPastItsShareOnly(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	r := share.NewRate(4<<20, 16<<20, c.now) // 4 MiB/s, 16 MiB at once
	assert.Zero(t, r.Wait("org-h"), "a group never charged may start")

	r.Charge("org-h", 14<<20)
	assert.Zero(t, r.Wait("org-h"), "2 MiB left")
	r.Charge("org-h", 14<<20) // 12 MiB past
	assert.Equal(t, 3*time.Second+time.Millisecond, r.Wait("org-h"), "12 MiB at 4 MiB/s")
	assert.Zero(t, r.Wait("org-a"), "another group is not held up")

	c.t = c.t.Add(3 * time.Second)
	assert.Equal(t, time.Millisecond, r.Wait("org-h"), "just empty")
	c.t = c.t.Add(10 * time.Millisecond)
	assert.Zero(t, r.Wait("org-h"))

	c.t = c.t.Add(time.Hour)
	r.Charge("org-h", 20<<20) // the bucket holds at most the burst, however long it waited
	assert.Equal(t, time.Second+time.Millisecond, r.Wait("org-h"))

	r.Charge("org-h", -5<<20) // nothing to refund
	r.Charge("org-h", 0)
	assert.Equal(t, time.Second+time.Millisecond, r.Wait("org-h"))
}

func TestRateForgetsFullBucketsOnly(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	r := share.NewRate(1<<20, 1<<20, c.now)
	r.Charge("heavy", 10<<20)
	for i := range 5000 { // more groups than a Rate keeps: the full ones go
		r.Charge(fmt.Sprintf("g%d", i), 1)
		c.t = c.t.Add(time.Millisecond)
	}
	assert.Positive(t, r.Wait("heavy"), "a group in debt is not forgotten")
}
