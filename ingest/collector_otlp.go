package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	fastjson "github.com/segmentio/encoding/json"
	kafkago "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/bandplane/bandplane/ingest/otlp"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// Bindings says which directory agent an operator bound a sender identity to
// (bandplane agents bind). *directory.Directory implements it.
type Bindings interface {
	Bound(org, kind, value string) (agentID string, ok bool)
}

// The OTLP receiver: POST /v1/traces (OTLP/HTTP, protobuf or JSON, gzip or not) and
// TraceService/Export (OTLP/gRPC). Both decode with the OpenTelemetry Collector's pdata,
// map the GenAI spans with ingest/otlp, and hold every event to the collector's rules:
// the same key roles, uploads share, slots, body and event limits, time window and
// writer's rights. Answers follow the OTLP specification: a span that cannot be stored
// is counted in partial_success.rejected_spans, the message naming the first problem;
// the request as a whole fails only when it cannot be read (400, 401, 403, 413, 415) or
// Kafka did not acknowledge it (503 with Retry-After; gRPC UNAVAILABLE), the only
// retryable failure besides 429.

const (
	contentProtobuf = "application/x-protobuf"
	contentJSON     = "application/json"
)

// TracesHandler serves POST /v1/traces.
func (c *Collector) TracesHandler() http.Handler { return http.HandlerFunc(c.traces) }

// otlpFailure is a request-wide refusal: the HTTP status and gRPC code it maps to.
type otlpFailure struct {
	http       int
	grpc       codes.Code
	retryAfter bool
	msg        string
}

func (f *otlpFailure) Error() string { return f.msg }

func fail(httpStatus int, code codes.Code, format string, args ...any) *otlpFailure {
	return &otlpFailure{http: httpStatus, grpc: code, msg: fmt.Sprintf(format, args...)}
}

func (c *Collector) traces(w http.ResponseWriter, r *http.Request) {
	ctype := contentProtobuf
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == contentJSON {
		ctype = contentJSON
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeStatus(w, ctype, fail(http.StatusMethodNotAllowed, codes.Unimplemented, "use POST"))
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || (mt != contentProtobuf && mt != contentJSON) {
		writeStatus(w, ctype, fail(http.StatusUnsupportedMediaType, codes.InvalidArgument,
			"Content-Type %q is not an OTLP encoding: send %s or %s", r.Header.Get("Content-Type"), contentProtobuf, contentJSON))
		return
	}
	token, err := keys.Bearer(r)
	if err != nil || token == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="bandplane"`)
		msg := `missing API key: send "Authorization: Bearer <ingest key>" (OTEL_EXPORTER_OTLP_HEADERS)`
		if err != nil {
			msg = err.Error()
		}
		writeStatus(w, ctype, fail(http.StatusUnauthorized, codes.Unauthenticated, "%s", msg))
		return
	}
	key, f := c.otlpKey(r.Context(), token)
	if f != nil {
		if f.http == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="bandplane"`)
		}
		writeStatus(w, ctype, f)
		return
	}
	release, refused := c.uploads.Take(key.Org, key.ID)
	if refused != nil {
		writeStatus(w, ctype, &otlpFailure{http: http.StatusTooManyRequests, grpc: codes.ResourceExhausted, retryAfter: true, msg: c.uploadRefusal(key, refused)})
		return
	}
	body, f := c.readOTLPBody(w, r)
	release()
	if f != nil {
		writeStatus(w, ctype, f)
		return
	}
	// The decode holds a slot: pdata's model of a body of tiny attributes is some 30
	// times its size, so decodes are bounded like everything after them.
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	case <-r.Context().Done():
		return // the client gave up waiting
	}
	req := ptraceotlp.NewExportRequest()
	if ctype == contentJSON {
		// pdata's JSON decoder has no depth limit: the guard bounds it first.
		if err := schema.CheckJSON(body); err != nil {
			writeStatus(w, ctype, fail(http.StatusBadRequest, codes.InvalidArgument, "the OTLP/JSON request is refused: %v", err))
			return
		}
		err = req.UnmarshalJSON(body)
	} else {
		err = req.UnmarshalProto(body)
	}
	if err != nil {
		writeStatus(w, ctype, fail(http.StatusBadRequest, codes.InvalidArgument, "cannot decode the OTLP request (%s): %v", ctype, err))
		return
	}
	resp, f := c.export(r.Context(), key, req.Traces())
	if f != nil {
		writeStatus(w, ctype, f)
		return
	}
	var b []byte
	if ctype == contentJSON {
		b, err = resp.MarshalJSON()
	} else {
		b, err = resp.MarshalProto()
	}
	if err != nil {
		writeStatus(w, ctype, fail(http.StatusInternalServerError, codes.Internal, "cannot encode the answer: %v", err))
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// otlpKey authenticates an OTLP request's token: an organization's ingest key. OTLP
// spans are an organization's usage, so a platform key, which has none, is refused.
func (c *Collector) otlpKey(ctx context.Context, token string) (keys.Key, *otlpFailure) {
	key, ok := c.cfg.Auth.Lookup(ctx, token)
	if !ok {
		return key, fail(http.StatusUnauthorized, codes.Unauthenticated, "unknown or revoked API key")
	}
	if !key.Has(keys.RoleIngest) {
		return key, fail(http.StatusForbidden, codes.PermissionDenied, "key %s has role %s; sending spans needs the %s role", key.ID, key.Role, keys.RoleIngest)
	}
	if key.Platform() {
		return key, fail(http.StatusForbidden, codes.PermissionDenied,
			"key %s is a platform key; spans are an organization's usage: send them with an ingest key of the organization (bandplane keys create --org ORG --role ingest)", key.ID)
	}
	if c.cfg.Registrations == nil {
		return key, fail(http.StatusForbidden, codes.PermissionDenied,
			"this collector has no directory to check what an organization may write (serve runs with --no-policy), so it takes no spans")
	}
	if c.cfg.RegistrationsReady != nil && !c.cfg.RegistrationsReady() {
		return key, &otlpFailure{http: http.StatusServiceUnavailable, grpc: codes.Unavailable, retryAfter: true,
			msg: "the directory is still loading, and spans are checked against it; retry"}
	}
	return key, nil
}

// otlpFirstBuffer bounds the buffer a body is first read into.
const otlpFirstBuffer = 256 << 10

// readOTLPBody reads the body, gunzipping it when it says so; MaxOTLPBodyBytes bounds
// both what arrives and what it inflates to.
func (c *Collector) readOTLPBody(w http.ResponseWriter, r *http.Request) ([]byte, *otlpFailure) {
	limit := c.cfg.MaxOTLPBodyBytes
	var src io.Reader = http.MaxBytesReader(w, r.Body, limit)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return nil, c.bodyFailure(err, "cannot read the gzip request body")
		}
		defer func() { _ = zr.Close() }()
		src = io.LimitReader(zr, limit+1)
	default:
		return nil, fail(http.StatusUnsupportedMediaType, codes.InvalidArgument, "Content-Encoding %q is not supported: send gzip or none", enc)
	}
	// The buffer starts at the length the request gives (its compressed size when
	// gzipped), up to otlpFirstBuffer, and grows as bytes arrive: a length is no
	// promise, and memory is held for what came.
	first := int64(otlpFirstBuffer)
	if n := r.ContentLength; n > 0 {
		first = min(n, first)
	}
	buf := bytes.NewBuffer(make([]byte, 0, first+bytes.MinRead))
	if _, err := buf.ReadFrom(src); err != nil {
		return nil, c.bodyFailure(err, "cannot read the request body")
	}
	body := buf.Bytes()
	if int64(len(body)) > limit {
		return nil, fail(http.StatusRequestEntityTooLarge, codes.ResourceExhausted,
			"the request body inflates to more than %d bytes (--otlp-max-body); send smaller batches", limit)
	}
	return body, nil
}

func (c *Collector) bodyFailure(err error, what string) *otlpFailure {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return fail(http.StatusRequestEntityTooLarge, codes.ResourceExhausted,
			"the request body is larger than %d bytes (--otlp-max-body); send smaller batches", c.cfg.MaxOTLPBodyBytes)
	}
	return fail(http.StatusBadRequest, codes.InvalidArgument, "%s: %v", what, err)
}

// otlpDirectory is what otlp.Map reads of the directory.
type otlpDirectory struct {
	Registrations
	Bindings
}

type noBindings struct{}

func (noBindings) Bound(string, string, string) (string, bool) { return "", false }

// export maps, admits and produces the spans of one request, the HTTP and gRPC
// receivers' common part. The caller holds a slot.
func (c *Collector) export(ctx context.Context, key keys.Key, td ptrace.Traces) (ptraceotlp.ExportResponse, *otlpFailure) {
	resp := ptraceotlp.NewExportResponse()
	if n := td.SpanCount(); n > c.cfg.MaxLines {
		return resp, fail(http.StatusRequestEntityTooLarge, codes.InvalidArgument,
			"the request holds %d spans, more than %d (--max-lines); send smaller batches", n, c.cfg.MaxLines)
	}
	bindings := c.cfg.Bindings
	if bindings == nil {
		bindings = noBindings{}
	}
	res := otlp.Map(td, otlp.Config{Org: key.Org, Directory: otlpDirectory{c.cfg.Registrations, bindings}, Content: c.cfg.OTLPContent})
	now := c.cfg.Now()
	var (
		msgs     = make([]kafkago.Message, 0, len(res.Spans))
		first    error
		rejected int
		unbound  []string
		stored   int
	)
	for i := range res.Spans {
		sp := &res.Spans[i]
		err := sp.Problem
		start := len(msgs)
		for j := range sp.Events {
			if err != nil {
				break
			}
			ev := &sp.Events[j]
			if err = ev.Validate(); err != nil {
				break
			}
			var m kafkago.Message
			if m, err = c.admit(key, ev, now, fastjson.Marshal); err == nil {
				msgs = append(msgs, m)
			}
		}
		if err != nil {
			if sp.Problem == nil {
				err = fmt.Errorf("span %s: %w", sp.Ref, err)
			}
			msgs = msgs[:start] // a span is stored whole or not at all
			if rejected++; first == nil {
				first = err
			}
			continue
		}
		stored++
		if sp.Unbound != "" && len(unbound) < 8 && !slices.Contains(unbound, sp.Unbound) {
			unbound = append(unbound, sp.Unbound)
		}
		if sp.Unbound != "" {
			c.cfg.Metrics.OTLPSpans.WithLabelValues("unbound").Inc()
		}
	}
	if len(msgs) > 0 {
		if err := c.cfg.Producer.ProduceMessages(ctx, msgs); err != nil {
			c.cfg.Metrics.CollectorErrors.Inc()
			c.log.Error("cannot produce OTLP events", "err", err, "events", len(msgs), "key_id", key.ID)
			return resp, &otlpFailure{http: http.StatusServiceUnavailable, grpc: codes.Unavailable, retryAfter: true,
				msg: "cannot write to kafka, nothing from this request is guaranteed stored; retry: " + err.Error()}
		}
	}
	c.cfg.Metrics.OTLPSpans.WithLabelValues("accepted").Add(float64(stored))
	c.cfg.Metrics.OTLPSpans.WithLabelValues("rejected").Add(float64(rejected))
	c.cfg.Metrics.OTLPSpans.WithLabelValues("skipped").Add(float64(res.Skipped))
	var notes []string
	if first != nil {
		notes = append(notes, first.Error())
		if rejected > 1 {
			notes = append(notes, fmt.Sprintf("%d spans were rejected in all", rejected))
		}
	}
	if len(unbound) > 0 {
		notes = append(notes, fmt.Sprintf("spans of %s were stored unattributed: no binding names the sender; bind it to an agent of organization %s (bandplane agents bind)",
			strings.Join(unbound, ", "), key.Org))
	}
	if rejected > 0 || len(notes) > 0 {
		ps := resp.PartialSuccess()
		ps.SetRejectedSpans(int64(rejected))
		ps.SetErrorMessage(strings.Join(notes, "; "))
	}
	return resp, nil
}

// writeStatus answers a request-wide failure with a google.rpc.Status in the request's
// encoding, as OTLP/HTTP asks.
func writeStatus(w http.ResponseWriter, ctype string, f *otlpFailure) {
	st := &spb.Status{Code: int32(f.grpc), Message: f.msg}
	var b []byte
	var err error
	if ctype == contentJSON {
		b, err = protojson.Marshal(st)
	} else {
		b, err = proto.Marshal(st)
	}
	if err != nil {
		b = nil
	}
	if f.retryAfter {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(f.http)
	_, _ = w.Write(b)
}

// GRPCServer is the OTLP/gRPC receiver: TraceService/Export with the collector's
// rules. The key is checked from the metadata before the message is read, and the
// uploads share is held while it is; MaxOTLPBodyBytes bounds the message.
func (c *Collector) GRPCServer() *grpc.Server {
	s := grpc.NewServer(
		grpc.MaxRecvMsgSize(int(min(c.cfg.MaxOTLPBodyBytes, 1<<31-1))),
		grpc.MaxConcurrentStreams(uint32(max(c.cfg.MaxUploadsPerKey, 1))),
		grpc.InTapHandle(c.grpcTap),
		grpc.StatsHandler(uploadRelease{}),
		// Connections time out as the HTTP servers' do: a handshake within 10 s, an
		// idle connection closed after OTLPIdleTimeout, a silent peer after a ping.
		grpc.ConnectionTimeout(10*time.Second),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: c.cfg.OTLPIdleTimeout,
			Time: c.cfg.OTLPIdleTimeout, Timeout: 20 * time.Second}),
	)
	ptraceotlp.RegisterGRPCServer(s, &grpcTraces{c: c})
	return s
}

const exportMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

type grpcKeyCtx struct{}

// grpcAdmission is what the tap admitted a stream with: the key and its upload's
// release, which runs once the message is read or the stream ends.
type grpcAdmission struct {
	key     keys.Key
	release func()
	once    sync.Once
}

func (a *grpcAdmission) done() { a.once.Do(a.release) }

// grpcTap authenticates a stream from its metadata and takes the key's uploads share,
// before gRPC reads the message.
func (c *Collector) grpcTap(ctx context.Context, info *tap.Info) (context.Context, error) {
	// Export is the only method: any other stream ends before a handler (and the
	// stats that give the share back) would run.
	if info.FullMethodName != exportMethod {
		return ctx, status.Errorf(codes.Unimplemented, "%s is not a method of this server: it serves %s", info.FullMethodName, exportMethod)
	}
	var token string
	if v := info.Header.Get("authorization"); len(v) > 0 {
		t, err := keys.ParseBearer(v[0])
		if err != nil {
			return ctx, status.Error(codes.Unauthenticated, err.Error())
		}
		token = t
	}
	if token == "" {
		return ctx, status.Error(codes.Unauthenticated, `missing API key: send the metadata "authorization: Bearer <ingest key>" (OTEL_EXPORTER_OTLP_HEADERS)`)
	}
	key, f := c.otlpKey(ctx, token)
	if f != nil {
		return ctx, status.Error(f.grpc, f.msg)
	}
	if err := ctx.Err(); err != nil {
		return ctx, status.FromContextError(err).Err()
	}
	release, refused := c.uploads.Take(key.Org, key.ID)
	if refused != nil {
		return ctx, status.Error(codes.ResourceExhausted, c.uploadRefusal(key, refused))
	}
	a := &grpcAdmission{key: key, release: release}
	// The stream's context ends with the stream, however it ends (gRPC cancels it on
	// every close, an early abort included), and by OTLPStreamTimeout at the latest,
	// as an HTTP request's by --read-timeout: the share is back then at the latest.
	ctx, cancel := context.WithTimeout(ctx, c.cfg.OTLPStreamTimeout)
	context.AfterFunc(ctx, func() { a.done(); cancel() })
	return context.WithValue(ctx, grpcKeyCtx{}, a), nil
}

// uploadRelease gives the uploads share back once the message is in, or the stream
// ends without it.
type uploadRelease struct{}

func (uploadRelease) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (uploadRelease) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (uploadRelease) HandleConn(context.Context, stats.ConnStats) {}
func (uploadRelease) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InPayload, *stats.End:
		if a, ok := ctx.Value(grpcKeyCtx{}).(*grpcAdmission); ok {
			a.done()
		}
	}
}

type grpcTraces struct {
	ptraceotlp.UnimplementedGRPCServer
	c *Collector
}

func (g *grpcTraces) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	a, ok := ctx.Value(grpcKeyCtx{}).(*grpcAdmission)
	if !ok {
		return ptraceotlp.NewExportResponse(), status.Error(codes.Unauthenticated, "the stream was not authenticated")
	}
	a.done()
	select {
	case g.c.slots <- struct{}{}:
		defer func() { <-g.c.slots }()
	case <-ctx.Done():
		return ptraceotlp.NewExportResponse(), status.FromContextError(ctx.Err()).Err()
	}
	resp, f := g.c.export(ctx, a.key, req.Traces())
	if f != nil {
		return resp, status.Error(f.grpc, f.msg)
	}
	return resp, nil
}
