package store

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
)

// Digest is the SHA-256 of an audit-trail row's canonical content, the unit the seals
// (query/trail) commit to and ingest compares when an event id comes back.
type Digest [sha256.Size]byte

// ContentDigest covers what the event said: every stored column except those ingest
// fills in itself (owner_id from the directory, ingested_at, the Kafka coordinates).
// The same event read again from Kafka, or posted again, has the same ContentDigest;
// an event that reuses an id with other content does not.
func (r *EventRow) ContentDigest() Digest { return r.digest(false) }

// SealDigest is ContentDigest plus the attribution ingest stored (owner_id): what a
// seal commits to, so that an edit of any column a reader sees is detected. Ingest
// never rewrites a stored row (a replayed event is skipped), so it does not change.
func (r *EventRow) SealDigest() Digest { return r.digest(true) }

// digest hashes the columns in a fixed order, each length-prefixed, under a version
// label: the encoding is part of the trail's format
// (query/trail/README.md). The encoding is built in one pooled buffer and hashed at once: ingest and
// verify digest every row.
func (r *EventRow) digest(withOwner bool) Digest {
	bp := digestBufs.Get().(*[]byte)
	b := (*bp)[:0]
	label := "bandplane.event.v1"
	if withOwner {
		label = "bandplane.sealed-event.v1"
	}
	b = appendField(b, label)
	b = appendField(b, r.ID)
	b = appendField(b, r.Type)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Time.UnixMilli()))
	b = appendField(b, r.OrgID)
	b = appendField(b, r.RoomID)
	b = appendField(b, r.ActorID)
	b = appendField(b, StoredActorType(r.ActorType))
	b = appendField(b, r.ActorHandle)
	if withOwner {
		b = appendField(b, r.OwnerID)
	}
	b = appendField(b, r.SubjectID)
	b = appendField(b, r.SubjectType)
	b = appendField(b, r.SubjectHandle)
	b = appendField(b, r.ExecutionID)
	b = appendField(b, r.Source)
	b = binary.BigEndian.AppendUint16(b, r.SchemaVersion)
	b = appendField(b, r.Data)
	d := Digest(sha256.Sum256(b))
	if cap(b) <= maxPooledDigestBuf {
		*bp = b
		digestBufs.Put(bp)
	}
	return d
}

// maxPooledDigestBuf keeps a row of unusual size from pinning its buffer in the pool.
const maxPooledDigestBuf = 64 << 10

var digestBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// appendField appends s length-prefixed, as WriteField writes it.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// WriteField writes s to h length-prefixed (4 bytes, big-endian): the encoding of every
// string the digests and the seals hash, so that no two field lists hash alike.
func WriteField(h hash.Hash, s string) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}

// StoredActorType is the actor type as the events table holds it: an event without
// one is stored as "system" (the column is an Enum8).
func StoredActorType(t string) string {
	if t == "" {
		return "system"
	}
	return t
}
