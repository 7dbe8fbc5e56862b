package main

import (
	"context"
	"fmt"
	"time"

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
	res, err := chdb.Migrate(ctx, conn, st.ch.Database)
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
	fs := newFlagSet(e, "retention", "[flags]")
	var st stackFlags
	st.register(fs)
	r := chdb.DefaultRetention()
	fs.DurationVar(&r.Events, "events", r.Events, "keep events and usage facts this long (0 = forever)")
	fs.DurationVar(&r.Rollup, "rollup", r.Rollup, "keep the hourly rollup this long (0 = forever)")
	fs.DurationVar(&r.DeadLetters, "dead-letters", r.DeadLetters, "keep dead letters this long (0 = forever)")
	dry := fs.Bool("dry-run", false, "list the partitions that would be dropped, drop nothing")
	if err := parse(fs, args); err != nil {
		return err
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	dropped, err := chdb.ApplyRetention(ctx, conn, st.ch.Database, r, time.Now(), *dry)
	out := map[string]any{"dry_run": *dry, "dropped": dropped}
	if dropped == nil {
		out["dropped"] = []chdb.Dropped{}
	}
	if perr := printJSON(e.stdout, out); perr != nil {
		return perr
	}
	return err
}
