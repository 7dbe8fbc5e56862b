package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/policy/replay"
)

const policyReplayUsage = "--bundle DIR [--from T] [--to T] [--org ORG] [--kinds a,b] [--examples N] [--max-memory BYTES]  (needs ClickHouse)"

// runPolicyReplay is `bandplane policy replay`: the recorded decisions of a range,
// decided again by a candidate bundle against the state each live decision saw. The
// summary and progress go to stderr, the result document to stdout.
func runPolicyReplay(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "policy replay", policyReplayUsage)
	var st stackFlags
	st.register(fs)
	bundle := fs.String("bundle", "", "the candidate bundle: a policy folder (.rego files, their tests, data.json), as serve's --policy-dir (required)")
	from := fs.String("from", "", "replay decisions at or after this time, RFC 3339 or YYYY-MM-DD (default: 24 hours before --to)")
	to := fs.String("to", "", "replay decisions before this time, RFC 3339 or YYYY-MM-DD (default: now)")
	org := fs.String("org", "", "replay only this organization's decisions (the state is every organization's, as the live decisions read it)")
	kinds := fs.String("kinds", "", "comma-separated decision kinds to replay (default all: "+strings.Join(slices.Sorted(maps.Keys(replay.StateSources)), ", ")+")")
	examples := fs.Int("examples", replay.DefaultExamples, "decisions kept as examples of each flip class")
	warmup := fs.Duration("warmup", replay.DefaultWarmup, "decisions this long before --from are replayed, not counted, to rebuild the rates and reservations open at --from")
	timeout := fs.Duration("eval-timeout", replay.DefaultEvalTimeout, "longest one evaluation of the candidate may take")
	maxMemory := fs.Int64("max-memory", defaultReplayMaxMemory, "bytes of memory the replay may take, in a process of its own that is stopped at the bound (at least 64 MiB; 0: in this process, unbounded)")
	if err := parse(fs, args); err != nil {
		return err
	}
	flagErr := func(format string, a ...any) error {
		fmt.Fprintf(e.stderr, "bandplane policy replay: "+format+"\n", a...)
		return exitError{code: 2}
	}
	if *bundle == "" {
		return flagErr("--bundle is required: the policy folder to replay")
	}
	if info, err := os.Stat(*bundle); err != nil || !info.IsDir() {
		return flagErr("--bundle %q is not a folder", *bundle)
	}
	end := time.Now().UTC()
	if *to != "" {
		t, err := parseDay(*to)
		if err != nil {
			return flagErr("--to: %v", err)
		}
		end = t
	}
	start := end.Add(-24 * time.Hour)
	if *from != "" {
		t, err := parseDay(*from)
		if err != nil {
			return flagErr("--from: %v", err)
		}
		start = t
	}
	if !start.Before(end) {
		return flagErr("--from (%s) must be before --to (%s)", start.Format(time.RFC3339), end.Format(time.RFC3339))
	}
	if *examples < 1 || *examples > 1000 {
		return flagErr("--examples must be 1..1000, got %d", *examples)
	}
	// Run takes 0 for its defaults: a value it would replace is refused here instead.
	if *warmup <= 0 {
		return flagErr("--warmup must be > 0 (it rebuilds the rates and reservations open at --from), got %s", *warmup)
	}
	if *timeout <= 0 {
		return flagErr("--eval-timeout must be > 0, got %s", *timeout)
	}
	run, err := replayRunner(st, *maxMemory)
	if err != nil {
		return flagErr("--max-memory: %v", err)
	}
	var kindList []string
	for _, k := range strings.Split(*kinds, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if _, ok := replay.StateSources[k]; !ok {
			return flagErr("--kinds: unknown decision kind %q (known: %s)", k, strings.Join(slices.Sorted(maps.Keys(replay.StateSources)), ", "))
		}
		kindList = append(kindList, k)
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	last := time.Time{}
	res, err := run(ctx, replay.Config{Source: replay.ClickHouse{Conn: conn, Database: st.ch.Database}, Bundle: os.DirFS(*bundle),
		From: start, To: end, Org: *org, Kinds: kindList, Examples: *examples, Warmup: *warmup, EvalTimeout: *timeout, Logger: e.log,
		Progress: func(p replay.Progress) {
			if time.Since(last) < time.Second && p.Fraction < 1 {
				return
			}
			last = time.Now()
			fmt.Fprintf(e.stderr, "replay: %d decisions (%.0f%% of the range), %.0f/s, %d records applied, ETA %s\n",
				p.Decisions, 100*p.Fraction, p.PerSecond, p.Records, p.ETA.Round(time.Second))
		}})
	if err != nil {
		fmt.Fprintf(e.stderr, "bandplane policy replay: %v\n", err)
		return exitError{code: 1}
	}
	writeReplaySummary(e.stderr, res)
	return printJSON(e.stdout, res)
}

// writeReplaySummary is the human summary: the counts, by kind, and the first examples.
func writeReplaySummary(w io.Writer, r *replay.Result) {
	fmt.Fprintf(w, "replay of %d decisions from %s to %s with bundle %s (%s):\n",
		r.Decisions, r.From.Format(time.RFC3339), r.To.Format(time.RFC3339), short(r.Bundle.Revision), r.Bundle.Digest)
	fmt.Fprintf(w, "  unchanged %d, allow → deny %d, deny → allow %d, same answer with other reasons %d (flip ratio %.4f)\n",
		r.Unchanged, r.AllowToDeny, r.DenyToAllow, r.ReasonChanged, r.Ratio())
	for _, k := range slices.Sorted(maps.Keys(r.ByKind)) {
		c := r.ByKind[k]
		fmt.Fprintf(w, "  %-16s %d decisions: %d allow → deny, %d deny → allow, %d reasons changed\n", k, c.Decisions, c.AllowToDeny, c.DenyToAllow, c.ReasonChanged)
	}
	for _, list := range []struct {
		name string
		ex   []replay.Example
	}{{"allow → deny", r.Examples.AllowToDeny}, {"deny → allow", r.Examples.DenyToAllow}, {"reasons changed", r.Examples.ReasonChanged}} {
		for i, ex := range list.ex {
			if i == 3 {
				fmt.Fprintf(w, "  … %d more %s examples in the JSON\n", len(list.ex)-3, list.name)
				break
			}
			other := ""
			if ex.Other != nil {
				other = " → " + partyName(*ex.Other)
			}
			fmt.Fprintf(w, "  %s: %s %s %s%s: %s, then %s\n", list.name, ex.Time.Format(time.RFC3339), ex.Kind, partyName(ex.Actor), other,
				answer(ex.Live), answer(ex.Candidate))
		}
	}
	if r.Approximate > 0 {
		fmt.Fprintf(w, "  %d decisions carried no recorded position and were replayed at the one before them\n", r.Approximate)
	}
	if r.Skipped > 0 {
		fmt.Fprintf(w, "  %d decisions could not be read; the first: %s\n", r.Skipped, r.SkipReason)
	}
}

func partyName(p replay.Party) string {
	switch {
	case p.Handle != "" && p.ID != "":
		return "@" + p.Handle + " (" + p.ID + ")"
	case p.Handle != "":
		return "@" + p.Handle
	}
	return p.ID
}

func answer(a replay.Answer) string {
	out := "deny"
	if a.Allow {
		out = "allow"
	}
	var codes []string
	for _, r := range a.Reasons {
		codes = append(codes, r.Code)
	}
	if len(codes) > 0 {
		out += " (" + strings.Join(codes, ", ") + ")"
	}
	return out
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
