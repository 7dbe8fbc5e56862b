package ingest

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/bandplane/bandplane/schema"
)

// Producer puts canonical events on the events topic. Produce blocks until every
// in-sync replica has acknowledged all of them, or returns an error (then some may have
// been written; retrying the whole call is harmless because ids are idempotency keys).
type Producer interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// Reject is one input line that was refused, and why.
type Reject struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

// DecodeLines decodes and validates each line (a platform frame or a canonical event).
// Line numbers start at 1; blank lines are skipped but counted.
func DecodeLines(lines [][]byte) ([]schema.Event, []Reject) {
	events := make([]schema.Event, 0, len(lines))
	var rejects []Reject
	for i, l := range lines {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		ev, err := schema.Decode(l)
		if err != nil {
			rejects = append(rejects, Reject{Line: i + 1, Reason: err.Error()})
			continue
		}
		events = append(events, ev)
	}
	return events, rejects
}

// ProducerSink sends lines the way the collector does, without HTTP: decode, validate,
// produce. The simulator uses it to write to Kafka directly.
type ProducerSink struct{ Producer Producer }

func (s ProducerSink) Send(ctx context.Context, lines [][]byte) error {
	events, rejects := DecodeLines(lines)
	if len(rejects) > 0 {
		return fmt.Errorf("%d of %d lines are invalid; first: line %d: %s", len(rejects), len(lines), rejects[0].Line, rejects[0].Reason)
	}
	return s.Producer.Produce(ctx, events)
}

// CollectorConfig configures the HTTP collector.
type CollectorConfig struct {
	Producer     Producer
	Token        string // bearer token clients must send
	MaxBodyBytes int64
	Logger       *slog.Logger
	Metrics      *Metrics
}

func (c *CollectorConfig) Validate() error {
	var errs []error
	if c.Producer == nil {
		errs = append(errs, errors.New("collector: no producer"))
	}
	if c.Token == "" {
		errs = append(errs, errors.New("collector: no bearer token (--collector-token or BANDPLANE_COLLECTOR_TOKEN)"))
	}
	return errors.Join(errs...)
}

// Collector serves POST /v1/events: a JSON array or NDJSON of canonical events or
// platform frames. Valid lines are produced to Kafka; the answer counts accepted and
// rejected lines and gives each rejected line's reason. A request is all-or-nothing
// towards Kafka only in the sense that a produce failure answers 503 and the client
// retries the whole request, which event ids make harmless.
type Collector struct {
	cfg CollectorConfig
	log *slog.Logger
}

func NewCollector(cfg CollectorConfig) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Collector{cfg: cfg, log: cfg.Logger.With("component", "collector")}, nil
}

// CollectorResponse is the JSON answer of POST /v1/events.
type CollectorResponse struct {
	Accepted int      `json:"accepted"`
	Rejected int      `json:"rejected"`
	Errors   []Reject `json:"errors,omitempty"`
	Error    string   `json:"error,omitempty"`
}

const maxListedRejects = 1000

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (c *Collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, CollectorResponse{Error: "use POST"})
		return
	}
	auth := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(c.cfg.Token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="bandplane"`)
		writeJSON(w, http.StatusUnauthorized, CollectorResponse{Error: "missing or wrong bearer token"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeJSON(w, http.StatusRequestEntityTooLarge, CollectorResponse{Error: fmt.Sprintf("request body is larger than %d bytes; send smaller batches", c.cfg.MaxBodyBytes)})
			return
		}
		writeJSON(w, http.StatusBadRequest, CollectorResponse{Error: "cannot read request body: " + err.Error()})
		return
	}
	lines, err := splitBody(body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, CollectorResponse{Error: err.Error()})
		return
	}
	events, rejects := DecodeLines(lines)
	resp := CollectorResponse{Accepted: len(events), Rejected: len(rejects), Errors: rejects}
	if len(resp.Errors) > maxListedRejects {
		resp.Errors = resp.Errors[:maxListedRejects]
	}
	c.cfg.Metrics.CollectorLines.WithLabelValues("rejected").Add(float64(len(rejects)))
	if len(events) > 0 {
		if err := c.cfg.Producer.Produce(r.Context(), events); err != nil {
			c.cfg.Metrics.CollectorErrors.Inc()
			c.log.Error("cannot produce collected events", "err", err, "events", len(events))
			writeJSON(w, http.StatusServiceUnavailable, CollectorResponse{Rejected: len(rejects), Errors: resp.Errors,
				Error: "cannot write to kafka, nothing from this request is guaranteed stored; retry: " + err.Error()})
			return
		}
		c.cfg.Metrics.CollectorLines.WithLabelValues("accepted").Add(float64(len(events)))
	}
	status := http.StatusOK
	if len(events) == 0 && len(rejects) > 0 {
		status = http.StatusBadRequest
	}
	writeJSON(w, status, resp)
}

// splitBody returns the lines of an NDJSON body, or the elements of a JSON array (each
// element counts as one line, numbered from 1).
func splitBody(body []byte) ([][]byte, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var elems []json.RawMessage
		if err := json.Unmarshal(trimmed, &elems); err != nil {
			return nil, fmt.Errorf("body starts with '[' but is not a JSON array: %v", err)
		}
		out := make([][]byte, len(elems))
		for i, e := range elems {
			out[i] = e
		}
		return out, nil
	}
	return bytes.Split(body, []byte("\n")), nil
}
