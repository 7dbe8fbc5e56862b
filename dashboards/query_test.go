package dashboards

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

func TestClickHouseQueryJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    *ClickHouseQueryBuilder
		want string
	}{
		{
			name: "table by default",
			b:    NewClickHouseQuery("SELECT 1"),
			want: `{
  "refId": "A",
  "datasource": {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"},
  "editorType": "sql",
  "queryType": "table",
  "format": 1,
  "rawSql": "SELECT 1",
  "pluginVersion": "4.0.0"
}`,
		},
		{
			name: "time series, hidden, other refId",
			b:    NewClickHouseQuery("SELECT now() AS time, 1 AS v").TimeSeries().RefId("B").Hide(true),
			want: `{
  "refId": "B",
  "hide": true,
  "datasource": {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"},
  "editorType": "sql",
  "queryType": "timeseries",
  "format": 0,
  "rawSql": "SELECT now() AS time, 1 AS v",
  "pluginVersion": "4.0.0"
}`,
		},
		{
			name: "back to table",
			b:    NewClickHouseQuery("SELECT 1").TimeSeries().Table(),
			want: `{
  "refId": "A",
  "datasource": {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"},
  "editorType": "sql",
  "queryType": "table",
  "format": 1,
  "rawSql": "SELECT 1",
  "pluginVersion": "4.0.0"
}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := tc.b.Build()
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			got, err := json.Marshal(q)
			if err != nil {
				t.Fatal(err)
			}
			var gotV, wantV any
			if err := json.Unmarshal(got, &gotV); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.want), &wantV); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantV, gotV); diff != "" {
				t.Errorf("query JSON (-want +got):\n%s\ngot: %s", diff, got)
			}
		})
	}
}

func TestClickHouseQueryBuildErrors(t *testing.T) {
	_, err := NewClickHouseQuery("  ").RefId("").Build()
	var berrs cog.BuildErrors
	if !errors.As(err, &berrs) {
		t.Fatalf("Build error is %T (%v), want cog.BuildErrors: panel builders type-assert it", err, err)
	}
	if len(berrs) != 1 || berrs[0].Path != "clickhouseQuery" {
		t.Fatalf("Build errors = %v, want one at path clickhouseQuery", berrs)
	}
	for _, want := range []string{"refId: missing", "rawSql: missing"} {
		if !strings.Contains(berrs[0].Message, want) {
			t.Errorf("Build error %q does not say %q", berrs[0].Message, want)
		}
	}

	// The reason the type matters: a panel given a broken target must fail its dashboard's
	// Build, not panic in WithTarget.
	_, err = dashboard.NewDashboardBuilder("broken").
		WithPanel(timeseries.NewPanelBuilder().Title("p").WithTarget(NewClickHouseQuery(""))).
		Build()
	if err == nil {
		t.Fatal("dashboard with an empty query built without error")
	}
}

func TestClickHouseQueryValidate(t *testing.T) {
	ok, _ := NewClickHouseQuery("SELECT 1").Build()
	q := ok.(ClickHouseQuery)
	q.Format = FormatTimeSeries // queryType still table
	if err := q.Validate(); err == nil {
		t.Error("Validate accepted format 0 with queryType table")
	}
	q = ok.(ClickHouseQuery)
	q.QueryType = "logs"
	if err := q.Validate(); err == nil {
		t.Error("Validate accepted queryType logs")
	}
	q = ok.(ClickHouseQuery)
	q.EditorType = "builder"
	if err := q.Validate(); err == nil {
		t.Error("Validate accepted editorType builder")
	}
}

func TestClickHouseQueryEqualsAndUnmarshal(t *testing.T) {
	built, err := NewClickHouseQuery("SELECT 1").TimeSeries().Hide(false).Build()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(built)
	if err != nil {
		t.Fatal(err)
	}
	back, err := VariantConfig().DataqueryUnmarshaler(raw)
	if err != nil {
		t.Fatalf("unmarshal %s: %v", raw, err)
	}
	if !built.Equals(back) {
		t.Errorf("round trip changed the query: %#v != %#v", built, back)
	}
	other, _ := NewClickHouseQuery("SELECT 2").TimeSeries().Hide(false).Build()
	if built.Equals(other) {
		t.Error("queries with different SQL are Equal")
	}
	hidden, _ := NewClickHouseQuery("SELECT 1").TimeSeries().Hide(true).Build()
	if built.Equals(hidden) {
		t.Error("queries with different hide are Equal")
	}
	if built.Equals(nil) {
		t.Error("query Equals nil")
	}
	if got := built.DataqueryType(); got != "grafana-clickhouse-datasource" {
		t.Errorf("DataqueryType = %q", got)
	}
}
