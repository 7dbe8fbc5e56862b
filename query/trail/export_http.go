package trail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
)

// The compliance export's HTTP side: GET /v1/audit/export streams a selection of one
// organization's trail pinned to a signed checkpoint of its log (Exporter), with the
// proofs to check it offline; `bandplane audit export` drives it.

// The exports one ExportHandler runs at once by default (ExportLimits): each holds a
// ClickHouse connection of the query pool while it reads. One API key runs one at a
// time and one organization's keys two, and one of the four is the platform's keys'
// only, so that no tenant's slow reader holds what the others, or the platform's own
// exports, need.
const (
	MaxConcurrentExports       = 4
	MaxConcurrentExportsPerOrg = 2
	MaxConcurrentExportsPerKey = 1
)

// exportWriteWindow is how long the handler gives each MiB of an export to reach the
// client (serve's --write-timeout would cut a long export).
const exportWriteWindow = 2 * time.Minute

// Response headers of an export.
const (
	HeaderExportSize     = "X-Bandplane-Export-Size"
	HeaderExportExpected = "X-Bandplane-Export-Expected-Events"
)

// ExportRecorder records each export in the audit trail (serve's audit producer, a
// kafka.Producer). Produce returns once Kafka has acknowledged the events.
type ExportRecorder interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// ExportLimits bound the exports running at once: in all (serve's --max-exports),
// of one organization's keys (--max-exports-per-org) and of one key
// (--max-exports-per-key). Zero fields take the defaults; one place of Total (of two
// or more) is the platform's keys' only.
type ExportLimits struct {
	Total, PerOrg, PerKey int
}

func newExportSlots(l ExportLimits) *share.Pool {
	if l.Total <= 0 {
		l.Total = MaxConcurrentExports
	}
	if l.PerOrg <= 0 {
		l.PerOrg = MaxConcurrentExportsPerOrg
	}
	if l.PerKey <= 0 {
		l.PerKey = MaxConcurrentExportsPerKey
	}
	return share.Few(l.Total, l.PerOrg, l.PerKey, keys.PlatformOrg)
}

type exportHandler struct {
	x        *Exporter      // nil: no audit key, every request is 503
	recorder ExportRecorder // records each export (nil: not recorded; tests of refusals)
	log      *slog.Logger
	slots    *share.Pool
}

// TypeAuditExported is the audit event of one export request: who took which part of
// the trail away (bandplane's own type; audit.* is refused from clients).
const TypeAuditExported = "audit.exported"

// sourceAuditExport is the source of the audit.exported events.
const sourceAuditExport = schema.SourceBandplane + "-audit"

// exportedData is the data of audit.exported.
type exportedData struct {
	KeyName     string    `json:"key_name,omitempty"`
	From        time.Time `json:"from"`
	To          time.Time `json:"to"`
	Types       []string  `json:"types"`
	Actors      []string  `json:"actors"`
	Rooms       []string  `json:"rooms"`
	Format      string    `json:"format"`
	Size        uint64    `json:"size"`
	Consistency []uint64  `json:"consistency,omitempty"`
	Resumed     bool      `json:"resumed"`
}

// ExportHandler serves GET /v1/audit/export for the roles compliance and admin;
// without an exporter (serve has no --audit-key) it answers 503. Each export is recorded as an
// audit.exported event through recorder before a byte of it is sent; one that cannot
// be recorded is refused (503).
func ExportHandler(auth keys.Authenticator, x *Exporter, recorder ExportRecorder, log *slog.Logger, limits ExportLimits) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &exportHandler{x: x, recorder: recorder, log: log.With("component", "audit_export"), slots: newExportSlots(limits)}
	return keys.Require(auth, keys.RoleCompliance, keys.RoleAdmin)(h)
}

func (h *exportHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		keys.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" /v1/audit/export: use GET")
		return
	}
	if h.x == nil {
		keys.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"the audit export signs what it exports with the audit key, and this serve has none: start it with --audit-key (env BANDPLANE_AUDIT_KEY)")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		keys.WriteError(w, http.StatusBadRequest, "bad_request", "malformed query string: "+err.Error())
		return
	}
	req, err := ParseExportRequest(q)
	if err != nil {
		keys.WriteError(w, http.StatusBadRequest, "bad_request", strings.ReplaceAll(err.Error(), "\n", "; "))
		return
	}
	k, _ := keys.FromContext(r.Context())
	switch org := req.Selection.Org; {
	case org == "" && k.Platform():
		keys.WriteError(w, http.StatusBadRequest, "bad_request", "org: required: a platform key names the organization to export (org=…)")
		return
	case org == "":
		req.Selection.Org = k.Org
	case !k.MayActOn(org):
		keys.Forbidden(w, k, org)
		return
	}
	release, refused := h.slots.Take(k.Org, k.ID)
	if refused != nil {
		w.Header().Set("Retry-After", "10")
		msg := fmt.Sprintf("%d exports of organizations are running, the most this server runs at once (--max-exports); retry later", refused.Limit)
		switch refused.Bound {
		case share.BoundClient:
			msg = fmt.Sprintf("%d exports of this key are running, the most one key runs at once (--max-exports-per-key); retry when one ends", refused.Limit)
		case share.BoundGroup:
			msg = fmt.Sprintf("%d exports of organization %s are running, the most one organization runs at once (--max-exports-per-org); retry when one ends", refused.Limit, k.Org)
		}
		keys.WriteError(w, http.StatusTooManyRequests, "too_many_requests", msg)
		return
	}
	defer release()
	ctx := r.Context()
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(exportWriteWindow)) // not every writer has one
	start := time.Now()
	exp, err := h.x.Prepare(ctx, req)
	switch {
	case err == nil:
	case errors.Is(err, ErrExportConflict):
		keys.WriteError(w, http.StatusConflict, "conflict", strings.TrimPrefix(err.Error(), ErrExportConflict.Error()+": "))
		return
	case ctx.Err() != nil:
		return
	default:
		h.log.Error("cannot prepare an audit export", "err", err, "org_id", req.Selection.Org, "key_id", k.ID)
		keys.WriteError(w, http.StatusServiceUnavailable, "unavailable", "cannot read the audit trail from ClickHouse or the checkpoints topic; retry (the server log says why)")
		return
	}
	cp := exp.Checkpoint()
	if h.recorder != nil {
		sel := req.Selection
		data, _ := json.Marshal(exportedData{KeyName: k.Name, From: sel.From, To: sel.To, Types: sel.Types, Actors: sel.Actors, Rooms: sel.Rooms,
			Format: req.Encoding, Size: cp.Size, Consistency: req.Consistency, Resumed: req.After != nil})
		ev := schema.Event{ID: schema.NewID(), Type: TypeAuditExported, Time: time.Now().UTC(), OrgID: sel.Org,
			Actor: schema.Party{ID: k.ID, Type: schema.ActorSystem}, Source: sourceAuditExport, SchemaVersion: schema.Version, Data: data}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := h.recorder.Produce(actx, []schema.Event{ev})
		cancel()
		if err != nil {
			h.log.Error("cannot record an audit export; refusing it", "err", err, "org_id", sel.Org, "key_id", k.ID)
			keys.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the export could not be recorded in the audit trail, so it is not served; retry")
			return
		}
	}
	ct := "application/x-ndjson"
	if req.Encoding == EncodingCSV {
		ct = "text/csv; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(HeaderExportSize, strconv.FormatUint(cp.Size, 10))
	w.Header().Set(HeaderExportExpected, strconv.FormatUint(exp.Expected(), 10))
	w.WriteHeader(http.StatusOK)
	flush := func() error {
		_ = rc.SetWriteDeadline(time.Now().Add(exportWriteWindow))
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	_ = flush()
	st, err := exp.Stream(ctx, w, flush)
	attrs := []any{"org_id", req.Selection.Org, "key_id", k.ID, "format", req.Encoding, "size", cp.Size, "resumed", req.After != nil,
		"events", st.Events, "total_events", st.Total, "gaps", st.Gaps, "bytes", st.Bytes, "duration", time.Since(start).Round(time.Millisecond)}
	switch {
	case err == nil:
		h.log.Info("audit export", attrs...)
	case ctx.Err() != nil:
		h.log.Info("audit export stopped: the client went away", attrs...)
	default:
		h.log.Error("audit export failed", append(attrs, "err", err)...)
	}
}

// listFlag is a repeatable flag whose values may also be comma-separated.
