// Package auditbench measures the audit trail on the running stack (`bandplane bench
// audit`): sealing stored events from their notes on Kafka into the organizations'
// logs, verifying the trail against the logs, and exporting one organization with
// inclusion proofs and checking that export offline.
//
// It may import any folder but cmd/ (deploy/layers).
package auditbench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// Config configures a run.
type Config struct {
	Brokers    []string
	ClickHouse chdb.Config // the database is made fresh, named <Database>_bench_audit
	Events     int         // stored events, over Orgs organizations and the last day
	Orgs       int
	DataBytes  int  // about how large each event's data is
	KeepData   bool // keep the database and the topics
	Logger     *slog.Logger
	Progress   func(format string, args ...any)
}

func (c *Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no kafka brokers (--kafka)"))
	}
	if c.Events < 1 || c.Events > 10_000_000 {
		errs = append(errs, fmt.Errorf("--events must be 1 to 10,000,000, got %d", c.Events))
	}
	if c.Orgs < 1 || c.Orgs > 1000 {
		errs = append(errs, fmt.Errorf("--orgs must be 1 to 1,000, got %d", c.Orgs))
	}
	if c.DataBytes < 0 || c.DataBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("--data-bytes must be 0 to 1 MiB, got %d", c.DataBytes))
	}
	return errors.Join(errs...)
}

// Result is the one JSON line the bench prints.
type Result struct {
	Events                   int     `json:"events"`
	Orgs                     int     `json:"orgs"`
	SealSeconds              float64 `json:"seal_seconds"`
	SealEventsPerS           float64 `json:"seal_events_per_s"`
	Checkpoints              int     `json:"checkpoints"`
	VerifySeconds            float64 `json:"verify_seconds"`
	VerifyEventsPerS         float64 `json:"verify_events_per_s"`
	ExportEvents             uint64  `json:"export_events"`
	ExportEventsPerS         float64 `json:"export_events_per_s"`
	ExportBytes              int64   `json:"export_bytes"`
	ExportBytesPerEvent      float64 `json:"export_bytes_per_event"`
	ExportVerifyEventsPerS   float64 `json:"export_verify_events_per_s"`
	ProofBytesPerEvent       float64 `json:"proof_bytes_per_event"`
	ProofBase64BytesPerEvent float64 `json:"proof_base64_bytes_per_event"`
	LogTreeHeight            int     `json:"log_tree_height"`
}

// Run loads the trail, seals it, verifies it, exports one organization and checks the
// export offline, each timed on its own.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, ...any) {}
	}
	db := cfg.ClickHouse.Database + "_bench_audit"
	chc := cfg.ClickHouse
	chc.Database = db
	conn, err := chdb.Open(ctx, chc)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		return Result{}, fmt.Errorf("cannot drop %s: %w", db, err)
	}
	if _, err := chdb.MigrateOn(ctx, conn, chc); err != nil {
		return Result{}, err
	}
	suffix := time.Now().UTC().Format("20060102T150405")
	topics := trail.Topics{Brokers: cfg.Brokers, Stored: "bandplane.bench.audit." + suffix + ".stored",
		Checkpoints: "bandplane.bench.audit." + suffix + ".checkpoints"}
	if err := trail.EnsureTopics(ctx, topics, 4); err != nil {
		return Result{}, err
	}
	if !cfg.KeepData {
		defer cleanup(conn, db, cfg.Brokers, topics)
	}
	if err := load(ctx, cfg, conn, db, topics); err != nil {
		return Result{}, err
	}

	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Result{}, err
	}
	pub := key.Public().(ed25519.PublicKey)
	res := Result{Events: cfg.Events, Orgs: cfg.Orgs}

	// Sealing: every note from the topic into the logs, signed, stored, published.
	s, closeSealer, err := trail.NewOnKafka(trail.Config{Conn: conn, Database: db, Key: key, Logger: cfg.Logger}, topics)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = closeSealer() }()
	start := time.Now()
	sealed := 0
	for sealed < cfg.Events {
		r, err := s.SealNow(ctx)
		if err != nil {
			return res, err
		}
		if r.Leaves == 0 {
			return res, fmt.Errorf("the sealer found %d of %d notes", sealed, cfg.Events)
		}
		sealed += r.Leaves
		res.Checkpoints += r.Checkpoints
	}
	res.SealSeconds = time.Since(start).Seconds()
	res.SealEventsPerS = float64(cfg.Events) / res.SealSeconds
	cfg.Progress("sealed %d events in %d checkpoints in %.2fs (%.0f events/s)", cfg.Events, res.Checkpoints, res.SealSeconds, res.SealEventsPerS)

	// Verify: every checkpoint, every log's root, every row against its leaves.
	start = time.Now()
	rep, err := trail.Verify(ctx, conn, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
	if err != nil {
		return res, err
	}
	res.VerifySeconds = time.Since(start).Seconds()
	if !rep.OK() || rep.SealedEvents != cfg.Events {
		return res, fmt.Errorf("verify found %d problems and %d of %d events sealed", len(rep.Problems), rep.SealedEvents, cfg.Events)
	}
	res.VerifyEventsPerS = float64(cfg.Events) / res.VerifySeconds
	cfg.Progress("verified %d events in %.2fs (%.0f events/s)", cfg.Events, res.VerifySeconds, res.VerifyEventsPerS)

	// The export of the first organization's whole day, then its offline check.
	x, err := trail.NewExporter(trail.ExportConfig{Conn: conn, Database: db, Key: key, Logger: cfg.Logger})
	if err != nil {
		return res, err
	}
	now := time.Now().UTC()
	sel := trail.Selection{Org: orgName(0), From: now.Add(-25 * time.Hour).Truncate(time.Second), To: now.Add(time.Minute).Truncate(time.Second)}
	start = time.Now()
	e, err := x.Prepare(ctx, trail.ExportRequest{Selection: sel, Encoding: trail.EncodingNDJSON})
	if err != nil {
		return res, err
	}
	var buf bytes.Buffer
	st, err := e.Stream(ctx, &buf, nil)
	if err != nil {
		return res, err
	}
	took := time.Since(start).Seconds()
	res.ExportEvents, res.ExportBytes = st.Total, st.Bytes
	res.ExportEventsPerS = float64(st.Total) / took
	res.ExportBytesPerEvent = float64(st.Bytes) / float64(max(st.Total, 1))
	res.ProofBytesPerEvent, res.ProofBase64BytesPerEvent, res.LogTreeHeight = proofSizes(buf.Bytes())
	cfg.Progress("exported %d events of %s (%d bytes) in %.2fs (%.0f events/s)", st.Total, sel.Org, st.Bytes, took, res.ExportEventsPerS)
	start = time.Now()
	xrep, err := trail.VerifyExport(ctx, bytes.NewReader(buf.Bytes()), int64(buf.Len()), trail.ExportVerifyOptions{Anchors: []ed25519.PublicKey{pub}})
	if err != nil {
		return res, err
	}
	if !xrep.OK() {
		return res, fmt.Errorf("the export's offline check found %d problems, the first: %+v", len(xrep.Problems), xrep.Problems[0])
	}
	res.ExportVerifyEventsPerS = float64(st.Total) / time.Since(start).Seconds()
	cfg.Progress("checked the export offline at %.0f events/s; proofs %.0f bytes a line (%.0f in base64)", res.ExportVerifyEventsPerS,
		res.ProofBytesPerEvent, res.ProofBase64BytesPerEvent)
	return res, nil
}

func orgName(i int) string { return fmt.Sprintf("org-%03d", i) }

// load stores the events as ingest would, and notes them on the stored-events topic.
func load(ctx context.Context, cfg Config, conn driver.Conn, db string, topics trail.Topics) error {
	st := store.New(conn, db)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: cfg.Brokers, Topic: topics.Stored, BatchSize: 1000})
	if err != nil {
		return err
	}
	defer p.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	now := time.Now().UTC()
	ingested := now.Add(-time.Minute).Truncate(time.Second)
	pad := strings.Repeat("x", max(0, cfg.DataBytes-40))
	const batch = 20_000
	for off := 0; off < cfg.Events; off += batch {
		n := min(batch, cfg.Events-off)
		rows := make([]store.EventRow, n)
		for i := range rows {
			k := off + i
			data, _ := json.Marshal(map[string]any{"content": fmt.Sprintf("message %d %s", k, pad)})
			rows[i] = store.EventRow{ID: fmt.Sprintf("bench-%08d", k), Type: schema.TypeMessageCreated,
				Time:  now.Add(-24 * time.Hour).Add(time.Duration(k) * 24 * time.Hour / time.Duration(cfg.Events)).Truncate(time.Millisecond),
				OrgID: orgName(k % cfg.Orgs), RoomID: fmt.Sprintf("room-%d", k%50), ActorID: fmt.Sprintf("agent-%d", k%200), ActorType: "agent",
				OwnerID: fmt.Sprintf("user-%d", k%20), Source: "band", SchemaVersion: 1, Data: string(data), IngestedAt: ingested,
				Partition: int32(k % 4), Offset: int64(k / 4)}
		}
		if err := st.BatchInsert(ctx, &store.Batch{Events: rows}); err != nil {
			return err
		}
		byOrg := map[string][]tlog.Leaf{}
		for i := range rows {
			byOrg[rows[i].OrgID] = append(byOrg[rows[i].OrgID], tlog.LeafOf(&rows[i]))
		}
		var msgs []kafkago.Message
		for org, leaves := range byOrg {
			for _, b := range tlog.EncodeNotes(leaves) {
				msgs = append(msgs, kafkago.Message{Key: []byte(org), Value: b})
			}
		}
		if err := p.ProduceMessages(ctx, msgs); err != nil {
			return err
		}
		cfg.Progress("stored and noted %d of %d events", off+n, cfg.Events)
	}
	return nil
}

// proofSizes reads the proofs of an NDJSON export's event lines: their mean size in
// hashes' bytes and as written (base64), and the largest number of hashes.
func proofSizes(export []byte) (raw, b64 float64, height int) {
	var n, rawSum, b64Sum int
	for line := range bytes.SplitSeq(export, []byte("\n")) {
		if !bytes.HasPrefix(line, []byte(`{"kind":"event"`)) {
			continue
		}
		var ev struct {
			Proof string `json:"proof"`
		}
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		n++
		b64Sum += len(ev.Proof)
		hashes := len(ev.Proof) * 3 / 4 / 32
		rawSum += hashes * 32
		height = max(height, hashes)
	}
	if n == 0 {
		return 0, 0, 0
	}
	return float64(rawSum) / float64(n), float64(b64Sum) / float64(n), height
}

func cleanup(conn driver.Conn, db string, brokers []string, topics trail.Topics) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db)
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	_, _ = c.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topics.Stored, topics.Checkpoints}})
}
