package dual_test

import (
	"context"
	"testing"

	"github.com/bandplane/bandplane/deploy/stacktest/dual"
)

// The migrations and everything the ingest pipeline sends (event, usage, directory,
// work-status and budget inserts, the hourly and daily rollups) on the same simulated
// traffic, on 18.16 and on 26.9.
func TestIntegrationCorpusIngest(t *testing.T) {
	other := dual.Chdb(t)
	rec, _ := dual.Database(t)
	loadSimulated(t, rec, 2000)
	steps := rec.Replay(context.Background(), t, other)
	t.Logf("%d steps", len(steps))
}
