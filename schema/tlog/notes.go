package tlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/bandplane/bandplane/schema"
)

// Notes: ingest tells the sealer which rows it stored by producing their leaves (the
// leaf of each copy it wrote) to the stored-events topic, once the batch is in
// ClickHouse and before it commits the batch's offsets. The sealer appends what the
// notes say, never what it finds in ClickHouse: a row written into ClickHouse by anyone
// but ingest has no note and stays outside the log, where verify finds it.
//
// The encoding of a message of the stored-events topic: the notes of one organization
// (the message key is the organization, so that one sealer sees them in order).
//
//	"bpn1" | varint count | count × note
//	note: uvarint len | id | int64 time ms | 32-byte digest |
//	      int64 ingested_at s | int32 partition | int64 offset
const notesMagic = "bpn1"

// noteFixed is the size of a note without its id.
const noteFixed = 8 + 32 + 8 + 4 + 8

// MaxNotesBytes bounds one message: the topic takes 1 MiB (less its framing).
const MaxNotesBytes = 900 << 10

// EncodeNotes encodes notes of one organization into messages of at most
// MaxNotesBytes each.
func EncodeNotes(notes []Leaf) [][]byte {
	var out [][]byte
	for len(notes) > 0 {
		n := 0
		size := len(notesMagic) + binary.MaxVarintLen64
		for n < len(notes) && size+noteFixed+binary.MaxVarintLen64+len(notes[n].ID) <= MaxNotesBytes {
			size += noteFixed + binary.MaxVarintLen64 + len(notes[n].ID)
			n++
		}
		n = max(n, 1)
		b := make([]byte, 0, size)
		b = append(b, notesMagic...)
		b = binary.AppendUvarint(b, uint64(n))
		for i := range notes[:n] {
			b = appendNote(b, &notes[i])
		}
		out = append(out, b)
		notes = notes[n:]
	}
	return out
}

func appendNote(b []byte, n *Leaf) []byte {
	b = binary.AppendUvarint(b, uint64(len(n.ID)))
	b = append(b, n.ID...)
	b = binary.BigEndian.AppendUint64(b, uint64(n.Time.UnixMilli()))
	b = append(b, n.Digest[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(n.IngestedAt.Unix()))
	b = binary.BigEndian.AppendUint32(b, uint32(n.Partition))
	return binary.BigEndian.AppendUint64(b, uint64(n.Offset))
}

// DecodeNotes reads a message of the stored-events topic for org. It refuses anything
// EncodeNotes would not write, naming the note and what is wrong with it.
func DecodeNotes(org string, b []byte) ([]Leaf, error) {
	if len(b) < len(notesMagic) || string(b[:len(notesMagic)]) != notesMagic {
		return nil, errors.New("not a notes message (no bpn1 magic)")
	}
	b = b[len(notesMagic):]
	count, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errors.New("notes message: bad count")
	}
	b = b[k:]
	if count > uint64(len(b)/noteFixed) {
		return nil, fmt.Errorf("notes message: %d notes cannot fit in %d bytes", count, len(b))
	}
	out := make([]Leaf, 0, count)
	for i := uint64(0); i < count; i++ {
		var n Leaf
		idLen, k := binary.Uvarint(b)
		if k <= 0 || idLen == 0 || idLen > schema.MaxIDBytes || uint64(len(b)-k) < idLen+noteFixed {
			return nil, fmt.Errorf("note %d: bad id length", i)
		}
		b = b[k:]
		n.ID = string(b[:idLen])
		if !utf8.ValidString(n.ID) {
			return nil, fmt.Errorf("note %d: id is not UTF-8", i)
		}
		b = b[idLen:]
		ms := int64(binary.BigEndian.Uint64(b))
		if ms < schema.MinTime.UnixMilli() || ms > schema.MaxTime.UnixMilli() {
			return nil, fmt.Errorf("note %d (event %q): time %d ms is outside the times the trail holds", i, n.ID, ms)
		}
		n.Time = time.UnixMilli(ms).UTC()
		copy(n.Digest[:], b[8:40])
		n.IngestedAt = time.Unix(int64(binary.BigEndian.Uint64(b[40:48])), 0).UTC()
		n.Partition = int32(binary.BigEndian.Uint32(b[48:52]))
		n.Offset = int64(binary.BigEndian.Uint64(b[52:60]))
		b = b[60:]
		n.Org = org
		out = append(out, n)
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("notes message: %d bytes after the last note", len(b))
	}
	return out, nil
}
