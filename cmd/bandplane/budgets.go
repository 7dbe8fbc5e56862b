package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/store"
)

func init() {
	registerGroup("budgets", "set, list and delete spend budgets (set, list, delete)", budgetsUsage,
		map[string]runFunc{"set": budgetsSet, "list": budgetsList, "delete": budgetsDelete})
}

const budgetsUsage = `usage: bandplane budgets <set|list|delete> [flags]

  set --org ORG --scope org|owner|agent|room|initiator [--id ID] --period day|month [--tokens N] [--cost DECIMAL] [--mode hard|soft]
                                 set (add or replace) the budget of one scope and period; prints it
  list [--org ORG] [--table]     the budgets in force, from the trail in ClickHouse (spend and
                                 reservations: the GraphQL budgets query of a running serve)
  delete --org ORG --id BUDGET   remove a budget

Each change is a budget.set or budget.deleted event on the events topic: every serve's
policy side applies it within a second, and it is in the audit trail.
Run 'bandplane budgets <command> -h' for its flags.
`

func budgetFlagError(e *env, cmd, format string, args ...any) error {
	fmt.Fprintf(e.stderr, "bandplane budgets %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return exitError{code: 2}
}

// cliKey is who a CLI change is recorded as: the --by name (no API key is involved).
func cliKey(by string) keys.Key { return keys.Key{ID: "cli:" + by, Name: by} }

// produceOwn writes bandplane's own events, one at a time, waiting for Kafka.
func produceOwn(ctx context.Context, st *stackFlags, partitions int, events ...schema.Event) error {
	brokers := st.brokers()
	if err := kafka.EnsureTopic(ctx, brokers, st.topic, partitions); err != nil {
		return err
	}
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: st.topic, BatchSize: 1, WriteTimeout: 15 * time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = p.Close() }()
	return p.Produce(ctx, events)
}

func budgetsSet(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "budgets set", "--org ORG --scope SCOPE [--id ID] --period PERIOD [--tokens N] [--cost DECIMAL] [--mode hard|soft]")
	var kf keysFlags
	kf.register(fs)
	org := fs.String("org", "", "organization of the budget; required")
	scope := fs.String("scope", "", "what it counts: org, owner, agent, room or initiator (a person, or a system such as schedule, and everything they set going); required")
	id := fs.String("id", "", "the owner, agent, room or initiator (not for --scope org)")
	period := fs.String("period", "", "day or month (UTC); required")
	tokens := fs.Int64("tokens", 0, "token limit (0: none)")
	cost := fs.String("cost", "", "cost limit in the billing currency, a decimal with at most 6 places (empty: none)")
	mode := fs.String("mode", "hard", "hard (deny what would pass it) or soft (alert only)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return budgetFlagError(e, "set", "unexpected argument %q", pos[0])
	}
	if *mode != "hard" && *mode != "soft" {
		return budgetFlagError(e, "set", "--mode: %q is not hard or soft", *mode)
	}
	b := policy.Budget{Org: *org, Scope: policy.BudgetScope(*scope), ScopeID: *id, Period: policy.Period(*period),
		Tokens: *tokens, Hard: *mode == "hard", UpdatedAt: time.Now().UTC(), UpdatedBy: "cli:" + kf.by}
	if *cost != "" {
		m, err := policy.ParseCostMicros(*cost)
		if err != nil {
			return budgetFlagError(e, "set", "--cost: %v", err)
		}
		b.CostMicros = m
	}
	b.Normalize()
	if err := b.Validate(); err != nil {
		return budgetFlagError(e, "set", "%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	conn, err := kf.stack.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if b.Scope == policy.ScopeAgent || b.Scope == policy.ScopeOwner {
		rows, err := store.New(conn, kf.stack.ch.Database).LoadDirectory(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(rows, func(r store.DirectoryRow) bool { return r.ID == b.ScopeID && r.OrgID == b.Org }) {
			return fmt.Errorf("cannot set the budget: %s %q is not registered in organization %s", b.Scope, b.ScopeID, b.Org)
		}
	}
	inForce, err := storedBudgets(ctx, &kf.stack, b.Org)
	if err != nil {
		return err
	}
	if len(inForce) >= policy.MaxBudgetsPerOrg && !slices.ContainsFunc(inForce, func(x policy.Budget) bool { return x.ID == b.ID }) {
		return fmt.Errorf("cannot set the budget: organization %s has %d budgets, the most it may have; delete one first", b.Org, len(inForce))
	}
	if err := produceOwn(ctx, &kf.stack, kf.partitions, api.BudgetEvent(schema.TypeBudgetSet, b, cliKey(kf.by))); err != nil {
		return fmt.Errorf("cannot record the budget on %s (it is not set): %w", kf.stack.topic, err)
	}
	return printJSON(e.stdout, b)
}

// storedBudgets are the budgets in force that ingest keeps (of org, or of every
// organization), checked as the policy replica checks them.
func storedBudgets(ctx context.Context, st *stackFlags, org string) ([]policy.Budget, error) {
	conn, err := st.openDB(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rows, err := store.New(conn, st.ch.Database).Budgets(ctx, org)
	if err != nil {
		return nil, err
	}
	var out []policy.Budget
	for _, r := range rows {
		var b policy.Budget
		if r.Deleted || schema.DecodeData([]byte(r.Data), &b) != nil || b.Org != r.OrgID {
			continue
		}
		b.Normalize()
		if b.Validate() == nil {
			out = append(out, b)
		}
	}
	return out, nil
}

func budgetsList(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "budgets list", "[--org ORG] [--table] [flags]")
	var st stackFlags
	st.register(fs)
	org := fs.String("org", "", "only this organization's budgets")
	table := fs.Bool("table", false, "print a table instead of one JSON line per budget")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return budgetFlagError(e, "list", "unexpected argument %q", pos[0])
	}
	list, err := storedBudgets(ctx, &st, *org)
	if err != nil {
		return err
	}
	if !*table {
		for _, b := range list {
			if err := printJSON(e.stdout, b); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tORG\tSCOPE\tSCOPE ID\tPERIOD\tTOKENS\tCOST\tMODE\tUPDATED\tBY")
	for _, b := range list {
		mode := "soft"
		if b.Hard {
			mode = "hard"
		}
		tok, cost := "-", "-"
		if b.Tokens > 0 {
			tok = fmt.Sprint(b.Tokens)
		}
		if b.CostMicros > 0 {
			cost = decimal.New(b.CostMicros, -6).StringFixed(2)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b.ID, b.Org, b.Scope, b.ScopeID, b.Period, tok, cost, mode,
			b.UpdatedAt.Format(time.RFC3339), b.UpdatedBy)
	}
	return tw.Flush()
}

func budgetsDelete(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "budgets delete", "--org ORG --id BUDGET [flags]")
	var kf keysFlags
	kf.register(fs)
	org := fs.String("org", "", "organization of the budget; required")
	id := fs.String("id", "", "the budget's id (budgets list); required")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return budgetFlagError(e, "delete", "unexpected argument %q", pos[0])
	}
	if *org == "" || *id == "" {
		return budgetFlagError(e, "delete", "--org and --id are required")
	}
	list, err := storedBudgets(ctx, &kf.stack, *org)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(list, func(b policy.Budget) bool { return b.ID == *id })
	if i < 0 {
		return errors.New("cannot delete: organization " + *org + " has no budget " + *id + " (budgets list --org " + *org + ")")
	}
	b := list[i]
	b.UpdatedAt, b.UpdatedBy = time.Now().UTC(), "cli:"+kf.by
	if err := produceOwn(ctx, &kf.stack, kf.partitions, api.BudgetEvent(schema.TypeBudgetDeleted, b, cliKey(kf.by))); err != nil {
		return fmt.Errorf("cannot record the deletion on %s (the budget stays): %w", kf.stack.topic, err)
	}
	return printJSON(e.stdout, b)
}
