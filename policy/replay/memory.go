package replay

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/bandplane/bandplane/schema"
)

// Memory is a Source of records held in memory, for the benchmark and the tests: the
// records of every partition, in any order.
type Memory struct {
	Trail []Record
}

func (m *Memory) Partitions(_ context.Context, org string) ([]int, error) {
	var out []int
	for _, r := range m.Trail {
		if org == "" || r.Event.OrgID == org {
			out = append(out, r.Partition)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (m *Memory) recordsOf(partition int, org string) []Record {
	var out []Record
	for _, r := range m.Trail {
		if r.Partition == partition && slices.Contains(recordTypes, r.Event.Type) && (org == "" || r.Event.OrgID == org) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Offset, b.Offset) })
	return out
}

func (m *Memory) Records(_ context.Context, partition int, org string) (Cursor, error) {
	return &sliceCursor{list: m.recordsOf(partition, org)}, nil
}

func (m *Memory) Decisions(_ context.Context, from, to time.Time, org string) (Cursor, error) {
	var list []timedRecord
	for _, r := range m.Trail {
		if r.Event.Type != schema.TypePolicyDecided || r.Event.Time.Before(from) || !r.Event.Time.Before(to) || (org != "" && r.Event.OrgID != org) {
			continue
		}
		list = append(list, timedRecord{r, decidedAt(&r)})
	}
	slices.SortStableFunc(list, func(a, b timedRecord) int {
		if c := a.r.Event.Time.Compare(b.r.Event.Time); c != 0 {
			return c
		}
		return a.at.Compare(b.at)
	})
	out := make([]Record, len(list))
	for i, t := range list {
		out[i] = t.r
	}
	return &sliceCursor{list: out}, nil
}

type sliceCursor struct {
	list []Record
	i    int
}

func (c *sliceCursor) Next() (Record, bool, error) {
	if c.i >= len(c.list) {
		return Record{}, false, nil
	}
	c.i++
	return c.list[c.i-1], true, nil
}

func (c *sliceCursor) Close() error { return nil }
