package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/bandplane/bandplane/dashboards"
)

func init() {
	register("dashboards", "write the Grafana dashboards as JSON (or --check them)", runDashboards)
}

func runDashboards(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "dashboards", "[--out DIR] [--check]")
	out := fs.String("out", filepath.Join("deploy", "grafana", "dashboards"), "folder of the dashboard JSON files")
	check := fs.Bool("check", false, "write nothing; exit 1 if the files in --out differ from the generated dashboards")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "bandplane dashboards: unexpected arguments %q\n", fs.Args())
		return exitError{code: 2}
	}
	if *check {
		problems, err := dashboards.Check(os.DirFS(*out))
		if err != nil {
			return fmt.Errorf("cannot check dashboards in %s: %w", *out, err)
		}
		if len(problems) > 0 {
			for _, p := range problems {
				fmt.Fprintf(e.stderr, "%s\n", filepath.Join(*out, p))
			}
			fmt.Fprintf(e.stderr, "dashboards in %s are stale: run 'bandplane dashboards --out %s' and commit the result\n", *out, *out)
			return exitError{code: 1}
		}
		fmt.Fprintf(e.stdout, "dashboards in %s are up to date\n", *out)
		return nil
	}
	files, err := dashboards.Files()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("cannot create dashboard folder %s: %w", *out, err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(*out, name)
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return fmt.Errorf("cannot write dashboard %s: %w", path, err)
		}
		fmt.Fprintf(e.stdout, "wrote %s\n", path)
	}
	return nil
}
