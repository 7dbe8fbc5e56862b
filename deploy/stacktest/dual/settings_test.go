package dual_test

import (
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
)

// movedOnCurrent are the 18.16 profile settings that current releases ignore in a
// profile (system.settings says is_obsolete) and take as server settings instead, under
// the name given: deploy/clickhouse/current/config.d/bandplane.xml sets them there.
var movedOnCurrent = map[string]string{
	"max_memory_usage_for_all_queries": "max_server_memory_usage",
	"background_pool_size":             "background_pool_size",
	"background_schedule_pool_size":    "background_schedule_pool_size",
}

// xmlElems are the names of the child elements of the element at path in an XML file.
func xmlElems(t *testing.T, file string, path ...string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(stacktest.RepoRoot(), file))
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // read only
	dec := xml.NewDecoder(f)
	var stack, out []string
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if slices.Equal(stack, path) {
				out = append(out, el.Name.Local)
			}
			stack = append(stack, el.Name.Local)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	require.NotEmpty(t, out, "%s has no elements under %s", file, strings.Join(path, "/"))
	return out
}

// The shipped settings are where each ClickHouse generation reads them: every profile
// setting of the 18.16 users.xml is a setting of 18.16; on 26.9 the same names are
// known and in force except exactly the documented three, which the current config
// sets as server settings; every setting of the current config is one 26.9 knows.
func TestIntegrationSettingsLiveWhereEachVersionReadsThem(t *testing.T) {
	ctx := context.Background()
	old, cur := dual.Server(t), dual.Chdb(t)
	inList := func(names []string) string { return "('" + strings.Join(names, "', '") + "')" }
	settings := func(e dual.Engine, q string) map[string]string {
		r, err := e.Query(ctx, q)
		require.NoError(t, err)
		m := map[string]string{}
		for _, row := range r.Rows {
			m[row[0]] = row[1]
		}
		return m
	}

	profile := xmlElems(t, "deploy/local/clickhouse/users.xml", "yandex", "profiles", "default")
	known := settings(old, "SELECT name, value FROM system.settings WHERE name IN "+inList(profile))
	for _, s := range profile {
		assert.Contains(t, known, s, "18.16 does not know the profile setting %s of deploy/local/clickhouse/users.xml", s)
	}

	obsolete := settings(cur, "SELECT name, toString(is_obsolete) FROM system.settings WHERE name IN "+inList(profile))
	var gone []string
	for _, s := range profile {
		if v, ok := obsolete[s]; !ok || v == "1" {
			gone = append(gone, s)
		}
	}
	slices.Sort(gone)
	want := make([]string, 0, len(movedOnCurrent))
	for s := range movedOnCurrent {
		want = append(want, s)
	}
	slices.Sort(want)
	assert.Equal(t, want, gone, "the 18.16 profile settings that %s ignores in a profile", cur.Name())

	curProfile := xmlElems(t, "deploy/clickhouse/current/users.d/bandplane.xml", "clickhouse", "profiles", "default")
	live := settings(cur, "SELECT name, toString(is_obsolete) FROM system.settings WHERE name IN "+inList(curProfile))
	for _, s := range curProfile {
		assert.Equal(t, "0", live[s], "%s of the current users.d is not a live profile setting of %s", s, cur.Name())
		assert.NotContains(t, movedOnCurrent, s)
	}
	server := xmlElems(t, "deploy/clickhouse/current/config.d/bandplane.xml", "clickhouse")
	serverKnown := settings(cur, "SELECT name, value FROM system.server_settings WHERE name IN "+inList(server))
	for _, s := range server {
		if s == "query_log" || s == "timezone" { // configuration of their own, not in system.server_settings
			continue
		}
		assert.Contains(t, serverKnown, s, "%s of the current config.d is not a server setting of %s", s, cur.Name())
	}
	for from, to := range movedOnCurrent {
		assert.Contains(t, server, to, "the current config.d does not set %s (18.16: %s in the profile)", to, from)
	}
}
