package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/dashboards"
)

func dashboardsCmd(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(append([]string{"dashboards"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDashboardsWritesAndChecksBothFolders(t *testing.T) {
	dir := t.TempDir()
	out, alerts := filepath.Join(dir, "dashboards"), filepath.Join(dir, "alerting")

	code, _, stderr := dashboardsCmd("--out", out, "--alerts", alerts, "--check")
	assert.Equal(t, 1, code, "nothing written yet: stale")
	assert.Contains(t, stderr, dashboards.CostFile+": missing")
	assert.Contains(t, stderr, dashboards.AlertsFile+": missing")

	code, stdout, stderr := dashboardsCmd("--out", out, "--alerts", alerts)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "wrote "+filepath.Join(out, dashboards.CostFile))
	assert.Contains(t, stdout, "wrote "+filepath.Join(alerts, dashboards.AlertsFile))

	code, stdout, stderr = dashboardsCmd("--out", out, "--alerts", alerts, "--check")
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "dashboards in "+out+" are up to date")
	assert.Contains(t, stdout, "alert rules in "+alerts+" are up to date")

	// A stray file in the alerting folder would break Grafana's provisioning.
	require.NoError(t, os.WriteFile(filepath.Join(alerts, "notes.txt"), []byte("x"), 0o644))
	code, _, stderr = dashboardsCmd("--out", out, "--alerts", alerts, "--check")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "notes.txt: not generated")
	assert.Contains(t, stderr, "run 'bandplane dashboards --alerts "+alerts+"'")

	code, _, stderr = dashboardsCmd("extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "unexpected arguments")
}

// The committed files are up to date: `bandplane dashboards --check` as CI runs it.
func TestDashboardsCheckOfTheRepository(t *testing.T) {
	root := filepath.Join("..", "..")
	code, stdout, stderr := dashboardsCmd("--out", filepath.Join(root, "deploy", "grafana", "dashboards"),
		"--alerts", filepath.Join(root, "deploy", "grafana", "provisioning", "alerting"), "--check")
	assert.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s\nregenerate with: go run ./cmd/bandplane dashboards", stdout, stderr)
}
