package policy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A bundle that calls a builtin reaching outside the process, reading the clock or
// allocating without bound is refused before any of it runs, its tests included: the
// server its http.send names is never called, and the old revision keeps serving.
func TestReloadRefusesHostileBuiltins(t *testing.T) {
	ctx := context.Background()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	t.Cleanup(srv.Close)
	e := exampleEngine(t)
	old := e.Revision()
	for name, tc := range map[string]struct{ file, src, want string }{
		"http.send in a policy": {"lib_extra.rego", "package bandplane.extra\n\nleak := http.send({\"method\": \"GET\", \"url\": \"" + srv.URL + "\"})\n",
			"lib_extra.rego:3 calls http.send, which reaches the network"},
		"http.send in a test": {"extra_test.rego", "package extra_test\n\ntest_leak if http.send({\"method\": \"GET\", \"url\": \"" + srv.URL + "\"})\n",
			"extra_test.rego:3 calls http.send, which reaches the network"},
		"DNS":                  {"lib_extra.rego", "package bandplane.extra\n\nips := net.lookup_ip_addr(\"example.com\")\n", "calls net.lookup_ip_addr, which reaches the network (DNS)"},
		"the environment":      {"lib_extra.rego", "package bandplane.extra\n\nenv := opa.runtime().env\n", "calls opa.runtime, which reads the process's environment"},
		"the wall clock":       {"lib_extra.rego", "package bandplane.extra\n\nnow := time.now_ns()\n", "calls time.now_ns, which reads the wall clock"},
		"an allocation bomb":   {"lib_extra.rego", "package bandplane.extra\n\nall := numbers.range(1, 10000000000)\n", "calls numbers.range, which builds a list"},
		"a builtin as a value": {"lib_extra.rego", "package bandplane.extra\n\nf := x if { some x; x := [1 | net.cidr_expand(\"10.0.0.0/8\")] }\n", "calls net.cidr_expand"},
	} {
		t.Run(name, func(t *testing.T) {
			b := copyBundle(t)
			b[tc.file] = &fstest.MapFile{Data: []byte(tc.src)}
			_, err := e.Reload(ctx, b)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "keeping "+old)
			assert.Equal(t, old, e.Revision())
			_, err = TestBundle(ctx, b)
			assert.ErrorContains(t, err, tc.want, "its tests are not run either")
		})
	}
	assert.Zero(t, calls.Load(), "no hostile bundle reached the network")
}

// Builtins OPA calls nondeterministic, and the JSON schema builtins that load local
// files through $ref, are refused as well.
func TestReloadRefusesNondeterministicAndFileReadingBuiltins(t *testing.T) {
	e := exampleEngine(t)
	for name, src := range map[string]string{
		"json.match_schema":  "package bandplane.extra\n\nx := json.match_schema({\"a\": 1}, {\"$ref\": \"file:///etc/passwd\"})\n",
		"io.jwt.encode_sign": "package bandplane.extra\n\nx := io.jwt.encode_sign({\"alg\": \"HS256\"}, {}, {\"kty\": \"oct\", \"k\": \"AAAA\"})\n",
	} {
		b := copyBundle(t)
		b["lib_extra.rego"] = &fstest.MapFile{Data: []byte(src)}
		_, err := e.Reload(context.Background(), b)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "calls "+name, name)
	}
}
