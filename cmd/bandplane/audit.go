package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/tlog"
)

func init() {
	registerGroup("audit", "tamper-evident audit trail: keygen, seal, verify, export, checkpoint, witness, rotate", auditUsage, map[string]runFunc{
		"keygen": func(_ context.Context, e *env, args []string) error { return runAuditKeygen(e, args) },
		"seal":   runAuditSeal, "verify": runAuditVerify, "export": runAuditExport,
		"checkpoint": runAuditCheckpoint, "witness": runAuditWitness, "rotate": runAuditRotate,
	})
}

const auditUsage = `usage: bandplane audit <keygen|seal|verify|export|checkpoint|witness|rotate> [flags]

  keygen --out FILE      make an Ed25519 audit key (FILE, mode 0600) and its public half (FILE.pub)
  seal --audit-key FILE  seal what ingest stored, now (serve --audit-key does it every --seal-every)
  verify --audit-key FILE.pub [--org ORG] [--from T] [--to T] [--checkpoint FILE ...]
                         check the trail against each organization's log: exit 0 if it matches, 1 if not;
                         the last line on stdout is the report as JSON
  verify --export FILE --audit-key FILE.pub [--checkpoint FILE ...]
                         check a compliance export offline (no database): the checkpoint, the manifest, every line
  export --out FILE --from T --to T [--format ndjson|csv] [--type T] [--actor A] [--room R] [--org ORG]
         [--server URL] [--key TOKEN] [--resume] [--checkpoint FILE]
                         a signed export of one organization's sealed trail from bandplane serve
  checkpoint [--org ORG] [--out FILE] [--server URL] [--key TOKEN]
                         an organization's newest signed checkpoint (C2SP tlog-checkpoint), from bandplane serve
  witness --state DIR --audit-key FILE.pub [--server URL] [--key TOKEN] [--every D]
                         keep every organization's newest checkpoint, check each new one by a consistency
                         proof, cosign it (C2SP tlog-cosignature); exit 1 on a rollback or a fork
  rotate --audit-key OLD --new-key NEW [--from T]
                         hand the log over from the old audit key to the new one (a record signed by both)

Run 'bandplane audit <command> -h' for a command's flags.
`

// auditAnchors loads the public keys a trail is checked against: the --audit-key
// files, or env's (BANDPLANE_AUDIT_KEY, read by the command) when none is given. It
// needs at least one.
func auditAnchors(keyFiles listFlag, env string) ([]ed25519.PublicKey, error) {
	if len(keyFiles) == 0 && env != "" {
		keyFiles = listFlag{env}
	}
	var anchors []ed25519.PublicKey
	for _, f := range keyFiles {
		pub, err := trail.LoadPublicKey(f)
		if err != nil {
			return nil, fmt.Errorf("--audit-key: %w", err)
		}
		anchors = append(anchors, pub)
	}
	if len(anchors) == 0 {
		return nil, errors.New("--audit-key: no audit key given (the public key file suffices)")
	}
	return anchors, nil
}

func auditKeyFlag(fs *flag.FlagSet, what string) *string {
	return fs.String("audit-key", envOr("BANDPLANE_AUDIT_KEY", ""), what+" (env BANDPLANE_AUDIT_KEY)")
}

func runAuditKeygen(e *env, args []string) error {
	fs := newFlagSet(e, "audit keygen", "--out FILE")
	out := fs.String("out", "", "private key file to create (mode 0600); the public key goes to FILE.pub (required)")
	var st stackFlags
	st.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	prefix, err := st.prefix()
	if err != nil {
		return err
	}
	if *out == "" {
		fs.Usage()
		return errors.New("--out is required")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := trail.GenerateKey(*out); err != nil {
		return err
	}
	pub, err := trail.LoadPublicKey(*out + ".pub")
	if err != nil {
		return err
	}
	vkey, err := tlog.VerifierKey(prefix, pub)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, map[string]string{"key_id": tlog.KeyID(pub), "private": *out, "public": *out + ".pub", "verifier_key": vkey})
}

func runAuditSeal(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit seal", "--audit-key FILE [flags]")
	var st stackFlags
	st.register(fs)
	keyFile := auditKeyFlag(fs, "Ed25519 private key file (bandplane audit keygen)")
	group := fs.String("group", "ingest", "the ingest consumer group (serve's --group): its offsets are what the coverage note signs")
	if err := parse(fs, args); err != nil {
		return err
	}
	key, err := trail.LoadPrivateKey(*keyFile)
	if err != nil {
		return fmt.Errorf("--audit-key: %w", err)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The operator's priority: the group gives this run the whole stored-events topic,
	// taking it from serve's sealer until it leaves.
	fmt.Fprintln(e.stderr, "audit seal: joining the sealers' group (a running serve hands the topic over)")
	s, closeSealer, err := newSealer(ctx, &st, conn, key, time.Minute, sealerPriorityOperator, *group, e.log, nil)
	if err != nil {
		return err
	}
	defer func() { _ = closeSealer() }()
	res, err := s.SealNow(ctx)
	if perr := printJSON(e.stdout, res); perr != nil {
		return perr
	}
	if err == nil && len(res.Refused) > 0 {
		return exitError{code: 1}
	}
	return err
}

func runAuditVerify(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit verify", "--audit-key FILE [--org ORG] [--from T] [--to T] [--checkpoint FILE ...] [flags] | --export FILE --audit-key FILE")
	var st stackFlags
	st.register(fs)
	var keyFiles listFlag
	fs.Var(&keyFiles, "audit-key", "an audit key the trail is checked against (repeatable): the public key file (FILE.pub) suffices, the private one works too; the first or the current key, rotations link the others (env BANDPLANE_AUDIT_KEY)")
	export := fs.String("export", "", "check this export file (bandplane audit export) offline instead of the database")
	org := fs.String("org", "", `verify only this organization's log ("" is the log of events stored without one; default: every log)`)
	from := fs.String("from", "", "only events at or after this time, RFC 3339 or YYYY-MM-DD")
	to := fs.String("to", "", "only events before this time, RFC 3339 or YYYY-MM-DD")
	margin := fs.Duration("margin", trail.DefaultMargin, "a stored row may lack its leaf this long after its ingested_at; longer before the newest checkpoint, it is unexpected (not with the checkpoints topic's coverage note: then its Kafka record decides)")
	var checkpoints listFlag
	fs.Var(&checkpoints, "checkpoint", "a checkpoint kept outside ClickHouse (bandplane audit checkpoint --out, a witness's state file): the log must extend it (repeatable)")
	useTopic := fs.Bool("checkpoints-topic", true, "also check the log against the newest checkpoints on the checkpoints topic (<topic>.checkpoints): catches a truncation or a rollback of ClickHouse, and with its coverage note and the events topic's records, rows written into ClickHouse by hand whatever their ingested_at or Kafka record")
	group := fs.String("group", "ingest", "the ingest consumer group (serve's --group, whose default this is): a coverage note of another group is ignored")
	if err := parse(fs, args); err != nil {
		return err
	}
	anchors, err := auditAnchors(keyFiles, os.Getenv("BANDPLANE_AUDIT_KEY"))
	if err != nil {
		return err
	}
	var saved []trail.External
	for _, f := range checkpoints {
		b, err := readBounded(f, tlog.MaxNoteBytes)
		if err != nil {
			return fmt.Errorf("--checkpoint: %w", err)
		}
		saved = append(saved, trail.External{Source: "checkpoint file " + f, Note: b})
	}
	if *export != "" {
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments %q", fs.Args())
		}
		var online []string
		fs.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "org", "from", "to", "margin", "checkpoints-topic", "group":
				online = append(online, "--"+fl.Name)
			}
		})
		if len(online) > 0 {
			return fmt.Errorf("%s: not with --export (an export names its own selection)", strings.Join(online, ", "))
		}
		return runAuditVerifyExport(ctx, e, *export, anchors, saved)
	}
	f := trail.Filter{Checkpoints: saved}
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "org" {
			f.Orgs = []string{*org}
		}
	})
	if *from != "" {
		if f.From, err = parseDay(*from); err != nil {
			return fmt.Errorf("--from: %w", err)
		}
	}
	if *to != "" {
		if f.To, err = parseDay(*to); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
	}
	f.Margin, f.Progress = *margin, e.stderr
	if err := f.Validate(); err != nil {
		return err
	}
	prefix, err := st.prefix()
	if err != nil {
		return err
	}
	var rotations [][]byte
	if *useTopic {
		latest, err := kafka.ReadLatest(ctx, st.brokers(), st.checkpointTopic())
		if err != nil {
			return fmt.Errorf("cannot read the checkpoints topic %s (--checkpoints-topic=false checks against ClickHouse alone): %w", st.checkpointTopic(), err)
		}
		for key, note := range latest {
			if strings.HasPrefix(key, trail.RotationKeyPrefix) {
				rotations = append(rotations, note)
				continue
			}
			if key == trail.CoverageKey {
				f.Coverage = note
				continue
			}
			f.Checkpoints = append(f.Checkpoints, trail.External{Source: fmt.Sprintf("the checkpoints topic's newest of org %q", key), Note: note})
		}
		// A row no leaf covers yet is checked against the record it claims: it must be
		// there, below the end, and be this event.
		f.EventsTopic, f.IngestGroup = st.topic, *group
		f.Records = trail.KafkaRecords(st.brokers(), st.topic, 0)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	start := time.Now()
	rep, err := trail.Verify(ctx, conn, st.ch.Database, trail.Keys{Prefix: prefix, Anchors: anchors, Rotations: rotations}, f)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "audit verify: %d organizations, %d checkpoints, %d leaves, %d sealed events, %d unsealed, %d expired, %d problems in %s\n",
		rep.Orgs, rep.Checkpoints, rep.Leaves, rep.SealedEvents, rep.UnsealedEvents, rep.ExpiredEvents, len(rep.Problems), time.Since(start).Round(time.Millisecond))
	if err := printJSON(e.stdout, rep); err != nil {
		return err
	}
	if !rep.OK() {
		return exitError{code: 1}
	}
	return nil
}

// readBounded reads a small file whole, refusing one over max bytes.
func readBounded(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	if len(b) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a checkpoint", path, max)
	}
	return b, nil
}
