package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/chdb"
)

func init() {
	register("migrate", "create or upgrade the ClickHouse schema", runMigrate)
	register("retention", "drop partitions older than the retention limits", runRetention)
}

func runMigrate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "migrate", "[flags]")
	var st stackFlags
	st.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := chdb.Open(ctx, st.ch)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := chdb.MigrateOn(ctx, conn, st.ch)
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(e.stdout, "database %s is up to date at schema version %d\n", st.ch.Database, res.To)
		return nil
	}
	fmt.Fprintf(e.stdout, "database %s migrated from version %d to %d: applied %v\n", st.ch.Database, res.From, res.To, res.Applied)
	return nil
}

func runRetention(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "retention", "[--audit-key FILE] [flags]")
	var st stackFlags
	st.register(fs)
	r := chdb.DefaultRetention()
	fs.DurationVar(&r.Events, "events", r.Events, "keep events and usage facts this long (0 = forever)")
	fs.DurationVar(&r.Rollup, "rollup", r.Rollup, "keep the hourly rollup this long (0 = forever)")
	fs.DurationVar(&r.DeadLetters, "dead-letters", r.DeadLetters, "keep dead letters this long (0 = forever)")
	dry := fs.Bool("dry-run", false, "list the partitions that would be dropped, drop nothing")
	keyFile := auditKeyFlag(fs, "Ed25519 private audit key (bandplane audit keygen): sign the retention cuts, so that audit verify "+
		"counts the sealed events dropped as expired; without it the cuts are unsigned and verify reports those events missing")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := r.Validate(); err != nil {
		return err
	}
	opts := chdb.RetentionOptions{DryRun: *dry}
	if *keyFile != "" {
		key, err := trail.LoadPrivateKey(*keyFile)
		if err != nil {
			return fmt.Errorf("--audit-key: %w", err)
		}
		prefix, err := st.prefix()
		if err != nil {
			return err
		}
		opts.Sign = trail.CutSigner(key, st.ch.Database, prefix)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := chdb.ApplyRetention(ctx, conn, st.ch, r, time.Now(), opts)
	if opts.Sign == nil {
		warnUnsigned(ctx, e, conn, st.ch.Database, res, *dry)
	}
	if perr := printJSON(e.stdout, map[string]any{"dry_run": *dry, "dropped": res.Dropped, "cuts": res.Cuts}); perr != nil {
		return perr
	}
	return err
}

// warnUnsigned warns when retention without the audit key drops sealed events: verify
// does not honour an unsigned cut (anyone could insert one), so it will report them
// missing.
func warnUnsigned(ctx context.Context, e *env, conn driver.Conn, db string, res chdb.RetentionResult, dry bool) {
	var days []string
	for _, d := range res.Dropped {
		if d.Table == "events" {
			days = append(days, d.Partition)
		}
	}
	if len(days) == 0 {
		return
	}
	n, err := trail.SealedIn(ctx, conn, db, days)
	if err != nil {
		e.log.Warn("retention without --audit-key: its cut is unsigned, and the sealed events it drops cannot be counted", "err", err)
		return
	}
	if n == 0 {
		return
	}
	verb := "dropped"
	if dry {
		verb = "would drop"
	}
	e.log.Warn(fmt.Sprintf("retention without --audit-key %s sealed events under an unsigned cut: audit verify will report them missing (pass --audit-key to sign the cut)", verb),
		"sealed_events", n, "partitions", len(days))
}
