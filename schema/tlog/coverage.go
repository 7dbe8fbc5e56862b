package tlog

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
)

// # Coverage
//
// A coverage note says how far into the events topic the logs reach: every record of
// each partition below its offset is, when ClickHouse stores it, a leaf of its
// organization's log (or was dead-lettered). The sealer reads the ingest group's
// committed offsets before a run (ingest commits a batch only once its notes are
// acknowledged) and, when the run sealed every note produced before that, signs them.
// A reader that rebuilds state from the trail (the policy replica) takes the records
// below the coverage from ClickHouse, each checked against the log, and the records
// from the coverage on from the topic itself: nothing it applies is a row only
// ClickHouse vouches for. The note's text:
//
//	<prefix> coverage
//	time <Unix seconds>
//	topic <events topic> <ingest group>
//	<partition> <offset>      (one line per partition, ascending)

// Coverage is a coverage note whose signature a KeyRing checked.
type Coverage struct {
	Topic, Group string
	Offsets      map[int]int64
	SignedAt     time.Time
	KeyID        string
}

// MaxCoveragePartitions bounds the partitions a coverage note lists.
const MaxCoveragePartitions = 10_000

// SignCoverage signs the coverage of topic as read by the ingest group.
func (s *Signer) SignCoverage(topic, group string, offsets map[int]int64, at time.Time) ([]byte, error) {
	if topic == "" || group == "" || strings.ContainsAny(topic+group, " \n") {
		return nil, fmt.Errorf("coverage: topic %q and group %q must be non-empty and hold no space", topic, group)
	}
	var b strings.Builder
	b.WriteString(s.prefix + " coverage\ntime " + strconv.FormatInt(at.Unix(), 10) + "\ntopic " + topic + " " + group + "\n")
	for _, p := range slices.Sorted(maps.Keys(offsets)) {
		b.WriteString(strconv.Itoa(p) + " " + strconv.FormatInt(offsets[p], 10) + "\n")
	}
	return note.Sign(&note.Note{Text: b.String()}, s.log)
}

// OpenCoverage checks a coverage note: signed by a key of the ring valid at its time,
// of this deployment, well formed.
func (r *KeyRing) OpenCoverage(msg []byte) (Coverage, error) {
	if len(msg) > MaxNoteBytes*16 {
		return Coverage{}, fmt.Errorf("the coverage note is %d bytes, more than %d", len(msg), MaxNoteBytes*16)
	}
	var vs []note.Verifier
	for _, k := range r.keys {
		vs = append(vs, k.log)
	}
	n, err := note.Open(msg, note.VerifierList(vs...))
	if err != nil {
		return Coverage{}, fmt.Errorf("the coverage note does not verify: %w", err)
	}
	lines := strings.Split(strings.TrimSuffix(n.Text, "\n"), "\n")
	if len(lines) < 3 || lines[0] != r.prefix+" coverage" {
		return Coverage{}, fmt.Errorf("not a coverage note of %s", r.prefix)
	}
	secs, ok := strings.CutPrefix(lines[1], "time ")
	sec, err := strconv.ParseInt(secs, 10, 64)
	if !ok || err != nil || sec < 0 {
		return Coverage{}, errors.New("coverage note: line 2 is not \"time <Unix seconds>\"")
	}
	tg, ok := strings.CutPrefix(lines[2], "topic ")
	topic, group, ok2 := strings.Cut(tg, " ")
	if !ok || !ok2 || topic == "" || group == "" {
		return Coverage{}, errors.New("coverage note: line 3 is not \"topic <topic> <group>\"")
	}
	c := Coverage{Topic: topic, Group: group, Offsets: map[int]int64{}, SignedAt: time.Unix(sec, 0).UTC()}
	if len(lines)-3 > MaxCoveragePartitions {
		return Coverage{}, fmt.Errorf("coverage note: %d partitions, more than %d", len(lines)-3, MaxCoveragePartitions)
	}
	for i, l := range lines[3:] {
		ps, os, ok := strings.Cut(l, " ")
		p, err1 := strconv.Atoi(ps)
		o, err2 := strconv.ParseInt(os, 10, 64)
		if !ok || err1 != nil || err2 != nil || p < 0 || o < 0 {
			return Coverage{}, fmt.Errorf("coverage note: line %d is not \"<partition> <offset>\"", i+4)
		}
		if _, dup := c.Offsets[p]; dup {
			return Coverage{}, fmt.Errorf("coverage note: partition %d twice", p)
		}
		c.Offsets[p] = o
	}
	for _, k := range r.keys {
		for _, s := range n.Sigs {
			if s.Name == k.log.Name() && s.Hash == k.log.KeyHash() {
				if !k.valid(c.SignedAt) {
					return Coverage{}, fmt.Errorf("key %s signed the coverage note at %s, outside the key's validity (%s)", k.id, c.SignedAt.Format(time.RFC3339), r.validity(k))
				}
				c.KeyID = k.id
			}
		}
	}
	return c, nil
}
