package seal

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest/store"
)

func testSeal(t *testing.T) *Seal {
	t.Helper()
	at := time.Date(2026, 2, 9, 10, 0, 0, 0, time.UTC)
	return &Seal{OrgID: "org-a", Seq: 7, SealedAt: at, Through: at.Add(-10 * time.Second), Events: 3,
		FirstTime: at.Add(-time.Hour), LastTime: at.Add(-time.Minute), Root: "ab", Prev: "cd"}
}

func TestSealSignature(t *testing.T) {
	key := testKey(t)
	s := testSeal(t)
	s.sign(key)
	assert.Equal(t, KeyID(pubOf(key)), s.KeyID)
	assert.Equal(t, s.ContentHash(), s.Hash)
	assert.Empty(t, s.checkSignature(pubOf(key), KeyID(pubOf(key))))

	// Deterministic: the same seal signed twice is the same row.
	again := testSeal(t)
	again.sign(key)
	assert.Equal(t, s, again)

	// Every signed field changes the hash.
	for name, edit := range map[string]func(*Seal){
		"org":        func(x *Seal) { x.OrgID = "org-b" },
		"seq":        func(x *Seal) { x.Seq++ },
		"sealed_at":  func(x *Seal) { x.SealedAt = x.SealedAt.Add(time.Second) },
		"through":    func(x *Seal) { x.Through = x.Through.Add(time.Second) },
		"events":     func(x *Seal) { x.Events++ },
		"first_time": func(x *Seal) { x.FirstTime = x.FirstTime.Add(time.Second) },
		"last_time":  func(x *Seal) { x.LastTime = x.LastTime.Add(time.Second) },
		"root":       func(x *Seal) { x.Root = "ac" },
		"prev":       func(x *Seal) { x.Prev = "" },
		"key_id":     func(x *Seal) { x.KeyID = "other" },
		// Length prefixes: moving a byte from one field to the next is a change too.
		"boundary": func(x *Seal) { x.Root, x.Prev = "abc", "d" },
	} {
		x := *s
		edit(&x)
		assert.NotEqual(t, s.Hash, x.ContentHash(), name)
		assert.Contains(t, x.checkSignature(pubOf(key), KeyID(pubOf(key))), "do not match its hash", name)
	}

	// A forged seal: right hash, no valid signature.
	forged := *s
	forged.Events = 99
	forged.Hash = forged.ContentHash()
	assert.Contains(t, forged.checkSignature(pubOf(key), KeyID(pubOf(key))), "does not verify with key "+KeyID(pubOf(key)))
	forged.Signature = "zz"
	assert.Contains(t, forged.checkSignature(pubOf(key), KeyID(pubOf(key))), "not a hex Ed25519 signature")

	other := pubOf(testKey(t))
	assert.Equal(t, "signed with key "+s.KeyID+", not with the given key "+KeyID(other), s.checkSignature(other, KeyID(other)))
}

func TestRoot(t *testing.T) {
	at := time.Date(2026, 2, 9, 10, 0, 0, 0, time.UTC)
	d := func(s string) store.Digest { return sha256.Sum256([]byte(s)) }
	es := []Entry{{at, "b", d("1")}, {at, "a", d("2")}, {at.Add(time.Millisecond), "a", d("3")}}
	r := Root(es)
	assert.Equal(t, "a", es[0].ID, "sorted in place by (id, time)")
	assert.Equal(t, at.Add(time.Millisecond), es[1].Time)

	shuffled := []Entry{es[2], es[0], es[1]}
	assert.Equal(t, r, Root(shuffled), "order of the input does not matter")
	for name, edit := range map[string]func([]Entry) []Entry{
		"digest": func(x []Entry) []Entry { x[0].Digest[0] ^= 1; return x },
		"time":   func(x []Entry) []Entry { x[0].Time = x[0].Time.Add(time.Millisecond); return x },
		"id":     func(x []Entry) []Entry { x[0].ID = "c"; return x },
		"less":   func(x []Entry) []Entry { return x[1:] },
		"more":   func(x []Entry) []Entry { return append(x, Entry{at, "z", d("4")}) },
	} {
		x := edit(append([]Entry(nil), es...))
		assert.NotEqual(t, r, Root(x), name)
	}
	assert.NotEqual(t, Root(nil), r)
	require.Len(t, Root(nil), 64)
}
