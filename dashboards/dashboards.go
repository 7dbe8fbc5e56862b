// Package dashboards owns bandplane's Grafana dashboards and alert rules as code: pure
// builder functions over grafana-foundation-sdk whose raw SQL targets read the ClickHouse
// tables through the Grafana ClickHouse data source plugin (v4). The JSON in
// deploy/grafana/dashboards and deploy/grafana/provisioning/alerting is generated from
// here (`bandplane dashboards`) and never edited by hand.
//
// Every query must run on ClickHouse 18.16 as well as on current releases (the tests run
// each one on 18.16 and 26.9): no window functions, no DateTime64 (so no *_ms macros), no
// toStartOfInterval (so no $__timeInterval), one JOIN per SELECT, an alias on every
// subquery, no positional ORDER BY, no LowCardinality/Map/Bool, 'UTC' given to every
// function that rounds a DateTime. Tables are ReplacingMergeTrees, read with FINAL so a
// replayed event counts once (except the few reads FINAL cannot change: unmerged).
// Every SELECT of a tenant's table is filtered by organization. Variables enter the SQL
// only through value (vars.go); macros.go expands a query as Grafana and the plugin do.
//
// It may import ingest/, policy/, query/, schema/ and its own folder's packages, never
// deploy/ or cmd/ (deploy/layers).
package dashboards

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Dashboard uids, stable so links and provisioning survive regeneration.
const (
	CostUID       = "bandplane-cost"
	ActivityUID   = "bandplane-agents"
	GovernanceUID = "bandplane-governance"
	ComplianceUID = "bandplane-compliance"
	WorkUID       = "bandplane-work"
	IngestUID     = "bandplane-ingest"
)

// File names of the generated dashboards, in deploy/grafana/dashboards.
const (
	CostFile       = "cost-attribution.json"
	ActivityFile   = "agent-activity.json"
	GovernanceFile = "governance.json"
	ComplianceFile = "compliance-audit.json"
	WorkFile       = "work-status.json"
	IngestFile     = "ingest-health.json"
)

// datasourceVar is the dashboard variable holding the ClickHouse data source. Panels and
// variables refer to it instead of a fixed uid, so the JSON imports into any Grafana;
// with the provisioned data source it is the only choice.
const datasourceVar = "datasource"

func datasourceRef() *common.DataSourceRef {
	typ, uid := PluginID, "${"+datasourceVar+"}"
	return &common.DataSourceRef{Type: &typ, Uid: &uid}
}

func datasourceVariable() *dashboard.DatasourceVariableBuilder {
	return dashboard.NewDatasourceVariableBuilder(datasourceVar).
		Label("ClickHouse").
		Type(PluginID)
}

func thresholds(steps ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)
}

func step(color string, from *float64) dashboard.Threshold {
	return dashboard.Threshold{Color: color, Value: from}
}

func itoa(n int) string { return strconv.Itoa(n) }

// lastColumn is the last name of a key like "org_id, room_id".
func lastColumn(key string) string {
	parts := strings.Split(key, ",")
	return strings.TrimSpace(parts[len(parts)-1])
}

// builders are the dashboards, keyed by file name.
func builders() map[string]*dashboard.DashboardBuilder {
	return map[string]*dashboard.DashboardBuilder{
		CostFile:       CostAttribution(),
		ActivityFile:   AgentActivity(),
		GovernanceFile: Governance(),
		ComplianceFile: ComplianceAudit(),
		WorkFile:       WorkStatus(),
		IngestFile:     PipelineHealth(),
	}
}

// Build builds every dashboard, keyed by its file name.
func Build() (map[string]dashboard.Dashboard, error) {
	builders := builders()
	out := make(map[string]dashboard.Dashboard, len(builders))
	var errs []error
	for _, name := range sortedKeys(builders) {
		d, err := builders[name].Build()
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot build dashboard %s: %w", name, err))
			continue
		}
		out[name] = d
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// All returns every dashboard keyed by its file name. The dashboards are constants
// written as code, so a build error is a bug that the package's tests catch; All panics
// on it, like regexp.MustCompile. Use Build to get the error instead.
func All() map[string]dashboard.Dashboard {
	all, err := Build()
	if err != nil {
		panic(err)
	}
	return all
}

// Marshal is the file form of a dashboard: indented JSON with a final newline.
func Marshal(d dashboard.Dashboard) ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cannot marshal dashboard %q: %w", deref(d.Uid), err)
	}
	return append(unescapeHTML(b), '\n'), nil
}

// Files returns the generated files: file name → contents.
func Files() (map[string][]byte, error) {
	all, err := Build()
	if err != nil {
		return nil, err
	}
	files := make(map[string][]byte, len(all))
	for name, d := range all {
		b, err := Marshal(d)
		if err != nil {
			return nil, err
		}
		files[name] = b
	}
	return files, nil
}

// Check compares the *.json files of dir with what Files generates and returns one line
// per file that is missing, differs, or is not generated (a dashboard that was removed
// from the code, or one in a subfolder). Grafana's file provider reads every *.json of
// its path, subfolders included, so a stray file anywhere below dir would be loaded as a
// dashboard too. No lines means dir is up to date.
func Check(dir fs.FS) ([]string, error) {
	want, err := Files()
	if err != nil {
		return nil, err
	}
	problems, err := compareFiles(dir, want, "dashboard")
	if err != nil {
		return nil, err
	}
	err = fs.WalkDir(dir, ".", func(name string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir() || !strings.HasSuffix(name, ".json"):
			return nil
		}
		if _, ok := want[name]; !ok {
			problems = append(problems, name+": not generated by any dashboard (removed? delete the file)")
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cannot list dashboards: %w", err)
	}
	return problems, nil
}

// compareFiles returns a line per file of want that is missing from dir or differs
// from its generated content (what names the kind of file, for the messages).
func compareFiles(dir fs.FS, want map[string][]byte, what string) ([]string, error) {
	var problems []string
	for _, name := range sortedKeys(want) {
		got, err := fs.ReadFile(dir, name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			problems = append(problems, name+": missing")
		case err != nil:
			return nil, fmt.Errorf("cannot read generated %s %s: %w", what, name, err)
		case !bytes.Equal(got, want[name]):
			problems = append(problems, name+": differs from the generated "+what)
		}
	}
	return problems, nil
}

// unescapeHTML turns the \u003c, \u003e and \u0026 that encoding/json writes for <, >
// and & back into the characters: the same JSON, but SQL that reads as SQL in a diff.
// (The SDK's MarshalJSON methods escape on their own, so json.Encoder.SetEscapeHTML
// cannot prevent it.) Outside strings JSON has no backslashes, and inside one a backslash
// always starts a two-character escape or a \uXXXX, so one left-to-right pass is exact.
func unescapeHTML(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			out = append(out, b[i])
			continue
		}
		if b[i+1] == 'u' && i+5 < len(b) {
			switch string(b[i+2 : i+6]) {
			case "003c":
				out, i = append(out, '<'), i+5
				continue
			case "003e":
				out, i = append(out, '>'), i+5
				continue
			case "0026":
				out, i = append(out, '&'), i+5
				continue
			}
		}
		out, i = append(out, b[i], b[i+1]), i+1
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// unmerged is a table read without FINAL, for the few reads whose answer FINAL does not
// change (a max, a GROUP BY of the key's first column, distinct keys counted with
// uniqExact): why says which, and stays in the SQL as a comment, which is what the
// rules test accepts in place of FINAL. It must hold no character a macro or
// $__conditionalAll parses (parentheses, commas, $, quotes).
func unmerged(table, why string) string {
	if strings.ContainsAny(why, "(),$'\"*/") {
		panic("unmerged: " + why)
	}
	return "bandplane." + table + " /* no FINAL: " + why + " */"
}

// sql trims the indentation of a query written as a Go raw string, so the JSON (and the
// plugin's editor) shows it flush left.
func sql(s string) string {
	lines := strings.Split(strings.Trim(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n")
}
