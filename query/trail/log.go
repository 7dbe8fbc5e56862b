package trail

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// ErrNotInLog is wrapped when what a reader asks of the log is not there: no verified
// checkpoint of the organization or of that size, no sealed event with that key.
var ErrNotInLog = errors.New("not in the log")

// ErrLogDamaged is wrapped when what ClickHouse holds does not prove what it should:
// a proof built from the stored tree fails against its signed checkpoint. Audit verify
// names the edit. The cause beside it stays text (%v, not %w), so that errors.Is finds
// no other kind in it: a damaged log must not read as ErrNotInLog or as a cancelled
// context.
var ErrLogDamaged = errors.New("the stored log does not match its checkpoints")

// Log answers questions about the organizations' logs of one database, checking every
// answer against checkpoints signed by the key ring before it gives it: the newest
// checkpoint, a consistency proof between two sizes, an inclusion proof of a sealed
// event. What ClickHouse holds is never passed on unchecked.
type Log struct {
	db      logDB
	prefix  string
	anchors []ed25519.PublicKey
}

// NewLog reads the logs of db, trusting the checkpoints of the ring anchored at
// anchors (and the rotations ClickHouse records); prefix "" is tlog.DefaultPrefix(db).
func NewLog(conn driver.Conn, db, prefix string, anchors []ed25519.PublicKey) (*Log, error) {
	if !identRe.MatchString(db) {
		return nil, fmt.Errorf("database %q is not a plain identifier", db)
	}
	if prefix == "" {
		prefix = tlog.DefaultPrefix(db)
	}
	if err := tlog.CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("origin prefix: %w", err)
	}
	if len(anchors) == 0 {
		return nil, errors.New("no audit key to check the log against")
	}
	return &Log{db: logDB{conn: conn, db: db}, prefix: prefix, anchors: anchors}, nil
}

// Prefix is the deployment's origin prefix.
func (l *Log) Prefix() string { return l.prefix }

// Ring is the key ring: the anchors and the rotation records ClickHouse holds.
func (l *Log) Ring(ctx context.Context) (*tlog.KeyRing, error) { return l.RingWith(ctx, nil) }

// RingWith is Ring with further rotation records (the checkpoints topic's): each counts
// only if it verifies on its own, and a conflict among all of them is a conflict.
func (l *Log) RingWith(ctx context.Context, extra [][]byte) (*tlog.KeyRing, error) {
	rot, err := l.Rotations(ctx)
	if err != nil {
		return nil, err
	}
	if len(extra) > maxRotations {
		return nil, fmt.Errorf("%w: %d rotation records besides ClickHouse's, more than %d", ErrLogDamaged, len(extra), maxRotations)
	}
	return tlog.NewKeyRing(l.prefix, l.anchors, append(rot, extra...))
}

// Rotations are the rotation records ClickHouse holds (each verifies on its own), at
// most maxRotations.
func (l *Log) Rotations(ctx context.Context) ([][]byte, error) {
	rot, err := l.db.rotations(ctx)
	if errors.Is(err, errTooManyRotations) {
		return nil, fmt.Errorf("%w: %v", ErrLogDamaged, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
	}
	return rot, err
}

// Orgs lists the organizations with a checkpoint.
func (l *Log) Orgs(ctx context.Context) ([]string, error) { return l.db.checkpointOrgs(ctx) }

// Newest is org's newest stored checkpoint that verifies (forged rows are skipped).
func (l *Log) Newest(ctx context.Context, ring *tlog.KeyRing, org string) (tlog.Checkpoint, error) {
	rows, err := l.db.topCheckpoints(ctx, org, maxForged+1)
	if err != nil {
		return tlog.Checkpoint{}, err
	}
	return pickNewest(ring, org, rows, maxForged+1)
}

// pickNewest is the first of org's rows, largest size first, that verifies as what its
// row says; rows is at most limit of them, and all limit failing is said so, since a
// genuine checkpoint may lie below them.
func pickNewest(ring *tlog.KeyRing, org string, rows []storedCheckpoint, limit int) (tlog.Checkpoint, error) {
	for _, r := range rows {
		if c, err := ring.Open(r.Note); err == nil && c.Org == org && c.Size == r.Size {
			return c, nil
		}
	}
	if len(rows) >= limit {
		return tlog.Checkpoint{}, fmt.Errorf("%w: none of organization %q's %d newest checkpoint rows verifies with the audit key (rows planted above its head: bandplane audit verify names them)",
			ErrNotInLog, org, len(rows))
	}
	return tlog.Checkpoint{}, fmt.Errorf("%w: organization %q has no checkpoint signed with the audit key", ErrNotInLog, org)
}

// OrgHead is an organization's newest stored checkpoint that verifies, or why it has
// none.
type OrgHead struct {
	Org        string
	Checkpoint tlog.Checkpoint
	Err        error // wraps ErrNotInLog
}

// Heads is Newest of every organization with a checkpoint row, by organization, in one
// query: each organization's rows of its largest sizes, at most as many as Newest reads,
// opened here.
func (l *Log) Heads(ctx context.Context, ring *tlog.KeyRing) ([]OrgHead, error) {
	rows, err := l.db.newestCheckpointRows(ctx, maxForged+1)
	if err != nil {
		return nil, err
	}
	var out []OrgHead
	for start := 0; start < len(rows); {
		end := start + 1
		for end < len(rows) && rows[end].Org == rows[start].Org {
			end++
		}
		org := rows[start].Org
		c, err := pickNewest(ring, org, rows[start:end], maxForged+1)
		out = append(out, OrgHead{Org: org, Checkpoint: c, Err: err})
		start = end
	}
	return out, nil
}

// maxForgedAtSize bounds the rows of one size AtSize reads past when they do not
// verify.
const maxForgedAtSize = 1000

// AtSize is org's stored checkpoint of exactly size that verifies.
func (l *Log) AtSize(ctx context.Context, ring *tlog.KeyRing, org string, size uint64) (tlog.Checkpoint, error) {
	rows, err := l.db.checkpointsAt(ctx, org, size, maxForgedAtSize+1)
	if err != nil {
		return tlog.Checkpoint{}, err
	}
	for _, r := range rows {
		if c, err := ring.Open(r.Note); err == nil && c.Org == org && c.Size == size {
			return c, nil
		}
	}
	if len(rows) > maxForgedAtSize {
		return tlog.Checkpoint{}, fmt.Errorf("%w: more than %d of organization %q's checkpoint rows of size %d do not verify (bandplane audit verify names them)",
			ErrLogDamaged, maxForgedAtSize, org, size)
	}
	return tlog.Checkpoint{}, fmt.Errorf("%w: organization %q has no checkpoint of size %d signed with the audit key", ErrNotInLog, org, size)
}

// Consistency is the proof that org's log at to.Size extends itself at from, checked
// against to's root and against the root the stored tree gives at from (the asker
// checks it against the root it holds).
func (l *Log) Consistency(ctx context.Context, org string, from uint64, to *tlog.Checkpoint) ([][]byte, error) {
	if from > to.Size {
		return nil, fmt.Errorf("%w: organization %q's log has %d leaves at its checkpoint, fewer than %d", ErrNotInLog, org, to.Size, from)
	}
	pr, err := tlog.ConsistencyProof(ctx, l.db, org, from, to.Size)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrLogDamaged, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
	}
	rng, err := tlog.LoadRange(ctx, l.db, org, from)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrLogDamaged, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
	}
	if err := tlog.VerifyConsistency(from, to.Size, pr, tlog.Root(rng), to.Root); err != nil {
		return nil, fmt.Errorf("%w: the consistency proof of organization %q from %d to %d fails: %v", ErrLogDamaged, org, from, to.Size, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
	}
	return pr, nil
}

// LeafProof is a sealed event's leaf with its inclusion proof against a checkpoint.
type LeafProof struct {
	Leaf  IndexedLeaf
	Proof [][]byte
}

// Inclusion finds the leaves of org's event with id at t (one per stored copy the
// sealer noted) in the log at cp and proves each against cp's root.
func (l *Log) Inclusion(ctx context.Context, org string, t time.Time, id string, cp *tlog.Checkpoint) ([]LeafProof, error) {
	leaves, err := l.db.leavesOf(ctx, org, []store.EventKey{{OrgID: org, Time: t.Unix(), ID: id}}, cp.Size)
	if err != nil {
		return nil, err
	}
	var keep []IndexedLeaf
	for _, lf := range leaves {
		// A time in whole seconds names the event's second (the table's key); one with
		// milliseconds names it exactly.
		if lf.ID == id && (t.Nanosecond() == 0 || lf.Time.Equal(t.UTC().Truncate(time.Millisecond))) {
			keep = append(keep, lf)
		}
	}
	if len(keep) == 0 {
		return nil, fmt.Errorf("%w: organization %q has no sealed event %q at %s in its log of size %d", ErrNotInLog, org, clip(id), t.UTC().Format(time.RFC3339Nano), cp.Size)
	}
	idx := make([]uint64, len(keep))
	for i := range keep {
		idx[i] = keep[i].Index
	}
	prs, err := tlog.InclusionProofs(ctx, l.db, org, idx, cp.Size)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrLogDamaged, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
	}
	out := make([]LeafProof, len(keep))
	for i := range keep {
		if err := tlog.VerifyInclusion(keep[i].Index, cp.Size, keep[i].Hash(), prs[i], cp.Root); err != nil {
			return nil, fmt.Errorf("%w: the inclusion proof of leaf %d of organization %q fails: %v", ErrLogDamaged, keep[i].Index, org, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
		}
		out[i] = LeafProof{Leaf: keep[i], Proof: prs[i]}
	}
	return out, nil
}

// Rotate records a key rotation (tlog.Rotation) in ClickHouse: RecordRotation without
// the checkpoints topic.
func (l *Log) Rotate(ctx context.Context, note []byte) error {
	_, err := l.RecordRotation(ctx, note, nil)
	return err
}

// sealedChunk bounds the rows one step of Sealed proves.
const sealedChunk = 5_000

// Sealed says which rows are sealed: a leaf of their organization's log under its
// newest verified checkpoint matches the row (verify's rule, matchLeaf), and the leaf's
// inclusion proof holds against that checkpoint's root. A reader that must not act on
// what only ClickHouse vouches for (the policy replica) keeps those. extra are rotation
// records found besides ClickHouse's (TopicRotations), as for RingWith.
func (l *Log) Sealed(ctx context.Context, extra [][]byte, rows []store.EventRow) ([]bool, error) {
	out := make([]bool, len(rows))
	ring, err := l.RingWith(ctx, extra)
	if err != nil {
		return nil, err
	}
	byOrg := map[string][]int{}
	for i := range rows {
		byOrg[rows[i].OrgID] = append(byOrg[rows[i].OrgID], i)
	}
	for org, all := range byOrg {
		cp, err := l.Newest(ctx, ring, org)
		if errors.Is(err, ErrNotInLog) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for start := 0; start < len(all); start += sealedChunk {
			part := all[start:min(len(all), start+sealedChunk)]
			keys := make([]store.EventKey, len(part))
			for j, i := range part {
				keys[j] = store.KeyOf(&rows[i])
			}
			leaves, err := l.db.leavesOf(ctx, org, keys, cp.Size)
			if err != nil {
				return nil, err
			}
			byKey := map[rowKey][]IndexedLeaf{}
			for _, lf := range leaves {
				k := rowKey{org: org, id: lf.ID, sec: lf.Time.Unix()}
				byKey[k] = append(byKey[k], lf)
			}
			var rowOf []int
			var matched []IndexedLeaf
			for _, i := range part {
				ls := byKey[keyOf(&rows[i])]
				if len(ls) == 0 {
					continue
				}
				c := copyOf(&rows[i])
				why, idx := matchLeaf(&c, ls, DefaultMargin)
				if why != "" {
					continue
				}
				for _, lf := range ls {
					if lf.Index == idx {
						rowOf, matched = append(rowOf, i), append(matched, lf)
						break
					}
				}
			}
			if len(matched) == 0 {
				continue
			}
			idx := make([]uint64, len(matched))
			for j := range matched {
				idx[j] = matched[j].Index
			}
			prs, err := tlog.InclusionProofs(ctx, l.db, org, idx, cp.Size)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrLogDamaged, err) //nolint:errorlint // the cause is text: ErrLogDamaged is the one kind callers see
			}
			for j := range matched {
				out[rowOf[j]] = tlog.VerifyInclusion(matched[j].Index, cp.Size, matched[j].Hash(), prs[j], cp.Root) == nil
			}
		}
	}
	return out, nil
}

// Coverage is the newest coverage note on the checkpoints topic (read by latest) that
// the ring opens; ok is false when there is none.
func (l *Log) Coverage(ctx context.Context, latest func(ctx context.Context) (map[string][]byte, error)) (tlog.Coverage, bool, error) {
	m, err := latest(ctx)
	if err != nil {
		return tlog.Coverage{}, false, err
	}
	note, ok := m[CoverageKey]
	if !ok {
		return tlog.Coverage{}, false, nil
	}
	ring, err := l.RingWith(ctx, TopicRotations(m))
	if err != nil {
		return tlog.Coverage{}, false, err
	}
	c, err := ring.OpenCoverage(note)
	if err != nil {
		return tlog.Coverage{}, false, fmt.Errorf("the coverage note on the checkpoints topic: %w", err)
	}
	return c, true, nil
}
