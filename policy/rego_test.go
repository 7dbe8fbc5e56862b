package policy

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRegoBundle runs the bundle's Rego tests through OPA's test runner and holds the
// policies to 95% line coverage.
func TestRegoBundle(t *testing.T) {
	rep, err := TestBundle(context.Background(), DefaultBundle())
	require.NoError(t, err)
	t.Logf("rego tests passed: %d, line coverage: %.1f%%", rep.Passed, rep.Coverage)
	for _, l := range rep.NotCovered {
		t.Logf("not covered: %s", l)
	}
	require.Greater(t, rep.Passed, 30)
	require.GreaterOrEqual(t, rep.Coverage, 95.0)
}
