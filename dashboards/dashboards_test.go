package dashboards

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// generatedDir is where `bandplane dashboards` writes, relative to this package.
const generatedDir = "../deploy/grafana/dashboards"

type panelWant struct {
	title, typ string
	format     Format
}

func TestDashboardsHaveExpectedPanels(t *testing.T) {
	want := map[string]struct {
		uid, title string
		panels     []panelWant
	}{
		CostFile: {CostUID, "bandplane — Cost & attribution", []panelWant{
			{"Total cost", "stat", FormatTable},
			{"Tokens by kind", "stat", FormatTable},
			{"Unpriced usage events", "stat", FormatTable},
			{"Cost by model (hourly)", "timeseries", FormatTimeSeries},
			{"Cost by agent", "table", FormatTable},
			{"Cost by owner", "barchart", FormatTable},
			{"Chattiest agents", "barchart", FormatTable},
		}},
		IngestFile: {IngestUID, "bandplane — Ingest health", []panelWant{
			{"Events ingested", "stat", FormatTable},
			{"Dead letters", "stat", FormatTable},
			{"Ingest lag", "timeseries", FormatTimeSeries},
			{"Events ingested per type", "timeseries", FormatTimeSeries},
			{"Dead letters by stage", "timeseries", FormatTimeSeries},
			{"Latest dead-letter reasons", "table", FormatTable},
		}},
	}
	all, err := Build()
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if diff := cmp.Diff(sortedKeys(want), sortedKeys(all)); diff != "" {
		t.Fatalf("dashboard files (-want +got):\n%s", diff)
	}
	for name, w := range want {
		d := all[name]
		if deref(d.Uid) != w.uid || deref(d.Title) != w.title {
			t.Errorf("%s: uid %q title %q, want %q %q", name, deref(d.Uid), deref(d.Title), w.uid, w.title)
		}
		var got []panelWant
		ids := map[uint32]bool{}
		for _, p := range panels(d) {
			if len(p.Targets) != 1 {
				t.Errorf("%s: panel %q has %d targets, want 1", name, deref(p.Title), len(p.Targets))
				continue
			}
			q := p.Targets[0].(ClickHouseQuery)
			got = append(got, panelWant{deref(p.Title), p.Type, q.Format})
			if p.Id == nil || ids[*p.Id] {
				t.Errorf("%s: panel %q has no id or a duplicate one", name, deref(p.Title))
			} else {
				ids[*p.Id] = true
			}
		}
		if diff := cmp.Diff(w.panels, got, cmp.AllowUnexported(panelWant{})); diff != "" {
			t.Errorf("%s panels (-want +got):\n%s", name, diff)
		}
	}
}

var (
	fromTable    = regexp.MustCompile(`FROM\s+(\w+)\.(\w+)(\s+FINAL)?`)
	sumsUsage    = regexp.MustCompile(`\b(sum|count)\(`)
	ch1816Breaks = []string{
		"toStartOfInterval", "$__timeInterval", "_ms", // no toStartOfInterval, no DateTime64 on 18.16
		"DateTime64", "JSONExtract", " OVER ", "OVER(", "LowCardinality", "Map(",
	}
)

// TestQueriesReadFinalAndTheOrg checks the rules every panel's SQL must keep.
func TestQueriesReadFinalAndTheOrg(t *testing.T) {
	for name, d := range All() {
		for _, p := range panels(d) {
			title := name + ": " + deref(p.Title)
			q, ok := p.Targets[0].(ClickHouseQuery)
			if !ok {
				t.Errorf("%s: target is %T, want ClickHouseQuery", title, p.Targets[0])
				continue
			}
			if err := q.Validate(); err != nil {
				t.Errorf("%s: %v", title, err)
			}
			if q.Datasource == nil || deref(q.Datasource.Uid) != "${datasource}" || deref(q.Datasource.Type) != PluginID {
				t.Errorf("%s: query data source is %+v, want the ${datasource} variable", title, q.Datasource)
			}
			if p.Datasource == nil || deref(p.Datasource.Uid) != "${datasource}" {
				t.Errorf("%s: panel data source is %+v, want the ${datasource} variable", title, p.Datasource)
			}
			s := q.RawSql
			froms := fromTable.FindAllStringSubmatch(s, -1)
			if len(froms) == 0 {
				t.Errorf("%s: no FROM bandplane.<table> in\n%s", title, s)
			}
			tables := map[string]bool{}
			for _, m := range froms {
				tables[m[2]] = true
				if m[1] != "bandplane" {
					t.Errorf("%s: reads %s.%s, want database bandplane", title, m[1], m[2])
				}
				// Every table is a ReplacingMergeTree: without FINAL a replay counts twice.
				if m[3] == "" {
					t.Errorf("%s: reads %s.%s without FINAL", title, m[1], m[2])
				}
			}
			if sumsUsage.MatchString(s) && strings.Contains(s, "usage_hourly") &&
				!strings.Contains(s, "FROM bandplane.usage_hourly FINAL") {
				t.Errorf("%s: sums usage_hourly without FINAL:\n%s", title, s)
			}
			// Dead letters have no organization; everything else is scoped to the org.
			if !(len(tables) == 1 && tables["dead_letters"]) && !strings.Contains(s, "org_id IN (${org:singlequote})") {
				t.Errorf("%s: does not filter on the org variable:\n%s", title, s)
			}
			if !strings.Contains(s, "$__timeFilter(") && !strings.Contains(s, "$__fromTime") {
				t.Errorf("%s: ignores the dashboard's time range:\n%s", title, s)
			}
			for _, bad := range ch1816Breaks {
				if strings.Contains(s, bad) {
					t.Errorf("%s: uses %q, which ClickHouse 18.16 lacks:\n%s", title, bad, s)
				}
			}
			if q.Format == FormatTimeSeries && !regexp.MustCompile(`ORDER BY (time|bucket)\b`).MatchString(s) {
				t.Errorf("%s: a time series must be sorted by its time column:\n%s", title, s)
			}
		}
	}
}

func TestVariables(t *testing.T) {
	for name, d := range All() {
		vars := map[string]dashboard.VariableModel{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v
		}
		ds, ok := vars["datasource"]
		if !ok || ds.Type != "datasource" || ds.Query == nil || deref(ds.Query.String) != PluginID {
			t.Errorf("%s: no datasource variable of type %s: %+v", name, PluginID, ds)
		}
		org, ok := vars["org"]
		if !ok {
			t.Errorf("%s: no org variable", name)
			continue
		}
		if org.Type != "query" || org.Query == nil || deref(org.Query.String) != "SELECT DISTINCT org_id FROM bandplane.usage_hourly" {
			t.Errorf("%s: org variable is %+v", name, org)
		}
		if org.Datasource == nil || deref(org.Datasource.Uid) != "${datasource}" {
			t.Errorf("%s: org variable data source is %+v", name, org.Datasource)
		}
	}
}

// TestGeneratedFilesUpToDate is `bandplane dashboards --check` as a test: the committed
// JSON must be what the code generates.
func TestGeneratedFilesUpToDate(t *testing.T) {
	problems, err := Check(os.DirFS(generatedDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s/%s", generatedDir, p)
	}
	if len(problems) > 0 {
		t.Log("regenerate with: go run ./cmd/bandplane dashboards")
	}
}

func TestCheckReportsStaleFiles(t *testing.T) {
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	dir := fstest.MapFS{
		CostFile:       {Data: files[CostFile]},
		"old.json":     {Data: []byte("{}\n")},
		"README.md":    {Data: []byte("not a dashboard")},
		"sub/sub.json": {Data: []byte("{}\n")},
	}
	problems, err := Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		IngestFile + ": missing",
		"old.json: not generated by any dashboard (removed? delete the file)",
	}
	if diff := cmp.Diff(want, problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}

	dir[IngestFile] = &fstest.MapFile{Data: append([]byte(nil), files[IngestFile]...)}
	dir[IngestFile].Data[len(dir[IngestFile].Data)-1] = ' ' // one byte changed
	delete(dir, "old.json")
	problems, err = Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{IngestFile + ": differs from the generated dashboard"}, problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}

	dir[IngestFile].Data = files[IngestFile]
	if problems, err = Check(dir); err != nil || len(problems) != 0 {
		t.Errorf("up-to-date dir: problems %v, err %v", problems, err)
	}
}

func TestMarshalIsStableReadableJSON(t *testing.T) {
	a, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	for name := range a {
		if string(a[name]) != string(b[name]) {
			t.Errorf("%s: two generations differ", name)
		}
		s := string(a[name])
		if strings.Contains(s, `\u003`) || strings.Contains(s, `\u0026`) {
			t.Errorf("%s: HTML-escaped characters left in the JSON", name)
		}
		if !strings.HasSuffix(s, "}\n") {
			t.Errorf("%s: does not end with a newline", name)
		}
	}
}

func TestUnescapeHTML(t *testing.T) {
	for in, want := range map[string]string{
		`"a \u003e= b \u003c c \u0026 d"`: `"a >= b < c & d"`,
		`"\\u003e"`:                       `"\\u003e"`, // an escaped backslash, then text
		`"\\\u003e"`:                      `"\\>"`,
		`"\u00e9\n"`:                      `"\u00e9\n"`,
		`"\u003`:                          `"\u003`,
	} {
		if got := string(unescapeHTML([]byte(in))); got != want {
			t.Errorf("unescapeHTML(%s) = %s, want %s", in, got, want)
		}
	}
}

func panels(d dashboard.Dashboard) []dashboard.Panel {
	var out []dashboard.Panel
	for _, p := range d.Panels {
		if p.Panel != nil {
			out = append(out, *p.Panel)
		}
	}
	return out
}
