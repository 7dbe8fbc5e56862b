package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPartitionBlocks(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	t.Run("a batch spanning 250 days", func(t *testing.T) {
		// Three rows a day, out of order, as a replayed backlog can be.
		var times []time.Time
		for round := range 3 {
			for d := range 250 {
				times = append(times, start.Add(time.Duration((d*7+round*3)%250)*24*time.Hour+time.Duration(round)*time.Hour))
			}
		}
		blocks := PartitionBlocks(len(times), func(i int) uint32 { return DayPartition(times[i]) }, MaxPartitionsPerBlock)
		require.GreaterOrEqual(t, len(blocks), 3)
		seen := map[int]bool{}
		owner := map[uint32]int{} // partition -> block
		for b, idx := range blocks {
			parts := map[uint32]bool{}
			for _, i := range idx {
				require.False(t, seen[i], "row %d is in two blocks", i)
				seen[i] = true
				p := DayPartition(times[i])
				parts[p] = true
				if o, ok := owner[p]; ok {
					assert.Equal(t, o, b, "partition %d is split over blocks", p)
				}
				owner[p] = b
			}
			assert.LessOrEqual(t, len(parts), MaxPartitionsPerBlock, "block %d", b)
		}
		assert.Len(t, seen, len(times), "every row is in a block")
		assert.Len(t, owner, 250)
	})
	t.Run("within the limit: one block, no split", func(t *testing.T) {
		assert.Nil(t, PartitionBlocks(5000, func(i int) uint32 { return DayPartition(start.Add(time.Duration(i%100) * 24 * time.Hour)) }, MaxPartitionsPerBlock))
		assert.Nil(t, PartitionBlocks(0, func(int) uint32 { return 0 }, MaxPartitionsPerBlock))
	})
	t.Run("just over the limit", func(t *testing.T) {
		blocks := PartitionBlocks(101, func(i int) uint32 { return uint32(i) }, MaxPartitionsPerBlock)
		require.Len(t, blocks, 2)
		assert.Len(t, blocks[0], 100)
		assert.Equal(t, []int{100}, blocks[1])
	})
}

func TestPartitionKeys(t *testing.T) {
	// DateTime('UTC') columns: the partition is the UTC day or month whatever the zone
	// of the time given.
	tz := time.FixedZone("UTC+5", 5*3600)
	at := time.Date(2026, 3, 1, 2, 0, 0, 0, tz) // 2026-02-28 21:00 UTC
	assert.Equal(t, uint32(20260228), DayPartition(at))
	assert.Equal(t, uint32(202602), MonthPartition(at))
	assert.Equal(t, uint32(19700101), DayPartition(time.Unix(0, 0)))
}
