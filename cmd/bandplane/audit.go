package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/bandplane/bandplane/ingest/kafka"
	"github.com/bandplane/bandplane/ingest/seal"
)

func init() {
	registerGroup("audit", "tamper-evident audit trail: keygen, seal, verify, export", auditUsage, map[string]runFunc{
		"keygen": func(_ context.Context, e *env, args []string) error { return runAuditKeygen(e, args) },
		"seal":   runAuditSeal, "verify": runAuditVerify, "export": runAuditExport,
	})
}

const auditUsage = `usage: bandplane audit <keygen|seal|verify|export> [flags]

  keygen --out FILE      make an Ed25519 audit key (FILE, mode 0600) and its public half (FILE.pub)
  seal --audit-key FILE  seal what was ingested, now (serve --audit-key does it every --seal-every)
  verify --audit-key FILE [--org ORG] [--from T] [--to T]
                         recompute everything sealed; exit 0 if it matches, 1 if not;
                         the last line on stdout is the report as JSON
  verify --export FILE --audit-key FILE.pub
                         check a compliance export offline (no database): seals, manifest, every line
  export --out FILE --from T --to T [--format ndjson|csv] [--type T] [--actor A] [--room R] [--org ORG]
         [--server URL] [--key TOKEN] [--resume]
                         a signed export of one organization's sealed trail from bandplane serve

Run 'bandplane audit <command> -h' for a command's flags.
`

func auditKeyFlag(fs *flag.FlagSet, what string) *string {
	return fs.String("audit-key", envOr("BANDPLANE_AUDIT_KEY", ""), what+" (env BANDPLANE_AUDIT_KEY)")
}

func runAuditKeygen(e *env, args []string) error {
	fs := newFlagSet(e, "audit keygen", "--out FILE")
	out := fs.String("out", "", "private key file to create (mode 0600); the public key goes to FILE.pub (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		fs.Usage()
		return errors.New("--out is required")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := seal.GenerateKey(*out); err != nil {
		return err
	}
	pub, err := seal.LoadPublicKey(*out + ".pub")
	if err != nil {
		return err
	}
	return printJSON(e.stdout, map[string]string{"key_id": seal.KeyID(pub), "private": *out, "public": *out + ".pub"})
}

func runAuditSeal(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit seal", "--audit-key FILE [flags]")
	var st stackFlags
	st.register(fs)
	keyFile := auditKeyFlag(fs, "Ed25519 private key file (bandplane audit keygen)")
	settle := fs.Duration("settle", seal.DefaultSettle, "leave rows ingested this recently for the next seal")
	margin := fs.Duration("margin", seal.DefaultMargin, "look again this far before the last watermark for rows that landed late (verify needs the same)")
	if err := parse(fs, args); err != nil {
		return err
	}
	key, err := seal.LoadPrivateKey(*keyFile)
	if err != nil {
		return fmt.Errorf("--audit-key: %w", err)
	}
	if *settle <= 0 {
		return fmt.Errorf("--settle must be > 0, got %s", *settle)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: st.brokers(), Topic: st.topic, BatchSize: kafka.AuditBatchSize})
	if err != nil {
		return err
	}
	defer p.Close()
	s, err := seal.New(seal.Config{Conn: conn, Database: st.ch.Database, Key: key, Producer: p,
		Settle: *settle, Margin: *margin, Logger: e.log})
	if err != nil {
		return err
	}
	res, err := s.SealNow(ctx)
	if perr := printJSON(e.stdout, res); perr != nil {
		return perr
	}
	return err
}

func runAuditVerify(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit verify", "--audit-key FILE [--org ORG] [--from T] [--to T] [flags] | --export FILE --audit-key FILE")
	var st stackFlags
	st.register(fs)
	keyFile := auditKeyFlag(fs, "the audit key: the public key file (FILE.pub) suffices, the private one works too")
	export := fs.String("export", "", "check this export file (bandplane audit export) offline instead of the database")
	org := fs.String("org", "", `verify only this organization's chain ("" is the chain of events stored without one; default: every chain)`)
	from := fs.String("from", "", "only events at or after this time, RFC 3339 or YYYY-MM-DD")
	to := fs.String("to", "", "only events before this time, RFC 3339 or YYYY-MM-DD")
	margin := fs.Duration("margin", seal.DefaultMargin, "the sealer's --margin: unsealed rows ingested that long before the last seal are unexpected")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *export != "" {
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments %q", fs.Args())
		}
		var online []string
		fs.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "org", "from", "to", "margin":
				online = append(online, "--"+fl.Name)
			}
		})
		if len(online) > 0 {
			return fmt.Errorf("%s: not with --export (an export names its own selection)", strings.Join(online, ", "))
		}
		return runAuditVerifyExport(ctx, e, *export, *keyFile)
	}
	var f seal.Filter
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "org" {
			f.Orgs = []string{*org}
		}
	})
	var err error
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
	pub, err := seal.LoadPublicKey(*keyFile)
	if err != nil {
		return fmt.Errorf("--audit-key: %w", err)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	start := time.Now()
	rep, err := seal.Verify(ctx, conn, st.ch.Database, pub, f)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "audit verify: %d seals, %d sealed events, %d unsealed, %d expired, %d problems in %s\n",
		rep.Seals, rep.SealedEvents, rep.UnsealedEvents, rep.ExpiredEvents, len(rep.Problems), time.Since(start).Round(time.Millisecond))
	if err := printJSON(e.stdout, rep); err != nil {
		return err
	}
	if !rep.OK() {
		return exitError{code: 1}
	}
	return nil
}
