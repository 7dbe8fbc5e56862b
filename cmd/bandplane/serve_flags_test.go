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
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"serve"}, args...), strings.NewReader(""), &stdout, &stderr)
		assert.Equal(t, 1, code, args)
		assert.Contains(t, stderr.String(), args[0]+" must be greater than 0", args)
	}
}
