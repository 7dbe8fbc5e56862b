package querybench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// The subscribers' process reports to the benchmark on its stdout in records of
// recordSize bytes, little-endian: the kind (1 byte), the subscriber's index (3
// bytes), a value (4 bytes) and a time (8 bytes, Unix ns). At 10,000 subscribers one
// change is 10,000 records: fixed-size binary ones cost either side a few nanoseconds
// each, and the time is taken when the message is read, so buffering them delays no
// figure.
const recordSize = 16

// maxSubscribers is what the 3-byte index holds.
const maxSubscribers = 1 << 24

type recordKind uint8

const (
	// recMessage: subscriber sub read change val at at.
	recMessage recordKind = iota + 1
	// recEnded: subscriber sub's subscription ended (val: endSlow or endBroken) at at,
	// before the benchmark closed it.
	recEnded
	// recReady: every subscriber (sub of them) has subscribed; at is how long dialling
	// and subscribing took, in ns.
	recReady
)

// The end codes of recEnded.
const (
	endSlow   = 1 // SLOW_SUBSCRIBER: the hub dropped it for falling behind
	endBroken = 2 // any other error, or a broken connection
)

type record struct {
	kind recordKind
	sub  int
	val  uint32
	at   int64
}

func (r record) put(b *[recordSize]byte) {
	binary.LittleEndian.PutUint32(b[0:4], uint32(r.sub)<<8|uint32(r.kind))
	binary.LittleEndian.PutUint32(b[4:8], r.val)
	binary.LittleEndian.PutUint64(b[8:16], uint64(r.at))
}

func decodeRecord(b *[recordSize]byte) (record, error) {
	head := binary.LittleEndian.Uint32(b[0:4])
	r := record{kind: recordKind(head & 0xff), sub: int(head >> 8), val: binary.LittleEndian.Uint32(b[4:8]),
		at: int64(binary.LittleEndian.Uint64(b[8:16]))}
	switch r.kind {
	case recMessage, recEnded, recReady:
		return r, nil
	}
	return r, fmt.Errorf("record of unknown kind %d", r.kind)
}

// readRecords hands each record of r to t, and the ready one to ready, until r ends.
func readRecords(r io.Reader, t *tally, ready func(subscribers int, took time.Duration)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var b [recordSize]byte
	for {
		if _, err := io.ReadFull(br, b[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("cannot read the subscribers' records: %w", err)
		}
		rec, err := decodeRecord(&b)
		if err != nil {
			return err
		}
		if rec.kind == recReady {
			ready(rec.sub, time.Duration(rec.at))
			continue
		}
		if err := t.add(rec); err != nil {
			return err
		}
	}
}

// tally is the benchmark's account of what its subscribers read, kept by the one
// goroutine reading their records; settled may be read meanwhile, the rest once it is
// done.
type tally struct {
	// produced[seq] is when change seq was handed to the producer, reached[seq] when
	// the live reader handed it to the hub (Unix ns, 0 while unknown).
	produced, reached []atomic.Int64
	want              int // the changes each subscriber is to read
	subscribers       int

	words    int      // of got per subscriber
	got      []uint64 // bit seq of subscriber i's words: it read change seq
	received []int32  // distinct changes read, by subscriber
	code     []uint8  // how its subscription ended (endSlow, endBroken), 0 while open

	total, fan []float64 // produce → read and hub → read of every first read, ms

	// settled counts the subscribers that read every change or ended.
	settled atomic.Int64
	// closing is when the benchmark began to end the subscriptions (Unix ns, 0 before):
	// ends after it are its own doing. An end before it counts even when its record
	// comes later.
	closing atomic.Int64
}

func newTally(subscribers, want int, produced, reached []atomic.Int64) *tally {
	words := (len(produced) + 63) / 64
	return &tally{produced: produced, reached: reached, want: want, subscribers: subscribers, words: words,
		got: make([]uint64, subscribers*words), received: make([]int32, subscribers), code: make([]uint8, subscribers)}
}

func (t *tally) add(r record) error {
	if r.sub < 0 || r.sub >= t.subscribers {
		return fmt.Errorf("record of subscriber %d of %d", r.sub, t.subscribers)
	}
	switch r.kind {
	case recMessage:
		seq := int(r.val)
		if seq >= t.want {
			return nil // not a change of this run
		}
		w, bit := &t.got[r.sub*t.words+seq/64], uint64(1)<<(seq%64)
		if *w&bit != 0 {
			return nil // Kafka delivers at least once; the first read counts
		}
		*w |= bit
		t.received[r.sub]++
		if int(t.received[r.sub]) == t.want && t.code[r.sub] == 0 {
			t.settled.Add(1)
		}
		t.total = append(t.total, ms(time.Duration(r.at-t.produced[seq].Load())))
		if at := t.reached[seq].Load(); at != 0 {
			t.fan = append(t.fan, ms(time.Duration(r.at-at)))
		}
	case recEnded:
		if c := t.closing.Load(); c != 0 && r.at >= c || t.code[r.sub] != 0 {
			return nil
		}
		t.code[r.sub] = uint8(r.val)
		if r.val != endSlow {
			t.code[r.sub] = endBroken
		}
		if int(t.received[r.sub]) < t.want {
			t.settled.Add(1)
		}
	default:
		return fmt.Errorf("unexpected record of kind %d", r.kind)
	}
	return nil
}

// stats fills in st's subscriber figures once every record is in, produced being the
// changes actually produced.
func (t *tally) stats(st *LiveStats, produced int) {
	st.Total, st.FanOut = distOf(t.total), distOf(t.fan)
	for i := range t.subscribers {
		switch t.code[i] {
		case endSlow:
			st.Slow++
		case endBroken:
			st.Broken++
		}
		missed := false
		words := t.got[i*t.words : (i+1)*t.words]
		for seq := range produced {
			if words[seq/64]&(1<<(seq%64)) == 0 {
				missed = true
				break
			}
		}
		if missed {
			st.Missing++
		}
		if t.code[i] != 0 || missed {
			st.Dropped++
		}
	}
}
