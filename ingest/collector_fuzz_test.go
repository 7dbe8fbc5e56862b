package ingest_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
)

// FuzzCollector posts arbitrary bodies with a platform or an organization's key: the
// handler never panics, answers one of its statuses with a JSON body that adds up, and
// whatever it produces is a valid event the key may write — never one of bandplane's
// own types, never another organization's. `make fuzz` runs it.
func FuzzCollector(f *testing.F) {
	if b, err := os.ReadFile("../schema/testdata/band/frames.ndjson"); err == nil {
		f.Add(string(b), false)
		f.Add("["+strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", ",")+"]", true)
	}
	f.Add(canonical("e1", "org-acme", "agent-acme"), true)
	f.Add(canonical("e2", "org-other", "agent-other"), true)
	f.Add(strings.Repeat("[", 100)+strings.Repeat("]", 100), false)
	f.Add(`{"id":"a","id":"b","type":"message.created"}`, false)
	f.Add(`{"id":"x","type":"policy.decided","time":"2026-03-01T10:00:00Z","actor":{"id":"a"},"source":"s"}`, false)
	f.Add("[\"\\ud800\"]", true)
	f.Add("", false)
	prod := &fakeProducer{}
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: prod, Auth: collectorKeys, Now: func() time.Time { return now },
		Registrations: registrations{"agent-acme": "org-acme", "agent-other": "org-other"}, MaxBodyBytes: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string, orgKey bool) {
		token := "s3cret"
		if orgKey {
			token = "acme"
		}
		prod.mu.Lock()
		prod.events = nil
		prod.mu.Unlock()
		req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
		var resp ingest.CollectorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatalf("answer is not JSON: %v: %s", err, rec.Body)
		}
		prod.mu.Lock()
		events := prod.events
		prod.mu.Unlock()
		if resp.Accepted != len(events) {
			t.Fatalf("accepted %d, produced %d", resp.Accepted, len(events))
		}
		if rec.Code == http.StatusOK && resp.Accepted == 0 {
			t.Fatalf("200 with nothing accepted: %s", rec.Body)
		}
		for _, ev := range events {
			b, _ := json.Marshal(&ev)
			again, err := schema.Decode(b)
			if err != nil {
				t.Fatalf("produced an event ingest refuses: %v: %s", err, b)
			}
			if again.ID != ev.ID || again.Type != ev.Type {
				t.Fatalf("produced event changes when decoded again: %s", b)
			}
			if schema.OwnType(ev.Type) || schema.OwnSource(ev.Source) {
				t.Fatalf("produced one of bandplane's own events: %s", b)
			}
			if orgKey && (ev.OrgID != "org-acme" || schema.PlatformOnlyType(ev.Type)) {
				t.Fatalf("an organization's key wrote %s", b)
			}
		}
	})
}
