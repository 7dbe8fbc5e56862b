package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
)

type fakeProducer struct {
	mu     sync.Mutex
	events []schema.Event
	err    error
}

func (p *fakeProducer) Produce(_ context.Context, evs []schema.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	p.events = append(p.events, evs...)
	return nil
}

func collect(t *testing.T, prod *fakeProducer, maxBody int64, token, body string) (int, ingest.CollectorResponse) {
	t.Helper()
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: prod, Token: "s3cret", MaxBodyBytes: maxBody})
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	var resp ingest.CollectorResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp), rec.Body.String())
	return rec.Code, resp
}

func sharedFrames(t *testing.T) []string {
	b, err := os.ReadFile("../schema/testdata/band/frames.ndjson")
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestCollectorAcceptsValidLinesAndReportsEachRejected(t *testing.T) {
	frames := sharedFrames(t)
	body := strings.Join([]string{
		frames[0],
		`{"topic":"chat_room:r1","event":"message_created"`, // line 2: malformed
		frames[5],
		``, // blank lines are skipped
		`{"id":"x","type":"usage.reported","time":"yesterday","actor":{"id":"a","type":"agent"},"source":"t","data":{}}`, // line 5
	}, "\n")
	prod := &fakeProducer{}
	code, resp := collect(t, prod, 0, "s3cret", body)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, 2, resp.Accepted)
	assert.Equal(t, 2, resp.Rejected)
	require.Len(t, resp.Errors, 2)
	assert.Equal(t, 2, resp.Errors[0].Line)
	assert.Contains(t, resp.Errors[0].Reason, "invalid JSON")
	assert.Equal(t, 5, resp.Errors[1].Line)
	assert.Contains(t, resp.Errors[1].Reason, "time")
	require.Len(t, prod.events, 2)
	assert.Equal(t, "message.created", prod.events[0].Type)
	assert.Equal(t, "event.tool_call", prod.events[1].Type)
}

func TestCollectorAcceptsAJSONArray(t *testing.T) {
	frames := sharedFrames(t)
	prod := &fakeProducer{}
	code, resp := collect(t, prod, 0, "s3cret", "["+strings.Join(frames, ",")+"]")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, len(frames), resp.Accepted)
	assert.Zero(t, resp.Rejected)
}

func TestCollectorErrors(t *testing.T) {
	frames := sharedFrames(t)
	for _, tc := range []struct {
		name, token, body string
		maxBody           int64
		prodErr           error
		code              int
		contains          string
	}{
		{"no token", "", frames[0], 0, nil, http.StatusUnauthorized, "bearer token"},
		{"wrong token", "nope", frames[0], 0, nil, http.StatusUnauthorized, "bearer token"},
		{"too large", "s3cret", frames[0], 10, nil, http.StatusRequestEntityTooLarge, "larger than 10 bytes"},
		{"all invalid", "s3cret", "{}\n[1]", 0, nil, http.StatusBadRequest, ""},
		{"kafka down", "s3cret", frames[0], 0, errors.New("broker unreachable"), http.StatusServiceUnavailable, "broker unreachable"},
		{"bad array", "s3cret", "[1,", 0, nil, http.StatusBadRequest, "not a JSON array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prod := &fakeProducer{err: tc.prodErr}
			code, resp := collect(t, prod, tc.maxBody, tc.token, tc.body)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, resp.Error, tc.contains)
			assert.Empty(t, prod.events)
		})
	}
}
