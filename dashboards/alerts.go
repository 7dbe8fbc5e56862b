package dashboards

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/alerting"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/expr"
)

// Alert rules as code. Each rule is one ClickHouse query (refId A, table format: string
// label columns and one numeric column, which Grafana's alerting turns into one alert
// instance per row) and a threshold on it (refId B, a server-side expression). Alerting
// runs a rule's query on the plugin's backend only (macros.go, step 3): no template
// variables and no $__conditionalAll, so the rules see every organization.
//
// The rules are built with the SDK's alerting package (its Rule is the provisioning HTTP
// API's shape) and written in Grafana's file-provisioning format
// (pkg/services/provisioning/alerting/rules_types.go, AlertRuleGroupV1: apiVersion,
// groups[].orgId/name/folder/interval/rules[] with uid, title, condition, data[],
// noDataState, execErrState, for, annotations, labels, isPaused), as JSON (the reader
// takes .json, .yaml and .yml files, and refuses any other file in the folder).

// AlertsFile is the generated alert-rule file in deploy/grafana/provisioning/alerting.
const AlertsFile = "bandplane-alerts.json"

// DatasourceUID is the uid of the provisioned ClickHouse data source
// (deploy/grafana/provisioning/datasources/clickhouse.yaml); alert rules name their data
// source by uid.
const DatasourceUID = "bandplane-clickhouse"

// alertFolder is the folder the rules are provisioned into (created if missing), the
// dashboards' folder too.
const alertFolder = "bandplane"

// AlertRule is one alert rule: its query and when it fires.
type AlertRule struct {
	UID, Title string
	// SQL is the rule's query; it runs over the last Range up to now.
	SQL   string
	Range time.Duration
	// The rule fires while the value column is above Above for For.
	Above    float64
	For      string
	Severity string
	Summary  string
	// Description, when set, is the rule's description annotation: what else to look at.
	Description string
	// NoData is the state when the query returns no rows: OK for rules whose rows are
	// the offenders (no row, nothing wrong).
	NoData alerting.RuleNoDataState
}

// Alert instances are told apart by their labels alone: two rows with the same label set
// make Grafana refuse the whole rule ("frame cannot uniquely be identified by its
// labels: has duplicate results"). Names are not unique (two rooms may share a title,
// two agents a handle), so every rule that returns several rows carries the ids of what
// a row is about as labels too (budget_id, org_id, agent_id), next to the names people
// read.
var (
	// The hard budgets and the share of their limit their current period has used: one
	// row per budget (budget_id).
	budgetAlertSQL = sql(`
	SELECT ` + nameOr("org_name", "org_id") + ` AS organization, budget, period, budget_id, org_id, used
	FROM (
	  SELECT org_id, budget_of AS budget, period, budget_id, used_pct / 100 AS used
	  FROM ` + budgetStatus("1 = 1") + `
	  WHERE hard
	) AS hard_budgets
	ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	ORDER BY used DESC, organization, budget, budget_id`)

	freshnessAlertSQL = sql(`
	SELECT toInt64(now()) - toInt64(max(ingested_at)) AS freshness
	FROM ` + newestIngest + `
	WHERE ` + recentEvents)

	deadLettersAlertSQL = sql(`
	SELECT count() AS dead_letters
	FROM bandplane.dead_letters FINAL
	WHERE ` + timeFilter("received_at"))

	reloadRefusedAlertSQL = sql(`
	SELECT count() AS refused
	FROM bandplane.events FINAL
	WHERE type = 'policy.reload_refused' AND ` + timeFilter("time"))

	// One row per organization and agent (org_id, agent_id).
	throttledAlertSQL = sql(`
	SELECT ` + nameOr("org_name", "org_id") + ` AS organization, agent, org_id, agent_id, throttles
	FROM (
	  SELECT org_id, ` + nameOr("agent_name", "agent_id") + ` AS agent, agent_id, throttles
	  FROM (
	    SELECT org_id, actor_id AS agent_id, count() AS throttles
	    FROM bandplane.events FINAL
	    WHERE type = 'policy.decided' AND ` + throttled + ` AND ` + timeFilter("time") + `
	    GROUP BY org_id, agent_id
	  ) AS t
	  ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	) AS named
	ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	ORDER BY throttles DESC, organization, agent, org_id, agent_id`)

	// One row per organization (org_id) with events that should be sealed by now: the
	// newest copy ingested more than unsealedGrace ago, within the rule's range, and no
	// leaf under the newest checkpoint (unsealedKeys). The value is the age of the
	// oldest of them, so a stopped sealer's grows by a minute a minute, up to the range.
	unsealedAlertSQL = sql(`
	SELECT if(org_id = '', '(no organization)', ` + nameOr("org_name", "org_id") + `) AS organization, org_id, unsealed_age
	FROM (
	  SELECT org_id, toInt64(now()) - toInt64(min(ingested)) AS unsealed_age
	  FROM ` + unsealedKeys("1 = 1", fromTime) + `
	  WHERE ingested < now() - ` + unsealedGrace + `
	  GROUP BY org_id
	) AS overdue
	ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	ORDER BY unsealed_age DESC, organization, org_id`)
)

// unsealedGrace is how long after its insert an event may lack a leaf before the
// unsealed rule counts it: ingest notes a batch once it is stored, and the sealer seals
// the notes at its next run (every minute by default), so an older row without one
// means sealing is stopped, behind or refused.
const unsealedGrace = "INTERVAL 5 MINUTE"

// Alerts are bandplane's alert rules.
func Alerts() []AlertRule {
	return []AlertRule{
		{
			UID: "bandplane-budget-80", Title: "Hard budget at 80 %",
			SQL: budgetAlertSQL, Range: 10 * time.Minute, Above: 0.8, For: "0s", Severity: "warning",
			Summary: "{{ $labels.budget }} ({{ $labels.organization }}, per {{ $labels.period }}) has used {{ humanizePercentage $values.A.Value }} of its hard limit: decisions will be denied at 100 %.",
			NoData:  alerting.RuleNoDataStateOK,
		},
		{
			UID: "bandplane-ingest-freshness", Title: "Ingest freshness over 60 s",
			SQL: freshnessAlertSQL, Range: 10 * time.Minute, Above: 60, For: "2m", Severity: "critical",
			Summary: "No event reached ClickHouse for {{ $values.A.Value }} s: ingest is stalled or behind (check bandplane_ingest_consumer_lag and /readyz), or the platform is quiet.",
			NoData:  alerting.RuleNoDataStateAlerting,
		},
		{
			UID: "bandplane-dead-letters", Title: "Dead letters in the last 5 minutes",
			SQL: deadLettersAlertSQL, Range: 5 * time.Minute, Above: 0, For: "0s", Severity: "warning",
			Summary: "{{ $values.A.Value }} records were dead-lettered in the last 5 minutes: see the Pipeline health dashboard's dead-letter reasons.",
			NoData:  alerting.RuleNoDataStateAlerting,
		},
		{
			UID: "bandplane-chatty-throttled", Title: "Chatty agent throttled repeatedly",
			SQL: throttledAlertSQL, Range: 10 * time.Minute, Above: 4, For: "0s", Severity: "warning",
			Summary: "{{ $labels.agent }} ({{ $labels.organization }}) was throttled {{ $values.A.Value }} times in 10 minutes (message rate or budget): consider suspending it.",
			NoData:  alerting.RuleNoDataStateOK,
		},
		{
			UID: "bandplane-policy-reload-refused", Title: "Policy bundle refused by the replay gate",
			SQL: reloadRefusedAlertSQL, Range: time.Hour, Above: 0, For: "0s", Severity: "warning",
			Summary:     "{{ $values.A.Value }} policy reloads in the last hour were refused: replayed over the last day, the new bundle flips more decisions than --policy-max-flip-ratio allows, and the previous bundle keeps serving.",
			Description: "The policy.reload_refused event in the audit trail has the counts; `bandplane policy replay --bundle DIR` names the flipped decisions by party.",
			NoData:      alerting.RuleNoDataStateOK,
		},
		{
			UID: "bandplane-audit-unsealed", Title: "Audit trail not sealed",
			SQL: unsealedAlertSQL, Range: time.Hour, Above: 600, For: "0s", Severity: "critical",
			Summary: "Events of {{ $labels.organization }} ingested {{ $values.A.Value }} s ago still have no leaf under its newest checkpoint: its audit trail is not being sealed.",
			Description: "The sealer is stopped, behind, or refuses this organization's log (it logs why at every run); `bandplane audit verify` names each row. " +
				"This is what ClickHouse holds, over the last hour: the Prometheus metric bandplane_audit_unsealed_age_seconds of each serve is the sealer process's own view " +
				"(the time since the start of its last run that sealed every note and refused no organization, one value for all organizations).",
			NoData: alerting.RuleNoDataStateOK,
		},
	}
}

// rule builds r with the SDK.
func (r AlertRule) rule() *alerting.RuleBuilder {
	q := NewClickHouseQuery(r.SQL).Datasource(common.DataSourceRef{Type: strPtr(PluginID), Uid: strPtr(DatasourceUID)})
	exprRef := common.DataSourceRef{Type: strPtr("__expr__"), Uid: strPtr("__expr__")}
	threshold := expr.NewExprBuilder().TypeThreshold(expr.NewTypeThresholdBuilder().
		RefId("B").
		Datasource(exprRef).
		Expression("A").
		Conditions([]cog.Builder[expr.ExprTypeThresholdConditions]{
			expr.NewExprTypeThresholdConditionsBuilder().Evaluator(
				expr.NewExprTypeThresholdConditionsEvaluatorBuilder().
					Type(expr.ExprTypeThresholdConditionsEvaluatorTypeGt).
					Params([]float64{r.Above})),
		}))
	seconds := alerting.Duration(r.Range / time.Second)
	annotations := map[string]string{"summary": r.Summary}
	if r.Description != "" {
		annotations["description"] = r.Description
	}
	return alerting.NewRuleBuilder(r.Title).
		Uid(r.UID).
		Condition("B").
		WithQuery(alerting.NewQueryBuilder("A").DatasourceUid(DatasourceUID).QueryType(string(QueryTypeTable)).
			RelativeTimeRange(seconds, 0).Model(q)).
		WithQuery(alerting.NewQueryBuilder("B").DatasourceUid("__expr__").RelativeTimeRange(0, 0).Model(threshold)).
		For(r.For).
		NoDataState(r.NoData).
		ExecErrState(alerting.RuleExecErrStateError).
		FolderUID(alertFolder).
		RuleGroup("bandplane").
		OrgID(1).
		Labels(map[string]string{"severity": r.Severity, "service": "bandplane"}).
		Annotations(annotations)
}

// The file-provisioning format (rules_types.go).
type alertFileV1 struct {
	APIVersion int            `json:"apiVersion"`
	Groups     []alertGroupV1 `json:"groups"`
}

type alertGroupV1 struct {
	OrgID    int64         `json:"orgId"`
	Name     string        `json:"name"`
	Folder   string        `json:"folder"`
	Interval string        `json:"interval"`
	Rules    []alertRuleV1 `json:"rules"`
}

type alertRuleV1 struct {
	UID          string            `json:"uid"`
	Title        string            `json:"title"`
	Condition    string            `json:"condition"`
	Data         []alertQueryV1    `json:"data"`
	NoDataState  string            `json:"noDataState"`
	ExecErrState string            `json:"execErrState"`
	For          string            `json:"for"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	IsPaused     bool              `json:"isPaused"`
}

// alertQueryV1's relativeTimeRange is in seconds (models.RelativeTimeRange).
type alertQueryV1 struct {
	RefID             string          `json:"refId"`
	QueryType         string          `json:"queryType"`
	RelativeTimeRange relativeRangeV1 `json:"relativeTimeRange"`
	DatasourceUID     string          `json:"datasourceUid"`
	Model             json.RawMessage `json:"model"`
}

type relativeRangeV1 struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// AlertFile builds the rules and renders them as the provisioning file.
func AlertFile() ([]byte, error) {
	group := alertGroupV1{OrgID: 1, Name: "bandplane", Folder: alertFolder, Interval: "1m"}
	var errs []error
	for _, r := range Alerts() {
		built, err := r.rule().Build()
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot build alert rule %s: %w", r.UID, err))
			continue
		}
		out := alertRuleV1{UID: deref(built.Uid), Title: built.Title, Condition: built.Condition,
			NoDataState: string(built.NoDataState), ExecErrState: string(built.ExecErrState), For: built.For,
			Annotations: built.Annotations, Labels: built.Labels}
		for _, q := range built.Data {
			model, err := json.Marshal(q.Model)
			if err != nil {
				errs = append(errs, fmt.Errorf("cannot marshal query %s of alert rule %s: %w", deref(q.RefId), r.UID, err))
				continue
			}
			aq := alertQueryV1{RefID: deref(q.RefId), QueryType: deref(q.QueryType), DatasourceUID: deref(q.DatasourceUid), Model: model}
			if q.RelativeTimeRange != nil {
				aq.RelativeTimeRange = relativeRangeV1{From: int64(derefDuration(q.RelativeTimeRange.From)), To: int64(derefDuration(q.RelativeTimeRange.To))}
			}
			out.Data = append(out.Data, aq)
		}
		group.Rules = append(group.Rules, out)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	b, err := json.MarshalIndent(alertFileV1{APIVersion: 1, Groups: []alertGroupV1{group}}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cannot marshal the alert rules: %w", err)
	}
	return append(unescapeHTML(b), '\n'), nil
}

func derefDuration(d *alerting.Duration) alerting.Duration {
	if d == nil {
		return 0
	}
	return *d
}

// AlertFiles are the files of deploy/grafana/provisioning/alerting: name → contents.
func AlertFiles() (map[string][]byte, error) {
	b, err := AlertFile()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{AlertsFile: b}, nil
}

// CheckAlerts compares the files at the root of dir with AlertFiles, like Check. Any
// other file there is a problem too: Grafana refuses to start its alerting provisioning
// when the folder holds a file that is not .json, .yaml or .yml, and would load any
// other rule file as well.
func CheckAlerts(dir fs.FS) ([]string, error) {
	want, err := AlertFiles()
	if err != nil {
		return nil, err
	}
	problems, err := compareFiles(dir, want, "alert rules")
	if err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(dir, ".")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("cannot list alert rule files: %w", err)
	}
	for _, e := range entries {
		if _, ok := want[e.Name()]; !ok {
			problems = append(problems, e.Name()+": not generated (Grafana's alerting provisioning reads every file of this folder; remove it)")
		}
	}
	return problems, nil
}
