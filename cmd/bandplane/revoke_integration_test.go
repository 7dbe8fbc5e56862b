package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/schema/keys"
)

// TestIntegrationRevocationEndsEverySubscription opens 100 subscriptions of one key on
// a real serve and revokes the key: its key.revoked event, read live from Kafka, ends
// them all. The key cache's own refresh is an hour here, so nothing else can.
func TestIntegrationRevocationEndsEverySubscription(t *testing.T) {
	s := newStack(t)
	viewer := s.key(t, "revoked-viewer", "org-acme", keys.RoleViewer)
	other := s.key(t, "other-viewer", "org-acme", keys.RoleViewer)
	srv := s.serve(t, "--key-refresh", "1h")
	wsURL := "ws" + strings.TrimPrefix(srv.url, "http") + "/graphql"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const conns, perConn = 4, 25
	var subs []<-chan wsclient.Message
	for range conns {
		conn, err := wsclient.Dial(ctx, wsURL, viewer)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		for range perConn {
			_, ch, err := conn.Subscribe(ctx, workSub, nil, 4)
			require.NoError(t, err)
			subs = append(subs, ch)
		}
	}
	otherConn, err := wsclient.Dial(ctx, wsURL, other)
	require.NoError(t, err)
	t.Cleanup(func() { _ = otherConn.Close() })
	_, kept, err := otherConn.Subscribe(ctx, workSub, nil, 4)
	require.NoError(t, err)

	_, err = s.keys.Revoke(ctx, s.ids["revoked-viewer"], "test")
	require.NoError(t, err)
	revoked := time.Now()
	var last time.Duration
	for i, ch := range subs {
		select {
		case m, ok := <-ch:
			if ok {
				require.NotEmpty(t, m.Errors, "subscription %d: a change instead of its end: %s", i, m.Data)
				require.Equal(t, "UNAUTHENTICATED", m.Errors[0].Extensions["code"], "%+v", m.Errors)
			}
		case <-ctx.Done():
			t.Fatalf("subscription %d of the revoked key is still open %s after the revocation", i, time.Since(revoked))
		}
		last = time.Since(revoked)
	}
	t.Logf("%d subscriptions of the revoked key ended within %s of the revocation", len(subs), last.Round(time.Millisecond))
	select {
	case m := <-kept:
		t.Fatalf("another key's subscription ended or changed: %+v", m)
	default:
	}
	srv.alive()
}
