package trail

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/keys"
)

// tokens is an Authenticator of a fixed set of tokens.
type tokens map[string]keys.Key

func (a tokens) Lookup(_ context.Context, token string) (keys.Key, bool) {
	k, ok := a[token]
	return k, ok
}

var exportAuth = tokens{
	"compliance-a": {ID: "k1", Org: "org-a", Role: keys.RoleCompliance},
	"platform":     {ID: "k-platform", Org: keys.PlatformOrg, Role: keys.RoleAdmin},
}

// unusedConn is a connection nothing may use: the requests below are refused before
// the export reads the trail.
type unusedConn struct{ driver.Conn }

func askExport(t *testing.T, h http.Handler, method, token, query string) (int, keys.ErrorBody, http.Header) {
	t.Helper()
	req := httptest.NewRequest(method, "/v1/audit/export?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var body keys.ErrorBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), "%d %s", rec.Code, rec.Body.String())
	return rec.Code, body, rec.Header()
}

// An export over its key's, its organization's or the tenants' share is 429 with
// Retry-After, naming the share; the platform's keys keep a place of their own.
func TestExportHandlerBusy(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	require.NoError(t, GenerateKey(keyFile))
	key, err := LoadPrivateKey(keyFile)
	require.NoError(t, err)
	x, err := NewExporter(ExportConfig{Conn: unusedConn{}, Database: "db", Key: key})
	require.NoError(t, err)
	ask := func(h *exportHandler, token string) (int, keys.ErrorBody, http.Header) {
		return askExport(t, keys.Require(exportAuth, keys.RoleCompliance, keys.RoleAdmin)(h), "GET", token, "from=2026-03-01&to=2026-03-02&org=org-a")
	}
	busy := func(h *exportHandler, token, want string) {
		t.Helper()
		status, body, hdr := ask(h, token)
		assert.Equal(t, http.StatusTooManyRequests, status)
		assert.Equal(t, "too_many_requests", body.Code)
		assert.Equal(t, "10", hdr.Get("Retry-After"))
		assert.Contains(t, body.Error, want)
	}

	h := &exportHandler{x: x, log: slog.New(slog.DiscardHandler), slots: newExportSlots(ExportLimits{})}
	_, refused := h.slots.Take("org-a", "k1") // an export of the key is running
	require.Nil(t, refused)
	busy(h, "compliance-a", "1 exports of this key are running, the most one key runs at once (--max-exports-per-key)")

	h = &exportHandler{x: x, log: slog.New(slog.DiscardHandler), slots: newExportSlots(ExportLimits{})}
	for _, k := range []string{"k2", "k3"} { // two of the organization's other keys
		_, refused := h.slots.Take("org-a", k)
		require.Nil(t, refused)
	}
	busy(h, "compliance-a", "2 exports of organization org-a are running, the most one organization runs at once (--max-exports-per-org)")

	h = &exportHandler{x: x, log: slog.New(slog.DiscardHandler), slots: newExportSlots(ExportLimits{})}
	for _, org := range []string{"org-b", "org-c", "org-d"} { // tenants hold 3 of 4
		_, refused := h.slots.Take(org, org+"-key")
		require.Nil(t, refused)
	}
	busy(h, "compliance-a", "3 exports of organizations are running, the most this server runs at once (--max-exports)")

	// The bounds are serve's flags.
	h = &exportHandler{x: x, log: slog.New(slog.DiscardHandler), slots: newExportSlots(ExportLimits{Total: 8, PerOrg: 3, PerKey: 2})}
	for _, k := range []string{"k2", "k2", "k3"} {
		_, refused := h.slots.Take("org-a", k)
		require.Nil(t, refused)
	}
	busy(h, "compliance-a", "3 exports of organization org-a are running")
	_, refused = h.slots.Take(keys.PlatformOrg, "k-platform")
	assert.Nil(t, refused, "the fourth is the platform's")
}
