package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/seal"
	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema/chdb"
)

func bandplane(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// lastLine is the last line of stdout, decoded.
func lastLine(t *testing.T, stdout string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), v), stdout)
}

func TestIntegrationAuditCLI(t *testing.T) {
	conn, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 1)
	ctx := context.Background()
	stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", topic}

	dir := t.TempDir()
	keyFile := filepath.Join(dir, "audit.key")
	code, stdout, stderr := bandplane(t, "audit", "keygen", "--out", keyFile)
	require.Equal(t, 0, code, stderr)
	var kg map[string]string
	lastLine(t, stdout, &kg)
	pub, err := seal.LoadPublicKey(keyFile + ".pub")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"key_id": seal.KeyID(pub), "private": keyFile, "public": keyFile + ".pub"}, kg)

	now := time.Now().UTC()
	var rows []store.EventRow
	for i := range 20 {
		rows = append(rows, store.EventRow{ID: fmt.Sprintf("cli-%02d", i), Type: "message.created", Time: now.Add(-time.Hour + time.Duration(i)*time.Second),
			OrgID: []string{"org-a", "org-b"}[i%2], ActorID: "agent-1", ActorType: "agent", Source: "band", SchemaVersion: 1,
			Data: fmt.Sprintf(`{"content":"hi %d"}`, i), IngestedAt: now.Add(-time.Minute)})
	}
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: rows}))

	code, stdout, stderr = bandplane(t, append([]string{"audit", "seal", "--audit-key", keyFile, "--settle", "1s"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	var res seal.Result
	lastLine(t, stdout, &res)
	assert.Equal(t, 2, res.Seals)
	assert.Equal(t, 20, res.Events)
	assert.Equal(t, 2, res.Emitted)
	total, _, err := kafka.Lag(ctx, stacktest.Brokers(), topic, "nobody-"+topic)
	require.NoError(t, err)
	assert.Equal(t, int64(2), total, "one audit.sealed event per seal on the events topic")

	verify := func(args ...string) (int, seal.Report, string) {
		t.Helper()
		code, stdout, stderr := bandplane(t, append(append([]string{"audit", "verify"}, stack...), args...)...)
		var rep seal.Report
		if code == 0 || code == 1 && stdout != "" {
			lastLine(t, stdout, &rep)
		}
		return code, rep, stderr
	}
	// The public half suffices; the private one works too; the environment names it.
	for _, k := range []string{keyFile + ".pub", keyFile} {
		code, rep, stderr := verify("--audit-key", k)
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, seal.Report{Seals: 2, SealedEvents: 20, Problems: []seal.Problem{}}, rep)
		assert.Contains(t, stderr, `audit verify: org "org-a": 1 seals, 10 sealed events, 0 unsealed, 0 problems`)
	}
	t.Setenv("BANDPLANE_AUDIT_KEY", keyFile+".pub")
	code, rep, stderr := verify("--org", "org-b", "--from", now.Add(-time.Hour).Format(time.RFC3339), "--to", now.Format(time.RFC3339))
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, seal.Report{Seals: 1, SealedEvents: 10, Problems: []seal.Problem{}}, rep)

	// A tampered row: exit 1, named in the last line.
	require.NoError(t, conn.Exec(ctx, "ALTER TABLE "+db+".events UPDATE data = '{}' WHERE id = 'cli-03'"))
	require.True(t, stacktest.Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		var pending uint64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM system.mutations WHERE database = ? AND is_done = 0", db).Scan(&pending))
		return pending == 0
	}))
	code, rep, _ = verify()
	assert.Equal(t, 1, code)
	require.Len(t, rep.Problems, 1)
	assert.Equal(t, "cli-03", rep.Problems[0].ID)
	assert.Equal(t, seal.KindModified, rep.Problems[0].Kind)
	assert.Equal(t, "seal:org-b:1", rep.Problems[0].Seal)

	// Another key: every seal fails its signature.
	otherKey := filepath.Join(dir, "other.key")
	code, _, stderr = bandplane(t, "audit", "keygen", "--out", otherKey)
	require.Equal(t, 0, code, stderr)
	code, rep, stderr = verify("--audit-key", otherKey+".pub")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no seal verifies with the given key")
	var sealProblems int
	for _, p := range rep.Problems {
		if strings.HasPrefix(p.ID, "seal:") {
			sealProblems++
			assert.Equal(t, seal.KindModified, p.Kind)
		}
	}
	assert.Equal(t, 2, sealProblems)
}

func TestIntegrationAuditCLIHostile(t *testing.T) {
	_, db := stacktest.Database(t)
	stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", db, "--kafka", strings.Join(stacktest.Brokers(), ",")}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "audit.key")
	code, _, stderr := bandplane(t, "audit", "keygen", "--out", keyFile)
	require.Equal(t, 0, code, stderr)
	garbage := filepath.Join(dir, "garbage.key")
	require.NoError(t, os.WriteFile(garbage, []byte("garbage"), 0o600))
	t.Setenv("BANDPLANE_AUDIT_KEY", "")

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no subcommand", []string{"audit"}, 2, "usage: bandplane audit"},
		{"unknown subcommand", []string{"audit", "frobnicate"}, 2, `unknown command "frobnicate"`},
		{"keygen without --out", []string{"audit", "keygen"}, 1, "--out is required"},
		{"keygen over a key", []string{"audit", "keygen", "--out", keyFile}, 1, keyFile + " already exists"},
		{"seal without key", append([]string{"audit", "seal"}, stack...), 1, "--audit-key: no audit key file given"},
		{"seal with the public key", append([]string{"audit", "seal", "--audit-key", keyFile + ".pub"}, stack...), 1, "is a public key: sealing needs the private key"},
		{"seal with a missing key", append([]string{"audit", "seal", "--audit-key", filepath.Join(dir, "nope")}, stack...), 1, "does not exist"},
		{"seal with garbage", append([]string{"audit", "seal", "--audit-key", garbage}, stack...), 1, "is not PEM"},
		{"verify with garbage", append([]string{"audit", "verify", "--audit-key", garbage}, stack...), 1, "is not PEM"},
		{"from after to", append([]string{"audit", "verify", "--audit-key", keyFile, "--from", "2026-02-10", "--to", "2026-02-09"}, stack...), 1, "--to (2026-02-09T00:00:00Z) must be after --from (2026-02-10T00:00:00Z)"},
		{"malformed from", append([]string{"audit", "verify", "--audit-key", keyFile, "--from", "yesterday"}, stack...), 1, `--from: "yesterday" is neither RFC 3339 nor YYYY-MM-DD`},
		{"malformed to", append([]string{"audit", "verify", "--audit-key", keyFile, "--to", "2026-13-01"}, stack...), 1, "--to:"},
		{"org without seals", append([]string{"audit", "verify", "--audit-key", keyFile, "--org", "nobody"}, stack...), 1, `organization "nobody" has no seals`},
		{"bad flag", []string{"audit", "verify", "--bogus"}, 2, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := bandplane(t, tc.args...)
			assert.Equal(t, tc.code, code, stderr)
			assert.Contains(t, stderr, tc.want)
			assert.Empty(t, stdout)
		})
	}
	code, _, stderr = bandplane(t, "audit", "verify", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "usage: bandplane audit verify")
}

// bandplane retention with the audit key signs its cut, and verify counts the sealed
// events it dropped as expired; without the key it warns, and verify reports them
// missing.
func TestIntegrationAuditRetention(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "audit.key")
	code, _, stderr := bandplane(t, "audit", "keygen", "--out", keyFile)
	require.Equal(t, 0, code, stderr)
	pub, err := seal.LoadPublicKey(keyFile + ".pub")
	require.NoError(t, err)
	t.Setenv("BANDPLANE_AUDIT_KEY", "")

	// A sealed trail of 4 events 30 days old and 4 of today.
	trail := func(t *testing.T) []string {
		conn, db := stacktest.Database(t)
		topic := stacktest.Topic(t, 1)
		stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", topic}
		now := time.Now().UTC()
		var rows []store.EventRow
		for i := range 8 {
			at := now.Add(-time.Hour)
			if i < 4 {
				at = now.AddDate(0, 0, -30)
			}
			rows = append(rows, store.EventRow{ID: fmt.Sprintf("ret-%02d", i), Type: "message.created", Time: at.Add(time.Duration(i) * time.Second),
				OrgID: "org-a", ActorID: "agent-1", ActorType: "agent", Source: "band", SchemaVersion: 1,
				Data: fmt.Sprintf(`{"content":"hi %d"}`, i), IngestedAt: now.Add(-time.Minute)})
		}
		require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: rows}))
		code, _, stderr := bandplane(t, append([]string{"audit", "seal", "--audit-key", keyFile, "--settle", "1s"}, stack...)...)
		require.Equal(t, 0, code, stderr)
		return stack
	}
	type output struct {
		DryRun  bool           `json:"dry_run"`
		Dropped []chdb.Dropped `json:"dropped"`
		Cuts    []chdb.Cut     `json:"cuts"`
	}
	verify := func(stack []string) (int, seal.Report) {
		t.Helper()
		code, stdout, stderr := bandplane(t, append([]string{"audit", "verify", "--audit-key", keyFile + ".pub"}, stack...)...)
		require.Contains(t, []int{0, 1}, code, stderr)
		var rep seal.Report
		lastLine(t, stdout, &rep)
		return code, rep
	}

	t.Run("signed", func(t *testing.T) {
		stack := trail(t)
		t.Setenv("BANDPLANE_AUDIT_KEY", keyFile) // the environment names the key
		code, stdout, stderr := bandplane(t, append([]string{"retention", "--events", "240h", "--dry-run"}, stack...)...)
		require.Equal(t, 0, code, stderr)
		var out output
		lastLine(t, stdout, &out)
		assert.True(t, out.DryRun)
		assert.Len(t, out.Dropped, 1)
		code, _ = verify(stack)
		assert.Equal(t, 0, code, "a dry run drops nothing")

		code, stdout, stderr = bandplane(t, append([]string{"retention", "--events", "240h"}, stack...)...)
		require.Equal(t, 0, code, stderr)
		assert.NotContains(t, stderr, `"level":"WARN"`)
		lastLine(t, stdout, &out)
		assert.Equal(t, []chdb.Dropped{{Table: "events", Partition: time.Now().UTC().AddDate(0, 0, -30).Format("20060102")}}, out.Dropped)
		require.Len(t, out.Cuts, 1)
		assert.Equal(t, seal.KeyID(pub), out.Cuts[0].KeyID)
		assert.NotEmpty(t, out.Cuts[0].Signature)
		code, rep := verify(stack)
		assert.Equal(t, 0, code)
		assert.Equal(t, seal.Report{Seals: 1, SealedEvents: 4, ExpiredEvents: 4, Problems: []seal.Problem{}}, rep)
	})

	t.Run("unsigned", func(t *testing.T) {
		stack := trail(t)
		code, stdout, stderr := bandplane(t, append([]string{"retention", "--events", "240h"}, stack...)...)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stderr, "retention without --audit-key dropped sealed events under an unsigned cut: audit verify will report them missing")
		assert.Contains(t, stderr, `"sealed_events":4`)
		var out output
		lastLine(t, stdout, &out)
		require.Len(t, out.Cuts, 1)
		assert.Empty(t, out.Cuts[0].KeyID)
		code, rep := verify(stack)
		assert.Equal(t, 1, code)
		assert.Len(t, rep.Problems, 4)
		for _, p := range rep.Problems {
			assert.Equal(t, seal.KindMissing, p.Kind)
			assert.Contains(t, p.Reason, "unsigned")
		}
		assert.Zero(t, rep.ExpiredEvents)
	})

	t.Run("hostile", func(t *testing.T) {
		stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", stacktest.Name(t)}
		garbage := filepath.Join(dir, "garbage.key")
		require.NoError(t, os.WriteFile(garbage, []byte("garbage"), 0o600))
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"public key", []string{"--audit-key", keyFile + ".pub"}, "--audit-key: audit key " + keyFile + ".pub is a public key"},
			{"garbage key", []string{"--audit-key", garbage}, "is not PEM"},
			{"missing key", []string{"--audit-key", filepath.Join(dir, "nope")}, "does not exist"},
			{"extra arguments", []string{"now"}, `unexpected arguments ["now"]`},
			{"negative", []string{"--events", "-1h"}, "retention --events must not be negative"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				code, stdout, stderr := bandplane(t, append(append([]string{"retention"}, stack...), tc.args...)...)
				assert.Equal(t, 1, code, stderr)
				assert.Contains(t, stderr, tc.want)
				assert.Empty(t, stdout)
			})
		}
		code, _, stderr := bandplane(t, "retention", "-h")
		assert.Equal(t, 0, code)
		assert.Contains(t, stderr, "without it the cuts are unsigned and verify reports those events missing")
	})
}
