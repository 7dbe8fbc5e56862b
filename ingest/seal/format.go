package seal

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/ingest/store"
)

// Seal is one link of an organization's chain: a signed statement that the entries
// stored under it (seal_entries with its org, seq and hash) are the events it covers,
// with the digest each event's content had when it was sealed.
type Seal struct {
	OrgID     string
	Seq       uint64    // 1, 2, … per organization: the previous seal's Seq plus one
	SealedAt  time.Time // the database's clock when the sealer took it (seconds)
	Through   time.Time // ingest watermark: every row ingested before it was sealed by now (seconds)
	Events    uint64    // number of entries
	FirstTime time.Time // earliest and latest event time among the entries (seconds)
	LastTime  time.Time
	Root      string // hex SHA-256 over the entries, see Root
	Prev      string // Hash of the previous seal; "" for Seq 1
	Hash      string // hex SHA-256 of Content
	KeyID     string // KeyID of the signing key
	Signature string // hex Ed25519 signature of Content
}

// ID names the seal in problems and logs: seal:<org>:<seq>.
func (s *Seal) ID() string { return SealID(s.OrgID, s.Seq) }

// SealID is the id a problem gives a seal (or a missing one) of org at seq.
func SealID(org string, seq uint64) string { return fmt.Sprintf("seal:%s:%d", org, seq) }

// Content is what the seal signs and hashes: every field but Hash and Signature, in a
// fixed order, strings length-prefixed, times as Unix seconds, under a version label.
// The encoding is part of the seal format (README, "Tamper-evident audit trail").
func (s *Seal) Content() []byte {
	b := make([]byte, 0, 256)
	b = appendString(b, "bandplane.seal.v1")
	b = appendString(b, s.OrgID)
	b = binary.BigEndian.AppendUint64(b, s.Seq)
	b = binary.BigEndian.AppendUint64(b, uint64(s.SealedAt.Unix()))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Through.Unix()))
	b = binary.BigEndian.AppendUint64(b, s.Events)
	b = binary.BigEndian.AppendUint64(b, uint64(s.FirstTime.Unix()))
	b = binary.BigEndian.AppendUint64(b, uint64(s.LastTime.Unix()))
	b = appendString(b, s.Root)
	b = appendString(b, s.Prev)
	b = appendString(b, s.KeyID)
	return b
}

// ContentHash is the hex SHA-256 of Content.
func (s *Seal) ContentHash() string {
	h := sha256.Sum256(s.Content())
	return hex.EncodeToString(h[:])
}

// sign fills KeyID, Hash and Signature. Ed25519 signatures are deterministic, so two
// sealers that build the same seal write the same row (and it collapses).
func (s *Seal) sign(key ed25519.PrivateKey) {
	s.KeyID = KeyID(key.Public().(ed25519.PublicKey))
	c := s.Content()
	h := sha256.Sum256(c)
	s.Hash = hex.EncodeToString(h[:])
	s.Signature = hex.EncodeToString(ed25519.Sign(key, c))
}

// checkSignature says what is wrong with the seal's hash and signature under pub, or "".
func (s *Seal) checkSignature(pub ed25519.PublicKey, pubID string) string {
	if got := s.ContentHash(); got != s.Hash {
		return fmt.Sprintf("the seal's fields do not match its hash %s (content hashes to %s)", short(s.Hash), short(got))
	}
	sig, err := hex.DecodeString(s.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "the signature is not a hex Ed25519 signature"
	}
	if !ed25519.Verify(pub, s.Content(), sig) {
		if s.KeyID != pubID {
			return fmt.Sprintf("signed with key %s, not with the given key %s", s.KeyID, pubID)
		}
		return fmt.Sprintf("the signature does not verify with key %s", pubID)
	}
	return ""
}

// Entry is one sealed event: its row key (org, time, id) and the digest of its content.
type Entry struct {
	Time   time.Time // millisecond precision, UTC
	ID     string
	Digest store.Digest
}

// Root commits to a seal's entries: the SHA-256 of a version label followed by each
// entry (length-prefixed id, time in Unix milliseconds, 32-byte digest) in the order of
// (id, time). A flat hash over the sorted list rather than a Merkle tree: verify
// always re-reads a seal's entries whole, and the list is rebuilt from seal_entries in
// that order. Root sorts entries in place.
func Root(entries []Entry) string {
	slices.SortFunc(entries, compareEntries)
	h := sha256.New()
	store.WriteField(h, "bandplane.seal-entries.v1")
	var n [8]byte
	for i := range entries {
		e := &entries[i]
		store.WriteField(h, e.ID)
		binary.BigEndian.PutUint64(n[:], uint64(e.Time.UnixMilli()))
		h.Write(n[:])
		h.Write(e.Digest[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func compareEntries(a, b Entry) int {
	if c := strings.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	return a.Time.Compare(b.Time)
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
