package graph

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

func keyRevoked(t *testing.T, source, keyID, org string) *schema.Event {
	data, err := json.Marshal(keys.EventData{KeyID: keyID, Org: org, Role: keys.RoleViewer})
	require.NoError(t, err)
	return &schema.Event{ID: "rev-" + keyID, Type: schema.TypeKeyRevoked, Time: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC),
		OrgID: org, Source: source, Data: data}
}

// openSubs opens n work subscriptions of key in org, each with a key check that counts
// its calls.
func openSubs(t *testing.T, h *Hub, ctx context.Context, key, org string, n int, checks *atomic.Int64) []<-chan *change {
	var out []<-chan *change
	for range n {
		ch, err := h.subscribe(ctx, key, org, "", subWork, func() bool { checks.Add(1); return true })
		require.NoError(t, err)
		out = append(out, ch)
	}
	return out
}

func closed(ch <-chan *change) bool {
	select {
	case _, ok := <-ch:
		return !ok
	default:
		return false
	}
}

func TestHubKeyRevokedEndsEverySubscriptionOfTheKeyAtOnce(t *testing.T) {
	var forgot []string
	h := NewHub(HubConfig{MaxSubscriptionsPerKey: 200, Forget: func(id string) { forgot = append(forgot, id) }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var checks atomic.Int64
	revoked := openSubs(t, h, ctx, "k-a", "org-a", 100, &checks)
	other := openSubs(t, h, ctx, "k-b", "org-a", 3, &checks)
	platform := openSubs(t, h, ctx, "k-platform", "org-b", 2, &checks)

	h.Publish(keyRevoked(t, keys.Source, "k-a", "org-a"))
	for i, ch := range revoked {
		require.True(t, closed(ch), "subscription %d of the revoked key is still open", i)
	}
	for _, ch := range append(other, platform...) {
		require.False(t, closed(ch), "another key's subscription ended")
	}
	require.Zero(t, checks.Load(), "no key was looked up: the event alone ended them")
	require.Equal(t, []string{"k-a"}, forgot, "the process's key cache drops the key too")
	require.Equal(t, 5, h.Subscribers())

	// A platform key's revocation carries no organization.
	h.Publish(keyRevoked(t, keys.Source, "k-platform", ""))
	for _, ch := range platform {
		require.True(t, closed(ch))
	}
	require.Equal(t, 3, h.Subscribers())
}

func TestHubIgnoresAForgedKeyRevoked(t *testing.T) {
	var forgot []string
	h := NewHub(HubConfig{Forget: func(id string) { forgot = append(forgot, id) }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var checks atomic.Int64
	subs := openSubs(t, h, ctx, "k-a", "org-a", 2, &checks)
	for _, ev := range []*schema.Event{
		keyRevoked(t, "band", "k-a", "org-a"),                                          // the platform's source: only bandplane revokes keys
		keyRevoked(t, schema.SourceBandplane, "k-a", "org-a"),                          // bandplane's, but not its key store's
		{Type: schema.TypeKeyRevoked, Source: keys.Source, Data: []byte(`{"key_id":`)}, // does not decode
		{Type: schema.TypeKeyRevoked, Source: keys.Source, Data: []byte(`{}`)},         // names no key
	} {
		h.Publish(ev)
	}
	for _, ch := range subs {
		require.False(t, closed(ch))
	}
	require.Empty(t, forgot)
}

func TestHubKeyCheckEndsSubscriptionsTheHeldKeysNoLongerAllow(t *testing.T) {
	h := NewHub(HubConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var allowed atomic.Bool
	allowed.Store(true)
	var checks atomic.Int64
	ch, err := h.subscribe(ctx, "k-a", "org-a", "", subWork, func() bool { checks.Add(1); return allowed.Load() })
	require.NoError(t, err)
	h.checkKeys()
	require.False(t, closed(ch))
	allowed.Store(false) // e.g. revoked while Kafka was down: the cache's next read drops it
	h.checkKeys()
	require.True(t, closed(ch))
	require.Equal(t, int64(2), checks.Load(), "one check per subscription per tick")
}
