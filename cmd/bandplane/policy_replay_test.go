package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy/replay"
)

// `policy replay` refuses bad flags with exit 2, naming the flag, before it connects to
// anything (no server is needed).
func TestPolicyReplayFlagErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "x.rego")
	require.NoError(t, os.WriteFile(file, []byte("package x\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--bundle is required"},
		{[]string{"--bundle", filepath.Join(dir, "missing")}, "is not a folder"},
		{[]string{"--bundle", file}, "is not a folder"},
		{[]string{"--bundle", dir, "--from", "2026-12-02", "--to", "2026-12-01"}, "--from (2026-12-02T00:00:00Z) must be before --to"},
		{[]string{"--bundle", dir, "--from", "yesterday"}, "--from:"},
		{[]string{"--bundle", dir, "--to", "12/01/2026"}, "--to:"},
		{[]string{"--bundle", dir, "--examples", "0"}, "--examples must be 1..1000"},
		{[]string{"--bundle", dir, "--examples", "1001"}, "--examples must be 1..1000"},
		{[]string{"--bundle", dir, "--kinds", "peer_visible,send_mail"}, `--kinds: unknown decision kind "send_mail"`},
		{[]string{"--bundle", dir, "--warmup", "0s"}, "--warmup must be > 0"},
		{[]string{"--bundle", dir, "--warmup", "-1h"}, "--warmup must be > 0"},
		{[]string{"--bundle", dir, "--eval-timeout", "0s"}, "--eval-timeout must be > 0"},
		{[]string{"--bundle", dir, "--eval-timeout", "-1s"}, "--eval-timeout must be > 0"},
		{[]string{"--bundle", dir, "--max-memory", "1000"}, "--max-memory: the memory bound of a policy replay must be at least 64 MiB"},
		{[]string{"--bundle", dir, "--max-memory", "-1"}, "--max-memory: the memory bound of a policy replay must be at least 64 MiB"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"policy", "replay"}, tc.args...), strings.NewReader(""), &stdout, &stderr)
		assert.Equal(t, 2, code, "%v: %s", tc.args, stderr.String())
		assert.Contains(t, stderr.String(), tc.want, tc.args)
		assert.Empty(t, stdout.String(), tc.args)
	}
}

// The reload gate's flags: off by default, a ratio within 0..1, a window above 0.
func TestPolicyGateFlags(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := policyFlags{maxFlipRatio: -1, gateWindow: 24 * time.Hour}
	g, err := p.gate(replay.Run, nil, "db", nil, log)
	require.NoError(t, err)
	assert.Nil(t, g, "no gate without --policy-max-flip-ratio")

	p.maxFlipRatio = 0
	g, err = p.gate(replay.Run, nil, "db", nil, log)
	require.NoError(t, err)
	assert.NotNil(t, g, "0 is the strictest gate, not none")

	p.maxFlipRatio = 1.5
	_, err = p.gate(replay.Run, nil, "db", nil, log)
	assert.ErrorContains(t, err, "--policy-max-flip-ratio must be between 0 and 1")

	p.maxFlipRatio, p.gateWindow = 0.1, 0
	_, err = p.gate(replay.Run, nil, "db", nil, log)
	assert.ErrorContains(t, err, "--policy-gate-window must be > 0")
}

// The bounded replay's child: a spec that is not JSON is refused by name; what its
// stderr says is read back (progress, its error line, and an out-of-memory death
// whose goroutine dump is longer than the tail kept); a result past its bound is noted.
func TestPolicyReplayChild(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{replayChildCommand}, strings.NewReader("{not json"), &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "bandplane "+replayChildCommand+": cannot read the replay's spec")
	assert.Empty(t, stdout.String())

	var got []replay.Progress
	dump := strings.Repeat("goroutine 7 [running]:\n\t/work/policy/replay/replay.go:429 +0xba\n", 2000)
	f := readChildStderr(strings.NewReader(replayProgressPrefix+`{"Decisions":5,"Fraction":0.5}`+"\n"+
		"bandplane "+replayChildCommand+": the candidate bundle is refused: x\n"+
		"fatal error: out of memory\n"+dump), func(p replay.Progress) { got = append(got, p) })
	require.Len(t, got, 1)
	assert.Equal(t, 5, got[0].Decisions)
	assert.Equal(t, "the candidate bundle is refused: x", f.message)
	assert.True(t, f.outOfMemory, "seen although the dump after it is longer than the tail")
	assert.NotContains(t, f.tail, "fatal error", "the tail is bounded")

	out := &limitedBuffer{max: 4}
	n, err := out.Write([]byte("123456"))
	require.NoError(t, err)
	assert.Equal(t, 6, n)
	assert.True(t, out.over)
	assert.Equal(t, "1234", out.String())
}
