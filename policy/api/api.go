// Package api serves the policy decisions over HTTP and makes each one an audit event:
// POST /v1/decisions/{name}, GET /v1/peers, POST /v1/policy/reload and the operator's
// POST /v1/agents/{id}/suspend|resume.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
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
	FailOpen map[string]bool
	// Auth checks the API key of every HTTP request (schema/README.md, "Keys and roles"):
	// decisions and peers need the router role, reload, suspend and resume the
	// operator or admin role. Nil serves no HTTP (the CLI and the benchmark of the
	// engine call Decide directly).
	Auth         keys.Authenticator
	BundleDir    string // where reload reads the policies ("" = the built-in bundle)
	AuditTimeout time.Duration
	// MaxBodyBytes bounds a request body (default DefaultMaxBodyBytes); a larger one is
	// answered 413.
	MaxBodyBytes int64
	// Shards assigns organizations to the policy replicas of the deployment (nil: this
	// is the only one). A send_message decision of an organization another replica owns
	// is answered 421 with the owner (shard.go), and the budget crossings of those
	// organizations are left to their owner.
	Shards *shard.Shards
	// Gate checks a bundle before a reload makes it serve (serve's replay of the last
	// day with it, --policy-max-flip-ratio); an error refuses it, and the running
	// bundle keeps serving. A *GateRefusal is audited as policy.reload_refused. Nil: no
	// gate.
	Gate       func(ctx context.Context, bundle fs.FS) error
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// GateRefusal is the gate's refusal of a bundle: the data of its policy.reload_refused
// event.
type GateRefusal struct {
	Revision    string    `json:"policy_revision"` // the refused bundle's
	Running     string    `json:"running_revision"`
	From        time.Time `json:"from"`
	To          time.Time `json:"to"`
	Decisions   int       `json:"decisions"`
	AllowToDeny int       `json:"allow_to_deny"`
	DenyToAllow int       `json:"deny_to_allow"`
	FlipRatio   float64   `json:"flip_ratio"`
	MaxRatio    float64   `json:"max_flip_ratio"`
}

func (g *GateRefusal) Error() string {
	return fmt.Sprintf("the replay of %d decisions from %s to %s flips %d to deny and %d to allow with it: a flip ratio of %.4f, above --policy-max-flip-ratio %g",
		g.Decisions, g.From.Format(time.RFC3339), g.To.Format(time.RFC3339), g.AllowToDeny, g.DenyToAllow, g.FlipRatio, g.MaxRatio)
}

// DefaultMaxBodyBytes is the largest decision request body by default: inputs are a few
// ids and numbers.
const DefaultMaxBodyBytes = 64 << 10

// API is an http.Handler.
type API struct {
	cfg            Config
	log            *slog.Logger
	mux            *http.ServeMux
	decisions      *prometheus.CounterVec
	auditErrs      prometheus.Counter
	reloadsRefused prometheus.Counter
	reloading      sync.Mutex
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
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Shards != nil && cfg.Auditor != nil {
		cfg.Auditor = ownedCrossings{Auditor: cfg.Auditor, shards: cfg.Shards}
	}
	a := &API{cfg: cfg, log: cfg.Logger.With("component", "policy-api"), mux: http.NewServeMux(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_policy_decisions_total",
			Help: "Policy decisions by decision and result."}, []string{"decision", "result"}),
		auditErrs: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_policy_audit_errors_total",
			Help: "Decisions whose audit event could not be written."}),
		reloadsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_policy_reloads_refused_total",
			Help: "Policy reloads the replay gate refused (--policy-max-flip-ratio); the running bundle kept serving."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(a.decisions, a.auditErrs, a.reloadsRefused)
	}
	if cfg.Auth != nil {
		router := keys.Require(cfg.Auth, keys.RoleRouter)
		operators := keys.Require(cfg.Auth, keys.RoleOperator, keys.RoleAdmin)
		a.mux.Handle("POST /v1/decisions/{name}", router(http.HandlerFunc(a.decide)))
		a.mux.Handle("GET /v1/peers", router(http.HandlerFunc(a.peers)))
		a.mux.Handle("POST /v1/policy/reload", operators(http.HandlerFunc(a.reload)))
		a.mux.Handle("POST /v1/agents/{id}/suspend", operators(a.suspend(true)))
		a.mux.Handle("POST /v1/agents/{id}/resume", operators(a.suspend(false)))
	}
	return a, nil
}

// ServeHTTP serves the decision API; without Config.Auth every request is refused.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Auth == nil {
		keys.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the policy API has no key store configured")
		return
	}
	a.mux.ServeHTTP(w, r)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	code := "bad_request"
	switch status {
	case http.StatusNotFound:
		code = "not_found"
	case http.StatusRequestEntityTooLarge:
		code = "too_large"
	case http.StatusUnprocessableEntity:
		code = "policy_refused"
	case http.StatusServiceUnavailable:
		code = "unavailable"
	case http.StatusInternalServerError:
		code = "internal"
	}
	keys.WriteError(w, status, code, msg)
}

// readBody reads a request body of at most MaxBodyBytes: 413 when it is larger, 400
// when it cannot be read. It reports whether the handler may go on.
func (a *API) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", a.cfg.MaxBodyBytes))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "cannot read request body: "+err.Error())
		return nil, false
	}
	return body, true
}

// ownAgent says whether the request's key may act on agent: a platform key on any, an
// organization's key on the agents registered in its organization only. The answer to
// an organization's key is the same for an agent of another organization and for one
// that does not exist, so that it learns neither who exists nor where.
func (a *API) ownAgent(r *http.Request, agent string) bool {
	k, _ := keys.FromContext(r.Context())
	if k.Platform() {
		return true
	}
	ag, ok := a.cfg.Engine.Directory().Agent(agent)
	return ok && k.MayActOn(ag.Org)
}

// mayAsk refuses (403) a decision about an agent the key may not act on.
func (a *API) mayAsk(w http.ResponseWriter, r *http.Request, agent string) bool {
	if a.ownAgent(r, agent) {
		return true
	}
	k, _ := keys.FromContext(r.Context())
	keys.WriteError(w, http.StatusForbidden, keys.CodeForbidden, fmt.Sprintf(
		"key %s (%s) of organization %s may ask only about agents registered in its organization; %q is not one", k.ID, k.Role, k.Org, agent))
	return false
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
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, fmt.Errorf("%s input: the request body is empty; send a JSON object", name)
	}
	// One JSON object, held to the rules of event lines (no duplicate keys, valid UTF-8,
	// bounded depth, nothing after it).
	if err := schema.CheckJSON(body); err != nil {
		return nil, fmt.Errorf("cannot decode %s input: %w", name, err)
	}
	if m, ok := in.(*policy.MessageInput); ok {
		if err := decodeMessage(body, m); err != nil {
			return nil, fmt.Errorf("cannot decode %s input: %w", name, err)
		}
	} else if err := decodeStrict(body, in); err != nil {
		return nil, fmt.Errorf("cannot decode %s input: %w", name, err)
	}
	if err := checkIDs(in); err != nil {
		return nil, fmt.Errorf("%s input: %w", name, err)
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
		if v.Chain != nil {
			if err := v.Chain.Validate(); err != nil {
				return nil, fmt.Errorf("%s input: %w", name, err)
			}
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s input: missing %s", name, strings.Join(missing, ", "))
	}
	return in, nil
}

var errUnknownDecision = errors.New("unknown decision")

// decodeStrict decodes body into v, refusing unknown fields.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	return typeError("input.", dec.Decode(v))
}

// decodeMessage decodes a send_message input, its chain on its own, so that an error
// inside the chain names its field ("input.chain.depth: …"): the decoder's own message
// of an unknown field names only the key. The chain must be an object (not null).
func decodeMessage(body []byte, m *policy.MessageInput) error {
	var wire struct {
		policy.MessageInput
		Chain json.RawMessage `json:"chain"` // shadows MessageInput.Chain
	}
	if err := decodeStrict(body, &wire); err != nil {
		return err
	}
	*m = wire.MessageInput
	raw := bytes.TrimSpace(wire.Chain)
	if wire.Chain == nil {
		return nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("input.chain: must be an object, got %s", clip(raw))
	}
	var c policy.Chain
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return fmt.Errorf("input.chain: unknown field %s (known: depth, handoffs, initiator, initiator_type)", f)
		}
		return typeError("input.chain.", err)
	}
	m.Chain = &c
	return nil
}

// typeError names the input field of a JSON type error ("input.chain.depth: must be a
// number (int64), got string"); other errors pass unchanged.
func typeError(prefix string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		field := strings.TrimPrefix(te.Field, "MessageInput.") // decodeMessage's embedding is no field of the input
		return fmt.Errorf("%s%s: must be a %s, got %s", prefix, field, kindOf(te.Type.Kind().String()), te.Value)
	}
	return err
}

func kindOf(k string) string {
	switch k {
	case "int64", "int", "int32":
		return "whole number"
	case "struct", "ptr":
		return "JSON object"
	}
	return k
}

// clip is at most 32 bytes of b, for an error message.
func clip(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "…"
	}
	return string(b)
}

// checkIDs holds the ids of an input to the limits of event ids (schema.MaxIDBytes, no
// control characters, valid UTF-8), so that nothing a caller names can be longer or
// stranger than what the audit trail stores.
func checkIDs(in any) error {
	var fields [][2]string
	switch v := in.(type) {
	case *policy.PeerInput:
		fields = [][2]string{{"agent", v.Agent}, {"room", v.Room}, {"candidate", v.Candidate}}
	case *policy.AddInput:
		fields = [][2]string{{"actor", v.Actor}, {"room", v.Room}, {"participant", v.Participant}}
	case *policy.ContactInput:
		fields = [][2]string{{"from", v.From}, {"handle", v.Handle}}
	case *policy.MessageInput:
		fields = [][2]string{{"agent", v.Agent}, {"room", v.Room}, {"execution_id", v.ExecutionID}}
	}
	for _, f := range fields {
		if err := checkID(f[0], f[1]); err != nil {
			return err
		}
	}
	return nil
}

func checkID(field, v string) error {
	if len(v) > schema.MaxIDBytes {
		return fmt.Errorf("%s is %d bytes long, more than %d", field, len(v), schema.MaxIDBytes)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%s is not valid UTF-8", field)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] == 0x7f {
			return fmt.Errorf("%s has a control character at byte %d", field, i)
		}
	}
	return nil
}

// Decide evaluates, audits and returns one decision; the HTTP handlers and the CLI go
// through it. With Config.Shards, a send_message decision of an organization another
// replica owns is a *MisdirectedError, taken before anything is evaluated, audited or
// reserved.
func (a *API) Decide(ctx context.Context, name string, in any) (policy.Decision, error) {
	stateful := name == policy.SendMessage && a.cfg.Shards != nil
	if stateful {
		if err := a.misdirected(in); err != nil {
			return policy.Decision{}, err
		}
	}
	at := time.Now()
	d, err := a.cfg.Engine.Decide(ctx, name, in)
	if err != nil {
		return d, err
	}
	if stateful {
		if err := a.registeredMeanwhile(&d, in); err != nil {
			return policy.Decision{}, err
		}
		a.initiatorElsewhere(&d, in)
	}
	if a.cfg.Auditor != nil {
		var taken *TakenData
		if name == policy.SendMessage && d.Allow && d.Quota != nil {
			taken = a.taken(at, in, &d)
		}
		actx, cancel := context.WithTimeout(ctx, a.cfg.AuditTimeout)
		err := a.cfg.Auditor.Produce(actx, []schema.Event{a.auditEvent(ctx, name, in, &d, taken)})
		cancel()
		if err != nil {
			a.auditErrs.Inc()
			a.log.Error("cannot write the audit event of a decision", "decision", name, "decision_id", d.DecisionID, "err", err)
			if d.Allow && !a.cfg.FailOpen[name] {
				// Neither the reservation nor the rate is taken by a decision that is not
				// granted: the limiter then counts exactly the allowed decisions of the
				// trail, which is what a restarted replica rebuilds it from.
				a.giveBack(&d, in)
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
	// RequestedBy is the id of the API key that asked (absent for the CLI).
	RequestedBy string `json:"requested_by,omitempty"`
	// Taken is what an allowed send_message took (absent on every other decision).
	Taken *TakenData `json:"taken,omitempty"`
	// Position and DecidedAt make a replay of the decision exact (policy.Decision): the
	// records of the events topic the directory had applied when the decision read it
	// (partition → next offset not applied; absent for a directory not kept from the
	// topic), and the engine's clock, which the limiter and the ledger read. Last, so
	// the first keys stay where the SQL reads them.
	Position  policy.Position `json:"position,omitempty"`
	DecidedAt time.Time       `json:"decided_at"`
}

// TakenData is what an allowed send_message decision took from the limiter and the
// ledger, written into its audit event so that the replica that owns the organization
// after a restart rebuilds exactly that state from the trail (policy/replica).
type TakenData struct {
	// At is read before the engine decides: never later than the engine's own clock,
	// so replaying the event at it never takes more than the decision did.
	At    time.Time    `json:"at"`
	Quota policy.Quota `json:"quota"`
	// AgentTAT and RoomTAT are the theoretical arrival times of the agent's rate and of
	// its rate in the room right after this decision (policy.Limiter.TAT): the state of
	// the limiter whatever came before (a sender saturated for longer than the window
	// carries its first burst in them). Absent for an unlimited rate.
	AgentTAT time.Time `json:"agent_tat,omitzero"`
	RoomTAT  time.Time `json:"room_tat,omitzero"`
	// ReservationExpires is when the estimate reserved on the budgets expires unless a
	// usage report of its execution settles it first.
	ReservationExpires time.Time `json:"reservation_expires,omitzero"`
}

// taken reads what the allowed send_message d took. A concurrent decision of the same
// agent may have taken after it (a TAT read later is never earlier): a restore from it
// can be stricter than the live limiter by the other decision, never looser.
func (a *API) taken(at time.Time, in any, d *policy.Decision) *TakenData {
	t := &TakenData{At: at.UTC(), Quota: *d.Quota, ReservationExpires: d.ReservationExpires}
	agent, room := d.Agent, roomOf(in) // the keys Engine.enforce took
	lim := a.cfg.Engine.Limiter()
	if tat, ok := lim.TAT(policy.AgentRateKey(agent)); ok && d.Quota.MessagesPerWindowAgent > 0 {
		t.AgentTAT = tat.UTC()
	}
	if tat, ok := lim.TAT(policy.RoomRateKey(agent, room)); ok && d.Quota.MessagesPerWindowAgentRoom > 0 {
		t.RoomTAT = tat.UTC()
	}
	return t
}

// giveBack returns what a granted send_message took (its reservation and both rates)
// when it is not granted after all.
func (a *API) giveBack(d *policy.Decision, in any) {
	if d.Name == policy.SendMessage && d.Quota != nil {
		agent, room := d.Agent, roomOf(in)
		window := time.Duration(d.Quota.WindowSeconds) * time.Second
		lim := a.cfg.Engine.Limiter()
		lim.Undo(policy.RoomRateKey(agent, room), int(d.Quota.MessagesPerWindowAgentRoom), window)
		lim.Undo(policy.AgentRateKey(agent), int(d.Quota.MessagesPerWindowAgent), window)
	}
	a.cfg.Engine.Release(d)
}

func (a *API) auditEvent(ctx context.Context, name string, in any, d *policy.Decision, taken *TakenData) schema.Event {
	canonical, _ := json.Marshal(in) // struct fields in a fixed order: canonical
	sum := sha256.Sum256(canonical)
	data, _ := json.Marshal(DecidedData{
		Decision: name, Allow: d.Allow, Reasons: d.Reasons, PolicyRevision: d.PolicyRevision,
		InputDigest: hex.EncodeToString(sum[:]), Input: canonical, RetryAfterMs: d.RetryAfterMs,
		RequestedBy: keyID(ctx), Taken: taken, Position: d.Position, DecidedAt: d.DecidedAt.UTC(),
	})
	actor, room := subjectOf(in)
	ev := schema.Event{
		ID: d.DecisionID, Type: schema.TypePolicyDecided, Time: time.Now().UTC(), RoomID: room,
		Actor: schema.Party{ID: actor, Type: schema.ActorAgent}, Source: SourcePolicy,
		SchemaVersion: schema.Version, Data: data,
	}
	if ag, ok := a.cfg.Engine.Directory().Agent(actor); ok {
		ev.OrgID = ag.Org
	}
	return ev
}

// keyID is the id of the API key of the request in ctx, or "".
func keyID(ctx context.Context) string {
	k, _ := keys.FromContext(ctx)
	return k.ID
}

// roomOf is the room of a typed input ("" for other forms).
func roomOf(in any) string {
	_, room := subjectOf(in)
	return room
}

// messageOf is a typed send_message input, or nil.
func messageOf(in any) *policy.MessageInput {
	switch v := in.(type) {
	case policy.MessageInput:
		return &v
	case *policy.MessageInput:
		return v
	}
	return nil
}

// mayName refuses (403) a send_message whose chain names a person or an agent as its
// initiator that the key may not act on: the decision reserves on the initiator's
// budgets, and a key of one organization must not spend another's. Only the platform's
// key (the routing core's) names initiators of other organizations. The answer is the
// same for an initiator of another organization and for one that does not exist.
func (a *API) mayName(w http.ResponseWriter, r *http.Request, in any) bool {
	m := messageOf(in)
	if m == nil || m.Chain == nil || m.Chain.Initiator == "" || m.Chain.InitiatorType == "system" {
		return true
	}
	k, _ := keys.FromContext(r.Context())
	if k.Platform() {
		return true
	}
	if org, ok := a.cfg.Engine.Directory().InitiatorOrg(m.Chain.Initiator, m.Chain.InitiatorType, ""); ok && k.MayActOn(org) {
		return true
	}
	keys.WriteError(w, http.StatusForbidden, keys.CodeForbidden, fmt.Sprintf(
		"key %s (%s) of organization %s may name as input.chain.initiator only people and agents registered in its organization; %q is not one (a chain across organizations is the platform's: ask with its key)",
		k.ID, k.Role, k.Org, m.Chain.Initiator))
	return false
}

func subjectOf(in any) (actor, room string) {
	switch v := in.(type) {
	case policy.PeerInput:
		return v.Agent, v.Room
	case policy.AddInput:
		return v.Actor, v.Room
	case policy.ContactInput:
		return v.From, ""
	case policy.MessageInput:
		return v.Agent, v.Room
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
	body, ok := a.readBody(w, r)
	if !ok {
		return
	}
	in, err := Input(name, body)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errUnknownDecision) {
			status = http.StatusNotFound
		}
		writeError(w, status, err.Error())
		return
	}
	if actor, _ := subjectOf(in); !a.mayAsk(w, r, actor) || !a.mayName(w, r, in) {
		return
	}
	d, err := a.Decide(r.Context(), name, in)
	if err != nil {
		var mis *MisdirectedError
		if errors.As(err, &mis) {
			a.writeMisdirected(w, mis)
			return
		}
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if name == policy.SendMessage && a.cfg.Shards != nil && d.Org != "" {
		// The organization is this replica's (Decide checked): the client pins the agent
		// to it (policy/client). An unknown agent's answer names no owner.
		w.Header().Set(OwnerHeader, a.cfg.Shards.Self())
	}
	if p, ok := in.(*policy.PeerInput); ok && p.Candidate == "" {
		keys.WriteJSON(w, http.StatusOK, peerList(d))
		return
	}
	keys.WriteJSON(w, http.StatusOK, d)
}

// peerList is a list answer of peer_visible: "peers" is always there, [] when empty.
func peerList(d policy.Decision) any {
	if d.Peers == nil {
		d.Peers = []policy.Peer{}
	}
	return struct {
		policy.Decision
		Peers []policy.Peer `json:"peers"`
	}{d, d.Peers}
}

func (a *API) peers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	in := &policy.PeerInput{Agent: q.Get("agent"), Room: q.Get("room")}
	if in.Agent == "" {
		writeError(w, http.StatusBadRequest, "query parameter agent is required")
		return
	}
	if err := checkIDs(in); err != nil {
		writeError(w, http.StatusBadRequest, "peers: "+err.Error())
		return
	}
	if !a.mayAsk(w, r, in.Agent) {
		return
	}
	d, err := a.Decide(r.Context(), policy.PeerVisible, in)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	keys.WriteJSON(w, http.StatusOK, peerList(d))
}

func (a *API) reload(w http.ResponseWriter, r *http.Request) {
	// The bundle decides for every organization: only a platform key may swap it.
	if k, _ := keys.FromContext(r.Context()); !k.Platform() {
		keys.Forbidden(w, k, keys.PlatformOrg)
		return
	}
	rev, err := a.Reload(r.Context())
	if err != nil {
		keys.WriteJSON(w, http.StatusUnprocessableEntity, map[string]string{
			"error": err.Error(), "code": "policy_refused", "policy_revision": a.cfg.Engine.Revision(),
		})
		return
	}
	keys.WriteJSON(w, http.StatusOK, map[string]string{"policy_revision": rev})
}

// Reload compiles and tests the policy folder (or the built-in bundle), passes it
// through the gate, and swaps it in; a failing or refused bundle is refused and the old
// one keeps serving.
func (a *API) Reload(ctx context.Context) (string, error) {
	// One reload at a time (an HTTP reload and the folder's watch), and of one copy of
	// the folder: what the gate replayed is what goes live, whatever changes meanwhile.
	a.reloading.Lock()
	defer a.reloading.Unlock()
	old := a.cfg.Engine.Revision()
	bundle := policy.DefaultBundle()
	if a.cfg.BundleDir != "" {
		snap, err := os.MkdirTemp("", "bandplane-policy-")
		if err != nil {
			return "", fmt.Errorf("cannot reload policy bundle (keeping %s): %w", old, err)
		}
		defer func() { _ = os.RemoveAll(snap) }()
		if err := os.CopyFS(snap, os.DirFS(a.cfg.BundleDir)); err != nil {
			return "", fmt.Errorf("cannot reload policy bundle (keeping %s): cannot read %s: %w", old, a.cfg.BundleDir, err)
		}
		bundle = os.DirFS(snap)
	}
	// The gate replays only a bundle that compiles and passes its tests: a broken one
	// is refused as broken, not by the gate.
	var gateErr error
	var gate func(context.Context, fs.FS) error
	if a.cfg.Gate != nil {
		gate = func(ctx context.Context, b fs.FS) error { gateErr = a.cfg.Gate(ctx, b); return gateErr }
	}
	rev, err := a.cfg.Engine.ReloadChecked(ctx, bundle, gate)
	if gateErr != nil {
		a.refused(ctx, old, gateErr)
		return "", err
	}
	if err != nil {
		a.log.Error("policy reload refused; the previous revision keeps serving", "err", err, "policy_revision", old)
		return "", err
	}
	a.log.Info("policy reloaded", "from", old, "to", rev)
	return rev, nil
}

// refused logs and counts a reload the gate refused, and audits it when the gate says
// why with its counts.
func (a *API) refused(ctx context.Context, running string, err error) {
	a.reloadsRefused.Inc()
	a.log.Error("policy reload refused by the replay gate; the previous revision keeps serving", "err", err, "policy_revision", running)
	var g *GateRefusal
	if !errors.As(err, &g) || a.cfg.Auditor == nil {
		return
	}
	g.Running = running
	data, _ := json.Marshal(g)
	ev := schema.Event{ID: schema.NewID(), Type: schema.TypePolicyReloadRefused, Time: time.Now().UTC(),
		Actor: schema.Party{ID: "bandplane-policy", Type: schema.ActorSystem}, Source: SourcePolicy, SchemaVersion: schema.Version, Data: data}
	actx, cancel := context.WithTimeout(ctx, a.cfg.AuditTimeout)
	defer cancel()
	if err := a.cfg.Auditor.Produce(actx, []schema.Event{ev}); err != nil {
		a.auditErrs.Inc()
		a.log.Error("cannot write the audit event of a refused reload", "err", err)
	}
}

// MaxReasonBytes bounds the reason an operator gives for a suspension.
const MaxReasonBytes = 1024

// suspend handles the operator's POST /v1/agents/{id}/suspend and resume (SetSuspended).
func (a *API) suspend(suspended bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		by, _ := keys.FromContext(r.Context())
		if !a.ownAgent(r, id) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("agent %q is not in the directory of this key's organization", id))
			return
		}
		body, ok := a.readBody(w, r)
		if !ok {
			return
		}
		var req struct {
			Reason string `json:"reason"`
		}
		if len(bytes.TrimSpace(body)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			err := schema.CheckJSON(body)
			if err == nil {
				err = dec.Decode(&req)
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, `cannot decode the body (want {"reason": "..."} or nothing): `+err.Error())
				return
			}
		}
		_, events, err := a.SetSuspended(r.Context(), by, id, suspended, req.Reason)
		if err != nil {
			writeError(w, StatusOf(err), err.Error())
			return
		}
		keys.WriteJSON(w, http.StatusOK, map[string]any{"agent": id, "suspended": suspended, "events": events})
	}
}

// StatusOf is the HTTP status of an error of this package's operations.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, schema.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, schema.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, schema.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, schema.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func eventIDs(evs []schema.Event) []string {
	out := make([]string, len(evs))
	for i := range evs {
		out[i] = evs[i].ID
	}
	return out
}

// SourcePolicy is the source of the events the policy API writes.
const SourcePolicy = schema.SourceBandplane + "-policy"

// OperatorData is the data of agent.suspended and agent.resumed.
type OperatorData struct {
	Reason  string `json:"reason,omitempty"`
	KeyName string `json:"key_name,omitempty"`
}

// operator is the actor of an operator's action: the API key that did it.
func operator(by keys.Key) schema.Party {
	id := by.ID
	if id == "" {
		id = "operator"
	}
	return schema.Party{ID: id, Type: schema.ActorSystem}
}

func operatorAction(ag policy.Agent, suspended bool, reason string, by keys.Key) schema.Event {
	typ := schema.TypeAgentResumed
	if suspended {
		typ = schema.TypeAgentSuspended
	}
	data, _ := json.Marshal(OperatorData{Reason: reason, KeyName: by.Name})
	return schema.Event{
		ID: schema.NewID(), Type: typ, Time: time.Now().UTC(), OrgID: ag.Org,
		Actor:   operator(by),
		Subject: &schema.Party{ID: ag.ID, Type: schema.ActorAgent, Handle: ag.Handle},
		Source:  SourcePolicy, SchemaVersion: schema.Version, Data: data,
	}
}

// agentControl is the stop command the routing core listens for.
func agentControl(ag policy.Agent, action, reason string, by keys.Key) schema.Event {
	data, _ := json.Marshal(map[string]string{"action": action, "reason": reason})
	return schema.Event{
		ID: schema.NewID(), Type: schema.TypeAgentControl, Time: time.Now().UTC(), OrgID: ag.Org,
		Actor:   operator(by),
		Subject: &schema.Party{ID: ag.ID, Type: schema.ActorAgent, Handle: ag.Handle},
		Source:  SourcePolicy, SchemaVersion: schema.Version, Data: data,
	}
}

// Revision is the hash of the policy bundle serving now.
func (a *API) Revision() string { return a.cfg.Engine.Revision() }
