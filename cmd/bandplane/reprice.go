package main

import (
	"context"
	"fmt"
	"time"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/store"
)

func init() {
	register("reprice", "recompute usage costs in a time range with the current price catalog", runReprice)
}

func runReprice(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "reprice", "--from TIME --to TIME [flags]")
	var st stackFlags
	st.register(fs)
	from := fs.String("from", "", "start of the range, RFC 3339 or YYYY-MM-DD (inclusive; required)")
	to := fs.String("to", "", "end of the range, RFC 3339 or YYYY-MM-DD (exclusive; default: now)")
	catalog := fs.String("catalog", envOr("BANDPLANE_CATALOG", ""), "price catalog JSON file (default: the built-in catalog)")
	agent := fs.String("agent", "", "only this agent's usage")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *from == "" {
		fs.Usage()
		return fmt.Errorf("--from is required")
	}
	f := store.UsageFilter{AgentID: *agent, To: time.Now().UTC()}
	var err error
	if f.From, err = parseDay(*from); err != nil {
		return fmt.Errorf("--from: %w", err)
	}
	if *to != "" {
		if f.To, err = parseDay(*to); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
	}
	if !f.To.After(f.From) {
		return fmt.Errorf("--to (%s) must be after --from (%s)", f.To.Format(time.RFC3339), f.From.Format(time.RFC3339))
	}
	cat, err := loadCatalog(*catalog)
	if err != nil {
		return err
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	s := store.New(conn, st.ch.Database)
	dir := ingest.NewDirectory()
	rows, err := s.LoadDirectory(ctx)
	if err != nil {
		return err
	}
	dir.Load(rows)
	res, err := ingest.Reprice(ctx, s, dir, cat, f)
	if perr := printJSON(e.stdout, res); perr != nil {
		return perr
	}
	return err
}

func parseDay(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	t, err := time.Parse("2006-01-02", s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor YYYY-MM-DD", s)
	}
	return t, nil
}
