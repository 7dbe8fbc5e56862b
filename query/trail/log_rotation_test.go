package trail

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/tlog"
)

func testLog(t *testing.T, tr *trail, anchor ed25519.PrivateKey) *Log {
	t.Helper()
	l, err := NewLog(tr.conn, tr.db, "", []ed25519.PublicKey{pubOf(anchor)})
	require.NoError(t, err)
	return l
}

// Recording a rotation again reuses the record; a second record for a rotated key, a
// new key already used, and a hand-over before a checkpoint already signed are refused,
// each naming the keys and the times.
func TestIntegrationRecordRotation(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	prefix := tlog.DefaultPrefix(tr.db)
	l := testLog(t, tr, tr.key)
	next, third := testKey(t), testKey(t)
	oldID, nextID, thirdID := tlog.KeyID(pubOf(tr.key)), tlog.KeyID(pubOf(next)), tlog.KeyID(pubOf(third))
	var newest time.Time
	rep := tr.verify(Filter{})
	for _, org := range orgs3 {
		if at := headOf(t, rep, org).SignedAt; at.After(newest) {
			newest = at
		}
	}

	// Not after the newest checkpoint: refused, naming the organization and the times.
	early, err := tlog.Rotation(prefix, tr.key, next, newest)
	require.NoError(t, err)
	_, err = l.RecordRotation(ctx, early, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not after organization")
	assert.Contains(t, err.Error(), "signed at "+newest.UTC().Format(time.RFC3339))
	// The topic's newest checkpoints count too: one signed later than ClickHouse's.
	from := time.Now().Add(time.Hour).Truncate(time.Second)
	rec, err := tlog.Rotation(prefix, tr.key, next, from)
	require.NoError(t, err)
	signer, err := tlog.NewSigner(prefix, tr.key)
	require.NoError(t, err)
	later, err := tlog.Rotation(prefix, tr.key, next, newest.Add(time.Second))
	require.NoError(t, err)
	untilPast(t, newest.Add(time.Second))
	fresh, err := signer.Sign("org-b", 10, make([]byte, 32))
	require.NoError(t, err)
	require.False(t, fresh.SignedAt.Before(newest.Add(time.Second)), "the topic's checkpoint is signed when the rotation starts, or after")
	_, err = l.RecordRotation(ctx, later, map[string][]byte{"org-b": fresh.Note, CoverageKey: []byte("not a checkpoint")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `not after organization "org-b"'s newest checkpoint on the checkpoints topic`)

	out, err := l.RecordRotation(ctx, rec, nil)
	require.NoError(t, err)
	assert.False(t, out.Reused)
	assert.Equal(t, rec, out.Note)

	// Again, at another time: the first record, not a second one.
	again, err := tlog.Rotation(prefix, tr.key, next, from.Add(time.Minute))
	require.NoError(t, err)
	out, err = l.RecordRotation(ctx, again, nil)
	require.NoError(t, err)
	assert.True(t, out.Reused)
	assert.Equal(t, rec, out.Note)
	assert.True(t, out.Record.From.Equal(from))
	stored, err := l.Rotations(ctx)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{rec}, stored)
	require.NoError(t, l.Rotate(ctx, again), "Rotate is as idempotent")

	// The rotated key to another key.
	other, err := tlog.Rotation(prefix, tr.key, third, from)
	require.NoError(t, err)
	_, err = l.RecordRotation(ctx, other, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("key %s is rotated to key %s from %s already, not to key %s", oldID, nextID, from.UTC().Format(time.RFC3339), thirdID))
	// A new key already introduced, or already retired.
	intro, err := tlog.Rotation(prefix, third, next, from)
	require.NoError(t, err)
	_, err = l.RecordRotation(ctx, intro, nil)
	assert.ErrorContains(t, err, "the new key "+nextID+" took over from key "+oldID)
	back, err := tlog.Rotation(prefix, next, tr.key, from.Add(time.Hour))
	require.NoError(t, err)
	_, err = l.RecordRotation(ctx, back, nil)
	assert.ErrorContains(t, err, "the new key "+oldID+" is retired already")
	// The new key handing over before it takes over.
	soon, err := tlog.Rotation(prefix, next, third, from.Add(-time.Minute))
	require.NoError(t, err)
	_, err = l.RecordRotation(ctx, soon, nil)
	assert.ErrorContains(t, err, "the old key cannot hand over")
	// A record that does not verify.
	forged := append([]byte(nil), rec...)
	forged[len(forged)-20] ^= 1 // in the last signature's bytes, not its padding
	_, err = l.RecordRotation(ctx, forged, nil)
	assert.Error(t, err)

	// A record only the topic holds (ClickHouse lost it) is reused and written back.
	tr2, _ := sealedTrail(t)
	l2 := testLog(t, tr2, tr2.key)
	n2 := testKey(t)
	rec2, err := tlog.Rotation(tlog.DefaultPrefix(tr2.db), tr2.key, n2, from)
	require.NoError(t, err)
	retry, err := tlog.Rotation(tlog.DefaultPrefix(tr2.db), tr2.key, n2, from.Add(time.Minute))
	require.NoError(t, err)
	out, err = l2.RecordRotation(ctx, retry, map[string][]byte{RotationKeyPrefix + tlog.KeyID(pubOf(n2)): rec2})
	require.NoError(t, err)
	assert.True(t, out.Reused)
	assert.Equal(t, rec2, out.Note)
	stored, err = l2.Rotations(ctx)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{rec2}, stored)

	// Two records for one key already (as an unchecked rotate could leave): refused,
	// listing both.
	tr2.exec("key_rotations", "DELETE WHERE 1")
	require.NoError(t, tr2.s.db.writeRotation(ctx, time.Now(), rec2))
	require.NoError(t, tr2.s.db.writeRotation(ctx, time.Now(), retry))
	_, err = l2.RecordRotation(ctx, rec2, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is rotated 2 times already")
}

// Heads reads every organization's newest checkpoint in one query, past rows planted
// above a head; one with only planted rows says so, and the others are as they are.
// AtSize finds the signed row of a size past planted rows of that size.
func TestIntegrationLogHeads(t *testing.T) {
	tr, _ := sealedTrail(t)
	ctx := context.Background()
	l := testLog(t, tr, tr.key)
	ring, err := l.Ring(ctx)
	require.NoError(t, err)
	want := map[string]tlog.Checkpoint{}
	for _, org := range orgs3 {
		c, err := l.Newest(ctx, ring, org)
		require.NoError(t, err)
		want[org] = c
	}
	plant := func(org string, size uint64, note string) {
		t.Helper()
		require.NoError(t, tr.conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s.checkpoints (org_id, size, root, signed_at, key_id, note) "+
			"SELECT '%s', toUInt64(%d), '', now(), 'forged', '%s'", tr.db, org, size, note)))
	}
	for i := range maxForged - 1 { // and one at its size: maxForged rows read past
		plant("org-a", want["org-a"].Size+1+uint64(i), fmt.Sprintf("forged %d", i))
	}
	plant("org-a", want["org-a"].Size, "0 forged at its size")
	for i := range maxForged + 1 {
		plant("org-b", want["org-b"].Size+1+uint64(i), fmt.Sprintf("forged %d", i))
	}
	plant("org-planted", 5, "forged")

	heads, err := l.Heads(ctx, ring)
	require.NoError(t, err)
	got := map[string]OrgHead{}
	for _, h := range heads {
		got[h.Org] = h
	}
	require.Len(t, got, 4)
	assert.NoError(t, got["org-a"].Err)
	assert.True(t, ptr(got["org-a"].Checkpoint).Same(ptr(want["org-a"])), "org-a's head past %d planted rows", maxForged)
	assert.NoError(t, got[""].Err)
	assert.True(t, ptr(got[""].Checkpoint).Same(ptr(want[""])))
	assert.ErrorIs(t, got["org-b"].Err, ErrNotInLog)
	assert.ErrorContains(t, got["org-b"].Err, fmt.Sprintf("none of organization \"org-b\"'s %d newest checkpoint rows verifies", maxForged+1))
	assert.ErrorIs(t, got["org-planted"].Err, ErrNotInLog)
	assert.ErrorContains(t, got["org-planted"].Err, "has no checkpoint signed")

	c, err := l.AtSize(ctx, ring, "org-a", want["org-a"].Size)
	require.NoError(t, err)
	assert.True(t, ptr(c).Same(ptr(want["org-a"])))
	_, err = l.AtSize(ctx, ring, "org-a", want["org-a"].Size+1)
	assert.ErrorIs(t, err, ErrNotInLog)
}

func ptr[T any](v T) *T { return &v }
