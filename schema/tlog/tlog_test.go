package tlog

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/compact"
	"golang.org/x/mod/sumdb/note"

	"github.com/bandplane/bandplane/schema/store"
)

// memTree is a NodeReader holding every node the appends visited.
type memTree map[compact.NodeID][]byte

func (m memTree) ReadNodes(_ context.Context, org string, ids []compact.NodeID) ([][]byte, error) {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		h, ok := m[id]
		if !ok {
			return nil, fmt.Errorf("org %q has no node %d/%d", org, id.Level, id.Index)
		}
		out[i] = h
	}
	return out, nil
}

func testLeaf(i int) Leaf {
	return Leaf{Org: "alpha", ID: fmt.Sprintf("e-%d", i), Time: time.UnixMilli(1_796_000_000_000 + int64(i)*7).UTC(),
		Digest: store.Digest{byte(i), byte(i >> 8)}, IngestedAt: time.Unix(1_796_000_100, 0).UTC(), Partition: 3, Offset: int64(1000 + i)}
}

// build appends n leaves, returning the tree's nodes and its root at every size.
func build(t *testing.T, n int) (memTree, [][]byte, []Leaf) {
	t.Helper()
	nodes := memTree{}
	rng := NewRange()
	roots := [][]byte{Root(rng)}
	var leaves []Leaf
	for i := 0; i < n; i++ {
		l := testLeaf(i)
		leaves = append(leaves, l)
		require.NoError(t, rng.Append(l.Hash(), func(id compact.NodeID, h []byte) { nodes[id] = h }))
		roots = append(roots, Root(rng))
	}
	return nodes, roots, leaves
}

func TestLeafHashCoversEveryField(t *testing.T) {
	base := testLeaf(1)
	h := base.Hash()
	for name, edit := range map[string]func(*Leaf){
		"org":         func(l *Leaf) { l.Org = "beta" },
		"id":          func(l *Leaf) { l.ID += "x" },
		"time":        func(l *Leaf) { l.Time = l.Time.Add(time.Millisecond) },
		"digest":      func(l *Leaf) { l.Digest[31] ^= 1 },
		"ingested_at": func(l *Leaf) { l.IngestedAt = l.IngestedAt.Add(time.Second) },
		"partition":   func(l *Leaf) { l.Partition++ },
		"offset":      func(l *Leaf) { l.Offset++ },
	} {
		l := base
		edit(&l)
		assert.NotEqual(t, h, l.Hash(), name)
	}
	// org "ab" + id "c" must not hash like org "a" + id "bc".
	a, b := base, base
	a.Org, a.ID, b.Org, b.ID = "ab", "c", "a", "bc"
	assert.NotEqual(t, a.Hash(), b.Hash())
	assert.Equal(t, h, base.Hash(), "deterministic")
}

func TestProofsAgainstEveryRoot(t *testing.T) {
	const n = 37
	nodes, roots, leaves := build(t, n)
	ctx := context.Background()
	for size := uint64(1); size <= n; size++ {
		var idx []uint64
		for i := uint64(0); i < size; i++ {
			idx = append(idx, i)
		}
		proofs, err := InclusionProofs(ctx, nodes, "alpha", idx, size)
		require.NoError(t, err)
		for i, pr := range proofs {
			require.NoError(t, VerifyInclusion(uint64(i), size, leaves[i].Hash(), pr, roots[size]), "leaf %d size %d", i, size)
			// Another leaf's hash, or another size's root, must fail.
			assert.Error(t, VerifyInclusion(uint64(i), size, leaves[(i+1)%n].Hash(), pr, roots[size]))
			if size > 1 {
				assert.Error(t, VerifyInclusion(uint64(i), size, leaves[i].Hash(), pr, roots[size-1]))
			}
		}
		for from := uint64(1); from <= size; from++ {
			pr, err := ConsistencyProof(ctx, nodes, "alpha", from, size)
			require.NoError(t, err)
			require.NoError(t, VerifyConsistency(from, size, pr, roots[from], roots[size]), "%d -> %d", from, size)
			if from < size {
				bad := bytes.Clone(roots[from])
				bad[0] ^= 1
				assert.Error(t, VerifyConsistency(from, size, pr, bad, roots[size]))
			}
		}
	}
	rng, err := LoadRange(ctx, nodes, "alpha", 21)
	require.NoError(t, err)
	assert.Equal(t, roots[21], Root(rng), "a range loaded from the stored nodes has the root appends had")
}

func TestProofsFailOnAMissingNode(t *testing.T) {
	nodes, _, _ := build(t, 8)
	delete(nodes, compact.NewNodeID(1, 1))
	_, err := InclusionProofs(context.Background(), nodes, "alpha", []uint64{0}, 8)
	assert.ErrorContains(t, err, "no node 1/1")
}

func TestNotesRoundTrip(t *testing.T) {
	var notes []Leaf
	for i := 0; i < 2000; i++ {
		notes = append(notes, testLeaf(i))
		notes[i].ID = strings.Repeat("i", 200) + fmt.Sprint(i)
	}
	msgs := EncodeNotes(notes)
	require.Len(t, msgs, 1)
	got, err := DecodeNotes("alpha", msgs[0])
	require.NoError(t, err)
	assert.Equal(t, notes, got)

	for i := 0; i < 8000; i++ { // more than one message holds
		notes = append(notes, testLeaf(i))
		notes[len(notes)-1].ID = strings.Repeat("x", 256)
	}
	msgs = EncodeNotes(notes)
	require.Greater(t, len(msgs), 1)
	var all []Leaf
	for _, m := range msgs {
		assert.LessOrEqual(t, len(m), MaxNotesBytes)
		got, err := DecodeNotes("alpha", m)
		require.NoError(t, err)
		all = append(all, got...)
	}
	assert.Equal(t, notes, all)
}

func TestDecodeNotesRefusesWhatEncodeNeverWrites(t *testing.T) {
	good := EncodeNotes([]Leaf{testLeaf(1)})[0]
	for name, b := range map[string][]byte{
		"empty":            nil,
		"no magic":         []byte("xxxx"),
		"count too large":  append([]byte("bpn1"), 0xff, 0xff, 0xff, 0x0f),
		"truncated":        good[:len(good)-1],
		"trailing bytes":   append(bytes.Clone(good), 0),
		"id length 0":      func() []byte { b := bytes.Clone(good); b[5] = 0; return b }(),
		"id length beyond": func() []byte { b := bytes.Clone(good); b[5] = 0x7f; return b }(),
		"id not UTF-8":     func() []byte { b := bytes.Clone(good); b[6] = 0xff; return b }(),
		"time out of range": func() []byte {
			n := testLeaf(1)
			n.Time = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
			return EncodeNotes([]Leaf{n})[0]
		}(),
	} {
		_, err := DecodeNotes("alpha", b)
		assert.Error(t, err, name)
	}
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return k
}

func TestCheckpointSignAndOpen(t *testing.T) {
	key := newKey(t)
	s, err := NewSigner("bandplane/test", key)
	require.NoError(t, err)
	root := bytes.Repeat([]byte{7}, 32)
	before := time.Now().Truncate(time.Second) // the timestamp is in whole seconds
	c, err := s.Sign("alpha org", 42, root)
	require.NoError(t, err)
	after := time.Now()
	text := string(c.Note)
	assert.True(t, strings.HasPrefix(text, "bandplane/test/org/alpha%20org\n42\n"), text)
	assert.Equal(t, 2, strings.Count(text, "\n— bandplane/test "), "the log's signature and its timestamp: %s", text)

	ring, err := NewKeyRing("bandplane/test", []ed25519.PublicKey{s.Public()}, nil)
	require.NoError(t, err)
	got, err := ring.Open(c.Note)
	require.NoError(t, err)
	assert.Equal(t, "alpha org", got.Org)
	assert.Equal(t, uint64(42), got.Size)
	assert.Equal(t, root, got.Root)
	assert.Equal(t, KeyID(s.Public()), got.KeyID)
	assert.False(t, got.SignedAt.Before(before) || got.SignedAt.After(after), "signed at %s, between %s and %s", got.SignedAt, before, after)

	other, err := NewKeyRing("bandplane/test", []ed25519.PublicKey{newKey(t).Public().(ed25519.PublicKey)}, nil)
	require.NoError(t, err)
	_, err = other.Open(c.Note)
	assert.ErrorContains(t, err, "no key of the ring")

	elsewhere, err := NewKeyRing("bandplane/prod", []ed25519.PublicKey{s.Public()}, nil)
	require.NoError(t, err)
	_, err = elsewhere.Open(c.Note)
	assert.Error(t, err, "another deployment's checkpoint (its key name differs too)")

	forged := strings.Replace(text, "\n42\n", "\n43\n", 1)
	_, err = ring.Open([]byte(forged))
	assert.ErrorContains(t, err, "do not verify")

	// A checkpoint with only the plain signature (no timestamp) is refused.
	skey, err := signerKey("bandplane/test", key)
	require.NoError(t, err)
	plain, err := note.NewSigner(skey)
	require.NoError(t, err)
	body, _, _ := strings.Cut(text, "\n\n")
	bare, err := note.Sign(&note.Note{Text: body + "\n"}, plain)
	require.NoError(t, err)
	_, err = ring.Open(bare)
	assert.ErrorContains(t, err, "without its timestamp")

	// Extension lines are refused even when signed.
	ts, err := NewSigner("bandplane/test", key)
	require.NoError(t, err)
	ext, err := note.Sign(&note.Note{Text: body + "\nextra\n"}, ts.log, ts.ts)
	require.NoError(t, err)
	_, err = ring.Open(ext)
	assert.ErrorContains(t, err, "extension lines")

	_, err = ring.Open(bytes.Repeat([]byte("x"), MaxNoteBytes+1))
	assert.ErrorContains(t, err, "more than")
}

func TestOriginRoundTrip(t *testing.T) {
	for _, org := range []string{"", "alpha", "a/b", "x y+z", "ü%2F", "-", "unattributed"} {
		o := Origin("bandplane/db", org)
		got, ok := OrgOf("bandplane/db", o)
		assert.True(t, ok, org)
		assert.Equal(t, org, got)
		assert.NotContains(t, o, "\n")
	}
	for _, bad := range []string{"bandplane/db", "bandplane/db/org/", "bandplane/other/org/a", "bandplane/db/org/a b", "bandplane/db/org/%zz"} {
		_, ok := OrgOf("bandplane/db", bad)
		assert.False(t, ok, bad)
	}
	for _, bad := range []string{"", "a b", "a+b", strings.Repeat("p", MaxPrefixBytes+1), "a\nb"} {
		assert.Error(t, CheckPrefix(bad), "%q", bad)
	}
}

func TestRotationCarriesTrust(t *testing.T) {
	const prefix = "bandplane/test"
	a, b, c := newKey(t), newKey(t), newKey(t)
	pub := func(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }
	sign := func(k ed25519.PrivateKey) []byte {
		s, err := NewSigner(prefix, k)
		require.NoError(t, err)
		cp, err := s.Sign("alpha", 1, make([]byte, 32))
		require.NoError(t, err)
		return cp.Note
	}
	past, future := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)

	// a hands over to b an hour ago: b's checkpoints of now pass, a's of now do not.
	ab, err := Rotation(prefix, a, b, past)
	require.NoError(t, err)
	for name, anchor := range map[string]ed25519.PrivateKey{"anchored at the first key": a, "anchored at the current key": b} {
		ring, err := NewKeyRing(prefix, []ed25519.PublicKey{pub(anchor)}, [][]byte{ab})
		require.NoError(t, err)
		assert.Empty(t, ring.Problems(), name)
		_, err = ring.Open(sign(b))
		assert.NoError(t, err, name)
		_, err = ring.Open(sign(a))
		assert.ErrorContains(t, err, "outside the key's validity", name)
		_, err = ring.Open(sign(c))
		assert.ErrorContains(t, err, "no key of the ring", "a key no rotation introduced: %s", name)
	}

	// a hands over to b in an hour: a's checkpoints of now pass, b's do not yet.
	abLater, err := Rotation(prefix, a, b, future)
	require.NoError(t, err)
	ring, err := NewKeyRing(prefix, []ed25519.PublicKey{pub(a)}, [][]byte{abLater})
	require.NoError(t, err)
	_, err = ring.Open(sign(a))
	assert.NoError(t, err)
	_, err = ring.Open(sign(b))
	assert.ErrorContains(t, err, "outside the key's validity")

	// A second rotation of the same key is a conflict: neither is followed.
	ac, err := Rotation(prefix, a, c, past.Add(-time.Minute))
	require.NoError(t, err)
	ring, err = NewKeyRing(prefix, []ed25519.PublicKey{pub(a)}, [][]byte{ab, ac})
	require.NoError(t, err)
	require.Len(t, ring.Problems(), 1)
	assert.Contains(t, ring.Problems()[0], "rotated twice")
	_, err = ring.Open(sign(b))
	assert.Error(t, err)
	_, err = ring.Open(sign(c))
	assert.Error(t, err)

	// A record signed by the old key only (the new signature replaced) is refused.
	forged := []byte(strings.Replace(string(ab), "from ", "from 1", 1))
	ring, err = NewKeyRing(prefix, []ed25519.PublicKey{pub(a)}, [][]byte{forged, []byte("junk")})
	require.NoError(t, err)
	assert.Len(t, ring.Problems(), 2)
	_, err = ring.Open(sign(b))
	assert.Error(t, err)

	// Another deployment's rotation is refused.
	other, err := Rotation("bandplane/prod", a, b, past)
	require.NoError(t, err)
	ring, err = NewKeyRing(prefix, []ed25519.PublicKey{pub(a)}, [][]byte{other})
	require.NoError(t, err)
	assert.Len(t, ring.Problems(), 1)
}

func TestExtendsAndCosign(t *testing.T) {
	nodes, roots, _ := build(t, 20)
	key := newKey(t)
	s, err := NewSigner("bandplane/test", key)
	require.NoError(t, err)
	at := func(size uint64, root []byte) Checkpoint {
		c, err := s.Sign("alpha", size, root)
		require.NoError(t, err)
		return c
	}
	c10, c20 := at(10, roots[10]), at(20, roots[20])
	pr, err := ConsistencyProof(context.Background(), nodes, "alpha", 10, 20)
	require.NoError(t, err)
	assert.NoError(t, Extends(&c10, &c20, pr))
	assert.NoError(t, Extends(&c20, &c20, nil), "the same checkpoint again")
	assert.ErrorIs(t, Extends(&c20, &c10, nil), ErrRollback)
	forkRoot := bytes.Clone(roots[20])
	forkRoot[3] ^= 1
	fork := at(20, forkRoot)
	assert.ErrorIs(t, Extends(&c20, &fork, nil), ErrFork)
	assert.ErrorIs(t, Extends(&c10, &fork, pr), ErrFork)

	skey, vkey, err := NewWitnessKey("witness.example")
	require.NoError(t, err)
	ws, err := WitnessSigner(skey)
	require.NoError(t, err)
	wv, err := WitnessVerifier(vkey)
	require.NoError(t, err)
	cosigned, err := Cosign(c20.Note, ws)
	require.NoError(t, err)
	assert.True(t, Cosigned(cosigned, wv))
	assert.False(t, Cosigned(c20.Note, wv))
	ring, err := NewKeyRing("bandplane/test", []ed25519.PublicKey{s.Public()}, nil)
	require.NoError(t, err)
	got, err := ring.Open(cosigned)
	require.NoError(t, err, "a witness's cosignature does not disturb the log's")
	assert.True(t, got.Same(&c20))
}

func TestCoverageSignAndOpen(t *testing.T) {
	key := newKey(t)
	s, err := NewSigner("bandplane/test", key)
	require.NoError(t, err)
	at := time.Unix(1_796_000_000, 0).UTC()
	msg, err := s.SignCoverage("bandplane.events", "ingest", map[int]int64{2: 30, 0: 10, 1: 0}, at)
	require.NoError(t, err)
	ring, err := NewKeyRing("bandplane/test", []ed25519.PublicKey{s.Public()}, nil)
	require.NoError(t, err)
	c, err := ring.OpenCoverage(msg)
	require.NoError(t, err)
	assert.Equal(t, Coverage{Topic: "bandplane.events", Group: "ingest", Offsets: map[int]int64{0: 10, 1: 0, 2: 30}, SignedAt: at, KeyID: KeyID(s.Public())}, c)

	forged := []byte(strings.Replace(string(msg), "\n2 30\n", "\n2 31\n", 1))
	_, err = ring.OpenCoverage(forged)
	assert.ErrorContains(t, err, "does not verify")
	other, err := NewKeyRing("bandplane/test", []ed25519.PublicKey{newKey(t).Public().(ed25519.PublicKey)}, nil)
	require.NoError(t, err)
	_, err = other.OpenCoverage(msg)
	assert.Error(t, err)
	cp, err := s.Sign("alpha", 1, make([]byte, 32))
	require.NoError(t, err)
	_, err = ring.OpenCoverage(cp.Note)
	assert.ErrorContains(t, err, "not a coverage note", "a checkpoint is not a coverage note")
	_, err = s.SignCoverage("a topic", "g", nil, at)
	assert.Error(t, err)
}
