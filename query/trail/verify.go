package trail

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// Kinds of Problem.
const (
	KindModified   = "modified"   // a row differs from what its leaf sealed
	KindMissing    = "missing"    // a sealed row, or a leaf of the log, is gone
	KindUnexpected = "unexpected" // a row no leaf covers although one should by now
	KindForged     = "forged"     // a checkpoint or rotation record that does not verify
	KindTruncated  = "truncated"  // the log is shorter than a signed checkpoint says
	KindForked     = "forked"     // the log's root at a signed size is not the signed root
)

// Problem is one thing verify found wrong. ID is the event id, or for the log itself
// log:<org>, leaf:<org>:<index> or checkpoint:<org>:<size>; Leaf is the leaf's index
// when the problem is about one.
type Problem struct {
	ID     string  `json:"id"`
	Kind   string  `json:"kind"`
	Org    string  `json:"org"`
	Leaf   *uint64 `json:"leaf,omitempty"`
	Reason string  `json:"reason"`
}

// Head is an organization's newest verified checkpoint.
type Head struct {
	Org      string    `json:"org"`
	Size     uint64    `json:"size"`
	Root     []byte    `json:"root"`
	SignedAt time.Time `json:"signed_at"`
	KeyID    string    `json:"key_id"`
}

// Report is what Verify found. Problems is never nil.
type Report struct {
	Orgs           int       `json:"orgs"`
	Checkpoints    int       `json:"checkpoints"` // verified checkpoint rows
	Leaves         uint64    `json:"leaves"`      // leaves under the newest checkpoints, each checked
	SealedEvents   int       `json:"sealed_events"`
	UnsealedEvents int       `json:"unsealed_events"`
	ExpiredEvents  int       `json:"expired_events,omitempty"`
	Heads          []Head    `json:"heads"`
	Problems       []Problem `json:"problems"`
}

// OK says whether everything sealed matched.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// External is a checkpoint kept outside ClickHouse: an auditor's file, a witness's
// state, the checkpoints topic's newest. Source names it in problems.
type External struct {
	Source string
	Note   []byte
}

// Keys are what a reader trusts: the deployment's origin prefix and the audit keys it
// anchors the key ring at. The rotation records in ClickHouse extend it, and so do
// Rotations, found elsewhere (the checkpoints topic): each verifies on its own.
type Keys struct {
	Prefix    string
	Anchors   []ed25519.PublicKey
	Rotations [][]byte
}

// Filter says what Verify checks.
type Filter struct {
	// Orgs selects logs; nil checks every organization ([]string{""} is the log of the
	// events stored without one).
	Orgs []string
	// From and To bound the event time, [From, To); zero is open.
	From, To time.Time
	// Margin is how long a row may lack a leaf after its ingested_at (0: DefaultMargin).
	Margin time.Duration
	// Checkpoints are kept outside ClickHouse; the log must extend each.
	Checkpoints []External
	// Coverage is the newest coverage note (tlog.Coverage) of the checkpoints topic,
	// nil when there is none, and EventsTopic and IngestGroup the events topic and
	// ingest group it must be of (a note of another is ignored; "" takes any). A row
	// no leaf covers whose Kafka record lies below the coverage is unexpected, whatever
	// its ingested_at says: ingest noted every row of those records. With a coverage
	// note and Records, a row no leaf covers is not judged by how long ago it was
	// ingested (a row may become visible long after the ingested_at of its first
	// insert attempt), but by its Kafka record.
	Coverage    []byte
	EventsTopic string
	IngestGroup string
	// Records reads records of the events topic (nil: not checked). Once every row is
	// read, it is called once per partition that a row no leaf covers yet claims a
	// record of, one call at a time, with the offsets to read (at most MaxRecords in
	// all; none for the copies beyond). Such a row is unexpected when its record is at
	// or past the partition's end, is missing, does not decode as an event, or is
	// another event (another id or event time): ingest cannot have written it.
	Records func(ctx context.Context, partition int32, offsets []int64) (Claimed, error)
	// MaxRecords bounds the records Records is asked for (0: DefaultMaxRecords); the
	// rows beyond it are checked against the partitions' ends only.
	MaxRecords int
	// Progress gets a line per organization checked; nil: none.
	Progress io.Writer
}

// Claimed is what Filter.Records found of one partition of the events topic.
type Claimed struct {
	// NoPartition says the events topic has no such partition.
	NoPartition bool
	// First is the partition's first offset (retention removed the records before
	// it), and End its end (the offset of the next record written).
	First, End int64
	// Records are the records at the offsets asked for: an offset asked for in
	// [First, End) that is neither here nor in Unread holds no record.
	Records map[int64]ClaimedRecord
	// Unread are offsets asked for that were not read (a bound on bytes, a record
	// too large to keep): nothing is known of them.
	Unread []int64
}

// ClaimedRecord is a record of the events topic: its value and timestamp, which is
// the time schema.DecodeAt gives a frame without one (as ingest decodes it).
type ClaimedRecord struct {
	Value []byte
	Time  time.Time
}

// DefaultMaxRecords is Filter.MaxRecords by default.
const DefaultMaxRecords = 10_000

// DefaultRecordBytes is what KafkaRecords reads in all by default: DefaultMaxRecords
// events of over 25 KiB each.
const DefaultRecordBytes = 256 << 20

// KafkaRecords is Filter.Records on the events topic: kafka.ReadAt on brokers, reading
// at most maxBytes of keys and values over all its calls (0: DefaultRecordBytes); the
// records past that are Unread.
func KafkaRecords(brokers []string, topic string, maxBytes int) func(ctx context.Context, partition int32, offsets []int64) (Claimed, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultRecordBytes
	}
	var mu sync.Mutex
	left := maxBytes
	return func(ctx context.Context, partition int32, offsets []int64) (Claimed, error) {
		mu.Lock()
		defer mu.Unlock()
		r, err := kafka.ReadAt(ctx, brokers, topic, int(partition), offsets, left)
		if errors.Is(err, kafka.ErrNoPartition) {
			return Claimed{NoPartition: true}, nil
		}
		if err != nil {
			return Claimed{}, err
		}
		left = max(0, left-r.Bytes)
		c := Claimed{First: r.First, End: r.End, Records: make(map[int64]ClaimedRecord, len(r.Records)), Unread: r.Unread}
		for o, rec := range r.Records {
			c.Records[o] = ClaimedRecord{Value: rec.Value, Time: rec.Time}
		}
		return c, nil
	}
}

func (f *Filter) Validate() error {
	var errs []error
	if !f.From.IsZero() && !f.To.IsZero() && !f.To.After(f.From) {
		errs = append(errs, fmt.Errorf("--to (%s) must be after --from (%s)", f.To.UTC().Format(time.RFC3339), f.From.UTC().Format(time.RFC3339)))
	}
	if f.Margin < 0 {
		errs = append(errs, fmt.Errorf("--margin must not be negative, got %s", f.Margin))
	}
	if f.MaxRecords < 0 {
		errs = append(errs, fmt.Errorf("the records to check must not be negative, got %d", f.MaxRecords))
	}
	return errors.Join(errs...)
}

// verifyWorkers is how many organizations Verify checks at once.
const verifyWorkers = 2

// windowRows bounds the rows (events, leaves, index entries) one step holds.
const windowRows = 500_000

// signed is a verified checkpoint and where it came from.
type signed struct {
	tlog.Checkpoint
	source string
}

type verifier struct {
	conn   driver.Conn
	db     string
	ring   *tlog.KeyRing
	f      Filter
	now    time.Time
	latest time.Time // the newest timestamp of a verified checkpoint, of any organization
	cuts   cuts
	rep    Report
	seen   map[string]bool
	byOrg  map[string][]signed
	cov    *tlog.Coverage // the checked coverage note, or nil
	// unsealed are copies no leaf covers yet, kept for the check against the events
	// topic (at most maxUnsealedKept of an organization), and unkept counts the rows
	// beyond.
	unsealed []unsealedCopy
	unkept   int
}

// unsealedCopy is a copy of a row that no leaf covers yet.
type unsealedCopy struct {
	org, id   string
	ms        int64 // the event time, in milliseconds
	partition int32
	offset    int64
}

// maxUnsealedKept bounds the unsealed copies of an organization verify keeps to check
// against the events topic; beyond it (a backlog of unsealed rows, which the unsealed
// count shows) the rest are not checked.
const maxUnsealedKept = 100_000

// Verify checks the trail of db against the log: every checkpoint row's signatures,
// every organization's log against its checkpoints (and the external ones), and every
// stored row against its leaves.
func Verify(ctx context.Context, conn driver.Conn, db string, keys Keys, f Filter) (Report, error) {
	if !identRe.MatchString(db) {
		return Report{}, fmt.Errorf("database %q is not a plain identifier", db)
	}
	if err := f.Validate(); err != nil {
		return Report{}, err
	}
	if f.Margin == 0 {
		f.Margin = DefaultMargin
	}
	if f.MaxRecords == 0 {
		f.MaxRecords = DefaultMaxRecords
	}
	if keys.Prefix == "" {
		keys.Prefix = tlog.DefaultPrefix(db)
	}
	ldb := logDB{conn: conn, db: db}
	rot, err := ldb.rotations(ctx)
	var flooded error
	if errors.Is(err, errTooManyRotations) {
		// Reported, and the ring follows the records found elsewhere only.
		flooded, rot, err = err, nil, nil
	}
	if err != nil {
		return Report{}, err
	}
	ring, err := tlog.NewKeyRing(keys.Prefix, keys.Anchors, append(rot, keys.Rotations...))
	if err != nil {
		return Report{}, err
	}
	v := &verifier{conn: conn, db: db, ring: ring, f: f, seen: map[string]bool{}, byOrg: map[string][]signed{},
		rep: Report{Problems: []Problem{}, Heads: []Head{}}}
	if flooded != nil {
		v.problem(Problem{ID: "rotation:table", Kind: KindForged, Reason: flooded.Error() + ": rows planted by hand; the key ring follows the checkpoints topic's records only"})
	}
	for i, p := range ring.Problems() {
		v.problem(Problem{ID: fmt.Sprintf("rotation:%d", i+1), Kind: KindForged, Reason: p})
	}
	if f.Coverage != nil {
		c, err := ring.OpenCoverage(f.Coverage)
		switch {
		case err != nil:
			v.problem(Problem{ID: "coverage", Kind: KindForged, Reason: "the coverage note of the checkpoints topic: " + err.Error()})
		case f.EventsTopic != "" && c.Topic != f.EventsTopic:
			v.progress("ignoring the coverage note of topic %s (this deployment's events topic is %s)", c.Topic, f.EventsTopic)
		case f.IngestGroup != "" && c.Group != f.IngestGroup:
			v.progress("ignoring the coverage note of ingest group %s (this deployment's ingest group is %s)", c.Group, f.IngestGroup)
		default:
			v.cov = &c
		}
	}
	if v.now, err = serverNow(ctx, conn); err != nil {
		return Report{}, err
	}
	if v.cuts, err = loadCuts(ctx, conn, db, ring); err != nil {
		return Report{}, err
	}
	if err := v.checkpoints(ctx, ldb); err != nil {
		return Report{}, err
	}
	orgs, err := v.orgs(ctx)
	if err != nil {
		return Report{}, err
	}
	v.progress("verifying %d organization(s) of %s (origin prefix %s, keys %v): newest checkpoint %s, %s",
		len(orgs), db, keys.Prefix, ring.KeyIDs(), fmtTime(v.latest), v.cuts.summary())
	// Organizations are checked verifyWorkers at a time: each one's reads wait on the
	// server while another's rows are hashed. Each has a report of its own, merged in
	// order.
	reps := make([]Report, len(orgs))
	unsealed := make([][]unsealedCopy, len(orgs))
	unkept := make([]int, len(orgs))
	errs := make([]error, len(orgs))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range min(verifyWorkers, len(orgs)) {
		wg.Go(func() {
			for i := range next {
				ov := *v
				ov.rep, ov.seen, ov.unsealed, ov.unkept = Report{Problems: []Problem{}, Heads: []Head{}}, map[string]bool{}, nil, 0
				errs[i] = ov.org(ctx, ldb, orgs[i])
				reps[i], unsealed[i], unkept[i] = ov.rep, ov.unsealed, ov.unkept
				mu.Lock()
				v.progress("org %q: %d leaves, %d sealed events, %d unsealed, %d problems", orgs[i],
					ov.rep.Leaves, ov.rep.SealedEvents, ov.rep.UnsealedEvents, len(ov.rep.Problems))
				mu.Unlock()
			}
		})
	}
	for i := range orgs {
		next <- i
	}
	close(next)
	wg.Wait()
	for i := range orgs {
		if errs[i] != nil {
			return v.rep, errs[i]
		}
		r := &reps[i]
		v.rep.Leaves += r.Leaves
		v.rep.SealedEvents += r.SealedEvents
		v.rep.UnsealedEvents += r.UnsealedEvents
		v.rep.ExpiredEvents += r.ExpiredEvents
		v.rep.Heads = append(v.rep.Heads, r.Heads...)
		for _, p := range r.Problems {
			v.problem(p)
		}
		v.unsealed = append(v.unsealed, unsealed[i]...)
		v.unkept += unkept[i]
	}
	if err := v.claimed(ctx); err != nil {
		return v.rep, err
	}
	v.rep.Orgs = len(orgs)
	slices.SortStableFunc(v.rep.Problems, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Org, b.Org), cmp.Compare(a.ID, b.ID), cmp.Compare(a.Kind, b.Kind))
	})
	return v.rep, nil
}

func (v *verifier) progress(format string, args ...any) {
	if v.f.Progress != nil {
		_, _ = fmt.Fprintf(v.f.Progress, "audit verify: "+format+"\n", args...) // progress is best effort: it does not fail a verification
	}
}

func (v *verifier) problem(p Problem) {
	key := p.Org + "\x00" + p.ID + "\x00" + p.Kind
	if v.seen[key] {
		return
	}
	v.seen[key] = true
	v.rep.Problems = append(v.rep.Problems, p)
}

func leafRef(i uint64) *uint64 { return &i }

func (v *verifier) selected(org string) bool {
	return v.f.Orgs == nil || slices.Contains(v.f.Orgs, org)
}

// checkpoints opens every checkpoint row and every external checkpoint. One that does
// not verify is forged; the rest are what each organization's log must match.
func (v *verifier) checkpoints(ctx context.Context, ldb logDB) error {
	rows, err := ldb.checkpointRows(ctx, nil)
	if err != nil {
		return err
	}
	for _, r := range rows {
		c, err := v.ring.Open(r.Note)
		if err == nil && (c.Org != r.Org || c.Size != r.Size) {
			err = fmt.Errorf("the row says org %q size %d, the note says org %q size %d", r.Org, r.Size, c.Org, c.Size)
		}
		if err != nil {
			if v.selected(r.Org) {
				v.problem(Problem{ID: fmt.Sprintf("checkpoint:%s:%d", r.Org, r.Size), Kind: KindForged, Org: r.Org,
					Reason: "a row of checkpoints that does not verify: " + err.Error()})
			}
			continue
		}
		v.rep.Checkpoints++
		v.add(signed{Checkpoint: c, source: "ClickHouse"})
	}
	for _, e := range v.f.Checkpoints {
		c, err := v.ring.Open(e.Note)
		if err != nil {
			v.problem(Problem{ID: "checkpoint:" + e.Source, Kind: KindForged, Reason: fmt.Sprintf("the checkpoint of %s does not verify: %v", e.Source, err)})
			continue
		}
		v.add(signed{Checkpoint: c, source: e.Source})
	}
	return nil
}

func (v *verifier) add(s signed) {
	if s.SignedAt.After(v.latest) {
		v.latest = s.SignedAt
	}
	v.byOrg[s.Org] = append(v.byOrg[s.Org], s)
}

// orgs lists the organizations to check: those asked for, or every one with rows,
// leaves or checkpoints.
func (v *verifier) orgs(ctx context.Context) ([]string, error) {
	if v.f.Orgs != nil {
		for _, org := range v.f.Orgs {
			if len(v.byOrg[org]) > 0 {
				continue
			}
			var n uint64
			if err := v.conn.QueryRow(ctx, "SELECT count() FROM "+v.db+".log_leaves WHERE org_id = ?", org).Scan(&n); err != nil {
				return nil, fmt.Errorf("cannot count the leaves of org %q in %s.log_leaves: %w", org, v.db, err)
			}
			if n == 0 {
				return nil, fmt.Errorf("organization %q has no log in %s: nothing to verify it against (is --org right? `bandplane audit seal` seals now)", org, v.db)
			}
		}
		return slices.Compact(slices.Sorted(slices.Values(v.f.Orgs))), nil
	}
	set := map[string]bool{}
	for org := range v.byOrg {
		set[org] = true
	}
	for _, table := range []string{"events", "log_leaves", "checkpoints"} {
		rows, err := v.conn.Query(ctx, "SELECT DISTINCT org_id FROM "+v.db+"."+table)
		if err != nil {
			return nil, fmt.Errorf("cannot list the organizations of %s.%s: %w", v.db, table, err)
		}
		for rows.Next() {
			var org string
			if err := rows.Scan(&org); err != nil {
				rows.Close()
				return nil, err
			}
			set[org] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for org := range set {
			if !yield(org) {
				return
			}
		}
	}), nil
}

// orgLeaves is what the scan of an organization's index learnt: a fingerprint of each
// leaf under the newest checkpoint, whether its time is in the filter's range, and
// when each leaf was first sealed.
type orgLeaves struct {
	size     uint64            // leaves the index holds, up to the newest checkpoint
	prints   []leafPrint       // each leaf's time and the start of its inner digest
	inRange  []bool            // the leaf's time lies in [From, To)
	sizes    []uint64          // checkpoint sizes, ascending
	signedAt []time.Time       // signedAt[i]: the earliest timestamp of the checkpoints of sizes >= sizes[i]
	seenLeaf []bool            // leaves found in log_leaves
	bySize   map[uint64]signed // one verified checkpoint per size (the first)
}

// leafPrint binds a row of log_leaves to the leaf the index scan proved: the leaf's
// time and the first 16 bytes of its inner digest (tlog.Leaf.Inner), which together
// give its tree hash.
type leafPrint struct {
	ms    int64
	inner [16]byte
}

// sealedAt is when the leaf at i was first covered by a checkpoint.
func (o *orgLeaves) sealedAt(i uint64) time.Time {
	j := sort.Search(len(o.sizes), func(j int) bool { return o.sizes[j] > i })
	if j == len(o.sizes) {
		return time.Time{}
	}
	return o.signedAt[j]
}

func (v *verifier) org(ctx context.Context, ldb logDB, org string) error {
	cps := v.byOrg[org]
	ol := &orgLeaves{bySize: map[uint64]signed{}}
	var newest *signed
	for i := range cps {
		c := &cps[i]
		if prev, ok := ol.bySize[c.Size]; ok {
			if !prev.Same(&c.Checkpoint) {
				v.problem(Problem{ID: "log:" + org, Kind: KindForked, Org: org,
					Reason: fmt.Sprintf("two signed checkpoints of size %d have different roots (%s and %s)", c.Size, prev.source, c.source)})
			}
			continue
		}
		ol.bySize[c.Size] = *c
		if newest == nil || c.Size > newest.Size {
			newest = c
		}
	}
	ol.sizes = slices.Sorted(func(yield func(uint64) bool) {
		for s := range ol.bySize {
			if !yield(s) {
				return
			}
		}
	})
	ol.signedAt = make([]time.Time, len(ol.sizes))
	var earliest time.Time
	for i := len(ol.sizes) - 1; i >= 0; i-- {
		t := ol.bySize[ol.sizes[i]].SignedAt
		for _, c := range cps {
			if c.Size == ol.sizes[i] && c.SignedAt.Before(t) {
				t = c.SignedAt
			}
		}
		if earliest.IsZero() || t.Before(earliest) {
			earliest = t
		}
		ol.signedAt[i] = earliest
	}
	if newest != nil {
		v.rep.Heads = append(v.rep.Heads, Head{Org: org, Size: newest.Size, Root: newest.Root, SignedAt: newest.SignedAt, KeyID: newest.KeyID})
		if err := v.scanIndex(ctx, org, ol); err != nil {
			return err
		}
	}
	if err := v.uncovered(ctx, org, ol); err != nil {
		return err
	}
	return v.compare(ctx, org, ol)
}

// uncovered names leaves past the newest checkpoint that were appended longer ago than
// the margin: the sealer signs a checkpoint right after it appends (a crash in between
// leaves leaves it writes again at its next run), so such leaves mean their checkpoints
// were deleted.
func (v *verifier) uncovered(ctx context.Context, org string, ol *orgLeaves) error {
	if v.latest.IsZero() {
		return nil
	}
	var n uint64
	var oldest time.Time
	var first uint64
	if err := v.conn.QueryRow(ctx, "SELECT count(), min(ingested_at), min(idx) FROM "+v.db+".log_leaves WHERE org_id = ? AND idx >= ?",
		org, ol.size).Scan(&n, &oldest, &first); err != nil {
		return fmt.Errorf("cannot count the leaves of org %q past its newest checkpoint in %s.log_leaves: %w", org, v.db, err)
	}
	if n > 0 && oldest.Before(v.latest.Add(-v.f.Margin)) {
		v.problem(Problem{ID: "log:" + org, Kind: KindMissing, Org: org, Leaf: leafRef(first),
			Reason: fmt.Sprintf("%d leaves from index %d on, past its newest checkpoint (size %d), hold rows ingested at %s, long before the newest checkpoint (%s): their checkpoints were deleted",
				n, first, ol.size, fmtTime(oldest), fmtTime(v.latest))})
	}
	return nil
}

// scanIndex reads org's index in order up to the newest checkpoint, recomputing the
// root at every checkpointed size.
func (v *verifier) scanIndex(ctx context.Context, org string, ol *orgLeaves) error {
	m := ol.sizes[len(ol.sizes)-1]
	rng := tlog.NewRange()
	next := 0 // the next size to check
	check := func() {
		for next < len(ol.sizes) && ol.sizes[next] == rng.End() {
			c := ol.bySize[ol.sizes[next]]
			if root := tlog.Root(rng); !bytes.Equal(root, c.Root) {
				v.problem(Problem{ID: "log:" + org, Kind: KindForked, Org: org,
					Reason: fmt.Sprintf("the leaves of its log do not give the root of its checkpoint of size %d (%s, signed at %s): the log was edited",
						c.Size, c.source, fmtTime(c.SignedAt))})
			}
			next++
		}
	}
	check() // size 0
	ol.prints = make([]leafPrint, 0, m)
	ol.inRange = make([]bool, 0, m)
	var lastMs int64
	var lastInner [32]byte
	broken := false
	for lo := uint64(0); lo < m && !broken; lo += windowRows {
		hi := min(m, lo+windowRows)
		rows, err := logDB{conn: v.conn, db: v.db}.indexRows(ctx, org, lo, hi)
		if err != nil {
			return err
		}
		for rows.Next() {
			row, err := scanIndexRow(rows, v.db)
			if err != nil {
				rows.Close()
				return err
			}
			idx, ms, in, ok := row.idx, row.ms, row.inner, row.ok
			switch {
			case broken:
				continue
			case idx+1 == rng.End():
				if ms != lastMs || in != lastInner {
					v.problem(Problem{ID: fmt.Sprintf("leaf:%s:%d", org, idx), Kind: KindForked, Org: org, Leaf: leafRef(idx),
						Reason: "log_index holds two different leaves at this index"})
				}
				continue
			case idx != rng.End():
				v.problem(Problem{ID: fmt.Sprintf("leaf:%s:%d", org, rng.End()), Kind: KindMissing, Org: org, Leaf: leafRef(rng.End()),
					Reason: fmt.Sprintf("log_index has no leaf at index %d (the next one it holds is %d)", rng.End(), idx)})
				broken = true
				continue
			case !ok:
				v.problem(Problem{ID: fmt.Sprintf("leaf:%s:%d", org, idx), Kind: KindModified, Org: org, Leaf: leafRef(idx),
					Reason: "its log_index row holds no valid digest"})
			}
			h := tlog.LeafHash(ms, in)
			if err := rng.Append(h, nil); err != nil {
				rows.Close()
				return err
			}
			fp := leafPrint{ms: ms}
			copy(fp.inner[:], in[:])
			ol.prints = append(ol.prints, fp)
			t := time.UnixMilli(ms).UTC()
			ol.inRange = append(ol.inRange, (v.f.From.IsZero() || !t.Before(v.f.From)) && (v.f.To.IsZero() || t.Before(v.f.To)))
			lastMs, lastInner = ms, in
			check()
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("cannot read %s.log_index: %w", v.db, err)
		}
	}
	ol.size = rng.End()
	ol.seenLeaf = make([]bool, ol.size)
	v.rep.Leaves += ol.size
	for _, s := range ol.sizes {
		if s > ol.size {
			c := ol.bySize[s]
			v.problem(Problem{ID: "log:" + org, Kind: KindTruncated, Org: org,
				Reason: fmt.Sprintf("its log holds %d leaves, but the checkpoint of %d leaves (%s, signed at %s) says more: the log was truncated or rolled back",
					ol.size, s, c.source, fmtTime(c.SignedAt))})
			break
		}
	}
	return nil
}

// compare walks the organization's rows and leaves window by window of event time.
func (v *verifier) compare(ctx context.Context, org string, ol *orgLeaves) error {
	windows, err := v.windows(ctx, org)
	if err != nil {
		return err
	}
	for _, w := range windows {
		if err := v.compareWindow(ctx, org, ol, w[0], w[1]); err != nil {
			return err
		}
	}
	// Every leaf under the checkpoints must have its row in log_leaves, which is where
	// the rows' leaves are found: a leaf deleted there (or moved to another time)
	// would take its row out of the comparison.
	for i := uint64(0); i < ol.size; i++ {
		if ol.inRange[i] && !ol.seenLeaf[i] {
			v.problem(Problem{ID: fmt.Sprintf("leaf:%s:%d", org, i), Kind: KindMissing, Org: org, Leaf: leafRef(i),
				Reason: fmt.Sprintf("leaf %d (sealed at %s) has no row in log_leaves", i, fmtTime(ol.sealedAt(i)))})
		}
	}
	return nil
}

// windows groups the days that hold the organization's rows or leaves into stretches
// of at most windowRows rows (a day with more is a window of its own).
func (v *verifier) windows(ctx context.Context, org string) ([][2]time.Time, error) {
	perDay := map[time.Time]uint64{}
	for _, table := range []string{"events", "log_leaves"} {
		q, args := v.timeRange("SELECT toDate(time) AS d, count() FROM "+v.db+"."+table+" WHERE org_id = ?", []any{org})
		rows, err := v.conn.Query(ctx, q+" GROUP BY d", args...)
		if err != nil {
			return nil, fmt.Errorf("cannot count the rows of org %q in %s.%s: %w", org, v.db, table, err)
		}
		for rows.Next() {
			var d time.Time
			var n uint64
			if err := rows.Scan(&d, &n); err != nil {
				rows.Close()
				return nil, err
			}
			perDay[time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)] += n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	days := slices.SortedFunc(func(yield func(time.Time) bool) {
		for d := range perDay {
			if !yield(d) {
				return
			}
		}
	}, time.Time.Compare)
	var out [][2]time.Time
	var n uint64
	for _, d := range days {
		if len(out) > 0 && n+perDay[d] <= windowRows {
			out[len(out)-1][1] = d.AddDate(0, 0, 1)
			n += perDay[d]
			continue
		}
		out = append(out, [2]time.Time{d, d.AddDate(0, 0, 1)})
		n = perDay[d]
	}
	for i := range out {
		if !v.f.From.IsZero() && out[i][0].Before(v.f.From) {
			out[i][0] = v.f.From.UTC()
		}
		if !v.f.To.IsZero() && out[i][1].After(v.f.To) {
			out[i][1] = v.f.To.UTC()
		}
	}
	return out, nil
}

// timeRange adds the event-time bounds of the filter to a query with a WHERE clause.
func (v *verifier) timeRange(q string, args []any) (string, []any) {
	if !v.f.From.IsZero() {
		q += " AND time >= ?"
		args = append(args, v.f.From.UTC().Truncate(time.Second))
	}
	if !v.f.To.IsZero() {
		q += " AND time < ?"
		args = append(args, v.f.To.UTC())
	}
	return q, args
}

// inRange says whether an event time lies in the filter's [From, To).
func (v *verifier) inRange(t time.Time) bool {
	return (v.f.From.IsZero() || !t.Before(v.f.From)) && (v.f.To.IsZero() || t.Before(v.f.To))
}

// storedCopy is what verify keeps of a stored copy of a row: its content digest and
// bookkeeping, computed as the row is read (the row itself is not held).
type storedCopy struct {
	id         string
	time       time.Time
	digest     store.Digest
	ingestedAt time.Time
	partition  int32
	offset     int64
}

func copyOf(r *store.EventRow) storedCopy {
	return storedCopy{id: r.ID, time: r.Time, digest: r.SealDigest(), ingestedAt: r.IngestedAt, partition: r.Partition, offset: r.Offset}
}

// compareWindow reads the window's leaves and stored rows at once (two queries: the
// server reads one while this process decodes the other) and compares them.
func (v *verifier) compareWindow(ctx context.Context, org string, ol *orgLeaves, from, to time.Time) error {
	var leaves map[rowKey][]IndexedLeaf
	var copies map[rowKey][]storedCopy
	var leafErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		leaves, leafErr = v.windowLeaves(ctx, org, ol, from, to)
	}()
	copies, err := v.windowCopies(ctx, org, from, to)
	<-done
	if err != nil {
		return err
	}
	if leafErr != nil {
		return leafErr
	}

	future := v.now.Add(v.f.Margin)
	var overdue time.Time // zero: no such rule
	if !v.latest.IsZero() && !v.byRecord() {
		overdue = v.latest.Add(-v.f.Margin)
	}
	for k, cs := range copies {
		ls := leaves[k]
		if len(ls) == 0 {
			v.unleafed(org, cs, future, overdue)
			continue
		}
		good := 0
		for i := range cs {
			if why, leaf := matchLeaf(&cs[i], ls, v.f.Margin); why != "" {
				v.problem(Problem{ID: cs[i].id, Kind: KindModified, Org: org, Leaf: leafRef(leaf), Reason: why})
			} else {
				good++
			}
		}
		if good > 0 {
			v.rep.SealedEvents++
		}
		v.orphans(org, ls, cs)
	}
	for k, ls := range leaves {
		if len(copies[k]) > 0 {
			continue
		}
		expired := false
		for _, lf := range ls {
			sealedAt := ol.sealedAt(lf.Index)
			why := v.cuts.excuse(lf.Time, sealedAt)
			if why == "" {
				expired = true
				continue
			}
			v.problem(Problem{ID: lf.ID, Kind: KindMissing, Org: org, Leaf: leafRef(lf.Index),
				Reason: fmt.Sprintf("the row at %s that leaf %d sealed at %s is gone (%s)", lf.Time.Format(time.RFC3339Nano), lf.Index, fmtTime(sealedAt), why)})
		}
		if expired {
			v.rep.ExpiredEvents++
		}
	}
	return nil
}

// windowLeaves reads the window's rows of log_leaves under the newest checkpoint, each
// bound to the leaf the index scan proved (else it is named: edited, or moved).
func (v *verifier) windowLeaves(ctx context.Context, org string, ol *orgLeaves, from, to time.Time) (map[rowKey][]IndexedLeaf, error) {
	out := map[rowKey][]IndexedLeaf{}
	if ol.size == 0 {
		return out, nil
	}
	rows, err := v.conn.Query(ctx, "SELECT "+leafCols+" FROM "+v.db+".log_leaves WHERE org_id = ? AND time >= ? AND time < ? AND idx < ?",
		org, from, to, ol.size)
	if err != nil {
		return nil, fmt.Errorf("cannot read the leaves of org %q from %s.log_leaves: %w", org, v.db, err)
	}
	defer rows.Close()
	for rows.Next() {
		var lf IndexedLeaf
		if err := scanLeaf(rows, &lf); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.log_leaves: %w", v.db, err)
		}
		if !v.inRange(lf.Time) {
			continue
		}
		in := lf.Inner()
		p := ol.prints[lf.Index]
		if lf.Org != org || p.ms != lf.Time.UnixMilli() || !bytes.Equal(in[:16], p.inner[:]) {
			v.problem(Problem{ID: fmt.Sprintf("leaf:%s:%d", org, lf.Index), Kind: KindModified, Org: org, Leaf: leafRef(lf.Index),
				Reason: fmt.Sprintf("the log_leaves row of event %s at index %d does not match the log", clip(lf.ID), lf.Index)})
			continue
		}
		if ol.seenLeaf[lf.Index] {
			continue // the same row twice, before a merge
		}
		ol.seenLeaf[lf.Index] = true
		k := rowKey{org: org, id: lf.ID, sec: lf.Time.Unix()}
		out[k] = append(out[k], lf)
	}
	return out, rows.Err()
}

// windowCopies reads every stored copy of the window's rows (without FINAL: each copy
// must match a leaf), keeping its digest and bookkeeping.
func (v *verifier) windowCopies(ctx context.Context, org string, from, to time.Time) (map[rowKey][]storedCopy, error) {
	out := map[rowKey][]storedCopy{}
	rows, err := v.conn.Query(ctx, "SELECT "+eventCols+" FROM "+v.db+".events WHERE org_id = ? AND time >= ? AND time < ?", org, from, to)
	if err != nil {
		return nil, fmt.Errorf("cannot read the events of org %q from %s.events: %w", org, v.db, err)
	}
	defer rows.Close()
	var r store.EventRow
	for rows.Next() {
		if err := scanEvent(rows, &r); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.events: %w", v.db, err)
		}
		if !v.inRange(r.Time) {
			continue
		}
		k := keyOf(&r)
		out[k] = append(out[k], copyOf(&r))
	}
	return out, rows.Err()
}

// byRecord says whether rows no leaf covers are judged by their Kafka records, not by
// how long ago they were ingested: with a coverage note (which catches a row of a
// record below it however recent it claims to be) and the events topic to read.
func (v *verifier) byRecord() bool { return v.cov != nil && v.f.Records != nil }

// unleafed judges the copies of a row no leaf covers: unsealed yet, or unexpected
// when one claims a Kafka record below the signed coverage, or was ingested in the
// future, or (without byRecord) before the newest checkpoint less the margin
// (overdue; zero: not so judged). The first rule rests on signed material only; the
// others on ingested_at, which whoever wrote the row chose, and serve when there is
// no coverage note. An unsealed row's copies are kept for claimed, which reads their
// Kafka records.
func (v *verifier) unleafed(org string, cs []storedCopy, future, overdue time.Time) {
	if v.cov != nil {
		for i := range cs {
			if o, ok := v.cov.Offsets[int(cs[i].partition)]; ok && cs[i].offset < o {
				v.problem(Problem{ID: cs[i].id, Kind: KindUnexpected, Org: org,
					Reason: fmt.Sprintf("in no leaf, though its Kafka record (partition %d, offset %d) lies below the coverage signed at %s (offset %d): ingest noted every row of those records (written into ClickHouse by hand?)",
						cs[i].partition, cs[i].offset, fmtTime(v.cov.SignedAt), o)})
				return
			}
		}
	}
	first, last := cs[0].ingestedAt, cs[0].ingestedAt
	for i := range cs {
		if cs[i].ingestedAt.Before(first) {
			first = cs[i].ingestedAt
		}
		if cs[i].ingestedAt.After(last) {
			last = cs[i].ingestedAt
		}
	}
	switch {
	case last.After(future):
		v.problem(Problem{ID: cs[0].id, Kind: KindUnexpected, Org: org,
			Reason: fmt.Sprintf("in no leaf, and ingested_at %s is in the future", fmtTime(last))})
	case !overdue.IsZero() && first.Before(overdue):
		v.problem(Problem{ID: cs[0].id, Kind: KindUnexpected, Org: org,
			Reason: fmt.Sprintf("in no leaf, though ingested at %s, more than the margin before the newest checkpoint (%s): ingest never noted it (written into ClickHouse by hand?)",
				fmtTime(first), fmtTime(v.latest))})
	default:
		v.rep.UnsealedEvents++
		if len(v.unsealed) >= maxUnsealedKept {
			v.unkept++
			return
		}
		for i := range cs {
			v.unsealed = append(v.unsealed, unsealedCopy{org: org, id: cs[i].id, ms: cs[i].time.UnixMilli(), partition: cs[i].partition, offset: cs[i].offset})
		}
	}
}

// claimed checks each unsealed copy against the Kafka record it claims, read now that
// every row is read: a record at or past the partition's end did not exist when its
// row was, and a record that is not this event (another id or event time, or not an
// event at all, or none) is not where ingest found it. Up to MaxRecords records are
// read; the copies beyond are checked against the end only. A record that retention
// removed cannot be checked: counted, as are the ones not read.
func (v *verifier) claimed(ctx context.Context) error {
	if v.f.Records == nil || len(v.unsealed) == 0 {
		if v.unkept > 0 {
			v.progress("%d unsealed rows beyond the first %d of an organization were not checked against the events topic", v.unkept, maxUnsealedKept)
		}
		return nil
	}
	type pos struct {
		partition int32
		offset    int64
	}
	byPart := map[int32][]int{}     // copies by partition
	distinct := map[int32][]int64{} // the offsets they claim, by partition
	for i, c := range v.unsealed {
		byPart[c.partition] = append(byPart[c.partition], i)
		distinct[c.partition] = append(distinct[c.partition], c.offset)
	}
	parts := slices.Sorted(maps.Keys(byPart))
	for _, p := range parts {
		slices.Sort(distinct[p])
		distinct[p] = slices.Compact(distinct[p])
	}
	// The records to read: at most MaxRecords, the lowest offsets of every partition
	// in turn.
	read := map[pos]bool{}
	for k := 0; len(read) < v.f.MaxRecords; k++ {
		more := false
		for _, p := range parts {
			if k < len(distinct[p]) && len(read) < v.f.MaxRecords {
				read[pos{p, distinct[p][k]}] = true
				more = true
			}
		}
		if !more {
			break
		}
	}
	bad := map[string]bool{} // rows found unexpected (org, id)
	var checked, retained, unread, beyond int
	for _, part := range parts {
		var offsets []int64
		for _, o := range distinct[part] {
			if read[pos{part, o}] {
				offsets = append(offsets, o)
			}
		}
		cl, err := v.f.Records(ctx, part, offsets)
		if err != nil {
			return fmt.Errorf("cannot read partition %d of the events topic, to check the records that %d rows no leaf covers claim: %w", part, len(byPart[part]), err)
		}
		unreadAt := map[int64]bool{}
		for _, o := range cl.Unread {
			unreadAt[o] = true
		}
		for _, i := range byPart[part] {
			c := &v.unsealed[i]
			rec, found := cl.Records[c.offset]
			var why string
			switch {
			case cl.NoPartition:
				why = fmt.Sprintf("in no leaf, and its Kafka partition %d is not one of the events topic's", c.partition)
			case c.offset >= cl.End:
				why = fmt.Sprintf("in no leaf, and its Kafka record (partition %d, offset %d) is past the end of the events topic (%d): ingest cannot have written it", c.partition, c.offset, cl.End)
			case !read[pos{part, c.offset}]:
				beyond++
				continue
			case found:
				checked++
				why = recordMismatch(c, rec)
			case c.offset < cl.First:
				retained++
				continue
			case unreadAt[c.offset]:
				unread++
				continue
			default:
				checked++
				why = fmt.Sprintf("in no leaf, and the events topic holds no record at partition %d, offset %d (its first offset is %d, its end %d): ingest cannot have written it",
					c.partition, c.offset, cl.First, cl.End)
			}
			if why == "" {
				continue
			}
			v.problem(Problem{ID: c.id, Kind: KindUnexpected, Org: c.org, Reason: why})
			if k := c.org + "\x00" + c.id; !bad[k] {
				bad[k] = true
				v.rep.UnsealedEvents--
			}
		}
	}
	v.progress("read the Kafka records of %d unsealed copies; %d rows unexpected by the events topic", checked, len(bad))
	if retained > 0 {
		v.progress("%d unsealed copies claim Kafka records that retention removed from the events topic (below the partition's first offset): not checked", retained)
	}
	if unread+beyond > 0 {
		v.progress("%d unsealed copies' Kafka records were not read (at most %d records are, within a byte bound): checked against the events topic's end only", unread+beyond, v.f.MaxRecords)
	}
	if v.unkept > 0 {
		v.progress("%d unsealed rows beyond the first %d of an organization were not checked against the events topic", v.unkept, maxUnsealedKept)
	}
	return nil
}

// recordMismatch says why the Kafka record a copy claims is not its event ("" when it
// is): it does not decode as ingest decodes it, or it is another event (its id or its
// event time differ; its organization may, as ingest attributes events).
func recordMismatch(c *unsealedCopy, rec ClaimedRecord) string {
	ev, err := schema.DecodeAt(rec.Value, rec.Time)
	if err != nil {
		return fmt.Sprintf("in no leaf, and its Kafka record (partition %d, offset %d) holds %d bytes that are not an event (%s): ingest cannot have written it",
			c.partition, c.offset, len(rec.Value), clip(err.Error()))
	}
	if ev.ID != c.id || ev.Time.UnixMilli() != c.ms {
		return fmt.Sprintf("in no leaf, and its Kafka record (partition %d, offset %d) is event %s at %s, not this one (at %s): ingest cannot have written it",
			c.partition, c.offset, clip(ev.ID), ev.Time.UTC().Format(time.RFC3339Nano), time.UnixMilli(c.ms).UTC().Format(time.RFC3339Nano))
	}
	return ""
}

// matches says whether a stored copy is the one a leaf sealed: the same content and
// Kafka record, and an ingested_at not after the leaf's, since an insert attempt that
// did not store the whole batch leaves an earlier copy, but not more than the margin
// before it.
func matches(r *storedCopy, lf *IndexedLeaf, margin time.Duration) bool {
	return lf.Digest == r.digest && lf.Partition == r.partition && lf.Offset == r.offset &&
		!r.ingestedAt.After(lf.IngestedAt) && !r.ingestedAt.Before(lf.IngestedAt.Add(-margin))
}

// orphans names the leaves of a row that no stored copy matches, though other leaves
// of the row have copies: each leaf must keep its copy, or an edited row that ingest
// noted again (a redelivery) would hide the leaf of the row as it was sealed. A leaf
// is excused by a matched leaf of the same content and Kafka record written at most
// the margin after it: a replay noted the copy of an earlier insert attempt, which a
// merge has since dropped.
func (v *verifier) orphans(org string, ls []IndexedLeaf, cs []storedCopy) {
	matched := make([]bool, len(ls))
	for i := range ls {
		for j := range cs {
			if matches(&cs[j], &ls[i], v.f.Margin) {
				matched[i] = true
				break
			}
		}
	}
	for i := range ls {
		if matched[i] {
			continue
		}
		lf := &ls[i]
		excused := false
		for j := range ls {
			o := &ls[j]
			if matched[j] && o.Digest == lf.Digest && o.Partition == lf.Partition && o.Offset == lf.Offset &&
				!o.IngestedAt.Before(lf.IngestedAt) && !o.IngestedAt.After(lf.IngestedAt.Add(v.f.Margin)) {
				excused = true
				break
			}
		}
		if !excused {
			v.problem(Problem{ID: lf.ID, Kind: KindModified, Org: org, Leaf: leafRef(lf.Index),
				Reason: fmt.Sprintf("no stored copy of the row is the one leaf %d sealed (ingested at %s, partition %d, offset %d); its copies match other leaves: edited, then noted again",
					lf.Index, fmtTime(lf.IngestedAt), lf.Partition, lf.Offset)})
		}
	}
}

// matchLeaf says why a stored copy of a row matches none of its leaves ("" when one
// matches: the same content and Kafka record, and an ingested_at not after the
// leaf's, since an insert attempt that did not store the whole batch leaves an earlier
// copy, but not more than the margin before it), and which leaf it is closest to.
func matchLeaf(r *storedCopy, ls []IndexedLeaf, margin time.Duration) (string, uint64) {
	d := r.digest
	why, closest := "", ls[0].Index
	rank := 0
	for _, lf := range ls {
		switch {
		case lf.Digest != d:
			if rank < 1 {
				why, closest, rank = fmt.Sprintf("the row at %s differs from what leaf %d sealed", r.time.Format(time.RFC3339Nano), lf.Index), lf.Index, 1
			}
		case lf.Partition != r.partition || lf.Offset != r.offset:
			if rank < 2 {
				why, closest, rank = fmt.Sprintf("its Kafka record (partition %d, offset %d) is not the one leaf %d sealed (partition %d, offset %d)",
					r.partition, r.offset, lf.Index, lf.Partition, lf.Offset), lf.Index, 2
			}
		case r.ingestedAt.After(lf.IngestedAt):
			if rank < 3 {
				why, closest, rank = fmt.Sprintf("its ingested_at %s is later than when leaf %d says it was written (%s): moved after it was sealed",
					fmtTime(r.ingestedAt), lf.Index, fmtTime(lf.IngestedAt)), lf.Index, 3
			}
		case r.ingestedAt.Before(lf.IngestedAt.Add(-margin)):
			if rank < 3 {
				why, closest, rank = fmt.Sprintf("its ingested_at %s is more than the margin before when leaf %d says it was written (%s): moved",
					fmtTime(r.ingestedAt), lf.Index, fmtTime(lf.IngestedAt)), lf.Index, 3
			}
		default:
			return "", lf.Index
		}
	}
	return why, closest
}
