package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/tlog"
)

// The listing of every organization's checkpoint on a real serve, one query for all of
// them: rows planted in ClickHouse do not hide an organization's checkpoint, a rollback
// of one organization is an error entry of its own, and the witness reports it while it
// keeps checking the others, an organization with an id of 256 bytes among them.
func TestIntegrationAuditWitnessPerOrganization(t *testing.T) {
	s := newStack(t)
	keyFile := filepath.Join(s.dir, "audit.key")
	require.NoError(t, trail.GenerateKey(keyFile))
	ingestKey := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	platform := s.key(t, "platform-compliance", keys.PlatformOrg, keys.RoleCompliance)
	srv := s.serve(t, "--audit-key", keyFile, "--seal-every", "1s", "--no-policy")
	prefix := tlog.DefaultPrefix(s.db)
	long := "org-" + strings.Repeat("é", 126)
	require.Len(t, long, schema.MaxIDBytes)

	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	post := func(org, prefix string, n int) {
		t.Helper()
		var evs []schema.Event
		for i := range n {
			evs = append(evs, schema.Event{ID: fmt.Sprintf("%s-%03d", prefix, i), Type: "message.created", Time: at.Add(time.Duration(i) * time.Second),
				OrgID: org, RoomID: "room-1", Actor: schema.Party{ID: "agent-1", Type: schema.ActorAgent}, Source: "band",
				SchemaVersion: schema.Version, Data: json.RawMessage(fmt.Sprintf(`{"content":"hi %d"}`, i))})
		}
		isoPost(t, srv, ingestKey, evs)
	}
	listing := func() map[string]trail.CheckpointEntry {
		t.Helper()
		code, body := srv.do(http.MethodGet, "/v1/audit/checkpoint", platform, "", nil)
		require.Equal(t, http.StatusOK, code, "%s", body)
		var list []trail.CheckpointEntry
		require.NoError(t, json.Unmarshal(body, &list))
		out := map[string]trail.CheckpointEntry{}
		for _, e := range list {
			out[e.Org] = e
		}
		return out
	}
	sizeAtLeast := func(org string, n uint64) trail.CheckpointEntry {
		t.Helper()
		var e trail.CheckpointEntry
		require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
			e = listing()[org]
			return e.Error == "" && e.Size >= n
		}), "organization %q did not reach %d leaves: %+v", org, n, e)
		return e
	}
	post("org-alpha", "a", 10)
	post(long, "l", 4)
	post("org-bravo", "b", 10)
	bravo1 := sizeAtLeast("org-bravo", 10)
	post("org-bravo", "b2", 5)
	bravo2 := sizeAtLeast("org-bravo", bravo1.Size+5)
	alpha := sizeAtLeast("org-alpha", 10)
	sizeAtLeast(long, 4)

	state := filepath.Join(s.dir, "witness")
	longFile := (&witness{dir: state}).file(long)
	witness := func() (int, witnessReport, string) {
		t.Helper()
		code, stdout, stderr := bandplane(t, "audit", "witness", "--state", state, "--audit-key", keyFile+".pub", "--audit-origin", prefix,
			"--server", srv.url, "--key", platform)
		var rep witnessReport
		if strings.TrimSpace(stdout) != "" {
			lastLine(t, stdout, &rep)
		}
		return code, rep, stderr
	}
	statusOf := func(rep witnessReport, org string) witnessOutcome {
		for _, o := range rep.Orgs {
			if o.Org == org {
				return o
			}
		}
		return witnessOutcome{Status: "absent"}
	}
	code, rep, stderr := witness()
	require.Equal(t, 0, code, stderr)
	for _, org := range []string{"org-alpha", "org-bravo", long} {
		assert.Equal(t, "first", statusOf(rep, org).Status, "%q: %s", org, statusOf(rep, org).Reason)
	}
	_, err := os.Stat(longFile)
	require.NoError(t, err, "the long organization's checkpoint is kept")

	// Rows planted above org-alpha's head, and beside its checkpoint at the same size
	// (sorting before it): the listing and proofs still find the signed one.
	// INSERT … SELECT: an INSERT … VALUES sent with Exec leaves 18.16 waiting for a data
	// block that the driver never sends.
	plant := func(size uint64, note string) {
		t.Helper()
		require.NoError(t, s.conn.Exec(t.Context(), fmt.Sprintf("INSERT INTO %s.checkpoints (org_id, size, root, signed_at, key_id, note) "+
			"SELECT 'org-alpha', toUInt64(%d), '', now(), 'forged', '%s'", s.db, size, note)))
	}
	for i := range 5 {
		plant(alpha.Size+100+uint64(i), fmt.Sprintf("forged %d", i))
	}
	plant(alpha.Size, "0 forged at the size")
	got := listing()["org-alpha"]
	assert.Empty(t, got.Error)
	assert.Equal(t, alpha.Size, got.Size)
	q := url.Values{"org": {"org-alpha"}, "from": {"3"}, "to": {strconv.FormatUint(alpha.Size, 10)}}
	code, body := srv.do(http.MethodGet, "/v1/audit/proof?"+q.Encode(), platform, "", nil)
	assert.Equal(t, http.StatusOK, code, "%s", body)

	// org-bravo's newest checkpoint row deleted from ClickHouse, while the topic keeps it:
	// its entry says it was rolled back, the others are listed as they are.
	require.NoError(t, s.conn.Exec(t.Context(), "ALTER TABLE "+s.db+".checkpoints DELETE WHERE org_id = 'org-bravo' AND size >= "+strconv.FormatUint(bravo2.Size, 10)))
	var e trail.CheckpointEntry
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		e = listing()["org-bravo"]
		return e.Error != ""
	}), "org-bravo's rollback is not listed: %+v", e)
	assert.Contains(t, e.Error, "rolled back")
	assert.Empty(t, e.Checkpoint)
	l := listing()
	assert.Empty(t, l["org-alpha"].Error)
	assert.Empty(t, l[long].Error)

	code, rep, stderr = witness()
	assert.Equal(t, 1, code, stderr)
	assert.Equal(t, "error", statusOf(rep, "org-bravo").Status)
	assert.Contains(t, statusOf(rep, "org-bravo").Reason, "rolled back")
	assert.Contains(t, stderr, `cannot check organization "org-bravo"`)
	assert.Equal(t, "unchanged", statusOf(rep, "org-alpha").Status, statusOf(rep, "org-alpha").Reason)
	assert.Equal(t, "unchanged", statusOf(rep, long).Status, statusOf(rep, long).Reason)
	assert.Equal(t, 1, rep.Errors)
	assert.Zero(t, rep.Refused)

	// The others still grow and are still witnessed.
	post("org-alpha", "a2", 3)
	sizeAtLeast("org-alpha", alpha.Size+3)
	code, rep, stderr = witness()
	assert.Equal(t, 1, code, stderr)
	assert.Equal(t, "extended", statusOf(rep, "org-alpha").Status, statusOf(rep, "org-alpha").Reason)
	assert.Equal(t, "error", statusOf(rep, "org-bravo").Status)
	srv.alive()
}
