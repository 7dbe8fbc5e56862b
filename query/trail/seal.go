// Package trail owns the tamper-evident audit trail: sealing what ingest stored into
// each organization's transparency log (tlog: an RFC 6962 Merkle tree with checkpoints
// signed by the audit key), verifying the trail against the log, and exporting
// selections that prove themselves offline.
//
// # Threat model
//
// The attacker can write to ClickHouse (every table, bookkeeping included) but does
// not hold the audit private key, and cannot write to Kafka. So nothing read from
// ClickHouse is trusted until it is checked against a signed checkpoint, and what the
// sealer appends does not come from ClickHouse at all.
//
// # What is sealed
//
// Ingest, once a batch is in ClickHouse and before it commits the batch's offsets,
// produces a note (tlog.Leaf) for every event row it stored to the stored-events topic,
// keyed by organization. The sealer reads that topic as a consumer group (one sealer
// holds an organization at a time) and appends each note as a leaf of the
// organization's log, then signs a checkpoint of the new size. A row inserted into
// ClickHouse by hand has no note, so it never becomes a leaf; verify reports it.
//
// A leaf commits to the row's key, the digest of its content (store.EventRow.
// SealDigest) and ingest's bookkeeping: ingested_at and the Kafka partition and offset.
// Ingest stamps ingested_at at each insert attempt, and notes only the attempt that
// stored the whole batch, so an earlier attempt may have left a copy of a row with an
// earlier ingested_at; a copy is genuine when its content and Kafka record match a leaf
// of its key and its ingested_at is not after that leaf's (verify).
//
// # Checkpoints
//
// A checkpoint is a C2SP tlog-checkpoint note signed by the audit key, as the log and
// with a timestamped cosignature (tlog). Each size an organization's log reaches is
// stored in the checkpoints table and produced to the checkpoints topic (compacted,
// keyed by organization), so that a truncation or a rollback of ClickHouse is caught
// by anyone who kept a checkpoint: the topic, a witness, an auditor's file. Every run
// also signs a fresh checkpoint of the same size for each organization with nothing
// new, to the topic only: the topic's checkpoint of an idle organization says how
// large its log still was at that time.
//
// The sealer trusts only checkpoints that verify with its key ring: a forged, unsigned
// or foreign row in checkpoints never becomes a head, and it signs nothing its ring
// would not accept (a rotation retired its key, or hands over to it only later). Each
// time the group hands it the topic, it loads the logs again and checks what
// ClickHouse holds against the newest checkpoint the topic has (Config.Published): a
// log shorter than the topic's checkpoint was rolled back, one with another root was
// forked, and a stored tree whose right edge does not give the head's root was edited.
// It seals nothing of such an organization, checks it again and logs why at every run,
// and keeps its notes (and, the topic being read in order, the ones after them)
// uncommitted, so the unsealed age (a metric, and an alert rule) grows. Notes are
// committed only once the checkpoints topic has acknowledged the checkpoints that seal
// them, and rotation records reach the sealer on the stored-events topic too: one it
// has seen counts for good.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package trail

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/transparency-dev/merkle/compact"

	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// Defaults of Config.
const (
	DefaultEvery     = time.Minute
	DefaultMaxLeaves = 100_000
	// DefaultMargin is how long after its ingested_at a row may still lack a leaf
	// without verify calling it unexpected: the time from an insert attempt to the
	// run that seals its note, with room for a slow insert and for clock skew between
	// an ingest host and ClickHouse.
	DefaultMargin = 10 * time.Minute
)

// NoteSource is the stored-events topic as the sealer reads it (schema/kafka.
// GroupReader implements it): messages keyed by organization, each notes
// (tlog.EncodeNotes). Drain blocks until it has returned every message of the
// partitions this member holds that was produced before the call, from where the last
// Drain stopped (the group's committed offsets at first), at most max of them; more
// says it stopped at max. Commit acknowledges everything the Drains since the last
// Commit returned; Rewind forgets it instead, so that the next Drain returns it again.
// Holds says whether this member holds the topic: the group gives the whole topic to
// one sealer (an operator's `audit seal` takes it over from serve's while it runs), and
// a sealer that holds nothing signs nothing, not even fresh checkpoints, which would
// claim a size the other sealer has moved past. Generation changes when the group
// hands the topic out again: another sealer may have extended the logs in between.
type NoteSource interface {
	Drain(ctx context.Context, max int) (msgs []kafkago.Message, more bool, err error)
	Commit(ctx context.Context) error
	Rewind()
	Holds() bool
	Generation() int64
}

// Publisher writes checkpoints to the checkpoints topic, keyed by organization (ingest/
// kafka.Producer implements it); it returns once every one is acknowledged.
type Publisher interface {
	ProduceMessages(ctx context.Context, msgs []kafkago.Message) error
}

// Config configures a Sealer.
type Config struct {
	Conn     driver.Conn
	Database string
	// Prefix is the deployment's origin prefix (tlog.DefaultPrefix(Database) when
	// empty): the key name of its checkpoints.
	Prefix string
	Key    ed25519.PrivateKey
	// Anchors are further audit keys the sealer trusts (the key ring's anchors besides
	// Key): the previous key right after a rotation needs none, its rotation record
	// links it.
	Anchors   []ed25519.PublicKey
	Notes     NoteSource
	Publisher Publisher
	// Published reads the newest checkpoint of every organization from the
	// checkpoints topic (nil: not compared).
	Published func(ctx context.Context) (map[string][]byte, error)
	// Ingested, when set, reads the ingest group's committed offsets on the events
	// topic (IngestTopic, IngestGroup) before each run: a run that seals every note
	// produced before it then publishes them as a signed coverage note (tlog.Coverage).
	Ingested    func(ctx context.Context) (map[int]int64, error)
	IngestTopic string
	IngestGroup string
	Every       time.Duration
	MaxLeaves   int // leaves per checkpoint (a run signs as many as it needs)
	Logger      *slog.Logger
	// Registerer gets the sealer's metrics (nil: none).
	Registerer prometheus.Registerer
	Now        func() time.Time
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
	if c.Prefix != "" {
		if err := tlog.CheckPrefix(c.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("seal: --audit-origin: %w", err))
		}
	}
	if len(c.Key) != ed25519.PrivateKeySize {
		errs = append(errs, errors.New("seal: no Ed25519 private key (--audit-key)"))
	}
	if c.Notes == nil {
		errs = append(errs, errors.New("seal: no source of the stored-events notes"))
	}
	if c.Publisher == nil {
		errs = append(errs, errors.New("seal: no publisher for the checkpoints"))
	}
	if c.Every < 0 || c.Every > 0 && c.Every < time.Second {
		errs = append(errs, fmt.Errorf("seal: --seal-every must be at least 1s, got %s", c.Every))
	}
	if c.MaxLeaves < 0 {
		errs = append(errs, fmt.Errorf("seal: max leaves must not be negative, got %d", c.MaxLeaves))
	}
	return errors.Join(errs...)
}

// orgLog is what the sealer holds of one organization's log: its verified head and
// the compact range of its tree at that size, or why it refuses to extend it.
type orgLog struct {
	head    tlog.Checkpoint // zero Size: an empty log
	rng     *compact.Range
	refused string
}

// Sealer seals the audit trail of one database.
type Sealer struct {
	cfg    Config
	signer *tlog.Signer
	db     logDB
	log    *slog.Logger
	m      *metrics

	gen       int64 // the stored-events topic's hand-out that orgs and published belong to
	orgs      map[string]*orgLog
	loaded    bool              // orgs holds every organization with a checkpoint
	published map[string][]byte // newest notes on the checkpoints topic, read once per hand-out
	read      bool              // published was read
	pending   []kafkago.Message // checkpoints Kafka has not acknowledged yet
	// rotations are the rotation records the sealer has seen (ClickHouse's, the
	// checkpoints topic's, the stored-events topic's), each verified, by text: one seen
	// once counts for good, so that deleting it from ClickHouse does not give a retired
	// key back its validity.
	rotations map[string][]byte
	// appended are the leaf hashes this hand-out appended: a note drained again (the
	// step of a refused organization is read again every run) is not appended again
	// even when the stored tree no longer proves it.
	appended map[[32]byte]struct{}

	mu       sync.Mutex
	caughtUp time.Time // the start of the last run that sealed every note produced before it
}

// maxPending bounds the checkpoints kept for a later attempt while Kafka is down; a
// dropped one costs only its copy on the topic (it is stored in ClickHouse, and the
// next run's checkpoint supersedes it).
const maxPending = 10_000

// drainMessages bounds the notes messages one step of a run holds (each up to
// tlog.MaxNotesBytes).
const drainMessages = 256

func New(cfg Config) (*Sealer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = tlog.DefaultPrefix(cfg.Database)
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.MaxLeaves == 0 {
		cfg.MaxLeaves = DefaultMaxLeaves
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	signer, err := tlog.NewSigner(cfg.Prefix, cfg.Key)
	if err != nil {
		return nil, err
	}
	s := &Sealer{cfg: cfg, signer: signer, db: logDB{conn: cfg.Conn, db: cfg.Database},
		log:  log.With("component", "sealer", "key_id", signer.KeyID(), "origin_prefix", cfg.Prefix),
		orgs: map[string]*orgLog{}, published: map[string][]byte{}, rotations: map[string][]byte{}, appended: map[[32]byte]struct{}{},
		caughtUp: cfg.Now()}
	s.m = newMetrics(cfg.Registerer, s.unsealedAge, s.refusedOrgs)
	return s, nil
}

// unsealedAge bounds the age of the oldest unsealed event: every note produced before
// the start of the last run that drained its notes and refused no organization is in
// the log (a row's note follows its insert by the insert's duration).
func (s *Sealer) unsealedAge() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Now().Sub(s.caughtUp).Seconds()
}

func (s *Sealer) refusedOrgs() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, o := range s.orgs {
		if o.refused != "" {
			n++
		}
	}
	return float64(n)
}

// Keys of the checkpoints topic that are not organizations (whose ids hold no control
// character): the coverage note, and each key rotation record.
const (
	CoverageKey       = "\x00coverage"
	RotationKeyPrefix = "\x00rotation:"
)

// TopicRotations are the rotation records among the checkpoints topic's newest notes
// (kafka.ReadLatest), in key order. Each still has to verify: a reader builds its key
// ring from them and ClickHouse's, so that a record deleted from ClickHouse still
// counts.
func TopicRotations(latest map[string][]byte) [][]byte {
	var out [][]byte
	for _, key := range slices.Sorted(maps.Keys(latest)) {
		if strings.HasPrefix(key, RotationKeyPrefix) {
			out = append(out, latest[key])
		}
	}
	return out
}

// Result says what one run did.
type Result struct {
	Checkpoints int `json:"checkpoints"` // of new sizes, stored and published
	Leaves      int `json:"leaves"`      // appended
	Duplicates  int `json:"duplicates"`  // notes of rows already in the log
	Orgs        int `json:"orgs"`        // organizations whose log grew
	Fresh       int `json:"fresh"`       // checkpoints of unchanged logs, published only
	Published   int `json:"published"`   // checkpoints the topic acknowledged
	// Idle says another sealer holds the stored-events topic: this one sealed nothing.
	Idle bool `json:"idle,omitempty"`
	// Covered is the events topic's coverage this run published (partition: offset).
	Covered map[int]int64 `json:"covered,omitempty"`
	// Refused names the organizations whose log the sealer would not extend, and why.
	Refused map[string]string `json:"refused,omitempty"`
}

// Run seals every Every (the first time at once) until ctx ends, then once more — the
// caller stops ingest first, so that run seals its last batches — and returns that
// run's error.
func (s *Sealer) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	// runOnce logs a failed run, and the next tick runs again.
	_ = s.runOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			return s.runOnce(final)
		case <-t.C:
			_ = s.runOnce(ctx)
		}
	}
}

func (s *Sealer) runOnce(ctx context.Context) error {
	res, err := s.SealNow(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("cannot seal the audit trail", "err", err, "checkpoints", res.Checkpoints)
		}
		return err
	}
	if res.Checkpoints > 0 {
		s.log.Info("sealed the audit trail", "checkpoints", res.Checkpoints, "leaves", res.Leaves, "orgs", res.Orgs,
			"duplicates", res.Duplicates, "fresh", res.Fresh)
	}
	return nil
}

// SealNow appends every note produced before the call to its organization's log,
// signs the checkpoints, publishes them (and those a failed earlier run could not),
// and commits the notes.
func (s *Sealer) SealNow(ctx context.Context) (Result, error) {
	start := s.cfg.Now()
	res := Result{Refused: map[string]string{}}
	err := s.run(ctx, &res)
	s.m.observe(res, err, s.cfg.Now().Sub(start))
	if len(res.Refused) == 0 {
		res.Refused = nil
	}
	// A sealer that holds nothing reports no age of its own: the one that holds the
	// topic does.
	if err == nil && res.Refused == nil {
		s.mu.Lock()
		s.caughtUp = start
		s.mu.Unlock()
	}
	return res, err
}

func (s *Sealer) run(ctx context.Context, res *Result) error {
	ring, err := s.ring(ctx)
	if err != nil {
		return err
	}
	for _, p := range ring.Problems() {
		s.log.Warn("ignoring a key rotation record", "problem", p)
	}
	// The ingest group's offsets before the notes: a batch committed below them had its
	// notes acknowledged before, so the drain below reaches them.
	var covered map[int]int64
	var coveredAt time.Time
	if s.cfg.Ingested != nil {
		coveredAt = s.cfg.Now()
		if covered, err = s.cfg.Ingested(ctx); err != nil {
			return fmt.Errorf("cannot read the ingest group's offsets for the coverage note: %w", err)
		}
	}
	// What a run does not commit, the next one reads again: the notes of a refused
	// organization, and those of a run that failed half way.
	fail := func(err error) error {
		s.cfg.Notes.Rewind()
		return err
	}
	grown := map[string]bool{}
	for first := true; ; first = false {
		msgs, more, err := s.cfg.Notes.Drain(ctx, drainMessages)
		if err != nil {
			return fail(fmt.Errorf("cannot read the stored-events notes: %w", err))
		}
		if !s.cfg.Notes.Holds() {
			// What it held of the logs is another sealer's to say now.
			s.forget(s.gen)
			res.Idle = true
			return nil
		}
		if gen := s.cfg.Notes.Generation(); gen != s.gen {
			if !first {
				return fail(errors.New("the stored-events topic was handed out again during the run: the next run starts over"))
			}
			s.forget(gen)
		}
		byOrg := map[string][]tlog.Leaf{}
		for _, m := range msgs {
			org := string(m.Key)
			if strings.HasPrefix(org, RotationKeyPrefix) {
				s.remember(m.Value, "the stored-events topic")
				continue
			}
			leaves, err := tlog.DecodeNotes(org, m.Value)
			if err != nil {
				// Only ingest writes the topic: a message it cannot have written is
				// counted and skipped, never sealed.
				s.m.badNotes.Inc()
				s.log.Error("skipping a message of the stored-events topic that is not notes", "org_id", org, "err", err, "bytes", len(m.Value))
				continue
			}
			byOrg[org] = append(byOrg[org], leaves...)
		}
		if first {
			if ring, err = s.prepare(ctx); err != nil {
				return fail(err)
			}
		}
		blocked := false
		for _, org := range slices.Sorted(maps.Keys(byOrg)) {
			ol, err := s.org(ctx, ring, org)
			if err != nil {
				return fail(err)
			}
			if ol.refused != "" {
				blocked = true
				continue
			}
			n, dups, err := s.appendOrg(ctx, org, ol, byOrg[org], res)
			if err != nil {
				return fail(err)
			}
			res.Leaves += n
			res.Duplicates += dups
			if n > 0 {
				grown[org] = true
			}
			if ol.refused != "" {
				blocked = true
			}
		}
		// The notes are committed only once the topic holds the checkpoints that seal
		// them: a checkpoint only ClickHouse holds is one a rollback removes unseen.
		if err := s.publish(ctx, res); err != nil {
			return fail(err)
		}
		if blocked {
			// The notes of a refused organization stay in the topic until its log is
			// mended, and so do the ones after them: the topic is read in order. The
			// other organizations' notes of this step are sealed and come back as
			// duplicates.
			s.cfg.Notes.Rewind()
			break
		}
		if err := s.cfg.Notes.Commit(ctx); err != nil {
			return fail(fmt.Errorf("cannot commit the stored-events notes (they are sealed; a redelivery is recognised): %w", err))
		}
		if !more {
			break
		}
	}
	res.Orgs = len(grown)
	for org, ol := range s.orgs {
		if ol.refused != "" {
			res.Refused[org] = ol.refused
		}
	}
	if len(res.Refused) > 0 {
		s.log.Error("not extending the logs of organizations whose stored log does not match their checkpoints (audit verify names what is wrong)",
			"refused", fmt.Sprint(res.Refused))
	}
	if !s.cfg.Notes.Holds() {
		// Handed out during the run: the new holder signs what follows.
		return nil
	}
	// Rotation records are read again before anything is signed: a rotation recorded
	// during the run counts.
	if ring, err = s.ring(ctx); err != nil {
		return err
	}
	if covered != nil && len(res.Refused) == 0 {
		note, err := s.signer.SignCoverage(s.cfg.IngestTopic, s.cfg.IngestGroup, covered, coveredAt)
		if err != nil {
			return err
		}
		if _, err := ring.OpenCoverage(note); err != nil {
			return s.mayNotSign(err)
		}
		s.pending = append(s.pending, kafkago.Message{Key: []byte(CoverageKey), Value: note})
		res.Covered = covered
	}
	// A fresh checkpoint of every other organization: the topic tells how large each
	// log still was at this time.
	for _, org := range slices.Sorted(maps.Keys(s.orgs)) {
		ol := s.orgs[org]
		if grown[org] || ol.refused != "" || ol.head.Size == 0 {
			continue
		}
		c, err := s.sign(ring, org, ol.head.Size, ol.head.Root)
		if err != nil {
			return errors.Join(err, s.publish(ctx, res))
		}
		s.pending = append(s.pending, kafkago.Message{Key: []byte(org), Value: c.Note})
		res.Fresh++
	}
	return s.publish(ctx, res)
}

// forget drops what the sealer holds of the logs when the group hands the topic out
// again (gen): another sealer may have extended them, or published newer checkpoints,
// in between. The logs are loaded again from ClickHouse and checked against the topic,
// which is read again. Checkpoints not yet published stay pending: they are stored,
// and the notes they seal were not committed.
func (s *Sealer) forget(gen int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen && len(s.orgs) > 0 {
		s.log.Info("the stored-events topic was handed to this sealer again: reloading the logs", "generation", gen)
	}
	s.gen, s.orgs, s.loaded, s.read, s.appended = gen, map[string]*orgLog{}, false, false, map[[32]byte]struct{}{}
}

// prepare reads the checkpoints topic once per hand-out of the topic, learns the
// organizations that have checkpoints, and checks every refused organization's log
// again, so that a mended log is extended without a restart. It returns the key ring
// with every rotation record seen so far, the drained ones and the topic's included.
func (s *Sealer) prepare(ctx context.Context) (*tlog.KeyRing, error) {
	if !s.read && s.cfg.Published != nil {
		published, err := s.cfg.Published(ctx)
		if err != nil {
			return nil, fmt.Errorf("cannot read the newest checkpoints from the checkpoints topic: %w", err)
		}
		s.published, s.read = published, true
		for _, msg := range TopicRotations(published) {
			s.remember(msg, "the checkpoints topic")
		}
	}
	ring, err := s.ring(ctx)
	if err != nil {
		return nil, err
	}
	var refused []string
	for org, ol := range s.orgs {
		if ol.refused != "" {
			refused = append(refused, org)
		}
	}
	for _, org := range refused {
		s.mu.Lock()
		delete(s.orgs, org)
		s.mu.Unlock()
		if _, err := s.org(ctx, ring, org); err != nil {
			return nil, err
		}
	}
	return ring, s.loadOrgs(ctx, ring)
}

// remember keeps a rotation record that verifies on its own (from names where it was
// found, for the log).
func (s *Sealer) remember(msg []byte, from string) {
	if _, ok := s.rotations[string(msg)]; ok {
		return
	}
	if _, err := tlog.OpenRotation(s.cfg.Prefix, msg); err != nil {
		s.log.Warn("ignoring a key rotation record that does not verify", "found_in", from, "err", err)
		return
	}
	if len(s.rotations) >= maxRotations {
		s.log.Error("ignoring a key rotation record: too many seen", "found_in", from, "max", maxRotations)
		return
	}
	s.rotations[string(msg)] = msg
}

// ErrKeyNotValid says the sealer's key may not sign now: a key rotation retired it,
// or hands over to it only later. The sealer then signs nothing.
var ErrKeyNotValid = errors.New("the audit key may not sign now")

func (s *Sealer) mayNotSign(err error) error {
	return fmt.Errorf("%w (key %s: %v): serve signs with the key a rotation hands the log to, from its time on", ErrKeyNotValid, s.signer.KeyID(), err) //nolint:errorlint // the cause is text: ErrKeyNotValid is the one kind callers see
}

// sign signs org's checkpoint and checks it against ring as every reader will: a
// checkpoint signed outside the key's validity would fork the log of whoever trusts
// the rotation.
func (s *Sealer) sign(ring *tlog.KeyRing, org string, size uint64, root []byte) (tlog.Checkpoint, error) {
	c, err := s.signer.Sign(org, size, root)
	if err != nil {
		return tlog.Checkpoint{}, err
	}
	if _, err := ring.Open(c.Note); err != nil {
		return tlog.Checkpoint{}, s.mayNotSign(err)
	}
	return c, nil
}

func (s *Sealer) publish(ctx context.Context, res *Result) error {
	if over := len(s.pending) - maxPending; over > 0 {
		s.log.Warn("dropping checkpoints kafka did not take (they are stored in clickhouse, and newer ones follow)", "dropped", over)
		s.pending = slices.Delete(s.pending, 0, over)
	}
	if len(s.pending) == 0 {
		return nil
	}
	if err := s.cfg.Publisher.ProduceMessages(ctx, s.pending); err != nil {
		return fmt.Errorf("cannot publish %d checkpoints to the checkpoints topic (their notes stay uncommitted; retried at the next run): %w", len(s.pending), err)
	}
	res.Published += len(s.pending)
	for _, m := range s.pending {
		s.published[string(m.Key)] = m.Value
	}
	s.pending = nil
	return nil
}

// ring is the key ring as of now: the sealer's key, the anchors, the rotations
// recorded in ClickHouse and every one the sealer has seen (each verifies on its own;
// run logs the ones that do not).
func (s *Sealer) ring(ctx context.Context) (*tlog.KeyRing, error) {
	rot, err := s.db.rotations(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rot {
		s.remember(r, "ClickHouse")
	}
	return tlog.NewKeyRing(s.cfg.Prefix, append([]ed25519.PublicKey{s.signer.Public()}, s.cfg.Anchors...), slices.Collect(maps.Values(s.rotations)))
}

// loadOrgs learns the organizations that have checkpoints, so that each run signs a
// fresh checkpoint of every one (once per hand-out of the topic).
func (s *Sealer) loadOrgs(ctx context.Context, ring *tlog.KeyRing) error {
	if s.loaded {
		return nil
	}
	orgs, err := s.db.checkpointOrgs(ctx)
	if err != nil {
		return err
	}
	for _, org := range orgs {
		if _, err := s.org(ctx, ring, org); err != nil {
			return err
		}
	}
	s.loaded = true
	return nil
}

// maxForged bounds the unverifiable checkpoint rows the sealer reads past, above an
// organization's head: more means the table needs audit verify, not a sealer.
const maxForged = 20

// head finds org's head in ClickHouse: the largest size whose checkpoint verifies with
// the ring. Forged, unsigned or foreign rows above it are counted and logged. Rows of
// which none verifies refuse the log rather than start it again at 0, which would
// fork it: that is a deleted rotation record, a sealer run with a key outside the
// ring, or forged rows only.
func (s *Sealer) head(ctx context.Context, ring *tlog.KeyRing, org string) (tlog.Checkpoint, string, error) {
	rows, err := s.db.topCheckpoints(ctx, org, maxForged+1)
	if err != nil {
		return tlog.Checkpoint{}, "", err
	}
	for i, r := range rows {
		c, err := ring.Open(r.Note)
		if err == nil && c.Org == org && c.Size == r.Size {
			return c, "", nil
		}
		why := "its size or organization differ from its row's"
		if err != nil {
			why = err.Error()
		}
		s.m.forged.Inc()
		s.log.Error("ignoring a checkpoint row that does not verify (audit verify names it)", "org_id", org, "size", r.Size, "reason", why)
		if i == maxForged {
			return tlog.Checkpoint{}, fmt.Sprintf("more than %d checkpoint rows above the head do not verify", maxForged), nil
		}
	}
	if len(rows) > 0 {
		return tlog.Checkpoint{}, fmt.Sprintf("none of its %d checkpoint rows verifies with the key ring (%s): a rotation record deleted, another key, or forged rows",
			len(rows), strings.Join(ring.KeyIDs(), ", ")), nil
	}
	return tlog.Checkpoint{Org: org, Origin: tlog.Origin(s.cfg.Prefix, org)}, "", nil
}

// org returns what the sealer holds of org's log, loading and checking it the first
// time: the head in ClickHouse against the newest checkpoint on the topic, and the
// stored right edge of the tree against the head's root.
func (s *Sealer) org(ctx context.Context, ring *tlog.KeyRing, org string) (*orgLog, error) {
	if ol := s.orgs[org]; ol != nil {
		return ol, nil
	}
	head, refused, err := s.head(ctx, ring, org)
	if err != nil {
		return nil, err
	}
	ol := &orgLog{head: head, refused: refused}
	if refused == "" {
		if msg, ok := s.published[org]; ok {
			why, err := s.compareTopic(ctx, ring, org, &head, msg)
			if err != nil {
				return nil, err
			}
			refused = why
		}
	}
	if refused == "" {
		rng, err := tlog.LoadRange(ctx, s.db, org, head.Size)
		switch {
		case errors.Is(err, ErrLogDamaged):
			refused = fmt.Sprintf("the right edge of its tree at size %d cannot be read: %v", head.Size, err)
		case err != nil:
			return nil, err // the database's: the next run tries again
		case head.Size > 0 && !bytes.Equal(tlog.Root(rng), head.Root):
			refused = fmt.Sprintf("its stored tree does not give the root of its checkpoint at size %d", head.Size)
		default:
			ol.rng = rng
		}
	}
	s.mu.Lock()
	s.orgs[org] = ol
	s.mu.Unlock()
	if refused != "" {
		s.refuse(ol, refused)
	}
	return ol, nil
}

func (s *Sealer) refuse(ol *orgLog, why string) {
	s.mu.Lock()
	ol.refused = why
	s.mu.Unlock()
	s.log.Error("refusing to extend an organization's log", "org_id", ol.head.Org, "reason", why)
}

// compareTopic says why ClickHouse's head of org does not extend the topic's newest
// checkpoint msg, or "" when it does; an error is the database's.
func (s *Sealer) compareTopic(ctx context.Context, ring *tlog.KeyRing, org string, head *tlog.Checkpoint, msg []byte) (string, error) {
	pub, err := ring.Open(msg)
	if err != nil || pub.Org != org {
		s.log.Warn("ignoring a checkpoint of the checkpoints topic that does not verify", "org_id", org, "err", err)
		return "", nil
	}
	switch {
	case pub.Size > head.Size:
		return fmt.Sprintf("rolled back: the checkpoints topic has a checkpoint of %d leaves signed at %s, ClickHouse's log ends at %d",
			pub.Size, pub.SignedAt.Format(time.RFC3339), head.Size), nil
	case pub.Size == head.Size:
		if !pub.Same(head) {
			return fmt.Sprintf("forked: the checkpoints topic has another root at size %d", pub.Size), nil
		}
		return "", nil
	}
	pr, err := tlog.ConsistencyProof(ctx, s.db, org, pub.Size, head.Size)
	if err != nil && !errors.Is(err, ErrLogDamaged) {
		return "", err
	}
	if err == nil {
		err = tlog.Extends(&pub, head, pr)
	}
	if err != nil {
		return fmt.Sprintf("ClickHouse's log at size %d does not extend the checkpoints topic's checkpoint of size %d: %v", head.Size, pub.Size, err), nil
	}
	return "", nil
}

// appendOrg appends org's new notes in checkpoints of at most MaxLeaves leaves and
// returns how many leaves it appended and how many notes were already in the log.
func (s *Sealer) appendOrg(ctx context.Context, org string, ol *orgLog, notes []tlog.Leaf, res *Result) (int, int, error) {
	fresh, inners, err := s.dedupe(ctx, org, ol, notes)
	if err != nil {
		return 0, 0, err
	}
	dups := len(notes) - len(fresh)
	appended := 0
	for len(fresh) > 0 {
		// The ring as of now: a rotation recorded during the run counts.
		ring, err := s.ring(ctx)
		if err != nil {
			return appended, dups, err
		}
		moved, err := s.checkHead(ctx, ring, org, ol)
		if err != nil || ol.refused != "" {
			return appended, dups, err
		}
		if moved {
			// What the other sealer appended is in the log now.
			before := len(fresh)
			if fresh, inners, err = s.dedupe(ctx, org, ol, fresh); err != nil {
				return appended, dups, err
			}
			dups += before - len(fresh)
			if len(fresh) == 0 {
				break
			}
		}
		n := min(len(fresh), s.cfg.MaxLeaves)
		part, partInner := fresh[:n], inners[:n]
		next := tlog.CloneRange(ol.rng) // the held range moves only once the checkpoint is stored
		var nodes []node
		for i := range part {
			if err := next.Append(tlog.LeafHash(part[i].Time.UnixMilli(), partInner[i]), func(id compact.NodeID, h []byte) {
				if id.Level > 0 {
					nodes = append(nodes, node{id: id, hash: h})
				}
			}); err != nil {
				return appended, dups, err
			}
		}
		c, err := s.sign(ring, org, next.End(), tlog.Root(next))
		if err != nil {
			return appended, dups, err
		}
		if err := s.db.appendLeaves(ctx, org, ol.head.Size, part, partInner, nodes); err != nil {
			return appended, dups, err
		}
		if err := s.db.writeCheckpoint(ctx, &c); err != nil {
			return appended, dups, err
		}
		ol.head, ol.rng = c, next
		if len(s.appended)+n > maxAppendedKept {
			s.appended = map[[32]byte]struct{}{}
		}
		for i := range part {
			s.appended[[32]byte(tlog.LeafHash(part[i].Time.UnixMilli(), partInner[i]))] = struct{}{}
		}
		s.pending = append(s.pending, kafkago.Message{Key: []byte(org), Value: c.Note})
		res.Checkpoints++
		appended += n
		fresh, inners = fresh[n:], inners[n:]
	}
	return appended, dups, nil
}

// checkHead re-reads org's head in ClickHouse just before an append: another sealer
// that extended it (a consumer-group rebalance overlapping this run) makes this one
// continue from what it wrote (moved); a head below the sealer's own is a rollback.
func (s *Sealer) checkHead(ctx context.Context, ring *tlog.KeyRing, org string, ol *orgLog) (moved bool, err error) {
	cur, refused, err := s.head(ctx, ring, org)
	if err != nil {
		return false, err
	}
	switch {
	case refused != "":
		s.refuse(ol, refused)
	case cur.Size < ol.head.Size:
		s.refuse(ol, fmt.Sprintf("rolled back: this sealer signed a checkpoint of %d leaves, ClickHouse's log now ends at %d", ol.head.Size, cur.Size))
	case cur.Size == ol.head.Size && !cur.Same(&ol.head):
		s.refuse(ol, fmt.Sprintf("forked: ClickHouse holds another root at size %d than this sealer signed", cur.Size))
	case cur.Size > ol.head.Size:
		s.log.Info("another sealer extended an organization's log; continuing from its head", "org_id", org, "size", cur.Size)
		s.mu.Lock()
		delete(s.orgs, org)
		s.mu.Unlock()
		fresh, err := s.org(ctx, ring, org)
		if err != nil {
			return false, err
		}
		*ol = *fresh
		s.mu.Lock()
		s.orgs[org] = ol
		s.mu.Unlock()
		return true, nil
	}
	return false, nil
}

// maxAppendedKept bounds the leaf hashes a sealer keeps of what it appended (Sealer.
// appended): about 40 MiB.
const maxAppendedKept = 1_000_000

// maxHeldRows bounds the rows of log_leaves read per event key (leavesOf). A note
// whose genuine row planted ones crowd out is appended again, which costs a duplicate
// leaf and nothing else.
const maxHeldRows = 4

// dedupe drops the notes of rows the log holds already (a note produced again: ingest
// retried a batch whose notes Kafka had taken, or a rebalance handed this sealer notes
// another one sealed) and repeats within the run. A note counts as held only when the
// log proves it: a row of log_leaves names the index, and the inclusion proof of the
// note's own leaf hash at that index verifies against the head's root. Rows planted
// in log_leaves or log_index therefore never make a note look held; at worst a note is
// appended twice. It returns the notes to append with their inner digests.
func (s *Sealer) dedupe(ctx context.Context, org string, ol *orgLog, notes []tlog.Leaf) ([]tlog.Leaf, [][32]byte, error) {
	type key struct {
		inner [32]byte
		ms    int64
	}
	seen := make(map[key]bool, len(notes))
	want := make(map[key]bool, len(notes))
	keys := make([]store.EventKey, 0, len(notes))
	for i := range notes {
		keys = append(keys, store.EventKey{OrgID: org, Time: notes[i].Time.Unix(), ID: notes[i].ID})
		want[key{notes[i].Inner(), notes[i].Time.UnixMilli()}] = true
	}
	held, err := s.db.leavesOf(ctx, org, keys, ol.head.Size)
	if err != nil {
		return nil, nil, err
	}
	var idx []uint64
	var cand []key
	for i := range held {
		if k := (key{held[i].Inner(), held[i].Time.UnixMilli()}); want[k] {
			idx, cand = append(idx, held[i].Index), append(cand, k)
		}
	}
	if len(idx) > 0 {
		proofs, err := tlog.InclusionProofs(ctx, s.db, org, idx, ol.head.Size)
		if err != nil {
			s.m.forged.Inc()
			s.log.Error("cannot prove notes already in the log; appending them again (audit verify names what is edited)", "org_id", org, "notes", len(idx), "err", err)
		}
		for i := range proofs {
			if tlog.VerifyInclusion(idx[i], ol.head.Size, tlog.LeafHash(cand[i].ms, cand[i].inner), proofs[i], ol.head.Root) == nil {
				seen[cand[i]] = true
			}
		}
	}
	out := notes[:0:0]
	var inners [][32]byte
	for i := range notes {
		k := key{notes[i].Inner(), notes[i].Time.UnixMilli()}
		if _, mine := s.appended[[32]byte(tlog.LeafHash(k.ms, k.inner))]; seen[k] || mine {
			continue
		}
		seen[k] = true
		out, inners = append(out, notes[i]), append(inners, k.inner)
	}
	return out, inners, nil
}
