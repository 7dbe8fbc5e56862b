package graph_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema/keys"
)

// fakeReplays keeps one finished job of org-a and records what it was asked.
type fakeReplays struct {
	gotOrg     string
	gotTarball []byte
	gotFrom    time.Time
	gotTo      time.Time
}

var finishedReplay = replay.Job{ID: "replay-1", Org: "org-a", Scoped: true, State: replay.JobDone, Result: &replay.Result{
	Counts: replay.Counts{Decisions: 3, AllowToDeny: 3},
	Examples: struct {
		AllowToDeny   []replay.Example `json:"allow_to_deny"`
		DenyToAllow   []replay.Example `json:"deny_to_allow"`
		ReasonChanged []replay.Example `json:"reason_changed"`
	}{AllowToDeny: []replay.Example{
		{DecisionID: "d-1", Actor: replay.Party{ID: "a-1"}, Candidate: replay.Answer{Reasons: []policy.Reason{{Code: "hidden"}}}},
		{DecisionID: "d-2", Actor: replay.Party{ID: "a-1"}},
		{DecisionID: "d-3", Actor: replay.Party{ID: "a-1"}},
	}},
}}

func (f *fakeReplays) Start(_ keys.Key, org string, tarball []byte, from, to time.Time) (replay.Job, error) {
	f.gotOrg, f.gotTarball, f.gotFrom, f.gotTo = org, tarball, from, to
	return replay.Job{ID: "replay-2", Org: org, State: replay.JobRunning, From: from, To: to}, nil
}

func (f *fakeReplays) Get(by keys.Key, org, id string) (replay.Job, bool) {
	if id != finishedReplay.ID || (org != finishedReplay.Org && !by.Platform()) {
		return replay.Job{}, false
	}
	return finishedReplay, true
}

func TestPolicyReplayFields(t *testing.T) {
	fr := &fakeReplays{}
	ks := fakeKeys{
		"tok-a-admin":   {ID: "k-a-admin", Org: "org-a", Role: keys.RoleAdmin},
		"tok-a-manager": {ID: "k-a-mgr", Org: "org-a", Role: keys.RoleManager},
	}
	// A body limit above the default, as an operator may set it: the bundle's own bound
	// still holds.
	h := graph.NewHandler(&fakeQuerier{}, ks, graph.WithPolicyReplays(fr), graph.WithLimits(graph.Limits{MaxBodyBytes: 4 << 20}))
	tarball := base64.StdEncoding.EncodeToString([]byte("a tarball"))

	// Happy: an organization's admin starts a replay of its own decisions (the last 24
	// hours by default) and pages the examples of a finished one.
	a := ask(t, h, "tok-a-admin", `mutation { startPolicyReplay(bundle: "`+tarball+`") { id state orgId } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `{"id":"replay-2","state":"RUNNING","orgId":"org-a"}`, string(a.Data["startPolicyReplay"]))
	assert.Equal(t, "org-a", fr.gotOrg)
	assert.Equal(t, "a tarball", string(fr.gotTarball))
	assert.Equal(t, 24*time.Hour, fr.gotTo.Sub(fr.gotFrom))
	a = ask(t, h, "tok-a-admin", `{ policyReplay(id: "replay-1") { state result { allowToDeny examples(class: ALLOW_TO_DENY, offset: 1, limit: 1) { decisionId } } } }`)
	require.Empty(t, a.Errors)
	assert.JSONEq(t, `{"state":"DONE","result":{"allowToDeny":3,"examples":[{"decisionId":"d-2"}]}}`, string(a.Data["policyReplay"]))
	a = ask(t, h, "tok-a-admin", `{ policyReplay(id: "replay-9") { id } }`)
	require.Empty(t, a.Errors)
	assert.Equal(t, "null", string(a.Data["policyReplay"]), "no job of that id")

	// Hostile: wrong role, another tenant, every tenant, a bundle too big or not base64,
	// a page out of range.
	tooBig := strings.Repeat("A", base64.StdEncoding.EncodedLen(replay.MaxTarballBytes+4))
	for name, tc := range map[string]struct{ token, q, code, msg string }{
		"manager starts":           {"tok-a-manager", `mutation { startPolicyReplay(bundle: "` + tarball + `") { id } }`, "FORBIDDEN", "needs one of admin"},
		"manager reads":            {"tok-a-manager", `{ policyReplay(id: "replay-1") { id } }`, "FORBIDDEN", "needs one of admin"},
		"another tenant's replay":  {"tok-a-admin", `mutation { startPolicyReplay(orgId: "org-b", bundle: "` + tarball + `") { id } }`, "FORBIDDEN", `may not read organization "org-b"`},
		"every tenant's replay":    {"tok-a-admin", `mutation { startPolicyReplay(orgId: "*", bundle: "` + tarball + `") { id } }`, "FORBIDDEN", ""},
		"another tenant's job":     {"tok-a-admin", `{ policyReplay(orgId: "org-b", id: "replay-1") { id } }`, "FORBIDDEN", ""},
		"bundle too big":           {"tok-a-admin", `mutation { startPolicyReplay(bundle: "` + tooBig + `") { id } }`, "BAD_USER_INPUT", "more than the 1048576 bytes a bundle's tarball may have"},
		"bundle not base64":        {"tok-a-admin", `mutation { startPolicyReplay(bundle: "not base64!") { id } }`, "BAD_USER_INPUT", "not base64"},
		"examples limit too big":   {"tok-a-admin", `{ policyReplay(id: "replay-1") { result { examples(class: ALLOW_TO_DENY, limit: 101) { decisionId } } } }`, "BAD_USER_INPUT", "limit: must be between 1 and 100"},
		"examples offset negative": {"tok-a-admin", `{ policyReplay(id: "replay-1") { result { examples(class: ALLOW_TO_DENY, offset: -1) { decisionId } } } }`, "BAD_USER_INPUT", "offset: must be >= 0"},
	} {
		a := ask(t, h, tc.token, tc.q)
		assert.Equal(t, tc.code, code(a), "%s: %+v", name, a.Errors)
		if tc.msg != "" && len(a.Errors) > 0 {
			assert.Contains(t, a.Errors[0].Message, tc.msg, name)
		}
	}
	assert.NotEqual(t, "not base64!", string(fr.gotTarball), "a refused bundle never reaches the jobs")

	// Without the replay service: UNAVAILABLE.
	off := graph.NewHandler(&fakeQuerier{}, ks)
	assert.Equal(t, "UNAVAILABLE", code(ask(t, off, "tok-a-admin", `{ policyReplay(id: "replay-1") { id } }`)))
}
