package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/bandplane/bandplane/dashboards"
)

func init() {
	register("dashboards", "write the Grafana dashboards and alert rules as JSON (or --check them)", runDashboards)
}

// generated is one folder of generated files: what to write there and how to check it.
type generated struct {
	what  string // for messages: "dashboards", "alert rules"
	dir   string
	files func() (map[string][]byte, error)
	check func(fs.FS) ([]string, error)
	flag  string
}

func runDashboards(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "dashboards", "[--out DIR] [--alerts DIR] [--check]")
	out := fs.String("out", filepath.Join("deploy", "grafana", "dashboards"), "folder of the dashboard JSON files")
	alerts := fs.String("alerts", filepath.Join("deploy", "grafana", "provisioning", "alerting"),
		"folder of the alert rule provisioning file (Grafana reads every file of it: keep nothing else there)")
	check := fs.Bool("check", false, "write nothing; exit 1 if the files in --out or --alerts differ from the generated ones")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "bandplane dashboards: unexpected arguments %q\n", fs.Args())
		return exitError{code: 2}
	}
	sets := []generated{
		{what: "dashboards", dir: *out, files: dashboards.Files, check: dashboards.Check, flag: "--out"},
		{what: "alert rules", dir: *alerts, files: dashboards.AlertFiles, check: dashboards.CheckAlerts, flag: "--alerts"},
	}
	if *check {
		stale := false
		for _, g := range sets {
			problems, err := g.check(os.DirFS(g.dir))
			if err != nil {
				return fmt.Errorf("cannot check %s in %s: %w", g.what, g.dir, err)
			}
			for _, p := range problems {
				fmt.Fprintf(e.stderr, "%s\n", filepath.Join(g.dir, p))
			}
			if len(problems) > 0 {
				stale = true
				fmt.Fprintf(e.stderr, "%s in %s are stale: run 'bandplane dashboards %s %s' and commit the result\n", g.what, g.dir, g.flag, g.dir)
				continue
			}
			fmt.Fprintf(e.stdout, "%s in %s are up to date\n", g.what, g.dir)
		}
		if stale {
			return exitError{code: 1}
		}
		return nil
	}
	for _, g := range sets {
		files, err := g.files()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(g.dir, 0o755); err != nil {
			return fmt.Errorf("cannot create %s folder %s: %w", g.what, g.dir, err)
		}
		names := make([]string, 0, len(files))
		for name := range files {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			path := filepath.Join(g.dir, name)
			if err := os.WriteFile(path, files[name], 0o644); err != nil {
				return fmt.Errorf("cannot write %s %s: %w", g.what, path, err)
			}
			fmt.Fprintf(e.stdout, "wrote %s\n", path)
		}
	}
	return nil
}
