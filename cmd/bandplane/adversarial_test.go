package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

// advSource marks the events these tests post, so that the audit trail can be compared
// with exactly what the collector accepted.
const advSource = "adversary"

var advSeq atomic.Int64

// advEvent is a canonical message.created of org (none when ""), sent by actor, with
// data as given (a JSON object) and the time given (RFC 3339; "" = a minute ago).
func advEvent(org, actor, data, at string) (id, line string) {
	id = fmt.Sprintf("adv-%d-%d", time.Now().UnixNano(), advSeq.Add(1))
	if at == "" {
		at = time.Now().UTC().Add(-time.Minute).Format(time.RFC3339Nano)
	}
	orgField := ""
	if org != "" {
		orgField = `"org_id":"` + org + `",`
	}
	if data == "" {
		data = `{"content":"hello"}`
	}
	return id, `{"id":"` + id + `","type":"message.created","time":"` + at + `",` + orgField + `"room_id":"room-adv","actor":{"id":"` + actor +
		`","type":"agent"},"source":"` + advSource + `","data":` + data + `}`
}

// nested is a JSON value nested depth levels deep (arrays), built without recursion.
func nested(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}

// TestIntegrationAdversarialCollector attacks a real `bandplane serve` through the
// collector with every class of bad input, each line posted beside a good one: the
// server stays up, the bad line gets its error, the good one lands, and at the end the
// audit trail holds exactly what was accepted.
func TestIntegrationAdversarialCollector(t *testing.T) {
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	acme := s.key(t, "acme-ingest", "org-acme", keys.RoleIngest)
	viewer := s.key(t, "acme-viewer", "org-acme", keys.RoleViewer)
	srv := s.serve(t)

	// The directory: agent-acme belongs to org-acme, agent-other to org-other.
	reg := func(agent, org, owner, handle string) string {
		return `{"id":"reg-` + agent + `","type":"agent.registered","time":"` + time.Now().UTC().Add(-time.Hour).Format(time.RFC3339) +
			`","org_id":"` + org + `","actor":{"id":"` + owner + `","type":"user"},"subject":{"id":"` + agent + `","type":"agent"},"source":"` + advSource +
			`","data":{"handle":"` + handle + `","owner_id":"` + owner + `","listed":true}}`
	}
	code, a := srv.post(platform, reg("agent-acme", "org-acme", "u-acme", "acme/bot"), reg("agent-other", "org-other", "u-other", "other/bot"))
	require.Equal(t, http.StatusOK, code, "%+v", a)
	require.Equal(t, 2, a.Accepted, "%+v", a)
	accepted := map[string]bool{"reg-agent-acme": true, "reg-agent-other": true}
	// Wait until the policy directory knows them (the collector checks parties against it).
	// (Until it has, such a probe is accepted as an unknown agent's: it is in the trail.)
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		id, line := advEvent("", "agent-other", "", "")
		_, a := srv.post(acme, line)
		if a.Accepted == 1 {
			accepted[id] = true
		}
		return a.Rejected == 1
	}), "the directory never learned agent-other's organization")

	now := time.Now().UTC()
	huge := strings.Repeat("x", kafka.MaxEventBytes)
	type attack struct {
		name, token, line, reason string
		status                    int // of the request as a whole (200 when the good line lands)
	}
	deep := func(depth int) string { // an event whose data nests depth-2 levels: depth in all
		_, l := advEvent("org-acme", "agent-acme", `{"x":`+nested(depth-2)+`}`, "")
		return l
	}
	withData := func(data string) string { _, l := advEvent("org-acme", "agent-acme", data, ""); return l }
	at := func(ts string) string { _, l := advEvent("org-acme", "agent-acme", "", ts); return l }
	usage := func(tokens string) string {
		return strings.Replace(withData(`{"input_tokens":`+tokens+`,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0}`),
			`"type":"message.created"`, `"type":"usage.reported"`, 1)
	}
	frameUsage := func(tokens string) string {
		return `{"topic":"chat_room:room-adv","event":"event_created","payload":{"id":"fu-` + tokens + `","content":"u","message_type":"task","metadata":{"band_usage":{"input_tokens":` +
			tokens + `,"output_tokens":1}},"sender_id":"agent-acme","sender_type":"Agent","chat_room_id":"room-adv","inserted_at":"` + now.Add(-time.Minute).Format(time.RFC3339) + `"}}`
	}
	own := func(typ string) string {
		return strings.Replace(withData(`{}`), `"type":"message.created"`, `"type":"`+typ+`"`, 1)
	}
	attacks := []attack{
		{"depth 65", acme, deep(65), "deeper than 64", 200},
		{"depth 1000", acme, deep(1000), "deeper than 64", 200},
		{"depth 100000", acme, deep(100_000), "deeper than 64", 200},
		{"depth 400000 (800 KB)", acme, deep(400_000), "deeper than 64", 200},
		// The 6 MB line: refused for its size before any scan of it.
		{"depth 3000000 (6 MB)", acme, deep(3_000_000), "one Kafka message may carry", 200},
		{"line over the Kafka limit", acme, withData(`{"content":"` + huge + `"}`), "one Kafka message may carry", 200},
		{"line that only encodes over the limit", acme, withData(`{"content":"` + strings.Repeat("<", kafka.MaxEventBytes/5) + `"}`), "bytes once encoded", 200},
		{"invalid UTF-8", acme, withData("{\"content\":\"caf\xe9\"}"), "UTF-8", 200},
		{"escaped lone surrogate", acme, withData(`{"content":"\ud800"}`), "surrogate", 200},
		{"duplicate key at the top", acme, strings.Replace(withData(`{}`), `"source":`, `"room_id":"room-b","source":`, 1), "duplicate", 200},
		{"duplicate key in data", acme, withData(`{"content":"a","content":"b"}`), "duplicate", 200},
		{"tokens 9e18", acme, usage("9000000000000000000"), "input_tokens", 200},
		{"tokens over the cap", acme, usage("1000000001"), "input_tokens", 200},
		{"tokens negative", acme, usage("-1"), "input_tokens", 200},
		{"tokens float", acme, usage("1.5"), "input_tokens", 200},
		{"frame tokens huge", acme, frameUsage("9000000000000000000"), "input_tokens", 200},
		{"frame tokens float", acme, frameUsage("2.5"), "input_tokens", 200},
		{"year 9999", acme, at("9999-01-01T00:00:00Z"), "time", 200},
		{"year 1971", acme, at("1971-06-01T00:00:00Z"), "time", 200},
		{"two hours ahead", acme, at(now.Add(2 * time.Hour).Format(time.RFC3339)), "--max-clock-skew", 200},
		{"older than the retention", acme, at(now.Add(-401 * 24 * time.Hour).Format(time.RFC3339)), "--max-event-age", 200},
		{"long id", acme, strings.Replace(withData(`{}`), `"id":"adv-`, `"id":"`+strings.Repeat("i", 300)+`adv-`, 1), "id", 200},
		{"another organization", acme, strings.Replace(withData(`{}`), `"org_id":"org-acme"`, `"org_id":"org-other"`, 1), "org_id", 200},
		{"another organization's agent", acme, strings.Replace(withData(`{}`), `"org_id":"org-acme",`, ``, 1), "", 200}, // replaced below
		{"forged registration", acme, reg("agent-other", "org-acme", "u-acme", "acme/stolen"), "platform ingest key", 200},
		{"forged policy decision", platform, own("policy.decided"), "bandplane itself", 200},
		{"forged agent.control", platform, own("agent.control"), "bandplane itself", 200},
		{"forged key event", platform, own("key.created"), "bandplane itself", 200},
		{"forged seal", platform, own("audit.sealed"), "bandplane itself", 200},
		{"forged resume", platform, own("agent.resumed"), "bandplane itself", 200},
		{"bandplane's source", platform, strings.Replace(withData(`{}`), `"source":"`+advSource+`"`, `"source":"bandplane-policy"`, 1), "reserved", 200},
	}
	// An event of agent-other's without org_id, posted with acme's key.
	for i := range attacks {
		if attacks[i].name == "another organization's agent" {
			_, l := advEvent("", "agent-other", "", "")
			attacks[i].line, attacks[i].reason = l, "registered in another organization"
		}
	}
	for _, tc := range attacks {
		t.Run(tc.name, func(t *testing.T) {
			goodID, good := advEvent("org-acme", "agent-acme", "", "")
			code, a := srv.post(tc.token, good, tc.line)
			srv.alive()
			require.Equal(t, tc.status, code, "%+v", a)
			assert.Equal(t, 1, a.Accepted, "the good line beside it lands: %+v", a)
			require.Len(t, a.Errors, 1, "%+v", a)
			assert.Equal(t, 2, a.Errors[0].Line)
			assert.Contains(t, a.Errors[0].Reason, tc.reason)
			accepted[goodID] = true
		})
	}

	// Whole requests that are refused, and keys that may not write at all.
	for _, tc := range []struct {
		name, token string
		body        []byte
		status      int
		contains    string
	}{
		{"no key", "", []byte(at("")), http.StatusUnauthorized, "API key"},
		{"unknown key", "bpk_" + strings.Repeat("A", 43), []byte(at("")), http.StatusUnauthorized, "unknown"},
		{"viewer key", viewer, []byte(at("")), http.StatusForbidden, "ingest"},
		{"body over 16 MiB", acme, []byte(strings.Repeat(" ", 17<<20)), http.StatusRequestEntityTooLarge, "larger than"},
		{"not an array", acme, []byte("[" + nested(10)), http.StatusBadRequest, "not a JSON array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, b := srv.do(http.MethodPost, "/v1/events", tc.token, "application/x-ndjson", tc.body)
			srv.alive()
			assert.Equal(t, tc.status, code, "%s", b)
			assert.Contains(t, string(b), tc.contains)
		})
	}

	// The trail holds exactly what was accepted: every accepted id, nothing else of ours.
	want := make([]string, 0, len(accepted))
	for id := range accepted {
		want = append(want, id)
	}
	sort.Strings(want)
	var got []string
	ok := stacktest.Eventually(t, 60*time.Second, 250*time.Millisecond, func() bool {
		got = got[:0]
		rows, err := s.conn.Query(context.Background(), "SELECT DISTINCT id FROM "+s.db+".events WHERE source = ? ORDER BY id", advSource)
		if err != nil {
			return false
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if rows.Scan(&id) != nil {
				return false
			}
			got = append(got, id)
		}
		return rows.Err() == nil && len(got) >= len(want)
	})
	require.True(t, ok, "the trail has %d of the %d accepted events", len(got), len(want))
	assert.Equal(t, want, got, "the audit trail holds exactly what was accepted")
	var forged uint64
	require.NoError(t, s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".events WHERE source = ? AND (type LIKE 'policy.%' OR type LIKE 'key.%' OR type LIKE 'audit.%' OR type LIKE 'agent.%' AND type != 'agent.registered')", advSource).Scan(&forged))
	assert.Zero(t, forged, "no forged governance or bandplane event reached the trail")
	srv.alive()
}

// joinRoom puts a-coder in room-1 (send_message needs the sender in the room).
const joinRoom = `{"topic":"room_participants:room-1","event":"participant_added","payload":{"id":"a-coder","name":"Coder","type":"Agent"}}`

// TestIntegrationAdversarialDecisionsAndKeys attacks the decision API, the operator
// endpoints, GraphQL and the key store of a real `bandplane serve`.
func TestIntegrationAdversarialDecisionsAndKeys(t *testing.T) {
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "router", keys.PlatformOrg, keys.RoleRouter)
	otherRouter := s.key(t, "other-router", "org-other", keys.RoleRouter)
	operator := s.key(t, "operator", keys.PlatformOrg, keys.RoleOperator)
	otherOperator := s.key(t, "other-operator", "org-other", keys.RoleOperator)
	compliance := s.key(t, "acme-compliance", "org-acme", keys.RoleCompliance)
	viewer := s.key(t, "acme-viewer", "org-acme", keys.RoleViewer)
	srv := s.serve(t)

	hour := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	code, a := srv.post(platform,
		`{"id":"u1","type":"user.registered","time":"`+hour+`","org_id":"org-acme","actor":{"id":"sys","type":"system"},"subject":{"id":"u-alice","type":"user"},"source":"adv","data":{"handle":"alice"}}`,
		`{"id":"a1","type":"agent.registered","time":"`+hour+`","org_id":"org-acme","actor":{"id":"u-alice","type":"user"},"subject":{"id":"a-coder","type":"agent"},"source":"adv","data":{"handle":"alice/coder","owner_id":"u-alice","model":"gpt-5-mini","personal_registry_access":true,"listed":true}}`,
		joinRoom)
	require.Equal(t, http.StatusOK, code, "%+v", a)
	decide := func(token, name, body string) (int, map[string]any) {
		t.Helper()
		code, b := srv.do(http.MethodPost, "/v1/decisions/"+name, token, "application/json", []byte(body))
		var out map[string]any
		require.NoError(t, json.Unmarshal(b, &out), "%d %s", code, b)
		return code, out
	}
	msg := `{"agent":"a-coder","room":"room-1"}`
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		_, d := decide(router, "send_message", msg)
		return d["allow"] == true
	}), "the policy directory never learned a-coder")

	for _, tc := range []struct {
		name, token, decision, body string
		status                      int
		contains                    string
	}{
		{"no key", "", "send_message", msg, 401, "API key"},
		{"ingest key", platform, "send_message", msg, 403, "router"},
		{"another organization's router", otherRouter, "send_message", msg, 403, "only about agents registered in its organization"},
		{"body over the limit", router, "send_message", `{"agent":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "larger than"},
		{"trailing data", router, "send_message", msg + ` {"agent":"x"}`, 400, "after top-level value"},
		{"empty body", router, "send_message", ``, 400, "empty"},
		{"duplicate key", router, "send_message", `{"agent":"a-coder","agent":"a-x"}`, 400, "duplicate"},
		{"deep", router, "send_message", nested(20_000), 400, "deeper"},
		{"unknown field", router, "send_message", `{"agent":"a-coder","tokenz":1}`, 400, "tokenz"},
		{"negative estimate", router, "send_message", `{"agent":"a-coder","tokens":-5}`, 400, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := decide(tc.token, tc.decision, tc.body)
			srv.alive()
			assert.Equal(t, tc.status, code, "%v", out)
			assert.Contains(t, fmt.Sprint(out["error"]), tc.contains)
		})
	}
	t.Run("an estimate of MaxInt64 tokens is denied, never wrapped into an allow", func(t *testing.T) {
		code, d := decide(router, "send_message", `{"agent":"a-coder","room":"room-1","tokens":9223372036854775807}`)
		require.Equal(t, http.StatusOK, code, "%v", d)
		assert.Equal(t, false, d["allow"], "%v", d)
		assert.Contains(t, fmt.Sprint(d["reasons"]), "budget_exceeded")
		_, d = decide(router, "send_message", msg)
		assert.Equal(t, true, d["allow"], "budgets still work afterwards: %v", d)
	})
	t.Run("peers always carry their list", func(t *testing.T) {
		code, b := srv.do(http.MethodGet, "/v1/peers?agent=nobody", router, "", nil)
		require.Equal(t, http.StatusOK, code, "%s", b)
		assert.Contains(t, string(b), `"peers":[]`)
	})
	t.Run("operators of other organizations cannot suspend, nor learn the agent exists", func(t *testing.T) {
		code, b := srv.do(http.MethodPost, "/v1/agents/a-coder/suspend", otherOperator, "application/json", nil)
		assert.Equal(t, http.StatusNotFound, code, "as if the agent did not exist: %s", b)
		code, b = srv.do(http.MethodPost, "/v1/agents/a-coder/suspend", router, "application/json", nil)
		assert.Equal(t, http.StatusForbidden, code, "%s", b)
		code, b = srv.do(http.MethodPost, "/v1/policy/reload", viewer, "", nil)
		assert.Equal(t, http.StatusForbidden, code, "%s", b)
		_, d := decide(router, "send_message", msg)
		assert.Equal(t, true, d["allow"])
	})
	t.Run("graphql authorizes every field", func(t *testing.T) {
		q := func(token, query string) string {
			body, _ := json.Marshal(map[string]string{"query": query})
			_, b := srv.do(http.MethodPost, "/graphql", token, "application/json", body)
			return string(b)
		}
		audit := `{ auditEvents(orgId: "org-acme", limit: 5) { events { id type data } } }`
		assert.Contains(t, q("", audit), "UNAUTHENTICATED")
		assert.Contains(t, q(viewer, audit), "FORBIDDEN", "a viewer does not read message content")
		assert.Contains(t, q(compliance, `{ auditEvents(orgId: "org-other") { nextCursor } }`), "FORBIDDEN")
		assert.NotContains(t, q(compliance, audit), "errors")
		assert.Contains(t, q(viewer, `{ costs(orgId: "org-acme", from: "2026-01-01T00:00:00Z", to: "2026-01-02T00:00:00Z") { rows { events } } }`), `"costs"`)
		srv.alive()
	})
	t.Run("metrics need an operator key", func(t *testing.T) {
		code, _ := srv.do(http.MethodGet, "/metrics", "", "", nil)
		assert.Equal(t, http.StatusUnauthorized, code)
		code, _ = srv.do(http.MethodGet, "/metrics", viewer, "", nil)
		assert.Equal(t, http.StatusForbidden, code)
		code, _ = srv.do(http.MethodGet, "/metrics", operator, "", nil)
		assert.Equal(t, http.StatusOK, code)
	})
	// How soon is for the key cache's tests to bound, on a clock of their own (schema/keys).
	t.Run("a revoked key stops working at the next key refresh", func(t *testing.T) {
		_, err := s.keys.Revoke(context.Background(), s.ids["acme-viewer"], "test")
		require.NoError(t, err)
		revokedAt := time.Now()
		var code int
		assert.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
			code, _ = srv.do(http.MethodGet, "/metrics", viewer, "", nil)
			return code == http.StatusUnauthorized
		}), "still accepted after revocation: %d", code)
		t.Logf("revocation took effect after %s", time.Since(revokedAt).Round(time.Millisecond))
	})
	srv.alive()
}

// TestIntegrationSuspensionSurvives: an operator's suspension holds against the
// platform's agent.updated and across a restart of serve; only a resume lifts it.
func TestIntegrationSuspensionSurvives(t *testing.T) {
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "router", keys.PlatformOrg, keys.RoleRouter)
	operator := s.key(t, "operator", keys.PlatformOrg, keys.RoleOperator)
	srv := s.serve(t)
	at := func(d time.Duration) string { return time.Now().UTC().Add(d).Format(time.RFC3339Nano) }
	agent := func(typ, id string, d time.Duration) string {
		return `{"id":"` + id + `","type":"` + typ + `","time":"` + at(d) + `","org_id":"org-acme","actor":{"id":"u-alice","type":"user"},"subject":{"id":"a-coder","type":"agent"},"source":"adv","data":{"handle":"alice/coder","owner_id":"u-alice","personal_registry_access":true,"listed":true,"suspended":false}}`
	}
	code, a := srv.post(platform, agent("agent.registered", "reg", -time.Hour), joinRoom)
	require.Equal(t, http.StatusOK, code, "%+v", a)
	send := func(srv *server) map[string]any {
		_, b := srv.do(http.MethodPost, "/v1/decisions/send_message", router, "application/json", []byte(`{"agent":"a-coder","room":"room-1"}`))
		var d map[string]any
		require.NoError(t, json.Unmarshal(b, &d), "%s", b)
		return d
	}
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool { return send(srv)["allow"] == true }))

	code, b := srv.do(http.MethodPost, "/v1/agents/a-coder/suspend", operator, "application/json", []byte(`{"reason":"runaway"}`))
	require.Equal(t, http.StatusOK, code, "%s", b)
	assert.Equal(t, false, send(srv)["allow"])

	// The platform re-sends the agent with suspended: false, then registers a-marker.
	// Both are keyed by the organization (no room): one partition, which the replica
	// applies in order, so once it knows a-marker it has applied the update.
	marker := `{"id":"marker","type":"agent.registered","time":"` + at(-time.Second) + `","org_id":"org-acme","actor":{"id":"u-alice","type":"user"},"subject":{"id":"a-marker","type":"agent"},"source":"adv","data":{"handle":"alice/marker","owner_id":"u-alice","personal_registry_access":true,"listed":true}}`
	code, a = srv.post(platform, agent("agent.updated", "upd", -time.Second), marker)
	require.Equal(t, http.StatusOK, code, "%+v", a)
	require.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		_, b := srv.do(http.MethodPost, "/v1/decisions/send_message", router, "application/json", []byte(`{"agent":"a-marker","room":"room-1"}`))
		return strings.Contains(string(b), `"reasons"`) && !strings.Contains(string(b), "unknown_agent")
	}), "the replica never applied a-marker's registration")
	d := send(srv)
	assert.Equal(t, false, d["allow"], "a platform update must not lift the operator's suspension: %v", d)
	assert.Contains(t, fmt.Sprint(d["reasons"]), "suspended")

	// A restart replays the trail from ClickHouse: the suspension is still there.
	srv.stop()
	require.True(t, stacktest.Eventually(t, 30*time.Second, 250*time.Millisecond, func() bool {
		var n uint64
		_ = s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".events WHERE type IN ('agent.suspended', 'agent.updated') AND subject_id = 'a-coder'").Scan(&n)
		return n == 2
	}), "the suspension and the update reached ClickHouse")
	srv = s.serve(t)
	d = send(srv)
	assert.Equal(t, false, d["allow"], "after a restart: %v", d)

	code, b = srv.do(http.MethodPost, "/v1/agents/a-coder/resume", operator, "application/json", nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	assert.Equal(t, true, send(srv)["allow"])
	srv.alive()
}
