package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
)

const (
	frameLine     = `{"topic":"chat_room:room-123","event":"message_created","payload":{"id":"msg-123","content":"@TestBot hi","message_type":"text","metadata":{"mentions":[{"id":"agent-123","handle":"testbot"}]},"sender_id":"user-456","sender_type":"User","chat_room_id":"room-123","inserted_at":"2025-11-17T11:20:10.284136Z"}}`
	usageLine     = `{"topic":"chat_room:room-123","event":"event_created","payload":{"id":"evt-201","content":"usage","message_type":"task","metadata":{"band_usage":{"input_tokens":1200,"output_tokens":340,"cache_read_tokens":0,"cache_write_tokens":0}},"sender_id":"agent-123","sender_type":"Agent","chat_room_id":"room-123","inserted_at":"2026-02-09T10:31:05"}}`
	canonicalLine = `{"id":"e-1","type":"message.created","time":"2026-02-09T12:31:00+02:00","actor":{"id":"u-1","type":"user"},"source":"band"}`
	badTimeLine   = `{"id":"e-2","type":"message.created","time":"yesterday","actor":{"id":"u-1"},"source":"band"}`
	badTopicLine  = `{"topic":"foo:bar","event":"message_created","payload":{}}`
)

func normalize(t *testing.T, stdin string, args ...string) (code int, stdout string, stderr []string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"normalize"}, args...), strings.NewReader(stdin), &out, &errOut)
	if s := strings.TrimRight(errOut.String(), "\n"); s != "" {
		stderr = strings.Split(s, "\n")
	}
	return code, out.String(), stderr
}

func outputEvents(t *testing.T, stdout string) []schema.Event {
	t.Helper()
	var events []schema.Event
	for _, l := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		if l == "" {
			continue
		}
		var e schema.Event
		require.NoError(t, json.Unmarshal([]byte(l), &e), l)
		events = append(events, e)
	}
	return events
}

func TestNormalizeStdin(t *testing.T) {
	in := frameLine + "\n\n   \n" + usageLine + "\r\n" + canonicalLine // no newline at the end
	code, stdout, stderr := normalize(t, in)
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	events := outputEvents(t, stdout)
	require.Len(t, events, 3)
	assert.Equal(t, schema.TypeMessageCreated, events[0].Type)
	assert.Equal(t, "band", events[0].Source)
	assert.Equal(t, "room-123", events[0].RoomID)
	assert.Equal(t, schema.TypeUsageReported, events[1].Type)
	assert.Equal(t, "2026-02-09T10:31:05Z", events[1].Time.Format("2006-01-02T15:04:05Z07:00"))
	assert.Equal(t, "e-1", events[2].ID)
	assert.Equal(t, "2026-02-09T10:31:00Z", events[2].Time.UTC().Format("2006-01-02T15:04:05Z07:00"))

	// Frame ids are the platform's, as ingest gives them to frames the platform sends.
	for i, l := range []string{frameLine, usageLine} {
		e, err := schema.DecodeFrom([]byte(l), time.Time{}, schema.PlatformWriter)
		require.NoError(t, err)
		assert.Equal(t, e.ID, events[i].ID, "line %d", i+1)
		org, err := schema.DecodeFrom([]byte(l), time.Time{}, "org-1")
		require.NoError(t, err)
		assert.NotEqual(t, org.ID, events[i].ID, "line %d", i+1)
	}

	// Every output line is itself canonical input that normalizes to itself.
	code, again, stderr := normalize(t, stdout)
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	assert.Equal(t, stdout, again)

	// "-" is stdin too.
	code, dash, _ := normalize(t, in, "-")
	assert.Equal(t, 0, code)
	assert.Equal(t, stdout, dash)
}

func TestNormalizeInvalidLines(t *testing.T) {
	in := strings.Join([]string{frameLine, badTimeLine, "", `{"id":`, badTopicLine, canonicalLine}, "\n") + "\n"
	code, stdout, stderr := normalize(t, in)
	assert.Equal(t, 1, code)
	assert.Equal(t, []string{
		`line 2: time: cannot parse "yesterday" as RFC 3339`,
		`line 4: invalid JSON at offset 6: unexpected end of JSON input`,
		`line 5: topic: unknown topic "foo:bar"`,
	}, stderr)
	events := outputEvents(t, stdout)
	require.Len(t, events, 2, "valid lines are still written")
	assert.Equal(t, schema.TypeMessageCreated, events[0].Type)
	assert.Equal(t, "e-1", events[1].ID)
}

func TestNormalizeFiles(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.ndjson")
	b := filepath.Join(dir, "b.ndjson")
	require.NoError(t, os.WriteFile(a, []byte(frameLine+"\n"+badTimeLine+"\n"), 0o644))
	require.NoError(t, os.WriteFile(b, []byte("\n"+badTopicLine+"\n"+usageLine+"\n"), 0o644))

	code, stdout, stderr := normalize(t, "", a, b)
	assert.Equal(t, 1, code)
	assert.Equal(t, []string{
		a + `:line 2: time: cannot parse "yesterday" as RFC 3339`,
		b + `:line 2: topic: unknown topic "foo:bar"`,
	}, stderr)
	assert.Len(t, outputEvents(t, stdout), 2)

	// One file: reports name only the line.
	code, _, stderr = normalize(t, "", a)
	assert.Equal(t, 1, code)
	assert.Equal(t, []string{`line 2: time: cannot parse "yesterday" as RFC 3339`}, stderr)

	// A file and stdin.
	code, stdout, stderr = normalize(t, canonicalLine+"\n", a, "-")
	assert.Equal(t, 1, code)
	assert.Equal(t, []string{a + `:line 2: time: cannot parse "yesterday" as RFC 3339`}, stderr)
	assert.Len(t, outputEvents(t, stdout), 2)

	// All valid: status 0.
	good := filepath.Join(dir, "good.ndjson")
	require.NoError(t, os.WriteFile(good, []byte(frameLine+"\n"+canonicalLine+"\n"), 0o644))
	code, stdout, stderr = normalize(t, "", good)
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	assert.Len(t, outputEvents(t, stdout), 2)
}

func TestNormalizeSampleFrames(t *testing.T) {
	sample, err := os.ReadFile(filepath.Join("..", "..", "schema", "testdata", "band", "frames.ndjson"))
	require.NoError(t, err)
	code, stdout, stderr := normalize(t, string(sample))
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	assert.Len(t, outputEvents(t, stdout), bytes.Count(bytes.TrimSpace(sample), []byte("\n"))+1)
}

func TestNormalizeMissingFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.ndjson")
	code, stdout, stderr := normalize(t, "", missing, "-")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	require.Len(t, stderr, 1)
	assert.Contains(t, stderr[0], missing+": open ")
}

func TestNormalizeLongLine(t *testing.T) {
	content := strings.Repeat("x", 9<<20) // 9 MiB
	long := `{"id":"e-big","type":"message.created","time":"2026-02-09T10:00:00Z","actor":{"id":"u"},"source":"band","data":{"content":"` + content + `"}}`
	code, stdout, stderr := normalize(t, frameLine+"\n"+long+"\n"+canonicalLine+"\n")
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	events := outputEvents(t, stdout)
	require.Len(t, events, 3)
	assert.Equal(t, "e-big", events[1].ID)
	assert.Len(t, events[1].Data, len(`{"content":""}`)+len(content))
}

func TestNormalizeHelp(t *testing.T) {
	code, stdout, stderr := normalize(t, "", "-h")
	assert.Equal(t, 0, code)
	assert.Empty(t, stdout)
	assert.Contains(t, strings.Join(stderr, "\n"), "usage: bandplane normalize")
	assert.Contains(t, strings.Join(stderr, "\n"), "normalize writes the\nplatform's", "the help names the writer scope of frame ids")

	code, _, _ = normalize(t, "", "-bogus")
	assert.Equal(t, 2, code)
}
