// Package seal owns the tamper-evident audit trail: sealing what ingest stored in the
// events table into signed, chained seals, and verifying the trail against them
// (CloudTrail's log-file validation is the model).
//
// # Seals
//
// Each organization (org_id "" too) has a chain of seals, seq 1, 2, …. A seal covers a
// set of event rows: seal_entries holds each row's key (org, time, id) and the
// SealDigest of its content as sealed; the seal's root is a hash over those entries
// (Root), prev is the previous seal's hash, hash is the SHA-256 of the seal's content
// (Content) and signature is the Ed25519 signature of that content with the audit key.
//
// # Announcements
//
// A seal is also produced to Kafka as an audit.sealed event (source bandplane-audit)
// carrying every field, so the chain can be checked from the topic alone, and verify
// reports a seal that an audit.sealed event names but the seals table lacks. Those
// events land in the trail and are sealed in their turn — but a seal whose entries
// are all audit.sealed events is not announced: the chain already authenticates them
// (each names a seal verify checks), and announcing it would give the next run a new
// row to seal, and so on, one seal per run forever on an idle trail. So an idle trail
// converges: the run after a burst seals its announcements, silently, and the runs
// after that find nothing. Such a seal is stored, chained and signed like any other;
// only the topic does not show it (Result.Unannounced counts them), so the newest
// seal that verify can miss (see below) may be one of those.
//
// # What a run seals
//
// A run takes W = the database's now() − Settle and seals the event rows whose
// ingested_at lies in [L − lookback, W), where L is the latest through of any seal,
// less those already sealed. The rows are read in chunks of ingested_at (at most
// MaxEntries rows and Margin/2 of ingested_at each, so memory is bounded), in order.
// The seals of a chunk claim through = the chunk's start, except the last one written,
// which claims its end once every organization of the chunk is sealed. So at any time
// every stored row ingested before the latest through is sealed, however a run (or
// several sealers at once) stopped, and a run only has to look back for rows that
// landed late.
//
// Ingest stamps ingested_at at each insert attempt, so a row lands a few seconds
// after its ingested_at. It does not write a replayed or redelivered event that is
// already stored, but it may store a row again: a batch insert retried after one of
// its tables failed, or bisected after ClickHouse refused a record, inserts the
// batch's event rows again, same content, newer ingested_at (a retry after a long
// back-off may come minutes later). A copy that lands before its row is sealed is
// the same candidate; one that lands after is found among the entries of recent
// seals and skipped, or, when the seal holding the first copy is older than the
// stretch of ingest the run reads (sealedKeys), sealed again: two equal entries of
// one row key. Verify reads events FINAL, one row per key, which matches both
// entries and counts once.
//
// The lookback is 2·Settle, except for one run every Margin/2 (and the first run of
// a process, the run after a failed one, and every SealNow), which looks back the
// whole Margin (10 min): a row that lands up to Margin/2 after its ingested_at (a slow
// insert, clock skew between an ingest host and ClickHouse) is still sealed, and
// verify never calls it unexpected meanwhile.
//
// # Concurrent sealers
//
// ClickHouse has no transactions and no lock that excludes a paused process, so
// instead of a lock two sealers running at once are made harmless. Seals are keyed by
// (org_id, seq, hash) and entries by their seal's hash, so two seals made at once with
// the same seq are stored side by side (a fork) instead of mixing; both are signed, link
// to a stored seal, and each one's entries match its root, so verify accepts them. An
// event sealed by both has two equal entries. The next seal links to the head with the
// smaller hash, so sealers converge. A sealer re-reads its head before writing each seal
// and starts over if another sealer moved it, which makes forks rare; identical seals
// (Ed25519 is deterministic) collapse into one row.
//
// # Verify
//
// Verify checks each chain (hash and signature of every seal, prev links, seq without
// gaps), recomputes each seal's root from its entries, and compares every entry with
// the row in events FINAL: a row that is gone is missing, a row whose digest differs is
// modified, and a row in no seal is unexpected when it was ingested before the
// watermark less Margin (or more than Margin in the future) — otherwise it is merely
// not sealed yet.
//
// # Export
//
// GET /v1/audit/export takes a selection of the sealed trail away with the seals and
// entries that prove it and a signed manifest: see ExportFormat (export.go).
//
// # Retention
//
// `bandplane retention` drops whole daily partitions of events and records each run's
// cut in retention_cuts (chdb.ApplyRetention): every row it dropped was older than
// before. Given the audit key (--audit-key, env BANDPLANE_AUDIT_KEY) it signs the cut
// (CutSigner: Ed25519 over CutContent — table, before, at, partitions). Verify
// honours only cuts whose signature verifies with the key it was given, and a sealed
// event whose row is gone is expired, not missing, only when an honoured cut covers
// its time, that cut was recorded after the event's seal (less 30 s of clock skew),
// and no row of the event's day (its toYYYYMMDD(time) partition) is left in events:
// retention drops whole days, a DELETE leaves the day's other rows. Everything else
// stays missing, and the problem's reason says which condition failed. Without the
// key retention still drops and records an unsigned cut, and warns that verify will
// report the sealed events it dropped as missing: an unsigned cut is exactly what a
// forger could insert by hand, so verify cannot tell them apart.
//
// What it cannot see: a row inserted with a recent ingested_at is sealed like any
// other; the newest seal and the rows after it can be removed together with its
// audit.sealed event, if it had one (compare the chain head with the topic or an
// earlier verify); a whole day removed under a signed cut that covers it reads as
// expired, but the retention run that made the cut dropped every such day anyway.
package seal

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bandplane/bandplane/ingest/store"
	"github.com/bandplane/bandplane/schema"
)

// Defaults of Config.
const (
	DefaultEvery      = time.Minute
	DefaultSettle     = 10 * time.Second
	DefaultMargin     = 10 * time.Minute
	DefaultMaxEntries = 100_000
)

// Source is the source of the audit.sealed events.
const Source = schema.SourceBandplane + "-audit"

// Producer writes audit events (ingest/kafka.Producer implements it). Produce blocks
// until every event is acknowledged, or returns an error (some may have been written;
// the call is retried whole, which the event ids make harmless).
type Producer interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// Config configures a Sealer.
type Config struct {
	Conn     driver.Conn
	Database string
	Key      ed25519.PrivateKey
	Producer Producer // the audit.sealed events
	Every    time.Duration
	// Settle is how long after its ingested_at a row is expected to be stored; rows
	// ingested in the last Settle wait for the next run.
	Settle time.Duration
	// Margin is how far before the last watermark a run looks again, every Margin/2,
	// for rows that landed later than Settle: a row may land up to Margin/2 after its
	// ingested_at. Verify must use the same margin (or a larger one).
	Margin     time.Duration
	MaxEntries int // entries per seal (a run makes as many seals as it needs)
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: no metrics
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports every problem of the config at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Conn == nil {
		errs = append(errs, errors.New("seal: no clickhouse connection"))
	}
	if !identRe.MatchString(c.Database) {
		errs = append(errs, fmt.Errorf("seal: database %q is not a plain identifier", c.Database))
	}
	if len(c.Key) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("seal: no Ed25519 private key (--audit-key)"))
	}
	if c.Producer == nil {
		errs = append(errs, errors.New("seal: no producer for the audit.sealed events"))
	}
	if c.Every < 0 || c.Every > 0 && c.Every < time.Second {
		errs = append(errs, fmt.Errorf("seal: --seal-every must be at least 1s, got %s", c.Every))
	}
	if c.Settle < 0 {
		errs = append(errs, fmt.Errorf("seal: settle must not be negative, got %s", c.Settle))
	}
	if c.Margin < 0 || c.Margin > 0 && c.Margin < 2*time.Second {
		errs = append(errs, fmt.Errorf("seal: margin must be at least 2s, got %s", c.Margin))
	}
	if c.MaxEntries < 0 {
		errs = append(errs, fmt.Errorf("seal: max entries must not be negative, got %d", c.MaxEntries))
	}
	return errors.Join(errs...)
}

// Sealer seals the audit trail of one database.
type Sealer struct {
	cfg      Config
	pub      ed25519.PublicKey
	log      *slog.Logger
	m        *metrics
	pending  []schema.Event // audit.sealed events not yet acknowledged by Kafka
	lastFull time.Time      // when a run last looked back the whole Margin; zero: the next one must
}

// maxPending bounds the audit.sealed events kept for a later attempt while Kafka is
// down; one that is dropped costs nothing but its announcement (the seal is stored).
const maxPending = 10_000

func New(cfg Config) (*Sealer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Margin == 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pub := cfg.Key.Public().(ed25519.PublicKey)
	return &Sealer{cfg: cfg, pub: pub, log: log.With("component", "sealer", "key_id", KeyID(pub)), m: newMetrics(cfg.Registerer)}, nil
}

// Result says what one SealNow did.
type Result struct {
	Seals   int       `json:"seals"`
	Events  int       `json:"events"`
	Orgs    int       `json:"orgs"`
	Through time.Time `json:"through,omitzero"` // the latest through written
	Emitted int       `json:"emitted"`          // audit.sealed events acknowledged
	Retries int       `json:"retries"`          // starts over because another sealer moved a head
	// Unannounced counts the seals made without an audit.sealed event: those whose
	// entries are all audit.sealed events (package doc, "Announcements").
	Unannounced int `json:"unannounced"`
}

// Run seals every Every (the first time at once) until ctx ends, then once more
// without settle — the caller stops ingest first, so that seal covers its last flush —
// and returns that seal's error.
func (s *Sealer) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	s.runOnce(ctx, s.cfg.Settle)
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			// No settle: up to the end of the current second. A row of another process
			// that lands later with an earlier ingested_at is within the next run's margin.
			return s.runOnce(final, -time.Second)
		case <-t.C:
			s.runOnce(ctx, s.cfg.Settle)
		}
	}
}

func (s *Sealer) runOnce(ctx context.Context, settle time.Duration) error {
	res, err := s.seal(ctx, settle, false)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("cannot seal the audit trail", "err", err, "seals", res.Seals)
		}
		return err
	}
	if res.Seals > 0 {
		s.log.Info("sealed the audit trail", "seals", res.Seals, "unannounced", res.Unannounced, "events", res.Events, "orgs", res.Orgs, "through", res.Through)
	}
	return nil
}

// SealNow seals what was ingested up to Settle ago, looking back the whole Margin for
// rows that landed late (an operator's `audit seal` is thorough, not cheap), and
// produces the audit.sealed events (with those a failed earlier call could not).
func (s *Sealer) SealNow(ctx context.Context) (Result, error) { return s.seal(ctx, s.cfg.Settle, true) }

var errHeadMoved = errors.New("another sealer moved the chain head")

const maxAttempts = 5

func (s *Sealer) seal(ctx context.Context, settle time.Duration, thorough bool) (Result, error) {
	start := time.Now()
	var res Result
	var events []schema.Event
	// Most runs look back only 2·Settle before the watermark; a run every Margin/2 (and
	// the first of the process, and the one after a failure) looks back the whole
	// Margin for rows that landed late. Re-reading Margin of ingest every run would
	// cost Margin/Every times the rows that are new.
	full := thorough || s.lastFull.IsZero() || time.Since(s.lastFull) >= s.cfg.Margin/2
	lookback := 2 * s.cfg.Settle
	if full {
		lookback = s.cfg.Margin
	}
	var err error
	for attempt := 1; ; attempt++ {
		var made []schema.Event
		made, err = s.attempt(ctx, settle, lookback, &res)
		events = append(events, made...)
		if !errors.Is(err, errHeadMoved) {
			break
		}
		res.Retries++
		err = nil
		if attempt == maxAttempts {
			// The other sealer is doing the work; what is left is sealed next time.
			s.log.Info("another sealer keeps sealing; leaving the rest to it", "attempts", attempt)
			break
		}
	}
	switch {
	case err != nil:
		s.lastFull = time.Time{} // a chunk may be half sealed: look back whole next time
	case full:
		s.lastFull = start
	}
	s.m.observe(res, err, time.Since(start))
	s.pending = append(s.pending, events...)
	if over := len(s.pending) - maxPending; over > 0 {
		s.log.Warn("dropping audit.sealed events that kafka did not take (their seals are stored)", "dropped", over)
		s.pending = slices.Delete(s.pending, 0, over)
	}
	if len(s.pending) > 0 {
		if perr := s.cfg.Producer.Produce(ctx, s.pending); perr != nil {
			s.m.errors.Inc()
			err = errors.Join(err, fmt.Errorf("cannot produce %d audit.sealed events (their seals are stored; retried at the next seal): %w", len(s.pending), perr))
		} else {
			res.Emitted = len(s.pending)
			s.pending = nil
		}
	}
	return res, err
}

// chunk is a stretch [start, end) of ingested_at, in Unix seconds, and the event times
// of its rows.
type chunk struct {
	start, end int64
	tmin, tmax time.Time
	rows       uint64
}

// attempt makes one pass over the window; it stops with errHeadMoved when another
// sealer sealed in between (the seals made so far are stored and returned).
func (s *Sealer) attempt(ctx context.Context, settle, lookback time.Duration, res *Result) ([]schema.Event, error) {
	conn, db := s.cfg.Conn, s.cfg.Database
	now, err := serverNow(ctx, conn)
	if err != nil {
		return nil, err
	}
	hs, watermark, err := heads(ctx, conn, db)
	if err != nil {
		return nil, err
	}
	hi := now.Add(-settle).Unix()
	lo := int64(0)
	if !watermark.IsZero() {
		lo = max(0, watermark.Add(-lookback).Unix())
	}
	if lo >= hi {
		return nil, nil
	}
	chunks, err := s.plan(ctx, lo, hi)
	if err != nil {
		return nil, err
	}
	var out []schema.Event
	orgs := map[string]bool{}
	for _, c := range chunks {
		entries, quiet, err := s.candidates(ctx, c)
		if err != nil {
			return out, err
		}
		chunkOrgs := slices.Sorted(maps.Keys(entries))
		for oi, org := range chunkOrgs {
			es := entries[org]
			slices.SortFunc(es, compareEntries)
			for len(es) > 0 {
				n := min(len(es), s.cfg.MaxEntries)
				// through claims that every row ingested before it is sealed. The seals
				// of a chunk claim its start (earlier chunks are finished, for every
				// organization); only the last one written claims the chunk's end, once
				// the whole chunk is sealed. A run that stops inside a chunk thus never
				// claims rows of the organizations it did not get to.
				through := c.start
				if oi == len(chunkOrgs)-1 && n == len(es) {
					through = c.end
				}
				h := hs[org]
				cur, err := orgHead(ctx, conn, db, org)
				if err != nil {
					return out, err
				}
				if cur != h {
					return out, errHeadMoved
				}
				sl := &Seal{OrgID: org, Seq: h.seq + 1, Prev: h.hash, SealedAt: now, Through: time.Unix(through, 0).UTC(), Events: uint64(n)}
				part := es[:n]
				sl.FirstTime, sl.LastTime = part[0].Time.Truncate(time.Second), part[0].Time.Truncate(time.Second)
				for i := range part {
					t := part[i].Time.Truncate(time.Second)
					if t.Before(sl.FirstTime) {
						sl.FirstTime = t
					}
					if t.After(sl.LastTime) {
						sl.LastTime = t
					}
				}
				sl.Root = Root(part)
				sl.sign(s.cfg.Key)
				if err := writeSeal(ctx, conn, db, sl, part); err != nil {
					return out, err
				}
				hs[org] = head{seq: sl.Seq, hash: sl.Hash}
				if announces(org, part, quiet) {
					out = append(out, sealEvent(sl))
				} else {
					res.Unannounced++
				}
				res.Seals++
				res.Events += n
				if sl.Through.After(res.Through) {
					res.Through = sl.Through
				}
				orgs[org] = true
				res.Orgs = len(orgs)
				es = es[n:]
			}
		}
	}
	return out, nil
}

// plan splits [lo, hi) into chunks of at most MaxEntries rows and Margin/2 of
// ingested_at (a single second may hold more rows than MaxEntries: then it is a chunk
// of its own, sealed in several seals). Only stretches that hold rows are returned.
func (s *Sealer) plan(ctx context.Context, lo, hi int64) ([]chunk, error) {
	maxSpan := max(1, int64(s.cfg.Margin/time.Second)/2)
	width := max(1, min(maxSpan, (hi-lo+999)/1000))
	rows, err := s.cfg.Conn.Query(ctx, `SELECT intDiv(toUInt32(ingested_at), ?) AS b, count(), min(time), max(time)
		FROM `+s.cfg.Database+`.events WHERE ingested_at >= ? AND ingested_at < ? GROUP BY b ORDER BY b`,
		uint32(width), time.Unix(lo, 0).UTC(), time.Unix(hi, 0).UTC())
	if err != nil {
		return nil, fmt.Errorf("cannot count the rows ingested into %s.events in [%s, %s): %w", s.cfg.Database,
			time.Unix(lo, 0).UTC().Format(time.RFC3339), time.Unix(hi, 0).UTC().Format(time.RFC3339), err)
	}
	type bucket struct {
		b          uint32
		n          uint64
		tmin, tmax time.Time
	}
	var bs []bucket
	for rows.Next() {
		var b bucket
		if err := rows.Scan(&b.b, &b.n, &b.tmin, &b.tmax); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cannot read the ingest histogram of %s.events: %w", s.cfg.Database, err)
		}
		bs = append(bs, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []chunk
	var cur *chunk
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	for _, b := range bs {
		bs, be := max(lo, int64(b.b)*width), min(hi, (int64(b.b)+1)*width)
		if b.n > uint64(s.cfg.MaxEntries) && be-bs > 1 {
			flush()
			sub, err := s.plan(ctx, bs, be)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
			continue
		}
		if cur != nil && (cur.rows+b.n > uint64(s.cfg.MaxEntries) || be-cur.start > maxSpan) {
			flush()
		}
		if cur == nil {
			cur = &chunk{start: bs, tmin: b.tmin.UTC(), tmax: b.tmax.UTC()}
		}
		cur.end, cur.rows = be, cur.rows+b.n
		if b.tmin.Before(cur.tmin) {
			cur.tmin = b.tmin.UTC()
		}
		if b.tmax.After(cur.tmax) {
			cur.tmax = b.tmax.UTC()
		}
	}
	flush()
	return out, nil
}

// announces says whether the seal of org over entries gets an audit.sealed event: not
// when every entry is itself an audit.sealed event. The chain authenticates those (each
// names a seal that verify checks), and announcing their seal would give the next run
// a new row to seal, and so on: an idle trail would get a seal every run forever.
func announces(org string, entries []Entry, quiet map[rowKey]bool) bool {
	for i := range entries {
		if !quiet[rowKey{org: org, id: entries[i].ID, sec: entries[i].Time.Unix()}] {
			return true
		}
	}
	return false
}

// isAnnouncement says whether a row is an audit.sealed event of a sealer.
func isAnnouncement(r *store.EventRow) bool {
	return r.Type == schema.TypeAuditSealed && r.Source == Source
}

type candidate struct {
	entry    Entry
	quiet    bool // the row is an audit.sealed event (isAnnouncement)
	conflict bool // another copy of the row has other content
}

// candidates reads the rows of a chunk that no seal covers yet, by organization, and
// the keys of those that are audit.sealed events. It reads without FINAL (FINAL would
// merge every row of the chunk's days) and keeps one copy of each row key; when copies
// differ, FINAL decides, as verify will see it.
func (s *Sealer) candidates(ctx context.Context, c chunk) (map[string][]Entry, map[rowKey]bool, error) {
	conn, db := s.cfg.Conn, s.cfg.Database
	sealed, err := sealedKeys(ctx, conn, db, c.start)
	if err != nil {
		return nil, nil, err
	}
	rows, err := conn.Query(ctx, "SELECT "+eventCols+" FROM "+db+".events WHERE ingested_at >= ? AND ingested_at < ? AND time >= ? AND time <= ?",
		time.Unix(c.start, 0).UTC(), time.Unix(c.end, 0).UTC(), c.tmin, c.tmax)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot read the rows ingested into %s.events in [%s, %s): %w", db,
			time.Unix(c.start, 0).UTC().Format(time.RFC3339), time.Unix(c.end, 0).UTC().Format(time.RFC3339), err)
	}
	cands := make(map[rowKey]*candidate, c.rows)
	var r store.EventRow
	for rows.Next() {
		if err := scanEvent(rows, &r); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("cannot read a row of %s.events: %w", db, err)
		}
		k := keyOf(&r)
		if sealed[k] {
			continue
		}
		d := r.SealDigest()
		if prev, ok := cands[k]; ok {
			if prev.entry.Digest != d {
				prev.conflict = true
			}
			continue
		}
		cands[k] = &candidate{entry: Entry{Time: r.Time, ID: r.ID, Digest: d}, quiet: isAnnouncement(&r)}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("cannot read the rows of %s.events: %w", db, err)
	}
	for k, cand := range cands {
		if !cand.conflict {
			continue
		}
		e, quiet, ok, err := finalRow(ctx, conn, db, k)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			delete(cands, k)
			continue
		}
		cand.entry, cand.quiet = e, quiet
	}
	out := map[string][]Entry{}
	quiet := map[rowKey]bool{}
	for k, cand := range cands {
		out[k.org] = append(out[k.org], cand.entry)
		if cand.quiet {
			quiet[k] = true
		}
	}
	return out, quiet, nil
}

// sealedKeys are the row keys in seals that may hold rows ingested at or after from.
// A run seals only rows with ingested_at < its sealed_at − settle (settle ≥ −1 s), both
// on the database's clock as far as the comparison goes, so such a seal has
// sealed_at ≥ from − 1 s: the lookup reads the entries of the last runs only. A row
// stored again later with a new ingested_at (an insert retried or bisected, see the
// package doc) whose first seal is older is sealed again: two equal entries, which
// verify accepts.
func sealedKeys(ctx context.Context, conn driver.Conn, db string, from int64) (map[rowKey]bool, error) {
	rows, err := conn.Query(ctx, `SELECT org_id, id, time FROM `+db+`.seal_entries
		WHERE (org_id, seq, seal) IN (SELECT org_id, seq, hash FROM `+db+`.seals WHERE sealed_at >= ?)`, time.Unix(from-2, 0).UTC())
	if err != nil {
		return nil, fmt.Errorf("cannot read the recent entries of %s.seal_entries: %w", db, err)
	}
	defer rows.Close()
	out := map[rowKey]bool{}
	for rows.Next() {
		var k rowKey
		var t time.Time
		if err := rows.Scan(&k.org, &k.id, &t); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.seal_entries: %w", db, err)
		}
		k.sec = t.Unix()
		out[k] = true
	}
	return out, rows.Err()
}

// finalRow reads one row as FINAL shows it, and whether it is an audit.sealed event.
func finalRow(ctx context.Context, conn driver.Conn, db string, k rowKey) (e Entry, quiet, ok bool, err error) {
	rows, err := conn.Query(ctx, "SELECT "+eventCols+" FROM "+db+".events FINAL WHERE org_id = ? AND time = ? AND id = ?",
		k.org, time.Unix(k.sec, 0).UTC(), k.id)
	if err != nil {
		return Entry{}, false, false, fmt.Errorf("cannot read event %s of org %q from %s.events: %w", k.id, k.org, db, err)
	}
	defer rows.Close()
	var r store.EventRow
	if !rows.Next() {
		return Entry{}, false, false, rows.Err()
	}
	if err := scanEvent(rows, &r); err != nil {
		return Entry{}, false, false, fmt.Errorf("cannot read event %s of org %q from %s.events: %w", k.id, k.org, db, err)
	}
	return Entry{Time: r.Time, ID: r.ID, Digest: r.SealDigest()}, isAnnouncement(&r), true, nil
}

// SealData is the data of an audit.sealed event: the seal whole, so that the chain
// can be checked from the topic alone.
type SealData struct {
	Seq       uint64    `json:"seq"`
	SealedAt  time.Time `json:"sealed_at"`
	Through   time.Time `json:"through"`
	Events    uint64    `json:"events"`
	FirstTime time.Time `json:"first_time"`
	LastTime  time.Time `json:"last_time"`
	Root      string    `json:"root"`
	Prev      string    `json:"prev"`
	Hash      string    `json:"hash"`
	KeyID     string    `json:"key_id"`
	Signature string    `json:"signature"`
}

// EventID is the id of the audit.sealed event of the seal with that hash.
func EventID(hash string) string { return "seal-" + hash }

func sealEvent(s *Seal) schema.Event {
	data, _ := json.Marshal(SealData{Seq: s.Seq, SealedAt: s.SealedAt, Through: s.Through, Events: s.Events,
		FirstTime: s.FirstTime, LastTime: s.LastTime, Root: s.Root, Prev: s.Prev, Hash: s.Hash, KeyID: s.KeyID, Signature: s.Signature})
	return schema.Event{
		ID: EventID(s.Hash), Type: schema.TypeAuditSealed, Time: s.SealedAt, OrgID: s.OrgID,
		Actor:  schema.Party{ID: Source, Type: schema.ActorSystem},
		Source: Source, SchemaVersion: schema.Version, Data: data,
	}
}

// sortedOrgs returns the keys of m in order.
func sortedOrgs[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
