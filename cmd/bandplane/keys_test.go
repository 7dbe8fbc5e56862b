package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

func keysCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"keys"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// Bad flags and arguments exit 2 with the reason on stderr, before any connection
// (the stack flags point nowhere).
func TestKeysBadFlags(t *testing.T) {
	nowhere := []string{"--clickhouse", "127.0.0.1:1", "--kafka", "127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: bandplane keys"},
		{[]string{"rotate"}, `unknown command "rotate"`},
		{[]string{"create", "--role", "viewer"}, "--org is required"},
		{[]string{"create", "--org", "acme"}, "--role is required (ingest, router, viewer, manager, compliance, operator, admin)"},
		{[]string{"create", "--org", "acme", "--role", "root"}, `--role: unknown role "root" (valid: ingest, router, viewer, manager, compliance, operator, admin)`},
		{[]string{"create", "--org", "acme*", "--role", "viewer"}, "'*' alone is a platform key"},
		{[]string{"create", "--org", "ac\x07me", "--role", "viewer"}, "control character"},
		{[]string{"create", "--org", strings.Repeat("o", 300), "--role", "viewer"}, "300 bytes long"},
		{[]string{"create", "--org", "acme", "--role", "viewer", "extra"}, `unexpected argument "extra"`},
		{[]string{"create", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"list", "extra"}, `unexpected argument "extra"`},
		{[]string{"revoke"}, "want exactly one key id, got 0"},
		{[]string{"revoke", "a", "b"}, "want exactly one key id, got 2"},
	} {
		code, stdout, stderr := keysCmd(t, append(c.args, nowhere...)...)
		assert.Equal(t, 2, code, "%q: %s", c.args, stderr)
		assert.Contains(t, stderr, c.want, "%q", c.args)
		assert.Empty(t, stdout, "%q", c.args)
	}
	code, _, stderr := keysCmd(t, "create", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "--org ORG --role ROLE")
}

// Without a server the error says what could not be reached, on stderr, exit 1.
func TestKeysStackDown(t *testing.T) {
	code, stdout, stderr := keysCmd(t, "list", "--clickhouse", "127.0.0.1:1", "--clickhouse-timeout", "2s")
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "bandplane keys: ")
	assert.Contains(t, stderr, "127.0.0.1:1")
}

func TestIntegrationKeysCLI(t *testing.T) {
	_, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 1)
	stack := []string{"--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", db,
		"--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", topic}

	// create: exactly one JSON line with exactly these fields.
	code, stdout, stderr := keysCmd(t, append([]string{"create", "--org", "acme", "--role", "viewer", "--name", "grafana", "--by", "ops@host"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 1, strings.Count(stdout, "\n"), stdout)
	var fields map[string]string
	require.NoError(t, json.Unmarshal([]byte(stdout), &fields), stdout)
	assert.ElementsMatch(t, []string{"id", "token", "org", "role", "name"}, keysOf(fields))
	assert.Equal(t, "acme", fields["org"])
	assert.Equal(t, "viewer", fields["role"])
	assert.Equal(t, "grafana", fields["name"])
	token, id := fields["token"], fields["id"]
	assert.True(t, strings.HasPrefix(token, keys.TokenPrefix), token)
	assert.NotContains(t, stderr, token)

	code, stdout, stderr = keysCmd(t, append([]string{"create", "--org", "*", "--role", "router"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	var platform createdKey
	require.NoError(t, json.Unmarshal([]byte(stdout), &platform))
	assert.Equal(t, "*", platform.Org)
	assert.Empty(t, platform.Name)

	// list: one JSON line per key, newest first, never a token.
	code, stdout, stderr = keysCmd(t, append([]string{"list"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 2, stdout)
	var listed []keys.Key
	for _, l := range lines {
		var k keys.Key
		require.NoError(t, json.Unmarshal([]byte(l), &k), l)
		listed = append(listed, k)
	}
	assert.ElementsMatch(t, []string{id, platform.ID}, []string{listed[0].ID, listed[1].ID})
	assert.NotContains(t, stdout, token)
	assert.NotContains(t, stdout, platform.Token)
	assert.NotContains(t, stdout, "token")
	for _, k := range listed {
		if k.ID == id {
			assert.Equal(t, "ops@host", k.CreatedBy)
			assert.True(t, k.Active())
		}
	}

	code, stdout, stderr = keysCmd(t, append([]string{"list", "--table"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	assert.True(t, strings.HasPrefix(stdout, "ID "), stdout)
	assert.Contains(t, stdout, id)
	assert.Contains(t, stdout, platform.ID)
	assert.NotContains(t, stdout, token)
	assert.Equal(t, 3, strings.Count(stdout, "\n"))

	// revoke (flags after the id too).
	code, stdout, stderr = keysCmd(t, append([]string{"revoke", id, "--by", "sec@host"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	var revoked keys.Key
	require.NoError(t, json.Unmarshal([]byte(stdout), &revoked), stdout)
	assert.Equal(t, id, revoked.ID)
	assert.False(t, revoked.Active())
	assert.Equal(t, "sec@host", revoked.RevokedBy)

	code, stdout, stderr = keysCmd(t, append([]string{"list", "--table"}, stack...)...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "sec@host")

	code, stdout, stderr = keysCmd(t, append([]string{"revoke", "no-such-key"}, stack...)...)
	assert.Equal(t, 1, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, `bandplane keys: cannot revoke key "no-such-key": not found (see `+"`bandplane keys list`)")

	// Two creations and one revocation: three audit events on the topic.
	total, _, err := kafka.Lag(context.Background(), stacktest.Brokers(), topic, "nobody-"+topic)
	require.NoError(t, err)
	assert.EqualValues(t, 3, total)
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
