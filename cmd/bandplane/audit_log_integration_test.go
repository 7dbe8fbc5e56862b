package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/tlog"
)

// The audit log's read side on a real serve: the newest checkpoint and proofs over HTTP
// (each checked here with the library, against the audit key), `audit checkpoint`, a
// witness that accepts extensions and refuses a rollback and a fork, and a key rotation
// verify follows. Hostile requests get 400, 401, 403 and 404 answers that say why.
func TestIntegrationAuditLog(t *testing.T) {
	s := newStack(t)
	keyFile := filepath.Join(s.dir, "audit.key")
	require.NoError(t, trail.GenerateKey(keyFile))
	pub, err := trail.LoadPublicKey(keyFile + ".pub")
	require.NoError(t, err)
	priv, err := trail.LoadPrivateKey(keyFile)
	require.NoError(t, err)
	ingestKey := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	compliance := s.key(t, "alpha-compliance", "org-alpha", keys.RoleCompliance)
	viewer := s.key(t, "alpha-viewer", "org-alpha", keys.RoleViewer)
	bravo := s.key(t, "bravo-admin", "org-bravo", keys.RoleAdmin)
	platform := s.key(t, "platform-admin", keys.PlatformOrg, keys.RoleAdmin)
	srv := s.serve(t, "--audit-key", keyFile, "--seal-every", "1s", "--no-policy")
	prefix := tlog.DefaultPrefix(s.db)
	ring, err := tlog.NewKeyRing(prefix, []ed25519.PublicKey{pub}, nil)
	require.NoError(t, err)

	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	post := func(prefix string, n int) []schema.Event {
		var evs []schema.Event
		for i := range n {
			evs = append(evs, schema.Event{ID: fmt.Sprintf("%s-%03d", prefix, i), Type: "message.created", Time: at.Add(time.Duration(i) * time.Second),
				OrgID: "org-alpha", RoomID: "room-1", Actor: schema.Party{ID: "agent-1", Type: schema.ActorAgent}, Source: "band",
				SchemaVersion: schema.Version, Data: json.RawMessage(fmt.Sprintf(`{"content":"hi %d"}`, i))})
		}
		isoPost(t, srv, ingestKey, evs)
		return evs
	}
	checkpoint := func(token string, min uint64) tlog.Checkpoint {
		t.Helper()
		var c tlog.Checkpoint
		require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
			code, body := srv.do(http.MethodGet, "/v1/audit/checkpoint", token, "", nil)
			if code != http.StatusOK {
				return false
			}
			var err error
			c, err = ring.Open(body)
			require.NoError(t, err, "the served checkpoint verifies with the audit key")
			return c.Size >= min
		}), "org-alpha's log did not reach %d leaves", min)
		return c
	}

	// Hostile requests first: every answer says what is wrong.
	for _, tc := range []struct {
		name, path, token string
		code              int
		want              string
	}{
		{"no key", "/v1/audit/checkpoint", "", http.StatusUnauthorized, ""},
		{"a viewer", "/v1/audit/checkpoint", viewer, http.StatusForbidden, ""},
		{"another organization", "/v1/audit/checkpoint?org=org-alpha", bravo, http.StatusForbidden, "may not act on organization org-alpha"},
		{"a tenant's empty org", "/v1/audit/checkpoint?org=", compliance, http.StatusBadRequest, "only a platform key"},
		{"an org too long", "/v1/audit/checkpoint?org=" + strings.Repeat("o", 300), platform, http.StatusBadRequest, "more than 256"},
		{"a control character", "/v1/audit/checkpoint?org=a%01b", platform, http.StatusBadRequest, "control character"},
		{"an unknown parameter", "/v1/audit/checkpoint?size=1", compliance, http.StatusBadRequest, `unknown parameter`},
		{"twice", "/v1/audit/proof?from=1&from=2", compliance, http.StatusBadRequest, "given 2 times"},
		{"neither proof", "/v1/audit/proof", compliance, http.StatusBadRequest, "give from"},
		{"both proofs", "/v1/audit/proof?from=1&event=e&time=2026-01-01T00:00:00Z", compliance, http.StatusBadRequest, "give from"},
		{"a bad size", "/v1/audit/proof?from=-1", compliance, http.StatusBadRequest, "not a tree size"},
		{"a huge size", "/v1/audit/proof?from=99999999999999999999", compliance, http.StatusBadRequest, "not a tree size"},
		{"from after to", "/v1/audit/proof?from=5&to=4", compliance, http.StatusBadRequest, "larger than to"},
		{"event without time", "/v1/audit/proof?event=e", compliance, http.StatusBadRequest, "time:"},
		{"a platform key without org", "/v1/audit/proof?from=1", platform, http.StatusBadRequest, "org: required"},
		{"nothing sealed yet", "/v1/audit/checkpoint?org=org-nobody", platform, http.StatusNotFound, "no checkpoint"},
		{"a POST", "/v1/audit/checkpoint", compliance, http.StatusMethodNotAllowed, "use GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := http.MethodGet
			if tc.name == "a POST" {
				method = http.MethodPost
			}
			code, body := srv.do(method, tc.path, tc.token, "", nil)
			assert.Equal(t, tc.code, code, "%s", body)
			assert.Contains(t, string(body), tc.want)
		})
	}

	first := post("a", 30)
	c1 := checkpoint(compliance, 30)
	assert.Equal(t, "org-alpha", c1.Org)

	// `audit checkpoint` saves it; a platform key lists every organization's.
	saved := filepath.Join(s.dir, "alpha.checkpoint")
	code, stdout, stderr := bandplane(t, "audit", "checkpoint", "--org", "org-alpha", "--out", saved, "--server", srv.url, "--key", compliance)
	require.Equal(t, 0, code, "%s%s", stdout, stderr)
	b, err := os.ReadFile(saved)
	require.NoError(t, err)
	_, err = ring.Open(b)
	require.NoError(t, err)
	code, body := srv.do(http.MethodGet, "/v1/audit/checkpoint", platform, "", nil)
	require.Equal(t, http.StatusOK, code, "%s", body)
	var list []trail.CheckpointEntry
	require.NoError(t, json.Unmarshal(body, &list))
	var orgs []string
	for _, e := range list {
		orgs = append(orgs, e.Org)
		assert.Empty(t, e.Error, "organization %q", e.Org)
	}
	assert.Contains(t, orgs, "org-alpha")

	// An inclusion proof of a sealed event, checked against the served checkpoint.
	ev := first[7]
	q := url.Values{"event": {ev.ID}, "time": {ev.Time.Format(time.RFC3339Nano)}}
	code, body = srv.do(http.MethodGet, "/v1/audit/proof?"+q.Encode(), compliance, "", nil)
	require.Equal(t, http.StatusOK, code, "%s", body)
	var incl trail.ProofAnswer
	require.NoError(t, json.Unmarshal(body, &incl))
	cp, err := ring.Open([]byte(incl.Checkpoint))
	require.NoError(t, err)
	require.Len(t, incl.Leaves, 1)
	leafHash, err := base64.StdEncoding.DecodeString(incl.Leaves[0].LeafHash)
	require.NoError(t, err)
	assert.NoError(t, tlog.VerifyInclusion(incl.Leaves[0].Index, cp.Size, leafHash, decodeAll(t, incl.Leaves[0].Proof), cp.Root))
	q.Set("event", "no-such-event")
	code, body = srv.do(http.MethodGet, "/v1/audit/proof?"+q.Encode(), compliance, "", nil)
	assert.Equal(t, http.StatusNotFound, code, "%s", body)

	// The witness's first pass takes every checkpoint as it is.
	state := filepath.Join(s.dir, "witness")
	alphaFile := (&witness{dir: state}).file("org-alpha")
	witness := func() (int, witnessReport, string) {
		t.Helper()
		code, stdout, stderr := bandplane(t, "audit", "witness", "--state", state, "--audit-key", keyFile+".pub", "--audit-origin", prefix,
			"--server", srv.url, "--key", platform)
		var rep witnessReport
		if stdout != "" {
			lastLine(t, stdout, &rep)
		}
		return code, rep, stderr
	}
	code, wrep, stderr := witness()
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, wrep.WitnessKey, "bandplane-witness+")
	statusOf := func(rep witnessReport, org string) witnessOutcome {
		for _, o := range rep.Orgs {
			if o.Org == org {
				return o
			}
		}
		return witnessOutcome{}
	}
	assert.Equal(t, "first", statusOf(wrep, "org-alpha").Status)

	// More events: the witness checks the consistency proof and cosigns the new one.
	post("b", 20)
	c2 := checkpoint(compliance, c1.Size+20)
	code, wrep, stderr = witness()
	require.Equal(t, 0, code, stderr)
	o := statusOf(wrep, "org-alpha")
	assert.Equal(t, "extended", o.Status, o.Reason)
	assert.GreaterOrEqual(t, o.Size, c2.Size)
	kept, err := os.ReadFile(alphaFile)
	require.NoError(t, err)
	vkey, err := os.ReadFile(filepath.Join(state, "witness.vkey"))
	require.NoError(t, err)
	wv, err := tlog.WitnessVerifier(strings.TrimSpace(string(vkey)))
	require.NoError(t, err)
	assert.True(t, tlog.Cosigned(kept, wv), "the kept checkpoint carries the witness's cosignature")
	// The witness's kept checkpoint is an auditor's checkpoint for verify.
	code, _, stderr = bandplane(t, "audit", "verify", "--audit-key", keyFile+".pub", "--checkpoint", alphaFile,
		"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic)
	require.Equal(t, 0, code, stderr)

	// A kept checkpoint larger than what the log serves (the log was rolled back), and
	// one of the served size with another root (a fork): both refused, the kept one
	// stays, exit 1.
	signer, err := tlog.NewSigner(prefix, priv)
	require.NoError(t, err)
	cur, err := ring.Open(kept)
	require.NoError(t, err)
	for name, fake := range map[string]func() tlog.Checkpoint{
		"rolled back": func() tlog.Checkpoint { c, _ := signer.Sign("org-alpha", cur.Size+1000, cur.Root); return c },
		"forked": func() tlog.Checkpoint {
			root := append([]byte(nil), cur.Root...)
			root[0] ^= 1
			c, _ := signer.Sign("org-alpha", cur.Size, root)
			return c
		},
	} {
		t.Run("witness refuses: "+name, func(t *testing.T) {
			f := fake()
			require.NoError(t, os.WriteFile(alphaFile, f.Note, 0o644))
			// The log must not move meanwhile, or "forked" would be "extended" from a
			// root it does not have: the sealer runs every second, but nothing new is
			// posted, so the size stays.
			code, wrep, stderr := witness()
			assert.Equal(t, 1, code, stderr)
			o := statusOf(wrep, "org-alpha")
			assert.Equal(t, "refused", o.Status)
			assert.Contains(t, stderr, "REFUSED the checkpoint of organization \"org-alpha\"")
			if name == "rolled back" {
				assert.Contains(t, o.Reason, "rolled back")
			} else {
				assert.Contains(t, o.Reason, "forked")
			}
			still, err := os.ReadFile(alphaFile)
			require.NoError(t, err)
			assert.Equal(t, f.Note, still, "the kept checkpoint stays")
		})
	}

	// A key rotation: a record signed by both keys, in ClickHouse and on the topic. Its
	// time must come after every organization's newest checkpoint: serve signs with the
	// old key until then.
	nextFile := filepath.Join(s.dir, "next.key")
	require.NoError(t, trail.GenerateKey(nextFile))
	next, err := trail.LoadPublicKey(nextFile + ".pub")
	require.NoError(t, err)
	oldID, nextID := tlog.KeyID(pub), tlog.KeyID(next)
	stackArgs := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic}
	rotate := func(args ...string) (int, map[string]any, string) {
		t.Helper()
		code, stdout, stderr := bandplane(t, append(append([]string{"audit", "rotate"}, args...), stackArgs...)...)
		var out map[string]any
		if strings.TrimSpace(stdout) != "" {
			lastLine(t, stdout, &out)
		}
		return code, out, stderr
	}
	code, _, stderr = rotate("--audit-key", keyFile, "--new-key", nextFile, "--from", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	assert.Equal(t, 1, code, stderr)
	assert.Regexp(t, `would take over at .*, not after organization "[a-z-]*"'s newest checkpoint .*, signed at .* by key `+tlog.KeyID(pub), stderr)
	code, _, stderr = rotate("--audit-key", keyFile, "--new-key", keyFile)
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "the new key is the old key")
	code, _, stderr = rotate("--audit-key", keyFile, "--new-key", nextFile, "--from", "tomorrow")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "not RFC 3339")

	srv.stop() // its sealer signs with the old key
	from := time.Now().Add(3 * time.Second).UTC().Truncate(time.Second)
	// Kafka unreachable: the record is in ClickHouse, and running the command again
	// publishes it.
	code, stdout, stderr = bandplane(t, "audit", "rotate", "--audit-key", keyFile, "--new-key", nextFile, "--from", from.Format(time.RFC3339),
		"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db, "--kafka", "127.0.0.1:1", "--topic", s.topic)
	require.Equal(t, 1, code, "%s%s", stdout, stderr)
	assert.Contains(t, stderr, "run the same audit rotate again")
	code, rot, stderr := rotate("--audit-key", keyFile, "--new-key", nextFile) // the default --from is later: not used
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, true, rot["reused"])
	assert.Equal(t, from.Format(time.RFC3339), rot["from"])
	assert.Equal(t, oldID, rot["old_key_id"])
	assert.Equal(t, nextID, rot["new_key_id"])
	assert.Contains(t, stderr, "is rotated to key "+nextID+" from "+from.Format(time.RFC3339)+" already: publishing that record again")
	record := rot["record"].(string)
	code, again, stderr := rotate("--audit-key", keyFile, "--new-key", nextFile, "--from", from.Add(time.Hour).Format(time.RFC3339))
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, record, again["record"], "the same record every time")
	assert.Contains(t, stderr, "(--from is not used)")
	latest, err := kafka.ReadLatest(t.Context(), stacktest.Brokers(), s.topic+".checkpoints")
	require.NoError(t, err)
	assert.Equal(t, record, string(latest[trail.RotationKeyPrefix+nextID]), "the record is on the checkpoints topic")
	var rotationRows uint64
	require.NoError(t, s.conn.QueryRow(t.Context(), "SELECT uniqExact(note) FROM "+s.db+".key_rotations").Scan(&rotationRows))
	assert.Equal(t, uint64(1), rotationRows, "one record, however often it is run")
	// The rotated key handed over to another key: refused, naming both and the time.
	thirdFile := filepath.Join(s.dir, "third.key")
	require.NoError(t, trail.GenerateKey(thirdFile))
	third, err := trail.LoadPublicKey(thirdFile + ".pub")
	require.NoError(t, err)
	code, _, stderr = rotate("--audit-key", keyFile, "--new-key", thirdFile)
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "key "+oldID+" is rotated to key "+nextID+" from "+from.Format(time.RFC3339)+" already, not to key "+tlog.KeyID(third))

	// Serve with the new key once it is valid.
	require.True(t, stacktest.Eventually(t, 10*time.Second, 20*time.Millisecond, func() bool { return time.Now().After(from.Add(time.Second)) }))
	srv = s.serve(t, "--audit-key", nextFile, "--seal-every", "1s", "--no-policy")
	post("c", 5)
	ring2, err := tlog.NewKeyRing(prefix, []ed25519.PublicKey{next}, nil)
	require.NoError(t, err)
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		code, body := srv.do(http.MethodGet, "/v1/audit/checkpoint", compliance, "", nil)
		if code != http.StatusOK {
			return false
		}
		c, err := ring2.Open(body)
		return err == nil && c.Size >= cur.Size+5
	}), "the new key's sealer did not extend the log")

	// The rotation records, for a reader anchored at one key; hostile requests refused.
	code, body = srv.do(http.MethodGet, "/v1/audit/rotations", compliance, "", nil)
	require.Equal(t, http.StatusOK, code, "%s", body)
	var rots trail.RotationsAnswer
	require.NoError(t, json.Unmarshal(body, &rots))
	require.Len(t, rots.Rotations, 1)
	assert.Equal(t, trail.RotationEntry{OldKeyID: oldID, NewKeyID: nextID, From: from, Record: record}, rots.Rotations[0])
	for _, tc := range []struct {
		method, path, token string
		code                int
	}{
		{http.MethodGet, "/v1/audit/rotations", "", http.StatusUnauthorized},
		{http.MethodGet, "/v1/audit/rotations", viewer, http.StatusForbidden},
		{http.MethodGet, "/v1/audit/rotations?org=org-alpha", compliance, http.StatusBadRequest},
		{http.MethodPost, "/v1/audit/rotations", compliance, http.StatusMethodNotAllowed},
	} {
		code, body := srv.do(tc.method, tc.path, tc.token, "", nil)
		assert.Equal(t, tc.code, code, "%s %s: %s", tc.method, tc.path, body)
	}

	// The witness, anchored at the old key, follows the record: the new key's checkpoint
	// extends the one it kept.
	require.NoError(t, os.WriteFile(alphaFile, kept, 0o644)) // the genuine one again
	code, wrep, stderr = witness()
	require.Equal(t, 0, code, stderr)
	o = statusOf(wrep, "org-alpha")
	assert.Equal(t, "extended", o.Status, o.Reason)
	nowKept, err := os.ReadFile(alphaFile)
	require.NoError(t, err)
	_, err = ring2.Open(nowKept)
	assert.NoError(t, err, "the witness keeps the new key's checkpoint")

	// Rotating the new key at a time before its newest checkpoint: refused.
	code, _, stderr = rotate("--audit-key", nextFile, "--new-key", thirdFile, "--from", from.Add(time.Second).Format(time.RFC3339))
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "not after organization")
	srv.stop()
	for _, anchor := range []string{keyFile + ".pub", nextFile + ".pub"} {
		code, stdout, stderr := bandplane(t, append([]string{"audit", "verify", "--audit-key", anchor}, stackArgs...)...)
		assert.Equal(t, 0, code, "anchored at %s: %s%s", anchor, stdout, stderr)
	}
}

func decodeAll(t *testing.T, hs []string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, h := range hs {
		b, err := base64.StdEncoding.DecodeString(h)
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}
