package seal

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
)

// Kinds of Problem.
const (
	KindModified   = "modified"   // a row (or seal) differs from what was sealed
	KindMissing    = "missing"    // a sealed row (or a seal) is gone
	KindUnexpected = "unexpected" // a row no seal covers although one should
)

// Problem is one thing verify found wrong. ID is the event id, or seal:<org>:<seq> for
// a seal; Seal is the seal the event's entry belongs to ("" for an unexpected row).
type Problem struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	Seal   string `json:"seal"`
	Org    string `json:"org"`
	Reason string `json:"reason"`
}

// Report is what Verify found. Problems is never nil.
type Report struct {
	Seals          int       `json:"seals"`
	SealedEvents   int       `json:"sealed_events"`
	UnsealedEvents int       `json:"unsealed_events"`
	ExpiredEvents  int       `json:"expired_events,omitempty"`
	Problems       []Problem `json:"problems"`
}

// OK says whether everything sealed matched.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Filter says what Verify checks.
type Filter struct {
	// Orgs selects chains; nil checks every organization ([]string{""} is the chain of
	// events stored without one).
	Orgs []string
	// From and To bound the event time, [From, To); zero is open.
	From, To time.Time
	// Margin must be at least the sealer's (0: DefaultMargin).
	Margin time.Duration
	// Progress gets a line per organization checked; nil: none.
	Progress io.Writer
}

func (f *Filter) Validate() error {
	var errs []error
	if !f.From.IsZero() && !f.To.IsZero() && !f.To.After(f.From) {
		errs = append(errs, fmt.Errorf("--to (%s) must be after --from (%s)", f.To.UTC().Format(time.RFC3339), f.From.UTC().Format(time.RFC3339)))
	}
	if f.Margin < 0 {
		errs = append(errs, fmt.Errorf("--margin must not be negative, got %s", f.Margin))
	}
	return errors.Join(errs...)
}

// windowRows bounds the entries (and event rows) one step of the comparison holds.
const windowRows = 500_000

// announceSkew is how far an ingest host's clock (ingested_at) may be ahead of the
// database's when verify decides which announced seals it must have read.
const announceSkew = 30 * time.Second

type verifier struct {
	conn      driver.Conn
	db        string
	pub       ed25519.PublicKey
	pubID     string
	f         Filter
	now       time.Time
	watermark time.Time // latest through of a seal that verifies
	cuts      cuts      // the retention cuts of the events table
	rep       Report
	seen      map[Problem]bool
}

// Verify recomputes what was sealed and compares it with the trail.
func Verify(ctx context.Context, conn driver.Conn, db string, pub ed25519.PublicKey, f Filter) (Report, error) {
	if !identRe.MatchString(db) {
		return Report{}, fmt.Errorf("database %q is not a plain identifier", db)
	}
	if len(pub) != ed25519.PublicKeySize {
		return Report{}, errors.New("no Ed25519 public key (--audit-key)")
	}
	if err := f.Validate(); err != nil {
		return Report{}, err
	}
	if f.Margin == 0 {
		f.Margin = DefaultMargin
	}
	v := &verifier{conn: conn, db: db, pub: pub, pubID: KeyID(pub), f: f, seen: map[Problem]bool{}, rep: Report{Problems: []Problem{}}}
	var err error
	if v.now, err = serverNow(ctx, conn); err != nil {
		return Report{}, err
	}
	if v.cuts, err = loadCuts(ctx, conn, db, pub, v.pubID); err != nil {
		return Report{}, err
	}

	// Every seal, of every organization: the watermark is the trail's, not a chain's.
	all, err := loadSeals(ctx, conn, db, nil)
	if err != nil {
		return Report{}, err
	}
	bad := map[*Seal]string{}
	chains := map[string][]*Seal{}
	keyIDs := map[string]int{}
	for i := range all {
		s := &all[i]
		if why := s.checkSignature(pub, v.pubID); why != "" {
			bad[s] = why
		} else if s.Through.After(v.watermark) {
			v.watermark = s.Through
		}
		keyIDs[s.KeyID]++
		chains[s.OrgID] = append(chains[s.OrgID], s)
	}
	if len(all) > 0 && len(bad) == len(all) && keyIDs[v.pubID] == 0 {
		v.progress("no seal verifies with the given key %s: the seals name %s", v.pubID, sortedOrgs(keyIDs))
	}

	orgs, err := v.orgs(ctx, chains)
	if err != nil {
		return Report{}, err
	}
	v.progress("verifying %d organization(s) of %s: %d seals, watermark %s, %s",
		len(orgs), db, len(all), fmtTime(v.watermark), v.cuts.summary())
	for _, org := range orgs {
		before := v.rep
		if err := v.org(ctx, org, chains[org], bad); err != nil {
			return v.rep, err
		}
		v.progress("org %q: %d seals, %d sealed events, %d unsealed, %d problems", org,
			v.rep.Seals-before.Seals, v.rep.SealedEvents-before.SealedEvents,
			v.rep.UnsealedEvents-before.UnsealedEvents, len(v.rep.Problems)-len(before.Problems))
	}
	slices.SortStableFunc(v.rep.Problems, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Org, b.Org), cmp.Compare(a.Seal, b.Seal), cmp.Compare(a.ID, b.ID), cmp.Compare(a.Kind, b.Kind))
	})
	return v.rep, nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.UTC().Format(time.RFC3339)
}

func (v *verifier) progress(format string, args ...any) {
	if v.f.Progress != nil {
		fmt.Fprintf(v.f.Progress, "audit verify: "+format+"\n", args...)
	}
}

func (v *verifier) problem(p Problem) {
	key := p
	key.Reason = ""
	if v.seen[key] {
		return
	}
	v.seen[key] = true
	v.rep.Problems = append(v.rep.Problems, p)
}

// orgs lists the organizations to check: those asked for, or every one that has seals,
// entries or events. An organization asked for that has neither seals nor entries is
// an error: there is nothing to verify it against.
func (v *verifier) orgs(ctx context.Context, chains map[string][]*Seal) ([]string, error) {
	withEntries, err := v.distinct(ctx, "seal_entries")
	if err != nil {
		return nil, err
	}
	if v.f.Orgs != nil {
		for _, org := range v.f.Orgs {
			if len(chains[org]) == 0 && !withEntries[org] {
				return nil, fmt.Errorf("organization %q has no seals in %s: nothing to verify it against (is --org right? `bandplane audit seal` seals now)", org, v.db)
			}
		}
		return slices.Compact(slices.Sorted(slices.Values(v.f.Orgs))), nil
	}
	set, err := v.distinct(ctx, "events")
	if err != nil {
		return nil, err
	}
	for org := range withEntries {
		set[org] = true
	}
	for org := range chains {
		set[org] = true
	}
	return sortedOrgs(set), nil
}

func (v *verifier) distinct(ctx context.Context, table string) (map[string]bool, error) {
	rows, err := v.conn.Query(ctx, "SELECT DISTINCT org_id FROM "+v.db+"."+table)
	if err != nil {
		return nil, fmt.Errorf("cannot list the organizations of %s.%s: %w", v.db, table, err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var org string
		if err := rows.Scan(&org); err != nil {
			return nil, err
		}
		out[org] = true
	}
	return out, rows.Err()
}

type sealRef struct {
	seq  uint64
	hash string
}

// org checks one organization: its chain, the roots of its seals, then its entries
// against its rows.
func (v *verifier) org(ctx context.Context, org string, seals []*Seal, bad map[*Seal]string) error {
	known := map[sealRef]*Seal{}
	byHash := map[string]*Seal{}
	bySeq := map[uint64][]*Seal{}
	referenced := map[string]bool{}
	for _, s := range seals {
		known[sealRef{s.Seq, s.Hash}] = s
		byHash[s.Hash] = s
		bySeq[s.Seq] = append(bySeq[s.Seq], s)
		referenced[s.Prev] = true
	}
	for _, s := range seals {
		if why, ok := bad[s]; ok {
			v.problem(Problem{ID: s.ID(), Kind: KindModified, Seal: s.ID(), Org: org, Reason: why})
		}
	}
	// Announced seals: one that is not stored is missing, and so are the seals below it.
	announced, err := v.announced(ctx, org, byHash, referenced)
	if err != nil {
		return err
	}
	// seq 1, 2, … without gaps (up to the highest stored or announced), each linking to
	// a stored seal one lower.
	seqs := slices.Sorted(func(yield func(uint64) bool) {
		for q := range bySeq {
			if !yield(q) {
				return
			}
		}
	})
	if len(seqs) == 0 || announced > seqs[len(seqs)-1] {
		seqs = append(seqs, announced+1) // a sentinel above the highest announced seal
	}
	next := uint64(1)
	for _, q := range seqs {
		if q > next {
			reason := fmt.Sprintf("no seal with seq %d is stored, though a later seal is", next)
			if q-next > 1 {
				reason = fmt.Sprintf("no seals with seq %d to %d are stored, though a later seal is", next, q-1)
			}
			v.problem(Problem{ID: SealID(org, next), Kind: KindMissing, Seal: SealID(org, next), Org: org, Reason: reason})
		}
		next = q + 1
	}
	for _, s := range seals {
		switch {
		case s.Seq == 0:
			v.problem(Problem{ID: s.ID(), Kind: KindModified, Seal: s.ID(), Org: org, Reason: "seq 0: chains start at 1"})
		case s.Seq == 1 && s.Prev != "":
			v.problem(Problem{ID: s.ID(), Kind: KindModified, Seal: s.ID(), Org: org, Reason: "the first seal links to a previous one"})
		case s.Seq > 1:
			p := byHash[s.Prev]
			if p == nil {
				if len(bySeq[s.Seq-1]) > 0 { // a gap is reported above
					v.problem(Problem{ID: SealID(org, s.Seq-1), Kind: KindMissing, Seal: SealID(org, s.Seq-1), Org: org,
						Reason: fmt.Sprintf("seal %d links to seal %s, which is not stored", s.Seq, short(s.Prev))})
				}
			} else if p.Seq != s.Seq-1 {
				v.problem(Problem{ID: s.ID(), Kind: KindModified, Seal: s.ID(), Org: org,
					Reason: fmt.Sprintf("seal %d links to seal %d", s.Seq, p.Seq)})
			}
		}
	}
	if err := v.roots(ctx, org, seals, known, referenced); err != nil {
		return err
	}
	return v.compare(ctx, org, known)
}

// announced checks that every audit.sealed event of the organization names a stored
// seal: removing a seal then means removing its event too, which a later seal covers.
// It returns the highest seq announced.
func (v *verifier) announced(ctx context.Context, org string, byHash map[string]*Seal, referenced map[string]bool) (uint64, error) {
	// A seal written while verify runs, after the seals were read, may be announced by
	// the time the events are: only announcements ingested before then (less a clock
	// skew allowance) must name a seal that was read.
	q, args := v.timeRange("SELECT id, data FROM "+v.db+".events FINAL WHERE org_id = ? AND type = ? AND source LIKE ? AND ingested_at < ?",
		[]any{org, schema.TypeAuditSealed, schema.SourceBandplane + "%", v.now.Add(-announceSkew)})
	rows, err := v.conn.Query(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("cannot read the audit.sealed events of org %q from %s.events: %w", org, v.db, err)
	}
	defer rows.Close()
	var highest uint64
	for rows.Next() {
		var id, data string
		if err := rows.Scan(&id, &data); err != nil {
			return 0, err
		}
		var d SealData
		if json.Unmarshal([]byte(data), &d) != nil || d.Hash == "" || d.Seq == 0 {
			continue // not a seal's announcement; the row itself is checked like any other
		}
		referenced[d.Hash] = true
		if byHash[d.Hash] == nil {
			v.problem(Problem{ID: SealID(org, d.Seq), Kind: KindMissing, Seal: SealID(org, d.Seq), Org: org,
				Reason: fmt.Sprintf("event %s announces seal %s, which is not stored", id, short(d.Hash))})
			highest = max(highest, d.Seq)
		}
	}
	return highest, rows.Err()
}

// timeRange adds the event-time bounds of the filter to a query with a WHERE clause.
func (v *verifier) timeRange(q string, args []any) (string, []any) {
	if !v.f.From.IsZero() {
		q += " AND time >= ?"
		args = append(args, v.f.From.UTC())
	}
	if !v.f.To.IsZero() {
		q += " AND time < ?"
		args = append(args, v.f.To.UTC())
	}
	return q, args
}

func (v *verifier) inRange(s *Seal) bool {
	if !v.f.From.IsZero() && s.LastTime.Before(v.f.From.Truncate(time.Second)) {
		return false
	}
	if !v.f.To.IsZero() && !s.FirstTime.Before(v.f.To) {
		return false
	}
	return true
}

// roots recomputes the root of every seal in range from its stored entries, reading
// them in stretches of seq of at most windowRows entries.
func (v *verifier) roots(ctx context.Context, org string, seals []*Seal, known map[sealRef]*Seal, referenced map[string]bool) error {
	var scope []*Seal
	for _, s := range seals {
		if v.inRange(s) {
			scope = append(scope, s)
		}
	}
	v.rep.Seals += len(scope)
	slices.SortFunc(scope, func(a, b *Seal) int { return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Hash, b.Hash)) })
	checked := map[*Seal]bool{}
	orphans := 0
	for i := 0; i < len(scope); {
		j, n := i, uint64(0)
		for j < len(scope) && (j == i || n+scope[j].Events <= windowRows) {
			n += scope[j].Events
			j++
		}
		lo, hi := scope[i].Seq, scope[j-1].Seq
		rows, err := v.conn.Query(ctx, `SELECT seq, seal, id, time, time_ms, digest FROM `+v.db+`.seal_entries FINAL
			WHERE org_id = ? AND seq >= ? AND seq <= ? ORDER BY seq, seal`, org, lo, hi)
		if err != nil {
			return fmt.Errorf("cannot read the entries of org %q seals %d to %d from %s.seal_entries: %w", org, lo, hi, v.db, err)
		}
		var cur sealRef
		var entries []Entry
		var corrupt int
		finish := func() {
			if cur.hash == "" && cur.seq == 0 {
				return
			}
			s := known[cur]
			switch {
			case s == nil && referenced[cur.hash]:
				v.problem(Problem{ID: SealID(org, cur.seq), Kind: KindMissing, Seal: SealID(org, cur.seq), Org: org,
					Reason: fmt.Sprintf("%d entries of seal %s are stored, but not the seal", len(entries), short(cur.hash))})
			case s == nil:
				// Entries written by a sealer that stopped before writing their seal:
				// nothing refers to them, and their events are sealed again.
				orphans += len(entries)
			case v.inRange(s):
				v.checkRoot(s, entries, corrupt)
				checked[s] = true
			}
			entries, corrupt = entries[:0], 0
		}
		for rows.Next() {
			var ref sealRef
			var e Entry
			var t time.Time
			var millis uint16
			var digest string
			if err := rows.Scan(&ref.seq, &ref.hash, &e.ID, &t, &millis, &digest); err != nil {
				rows.Close()
				return fmt.Errorf("cannot read a row of %s.seal_entries: %w", v.db, err)
			}
			if ref != cur {
				finish()
				cur = ref
			}
			e.Time = t.UTC().Add(time.Duration(millis) * time.Millisecond)
			var ok bool
			if e.Digest, ok = parseDigest(digest); !ok {
				corrupt++
			}
			entries = append(entries, e)
		}
		finish()
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("cannot read %s.seal_entries: %w", v.db, err)
		}
		i = j
	}
	for _, s := range scope {
		if !checked[s] {
			v.checkRoot(s, nil, 0)
		}
	}
	if orphans > 0 {
		v.progress("org %q: %d entries belong to no stored seal (left by a sealer that stopped half-way; ignored)", org, orphans)
	}
	return nil
}

func (v *verifier) checkRoot(s *Seal, entries []Entry, corrupt int) {
	fail := func(reason string) {
		v.problem(Problem{ID: s.ID(), Kind: KindModified, Seal: s.ID(), Org: s.OrgID, Reason: reason})
	}
	if corrupt > 0 {
		fail(fmt.Sprintf("%d of its entries hold no valid digest", corrupt))
		return
	}
	if uint64(len(entries)) != s.Events {
		fail(fmt.Sprintf("%d entries are stored, the seal covers %d", len(entries), s.Events))
		return
	}
	if Root(entries) != s.Root {
		fail("its stored entries do not match its root")
		return
	}
	first, last := entries[0].Time.Truncate(time.Second), entries[0].Time.Truncate(time.Second)
	for _, e := range entries {
		t := e.Time.Truncate(time.Second)
		if t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	if !first.Equal(s.FirstTime) || !last.Equal(s.LastTime) {
		fail("its entries' times do not match its first and last time")
	}
}

type entryRef struct {
	digest  store.Digest
	seal    *Seal
	matched bool
}

// compare walks the organization's events and entries window by window of event time.
func (v *verifier) compare(ctx context.Context, org string, known map[sealRef]*Seal) error {
	windows, err := v.windows(ctx, org)
	if err != nil {
		return err
	}
	for _, w := range windows {
		if err := v.compareWindow(ctx, org, known, w[0], w[1]); err != nil {
			return err
		}
	}
	return nil
}

// windows groups the days that hold the organization's events or entries into
// stretches of at most windowRows rows (a day with more is a window of its own).
func (v *verifier) windows(ctx context.Context, org string) ([][2]time.Time, error) {
	perDay := map[time.Time]uint64{}
	for _, table := range []string{"events", "seal_entries"} {
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
			d = time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
			perDay[d] += n
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

func (v *verifier) compareWindow(ctx context.Context, org string, known map[sealRef]*Seal, from, to time.Time) error {
	refs := map[rowKey][]*entryRef{}
	rows, err := v.conn.Query(ctx, `SELECT seq, seal, id, time, digest FROM `+v.db+`.seal_entries FINAL
		WHERE org_id = ? AND time >= ? AND time < ?`, org, from, to)
	if err != nil {
		return fmt.Errorf("cannot read the entries of org %q from %s.seal_entries: %w", org, v.db, err)
	}
	for rows.Next() {
		var ref sealRef
		var k rowKey
		var t time.Time
		var digest string
		if err := rows.Scan(&ref.seq, &ref.hash, &k.id, &t, &digest); err != nil {
			rows.Close()
			return fmt.Errorf("cannot read a row of %s.seal_entries: %w", v.db, err)
		}
		s := known[ref]
		if s == nil {
			continue // belongs to no stored seal: see roots
		}
		k.org, k.sec = org, t.Unix()
		d, _ := parseDigest(digest) // a bad digest fails its seal's root and matches no row
		refs[k] = append(refs[k], &entryRef{digest: d, seal: s})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read %s.seal_entries: %w", v.db, err)
	}

	rows, err = v.conn.Query(ctx, "SELECT "+eventCols+" FROM "+v.db+".events FINAL WHERE org_id = ? AND time >= ? AND time < ?", org, from, to)
	if err != nil {
		return fmt.Errorf("cannot read the events of org %q from %s.events: %w", org, v.db, err)
	}
	var r store.EventRow
	future := v.now.Add(v.f.Margin)
	var overdue time.Time
	if !v.watermark.IsZero() {
		overdue = v.watermark.Add(-v.f.Margin)
	}
	for rows.Next() {
		if err := scanEvent(rows, &r); err != nil {
			rows.Close()
			return fmt.Errorf("cannot read a row of %s.events: %w", v.db, err)
		}
		k := keyOf(&r)
		es := refs[k]
		if len(es) == 0 {
			switch {
			case r.IngestedAt.After(future):
				v.problem(Problem{ID: r.ID, Kind: KindUnexpected, Org: org,
					Reason: fmt.Sprintf("in no seal, and ingested_at %s is in the future", fmtTime(r.IngestedAt))})
			case r.IngestedAt.Before(overdue):
				v.problem(Problem{ID: r.ID, Kind: KindUnexpected, Org: org,
					Reason: fmt.Sprintf("in no seal, though ingested at %s, before the trail was sealed through %s", fmtTime(r.IngestedAt), fmtTime(v.watermark))})
			default:
				v.rep.UnsealedEvents++
			}
			continue
		}
		d := r.SealDigest()
		for _, e := range es {
			e.matched = true
			if e.digest != d {
				v.problem(Problem{ID: r.ID, Kind: KindModified, Seal: e.seal.ID(), Org: org,
					Reason: fmt.Sprintf("the row at %s differs from what seal %s sealed", r.Time.UTC().Format(time.RFC3339Nano), short(e.seal.Hash))})
			}
		}
		v.rep.SealedEvents++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read %s.events: %w", v.db, err)
	}
	for k, es := range refs {
		expired := false
		for _, e := range es {
			if e.matched {
				continue
			}
			t := time.Unix(k.sec, 0).UTC()
			why := v.cuts.excuse(t, e.seal)
			if why == "" {
				expired = true
				continue
			}
			v.problem(Problem{ID: k.id, Kind: KindMissing, Seal: e.seal.ID(), Org: org,
				Reason: fmt.Sprintf("the row at %s that seal %s sealed is gone (%s)", t.Format(time.RFC3339), short(e.seal.Hash), why)})
		}
		if expired {
			v.rep.ExpiredEvents++
		}
	}
	return nil
}
