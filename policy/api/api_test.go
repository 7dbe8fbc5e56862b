package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
)

type fakeAuditor struct {
	mu     sync.Mutex
	events []schema.Event
	err    error
}

func (f *fakeAuditor) Produce(_ context.Context, evs []schema.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.events = append(f.events, evs...)
	return nil
}

func newAPI(t *testing.T, aud *fakeAuditor, mod func(*api.Config)) (*api.API, *policy.Engine) {
	t.Helper()
	ctx := context.Background()
	snap, err := policy.LoadDirectoryFile("../testdata/directory.json")
	require.NoError(t, err)
	dir := policy.NewDirectory()
	require.NoError(t, dir.Load(ctx, snap))
	eng, err := policy.New(ctx, policy.Config{Directory: dir})
	require.NoError(t, err)
	cfg := api.Config{Engine: eng, Token: "t", OperatorToken: "op"}
	if aud != nil {
		cfg.Auditor = aud
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := api.New(cfg)
	require.NoError(t, err)
	return a, eng
}

func call(t *testing.T, h http.Handler, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
	return rec.Code, out
}

func TestDecisionIsAnsweredAndAudited(t *testing.T) {
	aud := &fakeAuditor{}
	a, eng := newAPI(t, aud, nil)
	code, d := call(t, a, "POST", "/v1/decisions/add_participant", "t",
		`{"actor":"a-architect","room":"room-webhook-retries","participant":"a-reviewer"}`)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, true, d["allow"], "a sibling may be added: %v", d)
	assert.NotEmpty(t, d["decision_id"])
	assert.Equal(t, eng.Revision(), d["policy_revision"])
	assert.NotNil(t, d["reasons"])

	require.Len(t, aud.events, 1)
	ev := aud.events[0]
	assert.Equal(t, d["decision_id"], ev.ID, "the audit event's id is the decision id")
	assert.Equal(t, schema.TypePolicyDecided, ev.Type)
	assert.Equal(t, "org-acme", ev.OrgID)
	assert.NoError(t, ev.Validate(), "the audit event must pass the ingest contract")
	var data api.DecidedData
	require.NoError(t, json.Unmarshal(ev.Data, &data))
	assert.True(t, data.Allow)
	assert.Len(t, data.InputDigest, 64)
	assert.Equal(t, "add_participant", data.Decision)
}

func TestDecisionDeniesAndExplains(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	code, d := call(t, a, "POST", "/v1/decisions/add_participant", "t",
		`{"actor":"a-architect","room":"room-webhook-retries","participant":"a-hidden"}`)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, false, d["allow"])
	reasons := d["reasons"].([]any)
	require.NotEmpty(t, reasons)
	assert.NotEmpty(t, reasons[0].(map[string]any)["code"])
}

func TestAuditFailureFailsClosedUnlessConfigured(t *testing.T) {
	body := `{"actor":"a-architect","room":"room-webhook-retries","participant":"a-reviewer"}`
	a, _ := newAPI(t, &fakeAuditor{err: errors.New("kafka down")}, nil)
	_, d := call(t, a, "POST", "/v1/decisions/add_participant", "t", body)
	assert.Equal(t, false, d["allow"], "a grant without an audit record is a deny")
	assert.Contains(t, mustJSON(d["reasons"]), "audit_unavailable")

	a, _ = newAPI(t, &fakeAuditor{err: errors.New("kafka down")}, func(c *api.Config) {
		c.FailOpen = map[string]bool{policy.AddParticipant: true}
	})
	_, d = call(t, a, "POST", "/v1/decisions/add_participant", "t", body)
	assert.Equal(t, true, d["allow"], "configured to fail open")
}

func TestPeersListsVisiblePeersNotInTheRoom(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	code, d := call(t, a, "GET", "/v1/peers?agent=a-architect&room=room-webhook-retries", "t", "")
	require.Equal(t, http.StatusOK, code)
	peers := map[string]map[string]any{}
	for _, p := range d["peers"].([]any) {
		pm := p.(map[string]any)
		peers[pm["id"].(string)] = pm
	}
	assert.Contains(t, peers, "a-reviewer", "sibling")
	assert.NotContains(t, peers, "a-coder", "already in the room")
	assert.NotContains(t, peers, "u-alice", "owner already in the room")
	assert.Contains(t, peers, "a-search", "global agent")
	for id, p := range peers {
		assert.Contains(t, p, "is_contact", id)
		assert.NotEmpty(t, p["reason"], id)
	}
}

func TestBadRequests(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	for _, tc := range []struct {
		name, path, token, body string
		code                    int
		contains                string
	}{
		{"no token", "/v1/decisions/add_participant", "", `{}`, 401, "bearer"},
		{"unknown decision", "/v1/decisions/launch_rockets", "t", `{}`, 404, "unknown decision"},
		{"missing fields", "/v1/decisions/add_participant", "t", `{"actor":"a"}`, 400, "missing room, participant"},
		{"unknown field", "/v1/decisions/send_message", "t", `{"agent":"a","rooom":"r"}`, 400, "rooom"},
		{"negative tokens", "/v1/decisions/send_message", "t", `{"agent":"a","tokens":-1}`, 400, "negative"},
		{"not json", "/v1/decisions/contact_request", "t", `nope`, 400, "cannot decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := call(t, a, "POST", tc.path, tc.token, tc.body)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, out["error"], tc.contains)
		})
	}
}

func TestSuspendTakesEffectAndIsAudited(t *testing.T) {
	aud := &fakeAuditor{}
	a, _ := newAPI(t, aud, nil)
	body := `{"agent":"a-coder","room":"room-webhook-retries"}`
	_, d := call(t, a, "POST", "/v1/decisions/send_message", "t", body)
	require.Equal(t, true, d["allow"], "%v", d)

	code, _ := call(t, a, "POST", "/v1/agents/a-coder/suspend", "t", `{"reason":"too chatty"}`)
	assert.Equal(t, http.StatusUnauthorized, code, "the decision token is not an operator token")
	code, out := call(t, a, "POST", "/v1/agents/a-coder/suspend", "op", `{"reason":"too chatty"}`)
	require.Equal(t, http.StatusOK, code, "%v", out)

	_, d = call(t, a, "POST", "/v1/decisions/send_message", "t", body)
	assert.Equal(t, false, d["allow"], "the next decision sees the suspension")
	var types []string
	for _, ev := range aud.events {
		types = append(types, ev.Type)
		assert.NoError(t, ev.Validate())
	}
	assert.Contains(t, types, schema.TypeAgentUpdated)
	assert.Contains(t, types, schema.TypeAgentControl, "the routing core is told to stop the agent")

	code, _ = call(t, a, "POST", "/v1/agents/a-coder/resume", "op", ``)
	require.Equal(t, http.StatusOK, code)
	_, d = call(t, a, "POST", "/v1/decisions/send_message", "t", body)
	assert.Equal(t, true, d["allow"])

	code, _ = call(t, a, "POST", "/v1/agents/nobody/suspend", "op", ``)
	assert.Equal(t, http.StatusNotFound, code)
}

func TestReloadRefusesABadBundleAndKeepsServing(t *testing.T) {
	dir := t.TempDir()
	copyBundle(t, dir)
	a, eng := newAPI(t, &fakeAuditor{}, func(c *api.Config) { c.BundleDir = dir })
	before := eng.Revision()

	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.rego"), []byte("package bandplane\nthis is not rego"), 0o644))
	code, out := call(t, a, "POST", "/v1/policy/reload", "op", "")
	assert.Equal(t, http.StatusUnprocessableEntity, code)
	assert.NotEmpty(t, out["error"])
	assert.Equal(t, before, eng.Revision(), "the old revision keeps serving")

	require.NoError(t, os.Remove(filepath.Join(dir, "broken.rego")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "extra.rego"), []byte("package bandplane.extra\n\nx := 1\n"), 0o644))
	code, out = call(t, a, "POST", "/v1/policy/reload", "op", "")
	require.Equal(t, http.StatusOK, code, "%v", out)
	assert.NotEqual(t, before, out["policy_revision"])
	assert.Equal(t, out["policy_revision"], eng.Revision())
}

func copyBundle(t *testing.T, dst string) {
	t.Helper()
	src := policy.DefaultBundle()
	entries, err := fsReadDir(src)
	require.NoError(t, err)
	for name, b := range entries {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dst, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dst, name), b, 0o644))
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
