package trail

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema/tlog"
)

// RotationOutcome is what RecordRotation did.
type RotationOutcome struct {
	Record tlog.RotationRecord
	// Note is the record in effect: the one given, or the one recorded before for the
	// same two keys (Reused), which is what is to be published.
	Note   []byte
	Reused bool
}

// RecordRotation records a key rotation (tlog.Rotation) in ClickHouse, checked against
// the records ClickHouse and the checkpoints topic hold (published: the topic's newest
// note per key, nil when it cannot be read) and against the newest checkpoints:
//
//   - A record that rotates the same old key to the same new key is there already: it is
//     reused (written to ClickHouse again if only the topic has it), whatever time the
//     new one names, so that running a rotation again after a failed step publishes the
//     same record. Two records rotating one key are a conflict every reader refuses.
//   - The old key rotated to another key, a new key that a record already introduced or
//     retired, or an old key not valid at the record's time, is refused.
//   - A time not after the newest checkpoint of any organization (ClickHouse's that
//     verify, and the topic's) is refused: the old key's checkpoints signed since would
//     stop verifying.
func (l *Log) RecordRotation(ctx context.Context, note []byte, published map[string][]byte) (RotationOutcome, error) {
	rec, err := tlog.OpenRotation(l.prefix, note)
	if err != nil {
		return RotationOutcome{}, err
	}
	stored, err := l.Rotations(ctx)
	if err != nil {
		return RotationOutcome{}, err
	}
	inDB := map[string]bool{}
	for _, n := range stored {
		inDB[string(n)] = true
	}
	var fromTopic [][]byte
	for key, n := range published {
		if strings.HasPrefix(key, RotationKeyPrefix) {
			fromTopic = append(fromTopic, n)
		}
	}
	slices.SortFunc(fromTopic, bytes.Compare)
	oldID, newID := tlog.KeyID(rec.Old), tlog.KeyID(rec.New)
	type known struct {
		rec  tlog.RotationRecord
		note []byte
	}
	var sameOld []known
	seen := map[string]bool{}
	for _, n := range append(stored, fromTopic...) {
		if seen[string(n)] {
			continue
		}
		seen[string(n)] = true
		e, err := tlog.OpenRotation(l.prefix, n)
		if err != nil {
			continue // a record that does not verify rotates nothing
		}
		at := e.From.Format(time.RFC3339)
		switch {
		case e.Old.Equal(rec.Old):
			if !slices.ContainsFunc(sameOld, func(k known) bool { return k.rec.New.Equal(e.New) && k.rec.From.Equal(e.From) }) {
				sameOld = append(sameOld, known{e, n})
			}
		case e.Old.Equal(rec.New):
			return RotationOutcome{}, fmt.Errorf("the new key %s is retired already: a record rotates it to key %s from %s; make a new key (bandplane audit keygen)",
				newID, tlog.KeyID(e.New), at)
		case e.New.Equal(rec.New):
			return RotationOutcome{}, fmt.Errorf("the new key %s took over from key %s at %s already: make a new key (bandplane audit keygen)",
				newID, tlog.KeyID(e.Old), at)
		}
	}
	switch {
	case len(sameOld) > 1:
		var to []string
		for _, k := range sameOld {
			to = append(to, fmt.Sprintf("to key %s from %s", tlog.KeyID(k.rec.New), k.rec.From.Format(time.RFC3339)))
		}
		slices.Sort(to)
		return RotationOutcome{}, fmt.Errorf("key %s is rotated %d times already (%s), so no reader trusts any of them: keep one (bandplane audit verify lists them) before rotating it",
			oldID, len(sameOld), strings.Join(to, ", "))
	case len(sameOld) == 1 && !sameOld[0].rec.New.Equal(rec.New):
		k := sameOld[0]
		return RotationOutcome{}, fmt.Errorf("key %s is rotated to key %s from %s already, not to key %s: a key is rotated once (a second record makes every reader trust neither); rotate key %s next",
			oldID, tlog.KeyID(k.rec.New), k.rec.From.Format(time.RFC3339), newID, tlog.KeyID(k.rec.New))
	case len(sameOld) == 1:
		k := sameOld[0]
		if !inDB[string(k.note)] {
			if err := l.db.writeRotation(ctx, time.Now(), k.note); err != nil {
				return RotationOutcome{}, err
			}
		}
		return RotationOutcome{Record: k.rec, Note: k.note, Reused: true}, nil
	}
	ring, err := tlog.NewKeyRing(l.prefix, l.anchors, append(stored, fromTopic...))
	if err != nil {
		return RotationOutcome{}, err
	}
	if _, why := ring.Trusted(oldID, rec.From); why != "" {
		return RotationOutcome{}, fmt.Errorf("the old key cannot hand over at %s: %s", rec.From.Format(time.RFC3339), why)
	}
	if newest, where, err := l.newestSigned(ctx, ring, published); err != nil {
		return RotationOutcome{}, err
	} else if where != "" && !rec.From.After(newest.SignedAt) {
		return RotationOutcome{}, fmt.Errorf("the new key would take over at %s, not after %s, signed at %s by key %s: the old key's checkpoints since would stop verifying; take over later (the default is a few minutes from now)",
			rec.From.Format(time.RFC3339), where, newest.SignedAt.Format(time.RFC3339), newest.KeyID)
	}
	if err := l.db.writeRotation(ctx, time.Now(), note); err != nil {
		return RotationOutcome{}, err
	}
	return RotationOutcome{Record: rec, Note: note}, nil
}

// newestSigned is the checkpoint signed last of every organization's newest: ClickHouse's
// that verify, and the topic's (published); where names it, "" when there is none.
func (l *Log) newestSigned(ctx context.Context, ring *tlog.KeyRing, published map[string][]byte) (tlog.Checkpoint, string, error) {
	heads, err := l.Heads(ctx, ring)
	if err != nil {
		return tlog.Checkpoint{}, "", err
	}
	var newest tlog.Checkpoint
	where := ""
	for _, h := range heads {
		if h.Err == nil && (where == "" || h.Checkpoint.SignedAt.After(newest.SignedAt)) {
			newest, where = h.Checkpoint, fmt.Sprintf("organization %q's newest checkpoint in ClickHouse (size %d)", h.Org, h.Checkpoint.Size)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(published)) {
		if key == CoverageKey || strings.HasPrefix(key, RotationKeyPrefix) {
			continue
		}
		c, err := ring.Open(published[key])
		if err == nil && (where == "" || c.SignedAt.After(newest.SignedAt)) {
			newest, where = c, fmt.Sprintf("organization %q's newest checkpoint on the checkpoints topic (size %d)", c.Org, c.Size)
		}
	}
	return newest, where, nil
}
