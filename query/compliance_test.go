package query

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
)

// checkErrs runs validate and compares its errors, one a line, with want (none: valid).
func checkErrs(t *testing.T, what any, err error, want ...string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Errorf("%+v: unexpected error %v", what, err)
		}
		return
	}
	if err == nil {
		t.Errorf("%+v: no error, want %q", what, want)
		return
	}
	if !errors.Is(err, schema.ErrInvalid) {
		t.Errorf("%v: not schema.ErrInvalid", err)
	}
	if diff := cmp.Diff(want, strings.Split(err.Error(), "\n")); diff != "" {
		t.Errorf("%+v: errors (-want +got):\n%s", what, diff)
	}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestAuditQueryValidateOutcomeAndCursors(t *testing.T) {
	f := func(q AuditQuery, want ...string) { t.Helper(); checkErrs(t, q, q.Validate(), want...) }
	f(AuditQuery{OrgID: "o", SubjectID: "s", Outcome: "allowed"})
	f(AuditQuery{OrgID: "o", Outcome: "denied", Before: b64("v2:1740823200:1740823200007:ev:9")})
	f(AuditQuery{OrgID: "o", Outcome: "deny"}, `outcome: unknown outcome "deny" (want allowed, denied or nothing)`)
	f(AuditQuery{OrgID: "o", Outcome: "ALLOWED"}, `outcome: unknown outcome "ALLOWED" (want allowed, denied or nothing)`)

	v1 := b64("v1:1740823200007:ev-9") // what bandplane handed out before the watermark
	f(AuditQuery{OrgID: "o", Before: v1}, `before: cursor "`+v1+`" is from an older version of bandplane (v1); start again from the first page`)
	malformed := func(raw string) {
		t.Helper()
		c := b64(raw)
		f(AuditQuery{OrgID: "o", Before: c}, `before: malformed cursor "`+c+`" (pass a nextCursor unchanged)`)
	}
	malformed("v2")
	malformed("v2:1:1")                                                                                                  // v1's shape under v2
	malformed("v2:1:1:")                                                                                                 // no id
	malformed("v2:x:1:id")                                                                                               // as-of not a number
	malformed("v2:-1:1:id")                                                                                              // negative as-of
	malformed("v2:1:-5:id")                                                                                              // negative time
	malformed("v2:1:1.5:id")                                                                                             // not an integer
	malformed("v3:1:1:id")                                                                                               // unknown version
	malformed("V2:1:1:id")                                                                                               // versions are lower case
	malformed("garbage")                                                                                                 // not ours at all
	malformed("v2:1:99999999999999999999:id")                                                                            // overflows
	f(AuditQuery{OrgID: "o", Before: "v2:1:1:id"}, `before: malformed cursor "v2:1:1:id" (pass a nextCursor unchanged)`) // not base64
	f(AuditQuery{OrgID: "o", Before: b64("v2:1:1:id") + "="}, `before: malformed cursor "`+b64("v2:1:1:id")+`=" (pass a nextCursor unchanged)`)

	// Every problem at once, in field order.
	f(AuditQuery{From: t1, To: t0, Types: []string{""}, Outcome: "x", Limit: -1, Before: "!"},
		"org_id: required",
		"to: must be after from (from 2025-03-02T10:00:00Z, to 2025-03-01T10:00:00Z)",
		"types: entry 0 must be 1 to 128 bytes, got 0",
		`outcome: unknown outcome "x" (want allowed, denied or nothing)`,
		"limit: must be between 1 and 10000, got -1",
		`before: malformed cursor "!" (pass a nextCursor unchanged)`)
}

func TestCursorV2RoundTrip(t *testing.T) {
	c := cursor{asOf: 1740823260, sec: 1740823200, ms: 999, id: "ev:with:colons"}
	got, err := decodeCursor(c.String())
	if err != nil {
		t.Fatal(err)
	}
	if got != c {
		t.Errorf("decodeCursor(%q) = %+v, want %+v", c.String(), got, c)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(c.String())
	if want := "v2:1740823260:1740823200999:ev:with:colons"; string(raw) != want {
		t.Errorf("cursor text = %q, want %q", raw, want)
	}
}

func TestAsOf(t *testing.T) {
	now := time.Date(2025, 3, 1, 10, 0, 5, 700_000_000, time.FixedZone("X", 3600))
	// A first page: two seconds back, whole seconds, UTC.
	if got, want := asOfOf("", now), time.Date(2025, 3, 1, 9, 0, 3, 0, time.UTC); !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("first page as of %s, want %s", got, want)
	}
	// A later page: the cursor's, whatever the clock says.
	c := cursor{asOf: t0.Unix(), sec: 1, id: "x"}.String()
	if got := asOfOf(c, now); !got.Equal(t0) {
		t.Errorf("later page as of %s, want %s", got, t0)
	}
}

func TestDecisionQueryValidate(t *testing.T) {
	f := func(q DecisionQuery, want ...string) { t.Helper(); checkErrs(t, q, q.Validate(), want...) }
	for _, d := range []string{"", "peer_visible", "add_participant", "contact_request", "send_message"} {
		f(DecisionQuery{OrgID: "o", Decision: d, Limit: MaxDecisionLimit})
	}
	f(DecisionQuery{OrgID: "o", From: t0, To: t1, Outcome: "allowed", AgentID: "a", Limit: 1})
	f(DecisionQuery{}, "org_id: required")
	f(DecisionQuery{OrgID: "o", Decision: "send"},
		`decision: unknown decision "send" (want one of peer_visible, add_participant, contact_request, send_message)`)
	f(DecisionQuery{OrgID: "o", Decision: "policy.decided"},
		`decision: unknown decision "policy.decided" (want one of peer_visible, add_participant, contact_request, send_message)`)
	f(DecisionQuery{OrgID: "o", Limit: MaxDecisionLimit + 1}, "limit: must be between 1 and 1000, got 1001")
	f(DecisionQuery{OrgID: "o", Limit: -1}, "limit: must be between 1 and 1000, got -1")
	f(DecisionQuery{OrgID: "o", From: t0, To: t0}, "to: must be after from (from 2025-03-01T10:00:00Z, to 2025-03-01T10:00:00Z)")
	v1 := b64("v1:1:e")
	f(DecisionQuery{OrgID: "o", Before: v1}, `before: cursor "`+v1+`" is from an older version of bandplane (v1); start again from the first page`)
	f(DecisionQuery{From: t1, To: t0, Decision: "x", Outcome: "yes", Limit: 5000, Before: "%%"},
		"org_id: required",
		"to: must be after from (from 2025-03-02T10:00:00Z, to 2025-03-01T10:00:00Z)",
		`decision: unknown decision "x" (want one of peer_visible, add_participant, contact_request, send_message)`,
		`outcome: unknown outcome "yes" (want allowed, denied or nothing)`,
		"limit: must be between 1 and 1000, got 5000",
		`before: malformed cursor "%%" (pass a nextCursor unchanged)`)
}

// The names and codes this package keeps as strings (it does not import the policy
// engine) are the engine's.
func TestPolicyNamesInStep(t *testing.T) {
	want := []string{policy.PeerVisible, policy.AddParticipant, policy.ContactRequest, policy.SendMessage}
	if diff := cmp.Diff(want, decisionNames); diff != "" {
		t.Errorf("decision names (-policy +query):\n%s", diff)
	}
	if diff := cmp.Diff([]string{policy.CodeRateLimited, policy.CodeBudgetExceeded}, throttleCodes); diff != "" {
		t.Errorf("throttle codes (-policy +query):\n%s", diff)
	}
}

// TestDecidedDataLayout: the SQL filters read "decision" and "allow" with visitParam*,
// which take the first occurrence of a key at any depth and allow no whitespace. That
// is the top-level one only while policy/api writes DecidedData compactly, with these
// two first, before the reasons and the input (which can hold any key).
func TestDecidedDataLayout(t *testing.T) {
	b, err := json.Marshal(api.DecidedData{Decision: "send_message", Allow: false,
		Reasons:        []policy.Reason{{Code: "rate_limited", Message: `"allow":true "decision":"x"`}},
		PolicyRevision: "rev", Input: json.RawMessage(`{"allow":true,"decision":"peer_visible","code":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"decision":"send_message","allow":false,"reasons":[{"code":"rate_limited",`; !strings.HasPrefix(string(b), want) {
		t.Errorf("DecidedData encodes as %s, want it to start with %s", b, want)
	}
}

func TestDecisionOf(t *testing.T) {
	at := t0.Add(123 * time.Millisecond)
	data, err := json.Marshal(api.DecidedData{Decision: "send_message", Allow: false,
		Reasons:        []policy.Reason{{Code: "rate_limited", Message: "agent a1 may post 12 messages per 1m0s in this room"}},
		PolicyRevision: "rev-1", InputDigest: "d1", Input: json.RawMessage(`{"agent":"a1","room":"r1"}`),
		RetryAfterMs: 1500, RequestedBy: "key-1"})
	if err != nil {
		t.Fatal(err)
	}
	e := Event{ID: "dec-1", Type: "policy.decided", Time: at, OrgID: "o", RoomID: "r1", ActorID: "a1", ActorType: "agent", Data: string(data)}
	got, err := DecisionOf(e)
	if err != nil {
		t.Fatal(err)
	}
	want := PolicyDecision{ID: "dec-1", Time: at, Decision: "send_message", Allowed: false,
		Reasons:  []Reason{{Code: "rate_limited", Message: "agent a1 may post 12 messages per 1m0s in this room"}},
		Revision: "rev-1", InputDigest: "d1", Input: `{"agent":"a1","room":"r1"}`, RetryAfterMs: 1500,
		AgentID: "a1", RoomID: "r1", RequestedBy: "key-1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decision (-want +got):\n%s", diff)
	}

	// An allow without reasons: Reasons is empty, not nil.
	e.Data = `{"decision":"peer_visible","allow":true,"reasons":null,"policy_revision":"r","input_digest":"d","input":{}}`
	got, err = DecisionOf(e)
	if err != nil {
		t.Fatal(err)
	}
	if got.Reasons == nil || len(got.Reasons) != 0 || !got.Allowed || got.Input != "{}" || got.RequestedBy != "" {
		t.Errorf("allow without reasons = %+v", got)
	}

	bad := func(e Event, want string) {
		t.Helper()
		_, err := DecisionOf(e)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecisionOf(%+v) error = %v, want it to contain %q", e, err, want)
		}
	}
	bad(Event{ID: "m1", Type: "message.created", Data: "{}"}, `cannot read event m1 as a policy decision: its type is "message.created", not policy.decided`)
	bad(Event{ID: "d2", Type: "policy.decided", Data: `{"allow":"yes"}`}, "cannot decode the data of policy decision d2")
	bad(Event{ID: "d3", Type: "policy.decided", Data: `{"allow":true`}, "cannot decode the data of policy decision d3")
}

func TestContactQueryValidate(t *testing.T) {
	f := func(q ContactQuery, want ...string) { t.Helper(); checkErrs(t, q, q.Validate(), want...) }
	for _, s := range []string{"", "pending", "approved", "rejected", "cancelled"} {
		f(ContactQuery{OrgID: "o", Status: s, Limit: MaxContactLimit})
	}
	f(ContactQuery{OrgID: "o", From: t0, To: t1, AgentID: "a"})
	f(ContactQuery{OrgID: "o", Status: "canceled"}, `status: unknown status "canceled" (want one of pending, approved, rejected, cancelled)`)
	f(ContactQuery{OrgID: "o", Status: "Pending"}, `status: unknown status "Pending" (want one of pending, approved, rejected, cancelled)`)
	f(ContactQuery{From: t1, To: t0, Status: "x", Limit: MaxContactLimit + 1},
		"org_id: required",
		"to: must be after from (from 2025-03-02T10:00:00Z, to 2025-03-01T10:00:00Z)",
		`status: unknown status "x" (want one of pending, approved, rejected, cancelled)`,
		"limit: must be between 1 and 1000, got 1001")
	f(ContactQuery{OrgID: "o", Limit: -3}, "limit: must be between 1 and 1000, got -3")
}

func TestChattyQueryValidate(t *testing.T) {
	f := func(q ChattyQuery, want ...string) { t.Helper(); checkErrs(t, q, q.Validate(), want...) }
	f(ChattyQuery{OrgID: "o"})
	f(ChattyQuery{OrgID: "o", From: t0, To: t1, Limit: MaxChattyLimit})
	f(ChattyQuery{OrgID: "o", Limit: MaxChattyLimit + 1}, "limit: must be between 1 and 100, got 101")
	f(ChattyQuery{From: t1, To: t0, Limit: -1},
		"org_id: required",
		"to: must be after from (from 2025-03-02T10:00:00Z, to 2025-03-01T10:00:00Z)",
		"limit: must be between 1 and 100, got -1")
}

func TestWindow(t *testing.T) {
	now := t1.In(time.FixedZone("X", 3600))
	f := func(from, to time.Time, wantFrom, wantTo time.Time) {
		t.Helper()
		gf, gt, err := window(from, to, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !gf.Equal(wantFrom) || !gt.Equal(wantTo) || gf.Location() != time.UTC || gt.Location() != time.UTC {
			t.Errorf("window(%s, %s) = %s, %s; want %s, %s", from, to, gf, gt, wantFrom, wantTo)
		}
	}
	f(time.Time{}, time.Time{}, t1.Add(-time.Hour), t1)
	f(t0, time.Time{}, t0, t1)
	f(time.Time{}, t0, t0.Add(-time.Hour), t0)
	f(t0, t0.Add(time.Minute), t0, t0.Add(time.Minute))
	f(t1.Add(time.Hour), t1.Add(2*time.Hour), t1.Add(time.Hour), t1.Add(2*time.Hour)) // both given: the caller's range

	// From alone, not before now: nothing could match.
	for _, from := range []time.Time{t1, t1.Add(time.Hour)} {
		_, _, err := window(from, time.Time{}, now, time.Hour)
		checkErrs(t, from, err, "from: must be before to, which defaults to now (from "+from.Format(time.RFC3339Nano)+", now 2025-03-02T10:00:00Z)")
	}
}

func TestChattySQL(t *testing.T) {
	from, to := t0.Add(1500*time.Millisecond), t0.Add(90*time.Minute)
	rng := "time >= ? AND (time > ? OR time_ms >= ?) AND time <= ? AND (time < ? OR time_ms < ?)"
	rngArgs := []any{t0.Add(time.Second), t0.Add(time.Second), uint16(500), t0.Add(90 * time.Minute), t0.Add(90 * time.Minute), uint16(0)}
	agents := []string{"a1", "a2"}
	f := func(name, gotSQL string, gotArgs []any, wantSQL string, wantArgs []any) {
		t.Helper()
		if diff := cmp.Diff(wantSQL, gotSQL); diff != "" {
			t.Errorf("%s sql (-want +got):\n%s", name, diff)
		}
		if diff := cmp.Diff(wantArgs, gotArgs); diff != "" {
			t.Errorf("%s args (-want +got):\n%s", name, diff)
		}
	}
	sql, args := chattyMessagesSQL{db: "db1", org: "o1", from: from, to: to, limit: 10}.toSQL()
	f("messages", sql, args,
		"SELECT actor_id, argMax(owner_id, time) AS last_owner, uniqExact(id, time) AS total_messages FROM db1.events"+
			" WHERE org_id = ? AND "+rng+" AND type = ? AND actor_type = 'agent'"+
			" GROUP BY actor_id ORDER BY total_messages DESC, actor_id LIMIT 10",
		append(append([]any{"o1"}, rngArgs...), "message.created"))

	sql, args = chattyUsageSQL{db: "db1", org: "o1", from: from, to: to, agents: agents}.toSQL()
	f("usage", sql, args,
		"SELECT agent_id, currency, sum(events) AS total_events, sum(input_tokens) AS total_input, sum(output_tokens) AS total_output,"+
			" sum(cache_read_tokens) AS total_cache_read, sum(cache_write_tokens) AS total_cache_write,"+
			" sum(reasoning_tokens) AS total_reasoning, sum(cost) AS total_cost FROM db1.usage_hourly FINAL"+
			" WHERE org_id = ? AND hour >= ? AND hour < ? AND has(?, agent_id) GROUP BY agent_id, currency HAVING total_events > 0",
		[]any{"o1", t0, t0.Add(2 * time.Hour), agents}) // whole hours: 10:00 to 12:00

	sql, args = chattyDecisionsSQL{db: "db1", org: "o1", from: from, to: to, agents: agents}.toSQL()
	f("decisions", sql, args,
		"SELECT actor_id, uniqExact(id, time) AS total_denied, uniqExactIf(id, time, visitParamExtractString(data, 'decision') = ?"+
			" AND has(?, visitParamExtractString(data, 'code'))) AS total_throttled FROM db1.events"+
			" WHERE org_id = ? AND "+rng+" AND type = ? AND has(?, actor_id) AND visitParamExtractBool(data, 'allow') = 0 GROUP BY actor_id",
		append(append([]any{"send_message", []string{"rate_limited", "budget_exceeded"}, "o1"}, rngArgs...), "policy.decided", agents))

	sql, args = chattySuspendedSQL{db: "db1", org: "o1", agents: agents}.toSQL()
	f("suspended", sql, args,
		"SELECT subject_id, argMax(type, (time, time_ms, kafka_partition, kafka_offset)) AS last_action FROM db1.events"+
			" WHERE org_id = ? AND has(?, type) AND has(?, subject_id) GROUP BY subject_id",
		[]any{"o1", []string{"agent.suspended", "agent.resumed"}, agents})
}

func TestGroupContacts(t *testing.T) {
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	ev := func(id, typ string, m int, actor, data string) Event {
		return Event{ID: id, Type: "contact.request_" + typ, Time: at(m), ActorID: actor, Data: data}
	}
	req := func(id, status, extra string) string {
		return fmt.Sprintf(`{"status":%q,"request_id":%q%s}`, status, id, extra)
	}
	// Newest first, as the query reads them; e2 is replayed (twice in the slice).
	events := []Event{
		ev("e7", "updated", 50, "a3", req("r3", "", "")), // no status: keeps pending
		ev("e6", "received", 40, "a3", req("r3", "pending", `,"from_handle":"carol"`)),
		ev("e5", "updated", 30, "a2", req("r2", "cancelled", `,"from_handle":"bob/bot"`)),
		ev("e4", "received", 25, "a2", req("r2", "pending", `,"from_handle":"bob/bot","message":"hi"`)),
		ev("e3", "received", 20, "a1", `{"status":"pending"}`), // no request id: skipped
		ev("e2", "updated", 10, "a1", req("r1", "approved", `,"from_handle":"alice","to_handle":"dave/agent"`)),
		ev("e2", "updated", 10, "a1", req("r1", "approved", `,"from_handle":"alice","to_handle":"dave/agent"`)),
		ev("e1", "received", 0, "a1", req("r1", "pending", `,"from_handle":"alice","message":"Code review"`)),
		ev("e8", "received", 10, "a4", req("r0", "pending", "")), // same LastChanged as r1: by id
	}
	withSubject := ev("e9", "updated", 60, "a4", req("r0", "rejected", ""))
	withSubject.SubjectID = "u-owner" // a canonical event naming who answered
	events = append([]Event{withSubject}, events...)
	got, err := groupContacts(events)
	if err != nil {
		t.Fatal(err)
	}
	want := []ContactRequest{
		{RequestID: "r0", Status: "rejected", AgentID: "a4", FirstSeen: at(10), LastChanged: at(60), DecidedBy: "u-owner",
			History: []ContactStep{{"pending", at(10), "a4", "e8"}, {"rejected", at(60), "a4", "e9"}}},
		{RequestID: "r3", Status: "pending", FromHandle: "carol", AgentID: "a3", FirstSeen: at(40), LastChanged: at(50),
			History: []ContactStep{{"pending", at(40), "a3", "e6"}, {"pending", at(50), "a3", "e7"}}},
		{RequestID: "r2", Status: "cancelled", FromHandle: "bob/bot", Message: "hi", AgentID: "a2", FirstSeen: at(25), LastChanged: at(30),
			DecidedBy: "bob/bot", History: []ContactStep{{"pending", at(25), "a2", "e4"}, {"cancelled", at(30), "a2", "e5"}}},
		{RequestID: "r1", Status: "approved", FromHandle: "alice", ToHandle: "dave/agent", Message: "Code review", AgentID: "a1",
			FirstSeen: at(0), LastChanged: at(10), DecidedBy: "a1",
			History: []ContactStep{{"pending", at(0), "a1", "e1"}, {"approved", at(10), "a1", "e2"}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	if _, err := groupContacts([]Event{ev("bad", "received", 0, "a1", `{"status":1}`)}); err == nil ||
		!strings.Contains(err.Error(), "cannot decode the data of contact.request_received event bad") {
		t.Errorf("bad data: error = %v", err)
	}
}

func TestAuditActorAndSubjectTheSameIDMatchEitherRole(t *testing.T) {
	sql, args := auditSQL{db: "db", q: AuditQuery{OrgID: "o", ActorID: "a1", SubjectID: "a1"}}.toSQL()
	if !strings.Contains(sql, "(actor_id = ? OR subject_id = ?)") {
		t.Errorf("sql = %s", sql)
	}
	n := 0
	for _, a := range args {
		if a == "a1" {
			n++
		}
	}
	if n == 0 || n%2 != 0 {
		t.Errorf("args = %v", args)
	}
	sql, _ = auditSQL{db: "db", q: AuditQuery{OrgID: "o", ActorID: "a1", SubjectID: "a2"}}.toSQL()
	if !strings.Contains(sql, "actor_id = ?") || !strings.Contains(sql, "subject_id = ?") || strings.Contains(sql, " OR subject_id") {
		t.Errorf("different ids are both required: %s", sql)
	}
	for _, q := range []AuditQuery{
		{OrgID: "o", SubjectID: strings.Repeat("x", 257)},
		{OrgID: "o", Types: make([]string, MaxAuditTypes+1)},
		{OrgID: "o", Types: []string{strings.Repeat("t", 129)}},
	} {
		if !errors.Is(q.Validate(), schema.ErrInvalid) {
			t.Errorf("Validate(%+v) accepted it", q)
		}
	}
}
