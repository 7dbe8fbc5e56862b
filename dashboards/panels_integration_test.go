package dashboards_test

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/dashboards"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
)

// inDB points the dashboards' SQL, which names its tables bandplane.<table>, at the
// test's database: the one place that does it.
func inDB(sql, db string) string { return strings.ReplaceAll(sql, "bandplane.", db+".") }

// scenario is a selection a manager could make: variable name → value (missing: "All",
// or "" for a text box). multi gives a variable several values, as a URL can.
type scenario struct {
	name   string
	values map[string]string
	multi  map[string][]string
	// rows says the scenario must give every panel rows (only "all" does: a narrower
	// selection may rightly be empty).
	rows bool
}

func (w *world) scenarios() []scenario {
	a := w.agents[0]
	var owner, room string
	for _, o := range w.owners {
		if o.org == a.org {
			owner = o.id
			break
		}
	}
	for _, r := range w.rooms {
		if r.org == a.org {
			room = r.id
			break
		}
	}
	h := w.hostile
	return []scenario{
		{name: "all", rows: true},
		{name: "one org", values: map[string]string{"org": a.org}},
		{name: "one of each", values: map[string]string{"org": a.org, "owner": owner, "agent": a.id, "room": room,
			"model": w.models[0], "actor": a.id, "type": "message.created", "search": "review", "decision": "send_message"}},
		{name: "hostile ids", values: map[string]string{"org": h.org, "owner": h.owner, "agent": h.agents[0], "room": h.room,
			"model": h.model, "actor": h.agents[1], "search": `ünï/cødé \"模型`}},
		{name: "hostile agent only", values: map[string]string{"agent": h.agents[1], "actor": h.agents[2], "owner": h.owner}},
		{name: "newline from a URL", values: map[string]string{"org": h.org + "\n", "agent": h.agents[0] + "\n' OR 1=1 --"}},
		{name: "two values from a URL", multi: map[string][]string{"org": {h.org, a.org}, "agent": {h.agents[0], a.id}}},
	}
}

// query is one SQL the plugin runs for a dashboard: a panel's target or a variable's
// query.
type query struct {
	where string // dashboard: panel or variable
	sql   string
	panel *dashboard.Panel // nil for a variable
}

func queriesOf(name string, d dashboard.Dashboard) []query {
	var out []query
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			sql, ok := dashboards.VariableSQL(v.Query)
			if !ok {
				panic(name + ": variable " + v.Name + ": no query the plugin runs")
			}
			out = append(out, query{where: name + ": variable " + v.Name, sql: sql})
		}
	}
	for _, p := range panelsOf(d) {
		for _, t := range p.Targets {
			q := t.(dashboards.ClickHouseQuery)
			out = append(out, query{where: name + ": " + deref(p.Title), sql: q.RawSql, panel: &p})
		}
	}
	return out
}

func panelsOf(d dashboard.Dashboard) []dashboard.Panel {
	var out []dashboard.Panel
	for _, p := range d.Panels {
		if p.Panel != nil {
			out = append(out, *p.Panel)
		}
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// interval is about what Grafana gives a panel of ~1000 px: the range over 1000, rounded
// up to a whole minute, at least the panel's minimum interval.
func interval(p *dashboard.Panel, from, to time.Time) time.Duration {
	iv := (to.Sub(from) / 1000).Round(time.Minute)
	if iv < time.Minute {
		iv = time.Minute
	}
	if p != nil && p.Interval != nil {
		if min, err := time.ParseDuration(*p.Interval); err == nil && min > iv {
			iv = min
		}
	}
	return iv
}

// variables are the dashboard's variables in s, in the order Grafana resolves them: a
// query variable's options come from running its query (expanded with the variables
// before it), which "All" then stands for.
func (w *world) variables(t *testing.T, ctx context.Context, d dashboard.Dashboard, s scenario) []dashboards.Variable {
	t.Helper()
	var vars []dashboards.Variable
	for _, v := range d.Templating.List {
		dv := dashboards.Variable{Name: v.Name}
		switch v.Type {
		case "datasource":
			continue
		case "textbox":
			dv.Values = []string{s.values[v.Name]}
		case "custom":
			for _, opt := range strings.Split(deref(v.Query.String), ",") {
				parts := strings.SplitN(opt, " : ", 2)
				dv.Options = append(dv.Options, strings.TrimSpace(parts[len(parts)-1]))
			}
		case "query":
			req := dashboards.Request{From: w.from, To: w.to, Interval: time.Minute, Vars: vars}
			q, ok := dashboards.VariableSQL(v.Query)
			require.True(t, ok, "variable %s: no query the plugin runs", v.Name)
			sql, err := req.Expand(q)
			require.NoError(t, err, "variable %s", v.Name)
			res, err := w.server.Query(ctx, inDB(sql, w.db))
			require.NoError(t, err, "variable %s:\n%s", v.Name, sql)
			for _, r := range res.Rows {
				dv.Options = append(dv.Options, r[0])
			}
		default:
			t.Fatalf("variable %s has type %s, which this test does not model", v.Name, v.Type)
		}
		if vals, ok := s.multi[v.Name]; ok {
			dv.Values, dv.Multi = vals, true
		} else if val, ok := s.values[v.Name]; ok && v.Type != "textbox" {
			dv.Values = []string{val}
		} else if v.Type != "textbox" {
			dv.All, dv.Values = true, []string{dashboards.AllValue}
		}
		vars = append(vars, dv)
	}
	return vars
}

// TestIntegrationEveryQueryRunsOnBothClickHouses expands every panel's and variable's
// SQL as Grafana and the plugin do, for several selections (every "All"; one
// organization; one of everything; ids full of quotes, backslashes, commas, ampersands
// and unicode; values a URL could inject), runs it on ClickHouse 18.16 and 26.9 over the
// same data, and checks both agree, the result has the shape its panel needs, and with
// everything on "All" every query returns rows. Hostile values must filter exactly as
// a correctly quoted literal of the same id does.
func TestIntegrationEveryQueryRunsOnBothClickHouses(t *testing.T) {
	w := loadWorld(t)
	ctx := context.Background()
	all, err := dashboards.Build()
	require.NoError(t, err)
	ids := w.namedIDs(t, ctx)
	hostileRows := map[string]int{} // dashboard → panels with rows for the hostile organization
	for _, name := range sortedKeys(all) {
		d := all[name]
		for _, s := range w.scenarios() {
			vars := w.variables(t, ctx, d, s)
			for _, q := range queriesOf(name, d) {
				req := dashboards.Request{From: w.from, To: w.to, Interval: interval(q.panel, w.from, w.to), Vars: vars}
				sql, err := req.Expand(q.sql)
				if !assert.NoError(t, err, "%s [%s]", q.where, s.name) {
					continue
				}
				a, b := w.run(t, ctx, q.where+" ["+s.name+"]", sql)
				if a == nil || b == nil {
					continue
				}
				if s.rows && len(a.Rows) == 0 {
					t.Errorf("%s [%s]: no rows on the simulated workload: the panel could never show data\n%s", q.where, s.name, sql)
				}
				checkShape(t, q, s.name, a, ids)
				if s.name == "hostile ids" && q.panel != nil && len(a.Rows) > 0 {
					hostileRows[name]++
				}
				w.checkOracle(t, ctx, q.where+" ["+s.name+"]", sql, a)
			}
		}
	}
	// The hostile organization has data of every kind: its selection must find it, or the
	// oracle comparisons above compared empty results only.
	for _, name := range sortedKeys(all) {
		assert.GreaterOrEqual(t, hostileRows[name], 2, "%s: panels with rows for the hostile organization", name)
	}
	t.Logf("panels with rows for the hostile organization: %v", hostileRows)
}

// run runs sql on both engines; it fails t and returns nils when either refuses it or
// the two disagree. now() is pinned to one instant, so that "as of now" panels are
// compared row by row too (dual.Diff compares only the columns of a query that reads
// the clock).
func (w *world) run(t *testing.T, ctx context.Context, where, sql string) (*dual.Result, *dual.Result) {
	t.Helper()
	sql = strings.ReplaceAll(inDB(sql, w.db), "now()", w.pinnedNow())
	a, errA := w.server.Query(ctx, sql)
	b, errB := w.current.Query(ctx, sql)
	if errA != nil || errB != nil {
		t.Errorf("%s:\n%s: %v\n%s: %v\n%s", where, w.server.Name(), errA, w.current.Name(), errB, sql)
		return nil, nil
	}
	if d := dual.Diff(sql, a, b); d != "" {
		t.Errorf("%s: %s vs %s: %s\n%s", where, w.server.Name(), w.current.Name(), d, sql)
		return nil, nil
	}
	return a, b
}

var decoded = regexp.MustCompile(`decodeURLComponent\('([^']*)'\)`)

// checkOracle runs sql again with every decodeURLComponent('<percent-encoded>') replaced
// by a string literal of the decoded value, quoted the way ClickHouse reads it (\ and '
// escaped): the filter must select exactly the rows that literal does.
func (w *world) checkOracle(t *testing.T, ctx context.Context, where, sql string, got *dual.Result) {
	t.Helper()
	if !decoded.MatchString(sql) {
		return
	}
	oracle := decoded.ReplaceAllStringFunc(sql, func(m string) string {
		enc := decoded.FindStringSubmatch(m)[1]
		v, err := url.PathUnescape(enc)
		require.NoError(t, err, "%s: %q is not percent-encoded", where, enc)
		return chLiteral(v)
	})
	want, err := w.server.Query(ctx, strings.ReplaceAll(inDB(oracle, w.db), "now()", w.pinnedNow()))
	if !assert.NoError(t, err, "%s: oracle\n%s", where, oracle) {
		return
	}
	if d := dual.Diff(sql, want, got); d != "" {
		t.Errorf("%s: the decoded filter differs from the literal one: %s\n%s", where, d, sql)
	}
}

// pinnedNow is the instant every query of the test reads as now().
func (w *world) pinnedNow() string { return fmt.Sprintf("toDateTime(%d, 'UTC')", w.now.Unix()) }

// chLiteral quotes s as a ClickHouse string literal.
func chLiteral(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`, "\r", `\r`, "\t", `\t`, "\x00", `\0`)
	return "'" + r.Replace(s) + "'"
}

// namedIDs are the ids that have a name (directory handles, room titles, organizations):
// a column people read must show the name instead.
func (w *world) namedIDs(t *testing.T, ctx context.Context) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, q := range []string{
		"SELECT id FROM " + w.db + ".directory FINAL WHERE handle != ''",
		"SELECT room_id FROM " + w.db + ".rooms FINAL WHERE kind = 'title' AND title != ''",
		"SELECT DISTINCT org_id FROM " + w.db + ".directory FINAL WHERE org_id != ''",
	} {
		res, err := w.server.Query(ctx, q)
		require.NoError(t, err)
		for _, r := range res.Rows {
			out[r[0]] = true
		}
	}
	return out
}

var uuid = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// idColumns may hold ids: the hidden ones links use, event ids, and raw text.
func idColumn(name string) bool {
	return name == "id" || strings.HasSuffix(name, "_id") || slices.Contains([]string{"excerpt", "last_record", "operator", "question", "source"}, name)
}

func numeric(typ string) bool {
	typ = strings.TrimSuffix(strings.TrimPrefix(typ, "Nullable("), ")")
	return strings.HasPrefix(typ, "UInt") || strings.HasPrefix(typ, "Int") || strings.HasPrefix(typ, "Float") ||
		strings.HasPrefix(typ, "Decimal")
}

func isTime(typ string) bool {
	typ = strings.TrimSuffix(strings.TrimPrefix(typ, "Nullable("), ")")
	return strings.HasPrefix(typ, "DateTime")
}

// checkShape checks what the panel's visualisation needs of the result.
func checkShape(t *testing.T, q query, scenario string, r *dual.Result, named map[string]bool) {
	t.Helper()
	where := q.where + " [" + scenario + "]"
	cols := r.Columns
	require.NotEmpty(t, cols, where)
	numbers := 0
	for _, c := range cols {
		if numeric(c.Type) {
			numbers++
		}
	}
	if q.panel == nil { // a variable: id (or value) first, then its name
		assert.LessOrEqual(t, len(cols), 2, "%s: a variable query returns value and text", where)
		for _, c := range cols {
			assert.Equal(t, "String", c.Type, "%s: column %s", where, c.Name)
		}
		if len(cols) == 2 {
			for _, row := range r.Rows {
				if named[row[0]] {
					assert.NotEqual(t, row[0], row[1], "%s: option %q shows its id, not its name", where, row[0])
				}
			}
		}
		return
	}
	switch q.panel.Type {
	case "timeseries":
		assert.True(t, isTime(cols[0].Type), "%s: a time series starts with its time column, got %v", where, cols[0])
		assert.Positive(t, numbers, "%s: no numeric column in %v", where, cols)
		for _, c := range cols[1:] {
			assert.True(t, numeric(c.Type) || c.Type == "String", "%s: column %v is neither a label nor a value", where, c)
		}
		times := make([]string, len(r.Rows))
		for i, row := range r.Rows {
			times[i] = row[0]
		}
		assert.True(t, sort.StringsAreSorted(times), "%s: the plugin needs the rows sorted by time", where)
	case "stat", "barchart":
		assert.Positive(t, numbers, "%s: no numeric column in %v", where, cols)
		for _, c := range cols {
			assert.True(t, numeric(c.Type) || c.Type == "String", "%s: column %v", where, c)
		}
	case "table":
	default:
		t.Errorf("%s: panel type %s not checked", where, q.panel.Type)
	}
	if q.panel.Type == "barchart" {
		assert.Equal(t, "String", cols[0].Type, "%s: the bars' names come first", where)
	}
	for i, c := range cols {
		if c.Type != "String" || idColumn(c.Name) {
			continue
		}
	rows:
		for _, row := range r.Rows {
			for _, id := range append([]string{row[i]}, uuid.FindAllString(row[i], -1)...) {
				if named[id] {
					t.Errorf("%s: column %s shows the id %q, which has a name: %q", where, c.Name, id, row[i])
					break rows
				}
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestIntegrationAlertRulesRun runs each alert rule's query as Grafana's alerting does
// (the plugin's backend macros only, over the rule's relative range up to now) on both
// engines: one numeric column and string labels, rows on the simulated workload, every
// row's label set unique (Grafana refuses the whole rule otherwise: "frame cannot
// uniquely be identified by its labels"), also for the twins, whose rooms share a title
// and agents a handle, and the twins' budgets and agents, which should fire, above the
// rule's threshold; the unsealed rule fires for exactly the organizations whose rows no
// leaf seals, a forged checkpoint row notwithstanding, with the age of the oldest.
func TestIntegrationAlertRulesRun(t *testing.T) {
	w := loadWorld(t)
	ctx := context.Background()
	now := w.now // the rules' ranges end where the queries' now() is pinned
	// What must fire: rule → the value of the label column → at least this value.
	fires := map[string]map[string]map[string]float64{
		"bandplane-budget-80":        {"budget_id": {}},
		"bandplane-chatty-throttled": {"agent_id": {}},
		"bandplane-dead-letters":     {"": {"": 2}}, // the two poison records, no labels
	}
	for id, used := range w.twins.used {
		fires["bandplane-budget-80"]["budget_id"][id] = used
	}
	for _, id := range w.twins.agents {
		fires["bandplane-chatty-throttled"]["agent_id"][id] = float64(w.twins.throttles)
	}
	fires["bandplane-chatty-throttled"]["agent_id"][w.agents[0].id] = 8 // the chatty agent
	// The organizations whose rows have no leaf, the one with a forged checkpoint too,
	// and no other: every row ingest stored is sealed.
	unsealed := map[string]float64{}
	for _, u := range []unsealedRows{w.seal.late, w.seal.never, w.seal.forged} {
		unsealed[u.org] = float64(w.now.Unix() - u.ingested.Unix())
	}
	fires["bandplane-audit-unsealed"] = map[string]map[string]float64{"org_id": unsealed}
	only := map[string]bool{"bandplane-audit-unsealed": true} // rules whose rows must be exactly those that fire
	for _, r := range dashboards.Alerts() {
		req := dashboards.Request{From: now.Add(-r.Range), To: now, Interval: time.Minute}
		front, err := req.Frontend(r.SQL)
		require.NoError(t, err)
		require.Equal(t, r.SQL, front, "%s: an alert rule's SQL must not depend on dashboard variables", r.UID)
		sql, err := req.Backend(r.SQL)
		require.NoError(t, err, r.UID)
		a, b := w.run(t, ctx, "alert "+r.UID, sql)
		if a == nil {
			continue
		}
		numbers, value := 0, -1
		for i, c := range a.Columns {
			if numeric(c.Type) {
				numbers, value = numbers+1, i
			} else {
				assert.Equal(t, "String", c.Type, "%s: label column %s", r.UID, c.Name)
			}
		}
		assert.Equal(t, 1, numbers, "%s: alerting needs exactly one numeric column: %v", r.UID, a.Columns)
		assert.NotEmpty(t, a.Rows, "%s: no rows on the simulated workload (which should make it fire)\n%s", r.UID, sql)
		t.Logf("%s: %s", r.UID, a.String())
		if value < 0 {
			continue
		}
		for _, res := range []*dual.Result{a, b} {
			assert.Empty(t, duplicateLabels(res, value), "%s: rows with the same labels make Grafana refuse the rule", r.UID)
		}
		for col, want := range fires[r.UID] {
			at := slices.Index(a.ColumnNames(), col)
			if col != "" && !assert.GreaterOrEqual(t, at, 0, "%s: no label %s", r.UID, col) {
				continue
			}
			got := map[string]float64{}
			for _, row := range a.Rows {
				key := ""
				if col != "" {
					key = row[at]
				}
				v, err := strconv.ParseFloat(row[value], 64)
				require.NoError(t, err, "%s: value %q", r.UID, row[value])
				got[key] = v
			}
			if only[r.UID] {
				assert.ElementsMatch(t, slices.Collect(maps.Keys(want)), slices.Collect(maps.Keys(got)), "%s: the %s that fire", r.UID, col)
			}
			for key, wantValue := range want {
				v, ok := got[key]
				if !assert.True(t, ok, "%s: no row for %s %q, which should fire", r.UID, col, key) {
					continue
				}
				assert.Greater(t, v, r.Above, "%s: %s %q should fire: its value is not above the threshold", r.UID, col, key)
				assert.InDelta(t, wantValue, v, 1e-9, "%s: %s %q", r.UID, col, key)
			}
		}
	}
	require.Len(t, w.twins.budgets, 2)
	require.Len(t, w.twins.agents, 2)
}

// duplicateLabels are the label sets (every column but the value) that more than one
// row of r has.
func duplicateLabels(r *dual.Result, value int) []string {
	seen := map[string]int{}
	var dups []string
	for _, row := range r.Rows {
		var labels []string
		for i, v := range row {
			if i != value {
				labels = append(labels, r.Columns[i].Name+"="+strconv.Quote(v))
			}
		}
		key := strings.Join(labels, ", ")
		if seen[key]++; seen[key] == 2 {
			dups = append(dups, key)
		}
	}
	return dups
}

func columnIndex(t *testing.T, r *dual.Result, name string) int {
	t.Helper()
	for i, c := range r.Columns {
		if c.Name == name {
			return i
		}
	}
	t.Fatalf("no column %s in %v", name, r.ColumnNames())
	return -1
}

// TestIntegrationHostileValuesFilterExactly: a variable holding a hostile id selects
// exactly that id's rows, on both engines, and a value that is not an id (a prefix of
// one, one with a newline a URL added, two values a URL gave) selects nothing. The
// filter is the one every panel uses (value() and is() in vars.go; the unit tests hold
// every panel to that form).
func TestIntegrationHostileValuesFilterExactly(t *testing.T) {
	w := loadWorld(t)
	ctx := context.Background()
	h := w.hostile
	filter := func(col, name string) string {
		return fmt.Sprintf("$__conditionalAll(%s = decodeURLComponent('${%s:percentencode}'), $%s)", col, name, name)
	}
	cases := []struct {
		variable, col, table string
		ids                  []string // that exist: each selects itself
	}{
		{"org", "org_id", "events", []string{h.org}},
		{"agent", "actor_id", "events", h.agents},
		{"owner", "owner_id", "directory", []string{h.owner}},
		{"room", "room_id", "events", []string{h.room}},
		{"model", "model", "usage_hourly", []string{h.model}},
	}
	for _, c := range cases {
		sql := "SELECT DISTINCT " + c.col + " AS v FROM bandplane." + c.table + " FINAL WHERE " + filter(c.col, c.variable) + " ORDER BY v"
		check := func(v dashboards.Variable, want []string) {
			t.Helper()
			expanded, err := dashboards.Request{Vars: []dashboards.Variable{v}}.Expand(sql)
			require.NoError(t, err)
			a, _ := w.run(t, ctx, fmt.Sprintf("%s = %q", c.variable, v.Values), expanded)
			if a == nil {
				return
			}
			var got []string
			for _, r := range a.Rows {
				got = append(got, r[0])
			}
			assert.Equal(t, want, got, "%s = %q\n%s", c.variable, v.Values, expanded)
		}
		for _, id := range c.ids {
			check(dashboards.Variable{Name: c.variable, Values: []string{id}}, []string{id})
			check(dashboards.Variable{Name: c.variable, Values: []string{id + "\n"}}, nil)
			r := []rune(id)
			check(dashboards.Variable{Name: c.variable, Values: []string{string(r[:len(r)-1])}}, nil)
			check(dashboards.Variable{Name: c.variable, Values: []string{id, id}, Multi: true}, nil)
			check(dashboards.Variable{Name: c.variable, Values: []string{`x\' OR 1=1 --`[:3]}}, nil)
		}
	}
}

// eventColumns are bandplane.events' columns, in order.
const eventColumns = "id, type, time, time_ms, org_id, room_id, actor_id, actor_type, actor_handle, owner_id, subject_id, " +
	"subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at, kafka_partition, kafka_offset"

// Oracles: what the reads without FINAL (dashboards' unmerged) replaced, reading FINAL.
// sealStatusFinal is the seal status's size, leaves and events not sealed yet, one query
// each (org_id and the value): the newest checkpoint's size, the leaves of the log
// counted (a whole log's count is its largest index + 1), and the events FINAL keeps
// that no leaf under the newest checkpoint seals, the leaves read whole.
var sealStatusFinal = map[string]string{
	"orgs": `
	SELECT org_id, '' AS v FROM bandplane.events FINAL WHERE ` + orgFilter + ` GROUP BY org_id
	UNION ALL
	SELECT org_id, '' AS v FROM bandplane.checkpoints FINAL WHERE ` + orgFilter + ` GROUP BY org_id`,
	"size": `
	SELECT org_id, toString(max(size)) AS v FROM bandplane.checkpoints FINAL WHERE ` + orgFilter + ` GROUP BY org_id`,
	"leaves": `
	SELECT org_id, toString(count()) AS v FROM bandplane.log_index FINAL WHERE ` + orgFilter + ` GROUP BY org_id`,
	"unsealed_events": `
	SELECT org_id, toString(count()) AS v
	FROM (
	  SELECT org_id, time, id, ingested_at FROM bandplane.events FINAL
	  WHERE ` + orgFilter + ` AND ingested_at >= now() - INTERVAL 1 DAY
	) AS e
	ANY LEFT JOIN (
	  SELECT org_id, time, id, max(leaf_at) AS sealed_at
	  FROM (SELECT org_id, time, id, idx, ingested_at AS leaf_at FROM bandplane.log_leaves FINAL WHERE ` + orgFilter + `) AS l
	  ANY LEFT JOIN (SELECT org_id, max(size) AS head FROM bandplane.checkpoints FINAL WHERE ` + orgFilter + ` GROUP BY org_id) AS h USING (org_id)
	  WHERE idx < head
	  GROUP BY org_id, time, id
	) AS s USING (org_id, time, id)
	WHERE ingested_at > sealed_at
	GROUP BY org_id`,
}

// sealColumns are the seal status's columns the oracle computes, in byOrg's order.
var sealColumns = []string{"size", "leaves", "unsealed_events"}

const (
	orgFilter      = "$__conditionalAll(org_id = decodeURLComponent('${org:percentencode}'), $org)"
	freshnessFinal = `
	SELECT toInt64(now()) - toInt64(max(ingested_at)) AS freshness
	FROM bandplane.events FINAL
	WHERE ` + orgFilter + ` AND time >= now() - INTERVAL 2 DAY`
)

// expandOrg expands sql for the org variable set to org ("" is All).
func (w *world) expandOrg(t *testing.T, sql, org string) string {
	t.Helper()
	v := dashboards.Variable{Name: "org", All: true, Values: []string{dashboards.AllValue}}
	if org != "" {
		v = dashboards.Variable{Name: "org", Values: []string{org}}
	}
	out, err := dashboards.Request{From: w.from, To: w.to, Interval: time.Minute, Vars: []dashboards.Variable{v}}.Expand(sql)
	require.NoError(t, err)
	return out
}

// sealOracle is sealStatusFinal's answer for org: org_id → size, leaves, unsealed_events.
func (w *world) sealOracle(t *testing.T, ctx context.Context, org string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, part := range append([]string{"orgs"}, sealColumns...) {
		res, _ := w.run(t, ctx, "seal status FINAL: "+part, w.expandOrg(t, sealStatusFinal[part], org))
		require.NotNil(t, res)
		for _, row := range res.Rows {
			if out[row[0]] == nil {
				out[row[0]] = []string{"0", "0", "0"}
			}
			if i := slices.Index(sealColumns, part); i >= 0 {
				out[row[0]][i] = row[1]
			}
		}
	}
	return out
}

// TestIntegrationReadsWithoutFinalAreExact: the reads that skip FINAL (the seal status
// and freshness panels, the freshness alert) answer what reading FINAL answers, on both
// engines, with keys stored more than once as ingest can store them: the same row twice
// (a redelivery), a row again with a newer ingested_at (an insert retried after its
// first copy was sealed, which its leaf does not seal), and the rows of an organization
// never sealed. Merges are stopped on the replayed tables, so every copy stays a row of
// its own.
func TestIntegrationReadsWithoutFinalAreExact(t *testing.T) {
	w := loadWorld(t)
	ctx := context.Background()
	require.GreaterOrEqual(t, len(w.orgs), 2)
	orgA, orgB, never := w.orgs[0].id, w.orgs[1].id, "never-sealed-org"
	all, err := dashboards.Build()
	require.NoError(t, err)
	seal := panelSQL(t, all[dashboards.ComplianceFile], "Latest seal per organization")
	freshness := panelSQL(t, all[dashboards.IngestFile], "Freshness")
	var freshnessAlert string
	for _, r := range dashboards.Alerts() {
		if r.UID == "bandplane-ingest-freshness" {
			freshnessAlert = r.SQL
		}
	}
	require.NotEmpty(t, freshnessAlert)
	before := w.sealOracle(t, ctx, "")

	newer := fmt.Sprintf("toDateTime(%d, 'UTC') AS ingested_at", w.now.Unix()-1)
	copyOf := func(org, cols string, limit int) string {
		// The source rows in a subquery: an alias in cols (… AS org_id) would stand for the
		// column in a WHERE next to it.
		return "INSERT INTO " + w.db + ".events (" + eventColumns + ") SELECT " + cols + " FROM (SELECT * FROM " + w.db +
			".events WHERE org_id = " + chLiteral(org) + " ORDER BY time, id LIMIT " + strconv.Itoa(limit) + ") AS src"
	}
	for _, insert := range []string{
		// an organization never sealed (3 events of orgA's, renamed), and redelivered
		copyOf(orgA, strings.NewReplacer("org_id", chLiteral(never)+" AS org_id", "id, type", "concat(id, '-n') AS id, type").Replace(eventColumns), 3),
		copyOf(never, eventColumns, 3),
		copyOf(orgA, eventColumns, 40),                                           // redelivered: the same rows again
		copyOf(orgB, strings.Replace(eventColumns, "ingested_at", newer, 1), 25), // stored again after sealing
	} {
		for _, e := range []dual.Engine{w.server, w.current} {
			require.NoError(t, e.Exec(ctx, insert), "%s: %s", e.Name(), insert)
		}
	}

	for _, org := range []string{"", orgA, orgB, never, w.hostile.org, w.seal.never.org, w.seal.forged.org} {
		want := w.sealOracle(t, ctx, org)
		res, _ := w.run(t, ctx, "seal status ["+org+"]", w.expandOrg(t, seal, org))
		require.NotNil(t, res)
		assert.Equal(t, want, byOrg(t, res), "seal status [%s]: the read without FINAL differs from FINAL", org)
		queries := []string{freshness}
		if org == "" {
			queries = append(queries, freshnessAlert) // no org variable: every organization
		}
		fin, _ := w.run(t, ctx, "freshness FINAL ["+org+"]", w.expandOrg(t, freshnessFinal, org))
		require.NotNil(t, fin)
		for _, q := range queries {
			got, _ := w.run(t, ctx, "freshness ["+org+"]", w.expandOrg(t, q, org))
			require.NotNil(t, got)
			assert.Equal(t, fin.Rows, got.Rows, "freshness [%s]: the read without FINAL differs from FINAL", org)
		}
	}
	// The copies were seen: the redelivered rows counted once, the rows stored again
	// after sealing as not sealed yet, the organization never sealed with its 3 events.
	after := w.sealOracle(t, ctx, "")
	assert.Equal(t, before[orgA], after[orgA], "redelivered rows count once")
	assert.Equal(t, []string{before[orgB][0], before[orgB][1], "25"}, after[orgB], "rows stored again after sealing are not sealed yet")
	assert.Equal(t, []string{"0", "0", "3"}, after[never], "the organization never sealed")
}

// byOrg is a seal status result as org_id → its sealColumns.
func byOrg(t *testing.T, r *dual.Result) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	var cols []int
	for _, c := range sealColumns {
		cols = append(cols, columnIndex(t, r, c))
	}
	org := columnIndex(t, r, "org_id")
	for _, row := range r.Rows {
		var v []string
		for _, c := range cols {
			v = append(v, row[c])
		}
		out[row[org]] = v
	}
	return out
}

// TestIntegrationSealStatusReadsTheLog runs the seal status panel on the sealed world,
// on both engines: every organization whose rows ingest stored is sealed, its newest
// checkpoint as large as its log and as its rows; the hostile organization, whose later
// rows have no leaf, is not, with their number and the age of the oldest; an
// organization with rows and no log is never sealed; and one with a checkpoint row
// forged for it (unsigned, claiming leaves its log does not have) is not sealed either,
// its status saying the checkpoint is larger than the log (the panel's description says
// what a forged row can and cannot do: TestSealStatusSaysWhatItCannotCheck).
func TestIntegrationSealStatusReadsTheLog(t *testing.T) {
	w := loadWorld(t)
	ctx := context.Background()
	all, err := dashboards.Build()
	require.NoError(t, err)
	seal := panelSQL(t, all[dashboards.ComplianceFile], "Latest seal per organization")
	res, _ := w.run(t, ctx, "seal status", w.expandOrg(t, seal, ""))
	require.NotNil(t, res)
	col := func(name string) int { return columnIndex(t, res, name) }
	org, status, size, leaves, unsealed, age, key := col("org_id"), col("status"), col("size"), col("leaves"),
		col("unsealed_events"), col("unsealed_age"), col("key_id")
	rows := map[string][]string{}
	for _, r := range res.Rows {
		rows[r[org]] = r
	}
	s := w.seal
	late := s.late.org
	for o, n := range s.sealed {
		r := rows[o]
		if !assert.NotNil(t, r, "no row for organization %q", o) {
			continue
		}
		sealed := strconv.FormatUint(n, 10)
		if o == late {
			assert.Equal(t, fmt.Sprintf("%d events not sealed yet", s.late.n), r[status], "org %q", o)
			assert.Equal(t, strconv.Itoa(s.late.n), r[unsealed], "org %q", o)
			assert.Equal(t, strconv.FormatInt(w.now.Unix()-s.late.ingested.Unix(), 10), r[age], "org %q: the oldest row not sealed", o)
		} else {
			assert.Equal(t, "sealed", r[status], "org %q", o)
			assert.Equal(t, "0", r[unsealed], "org %q", o)
			assert.Equal(t, dual.Null, r[age], "org %q", o)
		}
		assert.Equal(t, sealed, r[size], "org %q: the newest checkpoint covers its rows", o)
		assert.Equal(t, sealed, r[leaves], "org %q: a leaf per row", o)
		assert.NotEqual(t, dual.Null, r[key], "org %q", o)
	}
	if r := rows[s.never.org]; assert.NotNil(t, r, "no row for the organization never sealed") {
		assert.Equal(t, []string{"never sealed", "0", "0", strconv.Itoa(s.never.n), strconv.FormatInt(w.now.Unix()-s.never.ingested.Unix(), 10), dual.Null},
			[]string{r[status], r[size], r[leaves], r[unsealed], r[age], r[key]})
	}
	if r := rows[s.forged.org]; assert.NotNil(t, r, "no row for the organization with a forged checkpoint") {
		assert.Equal(t, fmt.Sprintf("newest checkpoint claims %d leaves, the log holds 0", s.forgedSize), r[status], "a forged checkpoint seals nothing")
		assert.Equal(t, []string{strconv.FormatUint(s.forgedSize, 10), "0", strconv.Itoa(s.forged.n), "forged"},
			[]string{r[size], r[leaves], r[unsealed], r[key]}, "the forged row is shown as it is written")
	}
	assert.Len(t, rows, len(s.sealed)+2, "an organization per log or events")
	// The hostile organization alone: its id selects its row only.
	one, _ := w.run(t, ctx, "seal status [hostile]", w.expandOrg(t, seal, late))
	require.NotNil(t, one)
	if assert.Len(t, one.Rows, 1) {
		assert.Equal(t, rows[late], one.Rows[0])
	}
}

func panelSQL(t *testing.T, d dashboard.Dashboard, title string) string {
	t.Helper()
	for _, p := range panelsOf(d) {
		if deref(p.Title) == title {
			return p.Targets[0].(dashboards.ClickHouseQuery).RawSql
		}
	}
	t.Fatalf("no panel %q", title)
	return ""
}
