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

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

func bandplane(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// storeNoted writes rows as ingest does: into ClickHouse, then their notes on the
// stored-events topic of topic (<topic>.stored), keyed by organization.
func storeNoted(t *testing.T, conn driver.Conn, db, topic string, rows []store.EventRow) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: rows}))
	require.NoError(t, kafka.EnsureTopic(ctx, stacktest.Brokers(), topic+".stored", 1))
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic + ".stored"})
	require.NoError(t, err)
	defer func() { _ = p.Close() }()
	byOrg := map[string][]tlog.Leaf{}
	var orgs []string
	for i := range rows {
		if _, ok := byOrg[rows[i].OrgID]; !ok {
			orgs = append(orgs, rows[i].OrgID)
		}
		byOrg[rows[i].OrgID] = append(byOrg[rows[i].OrgID], tlog.LeafOf(&rows[i]))
	}
	var msgs []kafkago.Message
	for _, org := range orgs {
		for _, b := range tlog.EncodeNotes(byOrg[org]) {
			msgs = append(msgs, kafkago.Message{Key: []byte(org), Value: b})
		}
	}
	require.NoError(t, p.ProduceMessages(ctx, msgs))
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
	code, stdout, stderr := bandplane(t, append([]string{"audit", "keygen", "--out", keyFile}, stack...)...)
	require.Equal(t, 0, code, stderr)
	var kg map[string]string
	lastLine(t, stdout, &kg)
	pub, err := trail.LoadPublicKey(keyFile + ".pub")
	require.NoError(t, err)
	vkey, err := tlog.VerifierKey(tlog.DefaultPrefix(db), pub)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"key_id": tlog.KeyID(pub), "private": keyFile, "public": keyFile + ".pub", "verifier_key": vkey}, kg)

	now := time.Now().UTC()
	var rows []store.EventRow
	for i := range 20 {
		rows = append(rows, store.EventRow{ID: fmt.Sprintf("cli-%02d", i), Type: "message.created", Time: now.Add(-time.Hour + time.Duration(i)*time.Second).Truncate(time.Millisecond),
			OrgID: []string{"org-a", "org-b"}[i%2], ActorID: "agent-1", ActorType: "agent", Source: "band", SchemaVersion: 1,
			Data: fmt.Sprintf(`{"content":"hi %d"}`, i), IngestedAt: now.Add(-time.Minute).Truncate(time.Second), Offset: int64(i)})
	}
	storeNoted(t, conn, db, topic, rows)
	// Written by hand, with no note: never sealed.
	insert := rows[0]
	insert.ID, insert.IngestedAt = "by-hand", now.Add(-time.Hour).Truncate(time.Second)
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: []store.EventRow{insert}}))

	code, stdout, stderr = bandplane(t, append([]string{"audit", "seal", "--audit-key", keyFile}, stack...)...)
	require.Equal(t, 0, code, stderr)
	var res trail.Result
	lastLine(t, stdout, &res)
	assert.Equal(t, 2, res.Checkpoints)
	assert.Equal(t, 20, res.Leaves)
	assert.Equal(t, 2, res.Orgs)
	latest, err := kafka.ReadLatest(ctx, stacktest.Brokers(), topic+".checkpoints")
	require.NoError(t, err)
	assert.Len(t, latest, 3, "org-a's and org-b's checkpoints and the coverage note, on the checkpoints topic")

	verify := func(args ...string) (int, trail.Report, string) {
		t.Helper()
		code, stdout, stderr := bandplane(t, append(append([]string{"audit", "verify"}, stack...), args...)...)
		var rep trail.Report
		if code == 0 || code == 1 && stdout != "" {
			lastLine(t, stdout, &rep)
		}
		return code, rep, stderr
	}
	// The public half suffices; the private one works too; the environment names it.
	for _, k := range []string{keyFile + ".pub", keyFile} {
		code, rep, stderr := verify("--audit-key", k)
		require.Equal(t, 1, code, stderr)
		assert.Equal(t, []string{"unexpected by-hand"}, problemKinds(rep), "the row written by hand")
		assert.Equal(t, 20, rep.SealedEvents)
		assert.Equal(t, uint64(20), rep.Leaves)
		assert.Contains(t, stderr, `audit verify: org "org-b": 10 leaves, 10 sealed events, 0 unsealed, 0 problems`)
	}
	require.NoError(t, conn.Exec(ctx, "ALTER TABLE "+db+".events DELETE WHERE id = 'by-hand'"))
	waitMutations(t, conn, db)
	t.Setenv("BANDPLANE_AUDIT_KEY", keyFile+".pub")
	code, rep, stderr := verify("--org", "org-b", "--from", now.Add(-time.Hour).Format(time.RFC3339), "--to", now.Format(time.RFC3339))
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, 10, rep.SealedEvents)
	assert.Equal(t, 1, rep.Orgs)

	// A checkpoint kept outside (the topic's, saved to a file) is extended; a file
	// that is not a checkpoint of the key is named.
	saved := filepath.Join(dir, "org-a.checkpoint")
	require.NoError(t, os.WriteFile(saved, latest["org-a"], 0o644))
	code, _, stderr = verify("--checkpoint", saved, "--checkpoints-topic=false")
	require.Equal(t, 0, code, stderr)
	junk := filepath.Join(dir, "junk.checkpoint")
	require.NoError(t, os.WriteFile(junk, []byte("bandplane/x/org/a\n1\nAAAA\n\n— x AAAA\n"), 0o644))
	code, rep, _ = verify("--checkpoint", junk)
	assert.Equal(t, 1, code)
	assert.Equal(t, []string{"forged checkpoint:checkpoint file " + junk}, problemKinds(rep))

	// A tampered row: exit 1, named in the last line with its leaf.
	require.NoError(t, conn.Exec(ctx, "ALTER TABLE "+db+".events UPDATE data = '{}' WHERE id = 'cli-03'"))
	waitMutations(t, conn, db)
	code, rep, _ = verify()
	assert.Equal(t, 1, code)
	require.Len(t, rep.Problems, 1)
	assert.Equal(t, "cli-03", rep.Problems[0].ID)
	assert.Equal(t, trail.KindModified, rep.Problems[0].Kind)
	require.NotNil(t, rep.Problems[0].Leaf)
	assert.Equal(t, uint64(1), *rep.Problems[0].Leaf)

	// Another key: every checkpoint is forged to it, and the topic's too.
	otherKey := filepath.Join(dir, "other.key")
	code, _, stderr = bandplane(t, "audit", "keygen", "--out", otherKey)
	require.Equal(t, 0, code, stderr)
	code, rep, _ = verify("--audit-key", otherKey+".pub")
	assert.Equal(t, 1, code)
	forged := 0
	for _, p := range rep.Problems {
		switch {
		case p.Kind != trail.KindForged:
		case p.ID == "coverage":
			assert.Contains(t, p.Reason, "the coverage note does not verify")
		default:
			forged++
			assert.Contains(t, p.Reason, "no key of the ring")
		}
	}
	assert.Equal(t, 4, forged, "the two checkpoint rows and the topic's two")
	assert.Contains(t, problemKinds(rep), "forged coverage", "and the topic's coverage note")
}

func problemKinds(rep trail.Report) []string {
	var out []string
	for _, p := range rep.Problems {
		out = append(out, p.Kind+" "+p.ID)
	}
	return out
}

func waitMutations(t *testing.T, conn driver.Conn, db string) {
	t.Helper()
	require.True(t, stacktest.Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		var pending uint64
		require.NoError(t, conn.QueryRow(context.Background(), "SELECT count() FROM system.mutations WHERE database = ? AND is_done = 0", db).Scan(&pending))
		return pending == 0
	}))
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
	big := filepath.Join(dir, "big.checkpoint")
	require.NoError(t, os.WriteFile(big, bytes.Repeat([]byte("x"), tlog.MaxNoteBytes+1), 0o600))
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
		{"verify without key", append([]string{"audit", "verify"}, stack...), 1, "--audit-key: no audit key given"},
		{"bad origin", append([]string{"audit", "verify", "--audit-key", keyFile, "--audit-origin", "a b"}, stack...), 1, "--audit-origin:"},
		{"checkpoint file missing", append([]string{"audit", "verify", "--audit-key", keyFile, "--checkpoint", filepath.Join(dir, "none")}, stack...), 1, "--checkpoint:"},
		{"checkpoint file too large", append([]string{"audit", "verify", "--audit-key", keyFile, "--checkpoint", big}, stack...), 1, "not a checkpoint"},
		{"seal with the public key", append([]string{"audit", "seal", "--audit-key", keyFile + ".pub"}, stack...), 1, "is a public key: sealing needs the private key"},
		{"seal with a missing key", append([]string{"audit", "seal", "--audit-key", filepath.Join(dir, "nope")}, stack...), 1, "does not exist"},
		{"seal with garbage", append([]string{"audit", "seal", "--audit-key", garbage}, stack...), 1, "is not PEM"},
		{"verify with garbage", append([]string{"audit", "verify", "--audit-key", garbage}, stack...), 1, "is not PEM"},
		{"from after to", append([]string{"audit", "verify", "--audit-key", keyFile, "--from", "2026-02-10", "--to", "2026-02-09"}, stack...), 1, "--to (2026-02-09T00:00:00Z) must be after --from (2026-02-10T00:00:00Z)"},
		{"malformed from", append([]string{"audit", "verify", "--audit-key", keyFile, "--from", "yesterday"}, stack...), 1, `--from: "yesterday" is neither RFC 3339 nor YYYY-MM-DD`},
		{"malformed to", append([]string{"audit", "verify", "--audit-key", keyFile, "--to", "2026-13-01"}, stack...), 1, "--to:"},
		{"org without a log", append([]string{"audit", "verify", "--audit-key", keyFile, "--org", "nobody", "--checkpoints-topic=false"}, stack...), 1, `organization "nobody" has no log`},
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
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "audit.key")
	code, _, stderr := bandplane(t, "audit", "keygen", "--out", keyFile)
	require.Equal(t, 0, code, stderr)
	pub, err := trail.LoadPublicKey(keyFile + ".pub")
	require.NoError(t, err)
	t.Setenv("BANDPLANE_AUDIT_KEY", "")

	// A sealed trail of 4 events 30 days old and 4 of today. The old ones sit at noon of
	// one day, read once here: all four in one partition, the one the test expects,
	// whatever the time of day it runs at.
	y, m, d := time.Now().UTC().AddDate(0, 0, -30).Date()
	oldDay := time.Date(y, m, d, 12, 0, 0, 0, time.UTC)
	stackArgs := func(t *testing.T) []string {
		conn, db := stacktest.Database(t)
		topic := stacktest.Topic(t, 1)
		stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", topic}
		now := time.Now().UTC()
		var rows []store.EventRow
		for i := range 8 {
			at := now.Add(-time.Hour)
			if i < 4 {
				at = oldDay
			}
			rows = append(rows, store.EventRow{ID: fmt.Sprintf("ret-%02d", i), Type: "message.created", Time: at.Add(time.Duration(i) * time.Second).Truncate(time.Millisecond),
				OrgID: "org-a", ActorID: "agent-1", ActorType: "agent", Source: "band", SchemaVersion: 1,
				Data: fmt.Sprintf(`{"content":"hi %d"}`, i), IngestedAt: now.Add(-time.Minute).Truncate(time.Second), Offset: int64(i)})
		}
		storeNoted(t, conn, db, topic, rows)
		code, _, stderr := bandplane(t, append([]string{"audit", "seal", "--audit-key", keyFile}, stack...)...)
		require.Equal(t, 0, code, stderr)
		// The cut must be recorded after the checkpoint (whole seconds).
		sealedAt := time.Now().Unix()
		require.True(t, stacktest.Eventually(t, 3*time.Second, 10*time.Millisecond, func() bool { return time.Now().Unix() > sealedAt }))
		return stack
	}
	type output struct {
		DryRun  bool           `json:"dry_run"`
		Dropped []chdb.Dropped `json:"dropped"`
		Cuts    []chdb.Cut     `json:"cuts"`
	}
	verify := func(stack []string) (int, trail.Report) {
		t.Helper()
		code, stdout, stderr := bandplane(t, append([]string{"audit", "verify", "--audit-key", keyFile + ".pub"}, stack...)...)
		require.Contains(t, []int{0, 1}, code, stderr)
		var rep trail.Report
		lastLine(t, stdout, &rep)
		return code, rep
	}

	t.Run("signed", func(t *testing.T) {
		stack := stackArgs(t)
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
		assert.Equal(t, []chdb.Dropped{{Table: "events", Partition: oldDay.Format("20060102")}}, out.Dropped)
		require.Len(t, out.Cuts, 1)
		assert.Equal(t, tlog.KeyID(pub), out.Cuts[0].KeyID)
		assert.NotEmpty(t, out.Cuts[0].Signature)
		code, rep := verify(stack)
		assert.Equal(t, 0, code, "%v", rep.Problems)
		assert.Equal(t, 4, rep.SealedEvents)
		assert.Equal(t, 4, rep.ExpiredEvents)
	})

	t.Run("unsigned", func(t *testing.T) {
		stack := stackArgs(t)
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
			assert.Equal(t, trail.KindMissing, p.Kind)
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

// audit verify reads the Kafka record each row no leaf covers claims, and takes the
// coverage note of its --group only.
func TestIntegrationAuditVerifyChecksTheClaimedRecord(t *testing.T) {
	conn, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 1)
	ctx := context.Background()
	stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", topic}
	keyFile := filepath.Join(t.TempDir(), "audit.key")
	code, _, stderr := bandplane(t, "audit", "keygen", "--out", keyFile)
	require.Equal(t, 0, code, stderr)

	// Two events on the events topic (offsets 0 and 1).
	now := time.Now().UTC()
	agent := schema.Party{ID: "agent-1", Type: schema.ActorAgent}
	evs := []schema.Event{
		{ID: "ev-0", Type: "message.created", Time: now.Add(-time.Hour).Truncate(time.Millisecond), OrgID: "org-a", Actor: agent, Source: "band", SchemaVersion: 1, Data: json.RawMessage(`{"content":"a"}`)},
		{ID: "ev-1", Type: "message.created", Time: now.Add(-time.Hour + time.Second).Truncate(time.Millisecond), OrgID: "org-a", Actor: agent, Source: "band", SchemaVersion: 1, Data: json.RawMessage(`{"content":"b"}`)},
	}
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	require.NoError(t, p.Produce(ctx, evs))
	require.NoError(t, p.Close())
	row := func(ev schema.Event, offset int64) store.EventRow {
		return store.EventRow{ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type),
			Source: ev.Source, SchemaVersion: 1, Data: string(ev.Data), IngestedAt: now.Add(-time.Minute).Truncate(time.Second), Offset: offset}
	}
	// ev-0 stored and noted, as ingest does; then, by hand, a row that claims ev-0's
	// record, and ev-1's row (not noted yet, say).
	storeNoted(t, conn, db, topic, []store.EventRow{row(evs[0], 0)})
	claimer := row(evs[1], 0)
	claimer.ID = "claimer"
	require.NoError(t, store.New(conn, db).BatchInsert(ctx, &store.Batch{Events: []store.EventRow{claimer, row(evs[1], 1)}}))
	code, _, stderr = bandplane(t, append([]string{"audit", "seal", "--audit-key", keyFile, "--group", "other-ingest"}, stack...)...)
	require.Equal(t, 0, code, stderr)

	for _, group := range []string{"", "other-ingest"} {
		args := append([]string{"audit", "verify", "--audit-key", keyFile + ".pub"}, stack...)
		if group != "" {
			args = append(args, "--group", group)
		}
		code, stdout, stderr := bandplane(t, args...)
		require.Equal(t, 1, code, stderr)
		var rep trail.Report
		lastLine(t, stdout, &rep)
		assert.Equal(t, []string{"unexpected claimer"}, problemKinds(rep))
		assert.Contains(t, rep.Problems[0].Reason, "its Kafka record (partition 0, offset 0) is event ev-0 at ")
		assert.Equal(t, 1, rep.UnsealedEvents, "ev-1, at its own record")
		assert.Equal(t, 1, rep.SealedEvents)
		ignored := "ignoring the coverage note of ingest group other-ingest (this deployment's ingest group is ingest)"
		if group == "" {
			assert.Contains(t, stderr, ignored, "the default group is serve's: ingest")
		} else {
			assert.NotContains(t, stderr, ignored)
		}
	}
	code, _, stderr = bandplane(t, "audit", "verify", "--export", "x.ndjson", "--audit-key", keyFile+".pub", "--group", "g")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--group: not with --export")
}
