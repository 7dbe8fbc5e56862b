package schema

import "time"

// Limits every event is held to, wherever it is decoded (collector, consumer, policy
// replica, `bandplane normalize`). They are part of the contract (ingest/README.md, "Limits").
const (
	// MaxDepth is the deepest nesting of objects and arrays a line may have: the
	// envelope is level 1, its data level 2. It is checked by a byte scan before any
	// decoder runs, so no input can make a decoder recurse deeper.
	MaxDepth = 64

	// MaxIDBytes bounds every id: id, org_id, room_id, actor.id, subject.id,
	// execution_id, and the ids inside data (owner_id, task_id, request_id, ...).
	MaxIDBytes = 256
	// MaxHandleBytes bounds a handle (`owner/agent-slug`).
	MaxHandleBytes = 128
	// MaxMentions bounds the mentions of one message: the platform tags a few
	// participants, and every mention is state that ingest keeps for an hour.
	MaxMentions = 256
	// MaxTypeBytes bounds the type; MaxSourceBytes the source.
	MaxTypeBytes   = 64
	MaxSourceBytes = 64

	// MaxTokens bounds each token count of a usage report (input, output, cache read,
	// cache write, reasoning): 10^9, some 500 times the largest context window of any
	// model. The cap is what keeps every sum exact (ingest/README.md, "Limits"): an hourly rollup
	// group would need 1.8·10^10 reports in one hour to overflow its UInt64 token sums,
	// and with prices capped at pricing.MaxPricePerMillion one report costs at most
	// 5·10^9 units (all five kinds at the cap, reasoning billed apart), far inside
	// Decimal(18,6), while the rollup sums cost in Decimal(38,6).
	MaxTokens = 1_000_000_000
)

// The times ClickHouse's DateTime can hold (UInt32 seconds since 1970; 18.16 wraps
// outside it). Validate refuses an event time outside [MinTime, MaxTime]; the collector
// narrows that to its accepted window (--max-event-age, --max-clock-skew).
var (
	MinTime = time.Unix(0, 0).UTC()
	MaxTime = time.Date(2105, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
)
