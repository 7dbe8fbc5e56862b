package graph

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// An organization whose keys read more bytes a second than its share waits for it to
// refill, holding its slot, and fails only when that would pass its deadline (after
// waiting until then); another organization, and the platform, read on at once.
func TestReadSlotsHoldAnOrganizationToItsByteRate(t *testing.T) {
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	var naps []time.Duration
	l := Limits{MaxReadBytesPerOrg: 1 << 20, MaxResponseBytes: 4 << 20, now: func() time.Time { return now },
		sleep: func(_ context.Context, d time.Duration) error { naps = append(naps, d); now = now.Add(d); return nil }}
	l.defaults()
	s := newReadSlots(l)
	hostile := keys.Key{ID: "k-h", Org: "org-h", Role: keys.RoleCompliance}
	other := keys.Key{ID: "k-h2", Org: "org-h", Role: keys.RoleViewer}
	legit := keys.Key{ID: "k-a", Org: "org-a", Role: keys.RoleViewer}
	platform := keys.Key{ID: "k-p", Org: keys.PlatformOrg, Role: keys.RoleAdmin}

	read := func(k keys.Key, bytes int64, timeout time.Duration) error {
		ctx, cancel := context.WithDeadline(context.Background(), now.Add(timeout))
		defer cancel()
		release, err := s.acquire(ctx, k)
		if err != nil {
			return err
		}
		release()
		s.charge(k, bytes)
		return nil
	}
	require.NoError(t, read(hostile, 3<<20, 10*time.Second), "a burst of up to one full response")
	require.NoError(t, read(hostile, 3<<20, 10*time.Second), "the bucket was not empty yet")
	require.Empty(t, naps)

	// 2 MiB past its share: another organization and the platform read at once.
	require.NoError(t, read(legit, 1<<20, 10*time.Second))
	require.NoError(t, read(platform, 1<<20, 10*time.Second))
	require.Empty(t, naps, "nobody else waits")

	// The organization's keys wait 2 s for the share, then read.
	require.NoError(t, read(other, 1<<20, 10*time.Second), "the organization's other keys share its rate")
	require.Equal(t, []time.Duration{2*time.Second + time.Millisecond}, naps)

	// Now 1 MiB past: a read whose deadline is nearer waits until it, then fails.
	naps = nil
	err := read(hostile, 1, 500*time.Millisecond)
	require.ErrorIs(t, err, schema.ErrTooMany)
	assert.Contains(t, err.Error(), "organization org-h read more than its 1048576 bytes a second from ClickHouse (--graphql-max-read-bytes-per-org); retry in 501ms")
	assert.Equal(t, []time.Duration{499 * time.Millisecond}, naps, "it answers no sooner than its deadline")
}
