package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
)

func init() {
	registerGroup("prices", "set and list the model prices kept in ClickHouse (set, list)", pricesUsage,
		map[string]runFunc{"set": pricesSet, "list": pricesList})
}

const pricesUsage = `usage: bandplane prices <set|list> [flags]

  set --model M --input X --output Y [--cache-read X] [--cache-write X] [--currency USD] [--effective TIME] [--by WHO]
        a new catalog version with M's prices per million tokens from TIME (default now) on; a price.set audit event;
        every running serve prices new usage with it within 2 s (usage already stored: bandplane reprice)
  list [--table]
        the entries of the newest catalog version, one JSON line each (or a table)

Run 'bandplane prices <command> -h' for its flags.
`

// priceFlags are the flags every command that opens the price service shares.
type priceFlags struct {
	stack      stackFlags
	catalog    string
	partitions int
}

func (p *priceFlags) register(fs *flag.FlagSet) {
	p.stack.register(fs)
	fs.StringVar(&p.catalog, "catalog", envOr("BANDPLANE_CATALOG", ""), "catalog JSON file that seeds an empty prices table (default: the built-in catalog)")
	fs.IntVar(&p.partitions, "partitions", 4, "partitions of the events topic when it has to be created")
}

// open connects the price service; withAuditor also connects its audit producer
// (writes need it; a read-only service serves an empty table's seed from memory).
func (p *priceFlags) open(ctx context.Context, e *env, withAuditor bool, cfg prices.Config) (*prices.Service, func(), error) {
	seed, err := loadCatalog(p.catalog)
	if err != nil {
		return nil, nil, err
	}
	conn, err := p.stack.openDB(ctx)
	if err != nil {
		return nil, nil, err
	}
	cfg.Conn, cfg.Database, cfg.Seed, cfg.Logger = conn, p.stack.ch.Database, seed, e.log
	closeAll := func() { conn.Close() }
	if withAuditor {
		brokers := p.stack.brokers()
		if err := kafka.EnsureTopic(ctx, brokers, p.stack.topic, p.partitions); err != nil {
			conn.Close()
			return nil, nil, err
		}
		prod, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: p.stack.topic, BatchSize: 1, WriteTimeout: 15 * time.Second})
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		cfg.Auditor = prod
		closeAll = func() { _ = prod.Close(); _ = conn.Close() }
	} else {
		cfg.ReadOnly = true
	}
	svc, err := prices.New(ctx, cfg)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return svc, closeAll, nil
}

// fieldFlags maps the fields of the price service's errors to the flags that set them.
var fieldFlags = map[string]string{
	"model": "--model", "input": "--input", "output": "--output", "cache_read": "--cache-read", "cache_write": "--cache-write",
	"currency": "--currency", "effective": "--effective", "by": "--by", "org": "--org", "agent": "--agent", "from": "--from", "to": "--to",
}

// reportInvalid prints each field error of err as a bad flag (exit 2); other errors
// are returned as they are.
func reportInvalid(e *env, cmd string, err error) error {
	if !errors.Is(err, schema.ErrInvalid) {
		return err
	}
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var fe *schema.FieldError
		if errors.As(err, &fe) {
			name := fieldFlags[fe.Field]
			if name == "" {
				name = fe.Field
			}
			fmt.Fprintf(e.stderr, "bandplane %s: %s: %s\n", cmd, name, fe.Reason)
			return
		}
		fmt.Fprintf(e.stderr, "bandplane %s: %v\n", cmd, err)
	}
	walk(err)
	return exitError{code: 2}
}

func pricesSet(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "prices set", "--model M --input X --output Y [--cache-read X] [--cache-write X] [--currency USD] [--effective TIME] [flags]")
	var pf priceFlags
	pf.register(fs)
	var in prices.PriceInput
	fs.StringVar(&in.Model, "model", "", "model name, as usage reports it (required)")
	fs.StringVar(&in.Input, "input", "", "price per million input tokens, a decimal (required)")
	fs.StringVar(&in.Output, "output", "", "price per million output tokens, a decimal (required)")
	fs.StringVar(&in.CacheRead, "cache-read", "", "price per million cache-read tokens (default: the input price)")
	fs.StringVar(&in.CacheWrite, "cache-write", "", "price per million cache-write tokens (default: the input price)")
	fs.StringVar(&in.Currency, "currency", "", "currency, a 3-letter code; must be the catalog's (default: the catalog's)")
	effective := fs.String("effective", "", "when the prices take effect, RFC 3339 or YYYY-MM-DD (default: now)")
	by := fs.String("by", defaultBy(), "who sets the price, recorded with it and in its audit event (default $USER@hostname)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		fmt.Fprintf(e.stderr, "bandplane prices set: %s\n", fmt.Sprintf(format, args...))
		return exitError{code: 2}
	}
	switch {
	case len(pos) > 0:
		return bad("unexpected argument %q", pos[0])
	case in.Model == "":
		return bad("--model is required")
	case in.Input == "":
		return bad("--input is required (a decimal price per million tokens)")
	case in.Output == "":
		return bad("--output is required (a decimal price per million tokens)")
	}
	if *effective != "" {
		if in.Effective, err = parseDay(*effective); err != nil {
			return bad("--effective: %v", err)
		}
	}
	svc, closeSvc, err := pf.open(ctx, e, true, prices.Config{})
	if err != nil {
		return err
	}
	defer closeSvc()
	v, err := svc.SetPrice(ctx, *by, in)
	if err != nil {
		return reportInvalid(e, "prices set", err)
	}
	return printJSON(e.stdout, v)
}

func pricesList(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "prices list", "[--table] [flags]")
	var pf priceFlags
	pf.register(fs)
	table := fs.Bool("table", false, "print a table instead of one JSON line per entry")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		fmt.Fprintf(e.stderr, "bandplane prices list: unexpected argument %q\n", pos[0])
		return exitError{code: 2}
	}
	svc, closeSvc, err := pf.open(ctx, e, false, prices.Config{})
	if err != nil {
		return err
	}
	defer closeSvc()
	list, err := svc.ListPrices(ctx)
	if err != nil {
		return err
	}
	if !*table {
		for _, p := range list {
			if err := printJSON(e.stdout, p); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tEFFECTIVE\tINPUT\tOUTPUT\tCACHE READ\tCACHE WRITE\tCURRENCY\tVERSION\tSET BY\tSET AT\tALIASES")
	for _, p := range list {
		setAt := "-"
		if !p.SetAt.IsZero() {
			setAt = p.SetAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", p.Model, p.Effective.Format(time.RFC3339), p.Input, p.Output,
			p.CacheRead, p.CacheWrite, p.Currency, p.CatalogVersion, dash(p.SetBy), setAt, dash(strings.Join(p.Aliases, ",")))
	}
	return tw.Flush()
}
