package store_test

import (
	"context"
	"testing"
)

// BenchmarkStoredEventsLookup is the lookup of a fresh batch of 20,000 keys (nothing
// found but one replay) against a table of 1M rows: what ingest asks before writing
// each batch. It needs the servers (BANDPLANE_INTEGRATION=1, make up).
func BenchmarkStoredEventsLookup(b *testing.B) {
	st, keys := lookupFixture(b)
	ctx := context.Background()
	for b.Loop() {
		got, err := st.StoredEvents(ctx, keys)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != 1 {
			b.Fatalf("found %d stored events, want the one replay", len(got))
		}
	}
}
