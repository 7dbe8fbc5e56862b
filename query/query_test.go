package query

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/google/go-cmp/cmp"
)

var (
	t0 = time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	t1 = time.Date(2025, 3, 2, 10, 0, 0, 0, time.UTC)
)

func TestCostsSQL(t *testing.T) {
	const aggs = "currency, sum(events) AS total_events, sum(unpriced_events) AS total_unpriced," +
		" sum(input_tokens) AS total_input, sum(output_tokens) AS total_output," +
		" sum(cache_read_tokens) AS total_cache_read, sum(cache_write_tokens) AS total_cache_write," +
		" sum(reasoning_tokens) AS total_reasoning," +
		" sum(unpriced_input_tokens) AS total_u_input, sum(unpriced_output_tokens) AS total_u_output," +
		" sum(unpriced_cache_read_tokens) AS total_u_cache_read, sum(unpriced_cache_write_tokens) AS total_u_cache_write," +
		" sum(unpriced_reasoning_tokens) AS total_u_reasoning, sum(cost) AS total_cost"
	const group = "owner_id, agent_id, room_id, model"
	const cols = group + ", currency, events, unpriced_events, input_tokens, output_tokens," +
		" cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens, unpriced_output_tokens," +
		" unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost"
	// Each group's newest row, without FINAL.
	latest := func(cond string) string {
		return " FROM (SELECT bucket AS hour, " + cols + " FROM db1.usage_rollup WHERE " + cond +
			" ORDER BY version DESC LIMIT 1 BY grain, bucket, " + group + ") AS rollup"
	}
	from := latest("org_id = ? AND grain = 'hour' AND bucket >= ? AND bucket < ?")
	f := func(name string, q CostQuery, wantSQL string, wantArgs []any) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			if err := q.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			sql, args := costsSQL{db: "db1", q: q}.toSQL()
			if diff := cmp.Diff(wantSQL, sql); diff != "" {
				t.Errorf("sql (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantArgs, args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
	f("no grouping", CostQuery{OrgID: "o1", From: t0, To: t1},
		"SELECT "+aggs+from+" GROUP BY currency HAVING total_events > 0 ORDER BY total_cost DESC, currency LIMIT 1001",
		[]any{"o1", t0, t1})
	f("agent and model", CostQuery{OrgID: "o1", From: t0, To: t1, GroupBy: []string{"agent", "model"}, Limit: 5},
		"SELECT agent_id, model, "+aggs+from+" GROUP BY agent_id, model, currency HAVING total_events > 0"+
			" ORDER BY total_cost DESC, agent_id, model, currency LIMIT 6",
		[]any{"o1", t0, t1})
	f("day first in order", CostQuery{OrgID: "o1", From: t0, To: t1, GroupBy: []string{"owner", "day"}},
		"SELECT owner_id, toStartOfDay(hour), "+aggs+from+" GROUP BY owner_id, toStartOfDay(hour), currency HAVING total_events > 0"+
			" ORDER BY toStartOfDay(hour), total_cost DESC, owner_id, currency LIMIT 1001",
		[]any{"o1", t0, t1})
	f("range widened to whole hours", CostQuery{OrgID: "o1", From: t0.Add(59 * time.Minute), To: t1.Add(time.Second), GroupBy: []string{"hour", "room"}},
		"SELECT hour, room_id, "+aggs+from+" GROUP BY hour, room_id, currency HAVING total_events > 0"+
			" ORDER BY hour, total_cost DESC, room_id, currency LIMIT 1001",
		[]any{"o1", t0, t1.Add(time.Hour)})
	f("non-UTC input", CostQuery{OrgID: "o1", From: t0.In(time.FixedZone("X", 3600)), To: t1.In(time.FixedZone("X", 3600))},
		"SELECT "+aggs+from+" GROUP BY currency HAVING total_events > 0 ORDER BY total_cost DESC, currency LIMIT 1001",
		[]any{"o1", t0, t1})
	f("filtered", CostQuery{OrgID: "o1", From: t0, To: t1, Filter: CostFilter{AgentIDs: []string{"a1", "a2"}, Models: []string{"m"}}},
		"SELECT "+aggs+latest("org_id = ? AND has(?, agent_id) AND has(?, model) AND grain = 'hour' AND bucket >= ? AND bucket < ?")+
			" GROUP BY currency HAVING total_events > 0 ORDER BY total_cost DESC, currency LIMIT 1001",
		[]any{"o1", []string{"a1", "a2"}, []string{"m"}, t0, t1})
	// Three days: the whole days as day rows, the edge hours as hour rows, in one scan.
	day := func(d int) time.Time { return time.Date(2025, 3, d, 0, 0, 0, 0, time.UTC) }
	f("whole days from the day rows", CostQuery{OrgID: "o1", From: t0, To: t1.Add(48 * time.Hour), GroupBy: []string{"day"}},
		"SELECT toStartOfDay(hour), "+aggs+latest("org_id = ? AND ((grain = 'day' AND bucket >= ? AND bucket < ?)"+
			" OR (grain = 'hour' AND ((bucket >= ? AND bucket < ?) OR (bucket >= ? AND bucket < ?))))")+
			" GROUP BY toStartOfDay(hour), currency HAVING total_events > 0 ORDER BY toStartOfDay(hour), total_cost DESC, currency LIMIT 1001",
		[]any{"o1", day(2), day(4), t0, day(2), day(4), t1.Add(48 * time.Hour)})
	f("by hour: the hour rows only", CostQuery{OrgID: "o1", From: t0, To: t1.Add(48 * time.Hour), GroupBy: []string{"hour"}},
		"SELECT hour, "+aggs+from+" GROUP BY hour, currency HAVING total_events > 0 ORDER BY hour, total_cost DESC, currency LIMIT 1001",
		[]any{"o1", t0, t1.Add(48 * time.Hour)})
}

func TestCostFilterRefusesHostileLists(t *testing.T) {
	long := make([]string, MaxFilterValues+1)
	for i := range long {
		long[i] = "a"
	}
	for name, f := range map[string]CostFilter{
		"too many": {OwnerIDs: long},
		"empty":    {RoomIDs: []string{""}},
		"too long": {Models: []string{string(make([]byte, 257))}},
	} {
		err := CostQuery{OrgID: "o1", From: t0, To: t1, Filter: f}.Validate()
		if !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want a schema.FieldError", name, err)
		}
	}
}

func TestCostQueryValidate(t *testing.T) {
	f := func(q CostQuery, want ...string) {
		t.Helper()
		err := q.Validate()
		if len(want) == 0 {
			if err != nil {
				t.Errorf("%+v: unexpected error %v", q, err)
			}
			return
		}
		if err == nil {
			t.Fatalf("%+v: no error, want %q", q, want)
		}
		if !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("%v: not schema.ErrInvalid", err)
		}
		got := strings.Split(err.Error(), "\n")
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("errors (-want +got):\n%s", diff)
		}
	}
	f(CostQuery{OrgID: "o", From: t0, To: t1, GroupBy: []string{"owner", "agent", "room", "model", "hour", "day"}, Limit: MaxCostLimit})
	f(CostQuery{From: t0, To: t1}, "org_id: required")
	f(CostQuery{OrgID: "o"}, "from: required", "to: required")
	f(CostQuery{OrgID: "o", From: t1, To: t0}, "to: must be after from (from 2025-03-02T10:00:00Z, to 2025-03-01T10:00:00Z)")
	f(CostQuery{OrgID: "o", From: t0, To: t0}, "to: must be after from (from 2025-03-01T10:00:00Z, to 2025-03-01T10:00:00Z)")
	f(CostQuery{OrgID: "o", From: t0, To: t1, GroupBy: []string{"foo"}},
		`group_by: unknown dimension "foo" (want one of owner, agent, room, model, hour, day, initiator, initiator_owner, chain_depth)`)
	f(CostQuery{OrgID: "o", From: t0, To: t1, GroupBy: []string{"agent", "agent"}}, `group_by: dimension "agent" given twice`)
	f(CostQuery{OrgID: "o", From: t0, To: t1, Limit: -1}, "limit: must be between 1 and 10000, got -1")
	f(CostQuery{OrgID: "o", From: t0, To: t1, Limit: MaxCostLimit + 1}, "limit: must be between 1 and 10000, got 10001")

	// Who set the spend going.
	f(CostQuery{OrgID: "o", From: t0, To: t1, GroupBy: []string{"initiator", "initiator_owner", "chain_depth"},
		Filter: CostFilter{InitiatorIDs: []string{"alice"}, InitiatorOwnerIDs: []string{"alice"}, ChainDepths: []int{0, 1, MaxChainDepth}}})
	f(CostQuery{OrgID: "o", From: t0, To: t1, GroupBy: []string{"initiator", "agent"}, Filter: CostFilter{RoomIDs: []string{"r"}}},
		"group_by: agent cannot be combined with initiator, initiator_owner, chain_depth or a filter on them: spend by initiator is kept by owner and model only (delegation gives an execution's agents)",
		"filter: agent_ids and room_ids cannot be combined with initiator, initiator_owner, chain_depth or a filter on them")
	f(CostQuery{OrgID: "o", From: t0, To: t1, Filter: CostFilter{ChainDepths: []int{-1, MaxChainDepth + 1}}},
		"filter.chain_depths: value 0 must be 0 to 65535, got -1", "filter.chain_depths: value 1 must be 0 to 65535, got 65536")
	f(CostQuery{OrgID: "o", From: t0, To: t1, Filter: CostFilter{ChainDepths: make([]int, MaxFilterValues+1)}},
		"filter.chain_depths: 101 values; at most 100")
	f(CostQuery{OrgID: "o", From: t0, To: t1, Filter: CostFilter{InitiatorIDs: []string{""}, InitiatorOwnerIDs: []string{strings.Repeat("x", 257)}}},
		"filter.initiator_ids: value 0 must be 1 to 256 bytes, got 0", "filter.initiator_owner_ids: value 0 must be 1 to 256 bytes, got 257")
}

func TestAuditSQL(t *testing.T) {
	const cols = "id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle," +
		" owner_id, subject_id, subject_type, subject_handle, execution_id, source, schema_version, data," +
		" ingested_at, kafka_partition, kafka_offset"
	const order = " ORDER BY time DESC, time_ms DESC, id DESC LIMIT 1 BY (time, time_ms, id)"
	// The page's keys are chosen by the subquery, with the same conditions (and so the
	// same arguments, twice); no FINAL.
	page := func(cond string, limit int) string {
		from := " FROM db1.events WHERE org_id = ?" + cond
		lim := fmt.Sprintf(" LIMIT %d", limit)
		return "SELECT " + cols + from + " AND (time, time_ms, id) IN (SELECT time, time_ms, id" + from + order + lim + ")" + order + lim
	}
	twice := func(args ...any) []any { return append(append([]any{}, args...), args...) }
	f := func(name string, s auditSQL, wantSQL string, wantArgs []any) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			if err := s.q.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			s.db = "db1"
			sql, args := s.toSQL()
			if diff := cmp.Diff(wantSQL, sql); diff != "" {
				t.Errorf("sql (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantArgs, args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
	f("org only", auditSQL{q: AuditQuery{OrgID: "o1"}}, page("", 101), twice("o1"))
	f("every filter", auditSQL{q: AuditQuery{
		OrgID: "o1", From: t0.Add(250 * time.Millisecond), To: t1.Add(999 * time.Millisecond),
		RoomID: "r1", ActorID: "a1", SubjectID: "s1", Types: []string{"message.posted", "tool.called"}, Limit: 10,
	}},
		page(" AND time >= ? AND (time > ? OR time_ms >= ?) AND time <= ? AND (time < ? OR time_ms < ?)"+
			" AND room_id = ? AND actor_id = ? AND subject_id = ? AND has(?, type)", 11),
		twice("o1", t0, t0, uint16(250), t1, t1, uint16(999), "r1", "a1", "s1", []string{"message.posted", "tool.called"}))
	before := cursor{asOf: t1.Unix() + 60, sec: t1.Unix(), ms: 7, id: "ev-9"}.String()
	f("before cursor, as of its watermark", auditSQL{q: AuditQuery{OrgID: "o1", Before: before, Limit: MaxAuditLimit}, asOf: t1.Add(time.Minute)},
		page(" AND ingested_at <= ? AND time <= ? AND (time < ? OR time_ms < ? OR (time_ms = ? AND id < ?))", 10001),
		twice("o1", t1.Add(time.Minute), t1, t1, uint16(7), uint16(7), "ev-9"))
	f("denied", auditSQL{q: AuditQuery{OrgID: "o1", Outcome: "denied"}},
		page(" AND type = ? AND visitParamExtractBool(data, 'allow') = 0", 101), twice("o1", "policy.decided"))
	f("allowed send_message", auditSQL{q: AuditQuery{OrgID: "o1", Outcome: "allowed"}, decision: "send_message"},
		page(" AND type = ? AND visitParamExtractBool(data, 'allow') = 1 AND visitParamExtractString(data, 'decision') = ?", 101),
		twice("o1", "policy.decided", "send_message"))
	// A window of a walk-back is the same query with one more range, and reads the rows
	// the page still lacks.
	f("window", auditSQL{q: AuditQuery{OrgID: "o1", From: t0, Types: []string{"message.created"}},
		win: span{from: t1.Add(-24 * time.Hour).Add(5 * time.Millisecond), to: t1.Add(-time.Hour).Add(5 * time.Millisecond)}, rows: 37},
		page(" AND time >= ? AND (time > ? OR time_ms >= ?)"+
			" AND time >= ? AND (time > ? OR time_ms >= ?) AND time <= ? AND (time < ? OR time_ms < ?) AND has(?, type)", 37),
		twice("o1", t0, t0, uint16(0), t1.Add(-24*time.Hour), t1.Add(-24*time.Hour), uint16(5),
			t1.Add(-time.Hour), t1.Add(-time.Hour), uint16(5), []string{"message.created"}))
	f("first window, open above", auditSQL{q: AuditQuery{OrgID: "o1"}, win: span{from: t1}},
		page(" AND time >= ? AND (time > ? OR time_ms >= ?)", 101), twice("o1", t1, t1, uint16(0)))
}

func TestAuditQueryValidate(t *testing.T) {
	f := func(q AuditQuery, want ...string) {
		t.Helper()
		err := q.Validate()
		if len(want) == 0 {
			if err != nil {
				t.Errorf("%+v: unexpected error %v", q, err)
			}
			return
		}
		if err == nil {
			t.Fatalf("%+v: no error, want %q", q, want)
		}
		if !errors.Is(err, schema.ErrInvalid) {
			t.Errorf("%v: not schema.ErrInvalid", err)
		}
		if diff := cmp.Diff(want, strings.Split(err.Error(), "\n")); diff != "" {
			t.Errorf("errors (-want +got):\n%s", diff)
		}
	}
	f(AuditQuery{OrgID: "o", From: t0})
	f(AuditQuery{OrgID: "o", To: t0})
	f(AuditQuery{}, "org_id: required")
	f(AuditQuery{OrgID: "o", From: t1, To: t0}, "to: must be after from (from 2025-03-02T10:00:00Z, to 2025-03-01T10:00:00Z)")
	f(AuditQuery{OrgID: "o", Types: []string{"a", ""}}, "types: entry 1 must be 1 to 128 bytes, got 0")
	f(AuditQuery{OrgID: "o", Limit: 10001}, "limit: must be between 1 and 10000, got 10001")
	f(AuditQuery{OrgID: "o", Before: "!!"}, `before: malformed cursor "!!" (pass a nextCursor unchanged)`)
	f(AuditQuery{OrgID: "o", Before: "djI6MTox"}, `before: malformed cursor "djI6MTox" (pass a nextCursor unchanged)`) // "v2:1:1"
}

func TestCursorRoundTrip(t *testing.T) {
	e := Event{ID: "ev:with:colons", Time: time.Date(2025, 3, 1, 10, 0, 5, 123_000_000, time.UTC)}
	s := cursorOf(e).String()
	got, err := decodeCursor(s)
	if err != nil {
		t.Fatal(err)
	}
	want := cursor{sec: e.Time.Unix(), ms: 123, id: "ev:with:colons"}
	if got != want {
		t.Errorf("decodeCursor(%q) = %+v, want %+v", s, got, want)
	}
}
