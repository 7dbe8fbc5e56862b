package schema_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/schema"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGeneratedLinesRoundTrip: every line of a simulated workload (platform frames and
// canonical directory events) decodes, and its canonical form decodes again to the
// same event, as ingest does when it reads it back from Kafka.
func TestGeneratedLinesRoundTrip(t *testing.T) {
	cfg := simulate.DefaultConfig()
	cfg.Events = 3000
	cfg.Start = time.Date(2026, 2, 9, 10, 0, 0, 0, time.UTC)
	var lines [][]byte
	_, err := simulate.Run(context.Background(), cfg, simulate.SinkFunc(func(_ context.Context, ls [][]byte) error {
		lines = append(lines, ls...)
		return nil
	}), nil)
	require.NoError(t, err)
	require.Len(t, lines, cfg.Events)
	frames := 0
	for _, l := range lines {
		require.NoError(t, schema.CheckJSON(l), "%s", l)
		e, err := schema.Decode(l)
		require.NoError(t, err, "%s", l)
		if e.Source == schema.SourceBand {
			frames++
		}
		b, err := json.Marshal(e)
		require.NoError(t, err)
		again, err := schema.Decode(b)
		require.NoError(t, err, "%s", b)
		assert.Equal(t, e, again, "%s", l)
	}
	assert.Greater(t, frames, cfg.Events/2, "most generated lines are frames")
}
