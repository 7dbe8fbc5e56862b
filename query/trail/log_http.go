package trail

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/tlog"
)

// The audit log's read side over HTTP (query/trail/README.md): an
// organization's newest checkpoint and the proofs a witness or an auditor checks
// against it. Every answer is checked against the audit key ring before it is sent.
//
//	GET /v1/audit/checkpoint[?org=ORG]    the signed note (text/plain); a platform key
//	                                      without org gets every organization's (JSON)
//	GET /v1/audit/proof?org=ORG&from=N[&to=M]
//	                                      consistency proof from size N to M (default:
//	                                      the newest checkpoint)
//	GET /v1/audit/proof?org=ORG&event=ID&time=T
//	                                      inclusion proof of a sealed event
//	GET /v1/audit/rotations               the key rotation records (JSON), which a
//	                                      reader anchored at one key follows to the
//	                                      others
//
// The listing of every organization's checkpoint has an entry per organization with a
// checkpoint in ClickHouse or on the checkpoints topic; one whose newest checkpoint
// cannot be served carries an error instead, so that one damaged log does not hide
// the others.

// latestCheckpoints caches the checkpoints topic's newest note per organization for
// checkpointRefresh, so that a burst of requests reads the topic once. A failed read is
// kept as long: with Kafka down, each request would otherwise wait for it again (a
// witness pass asks several times).
type latestCheckpoints struct {
	read func(ctx context.Context) (map[string][]byte, error)

	mu      sync.Mutex
	at      time.Time
	last    map[string][]byte
	lastErr error
}

const checkpointRefresh = 5 * time.Second

func (l *latestCheckpoints) get(ctx context.Context) (map[string][]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.last != nil || l.lastErr != nil) && time.Since(l.at) < checkpointRefresh {
		return l.last, l.lastErr
	}
	m, err := l.read(ctx)
	if err != nil && ctx.Err() != nil {
		return nil, err // the request's own end, not the topic's
	}
	l.last, l.lastErr, l.at = m, err, time.Now()
	if err != nil {
		l.last = nil
	}
	return l.last, err
}

type logHandler struct {
	log    *Log // nil without an audit key
	latest *latestCheckpoints
	logger *slog.Logger
}

// LogHandler serves /v1/audit/checkpoint, /v1/audit/proof and /v1/audit/rotations
// for the roles compliance and admin, from l (nil without an audit key: every request
// is 503) and latest, the checkpoints topic's newest notes (cached here).
func LogHandler(l *Log, latest func(ctx context.Context) (map[string][]byte, error), auth keys.Authenticator, log *slog.Logger) http.Handler {
	h := &logHandler{log: l, latest: &latestCheckpoints{read: latest}, logger: log.With("component", "audit_log")}
	return keys.Require(auth, keys.RoleCompliance, keys.RoleAdmin)(h)
}

// maxProofParam bounds a size of the proof endpoints: what a log can hold.
const maxProofParam = 1 << 62

func (h *logHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		keys.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" "+r.URL.Path+": use GET")
		return
	}
	if h.log == nil {
		keys.WriteError(w, http.StatusServiceUnavailable, "unavailable",
			"the audit log is checked against the audit key, and this serve has none: start it with --audit-key (env BANDPLANE_AUDIT_KEY)")
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		keys.WriteError(w, http.StatusBadRequest, "bad_request", "malformed query string: "+err.Error())
		return
	}
	known := map[string]bool{"org": true}
	switch r.URL.Path {
	case "/v1/audit/proof":
		known["from"], known["to"], known["event"], known["time"] = true, true, true, true
	case "/v1/audit/rotations":
		known = map[string]bool{} // the deployment's, not an organization's
	}
	var problems []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range q {
			if !yield(k) {
				return
			}
		}
	}) {
		switch {
		case !known[name]:
			problems = append(problems, fmt.Sprintf("unknown parameter %s", showParam(name)))
		case len(q[name]) > 1:
			problems = append(problems, fmt.Sprintf("%s: given %d times; give it once", name, len(q[name])))
		}
	}
	if len(problems) > 0 {
		keys.WriteError(w, http.StatusBadRequest, "bad_request", strings.Join(problems, "; "))
		return
	}
	ctx := r.Context()
	if r.URL.Path == "/v1/audit/rotations" {
		h.rotations(w, r, h.topic(ctx))
		return
	}
	k, _ := keys.FromContext(ctx)
	_, hasOrg := q["org"]
	org := q.Get("org")
	if hasOrg {
		if err := CheckOrgParam(org, k.Platform()); err != nil {
			keys.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
			return
		}
	}
	switch {
	case hasOrg && !k.MayActOn(org):
		keys.Forbidden(w, k, org)
		return
	case !hasOrg && !k.Platform():
		org, hasOrg = k.Org, true
	}
	latest := h.topic(ctx)
	ring, err := h.log.RingWith(ctx, TopicRotations(latest))
	if err != nil {
		h.fail(w, err)
		return
	}
	if r.URL.Path == "/v1/audit/checkpoint" {
		if !hasOrg {
			h.all(w, r, ring, latest)
			return
		}
		c, err := h.newest(ctx, ring, org, latest)
		if err != nil {
			h.fail(w, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Bandplane-Log-Size", strconv.FormatUint(c.Size, 10))
		_, _ = w.Write(c.Note)
		return
	}
	if !hasOrg {
		keys.WriteError(w, http.StatusBadRequest, "bad_request", "org: required: a platform key names the organization (org=…; org= with no value is the log of events stored without one)")
		return
	}
	h.proof(w, r, ring, org, q, latest)
}

func showParam(s string) string {
	if len(s) > 64 || !utf8.ValidString(s) {
		return fmt.Sprintf("of %d bytes", len(s))
	}
	return strconv.Quote(s)
}

// CheckOrgParam refuses what no organization id can be; "" (the events stored without
// one) is a platform key's only.
func CheckOrgParam(org string, platform bool) error {
	switch {
	case org == "" && !platform:
		return errors.New("org: empty: only a platform key reads the log of events stored without an organization")
	case len(org) > schema.MaxIDBytes:
		return fmt.Errorf("org: %d bytes, more than %d", len(org), schema.MaxIDBytes)
	case !utf8.ValidString(org):
		return errors.New("org: not valid UTF-8")
	}
	for i, c := range org {
		if unicode.IsControl(c) {
			return fmt.Errorf("org: a control character at byte %d", i)
		}
	}
	return nil
}

// topic is the checkpoints topic's newest notes: fresher checkpoints than ClickHouse's,
// and rotation records ClickHouse may have lost. When the topic cannot be read it is
// nil, and ClickHouse's alone are served.
func (h *logHandler) topic(ctx context.Context) map[string][]byte {
	latest, err := h.latest.get(ctx)
	if err != nil {
		h.logger.Warn("cannot read the checkpoints topic; serving ClickHouse's checkpoints and rotation records", "err", err)
	}
	return latest
}

// isOrgKey says whether a key of the checkpoints topic names an organization (the
// coverage note's and the rotation records' keys start with a control character, which
// no organization id holds).
func isOrgKey(key string) bool {
	return CheckOrgParam(key, true) == nil
}

// newest is org's newest checkpoint: the checkpoints topic's when it verifies and is
// no older than ClickHouse's (it is fresher: every run signs one), else ClickHouse's.
func (h *logHandler) newest(ctx context.Context, ring *tlog.KeyRing, org string, latest map[string][]byte) (tlog.Checkpoint, error) {
	stored, err := h.log.Newest(ctx, ring, org)
	if err != nil && !errors.Is(err, ErrNotInLog) {
		return tlog.Checkpoint{}, err
	}
	return combineNewest(ring, org, stored, err, latest)
}

// combineNewest chooses between ClickHouse's newest checkpoint of org (stored, or why
// there is none: serr, wrapping ErrNotInLog) and the topic's.
func combineNewest(ring *tlog.KeyRing, org string, stored tlog.Checkpoint, serr error, latest map[string][]byte) (tlog.Checkpoint, error) {
	if note, ok := latest[org]; ok {
		if c, oerr := ring.Open(note); oerr == nil && c.Org == org && c.Size >= stored.Size {
			if c.Size > stored.Size && serr == nil {
				// ClickHouse lost what the topic holds: serve neither, say so.
				return tlog.Checkpoint{}, fmt.Errorf("%w: the checkpoints topic has a checkpoint of %d leaves for organization %q, ClickHouse's log only %d: rolled back",
					ErrLogDamaged, c.Size, org, stored.Size)
			}
			if serr == nil || c.Size > 0 {
				return c, nil
			}
		}
	}
	return stored, serr
}

// CheckpointEntry is one organization's line of the listing: its newest checkpoint, or
// why it cannot be served.
type CheckpointEntry struct {
	Org        string     `json:"org"`
	Size       uint64     `json:"size,omitempty"`
	SignedAt   *time.Time `json:"signed_at,omitempty"`
	Checkpoint string     `json:"checkpoint,omitempty"`
	Error      string     `json:"error,omitempty"`
}

// all lists every organization's newest checkpoint: ClickHouse's newest rows of every
// organization in one query, opened here, each chosen against the topic's; an
// organization only the topic has is listed too (its rows in ClickHouse are gone, which
// its proofs then show).
func (h *logHandler) all(w http.ResponseWriter, r *http.Request, ring *tlog.KeyRing, latest map[string][]byte) {
	heads, err := h.log.Heads(r.Context(), ring)
	if err != nil {
		h.fail(w, err)
		return
	}
	out := []CheckpointEntry{}
	listed := map[string]bool{}
	add := func(org string, c tlog.Checkpoint, err error) {
		listed[org] = true
		if err != nil {
			h.logger.Warn("an organization's newest checkpoint cannot be served", "org_id", org, "err", err)
			out = append(out, CheckpointEntry{Org: org, Error: err.Error()})
			return
		}
		at := c.SignedAt
		out = append(out, CheckpointEntry{Org: org, Size: c.Size, SignedAt: &at, Checkpoint: string(c.Note)})
	}
	for _, hd := range heads {
		c, err := combineNewest(ring, hd.Org, hd.Checkpoint, hd.Err, latest)
		add(hd.Org, c, err)
	}
	for org := range latest {
		if listed[org] || !isOrgKey(org) {
			continue
		}
		c, err := combineNewest(ring, org, tlog.Checkpoint{},
			fmt.Errorf("%w: organization %q has no checkpoint in ClickHouse, and the checkpoints topic's does not verify with the audit key", ErrNotInLog, org), latest)
		add(org, c, err)
	}
	slices.SortFunc(out, func(a, b CheckpointEntry) int { return strings.Compare(a.Org, b.Org) })
	keys.WriteJSON(w, http.StatusOK, out)
}

// RotationEntry is one key rotation record with what it says.
type RotationEntry struct {
	OldKeyID string    `json:"old_key_id"`
	NewKeyID string    `json:"new_key_id"`
	From     time.Time `json:"from"`
	Record   string    `json:"record"`
}

// RotationsAnswer is what /v1/audit/rotations answers.
type RotationsAnswer struct {
	Rotations []RotationEntry `json:"rotations"`
}

// rotations serves the rotation records of ClickHouse and of the checkpoints topic that
// verify on their own (signed by both their keys). Serving what ClickHouse holds is safe:
// a reader follows a record only from a key it trusts, and a forged one does not verify.
func (h *logHandler) rotations(w http.ResponseWriter, r *http.Request, latest map[string][]byte) {
	stored, err := h.log.Rotations(r.Context())
	if err != nil {
		h.fail(w, err)
		return
	}
	ans := RotationsAnswer{Rotations: []RotationEntry{}}
	seen := map[string]bool{}
	for _, n := range append(stored, TopicRotations(latest)...) {
		if seen[string(n)] || len(seen) >= maxServedRotations {
			continue
		}
		seen[string(n)] = true
		rec, err := tlog.OpenRotation(h.log.Prefix(), n)
		if err != nil {
			h.logger.Warn("not serving a key rotation record that does not verify (audit verify names it)", "err", err)
			continue
		}
		ans.Rotations = append(ans.Rotations, RotationEntry{OldKeyID: tlog.KeyID(rec.Old), NewKeyID: tlog.KeyID(rec.New), From: rec.From, Record: string(n)})
	}
	slices.SortFunc(ans.Rotations, func(a, b RotationEntry) int {
		if c := a.From.Compare(b.From); c != 0 {
			return c
		}
		return strings.Compare(a.Record, b.Record)
	})
	keys.WriteJSON(w, http.StatusOK, ans)
}

// maxServedRotations bounds the records /v1/audit/rotations serves (ClickHouse's are
// bounded as the ring's, the topic's here).
const maxServedRotations = 2000

// ProofAnswer is what /v1/audit/proof answers.
type ProofAnswer struct {
	Org        string       `json:"org"`
	Checkpoint string       `json:"checkpoint"`
	From       *uint64      `json:"from,omitempty"`
	To         *uint64      `json:"to,omitempty"`
	Proof      []string     `json:"proof,omitempty"`
	Leaves     []LeafAnswer `json:"leaves,omitempty"`
}

// LeafAnswer is one sealed leaf of an inclusion proof: the columns it commits to, its
// hash and its audit path (base64).
type LeafAnswer struct {
	Index          uint64   `json:"index"`
	ID             string   `json:"id"`
	Time           string   `json:"time"`
	Digest         string   `json:"digest"`
	IngestedAt     string   `json:"ingested_at"`
	KafkaPartition int32    `json:"kafka_partition"`
	KafkaOffset    int64    `json:"kafka_offset"`
	LeafHash       string   `json:"leaf_hash"`
	Proof          []string `json:"proof"`
}

// EncodeProof is a proof's hashes as the endpoints send them: base64, in order.
func EncodeProof(hs [][]byte) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = base64.StdEncoding.EncodeToString(h)
	}
	return out
}

func (h *logHandler) proof(w http.ResponseWriter, r *http.Request, ring *tlog.KeyRing, org string, q url.Values, latest map[string][]byte) {
	ctx := r.Context()
	size := func(name string) (uint64, bool, error) {
		v, ok := q[name]
		if !ok {
			return 0, false, nil
		}
		n, err := strconv.ParseUint(v[0], 10, 64)
		if err != nil || n > maxProofParam || strconv.FormatUint(n, 10) != v[0] {
			return 0, true, fmt.Errorf("%s: %s is not a tree size (a decimal number)", name, showParam(v[0]))
		}
		return n, true, nil
	}
	from, hasFrom, ferr := size("from")
	to, hasTo, terr := size("to")
	_, hasEvent := q["event"]
	var problems []string
	for _, err := range []error{ferr, terr} {
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	switch {
	case hasFrom == hasEvent:
		problems = append(problems, "give from (a consistency proof) or event and time (an inclusion proof)")
	case hasEvent && hasTo:
		problems = append(problems, "to: not with event (an inclusion proof is against the newest checkpoint)")
	case hasFrom && hasTo && from > to:
		problems = append(problems, fmt.Sprintf("from: %d is larger than to (%d)", from, to))
	}
	var at time.Time
	id := q.Get("event")
	if hasEvent {
		if id == "" || len(id) > schema.MaxIDBytes || !utf8.ValidString(id) {
			problems = append(problems, "event: an event id of 1 to 256 bytes of UTF-8")
		}
		t, err := time.Parse(time.RFC3339Nano, q.Get("time"))
		if err != nil {
			problems = append(problems, fmt.Sprintf("time: %s is not RFC 3339 (the event's time, as in the trail)", showParam(q.Get("time"))))
		}
		at = t.UTC()
	}
	if len(problems) > 0 {
		keys.WriteError(w, http.StatusBadRequest, "bad_request", strings.Join(problems, "; "))
		return
	}
	var cp tlog.Checkpoint
	var err error
	if hasTo {
		cp, err = h.log.AtSize(ctx, ring, org, to)
		if errors.Is(err, ErrNotInLog) {
			if n, nerr := h.newest(ctx, ring, org, latest); nerr == nil && n.Size == to {
				cp, err = n, nil
			}
		}
	} else {
		cp, err = h.newest(ctx, ring, org, latest)
	}
	if err != nil {
		h.fail(w, err)
		return
	}
	ans := ProofAnswer{Org: org, Checkpoint: string(cp.Note)}
	if hasFrom {
		pr, err := h.log.Consistency(ctx, org, from, &cp)
		if err != nil {
			h.fail(w, err)
			return
		}
		ans.From, ans.To, ans.Proof = &from, &cp.Size, EncodeProof(pr)
		keys.WriteJSON(w, http.StatusOK, ans)
		return
	}
	lps, err := h.log.Inclusion(ctx, org, at, id, &cp)
	if err != nil {
		h.fail(w, err)
		return
	}
	for _, lp := range lps {
		l := lp.Leaf
		ans.Leaves = append(ans.Leaves, LeafAnswer{Index: l.Index, ID: l.ID, Time: l.Time.Format("2006-01-02T15:04:05.000Z07:00"),
			Digest: fmt.Sprintf("%x", l.Digest[:]), IngestedAt: l.IngestedAt.Format(time.RFC3339), KafkaPartition: l.Partition,
			KafkaOffset: l.Offset, LeafHash: base64.StdEncoding.EncodeToString(l.Hash()), Proof: EncodeProof(lp.Proof)})
	}
	keys.WriteJSON(w, http.StatusOK, ans)
}

func (h *logHandler) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrNotInLog):
		keys.WriteError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, ErrLogDamaged):
		h.logger.Error("the stored log does not prove what was asked", "err", err)
		keys.WriteError(w, http.StatusConflict, "conflict", err.Error()+" (bandplane audit verify names what is wrong)")
	default:
		h.logger.Error("cannot answer an audit log request", "err", err)
		keys.WriteError(w, http.StatusInternalServerError, "internal", "cannot read the audit log; see serve's log")
	}
}
