package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/rfc6962"
	"github.com/transparency-dev/merkle/testonly"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/tlog"
)

// The witness against a fake serve: a log per organization held in memory, its
// checkpoints signed here, answers the test scripts (errors, rollbacks, other
// organizations' checkpoints). What the real serve answers is tested in
// audit_log_integration_test.go.

const fakePrefix = "bandplane/witness-test"

type fakeLog struct {
	tree *testonly.Tree
	note []byte // the checkpoint served
}

type fakeServe struct {
	t *testing.T

	mu        sync.Mutex
	logs      map[string]*fakeLog
	errs      map[string]string // org -> the listing's error entry
	hidden    map[string]bool   // orgs left out of the listing
	rotations [][]byte
	failList  int               // answer the next this many requests with 500
	proofCode int               // answer proofs with this status instead
	swap      map[string]string // org -> the org whose checkpoint is served instead
	requests  []string
}

func newFakeServe(t *testing.T) (*fakeServe, *httptest.Server) {
	f := &fakeServe{t: t, logs: map[string]*fakeLog{}, errs: map[string]string{}, hidden: map[string]bool{}, swap: map[string]string{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

// grow appends n leaves to org's log and serves a checkpoint of it signed by key.
func (f *fakeServe) grow(org string, n int, key ed25519.PrivateKey) tlog.Checkpoint {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.logs[org]
	if l == nil {
		l = &fakeLog{tree: testonly.New(rfc6962.DefaultHasher)}
		f.logs[org] = l
	}
	for i := range n {
		l.tree.AppendData([]byte(fmt.Sprintf("%s/%d/%d", org, l.tree.Size(), i)))
	}
	return f.sign(org, l.tree.Size(), l.tree.Hash(), key)
}

// sign serves a checkpoint of org of any size and root (a rollback, a fork).
func (f *fakeServe) sign(org string, size uint64, root []byte, key ed25519.PrivateKey) tlog.Checkpoint {
	f.t.Helper()
	s, err := tlog.NewSigner(fakePrefix, key)
	require.NoError(f.t, err)
	c, err := s.Sign(org, size, root)
	require.NoError(f.t, err)
	if f.logs[org] == nil {
		f.logs[org] = &fakeLog{tree: testonly.New(rfc6962.DefaultHasher)}
	}
	f.logs[org].note = c.Note
	return c
}

func (f *fakeServe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.URL.Path+"?"+r.URL.RawQuery)
	if r.Header.Get("Authorization") != "Bearer test-token" {
		keys.WriteError(w, http.StatusUnauthorized, "unauthorized", "no key")
		return
	}
	if f.failList > 0 {
		f.failList--
		keys.WriteError(w, http.StatusInternalServerError, "internal", "cannot read the audit log; see serve's log")
		return
	}
	q := r.URL.Query()
	switch r.URL.Path {
	case "/v1/audit/rotations":
		ans := trail.RotationsAnswer{Rotations: []trail.RotationEntry{}}
		for _, n := range f.rotations {
			ans.Rotations = append(ans.Rotations, trail.RotationEntry{Record: string(n)})
		}
		keys.WriteJSON(w, http.StatusOK, ans)
	case "/v1/audit/checkpoint":
		if _, ok := q["org"]; ok {
			org := q.Get("org")
			if other, ok := f.swap[org]; ok {
				org = other
			}
			if msg, ok := f.errs[org]; ok {
				keys.WriteError(w, http.StatusConflict, "conflict", msg)
				return
			}
			l := f.logs[org]
			if l == nil || l.note == nil {
				keys.WriteError(w, http.StatusNotFound, "not_found", "not in the log")
				return
			}
			_, _ = w.Write(l.note)
			return
		}
		out := []trail.CheckpointEntry{}
		for _, org := range slices.Sorted(func(yield func(string) bool) {
			for o := range f.logs {
				if !yield(o) {
					return
				}
			}
		}) {
			switch {
			case f.hidden[org]:
			case f.errs[org] != "":
				out = append(out, trail.CheckpointEntry{Org: org, Error: f.errs[org]})
			default:
				out = append(out, trail.CheckpointEntry{Org: org, Checkpoint: string(f.logs[org].note)})
			}
		}
		keys.WriteJSON(w, http.StatusOK, out)
	case "/v1/audit/proof":
		if f.proofCode != 0 {
			keys.WriteError(w, f.proofCode, "conflict", "the stored log does not match its checkpoints")
			return
		}
		l := f.logs[q.Get("org")]
		from, _ := strconv.ParseUint(q.Get("from"), 10, 64)
		to, _ := strconv.ParseUint(q.Get("to"), 10, 64)
		if l == nil || to > l.tree.Size() || from > to {
			keys.WriteError(w, http.StatusNotFound, "not_found", "no checkpoint of that size")
			return
		}
		pr, err := l.tree.ConsistencyProof(from, to)
		require.NoError(f.t, err)
		keys.WriteJSON(w, http.StatusOK, trail.ProofAnswer{Org: q.Get("org"), Checkpoint: string(l.note), From: &from, To: &to, Proof: trail.EncodeProof(pr)})
	default:
		keys.WriteError(w, http.StatusNotFound, "not_found", r.URL.Path)
	}
}

// auditKey makes an audit key pair in dir.
func auditKey(t *testing.T, dir, name string) (ed25519.PrivateKey, string) {
	t.Helper()
	file := filepath.Join(dir, name)
	require.NoError(t, trail.GenerateKey(file))
	priv, err := trail.LoadPrivateKey(file)
	require.NoError(t, err)
	return priv, file + ".pub"
}

type witnessRun struct {
	code           int
	rep            witnessReport
	stdout, stderr string
}

func runFakeWitness(t *testing.T, srv *httptest.Server, state, pub string, extra ...string) witnessRun {
	t.Helper()
	args := append([]string{"audit", "witness", "--state", state, "--audit-key", pub, "--audit-origin", fakePrefix,
		"--server", srv.URL, "--key", "test-token"}, extra...)
	code, stdout, stderr := bandplane(t, args...)
	r := witnessRun{code: code, stdout: stdout, stderr: stderr}
	if strings.TrimSpace(stdout) != "" {
		lastLine(t, stdout, &r.rep)
	}
	return r
}

func (r witnessRun) of(org string) witnessOutcome {
	for _, o := range r.rep.Orgs {
		if o.Org == org {
			return o
		}
	}
	return witnessOutcome{Status: "absent"}
}

func keptNote(t *testing.T, state, org string) []byte {
	t.Helper()
	b, err := os.ReadFile((&witness{dir: state}).file(org))
	require.NoError(t, err)
	return b
}

// A rotation: the witness, anchored at the first key, follows the record serve lists
// and takes the new key's checkpoints; without the record, with a forged one, or with
// two records rotating the same key, it refuses them.
func TestWitnessFollowsARotation(t *testing.T) {
	dir := t.TempDir()
	oldKey, oldPub := auditKey(t, dir, "old.key")
	newKey, _ := auditKey(t, dir, "new.key")
	otherKey, _ := auditKey(t, dir, "other.key")
	f, srv := newFakeServe(t)
	state := filepath.Join(dir, "state")

	f.grow("org-alpha", 10, oldKey)
	r := runFakeWitness(t, srv, state, oldPub)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "first", r.of("org-alpha").Status)

	last := f.grow("org-alpha", 5, oldKey) // before the hand-over: the old key
	// The hand-over is the second after the old key's last checkpoint (timestamps are
	// whole seconds); the new key signs once the clock has reached it.
	from := last.SignedAt.Add(time.Second)
	record, err := tlog.Rotation(fakePrefix, oldKey, newKey, from)
	require.NoError(t, err)
	f.rotations = [][]byte{record}
	r = runFakeWitness(t, srv, state, oldPub)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "extended", r.of("org-alpha").Status, r.of("org-alpha").Reason)

	require.Eventually(t, func() bool { return !time.Now().Before(from) }, 5*time.Second, 10*time.Millisecond, "the clock never reached the hand-over")
	c := f.grow("org-alpha", 5, newKey)

	// Without the record the new key is no key of the ring.
	f.rotations = nil
	r = runFakeWitness(t, srv, state, oldPub)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "refused", r.of("org-alpha").Status)
	assert.Contains(t, r.of("org-alpha").Reason, "does not verify")

	// A forged record (a signature changed) links nothing, and is reported.
	forged := bytes.Clone(record)
	forged[len(forged)-20] ^= 1 // in the last signature's bytes, not its padding
	f.rotations = [][]byte{forged}
	r = runFakeWitness(t, srv, state, oldPub)
	assert.Equal(t, 1, r.code)
	assert.NotEmpty(t, r.rep.KeyProblems)
	assert.Contains(t, r.stderr, "key ring: rotation record 1 refused")

	// Two records rotating the old key: neither is trusted.
	second, err := tlog.Rotation(fakePrefix, oldKey, otherKey, from)
	require.NoError(t, err)
	f.rotations = [][]byte{record, second}
	r = runFakeWitness(t, srv, state, oldPub)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "rotated twice")

	// With the record: extended, cosigned and kept.
	f.rotations = [][]byte{record}
	r = runFakeWitness(t, srv, state, oldPub)
	require.Equal(t, 0, r.code, r.stderr)
	o := r.of("org-alpha")
	assert.Equal(t, "extended", o.Status, o.Reason)
	assert.Equal(t, uint64(15), o.From)
	assert.Equal(t, c.Size, o.Size)
	ring, err := tlog.NewKeyRing(fakePrefix, []ed25519.PublicKey{newKey.Public().(ed25519.PublicKey)}, nil)
	require.NoError(t, err)
	kept, err := ring.Open(keptNote(t, state, "org-alpha"))
	require.NoError(t, err, "the kept checkpoint is the new key's")
	assert.Equal(t, c.Size, kept.Size)

	// The old key signs nothing after the hand-over: a checkpoint it signs now is refused.
	f.grow("org-alpha", 1, oldKey)
	r = runFakeWitness(t, srv, state, oldPub)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.of("org-alpha").Reason, "outside the key's validity")
	_, err = ring.Open(keptNote(t, state, "org-alpha"))
	assert.NoError(t, err, "the kept checkpoint stays")
}

// One organization's problem is reported, and every other one is still checked; a
// one-shot pass exits 1 at its end.
func TestWitnessChecksEachOrganizationOnItsOwn(t *testing.T) {
	dir := t.TempDir()
	key, pub := auditKey(t, dir, "audit.key")
	f, srv := newFakeServe(t)
	state := filepath.Join(dir, "state")
	for _, org := range []string{"org-alpha", "org-bravo", "org-charlie"} {
		f.grow(org, 8, key)
	}
	f.errs["org-bravo"] = "the checkpoints topic has a checkpoint of 9 leaves for organization \"org-bravo\", ClickHouse's log only 8: rolled back"
	r := runFakeWitness(t, srv, state, pub)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "first", r.of("org-alpha").Status)
	assert.Equal(t, "first", r.of("org-charlie").Status)
	assert.Equal(t, "error", r.of("org-bravo").Status)
	assert.Contains(t, r.of("org-bravo").Reason, "rolled back")
	assert.Equal(t, 1, r.rep.Errors)
	assert.Contains(t, r.stderr, `cannot check organization "org-bravo"`)
	delete(f.errs, "org-bravo")

	// A rollback of one organization: refused, its kept checkpoint stays; the others go
	// on.
	r = runFakeWitness(t, srv, state, pub)
	require.Equal(t, 0, r.code, r.stderr)
	alpha := keptNote(t, state, "org-alpha")
	f.sign("org-alpha", 3, f.logs["org-alpha"].tree.HashAt(3), key)
	f.grow("org-charlie", 4, key)
	r = runFakeWitness(t, srv, state, pub)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "refused", r.of("org-alpha").Status)
	assert.Contains(t, r.of("org-alpha").Reason, "rolled back")
	assert.Equal(t, "extended", r.of("org-charlie").Status)
	assert.Equal(t, "unchanged", r.of("org-bravo").Status)
	assert.Equal(t, 1, r.rep.Refused)
	assert.Equal(t, alpha, keptNote(t, state, "org-alpha"))
	f.grow("org-alpha", 0, key) // the full log again

	// An organization the listing no longer has: missing.
	f.hidden["org-charlie"] = true
	r = runFakeWitness(t, srv, state, pub)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "missing", r.of("org-charlie").Status)
	assert.Contains(t, r.of("org-charlie").Reason, "12 leaves")
	assert.Equal(t, "unchanged", r.of("org-alpha").Status)
	delete(f.hidden, "org-charlie")

	// A proof serve cannot give (409) is a refusal; one it fails to answer (500) is an
	// error; either way the kept checkpoint stays.
	f.grow("org-alpha", 2, key)
	f.proofCode = http.StatusConflict
	r = runFakeWitness(t, srv, state, pub)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "refused", r.of("org-alpha").Status)
	f.proofCode = http.StatusBadGateway
	r = runFakeWitness(t, srv, state, pub)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "error", r.of("org-alpha").Status)
	assert.Equal(t, "unchanged", r.of("org-charlie").Status)
	f.proofCode = 0

	// --org: an organization serve does not know is an error, the others are checked;
	// the checkpoint of another organization than the one asked for is refused.
	r = runFakeWitness(t, srv, state, pub, "--org", "org-nobody", "--org", "org-alpha")
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "error", r.of("org-nobody").Status)
	assert.Equal(t, "extended", r.of("org-alpha").Status, r.of("org-alpha").Reason)
	f.swap["org-bravo"] = "org-alpha"
	r = runFakeWitness(t, srv, state, pub, "--org", "org-bravo")
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "refused", r.of("org-bravo").Status)
	assert.Contains(t, r.of("org-bravo").Reason, `checkpoint of organization "org-alpha"`)
	delete(f.swap, "org-bravo")

	// A pass that cannot read the listing at all fails as a whole.
	f.failList = 1
	r = runFakeWitness(t, srv, state, pub)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "HTTP 500")

	// Hostile flags.
	r = runFakeWitness(t, srv, state, pub, "--org", strings.Repeat("o", 300))
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "--org: 300 bytes")
	many := []string{}
	for i := range maxWitnessOrgs + 1 {
		many = append(many, "--org", fmt.Sprintf("org-%d", i))
	}
	r = runFakeWitness(t, srv, state, pub, many...)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "more than 10000")
	r = runFakeWitness(t, srv, state, pub, "--every", "-1s")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "negative")
}

// With --every, a pass that fails (serve down, an error answer) is reported and tried
// again; a refused organization does not stop the loop either.
func TestWitnessEveryKeepsWatching(t *testing.T) {
	dir := t.TempDir()
	key, pub := auditKey(t, dir, "audit.key")
	f, srv := newFakeServe(t)
	f.grow("org-alpha", 4, key)
	f.grow("org-bravo", 4, key)
	f.failList = 3
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runAuditWitness(ctx, &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, log: slog.New(slog.NewTextHandler(io.Discard, nil))},
			[]string{"--state", filepath.Join(dir, "state"), "--audit-key", pub, "--audit-origin", fakePrefix, "--server", srv.URL, "--key", "test-token", "--every", "20ms"})
	}()
	passes := func() int { return strings.Count(stdout.String(), `"witness_key"`) }
	require.Eventually(t, func() bool { return passes() >= 2 }, 10*time.Second, 10*time.Millisecond, "stderr: %s", stderr.String())
	assert.Contains(t, stderr.String(), "this pass failed, trying again")

	// A rollback of org-bravo is refused at every pass, and org-alpha is still watched.
	f.mu.Lock()
	f.sign("org-bravo", 2, f.logs["org-bravo"].tree.HashAt(2), key)
	f.mu.Unlock()
	f.grow("org-alpha", 3, key)
	// A pass prints its report, then its refusals: both are waited for.
	require.Eventually(t, func() bool {
		return strings.Contains(stdout.String(), `"org":"org-alpha","size":7,"from":4,"status":"extended"`) &&
			strings.Contains(stderr.String(), `REFUSED the checkpoint of organization "org-bravo"`)
	}, 10*time.Second, 10*time.Millisecond, "stdout: %s\nstderr: %s", stdout.String(), stderr.String())
	select {
	case err := <-done:
		t.Fatalf("the witness stopped: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the witness did not stop with its context")
	}
}

// The state file of an organization has a bounded name, whatever its id: an id of 256
// bytes that path-escapes to 768 is kept, checked and kept again.
func TestWitnessStateFileNames(t *testing.T) {
	w := &witness{dir: "/state"}
	long := "org-" + strings.Repeat("é", 126)
	require.Len(t, long, 256)
	for _, org := range []string{"", "org-alpha", long, strings.Repeat("%", 256), "../../etc/passwd", "a/b", "A.B_c-d"} {
		name := filepath.Base(w.file(org))
		assert.LessOrEqual(t, len(name), 100, "%q", org)
		assert.Equal(t, filepath.Join("/state", "logs"), filepath.Dir(w.file(org)), "%q stays in the folder", org)
		assert.True(t, strings.HasPrefix(name, "org-") && strings.HasSuffix(name, ".checkpoint"), name)
	}
	assert.Regexp(t, `^org-org-alpha-[0-9a-f]{32}\.checkpoint$`, filepath.Base(w.file("org-alpha")))
	assert.Regexp(t, `^org-etcpasswd-[0-9a-f]{32}\.checkpoint$`, filepath.Base(w.file("../../etc/passwd")))
	assert.NotEqual(t, w.file("a/b"), w.file("ab"), "the hash tells apart ids of the same plain characters")

	dir := t.TempDir()
	key, pub := auditKey(t, dir, "audit.key")
	f, srv := newFakeServe(t)
	state := filepath.Join(dir, "state")
	f.grow(long, 3, key)
	for _, want := range []string{"first", "unchanged"} {
		r := runFakeWitness(t, srv, state, pub)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, want, r.of(long).Status, r.of(long).Reason)
	}
	f.grow(long, 3, key)
	r := runFakeWitness(t, srv, state, pub, "--org", long)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "extended", r.of(long).Status, r.of(long).Reason)
	// What the witness keeps is a checkpoint file for verify: it names its organization.
	ring, err := tlog.NewKeyRing(fakePrefix, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, nil)
	require.NoError(t, err)
	c, err := ring.Open(keptNote(t, state, long))
	require.NoError(t, err)
	assert.Equal(t, long, c.Org)
	assert.Equal(t, uint64(6), c.Size)
}

func TestWitnessReportJSON(t *testing.T) {
	// The report's fields are what an operator's tooling reads.
	b, err := json.Marshal(witnessReport{WitnessKey: "k", Orgs: []witnessOutcome{{Org: "o", Size: 2, From: 1, Status: "error", Reason: "r"}}, Errors: 1})
	require.NoError(t, err)
	assert.JSONEq(t, `{"witness_key":"k","orgs":[{"org":"o","size":2,"from":1,"status":"error","reason":"r"}],"refused":0,"errors":1}`, string(b))
}
