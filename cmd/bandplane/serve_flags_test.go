package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestServeRefusesGraphQLLimitsThatMeanNothing: a zero or negative GraphQL limit is a
// usage error naming the flag, before anything is started (no server is needed).
func TestServeRefusesGraphQLLimitsThatMeanNothing(t *testing.T) {
	for _, args := range [][]string{
		{"--graphql-query-timeout", "0s"},
		{"--graphql-query-timeout", "-1s"},
		{"--graphql-max-concurrent-per-key", "0"},
		{"--graphql-clickhouse-conns", "-3"},
		{"--graphql-websocket-writes-per-second", "0"},
		{"--max-policy-replays-per-org", "0"},
		{"--policy-replay-timeout", "0s"},
		{"--policy-replay-timeout", "-1m"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"serve"}, args...), strings.NewReader(""), &stdout, &stderr)
		assert.Equal(t, 1, code, args)
		assert.Contains(t, stderr.String(), args[0]+" must be greater than 0", args)
	}
}

func TestPageHosts(t *testing.T) {
	assert.Equal(t, []string{"localhost", "127.0.0.1", "::1"}, pageHosts("", "0.0.0.0:8080"))
	assert.Equal(t, []string{"localhost", "127.0.0.1", "::1"}, pageHosts("", ":8080"))
	assert.Equal(t, []string{"localhost", "127.0.0.1", "::1", "10.0.0.5"}, pageHosts("", "10.0.0.5:8080"))
	assert.Equal(t, []string{"board.example.com", "bp.internal"}, pageHosts(" board.example.com, ,bp.internal ", "127.0.0.1:8080"))
}
