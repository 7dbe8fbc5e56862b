// Package api serves the policy decisions over HTTP and makes each one an audit event:
// POST /v1/decisions/{name}, GET /v1/peers, POST /v1/policy/reload and the operator's
// POST /v1/agents/{id}/suspend|resume.
package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
)

// Auditor writes audit events. Audit blocks until the events are acknowledged by Kafka
// (all in-sync replicas) or returns an error; *kafka.Producer implements it.
type Auditor interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// Config configures the API.
type Config struct {
	Engine  *policy.Engine
	Auditor Auditor // nil: decisions are not audited (CLI, benchmarks of the engine)
	// FailOpen lists decisions that may still grant access when their audit event
	// cannot be written. Every other decision fails closed: a grant without an audit
	// record becomes a deny (reason audit_unavailable).
	FailOpen      map[string]bool
	Token         string // bearer token for decisions and peers ("" = no auth)
	OperatorToken string // bearer token for reload, suspend and resume (required for them)
	BundleDir     string // where reload reads the policies ("" = the built-in bundle)
	AuditTimeout  time.Duration
	Logger        *slog.Logger
	Registerer    prometheus.Registerer
}

// API is an http.Handler.
type API struct {
	cfg       Config
	log       *slog.Logger
	mux       *http.ServeMux
	decisions *prometheus.CounterVec
	auditErrs prometheus.Counter
}

func New(cfg Config) (*API, error) {
	if cfg.Engine == nil {
		return nil, errors.New("policy api: no engine")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.AuditTimeout <= 0 {
		cfg.AuditTimeout = 5 * time.Second
	}
	a := &API{cfg: cfg, log: cfg.Logger.With("component", "policy-api"), mux: http.NewServeMux(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_policy_decisions_total",
			Help: "Policy decisions by decision and result."}, []string{"decision", "result"}),
		auditErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_policy_audit_errors_total",
			Help: "Decisions whose audit event could not be written."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(a.decisions, a.auditErrs)
	}
	a.mux.HandleFunc("POST /v1/decisions/{name}", a.auth(cfg.Token, a.decide))
	a.mux.HandleFunc("GET /v1/peers", a.auth(cfg.Token, a.peers))
	a.mux.HandleFunc("POST /v1/policy/reload", a.operator(a.reload))
	a.mux.HandleFunc("POST /v1/agents/{id}/suspend", a.operator(a.suspend(true)))
	a.mux.HandleFunc("POST /v1/agents/{id}/resume", a.operator(a.suspend(false)))
	return a, nil
}

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func bearer(r *http.Request, want string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (a *API) auth(token string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if token != "" && !bearer(r, token) {
			writeJSON(w, http.StatusUnauthorized, errorBody{"missing or wrong bearer token"})
			return
		}
		h(w, r)
	}
}

func (a *API) operator(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.cfg.OperatorToken == "" {
			writeJSON(w, http.StatusForbidden, errorBody{"operator endpoints are disabled: start with --operator-token"})
			return
		}
		if !bearer(r, a.cfg.OperatorToken) {
			writeJSON(w, http.StatusUnauthorized, errorBody{"missing or wrong operator bearer token"})
			return
		}
		h(w, r)
	}
}

// Input decodes and checks the input of a decision; unknown fields are refused so that
// a misspelt field is an error instead of a silent deny.
func Input(name string, body []byte) (any, error) {
	var in any
	switch name {
	case policy.PeerVisible:
		in = &policy.PeerInput{}
	case policy.AddParticipant:
		in = &policy.AddInput{}
	case policy.ContactRequest:
		in = &policy.ContactInput{}
	case policy.SendMessage:
		in = &policy.MessageInput{}
	default:
		return nil, fmt.Errorf("%w %q (known: %s, %s, %s, %s)", errUnknownDecision, name,
			policy.PeerVisible, policy.AddParticipant, policy.ContactRequest, policy.SendMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(in); err != nil {
		return nil, fmt.Errorf("cannot decode %s input: %w", name, err)
	}
	var missing []string
	need := func(field, v string) {
		if v == "" {
			missing = append(missing, field)
		}
	}
	switch v := in.(type) {
	case *policy.PeerInput:
		need("agent", v.Agent)
	case *policy.AddInput:
		need("actor", v.Actor)
		need("room", v.Room)
		need("participant", v.Participant)
	case *policy.ContactInput:
		need("from", v.From)
	case *policy.MessageInput:
		need("agent", v.Agent)
		if v.Tokens < 0 || v.CostMicros < 0 {
			return nil, fmt.Errorf("%s input: tokens and cost_micros must not be negative", name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s input: missing %s", name, strings.Join(missing, ", "))
	}
	return in, nil
}

var errUnknownDecision = errors.New("unknown decision")

// Decide evaluates, audits and returns one decision; the HTTP handlers and the CLI go
// through it.
func (a *API) Decide(ctx context.Context, name string, in any) (policy.Decision, error) {
	d, err := a.cfg.Engine.Decide(ctx, name, in)
	if err != nil {
		return d, err
	}
	if a.cfg.Auditor != nil {
		actx, cancel := context.WithTimeout(ctx, a.cfg.AuditTimeout)
		err := a.cfg.Auditor.Produce(actx, []schema.Event{a.auditEvent(name, in, &d)})
		cancel()
		if err != nil {
			a.auditErrs.Inc()
			a.log.Error("cannot write the audit event of a decision", "decision", name, "decision_id", d.DecisionID, "err", err)
			if d.Allow && !a.cfg.FailOpen[name] {
				d.Allow = false
				d.Reasons = append(d.Reasons, policy.Reason{Code: "audit_unavailable",
					Message: "the decision could not be recorded in the audit trail, so access is not granted"})
			}
		}
	}
	result := "deny"
	if d.Allow {
		result = "allow"
	}
	a.decisions.WithLabelValues(name, result).Inc()
	return d, nil
}

// DecidedData is the data of a policy.decided audit event.
type DecidedData struct {
	Decision       string          `json:"decision"`
	Allow          bool            `json:"allow"`
	Reasons        []policy.Reason `json:"reasons"`
	PolicyRevision string          `json:"policy_revision"`
	InputDigest    string          `json:"input_digest"` // SHA-256 of the canonical input JSON
	Input          json.RawMessage `json:"input"`
	RetryAfterMs   int64           `json:"retry_after_ms,omitempty"`
}

func (a *API) auditEvent(name string, in any, d *policy.Decision) schema.Event {
	canonical, _ := json.Marshal(in) // struct fields in a fixed order: canonical
	sum := sha256.Sum256(canonical)
	data, _ := json.Marshal(DecidedData{
		Decision: name, Allow: d.Allow, Reasons: d.Reasons, PolicyRevision: d.PolicyRevision,
		InputDigest: hex.EncodeToString(sum[:]), Input: canonical, RetryAfterMs: d.RetryAfterMs,
	})
	actor, room := subjectOf(in)
	ev := schema.Event{
		ID: d.DecisionID, Type: schema.TypePolicyDecided, Time: time.Now().UTC(), RoomID: room,
		Actor: schema.Party{ID: actor, Type: schema.ActorAgent}, Source: "bandplane-policy",
		SchemaVersion: schema.Version, Data: data,
	}
	if ag, ok := a.cfg.Engine.Directory().Agent(actor); ok {
		ev.OrgID = ag.Org
	}
	return ev
}

func subjectOf(in any) (actor, room string) {
	switch v := in.(type) {
	case *policy.PeerInput:
		return v.Agent, v.Room
	case *policy.AddInput:
		return v.Actor, v.Room
	case *policy.ContactInput:
		return v.From, ""
	case *policy.MessageInput:
		return v.Agent, v.Room
	}
	return "", ""
}

func (a *API) decide(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{"cannot read request body: " + err.Error()})
		return
	}
	in, err := Input(name, body)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errUnknownDecision) {
			status = http.StatusNotFound
		}
		writeJSON(w, status, errorBody{err.Error()})
		return
	}
	d, err := a.Decide(r.Context(), name, in)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, errorBody{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (a *API) peers(w http.ResponseWriter, r *http.Request) {
	in := &policy.PeerInput{Agent: r.URL.Query().Get("agent"), Room: r.URL.Query().Get("room")}
	if in.Agent == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{"query parameter agent is required"})
		return
	}
	d, err := a.Decide(r.Context(), policy.PeerVisible, in)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, errorBody{err.Error()})
		return
	}
	if d.Peers == nil {
		d.Peers = []policy.Peer{}
	}
	writeJSON(w, http.StatusOK, d)
}

func (a *API) reload(w http.ResponseWriter, r *http.Request) {
	rev, err := a.Reload(r.Context())
	if err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{
			"error": err.Error(), "policy_revision": a.cfg.Engine.Revision(),
		})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"policy_revision": rev})
}

// Reload compiles and tests the policy folder (or the built-in bundle) and swaps it in;
// a failing bundle is refused and the old one keeps serving.
func (a *API) Reload(ctx context.Context) (string, error) {
	old := a.cfg.Engine.Revision()
	var rev string
	var err error
	if a.cfg.BundleDir == "" {
		rev, err = a.cfg.Engine.Reload(ctx, policy.DefaultBundle())
	} else {
		rev, err = a.cfg.Engine.ReloadDir(ctx, a.cfg.BundleDir)
	}
	if err != nil {
		a.log.Error("policy reload refused; the previous revision keeps serving", "err", err, "policy_revision", old)
		return "", err
	}
	a.log.Info("policy reloaded", "from", old, "to", rev)
	return rev, nil
}

// suspend handles the operator's suspend and resume: the directory changes at once (the
// next decision sees it), the change is recorded as agent.updated, and a suspension
// also sends the routing core an agent.control stop event. A resume that cannot be
// recorded is undone (no unaudited grant); a suspension stays in force either way.
func (a *API) suspend(suspended bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		dir := a.cfg.Engine.Directory()
		ag, ok := dir.Agent(id)
		if !ok {
			writeJSON(w, http.StatusNotFound, errorBody{fmt.Sprintf("agent %q is not in the directory", id)})
			return
		}
		if err := dir.Suspend(r.Context(), id, suspended); err != nil {
			writeJSON(w, http.StatusInternalServerError, errorBody{err.Error()})
			return
		}
		ag.Suspended = suspended
		var reason struct {
			Reason string `json:"reason"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&reason)
		events := []schema.Event{agentUpdated(ag)}
		if suspended {
			events = append(events, agentControl(ag, "stop", reason.Reason))
		}
		if a.cfg.Auditor != nil {
			actx, cancel := context.WithTimeout(r.Context(), a.cfg.AuditTimeout)
			err := a.cfg.Auditor.Produce(actx, events)
			cancel()
			if err != nil {
				a.auditErrs.Inc()
				if !suspended {
					_ = dir.Suspend(context.WithoutCancel(r.Context()), id, true)
				}
				writeJSON(w, http.StatusServiceUnavailable, errorBody{fmt.Sprintf(
					"cannot record the change in the audit trail (the agent is suspended): %v", err)})
				return
			}
		}
		a.log.Info("agent suspension changed by operator", "agent_id", id, "suspended", suspended, "reason", reason.Reason)
		writeJSON(w, http.StatusOK, map[string]any{"agent": id, "suspended": suspended, "events": eventIDs(events)})
	}
}

func eventIDs(evs []schema.Event) []string {
	out := make([]string, len(evs))
	for i := range evs {
		out[i] = evs[i].ID
	}
	return out
}

func agentUpdated(ag policy.Agent) schema.Event {
	data, _ := json.Marshal(schema.AgentData{
		Handle: ag.Handle, OwnerID: ag.Owner, Model: ag.Model, PersonalRegistryAccess: ag.RegistryAccess,
		SharedWithOrg: ag.SharedWithOrg, Global: ag.Global, Listed: ag.Listed, Suspended: ag.Suspended,
	})
	return schema.Event{
		ID: schema.NewID(), Type: schema.TypeAgentUpdated, Time: time.Now().UTC(), OrgID: ag.Org,
		Actor:   schema.Party{ID: "operator", Type: schema.ActorSystem},
		Subject: &schema.Party{ID: ag.ID, Type: schema.ActorAgent, Handle: ag.Handle},
		Source:  "bandplane-policy", SchemaVersion: schema.Version, Data: data,
	}
}

// agentControl is the stop command the routing core listens for.
func agentControl(ag policy.Agent, action, reason string) schema.Event {
	data, _ := json.Marshal(map[string]string{"action": action, "reason": reason})
	return schema.Event{
		ID: schema.NewID(), Type: schema.TypeAgentControl, Time: time.Now().UTC(), OrgID: ag.Org,
		Actor:   schema.Party{ID: "operator", Type: schema.ActorSystem},
		Subject: &schema.Party{ID: ag.ID, Type: schema.ActorAgent, Handle: ag.Handle},
		Source:  "bandplane-policy", SchemaVersion: schema.Version, Data: data,
	}
}

// Revision is the hash of the policy bundle serving now.
func (a *API) Revision() string { return a.cfg.Engine.Revision() }
