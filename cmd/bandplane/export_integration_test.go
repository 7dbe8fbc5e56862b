package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// TestIntegrationExport drives the real `bandplane serve --audit-key` and the real CLI:
// events posted to the collector (and a few awkward rows written by hand, noted on the
// stored-events topic as ingest notes what it stores) are sealed with `bandplane audit
// seal`, exported as NDJSON and CSV through GET /v1/audit/export, and verified offline
// against the audit key and an auditor's checkpoint; a changed, a dropped and an added
// line are each named; an export killed midway (SIGKILL) and resumed equals, byte for
// byte, an uninterrupted export of the same selection; rows edited or deleted in
// ClickHouse after sealing are gaps of the next export.
func TestIntegrationExport(t *testing.T) {
	began := time.Now()
	s := newStack(t)
	keyFile := filepath.Join(s.dir, "audit.key")
	require.NoError(t, trail.GenerateKey(keyFile))
	pubFile := keyFile + ".pub"
	ingestKey := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	compliance := s.key(t, "alpha-compliance", "org-alpha", keys.RoleCompliance)
	viewer := s.key(t, "alpha-viewer", "org-alpha", keys.RoleViewer)
	bravoAdmin := s.key(t, "bravo-admin", "org-bravo", keys.RoleAdmin)
	platformAdmin := s.key(t, "platform-admin", keys.PlatformOrg, keys.RoleAdmin)
	srv := s.serve(t, "--audit-key", keyFile, "--seal-every", "1h", "--no-policy")
	t.Logf("serve ready after %s", time.Since(began).Round(time.Millisecond))

	// The range holds the posted events only (the key.created events are stamped now).
	from := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
	to := from.Add(time.Hour)
	rangeArgs := []string{"--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339)}
	exportQuery := "from=" + url.QueryEscape(from.Format(time.RFC3339)) + "&to=" + url.QueryEscape(to.Format(time.RFC3339))

	// Nothing sealed yet: 409, saying what to do.
	code, body := srv.do(http.MethodGet, "/v1/audit/export?"+exportQuery, compliance, "", nil)
	require.Equal(t, http.StatusConflict, code, "%s", body)
	assert.Contains(t, string(body), "is serve running with --audit-key?")

	const alphaEvents, bravoEvents = 2400, 300
	var evs []schema.Event
	content := strings.Repeat(`quote " comma , backslash \ tab	 `, 24)
	for i := range alphaEvents + bravoEvents {
		org, n := "org-alpha", i
		if i >= alphaEvents {
			org, n = "org-bravo", i-alphaEvents
		}
		typ := []string{"message.created", "event.tool_call", "message.created"}[n%3]
		data, _ := json.Marshal(map[string]any{"content": fmt.Sprintf("%s %d <&>", content, n), "n": n})
		evs = append(evs, schema.Event{ID: fmt.Sprintf("%s-%05d", org, n), Type: typ, Time: from.Add(time.Duration(n) * 1300 * time.Millisecond),
			OrgID: org, RoomID: []string{"room-1", "room-2"}[n%2], Actor: schema.Party{ID: fmt.Sprintf("agent-%d", n%5), Type: schema.ActorAgent},
			Source: "band", SchemaVersion: schema.Version, Data: data})
	}
	// Two rounds, each sealed: the export is pinned to the second round's checkpoint,
	// and proves its consistency with the first.
	stackArgs := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db, "--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic}
	ctx := context.Background()
	// sealNow seals until every one of ids has a leaf (a note produced after a run's
	// drain is sealed by the next one).
	sealNow := func(ids []string) trail.Result {
		t.Helper()
		isoWaitStored(t, s, ids)
		var res trail.Result
		for run := 1; ; run++ {
			code, stdout, stderr := bandplane(t, append([]string{"audit", "seal", "--audit-key", keyFile}, stackArgs...)...)
			require.Equal(t, 0, code, stderr)
			var r trail.Result
			lastLine(t, stdout, &r)
			res.Checkpoints, res.Leaves = res.Checkpoints+r.Checkpoints, res.Leaves+r.Leaves
			var n uint64
			require.NoError(t, s.conn.QueryRow(ctx, "SELECT uniqExact(id) FROM "+s.db+".log_leaves WHERE has(?, id)", ids).Scan(&n))
			if n == uint64(len(ids)) {
				return res
			}
			require.Less(t, run, 10, "%d of %d events sealed after %d runs", n, len(ids), run)
			t.Logf("run %d sealed %d of %d events; sealing again", run, n, len(ids))
			time.Sleep(500 * time.Millisecond)
		}
	}
	var firstIDs []string
	for i := 0; i < alphaEvents/2; i += 600 {
		batch := evs[i:min(alphaEvents/2, i+600)]
		isoPost(t, srv, ingestKey, batch)
		for _, e := range batch {
			firstIDs = append(firstIDs, e.ID)
		}
	}
	first := sealNow(firstIDs)
	// What an auditor keeps of org-alpha's log after the first round.
	auditorFile := filepath.Join(s.dir, "alpha.checkpoint")
	code, stdout, stderr := bandplane(t, "audit", "checkpoint", "--org", "org-alpha", "--out", auditorFile, "--server", srv.url, "--key", compliance)
	require.Equal(t, 0, code, "%s%s", stdout, stderr)
	for i := alphaEvents / 2; i < len(evs); i += 600 {
		isoPost(t, srv, ingestKey, evs[i:min(len(evs), i+600)])
	}
	// Rows no collector would store, written by hand and noted as ingest notes what it
	// stores: the export carries them exactly.
	odd := []string{"raw\nnewline", "carriage\r\nreturn", "\xff not utf-8", `"quoted"`, ""}
	var rows []store.EventRow
	for i, d := range odd {
		rows = append(rows, store.EventRow{ID: fmt.Sprintf("odd-%d", i), Type: "message.created", Time: from.Add(time.Duration(i)*time.Second + 7*time.Millisecond),
			OrgID: "org-alpha", RoomID: "room-1", ActorID: "agent-1", ActorType: "agent", Source: "band", SchemaVersion: 1, Data: d,
			IngestedAt: time.Now().UTC().Add(-time.Minute).Truncate(time.Second), Partition: 3, Offset: int64(1_000_000 + i)})
	}
	require.NoError(t, store.New(s.conn, s.db).BatchInsert(ctx, &store.Batch{Events: rows}))
	noteRows(t, s.topic+".stored", rows)
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	sealed := sealNow(ids)
	require.GreaterOrEqual(t, first.Leaves+sealed.Leaves, alphaEvents+bravoEvents+len(odd))
	t.Logf("%d events posted, stored and sealed in %d checkpoints after %s", first.Leaves+sealed.Leaves, first.Checkpoints+sealed.Checkpoints, time.Since(began).Round(time.Millisecond))

	// Who may export what.
	for _, tc := range []struct {
		name, token, query string
		status             int
	}{
		{"no key", "", exportQuery, 401},
		{"viewer", viewer, exportQuery, 403},
		{"another organization", bravoAdmin, exportQuery + "&org=org-alpha", 403},
		{"platform without org", platformAdmin, exportQuery, 400},
		{"bad parameter", compliance, exportQuery + "&types=" + strings.Repeat("x,", 101), 400},
	} {
		code, body := srv.do(http.MethodGet, "/v1/audit/export?"+tc.query, tc.token, "", nil)
		assert.Equal(t, tc.status, code, "%s: %s", tc.name, body)
		var eb keys.ErrorBody
		assert.NoError(t, json.Unmarshal(body, &eb), "%s: %s", tc.name, body)
		assert.NotEmpty(t, eb.Error, tc.name)
	}

	dir := t.TempDir()
	export := func(t *testing.T, token, out string, args ...string) (int, string, string) {
		t.Helper()
		return bandplane(t, append([]string{"audit", "export", "--out", out, "--server", srv.url, "--key", token, "--quiet"}, args...)...)
	}
	verify := func(t *testing.T, file string, extra ...string) (int, trail.ExportReport, string) {
		t.Helper()
		code, stdout, stderr := bandplane(t, append([]string{"audit", "verify", "--export", file, "--audit-key", pubFile}, extra...)...)
		var rep trail.ExportReport
		lastLine(t, stdout, &rep)
		return code, rep, stderr
	}
	type summary struct {
		Events uint64 `json:"events"`
		Gaps   uint64 `json:"gaps"`
		Size   uint64 `json:"size"`
		Bytes  int64  `json:"bytes"`
	}

	// The whole range, both encodings: every event of org-alpha, none of org-bravo.
	files := map[string]string{}
	for _, format := range []string{"ndjson", "csv"} {
		t.Run(format, func(t *testing.T) {
			start := time.Now()
			out := filepath.Join(dir, "alpha."+format)
			code, stdout, stderr := export(t, compliance, out, append(rangeArgs, "--format", format, "--checkpoint", auditorFile)...)
			require.Equal(t, 0, code, stderr)
			var sum summary
			lastLine(t, stdout, &sum)
			assert.Equal(t, uint64(alphaEvents+len(odd)), sum.Events)
			assert.Zero(t, sum.Gaps)
			assert.GreaterOrEqual(t, sum.Size, uint64(alphaEvents+len(odd)), "both rounds")
			t.Logf("%s: %d events at size %d, %d bytes in %s", format, sum.Events, sum.Size, sum.Bytes, time.Since(start).Round(time.Millisecond))
			start = time.Now()
			code, rep, stderr := verify(t, out, "--checkpoint", auditorFile)
			require.Equal(t, 0, code, stderr)
			assert.True(t, rep.OK())
			assert.Equal(t, int64(alphaEvents+len(odd)), rep.Events)
			assert.Len(t, rep.Consistent, 1, "the auditor's checkpoint")
			assert.Contains(t, stderr, "OK: every line and gap is a leaf of the signed checkpoint")
			t.Logf("%s verified offline in %s", format, time.Since(start).Round(time.Millisecond))
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			assert.False(t, bytes.Contains(b, []byte("org-bravo-")), "an event of another organization")
			files[format] = out
		})
	}
	require.Len(t, files, 2)

	// A selection by type and room, and another organization with a platform key.
	out := filepath.Join(dir, "filtered.ndjson")
	code2, stdout, stderr := export(t, compliance, out, append(rangeArgs, "--type", "message.created", "--room", "room-1,room-9")...)
	require.Equal(t, 0, code2, stderr)
	var sum summary
	lastLine(t, stdout, &sum)
	want := len(odd)
	for _, e := range evs[:alphaEvents] {
		if e.Type == "message.created" && e.RoomID == "room-1" {
			want++
		}
	}
	assert.Equal(t, uint64(want), sum.Events)
	code2, _, stderr = verifyCLI(t, out, pubFile)
	require.Equal(t, 0, code2, stderr)
	out = filepath.Join(dir, "bravo.csv")
	code2, stdout, stderr = export(t, platformAdmin, out, append(rangeArgs, "--org", "org-bravo", "--format", "csv")...)
	require.Equal(t, 0, code2, stderr)
	lastLine(t, stdout, &sum)
	assert.Equal(t, uint64(bravoEvents), sum.Events)
	code2, _, stderr = verifyCLI(t, out, pubFile)
	require.Equal(t, 0, code2, stderr)

	// Tampering with the file: each change is named by line and event id.
	original, err := os.ReadFile(files["ndjson"])
	require.NoError(t, err)
	ls := bytes.SplitAfter(original, []byte("\n"))
	tampered := func(name string, edit func([][]byte) [][]byte) trail.ExportReport {
		t.Helper()
		f := filepath.Join(dir, name+".ndjson")
		require.NoError(t, os.WriteFile(f, bytes.Join(edit(append([][]byte{}, ls...)), nil), 0o600))
		code, rep, stderr := verify(t, f)
		assert.Equal(t, 1, code, stderr)
		return rep
	}
	// Line 1 is the header; line 2 + i holds the i-th event in (time, id) order.
	rep := tampered("changed", func(l [][]byte) [][]byte {
		l[101] = bytes.Replace(l[101], []byte("backslash"), []byte("BACKSLASH"), 1)
		return l
	})
	require.Len(t, rep.Problems, 1, "%+v", rep.Problems)
	assert.Equal(t, trail.ExportChanged, rep.Problems[0].Kind)
	assert.Equal(t, int64(102), rep.Problems[0].Line)
	changedID := lineID(t, ls[101])
	assert.Equal(t, changedID, rep.Problems[0].ID)
	rep = tampered("dropped", func(l [][]byte) [][]byte { return append(l[:500], l[501:]...) })
	require.Equal(t, trail.ExportDropped, rep.Problems[0].Kind, "%+v", rep.Problems)
	assert.Equal(t, int64(501), rep.Problems[0].Line)
	assert.Equal(t, lineKey(t, ls[500]).Leaf, *rep.Problems[0].Leaf)
	rep = tampered("added", func(l [][]byte) [][]byte {
		extra := bytes.Replace(l[1000], []byte(lineID(t, l[1000])), []byte(lineID(t, l[1000])+"-copy"), 1)
		return append(append(l[:1001:1001], extra), l[1001:]...)
	})
	require.Equal(t, trail.ExportChanged, rep.Problems[0].Kind, "%+v", rep.Problems)
	assert.Equal(t, int64(1002), rep.Problems[0].Line)
	assert.Equal(t, lineID(t, ls[1000])+"-copy", rep.Problems[0].ID)
	assert.Equal(t, trail.ExportAdded, rep.Problems[1].Kind, "%+v", rep.Problems)

	// Killed midway, resumed: the file equals an uninterrupted export of the selection.
	for _, format := range []string{"ndjson", "csv"} {
		t.Run("kill and resume "+format, func(t *testing.T) {
			full, err := os.ReadFile(files[format])
			require.NoError(t, err)
			cutAt := int64(len(full)) * 45 / 100
			for full[cutAt-1] == '\n' {
				cutAt++ // a cut inside a line: --resume drops the partial one
			}
			proxy := pausingProxy(t, srv.url, cutAt)
			out := filepath.Join(dir, "killed."+format)
			cmd := exec.Command(bandplaneBinary(t), append([]string{"audit", "export", "--out", out, "--server", proxy.URL, "--key", compliance, "--format", format,
				"--checkpoint", auditorFile}, rangeArgs...)...)
			var cliErr bytes.Buffer
			cmd.Stderr = &cliErr
			require.NoError(t, cmd.Start())
			require.True(t, stacktest.Eventually(t, 60*time.Second, 10*time.Millisecond, func() bool {
				info, err := os.Stat(out + ".part")
				return err == nil && info.Size() >= cutAt
			}), "the CLI never wrote %d bytes: %s", cutAt, cliErr.String())
			require.NoError(t, cmd.Process.Kill()) // SIGKILL: no cleanup of any kind
			_ = cmd.Wait()
			part, err := os.ReadFile(out + ".part")
			require.NoError(t, err)
			require.Equal(t, full[:cutAt], part, "the killed CLI left what it had received")
			require.NoFileExists(t, out)

			code, stdout, stderr := export(t, compliance, out, "--resume")
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, stderr, "resuming")
			var sum summary
			lastLine(t, stdout, &sum)
			resumed, err := os.ReadFile(out)
			require.NoError(t, err)
			require.True(t, bytes.Equal(full, resumed), "the resumed file differs from the uninterrupted export (%d and %d bytes)", len(resumed), len(full))
			assert.NoFileExists(t, out+".part")
			// The same as an export pinned at the file's size, started afresh.
			again := filepath.Join(dir, "again."+format)
			code, _, stderr = export(t, compliance, again, append(rangeArgs, "--format", format, "--checkpoint", auditorFile, "--as-of", strconv.FormatUint(sum.Size, 10))...)
			require.Equal(t, 0, code, stderr)
			b, err := os.ReadFile(again)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(full, b), "an export pinned at size %d differs", sum.Size)
			// Resuming a complete file does nothing.
			code, _, stderr = export(t, compliance, out, "--resume")
			assert.Equal(t, 0, code, stderr)
			assert.Contains(t, stderr, "is complete: nothing to resume")
		})
	}

	// A cursor of another selection, and one whose file does not match the trail: 409.
	h, err := trail.ParseExportHeader("ndjson", ls[0])
	require.NoError(t, err)
	last, err := trail.ExportEventKey("ndjson", ls[700])
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		events uint64
		edit   func(q url.Values)
		want   string
	}{
		{"other selection", 700, func(q url.Values) { q.Set("format", "csv") }, "belongs to another export"},
		{"wrong count", 650, func(url.Values) {}, "the file holds 650 events"},
	} {
		c, err := trail.NewCursor(&h, tc.events, last.Time, last.ID)
		require.NoError(t, err)
		req, err := h.Request(&c)
		require.NoError(t, err)
		q := req.Values()
		tc.edit(q)
		code, body := srv.do(http.MethodGet, "/v1/audit/export?"+q.Encode(), compliance, "", nil)
		assert.Equal(t, http.StatusConflict, code, "%s: %s", tc.name, body)
		assert.Contains(t, string(body), tc.want, tc.name)
	}

	// The trail edited in ClickHouse after sealing: the next export proves it.
	require.NoError(t, s.conn.Exec(ctx, "ALTER TABLE "+s.db+".events UPDATE data = '{\"content\":\"rewritten\"}' WHERE id = 'org-alpha-00042'"))
	require.NoError(t, s.conn.Exec(ctx, "ALTER TABLE "+s.db+".events DELETE WHERE id = 'org-alpha-00043'"))
	require.True(t, stacktest.Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		var pending uint64
		require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM system.mutations WHERE database = ? AND is_done = 0", s.db).Scan(&pending))
		return pending == 0
	}))
	out = filepath.Join(dir, "edited.ndjson")
	code2, _, stderr = export(t, compliance, out, rangeArgs...)
	require.Equal(t, 0, code2, stderr)
	code2, rep, stderr = verify(t, out)
	assert.Equal(t, 1, code2, stderr)
	got := map[string]string{}
	for _, p := range rep.Problems {
		got[p.ID] = p.Kind
	}
	assert.Equal(t, map[string]string{"org-alpha-00042": trail.ExportModified, "org-alpha-00043": trail.ExportMissing}, got, "%+v", rep.Problems)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "rewritten", "an edited row is a gap, never its new content")

	// ClickHouse rolled back below the checkpoints topic (org-alpha's checkpoints after
	// the auditor's removed): an export without --checkpoint proves consistency with
	// the checkpoint the server serves, which refuses the rollback, so nothing stale is
	// signed; pinned with --as-of at the size left, the export is what it names.
	kept, err := heldCheckpointSize(auditorFile)
	require.NoError(t, err)
	require.NoError(t, s.conn.Exec(ctx, "ALTER TABLE "+s.db+".checkpoints DELETE WHERE org_id = 'org-alpha' AND size > "+strconv.FormatUint(kept, 10)))
	require.True(t, stacktest.Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		var pending uint64
		require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM system.mutations WHERE database = ? AND is_done = 0", s.db).Scan(&pending))
		return pending == 0
	}))
	out = filepath.Join(dir, "rolled-back.ndjson")
	code2, _, stderr = export(t, compliance, out, rangeArgs...)
	assert.Equal(t, 1, code2, stderr)
	assert.Contains(t, stderr, "cannot read the checkpoint the server serves (GET /v1/audit/checkpoint)")
	assert.Contains(t, stderr, "rolled back")
	assert.NoFileExists(t, out+".part")
	code2, stdout, stderr = export(t, compliance, out, append(rangeArgs, "--as-of", strconv.FormatUint(kept, 10))...)
	require.Equal(t, 0, code2, stderr)
	lastLine(t, stdout, &sum)
	assert.Equal(t, kept, sum.Size)
	// The export endpoint itself, given the checkpoints topic as serve gives it: 409,
	// naming the organization, both sizes and what to do.
	onTopic, err := newAuditExporter(s.conn, s.db, "", keyFile, func(ctx context.Context) (map[string][]byte, error) {
		return kafka.ReadLatest(ctx, stacktest.Brokers(), s.topic+".checkpoints")
	}, nil)
	require.NoError(t, err)
	status, eb, _ := exportAsk(t, trail.ExportHandler(fakeAuth{"c": {ID: "c", Org: "org-alpha", Role: keys.RoleCompliance}}, onTopic, nil, nil, trail.ExportLimits{}), http.MethodGet, "c", exportQuery)
	assert.Equal(t, http.StatusConflict, status, "%+v", eb)
	assert.Contains(t, eb.Error, `for org "org-alpha"`)
	assert.Contains(t, eb.Error, fmt.Sprintf("ClickHouse's newest checkpoint has only %d: ClickHouse's log was rolled back", kept))
	assert.Contains(t, eb.Error, "run bandplane audit verify")
	assert.Contains(t, eb.Error, fmt.Sprintf("the checkpoints topic has a checkpoint of %d leaves", h.Size), "the size of the exports before")

	// Every export served is in the trail: audit.exported, with the key that took it.
	var exported uint64
	require.True(t, stacktest.Eventually(t, 20*time.Second, 200*time.Millisecond, func() bool {
		require.NoError(t, s.conn.QueryRow(ctx, "SELECT count() FROM "+s.db+".events WHERE type = ? AND org_id = 'org-alpha' AND actor_id = ?",
			trail.TypeAuditExported, s.ids["alpha-compliance"]).Scan(&exported))
		return exported >= 3
	}), "audit.exported events of org-alpha's compliance key: %d", exported)
	srv.alive()
	t.Logf("done after %s", time.Since(began).Round(time.Millisecond))
}

func verifyCLI(t *testing.T, file, pub string) (int, string, string) {
	t.Helper()
	return bandplane(t, "audit", "verify", "--export", file, "--audit-key", pub)
}

// lineID is the id of an NDJSON event line.
func lineID(t *testing.T, line []byte) string { return lineKey(t, line).ID }

func lineKey(t *testing.T, line []byte) trail.ExportEventID {
	t.Helper()
	k, err := trail.ExportEventKey("ndjson", line)
	require.NoError(t, err)
	return k
}

// noteRows produces the notes of rows written by hand to the stored-events topic, as
// ingest does for what it stores: one message per organization, keyed by it.
func noteRows(t *testing.T, topic string, rows []store.EventRow) {
	t.Helper()
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
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
	require.NoError(t, p.ProduceMessages(context.Background(), msgs))
}

// pausingProxy forwards to target but sends only the first limit bytes of each answer,
// then holds the connection open: a client caught mid-stream.
func pausingProxy(t *testing.T, target string, limit int64) *httptest.Server {
	t.Helper()
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(resp.Body, limit))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(p.Close)
	return p
}
