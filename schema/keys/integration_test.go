package keys_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

func newStack(t *testing.T) (driver.Conn, string, string, *kafka.Producer) {
	t.Helper()
	conn, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 1)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic, BatchSize: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return conn, db, topic, p
}

// readEvents reads n events from partition 0 of topic (raw value and decoded).
func readEvents(t *testing.T, topic string, n int) ([]schema.Event, []string) {
	t.Helper()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: stacktest.Brokers(), Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close() //nolint:errcheck // a partition reader commits nothing
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var evs []schema.Event
	var raw []string
	for len(evs) < n {
		m, err := r.ReadMessage(ctx)
		require.NoError(t, err, "read %d of %d events from %s", len(evs), n, topic)
		var e schema.Event
		require.NoError(t, json.Unmarshal(m.Value, &e))
		evs = append(evs, e)
		raw = append(raw, string(m.Value))
	}
	return evs, raw
}

// topicSize is how many records topic holds.
func topicSize(t *testing.T, topic string) int64 {
	t.Helper()
	total, _, err := kafka.Lag(context.Background(), stacktest.Brokers(), topic, "nobody-"+topic)
	require.NoError(t, err)
	return total
}

func sha(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

func TestIntegrationKeyLifecycle(t *testing.T) {
	conn, db, topic, p := newStack(t)
	ctx := context.Background()
	store := keys.NewStore(conn, db, p)

	cache, err := keys.NewCache(keys.CacheConfig{Store: store, Refresh: 300 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, cache.Load(ctx))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = cache.Run(runCtx) }()

	before := time.Now().UTC().Truncate(time.Second)
	k, tok, err := store.Create(ctx, "acme", keys.RoleIngest, "collector", "ops@host")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(tok, "bpk_"))
	assert.Equal(t, "acme", k.Org)
	assert.Equal(t, keys.RoleIngest, k.Role)
	assert.Equal(t, "ops@host", k.CreatedBy)
	assert.True(t, k.Active())
	assert.False(t, k.CreatedAt.Before(before))
	platform, ptok, err := store.Create(ctx, keys.PlatformOrg, keys.RoleRouter, "", "ops@host")
	require.NoError(t, err)

	// Created while the cache runs: works at the next early refresh (the cache tests
	// bound how soon, on a clock of their own).
	require.True(t, stacktest.Eventually(t, 3*time.Second, 20*time.Millisecond, func() bool {
		_, ok := cache.Lookup(ctx, tok)
		return ok
	}))
	got, ok := cache.Lookup(ctx, tok)
	require.True(t, ok)
	assert.Equal(t, k, got)
	got, ok = cache.Lookup(ctx, ptok)
	require.True(t, ok)
	assert.True(t, got.Platform())

	// Stored: the digest, never the token.
	var stored, digest string
	require.NoError(t, conn.QueryRow(ctx, "SELECT id, token_sha256 FROM "+db+".api_keys FINAL WHERE id = ?", k.ID).Scan(&stored, &digest))
	assert.Equal(t, sha(tok), digest)
	var withToken uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".api_keys WHERE position(concat(id, token_sha256, org_id, role, name, created_by, revoked_by), ?) > 0", tok).Scan(&withToken))
	assert.Zero(t, withToken, "the token is nowhere in the table")

	// List: both keys, newest first, no secret.
	list, err := store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	ids := []string{list[0].ID, list[1].ID}
	assert.ElementsMatch(t, []string{k.ID, platform.ID}, ids)
	assert.False(t, list[0].CreatedAt.Before(list[1].CreatedAt))
	b, _ := json.Marshal(list)
	assert.NotContains(t, string(b), tok)
	assert.NotContains(t, string(b), sha(tok))
	assert.NotContains(t, string(b), ptok)

	// Revoke: refused at the next refresh.
	revoked, err := store.Revoke(ctx, k.ID, "sec@host")
	require.NoError(t, err)
	assert.False(t, revoked.Active())
	assert.Equal(t, "sec@host", revoked.RevokedBy)
	require.True(t, stacktest.Eventually(t, 5*time.Second, 20*time.Millisecond, func() bool {
		_, ok := cache.Lookup(ctx, tok)
		return !ok
	}))
	_, ok = cache.Lookup(ctx, ptok)
	assert.True(t, ok, "the other key still works")

	// Revoking again: the same key, no new event.
	again, err := store.Revoke(ctx, k.ID, "someone-else")
	require.NoError(t, err)
	assert.Equal(t, revoked, again)
	_, err = store.Revoke(ctx, "no-such-key", "sec@host")
	require.ErrorIs(t, err, schema.ErrNotFound)
	assert.Contains(t, err.Error(), "no-such-key")
	_, err = store.Revoke(ctx, "", "sec@host")
	require.ErrorIs(t, err, schema.ErrNotFound)

	list, err = store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2, "a revocation replaces the row")
	for _, l := range list {
		if l.ID == k.ID {
			assert.Equal(t, revoked, l)
		}
	}

	// The audit events: created, created, revoked; nothing more.
	evs, raw := readEvents(t, topic, 3)
	assert.EqualValues(t, 3, topicSize(t, topic))
	for i, e := range evs {
		require.NoError(t, e.Validate())
		assert.Equal(t, "bandplane-keys", e.Source)
		assert.Equal(t, schema.ActorSystem, e.Actor.Type)
		require.NotNil(t, e.Subject)
		assert.Equal(t, schema.ActorSystem, e.Subject.Type)
		for _, secret := range []string{tok, ptok, sha(tok), sha(ptok)} {
			assert.NotContains(t, raw[i], secret)
		}
	}
	assert.Equal(t, schema.TypeKeyCreated, evs[0].Type)
	assert.Equal(t, "acme", evs[0].OrgID)
	assert.Equal(t, "ops@host", evs[0].Actor.ID)
	assert.Equal(t, k.ID, evs[0].Subject.ID)
	assert.True(t, evs[0].Time.Equal(k.CreatedAt))
	assert.JSONEq(t, `{"key_id":"`+k.ID+`","org":"acme","role":"ingest","name":"collector"}`, string(evs[0].Data))

	assert.Equal(t, schema.TypeKeyCreated, evs[1].Type)
	assert.Empty(t, evs[1].OrgID)
	assert.JSONEq(t, `{"key_id":"`+platform.ID+`","org":"*","role":"router","name":""}`, string(evs[1].Data))

	assert.Equal(t, schema.TypeKeyRevoked, evs[2].Type)
	assert.Equal(t, "acme", evs[2].OrgID)
	assert.Equal(t, "sec@host", evs[2].Actor.ID)
	assert.Equal(t, k.ID, evs[2].Subject.ID)
	assert.True(t, evs[2].Time.Equal(revoked.RevokedAt))
	assert.JSONEq(t, `{"key_id":"`+k.ID+`","org":"acme","role":"ingest","name":"collector"}`, string(evs[2].Data))
}

// failingProducer refuses every event, or only those of one type.
type failingProducer struct {
	mu   sync.Mutex
	next keys.Producer
	fail string // type to refuse; "" refuses all
	seen []schema.Event
}

func (f *failingProducer) Produce(ctx context.Context, events []schema.Event) error {
	f.mu.Lock()
	f.seen = append(f.seen, events...)
	f.mu.Unlock()
	for _, e := range events {
		if f.fail == "" || e.Type == f.fail {
			return errors.New("kafka: not enough in-sync replicas")
		}
	}
	return f.next.Produce(ctx, events)
}

// A key whose key.created event cannot be written is not stored and never
// authenticates; a revocation whose event cannot be written still revokes.
func TestIntegrationKeyAuditFailure(t *testing.T) {
	conn, db, topic, p := newStack(t)
	ctx := context.Background()

	failing := &failingProducer{next: p}
	store := keys.NewStore(conn, db, failing)
	_, tok, err := store.Create(ctx, "acme", keys.RoleAdmin, "", "ops@host")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "key.created event could not be written")
	assert.Contains(t, err.Error(), "not enough in-sync replicas")
	assert.Empty(t, tok, "no token handed out")
	require.Len(t, failing.seen, 1, "the event was attempted")
	var rows uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".api_keys").Scan(&rows))
	assert.Zero(t, rows, "nothing stored")
	list, err := store.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, list)

	// Revocation with its event refused: revoked all the same, and the error says so.
	failing.fail = schema.TypeKeyRevoked
	k, tok, err := store.Create(ctx, "acme", keys.RoleAdmin, "", "ops@host")
	require.NoError(t, err)
	cache, err := keys.NewCache(keys.CacheConfig{Store: store})
	require.NoError(t, err)
	require.NoError(t, cache.Load(ctx))
	_, ok := cache.Lookup(ctx, tok)
	require.True(t, ok)

	revoked, err := store.Revoke(ctx, k.ID, "sec@host")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "key "+k.ID+" is revoked, but its key.revoked event could not be written")
	assert.False(t, revoked.Active())
	require.NoError(t, cache.Load(ctx))
	_, ok = cache.Lookup(ctx, tok)
	assert.False(t, ok, "revoked although its event is missing")
	list, err = store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.False(t, list[0].Active())

	// Only the one created event that succeeded reached the topic.
	evs, _ := readEvents(t, topic, 1)
	assert.Equal(t, schema.TypeKeyCreated, evs[0].Type)
	assert.Equal(t, k.ID, evs[0].Subject.ID)
	assert.EqualValues(t, 1, topicSize(t, topic))
}

// Hostile inputs to Create are refused before anything is produced or stored.
func TestIntegrationKeyCreateRefusesBadInput(t *testing.T) {
	conn, db, topic, p := newStack(t)
	ctx := context.Background()
	rec := &failingProducer{next: p, fail: "none"}
	store := keys.NewStore(conn, db, rec)
	for _, c := range []struct {
		org, role, name, by, want string
	}{
		{"", "viewer", "", "ops", "organization is empty"},
		{"a*", "viewer", "", "ops", "'*'"},
		{"acme\n", "viewer", "", "ops", "control character"},
		{strings.Repeat("o", 257), "viewer", "", "ops", "more than 256"},
		{"acme", "root", "", "ops", "unknown role \"root\""},
		{"acme", "", "", "ops", "unknown role"},
		{"acme", "viewer", "x\x1b[31m", "ops", "control character"},
		{"acme", "viewer", "", "", "who acts is empty"},
	} {
		_, tok, err := store.Create(ctx, c.org, keys.Role(c.role), c.name, c.by)
		require.Error(t, err, "%+v", c)
		assert.Contains(t, err.Error(), c.want)
		assert.Empty(t, tok)
	}
	assert.Empty(t, rec.seen)
	var rows uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count() FROM "+db+".api_keys").Scan(&rows))
	assert.Zero(t, rows)
	assert.Zero(t, topicSize(t, topic))
}
