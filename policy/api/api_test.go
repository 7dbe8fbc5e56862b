package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/bandplane/bandplane/schema/keys"
)

type fakeAuditor struct {
	mu     sync.Mutex
	events []schema.Event
	err    error
}

func (f *fakeAuditor) eventsOf(typ string) []schema.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []schema.Event
	for _, ev := range f.events {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
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
	cfg := api.Config{Engine: eng, Auth: testKeys}
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

// fakeKeys is a key store: a token maps to its key.
type fakeKeys map[string]keys.Key

func (f fakeKeys) Lookup(_ context.Context, token string) (keys.Key, bool) {
	k, ok := f[token]
	return k, ok
}

var testKeys = fakeKeys{
	"t":          {ID: "k-router", Org: keys.PlatformOrg, Role: keys.RoleRouter},
	"op":         {ID: "k-op", Org: keys.PlatformOrg, Role: keys.RoleOperator, Name: "on-call"},
	"acme-op":    {ID: "k-acme-op", Org: "org-acme", Role: keys.RoleOperator},
	"acme-admin": {ID: "k-acme-admin", Org: "org-acme", Role: keys.RoleAdmin},
	"other-op":   {ID: "k-other-op", Org: "org-other", Role: keys.RoleOperator},
	"acme-route": {ID: "k-acme-router", Org: "org-acme", Role: keys.RoleRouter},
	"other-rt":   {ID: "k-other-router", Org: "org-other", Role: keys.RoleRouter},
	"viewer":     {ID: "k-viewer", Org: keys.PlatformOrg, Role: keys.RoleViewer},
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
		{"no key", "/v1/decisions/add_participant", "", `{}`, 401, "API key"},
		{"unknown key", "/v1/decisions/add_participant", "nope", `{}`, 401, "unknown"},
		{"wrong role", "/v1/decisions/add_participant", "viewer", `{}`, 403, "router"},
		{"operator is no router", "/v1/decisions/add_participant", "op", `{}`, 403, "router"},
		{"unknown decision", "/v1/decisions/launch_rockets", "t", `{}`, 404, "unknown decision"},
		{"missing fields", "/v1/decisions/add_participant", "t", `{"actor":"a"}`, 400, "missing room, participant"},
		{"unknown field", "/v1/decisions/send_message", "t", `{"agent":"a","rooom":"r"}`, 400, "rooom"},
		{"negative tokens", "/v1/decisions/send_message", "t", `{"agent":"a","tokens":-1}`, 400, "negative"},
		{"not json", "/v1/decisions/contact_request", "t", `nope`, 400, "cannot decode"},
		{"empty body", "/v1/decisions/contact_request", "t", ``, 400, "body is empty"},
		{"blank body", "/v1/decisions/contact_request", "t", " \n", 400, "body is empty"},
		{"trailing data", "/v1/decisions/contact_request", "t", `{"from":"a"} {"from":"b"}`, 400, "after top-level value"},
		{"trailing brace", "/v1/decisions/contact_request", "t", `{"from":"a"}}`, 400, "after top-level value"},
		{"duplicate key", "/v1/decisions/contact_request", "t", `{"from":"a","from":"b"}`, 400, "duplicate"},
		{"deep", "/v1/decisions/contact_request", "t", strings.Repeat("[", 5000) + strings.Repeat("]", 5000), 400, "deeper"},
		{"long id", "/v1/decisions/send_message", "t", `{"agent":"` + strings.Repeat("a", 300) + `"}`, 400, "more than 256"},
		{"control char", "/v1/decisions/send_message", "t", `{"agent":"a\u0000b"}`, 400, "control character"},
		{"too large", "/v1/decisions/send_message", "t", `{"agent":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "larger than"},
		{"org key for another org's agent", "/v1/decisions/send_message", "other-rt", `{"agent":"a-coder","room":"r"}`, 403, "only about agents registered in its organization"},
		{"org key for an unknown agent: the same answer", "/v1/decisions/send_message", "other-rt", `{"agent":"a-nobody","room":"r"}`, 403, "only about agents registered in its organization"},
		{"org key for peers of another org", "/v1/peers?agent=a-coder", "other-rt", ``, 403, "only about agents registered in its organization"},
		{"peers long id", "/v1/peers?agent=" + strings.Repeat("a", 300), "t", ``, 400, "more than 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if strings.HasPrefix(tc.path, "/v1/peers") {
				method = "GET"
			}
			code, out := call(t, a, method, tc.path, tc.token, tc.body)
			assert.Equal(t, tc.code, code, "%v", out)
			assert.Contains(t, out["error"], tc.contains)
			assert.NotEmpty(t, out["code"], "every error carries a code")
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
	assert.Equal(t, http.StatusForbidden, code, "a router key is not an operator key")
	code, out := call(t, a, "POST", "/v1/agents/a-coder/suspend", "other-op", `{"reason":"too chatty"}`)
	assert.Equal(t, http.StatusNotFound, code, "another organization's operator: as if the agent did not exist")
	_, unknown := call(t, a, "POST", "/v1/agents/a-nobody/suspend", "other-op", ``)
	assert.Equal(t, strings.ReplaceAll(fmt.Sprint(unknown["error"]), "a-nobody", "a-coder"), fmt.Sprint(out["error"]), "no existence oracle")
	assert.NotContains(t, fmt.Sprint(out["error"]), "org-acme", "the agent's organization is not named")
	for _, bad := range []string{`{"reason":`, `{"why":"x"}`, `{"reason":"` + strings.Repeat("x", 2000) + `"}`, `{"reason":"a"} {}`} {
		code, out := call(t, a, "POST", "/v1/agents/a-coder/suspend", "op", bad)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %v", bad, out)
	}
	_, d = call(t, a, "POST", "/v1/decisions/send_message", "t", body)
	require.Equal(t, true, d["allow"], "refused requests change nothing: %v", d)
	assert.Empty(t, aud.eventsOf(schema.TypeAgentSuspended))

	code, out = call(t, a, "POST", "/v1/agents/a-coder/suspend", "acme-op", `{"reason":"too chatty"}`)
	require.Equal(t, http.StatusOK, code, "%v", out)

	_, d = call(t, a, "POST", "/v1/decisions/send_message", "t", body)
	assert.Equal(t, false, d["allow"], "the next decision sees the suspension")
	for _, ev := range aud.events {
		assert.NoError(t, ev.Validate())
	}
	susp := aud.eventsOf(schema.TypeAgentSuspended)
	require.Len(t, susp, 1)
	assert.Equal(t, "k-acme-op", susp[0].Actor.ID, "the operator's key is the actor")
	assert.Equal(t, "a-coder", susp[0].Subject.ID)
	assert.Equal(t, "org-acme", susp[0].OrgID)
	assert.True(t, schema.OwnType(susp[0].Type) && schema.OwnSource(susp[0].Source), "nobody else may write it")
	assert.Contains(t, string(susp[0].Data), "too chatty")
	assert.Len(t, aud.eventsOf(schema.TypeAgentControl), 1, "the routing core is told to stop the agent")
	assert.Empty(t, aud.eventsOf(schema.TypeAgentUpdated), "the registration is the platform's: the operator does not write it")

	code, _ = call(t, a, "POST", "/v1/agents/a-coder/resume", "acme-admin", ``)
	require.Equal(t, http.StatusOK, code)
	_, d = call(t, a, "POST", "/v1/decisions/send_message", "t", body)
	assert.Equal(t, true, d["allow"])
	assert.Len(t, aud.eventsOf(schema.TypeAgentResumed), 1)

	code, _ = call(t, a, "POST", "/v1/agents/nobody/suspend", "op", ``)
	assert.Equal(t, http.StatusNotFound, code)
}

func TestResumeThatCannotBeAuditedIsUndone(t *testing.T) {
	aud := &fakeAuditor{}
	a, eng := newAPI(t, aud, nil)
	code, _ := call(t, a, "POST", "/v1/agents/a-coder/suspend", "op", ``)
	require.Equal(t, http.StatusOK, code)
	aud.err = errors.New("kafka down")
	code, out := call(t, a, "POST", "/v1/agents/a-coder/resume", "op", ``)
	assert.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	ag, _ := eng.Directory().Agent("a-coder")
	assert.True(t, ag.IsSuspended(), "no unaudited resume")
}

func TestPeersAnswersAlwaysCarryTheList(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	code, d := call(t, a, "GET", "/v1/peers?agent=nobody", "t", "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, []any{}, d["peers"], "an empty list is [], not absent: %v", d)
	code, d = call(t, a, "POST", "/v1/decisions/peer_visible", "t", `{"agent":"nobody"}`)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, []any{}, d["peers"], "%v", d)
}

func TestReloadNeedsAPlatformKey(t *testing.T) {
	a, _ := newAPI(t, &fakeAuditor{}, nil)
	code, out := call(t, a, "POST", "/v1/policy/reload", "acme-admin", "")
	assert.Equal(t, http.StatusForbidden, code, "%v", out)
	code, _ = call(t, a, "POST", "/v1/policy/reload", "t", "")
	assert.Equal(t, http.StatusForbidden, code, "router")
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
