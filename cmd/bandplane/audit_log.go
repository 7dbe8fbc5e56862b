package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
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

type auditLogHandler struct {
	log    *trail.Log // nil without an audit key
	latest *latestCheckpoints
	logger *slog.Logger
}

// newAuditLogHandler serves /v1/audit/checkpoint, /v1/audit/proof and
// /v1/audit/rotations for the roles compliance and admin; without an audit key it
// answers 503.
func newAuditLogHandler(l *trail.Log, latest func(ctx context.Context) (map[string][]byte, error), auth keys.Authenticator, log *slog.Logger) http.Handler {
	h := &auditLogHandler{log: l, latest: &latestCheckpoints{read: latest}, logger: log.With("component", "audit_log")}
	return keys.Require(auth, keys.RoleCompliance, keys.RoleAdmin)(h)
}

// maxProofParam bounds a size of the proof endpoints: what a log can hold.
const maxProofParam = 1 << 62

func (h *auditLogHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		if err := checkOrgParam(org, k.Platform()); err != nil {
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
	ring, err := h.log.RingWith(ctx, trail.TopicRotations(latest))
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

// checkOrgParam refuses what no organization id can be; "" (the events stored without
// one) is a platform key's only.
func checkOrgParam(org string, platform bool) error {
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
func (h *auditLogHandler) topic(ctx context.Context) map[string][]byte {
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
	return checkOrgParam(key, true) == nil
}

// newest is org's newest checkpoint: the checkpoints topic's when it verifies and is
// no older than ClickHouse's (it is fresher: every run signs one), else ClickHouse's.
func (h *auditLogHandler) newest(ctx context.Context, ring *tlog.KeyRing, org string, latest map[string][]byte) (tlog.Checkpoint, error) {
	stored, err := h.log.Newest(ctx, ring, org)
	if err != nil && !errors.Is(err, trail.ErrNotInLog) {
		return tlog.Checkpoint{}, err
	}
	return combineNewest(ring, org, stored, err, latest)
}

// combineNewest chooses between ClickHouse's newest checkpoint of org (stored, or why
// there is none: serr, wrapping trail.ErrNotInLog) and the topic's.
func combineNewest(ring *tlog.KeyRing, org string, stored tlog.Checkpoint, serr error, latest map[string][]byte) (tlog.Checkpoint, error) {
	if note, ok := latest[org]; ok {
		if c, oerr := ring.Open(note); oerr == nil && c.Org == org && c.Size >= stored.Size {
			if c.Size > stored.Size && serr == nil {
				// ClickHouse lost what the topic holds: serve neither, say so.
				return tlog.Checkpoint{}, fmt.Errorf("%w: the checkpoints topic has a checkpoint of %d leaves for organization %q, ClickHouse's log only %d: rolled back",
					trail.ErrLogDamaged, c.Size, org, stored.Size)
			}
			if serr == nil || c.Size > 0 {
				return c, nil
			}
		}
	}
	return stored, serr
}

// checkpointEntry is one organization's line of the listing: its newest checkpoint, or
// why it cannot be served.
type checkpointEntry struct {
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
func (h *auditLogHandler) all(w http.ResponseWriter, r *http.Request, ring *tlog.KeyRing, latest map[string][]byte) {
	heads, err := h.log.Heads(r.Context(), ring)
	if err != nil {
		h.fail(w, err)
		return
	}
	out := []checkpointEntry{}
	listed := map[string]bool{}
	add := func(org string, c tlog.Checkpoint, err error) {
		listed[org] = true
		if err != nil {
			h.logger.Warn("an organization's newest checkpoint cannot be served", "org_id", org, "err", err)
			out = append(out, checkpointEntry{Org: org, Error: err.Error()})
			return
		}
		at := c.SignedAt
		out = append(out, checkpointEntry{Org: org, Size: c.Size, SignedAt: &at, Checkpoint: string(c.Note)})
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
			fmt.Errorf("%w: organization %q has no checkpoint in ClickHouse, and the checkpoints topic's does not verify with the audit key", trail.ErrNotInLog, org), latest)
		add(org, c, err)
	}
	slices.SortFunc(out, func(a, b checkpointEntry) int { return strings.Compare(a.Org, b.Org) })
	keys.WriteJSON(w, http.StatusOK, out)
}

// rotationEntry is one key rotation record with what it says.
type rotationEntry struct {
	OldKeyID string    `json:"old_key_id"`
	NewKeyID string    `json:"new_key_id"`
	From     time.Time `json:"from"`
	Record   string    `json:"record"`
}

type rotationsAnswer struct {
	Rotations []rotationEntry `json:"rotations"`
}

// rotations serves the rotation records of ClickHouse and of the checkpoints topic that
// verify on their own (signed by both their keys). Serving what ClickHouse holds is safe:
// a reader follows a record only from a key it trusts, and a forged one does not verify.
func (h *auditLogHandler) rotations(w http.ResponseWriter, r *http.Request, latest map[string][]byte) {
	stored, err := h.log.Rotations(r.Context())
	if err != nil {
		h.fail(w, err)
		return
	}
	ans := rotationsAnswer{Rotations: []rotationEntry{}}
	seen := map[string]bool{}
	for _, n := range append(stored, trail.TopicRotations(latest)...) {
		if seen[string(n)] || len(seen) >= maxServedRotations {
			continue
		}
		seen[string(n)] = true
		rec, err := tlog.OpenRotation(h.log.Prefix(), n)
		if err != nil {
			h.logger.Warn("not serving a key rotation record that does not verify (audit verify names it)", "err", err)
			continue
		}
		ans.Rotations = append(ans.Rotations, rotationEntry{OldKeyID: tlog.KeyID(rec.Old), NewKeyID: tlog.KeyID(rec.New), From: rec.From, Record: string(n)})
	}
	slices.SortFunc(ans.Rotations, func(a, b rotationEntry) int {
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

// proofAnswer is what /v1/audit/proof answers.
type proofAnswer struct {
	Org        string      `json:"org"`
	Checkpoint string      `json:"checkpoint"`
	From       *uint64     `json:"from,omitempty"`
	To         *uint64     `json:"to,omitempty"`
	Proof      []string    `json:"proof,omitempty"`
	Leaves     []leafProof `json:"leaves,omitempty"`
}

type leafProof struct {
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

func b64s(hs [][]byte) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = base64.StdEncoding.EncodeToString(h)
	}
	return out
}

func (h *auditLogHandler) proof(w http.ResponseWriter, r *http.Request, ring *tlog.KeyRing, org string, q url.Values, latest map[string][]byte) {
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
		if errors.Is(err, trail.ErrNotInLog) {
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
	ans := proofAnswer{Org: org, Checkpoint: string(cp.Note)}
	if hasFrom {
		pr, err := h.log.Consistency(ctx, org, from, &cp)
		if err != nil {
			h.fail(w, err)
			return
		}
		ans.From, ans.To, ans.Proof = &from, &cp.Size, b64s(pr)
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
		ans.Leaves = append(ans.Leaves, leafProof{Index: l.Index, ID: l.ID, Time: l.Time.Format("2006-01-02T15:04:05.000Z07:00"),
			Digest: fmt.Sprintf("%x", l.Digest[:]), IngestedAt: l.IngestedAt.Format(time.RFC3339), KafkaPartition: l.Partition,
			KafkaOffset: l.Offset, LeafHash: base64.StdEncoding.EncodeToString(l.Hash()), Proof: b64s(lp.Proof)})
	}
	keys.WriteJSON(w, http.StatusOK, ans)
}

func (h *auditLogHandler) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, trail.ErrNotInLog):
		keys.WriteError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, trail.ErrLogDamaged):
		h.logger.Error("the stored log does not prove what was asked", "err", err)
		keys.WriteError(w, http.StatusConflict, "conflict", err.Error()+" (bandplane audit verify names what is wrong)")
	default:
		h.logger.Error("cannot answer an audit log request", "err", err)
		keys.WriteError(w, http.StatusInternalServerError, "internal", "cannot read the audit log; see serve's log")
	}
}

// auditClient is the CLI's side of the endpoints above.
type auditClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

// auditClientFlags are the flags of a command that talks to serve's audit endpoints.
func auditClientFlags(fs *flag.FlagSet) (server, token *string) {
	server = fs.String("server", envOr("BANDPLANE_SERVER", "http://127.0.0.1:8080"), "bandplane serve's URL (env BANDPLANE_SERVER)")
	token = fs.String("key", "", "API key of role compliance or admin (default: env BANDPLANE_KEY)")
	return server, token
}

// newAuditClient checks the flags of auditClientFlags (token given, or from the
// environment by the caller).
func newAuditClient(server, token string) (*auditClient, error) {
	if token == "" {
		return nil, errors.New("no API key: give --key or set BANDPLANE_KEY (a key of role compliance or admin)")
	}
	base, err := url.Parse(server)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("--server %q is not an http(s) URL", server)
	}
	return &auditClient{base: base, token: token, http: &http.Client{Timeout: time.Minute}}, nil
}

// get fetches path?q and returns the body of a 200, or an error with the server's.
func (c *auditClient) get(ctx context.Context, path string, q url.Values, max int64) ([]byte, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach bandplane serve at %s: %w", c.base, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the answer of %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("the answer of %s is larger than %d bytes", path, max)
	}
	if resp.StatusCode != http.StatusOK {
		ae := &apiError{path: path, status: resp.StatusCode}
		var eb keys.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error != "" {
			ae.msg = eb.Error
		}
		return nil, ae
	}
	return b, nil
}

// apiError is an answer of serve other than 200: its status and what it said.
type apiError struct {
	path   string
	status int
	msg    string
}

func (e *apiError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("%s: HTTP %d", e.path, e.status)
	}
	return fmt.Sprintf("%s: %s (HTTP %d)", e.path, e.msg, e.status)
}

func orgQuery(org string, given bool) url.Values {
	q := url.Values{}
	if given {
		q.Set("org", org)
	}
	return q
}

func runAuditCheckpoint(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit checkpoint", "[--org ORG] [--out FILE] [flags]")
	org := fs.String("org", "", `the organization (required with a platform key; "" is the log of events stored without one)`)
	out := fs.String("out", "", "write the checkpoint to this file (default: stdout)")
	server, token := auditClientFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("BANDPLANE_KEY")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "org" })
	c, err := newAuditClient(*server, *token)
	if err != nil {
		return err
	}
	note, err := c.get(ctx, "/v1/audit/checkpoint", orgQuery(*org, given), tlog.MaxNoteBytes)
	if err != nil {
		return err
	}
	if !given && strings.HasPrefix(string(note), "[") {
		return errors.New("--org: required with a platform key (the server lists every organization's checkpoint otherwise)")
	}
	if *out == "" {
		_, err := e.stdout.Write(note)
		return err
	}
	return writeFileAtomic(*out, note, 0o644)
}

// writeFileAtomic writes data to path through a synced temporary file in its folder.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), mode)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// rotateGrace is how far ahead of now `audit rotate` hands over by default: time to
// restart serve with the new key before the old one stops signing.
const rotateGrace = 5 * time.Minute

// rotateKafkaWait bounds how long `audit rotate` tries the checkpoints topic before it
// goes on with ClickHouse alone (and says so).
const rotateKafkaWait = 30 * time.Second

func runAuditRotate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit rotate", "--audit-key OLD --new-key NEW [--from T] [flags]")
	var st stackFlags
	st.register(fs)
	oldFile := auditKeyFlag(fs, "the audit key in use now (private)")
	newFile := fs.String("new-key", "", "the audit key to hand over to (private; bandplane audit keygen makes one)")
	fromFlag := fs.String("from", "", "when the new key takes over, RFC 3339, after every organization's newest checkpoint (default: 5 minutes from now). "+
		"The old key signs nothing from then on and the new key nothing before: restart serve with --audit-key NEW before or after that time "+
		"(a sealer with the new key waits for it)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	old, err := trail.LoadPrivateKey(*oldFile)
	if err != nil {
		return fmt.Errorf("--audit-key: %w", err)
	}
	next, err := trail.LoadPrivateKey(*newFile)
	if err != nil {
		return fmt.Errorf("--new-key: %w", err)
	}
	// Rounded up: the record holds whole seconds, and the grace is at least the default.
	from := time.Now().UTC().Add(rotateGrace + time.Second - 1).Truncate(time.Second)
	if *fromFlag != "" {
		if from, err = time.Parse(time.RFC3339, *fromFlag); err != nil {
			return fmt.Errorf("--from: %q is not RFC 3339", *fromFlag)
		}
		if from.Unix() < 0 {
			return fmt.Errorf("--from: %s is before 1970", *fromFlag)
		}
	}
	prefix, err := st.prefix()
	if err != nil {
		return err
	}
	note, err := tlog.Rotation(prefix, old, next, from)
	if err != nil {
		return err
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	l, err := trail.NewLog(conn, st.ch.Database, prefix, []ed25519.PublicKey{old.Public().(ed25519.PublicKey)})
	if err != nil {
		return err
	}
	// The topic's rotation records and newest checkpoints count as much as ClickHouse's;
	// without Kafka the record goes to ClickHouse, and running the command again once
	// Kafka is back publishes the same record.
	t := st.auditTopics(sealerPriorityOperator)
	kctx, cancel := context.WithTimeout(ctx, rotateKafkaWait)
	published, kerr := func() (map[string][]byte, error) {
		if err := trail.EnsureTopics(kctx, t, 4); err != nil {
			return nil, err
		}
		return kafka.ReadLatest(kctx, t.Brokers, t.Checkpoints)
	}()
	cancel()
	if kerr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(e.stderr, "audit rotate: cannot read the checkpoints topic %s (%v): checking against ClickHouse alone\n", t.Checkpoints, kerr)
	}
	out, err := l.RecordRotation(ctx, note, published)
	if err != nil {
		return err
	}
	oldID, newID := tlog.KeyID(out.Record.Old), tlog.KeyID(out.Record.New)
	at := out.Record.From.Format(time.RFC3339)
	if out.Reused {
		msg := fmt.Sprintf("audit rotate: key %s is rotated to key %s from %s already: publishing that record again", oldID, newID, at)
		if *fromFlag != "" && !out.Record.From.Equal(from) {
			msg += " (--from is not used)"
		}
		fmt.Fprintln(e.stderr, msg)
	}
	if kerr != nil {
		return fmt.Errorf("the rotation record is in ClickHouse, not yet on the checkpoints topic %s (%w): run the same audit rotate again once Kafka is reachable; it publishes the same record",
			t.Checkpoints, kerr)
	}
	// The checkpoints topic keeps it outside ClickHouse too, where a reader anchored at
	// either key finds it; the stored-events topic hands it to the running sealer in
	// order with the notes, so that a deletion from ClickHouse cannot hide it from the
	// sealer, which then signs nothing with a retired key.
	msg := []kafkago.Message{{Key: []byte(trail.RotationKeyPrefix + newID), Value: out.Note}}
	for _, topic := range []string{t.Checkpoints, t.Stored} {
		p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: t.Brokers, Topic: topic})
		if err != nil {
			return err
		}
		err = p.ProduceMessages(ctx, msg)
		_ = p.Close()
		if err != nil {
			return fmt.Errorf("the rotation record is in ClickHouse, not on the topic %s (%w): run the same audit rotate again; it publishes the same record",
				topic, err)
		}
	}
	return printJSON(e.stdout, map[string]any{"old_key_id": oldID, "new_key_id": newID, "from": at, "reused": out.Reused, "record": string(out.Note)})
}
