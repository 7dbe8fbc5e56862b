package store

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

// Digest is the SHA-256 of an audit-trail row's canonical content, the unit the seals
// (ingest/seal) commit to and ingest compares when an event id comes back.
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
// label: the encoding is part of the seal format (README, "Tamper-evident audit trail").
func (r *EventRow) digest(withOwner bool) Digest {
	h := sha256.New()
	label := "bandplane.event.v1"
	if withOwner {
		label = "bandplane.sealed-event.v1"
	}
	WriteField(h, label)
	WriteField(h, r.ID)
	WriteField(h, r.Type)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(r.Time.UnixMilli()))
	h.Write(n[:])
	WriteField(h, r.OrgID)
	WriteField(h, r.RoomID)
	WriteField(h, r.ActorID)
	WriteField(h, StoredActorType(r.ActorType))
	WriteField(h, r.ActorHandle)
	if withOwner {
		WriteField(h, r.OwnerID)
	}
	WriteField(h, r.SubjectID)
	WriteField(h, r.SubjectType)
	WriteField(h, r.SubjectHandle)
	WriteField(h, r.ExecutionID)
	WriteField(h, r.Source)
	binary.BigEndian.PutUint16(n[:2], r.SchemaVersion)
	h.Write(n[:2])
	WriteField(h, r.Data)
	var d Digest
	h.Sum(d[:0])
	return d
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
