package keys

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCacheHeldNeverReadsTheStore(t *testing.T) {
	src := &fakeSource{}
	tok := src.add("k1", "org-a", RoleViewer)
	c := newTestCache(t, src, &fakeClock{}, nil)
	require.NoError(t, c.Load(context.Background()))
	loads := src.loads.Load()

	k, ok := c.Held(tok)
	require.True(t, ok)
	require.Equal(t, "k1", k.ID)
	for _, token := range []string{newToken(), "", "not-a-token", tok + "x"} {
		_, ok := c.Held(token)
		require.False(t, ok, "%q", token)
	}
	require.Equal(t, loads, src.loads.Load(), "unknown tokens read nothing")
}

func TestCacheForgetDropsAKeyAheadOfTheStore(t *testing.T) {
	src := &fakeSource{}
	tok := src.add("k1", "org-a", RoleViewer)
	other := src.add("k2", "org-a", RoleViewer)
	c := newTestCache(t, src, &fakeClock{}, nil)
	require.NoError(t, c.Load(context.Background()))

	held := c.keys.Load()
	c.Forget("k1")
	_, ok := c.Held(tok)
	require.False(t, ok, "forgotten at once")
	_, ok = c.Held(other)
	require.True(t, ok, "other keys stay")
	require.Len(t, *held, 2, "the map a Lookup may be reading is not changed")

	// A read of the store that does not show the revocation yet (it started before the
	// revocation was stored, or the row was edited back) does not bring the key back.
	require.NoError(t, c.refresh(context.Background(), false, false))
	_, ok = c.Held(tok)
	require.False(t, ok)
	_, ok = c.Lookup(context.Background(), tok)
	require.False(t, ok)

	c.Forget("k-unknown") // a key this process never held
	_, ok = c.Held(other)
	require.True(t, ok)
}
