package store

import (
	"slices"
	"time"
)

// MaxPartitionsPerBlock is the most partitions one INSERT block may touch: the default
// of max_partitions_per_insert_block on ClickHouse ≥ 19.x, which refuses a bigger block
// whole (18.16 has no such limit). Every insert here is split to stay within it.
const MaxPartitionsPerBlock = 100

// DayPartition is the partition of a row of events or usage (PARTITION BY
// toYYYYMMDD(time), the column being DateTime('UTC')).
func DayPartition(t time.Time) uint32 {
	y, m, d := t.UTC().Date()
	return uint32(y*10000 + int(m)*100 + d)
}

// MonthPartition is the partition of a row of usage_hourly or dead_letters
// (PARTITION BY toYYYYMM).
func MonthPartition(t time.Time) uint32 {
	y, m, _ := t.UTC().Date()
	return uint32(y*100 + int(m))
}

// PartitionBlocks splits rows 0…n-1 into blocks that touch at most limit distinct
// partitions each (key gives a row's partition), in partition order, so that no INSERT
// block exceeds max_partitions_per_insert_block. It returns nil when all rows fit in
// one block, the common case, without allocating more than a small set.
func PartitionBlocks(n int, key func(i int) uint32, limit int) [][]int {
	if limit < 1 {
		limit = 1
	}
	seen := make(map[uint32]struct{}, 4)
	var last uint32
	split := false
	for i := range n {
		k := key(i)
		if i > 0 && k == last {
			continue // rows arrive mostly in time order: skip the map for runs
		}
		last = k
		seen[k] = struct{}{}
		if len(seen) > limit {
			split = true
			break
		}
	}
	if !split {
		return nil
	}
	byKey := map[uint32][]int{}
	for i := range n {
		k := key(i)
		byKey[k] = append(byKey[k], i)
	}
	keys := make([]uint32, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out [][]int
	for start := 0; start < len(keys); start += limit {
		var block []int
		for _, k := range keys[start:min(start+limit, len(keys))] {
			block = append(block, byKey[k]...)
		}
		out = append(out, block)
	}
	return out
}

// byDay writes rows with write, once per block of at most MaxPartitionsPerBlock of
// their days (day gives a row's time), for the tables appended column by column.
func byDay[T any](rows []T, day func(*T) time.Time, write func([]T) error) error {
	if len(rows) == 0 {
		return nil
	}
	blocks := PartitionBlocks(len(rows), func(i int) uint32 { return DayPartition(day(&rows[i])) }, MaxPartitionsPerBlock)
	if blocks == nil {
		return write(rows)
	}
	for _, idx := range blocks {
		if err := write(pick(rows, idx)); err != nil {
			return err
		}
	}
	return nil
}

// pick returns the rows at idx, in that order.
func pick[T any](rows []T, idx []int) []T {
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = rows[j]
	}
	return out
}
