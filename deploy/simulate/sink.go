package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sink takes the simulator's lines: one event a line, each a complete JSON object
// without a trailing newline (a platform frame or a canonical event).
//
// Contract:
//   - Send blocks until every line of the batch is accepted by the destination (for
//     Kafka: acknowledged by the brokers; for a collector: answered 2xx with nothing
//     rejected), or returns an error. On error the caller treats the whole batch as not
//     sent; the sink may have delivered part of it, so delivery is at-least-once and
//     the events' ids make a re-delivery idempotent downstream.
//   - Send honours ctx: it returns promptly, with an error, once ctx is done.
//   - Run calls Send from one goroutine at a time and never modifies a line after
//     handing it over, so a sink may keep the slices.
//   - Lines are in order, and a sink must keep the order of lines of one room (the
//     Kafka producer keys by room).
type Sink interface {
	Send(ctx context.Context, lines [][]byte) error
}

// SinkFunc adapts a function to a Sink.
type SinkFunc func(ctx context.Context, lines [][]byte) error

// Send calls f.
func (f SinkFunc) Send(ctx context.Context, lines [][]byte) error { return f(ctx, lines) }

// HTTPSink posts batches as NDJSON to a collector: `POST <URL>/v1/events` with
// `Authorization: Bearer <Token>` and `Content-Type: application/x-ndjson`. The
// collector answers `{"accepted": n, "rejected": m, "errors": [{"line": k, "reason": "…"}]}`
// (line numbers 1-based). A non-2xx answer, or one with rejected > 0, is an error
// (*CollectorError) naming the count and the first reason. 5xx and 429 answers and
// connection errors are retried with exponential backoff; 4xx answers and rejected
// lines are not (sending them again would not help).
type HTTPSink struct {
	URL   string // the collector's base URL, e.g. http://localhost:8088
	Token string // bearer token; no Authorization header when empty
	// Client sends the requests; nil means a client with a 30 s timeout.
	Client *http.Client
	// MaxAttempts bounds the tries of one batch; 0 means 5.
	MaxAttempts int
	// Backoff is the first wait between tries, doubled after each up to MaxBackoff;
	// 0 means 200 ms. A Retry-After header in seconds overrides it (up to MaxBackoff).
	Backoff time.Duration
	// MaxBackoff caps a wait; 0 means 5 s.
	MaxBackoff time.Duration
}

// NewHTTPSink returns an HTTPSink with the default client and retry policy.
func NewHTTPSink(url, token string) *HTTPSink {
	return &HTTPSink{URL: url, Token: token}
}

// CollectorResponse is the collector's answer to a batch.
type CollectorResponse struct {
	Accepted int                `json:"accepted"`
	Rejected int                `json:"rejected"`
	Errors   []CollectorLineErr `json:"errors,omitempty"`
}

// CollectorLineErr is one rejected line.
type CollectorLineErr struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

// CollectorError is a batch the collector did not accept in full.
type CollectorError struct {
	StatusCode int
	Lines      int // lines in the batch
	Response   CollectorResponse
	Body       string // the answer's start, when it was not the JSON above
}

func (e *CollectorError) Error() string {
	var b strings.Builder
	if e.StatusCode/100 == 2 {
		fmt.Fprintf(&b, "collector rejected %d of %d lines", e.Response.Rejected, e.Lines)
	} else {
		fmt.Fprintf(&b, "collector answered %d %s for %d lines", e.StatusCode, http.StatusText(e.StatusCode), e.Lines)
		if e.Response.Rejected > 0 {
			fmt.Fprintf(&b, " (%d rejected)", e.Response.Rejected)
		}
	}
	if len(e.Response.Errors) > 0 {
		fmt.Fprintf(&b, "; first: line %d: %s", e.Response.Errors[0].Line, e.Response.Errors[0].Reason)
	} else if e.Body != "" {
		fmt.Fprintf(&b, ": %s", e.Body)
	}
	return b.String()
}

// retryable reports whether a status is worth another try.
func retryable(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests
}

// Send implements Sink.
func (s *HTTPSink) Send(ctx context.Context, lines [][]byte) error {
	if len(lines) == 0 {
		return nil
	}
	var body bytes.Buffer
	for _, l := range lines {
		body.Write(l)
		body.WriteByte('\n')
	}
	attempts := s.MaxAttempts
	if attempts <= 0 {
		attempts = 5
	}
	wait := s.Backoff
	if wait <= 0 {
		wait = 200 * time.Millisecond
	}
	maxWait := s.MaxBackoff
	if maxWait <= 0 {
		maxWait = 5 * time.Second
	}
	var lastErr error
	for attempt := 1; ; attempt++ {
		retryAfter, retry, err := s.post(ctx, body.Bytes(), len(lines))
		if err == nil {
			return nil
		}
		lastErr = err
		if !retry || ctx.Err() != nil {
			return err
		}
		if attempt >= attempts {
			return fmt.Errorf("after %d attempts: %w", attempt, lastErr)
		}
		d := min(wait, maxWait)
		if retryAfter > 0 {
			d = min(retryAfter, maxWait)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr) //nolint:errorlint // the run ended by its context; the last error is text, so that callers see only ctx's kind
		case <-t.C:
		}
		wait *= 2
	}
}

// post makes one try; it returns the Retry-After the server asked for, if any, and
// whether a failure is worth another try.
func (s *HTTPSink) post(ctx context.Context, body []byte, n int) (time.Duration, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(s.URL, "/")+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Accept", "application/json")
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
	client := s.Client
	if client == nil {
		client = defaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, true, err // connection error
	}
	defer resp.Body.Close() //nolint:errcheck // the body is read below; closing it loses nothing
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, true, fmt.Errorf("reading the collector's answer: %w", err)
	}
	var retryAfter time.Duration
	if v, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && v > 0 {
		retryAfter = time.Duration(v) * time.Second
	}
	ce := &CollectorError{StatusCode: resp.StatusCode, Lines: n}
	jsonErr := json.Unmarshal(raw, &ce.Response)
	if resp.StatusCode/100 != 2 {
		if jsonErr != nil {
			ce.Response = CollectorResponse{}
		}
		if len(ce.Response.Errors) == 0 {
			ce.Body = snippet(raw)
		}
		return retryAfter, retryable(resp.StatusCode), ce
	}
	if jsonErr != nil {
		ce.Body = snippet(raw)
		return 0, false, fmt.Errorf("collector answered %d with an unreadable body: %w: %s", resp.StatusCode, jsonErr, ce.Body)
	}
	if ce.Response.Rejected > 0 {
		return 0, false, ce
	}
	if ce.Response.Accepted != n {
		return 0, false, fmt.Errorf("collector accepted %d of %d lines without rejecting any", ce.Response.Accepted, n)
	}
	return 0, false, nil
}

var defaultClient = &http.Client{Timeout: 30 * time.Second}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
