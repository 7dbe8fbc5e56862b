package dashboards

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
)

// PluginID is the Grafana ClickHouse data source plugin's id (grafana-clickhouse-datasource).
const PluginID = "grafana-clickhouse-datasource"

// pluginVersion is written on every query. The plugin's frontend treats a query without
// a pluginVersion >= 4.0.0 as a v3 query and migrates it on load (re-deriving queryType
// from format); saying v4 keeps the JSON we generate exactly what Grafana runs.
const pluginVersion = "4.0.0"

// QueryType is how the plugin shapes a result: the SQL editor's "Query Type".
type QueryType string

const (
	// QueryTypeTable returns the rows as they are (stat, table, bar chart panels).
	QueryTypeTable QueryType = "table"
	// QueryTypeTimeSeries turns a long result (time, label…, value…) into one series per
	// label set. The first column must be a DateTime, sorted ascending.
	QueryTypeTimeSeries QueryType = "timeseries"
)

// Format is the numeric result format the plugin's backend (grafana/sqlds) reads; the
// frontend derives it from QueryType (time series 0, table 1, logs 2, traces 3).
type Format int

const (
	FormatTimeSeries Format = 0
	FormatTable      Format = 1
)

func (t QueryType) format() Format {
	if t == QueryTypeTimeSeries {
		return FormatTimeSeries
	}
	return FormatTable
}

// ClickHouseQuery is a raw SQL target of the ClickHouse data source (plugin v4 "SQL
// Editor" query). grafana-foundation-sdk v0.0.22 ships no type for this plugin.
type ClickHouseQuery struct {
	// RefId and Hide are on every Grafana query.
	RefId      string                `json:"refId"`
	Hide       *bool                 `json:"hide,omitempty"`
	Datasource *common.DataSourceRef `json:"datasource,omitempty"`

	EditorType    string    `json:"editorType"` // always "sql": no builder options to keep in sync
	QueryType     QueryType `json:"queryType"`
	Format        Format    `json:"format"`
	RawSql        string    `json:"rawSql"`
	PluginVersion string    `json:"pluginVersion"`
}

var _ variants.Dataquery = ClickHouseQuery{}

// ImplementsDataqueryVariant tells cog that ClickHouseQuery is a data query.
func (q ClickHouseQuery) ImplementsDataqueryVariant() {}

// DataqueryType is the plugin id the query belongs to.
func (q ClickHouseQuery) DataqueryType() string { return PluginID }

// Validate reports what would make Grafana reject or misread the query.
func (q ClickHouseQuery) Validate() error {
	var errs []error
	if q.RefId == "" {
		errs = append(errs, errors.New("refId: missing"))
	}
	if strings.TrimSpace(q.RawSql) == "" {
		errs = append(errs, errors.New("rawSql: missing"))
	}
	if q.EditorType != "sql" {
		errs = append(errs, errors.New(`editorType: must be "sql", got "`+q.EditorType+`"`))
	}
	switch q.QueryType {
	case QueryTypeTable, QueryTypeTimeSeries:
		if q.Format != q.QueryType.format() {
			errs = append(errs, errors.New("format: does not match queryType "+string(q.QueryType)))
		}
	default:
		errs = append(errs, errors.New(`queryType: must be "table" or "timeseries", got "`+string(q.QueryType)+`"`))
	}
	return errors.Join(errs...)
}

// Equals reports whether other is the same ClickHouse query.
func (q ClickHouseQuery) Equals(other variants.Dataquery) bool {
	o, ok := other.(ClickHouseQuery)
	if !ok {
		return false
	}
	return q.RefId == o.RefId && boolPtrEqual(q.Hide, o.Hide) && refEqual(q.Datasource, o.Datasource) &&
		q.EditorType == o.EditorType && q.QueryType == o.QueryType && q.Format == o.Format &&
		q.RawSql == o.RawSql && q.PluginVersion == o.PluginVersion
}

func boolPtrEqual(a, b *bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func strPtrEqual(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func refEqual(a, b *common.DataSourceRef) bool {
	if a == nil || b == nil {
		return a == b
	}
	return strPtrEqual(a.Type, b.Type) && strPtrEqual(a.Uid, b.Uid)
}

// VariantConfig lets cog unmarshal dashboards holding ClickHouse queries:
// cog.NewRuntime().RegisterDataqueryVariant(dashboards.VariantConfig()).
func VariantConfig() variants.DataqueryConfig {
	unmarshal := func(raw []byte) (variants.Dataquery, error) {
		var q ClickHouseQuery
		if err := json.Unmarshal(raw, &q); err != nil {
			return nil, err
		}
		return q, nil
	}
	return variants.DataqueryConfig{
		Identifier:                 PluginID,
		DataqueryUnmarshaler:       unmarshal,
		StrictDataqueryUnmarshaler: unmarshal,
	}
}

var _ cog.Builder[variants.Dataquery] = (*ClickHouseQueryBuilder)(nil)

// ClickHouseQueryBuilder builds a ClickHouseQuery for a panel's WithTarget.
type ClickHouseQueryBuilder struct {
	internal ClickHouseQuery
}

// NewClickHouseQuery starts a table-format SQL query with refId "A" on the dashboard's
// ClickHouse data source variable.
func NewClickHouseQuery(sql string) *ClickHouseQueryBuilder {
	return &ClickHouseQueryBuilder{internal: ClickHouseQuery{
		RefId:         "A",
		Datasource:    datasourceRef(),
		EditorType:    "sql",
		QueryType:     QueryTypeTable,
		Format:        FormatTable,
		RawSql:        sql,
		PluginVersion: pluginVersion,
	}}
}

// Build returns the query, or cog.BuildErrors: the SDK's panel builders type-assert the
// error of every target they are given to cog.BuildErrors, so any other error panics.
func (b *ClickHouseQueryBuilder) Build() (variants.Dataquery, error) {
	if err := b.internal.Validate(); err != nil {
		return ClickHouseQuery{}, cog.MakeBuildErrors("clickhouseQuery", err)
	}
	return b.internal, nil
}

// RefId names the query within its panel.
func (b *ClickHouseQueryBuilder) RefId(refId string) *ClickHouseQueryBuilder {
	b.internal.RefId = refId
	return b
}

// Hide keeps the query from being shown (it still runs for other queries to use).
func (b *ClickHouseQueryBuilder) Hide(hide bool) *ClickHouseQueryBuilder {
	b.internal.Hide = &hide
	return b
}

// Datasource overrides the data source the query runs on.
func (b *ClickHouseQueryBuilder) Datasource(ref common.DataSourceRef) *ClickHouseQueryBuilder {
	b.internal.Datasource = &ref
	return b
}

// TimeSeries asks the plugin for one series per label set (format 0).
func (b *ClickHouseQueryBuilder) TimeSeries() *ClickHouseQueryBuilder {
	b.internal.QueryType, b.internal.Format = QueryTypeTimeSeries, FormatTimeSeries
	return b
}

// Table asks the plugin for the rows as they are (format 1, the default).
func (b *ClickHouseQueryBuilder) Table() *ClickHouseQueryBuilder {
	b.internal.QueryType, b.internal.Format = QueryTypeTable, FormatTable
	return b
}
