// Package tlog is the organization's transparency log over the audit trail: what a
// leaf commits to, the RFC 6962 tree over the leaves (github.com/transparency-dev/
// merkle: compact ranges to append, inclusion and consistency proofs), the C2SP
// tlog-checkpoint signed notes the audit key signs (golang.org/x/mod/sumdb/note,
// github.com/transparency-dev/formats), the key ring that carries trust across a key
// rotation, and a witness's checks. It holds no database code: query/trail stores the
// log in ClickHouse and reads it back through NodeReader.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package tlog

import (
	"crypto/sha256"
	"encoding/binary"
	"time"

	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/bandplane/bandplane/schema/store"
)

// Leaf is one stored copy of an event row as ingest wrote it: its key (organization,
// time, id), the digest of its content (store.EventRow.SealDigest, which covers every
// column a reader sees but ingest's bookkeeping), and that bookkeeping: when the copy
// was written (ingested_at) and the Kafka record it came from. The leaf commits to all
// of it, so no column of a sealed row can change unseen.
type Leaf struct {
	Org        string
	ID         string
	Time       time.Time // millisecond precision, UTC
	Digest     store.Digest
	IngestedAt time.Time // whole seconds, UTC
	Partition  int32
	Offset     int64
}

// LeafOf is the leaf of a stored row.
func LeafOf(r *store.EventRow) Leaf {
	return Leaf{Org: r.OrgID, ID: r.ID, Time: r.Time.UTC().Truncate(time.Millisecond), Digest: r.SealDigest(),
		IngestedAt: r.IngestedAt.UTC().Truncate(time.Second), Partition: r.Partition, Offset: r.Offset}
}

// Inner is the SHA-256 of everything a leaf commits to but its time: a version label,
// then the organization and id (length-prefixed), the content digest, ingested_at
// (Unix seconds), the Kafka partition and offset, big-endian. The leaf's data is its
// time and Inner (LeafData), so that a scan of the log's index, which stores both,
// proves every leaf's time without reading the rest.
func (l *Leaf) Inner() [sha256.Size]byte {
	const label = "bandplane.leaf.v1"
	var buf [4 + len(label) + 2*(4+256) + 32 + 20]byte // no allocation for ids within the limit
	b := appendField(buf[:0], label)
	b = appendField(b, l.Org)
	b = appendField(b, l.ID)
	b = append(b, l.Digest[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(l.IngestedAt.Unix()))
	b = binary.BigEndian.AppendUint32(b, uint32(l.Partition))
	b = binary.BigEndian.AppendUint64(b, uint64(l.Offset))
	return sha256.Sum256(b)
}

// appendField appends s length-prefixed (4 bytes, big-endian), as store.WriteField
// writes it.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// Hash is the leaf's RFC 6962 hash: SHA-256(0x00 || LeafData).
func (l *Leaf) Hash() []byte { return LeafHash(l.Time.UnixMilli(), l.Inner()) }

// leafDataSize is the size of LeafData: a one-byte version, the time and Inner.
const leafDataSize = 1 + 8 + sha256.Size

// LeafData is the leaf as the tree hashes it: version 1, the event time in Unix
// milliseconds (big-endian), Inner. Part of the trail's format: changing it makes
// every checkpoint fail.
func LeafData(timeMs int64, inner [sha256.Size]byte) []byte {
	b := make([]byte, leafDataSize)
	b[0] = 1
	binary.BigEndian.PutUint64(b[1:9], uint64(timeMs))
	copy(b[9:], inner[:])
	return b
}

// LeafHash is the RFC 6962 leaf hash of a leaf's time and Inner.
func LeafHash(timeMs int64, inner [sha256.Size]byte) []byte {
	return rfc6962.DefaultHasher.HashLeaf(LeafData(timeMs, inner))
}

// HashChildren is the RFC 6962 hash of an interior node.
func HashChildren(left, right []byte) []byte { return rfc6962.DefaultHasher.HashChildren(left, right) }
