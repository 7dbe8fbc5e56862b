package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Hostile values of the chain flags are refused before anything is sent, with the
// flag and the value in the message.
func TestSimulateChainFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--loops", "-0.5"}, "--loops must be in [0, 1], got -0.5"},
		{[]string{"--loops", "2"}, "--loops must be in [0, 1], got 2"},
		{[]string{"--explicit-triggers", "NaN"}, "--explicit-triggers must be in [0, 1], got NaN"},
		{[]string{"--explicit-triggers", "1e400"}, "invalid value \"1e400\" for flag -explicit-triggers"},
		{[]string{"--late-triggers", "+Inf"}, "--late-triggers must be in [0, 1], got +Inf"},
		{[]string{"--late-triggers", "half"}, "invalid value \"half\" for flag -late-triggers"},
		{[]string{"--overlap", "-Inf"}, "--overlap must be in [0, 1], got -Inf"},
		{[]string{"--overlap", "1.0000001"}, "--overlap must be in [0, 1], got 1.0000001"},
		{[]string{"--explicit-triggers", "0.9", "--late-triggers", "0.2"}, "--explicit-triggers + --late-triggers must be <= 1, got 0.9 + 0.2"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"simulate", "--kafka", "127.0.0.1:1", "--quiet"}, tc.args...)
			code := run(args, strings.NewReader(""), &stdout, &stderr)
			assert.NotZero(t, code)
			assert.Contains(t, stderr.String(), tc.want)
			assert.NotContains(t, stderr.String(), "sending to", "nothing is sent")
			assert.Empty(t, stdout.String())
		})
	}
}
