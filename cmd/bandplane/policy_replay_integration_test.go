package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// rpDecision is the part of a decision answer the replay test reads.
type rpDecision struct {
	DecisionID string `json:"decision_id"`
	Allow      bool   `json:"allow"`
	Reasons    []struct {
		Code string `json:"code"`
	} `json:"reasons"`
}

func (d rpDecision) has(code string) bool {
	for _, r := range d.Reasons {
		if r.Code == code {
			return true
		}
	}
	return false
}

// TestIntegrationPolicyReplay makes decisions of every kind through a real serve (peers,
// adds, a contact request, messages up to and past a rate limit and a hard budget,
// with the directory changing between them), then replays the trail:
//   - with the live bundle: every decision comes back the same (the state each saw is
//     rebuilt exactly);
//   - with a bundle that hides siblings: exactly the sibling peer decisions flip to
//     deny, named by party;
//   - with a lower message rate: exactly the messages above the new rate flip.
func TestIntegrationPolicyReplay(t *testing.T) {
	s := newStack(t)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "platform-router", keys.PlatformOrg, keys.RoleRouter)
	const org = "org-rp"
	manager := s.key(t, "rp-manager", org, keys.RoleManager)
	live := bundleWithQuotas(t, `{"messages_per_window_agent": 3, "messages_per_window_agent_room": 100}`, org)
	operator := s.key(t, "platform-operator", keys.PlatformOrg, keys.RoleOperator)
	// The gate refuses a reload whose bundle flips more than 5 % of the last hour's
	// decisions.
	srv := s.serve(t, "--policy-dir", live, "--policy-max-flip-ratio", "0.05", "--policy-gate-window", "1h",
		"--policy-replay-max-memory", strconv.Itoa(256<<20))
	began := time.Now().UTC()

	at := began.Add(-time.Hour)
	n := 0
	event := func(typ, room string, actor schema.Party, subject *schema.Party, data any) schema.Event {
		n++
		at = at.Add(time.Second)
		raw, err := json.Marshal(data)
		require.NoError(t, err)
		e := schema.Event{ID: fmt.Sprintf("rp-%d", n), Type: typ, Time: at, OrgID: org, RoomID: room, Actor: actor, Subject: subject,
			Source: "replay-test", SchemaVersion: schema.Version, Data: raw}
		require.NoError(t, e.Validate())
		return e
	}
	sys := schema.Party{ID: "router", Type: schema.ActorSystem}
	ola, bo := schema.Party{ID: "u-ola", Type: schema.ActorUser}, schema.Party{ID: "u-bo", Type: schema.ActorUser}
	one, two := schema.Party{ID: "a-one", Type: schema.ActorAgent}, schema.Party{ID: "a-two", Type: schema.ActorAgent}
	three := schema.Party{ID: "a-three", Type: schema.ActorAgent}
	agent := func(p schema.Party, owner schema.Party, handle string) schema.Event {
		return event(schema.TypeAgentRegistered, "", owner, &p, schema.AgentData{Handle: handle, OwnerID: owner.ID, Model: "gpt-5-mini",
			PersonalRegistryAccess: true, Listed: true})
	}
	join := func(room string, p schema.Party) schema.Event {
		return event(schema.TypeParticipantAdded, room, sys, &p, schema.ParticipantData{ParticipantID: p.ID, ParticipantType: schema.ActorAgent})
	}
	directory := []schema.Event{
		event(schema.TypeUserRegistered, "", sys, &ola, schema.UserData{Handle: "ola"}),
		event(schema.TypeUserRegistered, "", sys, &bo, schema.UserData{Handle: "bo"}),
		agent(one, ola, "ola/one"), agent(two, ola, "ola/two"), agent(three, bo, "bo/three"),
		join("room-r", one), join("room-s", three),
	}
	isoPost(t, srv, platform, directory)
	var directoryIDs []string
	for _, e := range directory {
		directoryIDs = append(directoryIDs, e.ID)
	}
	// `budgets set` checks the agent against ClickHouse's directory.
	isoWaitStored(t, s, directoryIDs)

	var ids []string
	decide := func(name string, body map[string]any) rpDecision {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		code, out := srv.do(http.MethodPost, "/v1/decisions/"+name, router, "application/json", b)
		require.Equal(t, http.StatusOK, code, "%s", out)
		var d rpDecision
		require.NoError(t, json.Unmarshal(out, &d), "%s", out)
		require.NotEmpty(t, d.DecisionID, "%s", out)
		ids = append(ids, d.DecisionID)
		return d
	}
	// Each wait polls a decision until the replica has applied what it waits for: the
	// polls are decisions of the trail too, denied at first, and must replay the same.
	require.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return decide("peer_visible", map[string]any{"agent": "a-one", "candidate": "a-two"}).Allow
	}), "the directory reaches the policy replica")
	decide("peer_visible", map[string]any{"agent": "a-one", "candidate": "a-three"})
	decide("peer_visible", map[string]any{"agent": "a-one"})
	decide("peer_visible", map[string]any{"agent": "a-two", "candidate": "a-one"})
	decide("add_participant", map[string]any{"actor": "a-one", "room": "room-r", "participant": "a-two"})
	decide("add_participant", map[string]any{"actor": "a-one", "room": "room-r", "participant": "a-three"})
	decide("contact_request", map[string]any{"from": "a-one", "handle": "@bo/three"})
	decide("contact_request", map[string]any{"from": "a-one", "handle": "@nobody/none"})

	// a-two is not in room-r yet; once the platform adds it, it may post there.
	notYet := decide("send_message", map[string]any{"agent": "a-two", "room": "room-r"})
	require.False(t, notYet.Allow)
	isoPost(t, srv, platform, []schema.Event{join("room-r", two)})
	require.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return decide("send_message", map[string]any{"agent": "a-two", "room": "room-r"}).Allow
	}), "the participant reaches the policy replica")

	// Three messages a minute: the fourth and fifth are refused.
	var rates []rpDecision
	for range 5 {
		rates = append(rates, decide("send_message", map[string]any{"agent": "a-one", "room": "room-r", "tokens": 10}))
	}
	assert.True(t, rates[0].Allow && rates[1].Allow && rates[2].Allow, "%+v", rates)
	assert.True(t, rates[3].has("rate_limited") && rates[4].has("rate_limited"), "%+v", rates)

	// A hard budget of 1,000 tokens a day: the third estimate of 400 is refused.
	code, out, errOut := s.cli(t, "budgets", "set", "--org", org, "--scope", "agent", "--id", "a-three", "--period", "day", "--tokens", "1000", "--mode", "hard", "--by", "ops")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	require.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		a := isoAsk(t, srv, manager, `{ budgets { scopeId } }`)
		return len(a.Errors) == 0 && strings.Contains(string(a.Data), "a-three")
	}), "the budget reaches the policy replica")
	var spends []rpDecision
	for range 3 {
		spends = append(spends, decide("send_message", map[string]any{"agent": "a-three", "room": "room-s", "tokens": 400}))
	}
	assert.True(t, spends[0].Allow && spends[1].Allow, "%+v", spends)
	assert.True(t, spends[2].has("budget_exceeded"), "%+v", spends)

	isoWaitStored(t, s, ids)
	from, to := began.Add(-time.Minute).Format(time.RFC3339Nano), time.Now().UTC().Add(time.Minute).Format(time.RFC3339Nano)
	run := func(bundle string, extra ...string) replay.Result {
		t.Helper()
		code, out, errOut := s.cli(t, append([]string{"policy", "replay", "--bundle", bundle, "--from", from, "--to", to}, extra...)...)
		require.Equal(t, 0, code, "%s", errOut)
		var r replay.Result
		require.NoError(t, json.Unmarshal([]byte(out), &r), "%s", out)
		t.Logf("replay with %s:\n%s", filepath.Base(bundle), errOut)
		return r
	}

	self := run(live)
	assert.Equal(t, len(ids), self.Decisions, "every decision of the range is replayed")
	assert.Equal(t, self.Decisions, self.Unchanged, "the live bundle decides its own decisions the same: %+v", self.Examples)
	assert.Zero(t, self.Approximate)
	for _, k := range []string{"peer_visible", "add_participant", "contact_request", "send_message"} {
		assert.Positive(t, self.ByKind[k].Decisions, k)
	}
	assert.Positive(t, self.ByOrg[org].Decisions)

	// Siblings are no longer peers: the decisions that saw a-one and a-two as siblings
	// flip, and nothing else.
	hide := copyDir(t, live)
	f, err := os.OpenFile(filepath.Join(hide, "peer_visible.rego"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`
candidate_deny contains lib.reason("sibling_hidden", sprintf("%s is only a sibling of %s", [candidate, agent])) if {
	lib.agent_grant(agent, candidate) == "sibling"
}
`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	dropTests(t, hide) // the bundle's own tests expect siblings to be visible
	tight := run(hide, "--kinds", "peer_visible")
	assert.Positive(t, tight.AllowToDeny)
	assert.Zero(t, tight.DenyToAllow)
	assert.Equal(t, tight.AllowToDeny, tight.ByKind["peer_visible"].AllowToDeny)
	require.NotEmpty(t, tight.Examples.AllowToDeny)
	for _, ex := range tight.Examples.AllowToDeny {
		assert.Contains(t, []string{"a-one", "a-two"}, ex.Actor.ID)
		if ex.Other != nil {
			assert.Contains(t, []string{"ola/one", "ola/two"}, ex.Other.Handle, "named by party")
		}
		assert.Equal(t, "sibling_hidden", ex.Candidate.Reasons[0].Code)
	}

	// Two messages a minute instead of three: exactly a-one's third message flips.
	slower := bundleWithQuotas(t, `{"messages_per_window_agent": 2, "messages_per_window_agent_room": 100}`, org)
	rate := run(slower, "--kinds", "send_message", "--org", org)
	assert.Equal(t, 1, rate.AllowToDeny, "%+v", rate.Examples)
	assert.Zero(t, rate.DenyToAllow)
	require.Len(t, rate.Examples.AllowToDeny, 1)
	assert.Equal(t, rates[2].DecisionID, rate.Examples.AllowToDeny[0].DecisionID)
	assert.Equal(t, "rate_limited", rate.Examples.AllowToDeny[0].Candidate.Reasons[0].Code)

	// The same replay as a job of the API: the organization's admin sends the bundle as
	// a tarball and pages the flips; another organization sees none of it.
	admin := s.key(t, "rp-admin", org, keys.RoleAdmin)
	other := s.key(t, "other-admin", "org-other", keys.RoleAdmin)
	var started struct {
		StartPolicyReplay struct{ ID, State, Digest string }
	}
	recAsk(t, srv, admin, `mutation($b: String!, $from: Time, $to: Time) { startPolicyReplay(bundle: $b, from: $from, to: $to) { id state digest } }`,
		map[string]any{"b": tarFS(t, os.DirFS(hide)), "from": from, "to": to}, &started)
	require.NotEmpty(t, started.StartPolicyReplay.ID)
	const replayDoc = `query($id: ID!) { policyReplay(id: $id) { state error decisions progress revision scoped
		result { decisions outOfScope allowToDeny denyToAllow byKind { kind allowToDeny } examples(class: ALLOW_TO_DENY, limit: 1) { decisionId actorHandle otherHandle candidateReasons } } } }`
	type replayAnswer struct {
		PolicyReplay *struct {
			State, Error, Revision string
			Decisions              int
			Scoped                 bool
			Result                 *struct {
				Decisions, OutOfScope, AllowToDeny, DenyToAllow int
				ByKind                                          []struct {
					Kind        string
					AllowToDeny int
				}
				Examples []struct {
					DecisionID, ActorHandle, OtherHandle string
					CandidateReasons                     []string
				}
			}
		}
	}
	var job replayAnswer
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		recAsk(t, srv, admin, replayDoc, map[string]any{"id": started.StartPolicyReplay.ID}, &job)
		return job.PolicyReplay != nil && job.PolicyReplay.State != "RUNNING"
	}), "the replay job finishes")
	require.Equal(t, "DONE", job.PolicyReplay.State, job.PolicyReplay.Error)
	require.NotNil(t, job.PolicyReplay.Result)
	assert.True(t, job.PolicyReplay.Scoped, "an organization's admin replays over its own trail")
	assert.Zero(t, job.PolicyReplay.Result.OutOfScope, "every decision of the scenario reads its own organization's state")
	assert.Equal(t, tight.AllowToDeny, job.PolicyReplay.Result.AllowToDeny, "the job finds what the CLI found")
	assert.Equal(t, self.Decisions, job.PolicyReplay.Result.Decisions, "all of the organization's decisions")
	require.Len(t, job.PolicyReplay.Result.Examples, 1, "a page of one")
	assert.Contains(t, []string{"ola/one", "ola/two"}, job.PolicyReplay.Result.Examples[0].ActorHandle)
	var foreign replayAnswer
	recAsk(t, srv, other, replayDoc, map[string]any{"id": started.StartPolicyReplay.ID}, &foreign)
	assert.Nil(t, foreign.PolicyReplay, "another organization's replay is not found")

	// A candidate whose evaluation allocates without bound, one builtin call at a time
	// (100 KB, then 100 MB, then 1 GB in one replace), is stopped at the replay's memory
	// bound of 256 MiB: the CLI says so, serve's job fails saying so, and serve goes on.
	bomb := copyDir(t, live)
	dropTests(t, bomb)
	f, err = os.OpenFile(filepath.Join(bomb, "peer_visible.rego"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	x100, x1000 := strings.Repeat("x", 100), strings.Repeat("x", 1000)
	_, err = f.WriteString(`
candidate_deny contains lib.reason("bomb", "a string bomb") if {
	count(replace(replace(replace("` + x100 + `", "x", "` + x1000 + `"), "x", "` + x1000 + `"), "x", "xxxxxxxxxx")) < 0
}
`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	code, _, errOut = s.cli(t, "policy", "replay", "--bundle", bomb, "--from", from, "--to", to, "--kinds", "peer_visible",
		"--eval-timeout", "1m", "--max-memory", strconv.Itoa(256<<20))
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "the replay needed more than its memory bound (256 MiB) and was stopped")
	recAsk(t, srv, admin, `mutation($b: String!, $from: Time, $to: Time) { startPolicyReplay(bundle: $b, from: $from, to: $to) { id state digest } }`,
		map[string]any{"b": tarFS(t, os.DirFS(bomb)), "from": from, "to": to}, &started)
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		recAsk(t, srv, admin, replayDoc, map[string]any{"id": started.StartPolicyReplay.ID}, &job)
		return job.PolicyReplay != nil && job.PolicyReplay.State != "RUNNING"
	}), "the bomb's replay job ends")
	assert.Equal(t, "FAILED", job.PolicyReplay.State)
	assert.Contains(t, job.PolicyReplay.Error, "memory bound (256 MiB)")
	health, err := http.Get(srv.url + "/healthz")
	require.NoError(t, err)
	_ = health.Body.Close()
	assert.Equal(t, http.StatusOK, health.StatusCode, "serve outlives the bomb")

	// The gate: the sibling-hiding bundle, shipped into serve's policy folder, flips
	// more than 5 % of the hour's decisions and is refused, audited; the running bundle
	// keeps serving. A change that flips nothing is taken.
	running := decide("peer_visible", map[string]any{"agent": "a-one", "candidate": "a-two"})
	require.True(t, running.Allow)
	original, err := os.ReadFile(filepath.Join(live, "peer_visible.rego"))
	require.NoError(t, err)
	tightened, err := os.ReadFile(filepath.Join(hide, "peer_visible.rego"))
	require.NoError(t, err)
	tests, err := filepath.Glob(filepath.Join(live, "*_test.rego"))
	require.NoError(t, err)
	saved := map[string][]byte{}
	for _, f := range tests {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		saved[f] = b
	}
	dropTests(t, live)
	require.NoError(t, os.WriteFile(filepath.Join(live, "peer_visible.rego"), tightened, 0o644))
	code, body := srv.do(http.MethodPost, "/v1/policy/reload", operator, "", nil)
	assert.Equal(t, http.StatusUnprocessableEntity, code, "%s", body)
	assert.Contains(t, string(body), "above --policy-max-flip-ratio 0.05")
	assert.True(t, decide("peer_visible", map[string]any{"agent": "a-one", "candidate": "a-two"}).Allow, "the running bundle keeps serving")
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		var n uint64
		_ = s.conn.QueryRow(t.Context(), "SELECT count() FROM "+s.db+".events WHERE type = 'policy.reload_refused' AND source = 'bandplane-policy'").Scan(&n)
		return n > 0
	}), "the refusal is in the audit trail")

	require.NoError(t, os.WriteFile(filepath.Join(live, "peer_visible.rego"), append(original, []byte("\n# reviewed\n")...), 0o644))
	for f, b := range saved {
		require.NoError(t, os.WriteFile(f, b, 0o644))
	}
	code, body = srv.do(http.MethodPost, "/v1/policy/reload", operator, "", nil)
	assert.Equal(t, http.StatusOK, code, "a bundle that flips nothing is taken: %s", body)
	srv.alive()
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
	return dst
}

func dropTests(t *testing.T, dir string) {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*_test.rego"))
	require.NoError(t, err)
	for _, m := range matches {
		require.NoError(t, os.Remove(m))
	}
}

// tarFS is a gzipped tar of a bundle's files, base64: what startPolicyReplay takes.
func tarFS(t *testing.T, fsys fs.FS) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	require.NoError(t, fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: p, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	}))
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}
