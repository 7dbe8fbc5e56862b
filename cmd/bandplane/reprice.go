package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
)

func init() {
	register("reprice", "recompute usage costs in a time range with the newest price catalog, as a job (prints progress)", runReprice)
}

func runReprice(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "reprice", "--from TIME [--to TIME] [--org ORG] [--agent ID] [flags] | --cancel JOB")
	var pf priceFlags
	pf.register(fs)
	from := fs.String("from", "", "start of the range, RFC 3339 or YYYY-MM-DD (inclusive; required)")
	to := fs.String("to", "", "end of the range, RFC 3339 or YYYY-MM-DD (exclusive; default: now)")
	org := fs.String("org", keys.PlatformOrg, "only this organization's usage ('*': every organization)")
	agent := fs.String("agent", "", "only this agent's usage")
	by := fs.String("by", defaultBy(), "who asks, recorded in the job and its audit events (default $USER@hostname)")
	cancel := fs.String("cancel", "", "cancel this job (queued or running, here or in a serve) instead")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "bandplane reprice: unexpected argument %q\n", fs.Arg(0))
		return exitError{code: 2}
	}
	if *cancel != "" {
		svc, closeSvc, err := pf.open(ctx, e, true, prices.Config{})
		if err != nil {
			return err
		}
		defer closeSvc()
		j, err := svc.Cancel(ctx, *by, *cancel)
		if err != nil {
			return reportInvalid(e, "reprice", err)
		}
		return printJSON(e.stdout, j)
	}
	if *from == "" {
		fs.Usage()
		return fmt.Errorf("--from is required")
	}
	f, err := parseDay(*from)
	if err != nil {
		return fmt.Errorf("--from: %w", err)
	}
	t := time.Now().UTC()
	if *to != "" {
		if t, err = parseDay(*to); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
	}
	if !t.After(f) {
		return fmt.Errorf("--to (%s) must be after --from (%s)", t.Format(time.RFC3339), f.Format(time.RFC3339))
	}
	progress := func(j prices.Job) {
		fmt.Fprintf(e.stderr, "reprice job %s: %s, day %d of %d (up to %s), %d rows scanned, %d changed, catalog version %d\n",
			j.ID, j.State, j.DaysDone, j.DaysTotal, j.Cursor.Format(time.RFC3339), j.RowsScanned, j.RowsChanged, j.CatalogVersion)
	}
	svc, closeSvc, err := pf.open(ctx, e, true, prices.Config{OnProgress: progress})
	if err != nil {
		return err
	}
	defer closeSvc()
	if pf.catalog != "" {
		if err := sameCatalog(ctx, svc, pf.catalog); err != nil {
			return err
		}
	}
	j, err := svc.RunNow(ctx, *by, *org, *agent, f, t)
	if err != nil && j.ID == "" {
		return reportInvalid(e, "reprice", err)
	}
	if perr := printJSON(e.stdout, j); perr != nil {
		return perr
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintf(e.stderr, "reprice job %s is queued again at %s: a running serve finishes it (or `bandplane reprice --cancel %s`)\n",
			j.ID, j.Cursor.Format(time.RFC3339), j.ID)
	}
	return err
}

// sameCatalog refuses a --catalog whose prices are not those in ClickHouse: prices are
// data now, and a reprice applies the newest stored version (the file only seeds an
// empty table, as in serve).
func sameCatalog(ctx context.Context, svc *prices.Service, path string) error {
	file, err := pricing.Load(path)
	if err != nil {
		return err
	}
	stored, err := svc.ListPrices(ctx)
	if err != nil {
		return err
	}
	have := map[string]prices.PriceVersion{}
	for _, p := range stored {
		have[p.Model+"@"+p.Effective.Format(time.RFC3339)] = p
	}
	var differ []string
	for _, p := range file.Prices() {
		s, ok := have[p.Model+"@"+p.Effective.Format(time.RFC3339)]
		if !ok || s.Input != pricing.FormatPrice(p.Input) || s.Output != pricing.FormatPrice(p.Output) ||
			s.CacheRead != pricing.FormatPrice(p.CacheRead) || s.CacheWrite != pricing.FormatPrice(p.CacheWrite) || s.Currency != file.Currency() {
			differ = append(differ, p.Model)
		}
	}
	if len(differ) == 0 {
		return nil
	}
	sort.Strings(differ)
	if len(differ) > 5 {
		differ = append(differ[:5], "…")
	}
	return fmt.Errorf("--catalog %s differs from the prices in ClickHouse (catalog version %d) for %s: prices are kept in ClickHouse now; "+
		"set them with `bandplane prices set`, then reprice (--catalog only seeds an empty prices table)", path, svc.CurrentVersion(), strings.Join(differ, ", "))
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
