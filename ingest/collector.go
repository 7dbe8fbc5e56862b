package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
)

// Producer puts canonical events on the events topic. Produce blocks until every
// in-sync replica has acknowledged all of them, or returns an error (then some may have
// been written; retrying the whole call is harmless because ids are idempotency keys).
type Producer interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// MessageProducer is Producer for events the caller has encoded already (the collector
// encodes each line once, to hold it to the message limit). *kafka.Producer implements
// both.
type MessageProducer interface {
	ProduceMessages(ctx context.Context, msgs []kafkago.Message) error
}

// Registrations says which organization an agent or a person is registered in; the
// collector reads it to keep an organization's key from writing as another
// organization's party. *directory.Directory implements it (its trail view).
type Registrations interface {
	OrgOf(id string) (org string, known bool)
}

// Reject is one input line that was refused, and why.
type Reject struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

// DecodeLines decodes and validates each line (a platform frame or a canonical event),
// as the platform's: frame ids are in schema.PlatformWriter's scope. Line numbers start
// at 1; blank lines are skipped but counted.
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
// produce. The simulator uses it to write to Kafka directly (as the routing core would:
// with the rights of a platform key).
type ProducerSink struct{ Producer Producer }

func (s ProducerSink) Send(ctx context.Context, lines [][]byte) error {
	events, rejects := DecodeLines(lines)
	if len(rejects) > 0 {
		return fmt.Errorf("%d of %d lines are invalid; first: line %d: %s", len(rejects), len(lines), rejects[0].Line, rejects[0].Reason)
	}
	return s.Producer.Produce(ctx, events)
}

// Defaults of the collector's limits (serve's flags).
const (
	DefaultMaxBodyBytes = 16 << 20
	// DefaultMaxOTLPBodyBytes is the OpenTelemetry Collector's own default message
	// limit (4 MiB).
	DefaultMaxOTLPBodyBytes = 4 << 20
	DefaultMaxLines         = 100_000
	DefaultMaxConcurrent    = 8
	// Uploads: bodies being read. One key reads at most 2 at once, one
	// organization's keys 4, all tenants 12 of 16 (the platform's keys, the routing
	// core's, keep 4).
	DefaultMaxUploads       = 16
	DefaultMaxUploadsPerOrg = 4
	DefaultMaxUploadsPerKey = 2
	DefaultMaxEventAge      = 400 * 24 * time.Hour // the events retention (bandplane retention --events)
	DefaultMaxClockSkew     = time.Hour
)

// CollectorConfig configures the HTTP collector.
type CollectorConfig struct {
	Producer MessageProducer
	// Auth authenticates every request; the key needs the ingest role.
	Auth keys.Authenticator
	// Registrations refuses lines of an organization's key whose actor or subject is
	// registered in another organization. Without it, organizations' keys may not write
	// at all (only platform keys). RegistrationsReady, when set, says whether
	// Registrations has loaded: until it has, an organization's request is answered 503.
	Registrations      Registrations
	RegistrationsReady func() bool
	// Bindings names the directory agent an OTLP sender identity is bound to; without
	// it every span is stored unattributed.
	Bindings Bindings
	// OTLPContent stores the prompts, completions and tool arguments OTLP spans carry
	// (off: dropped, as they are often personal data).
	OTLPContent bool
	// MaxOTLPBodyBytes bounds an OTLP request, after gunzip, and an OTLP/gRPC message
	// (default DefaultMaxOTLPBodyBytes): pdata's model of it is up to some 30 times
	// its size. OTLPStreamTimeout bounds an OTLP/gRPC stream, as --read-timeout an
	// HTTP request (default 60 s); OTLPIdleTimeout closes an idle gRPC connection
	// (default 120 s).
	MaxOTLPBodyBytes                   int64
	OTLPStreamTimeout, OTLPIdleTimeout time.Duration
	MaxBodyBytes                       int64 // default DefaultMaxBodyBytes; larger bodies are answered 413
	MaxLines                           int   // events per request (default DefaultMaxLines); more: 413
	// MaxUploads bounds the request bodies being read at once (default
	// DefaultMaxUploads), MaxUploadsPerOrg and MaxUploadsPerKey those of one
	// organization's keys and of one key; a quarter of MaxUploads is the platform's
	// keys' only. A request over its share is answered 429 at once: a body that
	// trickles in holds its own key's place, never another tenant's. With the body limit
	// they bound the memory of what is being read.
	MaxUploads, MaxUploadsPerOrg, MaxUploadsPerKey int
	// MaxConcurrent bounds the bodies, read whole, decoded and produced at once (default
	// DefaultMaxConcurrent); others wait for a slot, which none holds while a client
	// sends.
	MaxConcurrent int
	// MaxEventBytes bounds one encoded event (default kafka.MaxEventBytes): a larger
	// line is a line error, never a request-wide 503.
	MaxEventBytes int
	// Events older than MaxEventAge or more than MaxClockSkew in the future are refused.
	MaxEventAge  time.Duration    // default DefaultMaxEventAge
	MaxClockSkew time.Duration    // default DefaultMaxClockSkew
	Now          func() time.Time // default time.Now
	Logger       *slog.Logger
	Metrics      *Metrics
}

func (c *CollectorConfig) Validate() error {
	var errs []error
	if c.Producer == nil {
		errs = append(errs, errors.New("collector: no producer"))
	}
	if c.Auth == nil {
		errs = append(errs, errors.New("collector: no key store to authenticate with"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("collector: --max-body must be > 0, got %d", c.MaxBodyBytes))
	}
	if c.MaxOTLPBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("collector: --otlp-max-body must be > 0, got %d", c.MaxOTLPBodyBytes))
	}
	if c.OTLPStreamTimeout < 0 || c.OTLPIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("collector: the OTLP/gRPC timeouts must be > 0, got %s and %s", c.OTLPStreamTimeout, c.OTLPIdleTimeout))
	}
	if c.MaxLines < 0 {
		errs = append(errs, fmt.Errorf("collector: --max-lines must be > 0, got %d", c.MaxLines))
	}
	if c.MaxConcurrent < 0 {
		errs = append(errs, fmt.Errorf("collector: --max-concurrent-posts must be > 0, got %d", c.MaxConcurrent))
	}
	for _, f := range []struct {
		flag string
		v    int
	}{{"--max-uploads", c.MaxUploads}, {"--max-uploads-per-org", c.MaxUploadsPerOrg}, {"--max-uploads-per-key", c.MaxUploadsPerKey}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("collector: %s must be > 0, got %d", f.flag, f.v))
		}
	}
	if c.MaxEventBytes < 0 || c.MaxEventBytes > kafka.MaxEventBytes {
		errs = append(errs, fmt.Errorf("collector: the event size limit must be between 1 and %d (Kafka's message limit), got %d", kafka.MaxEventBytes, c.MaxEventBytes))
	}
	if c.MaxEventAge < 0 {
		errs = append(errs, fmt.Errorf("collector: --max-event-age must be > 0, got %s", c.MaxEventAge))
	}
	if c.MaxClockSkew < 0 {
		errs = append(errs, fmt.Errorf("collector: --max-clock-skew must be >= 0, got %s", c.MaxClockSkew))
	}
	return errors.Join(errs...)
}

// Collector serves POST /v1/events: a JSON array or NDJSON of canonical events or
// platform frames. Each line is decoded, validated and held to the key's rights; valid
// lines are produced to Kafka; the answer counts accepted and rejected lines and gives
// each rejected line's reason. A produce failure answers 503 and the client retries the
// whole request, which event ids make harmless.
//
// The key's rights (schema/README.md, "Keys and roles"): nobody writes bandplane's own types or
// sources; only platform keys write directory and governance types; an organization's
// key writes events of its organization only (an event without org_id gets the key's),
// and not as a party registered in another organization. A frame's id is in the scope of
// the key's organization (the platform's for a platform key): an organization that posts
// a frame the platform is about to send gets an event of its own, never the platform's id.
type Collector struct {
	cfg     CollectorConfig
	log     *slog.Logger
	handler http.Handler
	slots   chan struct{} // MaxConcurrent
	uploads *share.Pool   // MaxUploads
}

func NewCollector(cfg CollectorConfig) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxEventBytes == 0 {
		cfg.MaxEventBytes = kafka.MaxEventBytes
	}
	if cfg.MaxOTLPBodyBytes == 0 {
		cfg.MaxOTLPBodyBytes = DefaultMaxOTLPBodyBytes
	}
	if cfg.OTLPStreamTimeout == 0 {
		cfg.OTLPStreamTimeout = time.Minute
	}
	if cfg.OTLPIdleTimeout == 0 {
		cfg.OTLPIdleTimeout = 2 * time.Minute
	}
	if cfg.MaxLines == 0 {
		cfg.MaxLines = DefaultMaxLines
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.MaxUploads == 0 {
		cfg.MaxUploads = DefaultMaxUploads
	}
	if cfg.MaxUploadsPerOrg == 0 {
		cfg.MaxUploadsPerOrg = DefaultMaxUploadsPerOrg
	}
	if cfg.MaxUploadsPerKey == 0 {
		cfg.MaxUploadsPerKey = DefaultMaxUploadsPerKey
	}
	if cfg.MaxEventAge == 0 {
		cfg.MaxEventAge = DefaultMaxEventAge
	}
	if cfg.MaxClockSkew == 0 {
		cfg.MaxClockSkew = DefaultMaxClockSkew
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	c := &Collector{cfg: cfg, log: cfg.Logger.With("component", "collector"), slots: make(chan struct{}, cfg.MaxConcurrent),
		uploads: share.New(share.Limits{Total: cfg.MaxUploads, PerGroup: cfg.MaxUploadsPerOrg, PerClient: cfg.MaxUploadsPerKey,
			Reserved: cfg.MaxUploads / 4}, keys.PlatformOrg)}
	c.handler = keys.Require(cfg.Auth, keys.RoleIngest)(http.HandlerFunc(c.collect))
	return c, nil
}

// CollectorResponse is the JSON answer of POST /v1/events.
type CollectorResponse struct {
	Accepted int      `json:"accepted"`
	Rejected int      `json:"rejected"`
	Errors   []Reject `json:"errors,omitempty"`
	Error    string   `json:"error,omitempty"`
	Code     string   `json:"code,omitempty"`
}

const maxListedRejects = 1000

func (c *Collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		keys.WriteJSON(w, http.StatusMethodNotAllowed, CollectorResponse{Error: "use POST", Code: "method_not_allowed"})
		return
	}
	c.handler.ServeHTTP(w, r)
}

func (c *Collector) collect(w http.ResponseWriter, r *http.Request) {
	key, _ := keys.FromContext(r.Context())
	if !key.Platform() && c.cfg.RegistrationsReady != nil && !c.cfg.RegistrationsReady() {
		w.Header().Set("Retry-After", "1")
		keys.WriteJSON(w, http.StatusServiceUnavailable, CollectorResponse{Code: "unavailable",
			Error: "the directory is still loading, and an organization's events are checked against it; retry"})
		return
	}
	release, refused := c.uploads.Take(key.Org, key.ID)
	if refused != nil {
		w.Header().Set("Retry-After", "1")
		keys.WriteJSON(w, http.StatusTooManyRequests, CollectorResponse{Code: "too_many_requests", Error: c.uploadRefusal(key, refused)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.cfg.MaxBodyBytes))
	release()
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			keys.WriteJSON(w, http.StatusRequestEntityTooLarge, CollectorResponse{Code: "too_large",
				Error: fmt.Sprintf("request body is larger than %d bytes (--max-body); send smaller batches", c.cfg.MaxBodyBytes)})
			return
		}
		keys.WriteJSON(w, http.StatusBadRequest, CollectorResponse{Code: "bad_request", Error: "cannot read request body: " + err.Error()})
		return
	}
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	case <-r.Context().Done():
		return // the client gave up waiting
	}
	now := c.cfg.Now()
	var msgs []kafkago.Message
	var rejects []Reject
	rejected, lines := 0, 0
	err = eachLine(body, func(n int, l []byte) error {
		if lines++; lines > c.cfg.MaxLines {
			return errTooManyLines
		}
		m, err := c.line(key, l, now)
		if err != nil {
			// Only the reasons that are listed are kept: a body of a million bad lines
			// costs a counter, not a million messages.
			if rejected++; len(rejects) < maxListedRejects {
				rejects = append(rejects, Reject{Line: n, Reason: err.Error()})
			}
			return nil
		}
		msgs = append(msgs, m)
		return nil
	})
	switch {
	case errors.Is(err, errTooManyLines):
		keys.WriteJSON(w, http.StatusRequestEntityTooLarge, CollectorResponse{Code: "too_large",
			Error: fmt.Sprintf("the request holds more than %d events (--max-lines); send smaller batches", c.cfg.MaxLines)})
		return
	case err != nil:
		keys.WriteJSON(w, http.StatusBadRequest, CollectorResponse{Code: "bad_request", Error: err.Error()})
		return
	}
	if len(msgs) == 0 && rejected == 0 {
		keys.WriteJSON(w, http.StatusBadRequest, CollectorResponse{Code: "bad_request", Error: "the request body holds no events (NDJSON or a JSON array of events)"})
		return
	}
	resp := CollectorResponse{Accepted: len(msgs), Rejected: rejected, Errors: rejects}
	c.cfg.Metrics.CollectorLines.WithLabelValues("rejected").Add(float64(rejected))
	if len(msgs) > 0 {
		if err := c.cfg.Producer.ProduceMessages(r.Context(), msgs); err != nil {
			c.cfg.Metrics.CollectorErrors.Inc()
			c.log.Error("cannot produce collected events", "err", err, "events", len(msgs), "key_id", key.ID)
			w.Header().Set("Retry-After", "1")
			keys.WriteJSON(w, http.StatusServiceUnavailable, CollectorResponse{Rejected: rejected, Errors: resp.Errors, Code: "unavailable",
				Error: "cannot write to kafka, nothing from this request is guaranteed stored; retry: " + err.Error()})
			return
		}
		c.cfg.Metrics.CollectorLines.WithLabelValues("accepted").Add(float64(len(msgs)))
	}
	status := http.StatusOK
	if len(msgs) == 0 {
		status = http.StatusBadRequest
		resp.Code, resp.Error = "rejected", fmt.Sprintf("all %d lines were refused; the reasons are in errors (the first %d)", rejected, maxListedRejects)
	}
	keys.WriteJSON(w, status, resp)
}

// uploadRefusal says which share of the uploads refused key's request.
func (c *Collector) uploadRefusal(key keys.Key, r *share.Refusal) string {
	switch r.Bound {
	case share.BoundClient:
		return fmt.Sprintf("key %s is already sending %d request bodies (--max-uploads-per-key); send one after the other, or retry", key.ID, r.Limit)
	case share.BoundGroup:
		return fmt.Sprintf("organization %s is already sending %d request bodies (--max-uploads-per-org); retry", key.Org, r.Limit)
	default:
		return fmt.Sprintf("the collector is reading %d request bodies of organizations, the most it reads at once (--max-uploads); retry", r.Limit)
	}
}

// line decodes one line, holds it to the key's rights and the accepted time window,
// and encodes it as the message to produce.
func (c *Collector) line(key keys.Key, l []byte, now time.Time) (kafkago.Message, error) {
	if len(l) > c.cfg.MaxEventBytes {
		// Refused before it is decoded: no line costs more than one event's worth.
		return kafkago.Message{}, fmt.Errorf("the line is %d bytes, more than the %d bytes one Kafka message may carry; send its content in smaller events",
			len(l), c.cfg.MaxEventBytes)
	}
	ev, err := schema.DecodeFrom(l, now, writerOf(key))
	if err != nil {
		return kafkago.Message{}, err
	}
	return c.admit(key, &ev, now, json.Marshal)
}

// admit holds a decoded, valid event to the key's rights and the accepted time window,
// and encodes it as the message to produce: the one path of every event a client sends.
// encode is encoding/json's Marshal for events decoded from a client's JSON (it
// compacts their data as it always has); the OTLP receiver, whose data it built
// compact itself, passes the faster encoder.
func (c *Collector) admit(key keys.Key, ev *schema.Event, now time.Time, encode func(any) ([]byte, error)) (kafkago.Message, error) {
	if err := c.mayWrite(key, ev); err != nil {
		return kafkago.Message{}, err
	}
	if oldest := now.Add(-c.cfg.MaxEventAge); ev.Time.Before(oldest) {
		return kafkago.Message{}, fmt.Errorf("time: %s is older than the accepted window of %s (--max-event-age)",
			ev.Time.Format(time.RFC3339Nano), c.cfg.MaxEventAge)
	}
	if newest := now.Add(c.cfg.MaxClockSkew); ev.Time.After(newest) {
		return kafkago.Message{}, fmt.Errorf("time: %s is more than %s ahead of the collector's clock (%s; --max-clock-skew)",
			ev.Time.Format(time.RFC3339Nano), c.cfg.MaxClockSkew, now.UTC().Format(time.RFC3339))
	}
	b, err := encode(ev)
	if err != nil {
		return kafkago.Message{}, fmt.Errorf("cannot encode the event: %w", err)
	}
	if len(b) > c.cfg.MaxEventBytes {
		return kafkago.Message{}, fmt.Errorf("the event is %d bytes once encoded, more than the %d bytes one Kafka message may carry; send its content in smaller events",
			len(b), c.cfg.MaxEventBytes)
	}
	return kafkago.Message{Key: []byte(ev.Key()), Value: b}, nil
}

// writerOf is the scope of the frame ids of key's lines: its organization, or the
// platform's for a platform key.
func writerOf(key keys.Key) string {
	if key.Platform() {
		return schema.PlatformWriter
	}
	return key.Org
}

// mayWrite holds an event to the key's rights; an organization's event without org_id
// is stamped with the key's organization.
func (c *Collector) mayWrite(key keys.Key, ev *schema.Event) error {
	if schema.OwnType(ev.Type) {
		return fmt.Errorf("type: %q is written only by bandplane itself, never through the collector", ev.Type)
	}
	if schema.OwnSource(ev.Source) {
		return fmt.Errorf("source: %q is reserved for the events bandplane itself writes", ev.Source)
	}
	if key.Platform() {
		return nil
	}
	if schema.PlatformOnlyType(ev.Type) {
		return fmt.Errorf("type: %q changes the directory or governance and needs a platform ingest key (--org '*'); key %s belongs to organization %q",
			ev.Type, key.ID, key.Org)
	}
	if ev.OrgID == "" {
		ev.OrgID = key.Org
	} else if ev.OrgID != key.Org {
		return fmt.Errorf("org_id: %q is not the organization of key %s (%q)", ev.OrgID, key.ID, key.Org)
	}
	if c.cfg.Registrations == nil {
		return fmt.Errorf("key %s belongs to organization %q, and this collector has no directory to check what an organization may write (serve runs with --no-policy): only platform keys may write here",
			key.ID, key.Org)
	}
	for _, p := range [...]struct {
		field string
		id    string
	}{{"actor.id", ev.Actor.ID}, {"subject.id", subjectID(ev)}} {
		if p.id == "" {
			continue
		}
		if org, known := c.cfg.Registrations.OrgOf(p.id); known && org != key.Org {
			return fmt.Errorf("%s: %q is registered in another organization than key %s's (%q)", p.field, p.id, key.ID, key.Org)
		}
	}
	return nil
}

func subjectID(ev *schema.Event) string {
	if ev.Subject == nil {
		return ""
	}
	return ev.Subject.ID
}

var errTooManyLines = errors.New("too many lines")

// eachLine calls fn with each non-blank line of an NDJSON body, or each element of a
// JSON array (each element counts as one line), numbered from 1, without copying the
// body; it stops at fn's first error.
func eachLine(body []byte, fn func(n int, line []byte) error) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return splitArray(trimmed, fn)
	}
	for n := 1; len(body) > 0; n++ {
		l := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			l, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		if err := fn(n, l); err != nil {
			return err
		}
	}
	return nil
}

// splitArray calls fn with each element of a JSON array without decoding it: a scan
// that tracks strings and bracket depth as counters, so no nesting can make it recurse.
// Each element is then decoded (and guarded) as a line. A malformed array is refused
// before fn sees any element.
func splitArray(b []byte, fn func(n int, line []byte) error) error {
	if err := scanArray(b, func([]byte) error { return nil }); err != nil {
		return err
	}
	n := 0
	return scanArray(b, func(e []byte) error { n++; return fn(n, e) })
}

// scanArray is splitArray's scan: it calls each with every element.
func scanArray(b []byte, each func([]byte) error) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("body starts with '[' but is not a JSON array: "+format, args...)
	}
	depth, start, elements := 0, -1, 0
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
			continue
		}
		switch ch {
		case '"':
			inString = true
		case '[', '{':
			depth++
			if depth == 2 && start < 0 {
				start = i
			}
			continue
		case ']', '}':
			depth--
			if depth < 0 {
				return bad("unbalanced %q at offset %d", ch, i)
			}
			if depth == 0 {
				if ch != ']' {
					return bad("unbalanced %q at offset %d", ch, i)
				}
				if rest := bytes.TrimSpace(b[i+1:]); len(rest) > 0 {
					return bad("unexpected data after the array at offset %d", i+1)
				}
				if start >= 0 {
					return each(bytes.TrimSpace(b[start:i]))
				}
				if elements > 0 {
					return bad("trailing ',' before offset %d", i)
				}
				return nil
			}
			continue
		case ',':
			if depth == 1 {
				if start < 0 {
					return bad("empty element before offset %d", i)
				}
				if err := each(bytes.TrimSpace(b[start:i])); err != nil {
					return err
				}
				start, elements = -1, elements+1
				continue
			}
		case ' ', '\t', '\r', '\n':
			continue
		}
		if depth == 1 && start < 0 {
			start = i
		}
	}
	return bad("it ends before its closing ']'")
}
