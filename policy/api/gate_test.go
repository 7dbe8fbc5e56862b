package api_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
)

// A reload the gate refuses keeps the running bundle and is audited with the gate's
// counts; one it passes is made; a gate that cannot replay refuses too.
func TestReloadGate(t *testing.T) {
	aud := &fakeAuditor{}
	var verdict error
	calls := 0
	a, eng := newAPI(t, aud, func(c *api.Config) {
		c.Gate = func(_ context.Context, b fs.FS) error {
			calls++
			require.NotNil(t, b, "the gate sees the bundle it judges")
			return verdict
		}
	})
	running := eng.Revision()
	from := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	verdict = &api.GateRefusal{Revision: "r2", From: from, To: from.Add(24 * time.Hour), Decisions: 1000, AllowToDeny: 80, DenyToAllow: 2, FlipRatio: 0.082, MaxRatio: 0.05}
	_, err := a.Reload(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "keeping "+running)
	assert.Contains(t, err.Error(), "flips 80 to deny and 2 to allow")
	assert.Equal(t, running, eng.Revision())
	evs := aud.eventsOf(schema.TypePolicyReloadRefused)
	require.Len(t, evs, 1)
	var g api.GateRefusal
	require.NoError(t, schema.DecodeData(evs[0].Data, &g))
	assert.Equal(t, 80, g.AllowToDeny)
	assert.Equal(t, running, g.Running)
	assert.Equal(t, api.SourcePolicy, evs[0].Source)

	verdict = errors.New("the replay gate cannot replay the last 24h0m0s with the new bundle: clickhouse is down")
	_, err = a.Reload(context.Background())
	assert.ErrorContains(t, err, "clickhouse is down")
	assert.Len(t, aud.eventsOf(schema.TypePolicyReloadRefused), 1, "only the gate's verdicts are audited")

	verdict = nil
	rev, err := a.Reload(context.Background())
	require.NoError(t, err)
	assert.Equal(t, rev, eng.Revision())
	assert.Equal(t, 3, calls)
}

// The gate judges only a bundle that compiles and passes its tests: a broken one is
// refused as broken, and neither replayed, counted as the gate's refusal nor audited.
func TestReloadGateSeesOnlyWorkingBundles(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, policy.DefaultBundle()))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.rego"), []byte("package bandplane.broken\n\nx := \n"), 0o600))
	aud := &fakeAuditor{}
	reg := prometheus.NewRegistry()
	calls := 0
	a, eng := newAPI(t, aud, func(c *api.Config) {
		c.BundleDir, c.Registerer = dir, reg
		c.Gate = func(context.Context, fs.FS) error { calls++; return nil }
	})
	running := eng.Revision()
	_, err := a.Reload(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "broken.rego")
	assert.Equal(t, running, eng.Revision())
	assert.Zero(t, calls, "the gate never replays a bundle that does not build")
	assert.Empty(t, aud.eventsOf(schema.TypePolicyReloadRefused))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "bandplane_policy_reloads_refused_total" {
			found = true
			assert.Zero(t, mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	assert.True(t, found, "the refusals metric is registered")

	require.NoError(t, os.Remove(filepath.Join(dir, "broken.rego")))
	_, err = a.Reload(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, calls, "a bundle that builds is judged")
}
