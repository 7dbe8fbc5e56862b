package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/client"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// shardBundle is the built-in bundle with slow rates for orgs: 16 messages an hour per
// agent, 6 an hour per agent in one room (one every 3¾ and 10 minutes), so that nothing
// refills while the test runs and every answer is exact to compare.
func shardBundle(t *testing.T, orgs ...string) string {
	return bundleWithQuotas(t, `{"window_seconds": 3600, "messages_per_window_agent": 16, "messages_per_window_agent_room": 6}`, orgs...)
}

// serveAt starts `bandplane serve` listening on addr (a replica's URL must be known
// before it starts: it is in every replica's --policy-peers) with its own policy group.
func (s *stack) serveAt(t *testing.T, addr, policyGroup string, extra ...string) *server {
	t.Helper()
	args := append([]string{"serve", "--listen", addr, "--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db,
		"--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic, "--group", s.group, "--policy-group", policyGroup,
		"--batch-age", "100ms", "--rollup-interval", "500ms", "--key-refresh", "1s", "--otlp-grpc-listen", ""}, extra...)
	cmd := exec.Command(bandplaneBinary(t), args...)
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	srv := &server{t: t, cmd: cmd, url: "http://" + addr, log: &log, done: make(chan error, 1)}
	go func() { srv.done <- cmd.Wait() }()
	t.Cleanup(func() { srv.stop() })
	require.True(t, stacktest.Eventually(t, 90*time.Second, 100*time.Millisecond, func() bool {
		select {
		case err := <-srv.done:
			srv.done <- err
			t.Fatalf("bandplane serve exited (%v):\n%s", err, log.String())
		default:
		}
		resp, err := http.Get(srv.url + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}), "bandplane serve on %s is not ready after 90 s:\n%s", addr, log.String())
	return srv
}

// step is one decision of the chatty agent's sequence and its answer.
type step struct {
	room  string
	allow bool
	code  string
	retry time.Duration
	sent  time.Time // when the request was sent (the client's clock)
	at    time.Time // when the answer came (the client's clock)
	id    string
	exec  string
	// rawRoom is the room's id (room is its name in the sequence).
	rawRoom string
}

func (s step) outcome() string {
	if s.allow {
		return "allow"
	}
	return s.code
}

func outcomes(steps []step) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.room + ":" + s.outcome()
	}
	return out
}

// runSequence sends one send_message per room in rooms, alternating over clients, each
// with an estimate of 1,000 tokens and an execution id of its own (prefix-i).
func runSequence(t *testing.T, clients []*client.Client, agent string, rooms []string, names map[string]string, prefix string) []step {
	t.Helper()
	var out []step
	for i, room := range rooms {
		exec := fmt.Sprintf("%s-%d", prefix, i)
		sent := time.Now()
		d, err := clients[i%len(clients)].Decide(context.Background(), policy.SendMessage,
			policy.MessageInput{Agent: agent, Room: room, Tokens: 1000, ExecutionID: exec})
		require.NoError(t, err, "decision %d in %s", i, room)
		st := step{room: names[room], allow: d.Allow, retry: time.Duration(d.RetryAfterMs) * time.Millisecond, sent: sent, at: time.Now(), id: d.DecisionID,
			exec: exec, rawRoom: room}
		if len(d.Reasons) > 0 {
			st.code = d.Reasons[0].Code
		}
		out = append(out, st)
	}
	return out
}

func repeat(room string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = room
	}
	return out
}

func allowedIn(steps []step) (n int) {
	for _, s := range steps {
		if s.allow {
			n++
		}
	}
	return n
}

// knows waits until srv's directory knows agent (peer_visible, which takes nothing)
// and has it in every one of rooms (add_participant of itself answers "self", not
// actor_not_in_room: the events of the agent and of its rooms are on different
// partitions, so the agent can be known before its rooms are).
func knows(t *testing.T, srv *server, router, agent string, rooms ...string) {
	t.Helper()
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		code, b := srv.do(http.MethodPost, "/v1/decisions/peer_visible", router, "application/json", []byte(`{"agent":"`+agent+`"}`))
		var d policy.Decision
		if code != http.StatusOK || json.Unmarshal(b, &d) != nil || !d.Allow {
			return false
		}
		for _, room := range rooms {
			code, b := srv.do(http.MethodPost, "/v1/decisions/add_participant", router, "application/json",
				[]byte(`{"actor":"`+agent+`","room":"`+room+`","participant":"`+agent+`"}`))
			var d policy.Decision
			if code != http.StatusOK || json.Unmarshal(b, &d) != nil || len(d.Reasons) == 0 || d.Reasons[0].Code != "self" {
				return false
			}
		}
		return true
	}), "%s never learnt agent %s in rooms %v", srv.url, agent, rooms)
}

// TestIntegrationClusterPolicyShards: two policy replicas with one peer list. The
// chatty agent's send_message decisions go alternately to both through the policy
// client: exactly the answers of one replica, each decision audited once; then the
// replica that owns its organization restarts (the decisions just before the restart
// are in Kafka only: ingest is stopped) and the agent is still limited exactly, to the
// millisecond of its retry_after. And no replica decides, or names an owner, when it
// must not.
func TestIntegrationClusterPolicyShards(t *testing.T) {
	s := newStack(t)
	tag := isoTag()
	single, sharded := newIsoTenant("solo", tag), newIsoTenant("shard", tag)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "platform-router", keys.PlatformOrg, keys.RoleRouter)
	viewer := s.key(t, "platform-viewer", keys.PlatformOrg, keys.RoleViewer)
	tenantRouter := s.key(t, "shard-router", sharded.org, keys.RoleRouter)
	metricsKey := s.key(t, "platform-operator", keys.PlatformOrg, keys.RoleOperator)
	strangerRouter := s.key(t, "stranger-router", "org-stranger-"+tag, keys.RoleRouter)
	bundle := shardBundle(t, single.org, sharded.org)

	// 1. One replica (it also runs ingest): the reference run of the sequence.
	solo := s.serveAt(t, freePort(t), s.group+"-policy-solo", "--policy-dir", bundle)
	for _, tn := range []*isoTenant{single, sharded} {
		at := time.Now().UTC().Add(-10 * time.Minute)
		evs := tn.seed(t, at)
		// The coder is in three rooms.
		for _, room := range []string{tn.room2, thirdRoom(tn)} {
			evs = append(evs, tn.event(t, schema.TypeParticipantAdded, room, tn.system, &tn.coder,
				schema.ParticipantData{ParticipantID: tn.coder.ID, ParticipantType: schema.ActorAgent}, at.Add(time.Minute)))
		}
		isoPost(t, solo, platform, evs)
		knows(t, solo, router, tn.coder.ID, tn.room, tn.room2, thirdRoom(tn))
	}
	rooms := func(tn *isoTenant) (first, second, last []string, names map[string]string) {
		third := thirdRoom(tn)
		first = append(repeat(tn.room, 8), repeat(tn.room2, 8)...)
		second = append(append(repeat(tn.room, 2), repeat(tn.room2, 2)...), repeat(third, 10)...)
		return first[:8], first[8:], second, map[string]string{tn.room: "room1", tn.room2: "room2", third: "room3"}
	}
	soloClient, err := client.New(client.Config{Endpoint: solo.url, APIKey: router})
	require.NoError(t, err)
	a1, a2, b, names := rooms(single)
	reference := runSequence(t, []*client.Client{soloClient}, single.coder.ID, append(append(a1, a2...), b...), names, "solo")
	require.Equal(t, 12, allowedIn(reference[:16]), "6 an hour in each room: %v", outcomes(reference))
	require.Equal(t, 4, allowedIn(reference[16:]), "then 16 an hour for the agent: %v", outcomes(reference))

	// 2. Two replicas of one deployment.
	addrs := []string{freePort(t), freePort(t)}
	peers := []string{"http://" + addrs[0], "http://" + addrs[1]}
	shards, err := shard.New(shard.Config{Peers: peers, Self: peers[0]})
	require.NoError(t, err)
	owner := 0
	if shards.Owner(sharded.org) == peers[1] {
		owner = 1
	}
	other := 1 - owner
	replicaFlags := func(i int) []string {
		return []string{"--no-consumer", "--policy-dir", bundle, "--policy-peers", strings.Join(peers, ","), "--policy-self", peers[i]}
	}
	replicas := make([]*server, 2)
	for i := range replicas {
		replicas[i] = s.serveAt(t, addrs[i], s.group+"-policy-"+string(rune('a'+i)), replicaFlags(i)...)
		knows(t, replicas[i], router, sharded.coder.ID, sharded.room, sharded.room2, thirdRoom(sharded))
	}
	clients := make([]*client.Client, 2)
	for i := range clients {
		clients[i], err = client.New(client.Config{Endpoint: peers[i], Peers: peers, APIKey: router})
		require.NoError(t, err)
	}

	// Hostile: the replica that does not own the organization, asked directly.
	body := []byte(`{"agent":"` + sharded.coder.ID + `","room":"` + sharded.room + `"}`)
	for _, tc := range []struct {
		name, token string
		code        int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"a forged key", "bpk_forged", http.StatusUnauthorized},
		{"a viewer key", viewer, http.StatusForbidden},
		{"another organization's router key", strangerRouter, http.StatusForbidden},
	} {
		req, err := http.NewRequest(http.MethodPost, replicas[other].url+"/v1/decisions/send_message", bytes.NewReader(body))
		require.NoError(t, err)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var raw bytes.Buffer
		_, _ = raw.ReadFrom(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, tc.code, resp.StatusCode, "%s: %s", tc.name, raw.String())
		assert.Empty(t, resp.Header.Get(shard.OwnerHeader), tc.name)
		assert.NotContains(t, raw.String(), addrs[owner], "%s: no owner is named", tc.name)
	}
	for _, token := range []string{router, tenantRouter} {
		for range 3 {
			req, err := http.NewRequest(http.MethodPost, replicas[other].url+"/v1/decisions/send_message", bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			var mis struct{ Code, Owner, Message string }
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&mis))
			_ = resp.Body.Close()
			require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "%+v", mis)
			assert.Equal(t, peers[owner], resp.Header.Get(shard.OwnerHeader))
			assert.Equal(t, "misdirected", mis.Code)
			assert.Equal(t, peers[owner], mis.Owner)
		}
	}
	// Stateless decisions: both replicas answer them.
	for _, srv := range replicas {
		code, _ := srv.do(http.MethodPost, "/v1/decisions/add_participant", router, "application/json",
			[]byte(`{"actor":"`+sharded.coder.ID+`","room":"`+sharded.room+`","participant":"`+sharded.writer.ID+`"}`))
		assert.Equal(t, http.StatusOK, code, srv.url)
	}

	// 3. The sequence, alternately through both, ingest running for the first part.
	a1, a2, b, names = rooms(sharded)
	got := runSequence(t, clients, sharded.coder.ID, a1, names, "a1")
	// The usage of two of the allowed executions settles their reservations.
	isoPost(t, solo, platform, usageOf(t, sharded, got[0], got[3]))
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return countDecided(t, s, sharded.org) == uint64(len(a1)) && countUsage(t, s, sharded.org, "a1-") == 2
	}), "ingest did not store the first decisions and their usage")
	solo.stop() // from here on the decisions (and usage) are in Kafka only
	got = append(got, runSequence(t, clients, sharded.coder.ID, a2, names, "a2")...)
	isoPost(t, replicas[other], platform, usageOf(t, sharded, got[8], got[13]))
	require.True(t, got[0].allow && got[3].allow && got[8].allow && got[13].allow)
	// 12 reserved, 4 settled: 8 open on the owner, none on the other. The reference
	// run's 16, none settled, are held by the owner of its organization: whichever
	// replica it is restored them when it started.
	soloOpen := func(i int) int {
		if shards.Owner(single.org) == peers[i] {
			return allowedIn(reference)
		}
		return 0
	}
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return reservations(t, replicas[owner], metricsKey) == 8+soloOpen(owner)
	}), "the owner holds the open reservations")
	assert.Equal(t, soloOpen(other), reservations(t, replicas[other], metricsKey))
	assert.Equal(t, outcomes(reference[:16]), outcomes(got), "two replicas answer as one")
	for i, c := range clients {
		o, ok := c.Owner(sharded.coder.ID)
		assert.True(t, ok, "client %d learnt the owner", i)
		assert.Equal(t, peers[owner], o)
	}

	// 4. The owner restarts with the same flags: it rebuilds the rates from ClickHouse
	// (the first part) and the topic's tail (the second).
	replicas[owner].stop()
	replicas[owner] = s.serveAt(t, addrs[owner], s.group+"-policy-"+string(rune('a'+owner)), replicaFlags(owner)...)
	restored := restoreLog(t, replicas[owner])
	// The reference run's organization counts too when this replica owns it: the
	// decisions are restored by organization, whichever process took them.
	fromSolo := 0
	if shards.Owner(single.org) == peers[owner] {
		fromSolo = allowedIn(reference)
	}
	assert.Equal(t, 6+fromSolo, restored.FromClickHouse, "the first part's allowed decisions, stored")
	assert.Equal(t, 6, restored.FromTopic, "the second part's, in Kafka only")
	// 4 of the first part's (2 were settled in ClickHouse) and the second part's 6, 2 of
	// which the tail's usage reports then settle.
	assert.Equal(t, 10+soloOpen(owner), restored.Reservations, "the open reservations of both parts")
	assert.Equal(t, 8+soloOpen(owner), reservations(t, replicas[owner], metricsKey), "the restarted owner holds the same open reservations")
	after := runSequence(t, clients, sharded.coder.ID, b, names, "b")
	got = append(got, after...)
	assert.Equal(t, outcomes(reference), outcomes(got), "a restart grants no fresh burst")
	require.Equal(t, 16, allowedIn(got), "%v", outcomes(got))
	// Exact, not only denied: the room's next opening is the same instant before and
	// after the restart. An answer's retry_after counts from the replica's clock when it
	// decided, some instant between the request and the answer (this test's clock, on
	// the same host), rounded up to the millisecond: the opening lies in
	// [sent+retry-1ms, at+retry], and the two answers' spans share it.
	lastBefore, firstAfter := got[7], after[0]
	require.False(t, lastBefore.allow)
	require.False(t, firstAfter.allow)
	assert.Equal(t, "rate_limited", firstAfter.code)
	opens := func(s step) (from, to time.Time) { return s.sent.Add(s.retry - time.Millisecond), s.at.Add(s.retry) }
	beforeFrom, beforeTo := opens(lastBefore)
	afterFrom, afterTo := opens(firstAfter)
	assert.True(t, !afterFrom.After(beforeTo) && !beforeFrom.After(afterTo),
		"room 1 opens in [%s, %s] before the restart, in [%s, %s] after", beforeFrom, beforeTo, afterFrom, afterTo)

	// 5. Every decision audited exactly once, none of the 421s.
	_ = s.serveAt(t, freePort(t), s.group+"-policy-solo", "--policy-dir", bundle) // ingests again: the decisions reach ClickHouse
	require.True(t, stacktest.Eventually(t, 60*time.Second, 300*time.Millisecond, func() bool {
		return countDecided(t, s, sharded.org) >= uint64(len(got))
	}), "ingest did not store the decisions")
	rows, err := s.conn.Query(context.Background(), "SELECT id, any(visitParamExtractBool(data, 'allow')), count() FROM "+s.db+
		".events FINAL WHERE org_id = ? AND type = ? AND visitParamExtractString(data, 'decision') = 'send_message' GROUP BY id",
		sharded.org, schema.TypePolicyDecided)
	require.NoError(t, err)
	stored := map[string]bool{}
	for rows.Next() {
		var id string
		var allow uint8
		var n uint64
		require.NoError(t, rows.Scan(&id, &allow, &n))
		assert.Equal(t, uint64(1), n, "decision %s has one audit event", id)
		stored[id] = allow == 1
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.Len(t, stored, len(got), "one audit event per decision asked, none for the 421s")
	for _, st := range got {
		allow, ok := stored[st.id]
		assert.True(t, ok, "decision %s is in the trail", st.id)
		assert.Equal(t, st.allow, allow, "decision %s", st.id)
	}
	for _, r := range replicas {
		r.alive()
	}
}

// restoreLog is the replica's log line of its restored rates.
func restoreLog(t *testing.T, srv *server) (line struct {
	FromClickHouse int `json:"decisions_from_clickhouse"`
	FromTopic      int `json:"decisions_from_topic"`
	Reservations   int `json:"reservations"`
}) {
	t.Helper()
	// The line is logged before /readyz answers, but exec copies the child's output in
	// its own goroutine: wait for the copy rather than read once.
	var found string
	stacktest.Eventually(t, 10*time.Second, 50*time.Millisecond, func() bool {
		for _, l := range strings.Split(srv.log.String(), "\n") {
			if strings.Contains(l, "message rates restored from the trail") {
				found = l
				return true
			}
		}
		return false
	})
	if found == "" {
		t.Fatalf("%s logged no restore:\n%s", srv.url, srv.log.String())
	}
	require.NoError(t, json.Unmarshal([]byte(found), &line), found)
	return line
}

func thirdRoom(tn *isoTenant) string { return "room_" + tn.name + "_third_" + tn.tag }

// usageOf is a usage report of each step's execution (900 tokens against its estimate
// of 1,000).
func usageOf(t *testing.T, tn *isoTenant, steps ...step) []schema.Event {
	t.Helper()
	var out []schema.Event
	for _, st := range steps {
		ev := tn.event(t, schema.TypeUsageReported, st.rawRoom, tn.coder, nil, schema.UsageData{InputTokens: 800, OutputTokens: 100}, time.Now().UTC())
		ev.ExecutionID = st.exec
		out = append(out, ev)
	}
	return out
}

// countUsage is the number of usage reports of org whose execution id starts with prefix.
func countUsage(t *testing.T, s *stack, org, prefix string) uint64 {
	t.Helper()
	var n uint64
	require.NoError(t, s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".events FINAL WHERE org_id = ? AND type = ? AND startsWith(execution_id, ?)",
		org, schema.TypeUsageReported, prefix).Scan(&n))
	return n
}

// reservations is the bandplane_policy_reservations gauge of srv.
func reservations(t *testing.T, srv *server, operator string) int {
	t.Helper()
	code, b := srv.do(http.MethodGet, "/metrics", operator, "", nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "bandplane_policy_reservations "); ok {
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return int(n)
		}
	}
	t.Fatalf("%s has no bandplane_policy_reservations", srv.url)
	return 0
}

// countDecided is the number of send_message decisions about org in the trail.
func countDecided(t *testing.T, s *stack, org string) uint64 {
	t.Helper()
	var n uint64
	require.NoError(t, s.conn.QueryRow(context.Background(), "SELECT count() FROM "+s.db+".events FINAL WHERE org_id = ? AND type = ?"+
		" AND visitParamExtractString(data, 'decision') = 'send_message'", org, schema.TypePolicyDecided).Scan(&n))
	return n
}
