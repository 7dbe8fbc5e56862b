package policybench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The benchmark's self-replay is exact: the same bundle over its own decisions, each
// against the state its position names, decides every one the same.
func TestSelfReplayIsExact(t *testing.T) {
	s, err := NewSetup(context.Background(), 500, 1500)
	require.NoError(t, err)
	r, err := s.Replay(context.Background(), 3000)
	require.NoError(t, err)
	assert.Equal(t, 3000, r.Decisions)
	assert.Zero(t, r.Flips)
	assert.Zero(t, r.ReasonChanged)
	t.Logf("%+v", r)
}
