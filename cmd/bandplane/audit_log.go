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

	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/seal"
	"github.com/bandplane/bandplane/ingest/seal/tlog"
	"github.com/bandplane/bandplane/policy/keys"
	"github.com/bandplane/bandplane/schema"
)

// The audit log's read side over HTTP (README, "Tamper-evident audit trail"): an
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

// latestCheckpoints caches the checkpoints topic's newest note per organization for
// checkpointRefresh, so that a burst of requests reads the topic once.
type latestCheckpoints struct {
	read func(ctx context.Context) (map[string][]byte, error)

	mu   sync.Mutex
	at   time.Time
	last map[string][]byte
}

const checkpointRefresh = 5 * time.Second

func (l *latestCheckpoints) get(ctx context.Context) (map[string][]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last != nil && time.Since(l.at) < checkpointRefresh {
		return l.last, nil
	}
	m, err := l.read(ctx)
	if err != nil {
		return nil, err
	}
	l.last, l.at = m, time.Now()
	return m, nil
}

type auditLogHandler struct {
	log    *seal.Log // nil without an audit key
	latest *latestCheckpoints
	logger *slog.Logger
}

// newAuditLogHandler serves /v1/audit/checkpoint and /v1/audit/proof for the roles
// compliance and admin; without an audit key it answers 503.
func newAuditLogHandler(l *seal.Log, latest func(ctx context.Context) (map[string][]byte, error), auth keys.Authenticator, log *slog.Logger) http.Handler {
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
	if r.URL.Path == "/v1/audit/proof" {
		known["from"], known["to"], known["event"], known["time"] = true, true, true, true
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
	k, _ := keys.FromContext(r.Context())
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
	ctx := r.Context()
	ring, err := h.log.Ring(ctx)
	if err != nil {
		h.fail(w, err)
		return
	}
	if r.URL.Path == "/v1/audit/checkpoint" {
		if !hasOrg {
			h.all(w, r, ring)
			return
		}
		c, err := h.newest(ctx, ring, org)
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
	h.proof(w, r, ring, org, q)
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

// newest is org's newest checkpoint: the checkpoints topic's when it verifies and is
// no older than ClickHouse's (it is fresher: every run signs one), else ClickHouse's.
func (h *auditLogHandler) newest(ctx context.Context, ring *tlog.KeyRing, org string) (tlog.Checkpoint, error) {
	stored, err := h.log.Newest(ctx, ring, org)
	if err != nil && !errors.Is(err, seal.ErrNotInLog) {
		return tlog.Checkpoint{}, err
	}
	latest, lerr := h.latest.get(ctx)
	if lerr != nil {
		h.logger.Warn("cannot read the checkpoints topic; serving ClickHouse's newest checkpoint", "err", lerr)
	}
	if note, ok := latest[org]; ok {
		if c, oerr := ring.Open(note); oerr == nil && c.Org == org && c.Size >= stored.Size {
			if c.Size > stored.Size && err == nil {
				// ClickHouse lost what the topic holds: serve neither, say so.
				return tlog.Checkpoint{}, fmt.Errorf("%w: the checkpoints topic has a checkpoint of %d leaves for organization %q, ClickHouse's log only %d: rolled back",
					seal.ErrLogDamaged, c.Size, org, stored.Size)
			}
			if err == nil || c.Size > 0 {
				return c, nil
			}
		}
	}
	return stored, err
}

// checkpointEntry is one organization's line of the listing.
type checkpointEntry struct {
	Org        string    `json:"org"`
	Size       uint64    `json:"size"`
	SignedAt   time.Time `json:"signed_at"`
	Checkpoint string    `json:"checkpoint"`
}

func (h *auditLogHandler) all(w http.ResponseWriter, r *http.Request, ring *tlog.KeyRing) {
	ctx := r.Context()
	orgs, err := h.log.Orgs(ctx)
	if err != nil {
		h.fail(w, err)
		return
	}
	out := []checkpointEntry{}
	for _, org := range orgs {
		c, err := h.newest(ctx, ring, org)
		if errors.Is(err, seal.ErrNotInLog) {
			continue
		}
		if err != nil {
			h.fail(w, err)
			return
		}
		out = append(out, checkpointEntry{Org: org, Size: c.Size, SignedAt: c.SignedAt, Checkpoint: string(c.Note)})
	}
	keys.WriteJSON(w, http.StatusOK, out)
}

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

func (h *auditLogHandler) proof(w http.ResponseWriter, r *http.Request, ring *tlog.KeyRing, org string, q url.Values) {
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
		if errors.Is(err, seal.ErrNotInLog) {
			if n, nerr := h.newest(ctx, ring, org); nerr == nil && n.Size == to {
				cp, err = n, nil
			}
		}
	} else {
		cp, err = h.newest(ctx, ring, org)
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
	case errors.Is(err, seal.ErrNotInLog):
		keys.WriteError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, seal.ErrLogDamaged):
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
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the answer of %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("the answer of %s is larger than %d bytes", path, max)
	}
	if resp.StatusCode != http.StatusOK {
		var eb keys.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error != "" {
			return nil, fmt.Errorf("%s: %s (HTTP %d)", path, eb.Error, resp.StatusCode)
		}
		return nil, fmt.Errorf("%s: HTTP %d", path, resp.StatusCode)
	}
	return b, nil
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
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err == nil {
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

func runAuditRotate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit rotate", "--audit-key OLD --new-key NEW [--from T] [flags]")
	var st stackFlags
	st.register(fs)
	oldFile := auditKeyFlag(fs, "the audit key in use now (private)")
	newFile := fs.String("new-key", "", "the audit key to hand over to (private; bandplane audit keygen makes one)")
	fromFlag := fs.String("from", "", "when the new key takes over, RFC 3339 (default: now); restart serve with --audit-key NEW at that time")
	if err := parse(fs, args); err != nil {
		return err
	}
	old, err := seal.LoadPrivateKey(*oldFile)
	if err != nil {
		return fmt.Errorf("--audit-key: %w", err)
	}
	next, err := seal.LoadPrivateKey(*newFile)
	if err != nil {
		return fmt.Errorf("--new-key: %w", err)
	}
	from := time.Now().UTC().Truncate(time.Second)
	if *fromFlag != "" {
		if from, err = time.Parse(time.RFC3339, *fromFlag); err != nil {
			return fmt.Errorf("--from: %q is not RFC 3339", *fromFlag)
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
	l, err := seal.NewLog(conn, st.ch.Database, prefix, []ed25519.PublicKey{old.Public().(ed25519.PublicKey)})
	if err != nil {
		return err
	}
	if err := l.Rotate(ctx, note); err != nil {
		return err
	}
	// The topic keeps it outside ClickHouse too, where a reader anchored at either key
	// finds it.
	t := st.auditTopics(sealerPriorityOperator)
	if err := seal.EnsureTopics(ctx, t, 4); err != nil {
		return err
	}
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: t.Brokers, Topic: t.Checkpoints})
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.ProduceMessages(ctx, []kafkago.Message{{Key: []byte(seal.RotationKeyPrefix + tlog.KeyID(next.Public().(ed25519.PublicKey))), Value: note}}); err != nil {
		return err
	}
	return printJSON(e.stdout, map[string]string{"old_key_id": tlog.KeyID(old.Public().(ed25519.PublicKey)),
		"new_key_id": tlog.KeyID(next.Public().(ed25519.PublicKey)), "from": from.Format(time.RFC3339), "record": string(note)})
}
