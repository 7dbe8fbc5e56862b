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

var exportAuth = tokens{"compliance-a": {ID: "k1", Org: "org-a", Role: keys.RoleCompliance}}

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

// Every export slot taken, or an export of the same key running, is 429 with
// Retry-After.
func TestExportHandlerBusy(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	require.NoError(t, GenerateKey(keyFile))
	key, err := LoadPrivateKey(keyFile)
	require.NoError(t, err)
	x, err := NewExporter(ExportConfig{Conn: unusedConn{}, Database: "db", Key: key})
	require.NoError(t, err)
	h := &exportHandler{x: x, log: slog.New(slog.DiscardHandler), slots: make(chan struct{}, MaxConcurrentExports)}
	for range MaxConcurrentExports {
		h.slots <- struct{}{} // every slot taken by a running export
	}
	status, body, hdr := askExport(t, keys.Require(exportAuth, keys.RoleCompliance, keys.RoleAdmin)(h), "GET", "compliance-a", "from=2026-03-01&to=2026-03-02")
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, "too_many_requests", body.Code)
	assert.Equal(t, "10", hdr.Get("Retry-After"))

	// One export at a time per key, whatever slots are free.
	h = &exportHandler{x: x, log: slog.New(slog.DiscardHandler), slots: make(chan struct{}, MaxConcurrentExports),
		running: map[string]bool{exportAuth["compliance-a"].ID: true}}
	status, body, _ = askExport(t, keys.Require(exportAuth, keys.RoleCompliance, keys.RoleAdmin)(h), "GET", "compliance-a", "from=2026-03-01&to=2026-03-02")
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Contains(t, body.Error, "one at a time per key")
}
