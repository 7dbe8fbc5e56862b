package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/keys"
)

// fakeAuth knows a fixed set of tokens.
type fakeAuth map[string]keys.Key

func (a fakeAuth) Lookup(_ context.Context, token string) (keys.Key, bool) {
	k, ok := a[token]
	return k, ok
}

// noConn is a connection nothing may use: the requests below are answered before the
// export reads the trail.
type noConn struct{ driver.Conn }

var exportAuth = fakeAuth{
	"compliance-a": {ID: "k1", Org: "org-a", Role: keys.RoleCompliance},
	"admin-a":      {ID: "k2", Org: "org-a", Role: keys.RoleAdmin},
	"viewer-a":     {ID: "k3", Org: "org-a", Role: keys.RoleViewer},
	"operator-p":   {ID: "k4", Org: keys.PlatformOrg, Role: keys.RoleOperator},
	"admin-p":      {ID: "k5", Org: keys.PlatformOrg, Role: keys.RoleAdmin},
}

func exportHandlerForTest(t *testing.T, withKey bool) http.Handler {
	t.Helper()
	keyFile := ""
	if withKey {
		keyFile = filepath.Join(t.TempDir(), "audit.key")
		require.NoError(t, trail.GenerateKey(keyFile))
	}
	x, err := newAuditExporter(noConn{}, "db", "", keyFile, nil, nil)
	require.NoError(t, err)
	require.Equal(t, withKey, x != nil)
	return trail.ExportHandler(exportAuth, x, nil, nil, trail.ExportLimits{})
}

func exportAsk(t *testing.T, h http.Handler, method, token, query string) (int, keys.ErrorBody, http.Header) {
	t.Helper()
	req := httptest.NewRequest(method, "/v1/audit/export?"+query, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var body keys.ErrorBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), "%d %s", rec.Code, rec.Body.String())
	return rec.Code, body, rec.Header()
}

func TestExportHandlerRefuses(t *testing.T) {
	h := exportHandlerForTest(t, true)
	ok := "from=2026-03-01&to=2026-03-02"
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name, method, token, query string
		status                     int
		code, want                 string
	}{
		{"no key", "GET", "", ok, 401, keys.CodeUnauthenticated, "missing API key"},
		{"unknown key", "GET", "nope", ok, 401, keys.CodeUnauthenticated, "unknown or revoked"},
		{"viewer", "GET", "viewer-a", ok, 403, keys.CodeForbidden, "needs one of: compliance, admin"},
		{"operator", "GET", "operator-p", ok, 403, keys.CodeForbidden, "needs one of: compliance, admin"},
		{"post", "POST", "compliance-a", ok, 405, "method_not_allowed", "use GET"},
		{"other org", "GET", "compliance-a", ok + "&org=org-b", 403, keys.CodeForbidden, "may not act on organization org-b"},
		{"every org", "GET", "admin-a", ok + "&org=*", 400, "bad_request", "'*' is not an organization"},
		{"platform without org", "GET", "admin-p", ok, 400, "bad_request", "org: required: a platform key names the organization"},
		{"no range", "GET", "compliance-a", "", 400, "bad_request", "from: required"},
		{"range backwards", "GET", "compliance-a", "from=2026-03-02&to=2026-03-01", 400, "bad_request", "to: must be after from"},
		{"range too long", "GET", "compliance-a", "from=2024-01-01&to=2026-01-01", 400, "bad_request", "spans more than 401 days"},
		{"id too long", "GET", "compliance-a", ok + "&actors=" + long, 400, "bad_request", "actors: a value of 300 bytes is longer than 256 bytes"},
		{"control character", "GET", "compliance-a", ok + "&rooms=a%0Ab", 400, "bad_request", `rooms: "a\nb" has a control character`},
		{"unknown parameter", "GET", "compliance-a", ok + "&type=x", 400, "bad_request", `unknown parameter "type"`},
		{"bad format", "GET", "compliance-a", ok + "&format=xlsx", 400, "bad_request", `format: "xlsx" is not ndjson or csv`},
		{"bad cursor", "GET", "compliance-a", ok + "&as_of=12&after=zzz", 400, "bad_request", "after: malformed cursor"},
		{"cursor without as_of", "GET", "compliance-a", ok + "&after=" + trail.Cursor{}.String(), 400, "bad_request", "after: needs as_of"},
		{"as_of not a size", "GET", "compliance-a", ok + "&as_of=2026-03-02T00:00:00Z", 400, "bad_request", "as_of: want a log size"},
		{"as_of zero", "GET", "compliance-a", ok + "&as_of=0", 400, "bad_request", "as_of: 0 is not the size of a checkpoint"},
		{"as_of twice", "GET", "compliance-a", ok + "&as_of=3&as_of=4", 400, "bad_request", "as_of: given 2 times"},
		{"as_of too large", "GET", "compliance-a", ok + "&as_of=99999999999999999999", 400, "bad_request", "as_of: want a log size"},
		{"too many consistency sizes", "GET", "compliance-a", ok + "&consistency=1,2,3,4,5,6,7,8,9", 400, "bad_request", "consistency: 9 values; at most 8"},
		{"consistency not a size", "GET", "compliance-a", ok + "&consistency=-3", 400, "bad_request", "consistency: want a log size"},
		{"malformed query", "GET", "compliance-a", ok + "&%zz", 400, "bad_request", "malformed query string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, _ := exportAsk(t, h, tc.method, tc.token, tc.query)
			assert.Equal(t, tc.status, status, "%+v", body)
			assert.Equal(t, tc.code, body.Code)
			assert.Contains(t, body.Error, tc.want)
		})
	}
	// Many problems at once, each named.
	many := strings.Repeat("t,", 150)
	status, body, _ := exportAsk(t, h, "GET", "compliance-a", "types="+many+"&format=x")
	assert.Equal(t, 400, status)
	for _, want := range []string{"from: required", "types:", "format:"} {
		assert.Contains(t, body.Error, want)
	}
}

func TestExportHandlerWithoutAuditKey(t *testing.T) {
	h := exportHandlerForTest(t, false)
	status, body, _ := exportAsk(t, h, "GET", "compliance-a", "from=2026-03-01&to=2026-03-02")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, "unavailable", body.Code)
	assert.Contains(t, body.Error, "start it with --audit-key")
	// Authentication still comes first.
	status, _, _ = exportAsk(t, h, "GET", "", "from=2026-03-01&to=2026-03-02")
	assert.Equal(t, http.StatusUnauthorized, status)
	// A key file that is not a private key stops serve at start, and so does an origin
	// prefix a checkpoint cannot have.
	pub := filepath.Join(t.TempDir(), "audit.key")
	require.NoError(t, trail.GenerateKey(pub))
	_, err := newAuditExporter(noConn{}, "db", "", pub+".pub", nil, nil)
	assert.ErrorContains(t, err, "is a public key")
	_, err = newAuditExporter(noConn{}, "db", "has space", pub, nil, nil)
	assert.ErrorContains(t, err, "--audit-origin")
}

func TestExportCLIRefuses(t *testing.T) {
	dir := t.TempDir()
	done := filepath.Join(dir, "done.ndjson")
	require.NoError(t, os.WriteFile(done, []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cut.ndjson.part"), []byte("x"), 0o600))
	sizeless := filepath.Join(dir, "sizeless.checkpoint")
	require.NoError(t, os.WriteFile(sizeless, []byte("bandplane/db/org/a\nx\nAAAA\n\n— bandplane/db AAAA\n"), 0o600))
	var nineCheckpoints []string
	for range 9 {
		nineCheckpoints = append(nineCheckpoints, "--checkpoint", sizeless)
	}
	keyFile := filepath.Join(dir, "audit.key")
	require.NoError(t, trail.GenerateKey(keyFile))
	t.Setenv("BANDPLANE_KEY", "")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no out", []string{"audit", "export", "--key", "k"}, 1, "--out is required"},
		{"no key", []string{"audit", "export", "--out", filepath.Join(dir, "a")}, 1, "no API key"},
		{"bad server", []string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k", "--server", "ftp://x"}, 1, "is not an http(s) URL"},
		{"no range", []string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k"}, 1, "from: required"},
		{"bad as-of", []string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--as-of", "now"}, 1, "--as-of: want a log size"},
		{"missing checkpoint", []string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--checkpoint", filepath.Join(dir, "nope")}, 1, "--checkpoint: open"},
		{"not a checkpoint", []string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--checkpoint", done}, 1, "is not a checkpoint"},
		{"checkpoint of no size", []string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--checkpoint", sizeless}, 1, `its second line "x" is not a tree size`},
		{"too many checkpoints", append([]string{"audit", "export", "--out", filepath.Join(dir, "a"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02"}, nineCheckpoints...), 1, "--checkpoint: 9 given; at most 8"},
		{"exists", []string{"audit", "export", "--out", done, "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02"}, 1, "exists: remove it"},
		{"part exists", []string{"audit", "export", "--out", filepath.Join(dir, "cut.ndjson"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02"}, 1, "--resume continues it"},
		{"nothing to resume", []string{"audit", "export", "--out", filepath.Join(dir, "none"), "--key", "k", "--resume"}, 1, "no interrupted export"},
		{"resume garbage", []string{"audit", "export", "--out", filepath.Join(dir, "cut.ndjson"), "--key", "k", "--resume"}, 1, "holds no complete header"},
		{"resume as another format", []string{"audit", "export", "--out", filepath.Join(dir, "cut.ndjson"), "--key", "k", "--resume", "--format", "csv"}, 1, "is a ndjson export, not csv"},
		{"server down", []string{"audit", "export", "--out", filepath.Join(dir, "b"), "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--server", "http://127.0.0.1:1"}, 1, "cannot reach"},
		{"verify export with --org", []string{"audit", "verify", "--export", done, "--audit-key", keyFile + ".pub", "--org", "o"}, 1, "--org: not with --export"},
		{"verify missing export", []string{"audit", "verify", "--export", filepath.Join(dir, "nope"), "--audit-key", filepath.Join(dir, "k")}, 1, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := bandplane(t, tc.args...)
			assert.Equal(t, tc.code, code, stderr)
			assert.Contains(t, stderr, tc.want)
		})
	}
	assert.NoFileExists(t, filepath.Join(dir, "b.part"), "a failed start leaves no file")

	// verify --export on files that are no export: exit 1, the problem named.
	for _, content := range []string{"", "garbage\n", `{"kind":"header"}` + "\n", strings.Repeat("{", 1000)} {
		f := filepath.Join(dir, "bad.ndjson")
		require.NoError(t, os.WriteFile(f, []byte(content), 0o600))
		code, stdout, stderr := bandplane(t, "audit", "verify", "--export", f, "--audit-key", keyFile+".pub")
		assert.Equal(t, 1, code, "%q: %s", content, stderr)
		var rep trail.ExportReport
		lastLine(t, stdout, &rep)
		assert.NotEmpty(t, rep.Problems, "%q", content)
	}
	code, _, stderr := bandplane(t, "audit", "verify", "--export", dir, "--audit-key", keyFile+".pub")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "is not a regular file")
}

// A busy server (429) is asked again after its Retry-After, within exportBusyWait, and
// then the CLI gives up with the server's answer; a hostile Retry-After (huge, negative,
// not a number) is bounded.
func TestExportCLIWaitsForABusyServer(t *testing.T) {
	defer func(d time.Duration) { exportBusyWait = d }(exportBusyWait)
	exportBusyWait = 2500 * time.Millisecond
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/audit/checkpoint" {
			_, _ = w.Write([]byte(testNote))
			return
		}
		asked.Add(1)
		w.Header().Set("Retry-After", "1")
		keys.WriteError(w, http.StatusTooManyRequests, "too_many_requests", "an export of this key is running already")
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "busy.ndjson")
	code, _, stderr := bandplane(t, "audit", "export", "--out", out, "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--server", srv.URL)
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "the server is busy (429); asking again in 1s")
	assert.Contains(t, stderr, "the server answered 429 (too_many_requests): an export of this key is running already")
	assert.GreaterOrEqual(t, asked.Load(), int32(3), "asked again after each Retry-After")
	// Within the bound: each wait is the Retry-After or what is left of the 2.5 s, and
	// the ask after the bound is the last, so at most at 0, 1, 2 and 2.5 s, however slow.
	assert.LessOrEqual(t, asked.Load(), int32(4), "asked again past the bound")

	for v, want := range map[string]time.Duration{"": time.Second, "abc": time.Second, "-5": time.Second, "0": time.Second,
		"7": 7 * time.Second, "99999999999999999999": time.Second, "3600": 30 * time.Second} {
		assert.Equal(t, want, retryAfter(v), "Retry-After %q", v)
	}
}

// testNote is a checkpoint note as GET /v1/audit/checkpoint serves it (the CLI reads
// only its size).
const testNote = "bandplane/db/org/org-a\n42\nAAAA\n\n— bandplane/db AAAA\n"

// A new export proves consistency with the checkpoint the server serves, read first
// (one request, no retries), unless --checkpoint or --as-of says what to prove; what
// the checkpoint endpoint answers instead of a note stops the export, saying why.
func TestExportCLISendsTheServedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	held := filepath.Join(dir, "held.checkpoint")
	require.NoError(t, os.WriteFile(held, []byte(strings.Replace(testNote, "\n42\n", "\n17\n", 1)), 0o600))
	type asked struct{ path, query string }
	var (
		mu     sync.Mutex
		log    []asked
		answer func(w http.ResponseWriter)
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		log = append(log, asked{r.URL.Path, r.URL.RawQuery})
		mu.Unlock()
		if r.URL.Path == "/v1/audit/checkpoint" {
			answer(w)
			return
		}
		keys.WriteError(w, http.StatusConflict, "conflict", "stop here")
	}))
	defer srv.Close()
	note := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(testNote))
	}
	run := func(t *testing.T, args ...string) (string, []asked) {
		t.Helper()
		mu.Lock()
		log = nil
		mu.Unlock()
		out := filepath.Join(t.TempDir(), "x.ndjson")
		code, _, stderr := bandplane(t, append([]string{"audit", "export", "--out", out, "--key", "k", "--from", "2026-01-01", "--to", "2026-01-02", "--server", srv.URL, "--quiet"}, args...)...)
		assert.Equal(t, 1, code, stderr)
		assert.NoFileExists(t, out+".part", "a refused start leaves no file")
		mu.Lock()
		defer mu.Unlock()
		return stderr, slices.Clone(log)
	}
	query := func(t *testing.T, a asked) url.Values {
		t.Helper()
		q, err := url.ParseQuery(a.query)
		require.NoError(t, err)
		return q
	}

	answer = note
	stderr, got := run(t)
	assert.Contains(t, stderr, "stop here")
	require.Len(t, got, 2, "%+v", got)
	assert.Equal(t, asked{"/v1/audit/checkpoint", ""}, got[0], "the key's own organization")
	assert.Equal(t, "/v1/audit/export", got[1].path)
	assert.Equal(t, []string{"42"}, query(t, got[1])["consistency"])

	_, got = run(t, "--org", "org-b")
	require.Len(t, got, 2)
	assert.Equal(t, asked{"/v1/audit/checkpoint", "org=org-b"}, got[0])
	assert.Equal(t, []string{"42"}, query(t, got[1])["consistency"])

	_, got = run(t, "--checkpoint", held)
	require.Len(t, got, 1, "the held checkpoint instead: %+v", got)
	assert.Equal(t, []string{"17"}, query(t, got[0])["consistency"])

	_, got = run(t, "--as-of", "12")
	require.Len(t, got, 1, "an export pinned again is the same export: %+v", got)
	assert.Empty(t, query(t, got[0])["consistency"])
	assert.Equal(t, "12", query(t, got[0]).Get("as_of"))

	for name, tc := range map[string]struct {
		answer func(w http.ResponseWriter)
		want   string
	}{
		"rolled back": {func(w http.ResponseWriter) {
			keys.WriteError(w, http.StatusConflict, "conflict", "the checkpoints topic has a checkpoint of 16 leaves for organization \"org-a\", ClickHouse's log only 10: rolled back")
		}, "cannot read the checkpoint the server serves (GET /v1/audit/checkpoint), which the export proves its log extends: the server answered 409 (conflict): the checkpoints topic has a checkpoint of 16 leaves"},
		"nothing sealed": {func(w http.ResponseWriter) {
			keys.WriteError(w, http.StatusNotFound, "not_found", "org-a: not in the log")
		}, "the server answered 404 (not_found): org-a: not in the log"},
		"not bandplane":            {func(w http.ResponseWriter) { http.Error(w, "bad gateway", http.StatusBadGateway) }, "the server answered 502: bad gateway"},
		"a platform key's listing": {func(w http.ResponseWriter) { keys.WriteJSON(w, http.StatusOK, []string{}) }, "--org: required with a platform key"},
		"not a note":               {func(w http.ResponseWriter) { _, _ = w.Write([]byte("hello\nworld\n!\n")) }, `the server's answer is not a checkpoint: its second line "world" is not a tree size`},
		"too long":                 {func(w http.ResponseWriter) { _, _ = w.Write([]byte(strings.Repeat("x", 20<<10))) }, "the answer is larger than a checkpoint"},
	} {
		t.Run(name, func(t *testing.T) {
			answer = tc.answer
			stderr, got := run(t)
			assert.Contains(t, stderr, tc.want)
			assert.Len(t, got, 1, "no export asked for: %+v", got)
		})
	}
}
