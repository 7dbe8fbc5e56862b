package simulate

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// collector is a fake collector: it checks the request, then answers with fn.
func collector(t *testing.T, fn func(n int, lines []string) (int, any)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		assert.Equal(t, http.MethodPost, r.Method)
		assert.Equal(t, "/v1/events", r.URL.Path)
		assert.Equal(t, "Bearer s3cret", r.Header.Get("Authorization"))
		assert.Equal(t, "application/x-ndjson", r.Header.Get("Content-Type"))
		var lines []string
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		status, body := fn(int(calls.Load()), lines)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if s, ok := body.(string); ok {
			_, _ = io.WriteString(w, s)
			return
		}
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

var twoLines = [][]byte{[]byte(`{"a":1}`), []byte(`{"b":2}`)}

func TestHTTPSinkSuccess(t *testing.T) {
	var got []string
	srv, calls := collector(t, func(_ int, lines []string) (int, any) {
		got = lines
		return http.StatusOK, CollectorResponse{Accepted: len(lines)}
	})
	s := NewHTTPSink(srv.URL+"/", "s3cret")
	require.NoError(t, s.Send(context.Background(), twoLines))
	assert.Equal(t, []string{`{"a":1}`, `{"b":2}`}, got)
	assert.EqualValues(t, 1, calls.Load())
	require.NoError(t, s.Send(context.Background(), nil)) // nothing to send: no request
	assert.EqualValues(t, 1, calls.Load())
}

func TestHTTPSinkRejected(t *testing.T) {
	srv, calls := collector(t, func(_ int, lines []string) (int, any) {
		return http.StatusOK, CollectorResponse{Accepted: 1, Rejected: 1,
			Errors: []CollectorLineErr{{Line: 2, Reason: "type: missing"}}}
	})
	s := NewHTTPSink(srv.URL, "s3cret")
	err := s.Send(context.Background(), twoLines)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rejected 1 of 2 lines")
	assert.Contains(t, err.Error(), "line 2: type: missing")
	var ce *CollectorError
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, 1, ce.Response.Rejected)
	assert.EqualValues(t, 1, calls.Load(), "rejected lines are not retried")
}

func TestHTTPSink4xxNotRetried(t *testing.T) {
	srv, calls := collector(t, func(_ int, lines []string) (int, any) {
		return http.StatusUnauthorized, `{"error":"bad token"}`
	})
	s := NewHTTPSink(srv.URL, "s3cret")
	err := s.Send(context.Background(), twoLines)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "401")
	assert.Contains(t, err.Error(), "bad token")
	assert.EqualValues(t, 1, calls.Load())

	// 400 with the collector's JSON: the first reason is named.
	srv2, _ := collector(t, func(_ int, lines []string) (int, any) {
		return http.StatusBadRequest, CollectorResponse{Rejected: 2, Errors: []CollectorLineErr{{Line: 1, Reason: "not JSON"}}}
	})
	err = NewHTTPSink(srv2.URL, "s3cret").Send(context.Background(), twoLines)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "400")
	assert.Contains(t, err.Error(), "2 rejected")
	assert.Contains(t, err.Error(), "line 1: not JSON")
}

func TestHTTPSinkRetries503(t *testing.T) {
	srv, calls := collector(t, func(call int, lines []string) (int, any) {
		if call < 3 {
			return http.StatusServiceUnavailable, "overloaded"
		}
		return http.StatusAccepted, CollectorResponse{Accepted: len(lines)}
	})
	s := &HTTPSink{URL: srv.URL, Token: "s3cret", Backoff: time.Millisecond}
	require.NoError(t, s.Send(context.Background(), twoLines))
	assert.EqualValues(t, 3, calls.Load())
}

func TestHTTPSinkGivesUp(t *testing.T) {
	srv, calls := collector(t, func(int, []string) (int, any) {
		return http.StatusBadGateway, "upstream down"
	})
	s := &HTTPSink{URL: srv.URL, Token: "s3cret", Backoff: time.Millisecond, MaxAttempts: 3}
	err := s.Send(context.Background(), twoLines)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "after 3 attempts")
	assert.Contains(t, err.Error(), "502")
	assert.Contains(t, err.Error(), "upstream down")
	assert.EqualValues(t, 3, calls.Load())
}

func TestHTTPSinkConnectionErrorRetried(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	s := &HTTPSink{URL: url, Token: "s3cret", Backoff: time.Millisecond, MaxAttempts: 2}
	err := s.Send(context.Background(), twoLines)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "after 2 attempts")
}

func TestHTTPSinkHonoursContext(t *testing.T) {
	srv, _ := collector(t, func(int, []string) (int, any) {
		return http.StatusServiceUnavailable, "busy"
	})
	s := &HTTPSink{URL: srv.URL, Token: "s3cret", Backoff: time.Hour, MaxAttempts: 10}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// A backoff that ignored ctx would hold Send for the hour, past the test's timeout.
	err := s.Send(ctx, twoLines)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Run through an HTTPSink end to end against a fake collector.
func TestRunThroughHTTPSink(t *testing.T) {
	var total atomic.Int64
	srv, _ := collector(t, func(_ int, lines []string) (int, any) {
		total.Add(int64(len(lines)))
		return http.StatusOK, CollectorResponse{Accepted: len(lines)}
	})
	cfg := testConfig(700)
	cfg.BatchSize = 200
	s, err := Run(context.Background(), cfg, NewHTTPSink(srv.URL, "s3cret"), nil)
	require.NoError(t, err)
	assert.Equal(t, 700, s.Events)
	assert.EqualValues(t, 700, total.Load())
}
