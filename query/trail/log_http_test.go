package trail

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/tlog"
)

const logTestPrefix = "bandplane/log-http-test"

// The choice between ClickHouse's newest checkpoint and the topic's: the topic's when it
// verifies and is no smaller, a rollback when it is larger, ClickHouse's otherwise.
func TestCombineNewest(t *testing.T) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	ring, err := tlog.NewKeyRing(logTestPrefix, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, nil)
	require.NoError(t, err)
	sign := func(k ed25519.PrivateKey, org string, size uint64) tlog.Checkpoint {
		s, err := tlog.NewSigner(logTestPrefix, k)
		require.NoError(t, err)
		c, err := s.Sign(org, size, make([]byte, 32))
		require.NoError(t, err)
		return c
	}
	stored := sign(key, "org-a", 5)
	noneErr := fmt.Errorf("%w: organization %q has no checkpoint signed with the audit key", ErrNotInLog, "org-a")

	c, err := combineNewest(ring, "org-a", stored, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, stored.Note, c.Note, "no topic: ClickHouse's")

	same := sign(key, "org-a", 5)
	c, err = combineNewest(ring, "org-a", stored, nil, map[string][]byte{"org-a": same.Note})
	require.NoError(t, err)
	assert.Equal(t, same.Note, c.Note, "the topic's is fresher")

	larger := sign(key, "org-a", 9)
	_, err = combineNewest(ring, "org-a", stored, nil, map[string][]byte{"org-a": larger.Note})
	assert.ErrorIs(t, err, ErrLogDamaged)
	assert.ErrorContains(t, err, "rolled back")

	c, err = combineNewest(ring, "org-a", tlog.Checkpoint{}, noneErr, map[string][]byte{"org-a": larger.Note})
	require.NoError(t, err)
	assert.Equal(t, larger.Note, c.Note, "only the topic has it")

	for name, note := range map[string][]byte{
		"another key":          sign(other, "org-a", 9).Note,
		"another organization": sign(key, "org-b", 9).Note,
		"junk":                 []byte("junk"),
	} {
		c, err = combineNewest(ring, "org-a", stored, nil, map[string][]byte{"org-a": note})
		require.NoError(t, err, name)
		assert.Equal(t, stored.Note, c.Note, "%s: ClickHouse's", name)
		_, err = combineNewest(ring, "org-a", tlog.Checkpoint{}, noneErr, map[string][]byte{"org-a": note})
		assert.ErrorIs(t, err, ErrNotInLog, name)
	}

	assert.True(t, isOrgKey("org-a"))
	assert.True(t, isOrgKey(""))
	assert.False(t, isOrgKey(CoverageKey))
	assert.False(t, isOrgKey(RotationKeyPrefix+"abc"))
	assert.Equal(t, [][]byte{[]byte("r1"), []byte("r2")},
		TopicRotations(map[string][]byte{RotationKeyPrefix + "b": []byte("r2"), RotationKeyPrefix + "a": []byte("r1"), "org-a": []byte("c"), CoverageKey: []byte("cov")}))
}

// The topic is read once per refresh interval, a failed read included (with Kafka down
// every request would wait for it again); a request's own cancellation is not kept. The
// test runs in a synctest bubble: the cache's clock (time.Now) moves only when the test
// sleeps, so what is within the interval does not depend on the machine's speed.
func TestTopicCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reads := 0
		fail := errors.New("kafka down")
		var answer error
		l := &latestCheckpoints{read: func(ctx context.Context) (map[string][]byte, error) {
			reads++
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if answer != nil {
				return nil, answer
			}
			return map[string][]byte{"org-a": []byte("n")}, nil
		}}
		ctx := context.Background()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err := l.get(cancelled)
		assert.ErrorIs(t, err, context.Canceled)
		answer = fail
		_, err = l.get(ctx)
		assert.ErrorIs(t, err, fail)
		time.Sleep(checkpointRefresh - time.Nanosecond)
		_, err = l.get(ctx)
		assert.ErrorIs(t, err, fail)
		assert.Equal(t, 2, reads, "the failure is kept")
		answer = nil
		time.Sleep(time.Nanosecond)
		m, err := l.get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "n", string(m["org-a"]))
		_, _ = l.get(ctx)
		assert.Equal(t, 3, reads)
	})
}
