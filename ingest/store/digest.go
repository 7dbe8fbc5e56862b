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
	writeField(h, label)
	writeField(h, r.ID)
	writeField(h, r.Type)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(r.Time.UnixMilli()))
	h.Write(n[:])
	writeField(h, r.OrgID)
	writeField(h, r.RoomID)
	writeField(h, r.ActorID)
	writeField(h, StoredActorType(r.ActorType))
	writeField(h, r.ActorHandle)
	if withOwner {
		writeField(h, r.OwnerID)
	}
	writeField(h, r.SubjectID)
	writeField(h, r.SubjectType)
	writeField(h, r.SubjectHandle)
	writeField(h, r.ExecutionID)
	writeField(h, r.Source)
	binary.BigEndian.PutUint16(n[:2], r.SchemaVersion)
	h.Write(n[:2])
	writeField(h, r.Data)
	var d Digest
	h.Sum(d[:0])
	return d
}

func writeField(h hash.Hash, s string) {
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
