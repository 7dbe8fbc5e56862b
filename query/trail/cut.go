package trail

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/tlog"
)

// CutContent is what the signature of a retention cut covers: under a version label,
// the deployment (database and origin prefix), the table, before and at (Unix
// seconds) and the number of partitions dropped, strings length-prefixed. Binding the
// deployment keeps a cut signed for one database from excusing deletions in another
// that shares the audit key. Part of the trail's format.
func CutContent(db, prefix string, c *chdb.Cut) []byte {
	b := make([]byte, 0, 128)
	b = appendString(b, "bandplane.retention-cut.v2")
	b = appendString(b, db)
	b = appendString(b, prefix)
	b = appendString(b, c.Table)
	b = binary.BigEndian.AppendUint64(b, uint64(c.Before.Unix()))
	b = binary.BigEndian.AppendUint64(b, uint64(c.At.Unix()))
	b = binary.BigEndian.AppendUint64(b, c.Partitions)
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// CutSigner is the chdb.RetentionOptions.Sign of the audit key for the deployment of
// db with origin prefix: it fills a cut's KeyID and Signature.
func CutSigner(key ed25519.PrivateKey, db, prefix string) func(*chdb.Cut) {
	id := tlog.KeyID(key.Public().(ed25519.PublicKey))
	return func(c *chdb.Cut) {
		c.KeyID = id
		c.Signature = hex.EncodeToString(ed25519.Sign(key, CutContent(db, prefix, c)))
	}
}

// checkCut says why verify does not honour a cut, or "": it must be signed, for this
// deployment, by a key of the ring valid when the cut was made.
func checkCut(c *chdb.Cut, db string, ring *tlog.KeyRing) string {
	if c.Signature == "" {
		return "unsigned (bandplane retention ran without --audit-key)"
	}
	sig, err := hex.DecodeString(c.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "its signature is not a hex Ed25519 signature"
	}
	pub, why := ring.Trusted(c.KeyID, c.At)
	if why != "" {
		return why
	}
	if !ed25519.Verify(pub, CutContent(db, ring.Prefix(), c), sig) {
		return fmt.Sprintf("its signature does not verify with key %s for database %s and origin prefix %s", c.KeyID, db, ring.Prefix())
	}
	return ""
}

// cutSkew is how far the clock of the host that ran bandplane retention (a cut's at)
// may be behind the sealer's (a checkpoint's timestamp).
const cutSkew = 30 * time.Second

type ignoredCut struct {
	cut chdb.Cut
	why string
}

// cuts are the retention cuts of the events table as verify sees them.
type cuts struct {
	honoured  []chdb.Cut  // signed for this deployment, by at
	maxBefore []time.Time // maxBefore[i]: the latest before among honoured[i:]
	ignored   []ignoredCut
	present   map[uint32]bool // days (YYYYMMDD) before the latest honoured cut that still hold a row
}

// loadCuts reads the cuts of the events table, keeps those checkCut honours, and reads
// which days they cover still hold rows.
func loadCuts(ctx context.Context, conn driver.Conn, db string, ring *tlog.KeyRing) (cuts, error) {
	all, err := chdb.RetentionCuts(ctx, conn, db, "events")
	if err != nil {
		return cuts{}, err
	}
	var c cuts
	for _, cut := range all {
		if why := checkCut(&cut, db, ring); why != "" {
			c.ignored = append(c.ignored, ignoredCut{cut: cut, why: why})
			continue
		}
		c.honoured = append(c.honoured, cut)
	}
	if len(c.honoured) == 0 {
		return c, nil
	}
	slices.SortStableFunc(c.honoured, func(a, b chdb.Cut) int { return a.At.Compare(b.At) })
	c.maxBefore = make([]time.Time, len(c.honoured))
	var latest time.Time
	for i := len(c.honoured) - 1; i >= 0; i-- {
		if c.honoured[i].Before.After(latest) {
			latest = c.honoured[i].Before
		}
		c.maxBefore[i] = latest
	}
	// Partition pruning on time keeps this to the days before the cut, which retention
	// dropped: normally none are left.
	rows, err := conn.Query(ctx, "SELECT DISTINCT toYYYYMMDD(time) FROM "+db+".events WHERE time < ?", latest.UTC())
	if err != nil {
		return cuts{}, fmt.Errorf("cannot list the days of %s.events before the retention cut %s: %w", db, fmtTime(latest), err)
	}
	defer rows.Close()
	c.present = map[uint32]bool{}
	for rows.Next() {
		var d uint32
		if err := rows.Scan(&d); err != nil {
			return cuts{}, fmt.Errorf("cannot read a day of %s.events: %w", db, err)
		}
		c.present[d] = true
	}
	return c, rows.Err()
}

func yyyymmdd(t time.Time) uint32 {
	t = t.UTC()
	return uint32(t.Year()*10000 + int(t.Month())*100 + t.Day())
}

// excuse says why the sealed event at t, sealed at sealedAt (the timestamp of the first
// checkpoint that covers its leaf), whose row is gone is missing, or "" when it
// expired: an honoured cut recorded after it was sealed covers t, and no row of t's
// day is left (retention drops whole days; a DELETE leaves the day's other rows).
func (c *cuts) excuse(t, sealedAt time.Time) string {
	i := sort.Search(len(c.honoured), func(i int) bool { return !c.honoured[i].At.Before(sealedAt.Add(-cutSkew)) })
	if i < len(c.honoured) && t.Before(c.maxBefore[i]) {
		if c.present[yyyymmdd(t)] {
			return fmt.Sprintf("a retention cut covers its time, but rows of its day %s are still stored: retention drops whole days", t.UTC().Format(time.DateOnly))
		}
		return ""
	}
	if i > 0 && t.Before(c.maxBefore[0]) {
		return "the retention cuts that cover its time were recorded before it was sealed"
	}
	for _, ig := range c.ignored {
		if t.Before(ig.cut.Before) {
			return fmt.Sprintf("the retention cut recorded at %s that covers its time is ignored: %s", fmtTime(ig.cut.At), ig.why)
		}
	}
	return "no retention cut covers its time"
}

func (c *cuts) summary() string {
	s := fmt.Sprintf("%d retention cut(s) signed for this deployment", len(c.honoured))
	if len(c.honoured) > 0 {
		s += ", the latest before " + fmtTime(c.maxBefore[0])
	}
	if len(c.ignored) > 0 {
		s += fmt.Sprintf(", %d ignored (the first: %s)", len(c.ignored), c.ignored[0].why)
	}
	return s
}

// SealedIn counts the sealed events (distinct row keys of log_leaves) whose time lies
// in the given daily partitions (YYYYMMDD) of events: those verify reports missing once
// the partitions are dropped under a cut it does not honour.
func SealedIn(ctx context.Context, conn driver.Conn, db string, partitions []string) (uint64, error) {
	if !identRe.MatchString(db) {
		return 0, fmt.Errorf("database %q is not a plain identifier", db)
	}
	if len(partitions) == 0 {
		return 0, nil
	}
	var n uint64
	// A bound []string is an array literal: has() takes it on 18.16, IN does not.
	if err := conn.QueryRow(ctx, "SELECT uniqExact(org_id, id, time) FROM "+db+".log_leaves WHERE has(?, toString(toYYYYMMDD(time)))",
		partitions).Scan(&n); err != nil {
		return 0, fmt.Errorf("cannot count the sealed events of %d partitions in %s.log_leaves: %w", len(partitions), db, err)
	}
	return n, nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.UTC().Format(time.RFC3339)
}
