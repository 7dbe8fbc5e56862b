package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Where `bandplane dashboards` writes, relative to this package.
const (
	generatedDir = "../deploy/grafana/dashboards"
	alertsDir    = "../deploy/grafana/provisioning/alerting"
)

type panelWant struct {
	title, typ string
	format     Format
}

func TestDashboardsHaveExpectedPanels(t *testing.T) {
	want := map[string]struct {
		uid, title string
		panels     []panelWant
	}{
		ActivityFile: {ActivityUID, "bandplane — Agent activity", []panelWant{
			{"Messages per agent", "timeseries", FormatTimeSeries},
			{"Chattiest agents", "barchart", FormatTable},
			{"Activity per agent", "table", FormatTable},
			{"Tool calls and errors", "timeseries", FormatTimeSeries},
			{"Throttles", "timeseries", FormatTimeSeries},
			{"Suspensions", "table", FormatTable},
			{"Rooms", "table", FormatTable},
		}},
		ComplianceFile: {ComplianceUID, "bandplane — Compliance audit", []panelWant{
			{"Latest seal per organization", "table", FormatTable},
			{"Events by type", "timeseries", FormatTimeSeries},
			{"Audit trail", "table", FormatTable},
		}},
		CostFile: {CostUID, "bandplane — Cost & attribution", []panelWant{
			{"Total cost", "stat", FormatTable},
			{"Tokens by kind", "stat", FormatTable},
			{"Cache savings", "stat", FormatTable},
			{"Unpriced usage events", "stat", FormatTable},
			{"Spend by organization", "timeseries", FormatTimeSeries},
			{"Spend by model", "timeseries", FormatTimeSeries},
			{"Spend by owner", "timeseries", FormatTimeSeries},
			{"Spend by agent", "timeseries", FormatTimeSeries},
			{"Spend by room", "timeseries", FormatTimeSeries},
			{"Tokens by kind over time", "timeseries", FormatTimeSeries},
			{"Tokens by model over time", "timeseries", FormatTimeSeries},
			{"Top spenders", "table", FormatTable},
			{"Cost by owner", "barchart", FormatTable},
			{"Cost by room", "barchart", FormatTable},
			{"Cost by initiator", "barchart", FormatTable},
			{"Spend caused by other owners", "table", FormatTable},
			{"Spend by chain depth", "timeseries", FormatTimeSeries},
			{"Cache savings by model", "table", FormatTable},
			{"Unpriced usage by model", "table", FormatTable},
			{"Budgets", "table", FormatTable},
			{"Budget burn-down", "timeseries", FormatTimeSeries},
		}},
		GovernanceFile: {GovernanceUID, "bandplane — Governance", []panelWant{
			{"Decisions allowed and denied", "timeseries", FormatTimeSeries},
			{"Denials by reason", "timeseries", FormatTimeSeries},
			{"Decisions by decision and reason", "table", FormatTable},
			{"Contact-request funnel", "stat", FormatTable},
			{"Cross-organization adds and refusals", "stat", FormatTable},
			{"Contact requests by owner", "table", FormatTable},
			{"Cross-organization adds", "table", FormatTable},
			{"Policy revisions in force", "timeseries", FormatTimeSeries},
			{"Policy revisions", "table", FormatTable},
		}},
		IngestFile: {IngestUID, "bandplane — Pipeline health", []panelWant{
			{"Events ingested", "stat", FormatTable},
			{"Freshness", "stat", FormatTable},
			{"Dead letters", "stat", FormatTable},
			{"Ingest rate", "timeseries", FormatTimeSeries},
			{"Ingest lag", "timeseries", FormatTimeSeries},
			{"Events ingested per type", "timeseries", FormatTimeSeries},
			{"Dead letters by stage", "timeseries", FormatTimeSeries},
			{"Latest dead-letter reasons", "table", FormatTable},
		}},
		WorkFile: {WorkUID, "bandplane — Work status", []panelWant{
			{"Tasks by status", "barchart", FormatTable},
			{"Tasks by room", "table", FormatTable},
			{"Stuck tasks", "table", FormatTable},
			{"Waiting for a human", "table", FormatTable},
			{"Oldest wait per room", "barchart", FormatTable},
		}},
	}
	all, err := Build()
	require.NoError(t, err)
	if diff := cmp.Diff(sortedKeys(want), sortedKeys(all)); diff != "" {
		t.Fatalf("dashboard files (-want +got):\n%s", diff)
	}
	for name, w := range want {
		d := all[name]
		assert.Equal(t, w.uid, deref(d.Uid), name)
		assert.Equal(t, w.title, deref(d.Title), name)
		var got []panelWant
		ids := map[uint32]bool{}
		for _, p := range d.Panels {
			var id *uint32
			switch {
			case p.Panel != nil:
				id = p.Panel.Id
				if !assert.Len(t, p.Panel.Targets, 1, "%s: panel %q", name, deref(p.Panel.Title)) {
					continue
				}
				got = append(got, panelWant{deref(p.Panel.Title), p.Panel.Type, p.Panel.Targets[0].(ClickHouseQuery).Format})
			case p.RowPanel != nil:
				id = &p.RowPanel.Id
			}
			if id == nil || ids[*id] {
				t.Errorf("%s: a panel has no id or a duplicate one", name)
			} else {
				ids[*id] = true
			}
		}
		if diff := cmp.Diff(w.panels, got, cmp.AllowUnexported(panelWant{})); diff != "" {
			t.Errorf("%s panels (-want +got):\n%s", name, diff)
		}
	}
}

// sqlOf is every SQL text a dashboard sends: its panels' targets and its variables'
// queries, keyed by where it comes from.
type sqlOf struct {
	where, sql string
	panel      *dashboard.Panel
	variable   string // the variable's name, for a variable's query
}

func queries(name string, d dashboard.Dashboard) []sqlOf {
	var out []sqlOf
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			q, _ := VariableSQL(v.Query)
			out = append(out, sqlOf{where: name + ": variable " + v.Name, sql: q, variable: v.Name})
		}
	}
	for _, p := range panels(d) {
		for _, tg := range p.Targets {
			out = append(out, sqlOf{where: name + ": " + deref(p.Title), sql: tg.(ClickHouseQuery).RawSql, panel: &p})
		}
	}
	return out
}

var (
	// fromTable is a read of a table: FINAL, or unmerged's comment saying why not.
	fromTable    = regexp.MustCompile(`\bFROM\s+(\w+)\.(\w+)(\s+FINAL\b|\s+/\* no FINAL: [^*]+ \*/)?`)
	varRef       = regexp.MustCompile(`\$\{(\w+)(?::([^}]*))?\}|\$(\w+)`)
	ch1816Breaks = []string{
		"toStartOfInterval", "$__timeInterval", "$__fromTime_ms", "$__toTime_ms", "$__timeFilter_ms", // no toStartOfInterval, no DateTime64
		"DateTime64", "JSONExtract", " OVER ", "OVER(", "LowCardinality", " Map(", "(Map(", " Bool", "(Bool", "ASOF", "ilike",
		"ANY INNER JOIN", // keeps one row per left key too since 20.x
	}
	positionalOrder = regexp.MustCompile(`ORDER BY\s+\d`)
	safeLiteral     = regexp.MustCompile(`^[A-Za-z0-9%._~-]*$`)
)

// TestQueriesFollowTheRules checks what every query must keep to run on ClickHouse 18.16
// and current releases, count a replayed event once, stay in its tenant, and take
// variables only through value().
func TestQueriesFollowTheRules(t *testing.T) {
	for name, d := range All() {
		vars := map[string]bool{}
		for _, v := range d.Templating.List {
			vars[v.Name] = true
		}
		for _, q := range queries(name, d) {
			checkSQL(t, q.where, q.sql, vars)
			if q.variable != varOrg { // the org variable lists the organizations
				for _, p := range tenantProblems(q.where, q.sql) {
					t.Error(p)
				}
			}
			if q.panel == nil {
				continue
			}
			p := q.panel
			cq := p.Targets[0].(ClickHouseQuery)
			assert.NoError(t, cq.Validate(), q.where)
			assert.Equal(t, "${datasource}", deref(cq.Datasource.Uid), "%s: query data source", q.where)
			assert.Equal(t, "${datasource}", deref(p.Datasource.Uid), "%s: panel data source", q.where)
			if !strings.Contains(q.sql, "$__timeFilter(") && !strings.Contains(q.sql, "$__fromTime") && !strings.Contains(q.sql, "now()") {
				t.Errorf("%s: neither uses the dashboard's range nor is as of now:\n%s", q.where, q.sql)
			}
			if cq.Format == FormatTimeSeries && !regexp.MustCompile(`ORDER BY (time|bucket)\b[^()]*$`).MatchString(q.sql) {
				t.Errorf("%s: a time series must be sorted by its time column:\n%s", q.where, q.sql)
			}
			if p.Type != "table" && (p.FieldConfig == nil || p.FieldConfig.Defaults.Unit == nil) {
				t.Errorf("%s: no unit", q.where)
			}
		}
	}
	for _, r := range Alerts() {
		checkSQL(t, "alert "+r.UID, r.SQL, map[string]bool{})
		assert.NotContains(t, r.SQL, "$__conditionalAll", "%s: alerting has no frontend", r.UID)
	}
}

func checkSQL(t *testing.T, where, s string, vars map[string]bool) {
	t.Helper()
	for _, p := range sqlProblems(where, s, vars) {
		t.Error(p)
	}
}

func sqlProblems(where, s string, vars map[string]bool) []string {
	var out []string
	errorf := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	froms := fromTable.FindAllStringSubmatch(s, -1)
	if len(froms) == 0 {
		errorf("%s: no FROM bandplane.<table> in\n%s", where, s)
	}
	for _, m := range froms {
		if m[1] != "bandplane" {
			errorf("%s: reads %s.%s, want database bandplane", where, m[1], m[2])
		}
		// Every table is a ReplacingMergeTree: without FINAL a replay counts twice, unless
		// the read is one whose answer FINAL does not change, said so with unmerged.
		if m[3] == "" {
			errorf("%s: reads %s.%s without FINAL (or unmerged's reason why not)", where, m[1], m[2])
		}
	}
	out = append(out, timezoneProblems(where, s)...)
	for _, bad := range ch1816Breaks {
		if strings.Contains(s, bad) {
			errorf("%s: uses %q, which ClickHouse 18.16 or current releases treat differently:\n%s", where, bad, s)
		}
	}
	if positionalOrder.MatchString(s) {
		errorf("%s: positional ORDER BY (18.16 orders by the constant):\n%s", where, s)
	}
	out = append(out, subqueryProblems(where, s)...)
	for _, m := range varRef.FindAllStringSubmatchIndex(s, -1) {
		ref := s[m[0]:m[1]]
		switch {
		case strings.HasPrefix(ref, "$__"):
			if rest := s[m[1]:]; (ref == "$__fromTime" || ref == "$__toTime" || ref == "$__interval_s") && !strings.HasPrefix(rest, ")") {
				errorf("%s: %s must be followed by \")\" (the plugin takes everything up to the next \")\" as its arguments when a \"(\" comes first)", where, ref)
			}
		case m[2] >= 0: // ${name:fmt}
			name, format := s[m[2]:m[3]], ""
			if m[4] >= 0 {
				format = s[m[4]:m[5]]
			}
			if format != "percentencode" || !strings.HasSuffix(s[:m[0]], "decodeURLComponent('") || !strings.HasPrefix(s[m[1]:], "')") {
				errorf("%s: %s: a variable goes into SQL only as decodeURLComponent('${%s:percentencode}') (value())", where, ref, name)
			}
			if !vars[name] {
				errorf("%s: %s is not a variable of this dashboard", where, ref)
			}
		default: // $name: only as $__conditionalAll's second argument
			name := s[m[6]:m[7]]
			if !strings.HasPrefix(s[m[1]:], ")") || !strings.HasSuffix(s[:m[0]], ", ") {
				errorf("%s: bare %s outside $__conditionalAll", where, ref)
			}
			if !vars[name] {
				errorf("%s: $%s is not a variable of this dashboard", where, name)
			}
		}
	}
	return out
}

// subqueryProblems: every parenthesised SELECT is a subquery with an alias (ClickHouse
// ≥ 20 refuses a JOIN subquery without one) unless it is the right side of IN or a
// scalar; and no SELECT has more than one JOIN (18.16).
func subqueryProblems(where, s string) []string {
	var out []string
	errorf := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	depthJoins := map[int]int{}
	var stack []int
	level := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			stack = append(stack, i)
			level++
			depthJoins[level] = 0
		case ')':
			if len(stack) == 0 {
				errorf("%s: unbalanced parentheses", where)
				return out
			}
			open := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			level--
			inner := strings.TrimSpace(s[open+1 : i])
			if !strings.HasPrefix(inner, "SELECT") && !strings.HasPrefix(inner, "WITH") {
				continue
			}
			before := strings.TrimRight(s[:open], " \t\n")
			after := strings.TrimLeft(s[i+1:], " \t\n")
			if strings.HasSuffix(before, " IN") || strings.HasSuffix(before, "WITH") || scalarAfter.MatchString(before) {
				continue
			}
			if !regexp.MustCompile(`^AS \w+`).MatchString(after) {
				errorf("%s: subquery without an alias: (%.60s…)", where, inner)
			}
		default:
			if strings.HasPrefix(s[i:], " JOIN ") {
				depthJoins[level]++
				if depthJoins[level] > 1 {
					errorf("%s: two JOINs in one SELECT (18.16 allows one):\n%s", where, s)
				}
			}
		}
	}
	return out
}

// scalarAfter is the end of the text before a scalar subquery: a comparison.
var scalarAfter = regexp.MustCompile(`(=|<|>|!=)$`)

// roundsTime are ClickHouse's functions that round, split or read a DateTime in a time
// zone: the server's unless told. The macros expand to toDateTime(<seconds>), a DateTime
// in the server's zone, so every such call names 'UTC' as its last argument, whatever it
// is given (a column, a macro, now()).
var roundsTime = regexp.MustCompile(`\b(toStartOf\w+|toDate|toDateTime|toMonday|toYYYYMM\w*|toYear|toQuarter|toMonth|toDayOf\w+|toHour|toMinute|toSecond|toRelative\w+|toISOWeek|toISOYear|toWeek|toYearWeek|toTime)\(`)

func timezoneProblems(where, s string) []string {
	var out []string
	for _, m := range roundsTime.FindAllStringSubmatchIndex(s, -1) {
		args := macroArgs(s, m[1]-1)
		if args == nil {
			out = append(out, fmt.Sprintf("%s: %s( does not close", where, s[m[2]:m[3]]))
			continue
		}
		if len(args) < 2 || strings.TrimSpace(args[len(args)-1]) != "'UTC'" {
			out = append(out, fmt.Sprintf("%s: %s(%s) uses the server's time zone: pass 'UTC' as its last argument", where, s[m[2]:m[3]], strings.Join(args, ",")))
		}
	}
	return out
}

// selectNode is one SELECT of a query: its own text (with each subquery cut out as
// (#n)), its subqueries, and whether it is a lookup.
type selectNode struct {
	own      string
	children []*selectNode
	// lookup: the right side of a JOIN that reads only the directory and rooms (names,
	// handles and organizations by id).
	lookup bool
}

// parseSelects splits a query into its SELECTs: the parts of a UNION ALL at the top,
// each with the subqueries of its own text.
func parseSelects(s string) []*selectNode {
	n := 0
	return parseUnion(s, &n)
}

func parseUnion(s string, n *int) []*selectNode {
	text, groups := parseLevel(s, n)
	var out []*selectNode
	for _, part := range strings.Split(text, "UNION ALL") {
		node := &selectNode{own: part}
		for id, g := range groups {
			if strings.Contains(part, "(#"+itoa(id)+")") {
				node.children = append(node.children, g...)
			}
		}
		out = append(out, node)
	}
	return out
}

// parseLevel is s with each parenthesised SELECT replaced by (#n), and those SELECTs by
// n. Parentheses inside string literals do not count.
func parseLevel(s string, n *int) (string, map[int][]*selectNode) {
	var b strings.Builder
	groups := map[int][]*selectNode{}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\'':
			j := skipLiteral(s, i)
			b.WriteString(s[i:j])
			i = j - 1
		case '(':
			j := closingParen(s, i)
			inner := s[i+1 : j]
			if t := strings.TrimSpace(inner); strings.HasPrefix(t, "SELECT") || strings.HasPrefix(t, "WITH") {
				*n++
				id := *n
				g := parseUnion(inner, n)
				if strings.HasSuffix(strings.TrimSpace(b.String()), "JOIN") && readsOnly(inner, "directory", "rooms") {
					markLookup(g)
				}
				groups[id] = g
				b.WriteString("(#" + itoa(id) + ")")
			} else {
				text, inner := parseLevel(inner, n)
				for id, g := range inner {
					groups[id] = g
				}
				b.WriteString("(" + text + ")")
			}
			i = j
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), groups
}

// skipLiteral is the index after the string literal that opens at i (\ escapes).
func skipLiteral(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '\'':
			return j + 1
		}
	}
	return len(s)
}

// closingParen is the index of the ")" that closes the "(" at i (len(s) if none).
func closingParen(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '\'':
			j = skipLiteral(s, j) - 1
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return len(s)
}

func readsOnly(s string, tables ...string) bool {
	froms := fromTable.FindAllStringSubmatch(s, -1)
	for _, m := range froms {
		if !slices.Contains(tables, m[2]) {
			return false
		}
	}
	return len(froms) > 0
}

func markLookup(nodes []*selectNode) {
	for _, n := range nodes {
		n.lookup = true
		markLookup(n.children)
	}
}

// orgFiltered is the org variable's test, in the one form vars.go writes it.
var orgFiltered = regexp.MustCompile(`\$__conditionalAll\(.*decodeURLComponent\('\$\{org:percentencode\}'\).*, \$org\)`)

// tenantProblems: every SELECT that reads a tenant's table (all but the dead letters and
// the price catalog, which have no organization) is filtered by the org variable, in its
// own WHERE or in a SELECT it is nested in (its rows reach the panel only through that
// one: the cross-organization adds read every participant.added and keep those whose
// room or participant is of the organization). Not filtered, on purpose:
//   - lookups, the right side of a JOIN that reads only the directory and rooms: they
//     name ids of rows already filtered, and filtering them by organization too would
//     lose the names and organizations of parties and rooms of other organizations (a
//     participant from another organization, a room whose org_id is another's);
//   - the org variable's own query, which lists the organizations;
//   - the alert rules, which have no variables and see every organization.
func tenantProblems(where, s string) []string {
	var out []string
	var walk func(nodes []*selectNode, filtered bool)
	walk = func(nodes []*selectNode, filtered bool) {
		for _, n := range nodes {
			here := filtered || orgFiltered.MatchString(n.own)
			if !here && !n.lookup {
				for _, m := range fromTable.FindAllStringSubmatch(n.own, -1) {
					if m[2] != "dead_letters" && m[2] != "prices" {
						out = append(out, fmt.Sprintf("%s: a SELECT reads %s without filtering on the org variable:\n%s", where, m[2], strings.TrimSpace(n.own)))
					}
				}
			}
			walk(n.children, here)
		}
	}
	walk(parseSelects(s), false)
	return out
}

// The rule checker itself catches each mistake it is there for.
func TestSQLRulesCatchMistakes(t *testing.T) {
	vars := map[string]bool{"org": true}
	for bad, want := range map[string]string{
		"SELECT 1 FROM bandplane.events WHERE 1": "without FINAL",
		"SELECT 1 FROM other.events FINAL":       "want database bandplane",
		"SELECT a FROM (SELECT a FROM bandplane.t FINAL) ANY LEFT JOIN (SELECT a FROM bandplane.u FINAL) AS u USING (a)":                                                "without an alias",
		"SELECT a FROM bandplane.t FINAL ANY LEFT JOIN (SELECT a FROM bandplane.u FINAL) AS u USING (a) ANY LEFT JOIN (SELECT a FROM bandplane.v FINAL) AS v USING (a)": "two JOINs",
		"SELECT 1 FROM bandplane.t FINAL WHERE org_id IN (${org:singlequote})":                                                                                          "only as decodeURLComponent",
		"SELECT 1 FROM bandplane.t FINAL WHERE org_id = '${org}'":                                                                                                       "only as decodeURLComponent",
		"SELECT 1 FROM bandplane.t FINAL WHERE org_id = decodeURLComponent('${nope:percentencode}')":                                                                    "not a variable",
		"SELECT 1 FROM bandplane.t FINAL WHERE org_id = $org":                                                                                                           "outside $__conditionalAll",
		"SELECT 1 FROM bandplane.t FINAL WHERE h <= $__toTime AND x IN (1)":                                                                                             "must be followed by",
		"SELECT 1 FROM bandplane.t FINAL ORDER BY 2":                                                                                                                    "positional",
		"SELECT toStartOfInterval(t, INTERVAL 1 hour) FROM bandplane.t FINAL":                                                                                           "toStartOfInterval",
		"SELECT 1 FROM bandplane.t FINAL ANY INNER JOIN (SELECT 1 FROM bandplane.u FINAL) AS u USING (a)":                                                               "ANY INNER JOIN",
		"SELECT 1 FROM bandplane.t /* no FINAL */":                                                                                                                      "without FINAL",
		"SELECT toStartOfHour(($__fromTime)) FROM bandplane.t FINAL":                                                                                                    "toStartOfHour(($__fromTime)) uses the server's time zone",
		"SELECT 1 FROM bandplane.t FINAL WHERE toStartOfMonth(hour, 'Europe/Paris') = 1":                                                                                "toStartOfMonth(hour, 'Europe/Paris') uses",
		"SELECT toDateTime(intDiv(toUInt32(t), 60) * 60) FROM bandplane.t FINAL":                                                                                        "toDateTime(intDiv(toUInt32(t), 60) * 60) uses",
		"SELECT 1 FROM bandplane.t FINAL WHERE a >= toStartOfDay(now())":                                                                                                "toStartOfDay(now()) uses",
	} {
		problems := strings.Join(sqlProblems("q", bad, vars), "\n")
		assert.Contains(t, problems, want, bad)
	}
	assert.Empty(t, sqlProblems("q", "SELECT a FROM (SELECT a FROM bandplane.t FINAL WHERE $__conditionalAll(org_id = decodeURLComponent('${org:percentencode}'), $org) AND h <= ($__toTime)) AS t ANY LEFT JOIN (SELECT a FROM bandplane.u FINAL) AS u USING (a) WHERE a IN (SELECT a FROM bandplane.v FINAL)", vars))
	assert.Empty(t, sqlProblems("q", "SELECT max(x) FROM "+unmerged("t", "max is the same")+" WHERE h >= toStartOfHour(($__fromTime), 'UTC') AND a >= (SELECT min(b) FROM bandplane.u FINAL)", vars))
	assert.Panics(t, func() { unmerged("t", "a reason (with parentheses)") })
}

// The tenant rule looks at each SELECT, not at the query as a whole.
func TestTenantRuleCatchesAnUnfilteredSelect(t *testing.T) {
	org := "$__conditionalAll(org_id = decodeURLComponent('${org:percentencode}'), $org)"
	for bad, want := range map[string]string{
		"SELECT a FROM bandplane.events FINAL WHERE 1": "reads events without filtering",
		"SELECT a FROM (SELECT a FROM bandplane.events FINAL WHERE " + org + ") AS x UNION ALL SELECT a FROM bandplane.tasks FINAL":                             "reads tasks without",
		"SELECT a FROM (SELECT a FROM bandplane.events FINAL WHERE " + org + ") AS x ANY LEFT JOIN (SELECT a FROM bandplane.usage_hourly FINAL) AS u USING (a)": "reads usage_hourly without",
	} {
		assert.Contains(t, strings.Join(tenantProblems("q", bad), "\n"), want, bad)
	}
	for _, good := range []string{
		// filtered by the SELECT it is nested in
		"SELECT a FROM (SELECT a, o FROM bandplane.events FINAL) AS x WHERE " + strings.ReplaceAll(org, "org_id", "o"),
		// a set an IN tests rows of a filtered SELECT against
		"SELECT a FROM bandplane.events FINAL WHERE " + org + " AND a IN (SELECT a FROM bandplane.log_leaves FINAL)",
		// a lookup of names by id
		"SELECT a FROM (SELECT a FROM bandplane.events FINAL WHERE " + org + ") AS x ANY LEFT JOIN (SELECT id AS a, handle FROM bandplane.directory FINAL) AS names USING (a)",
		// no organization in the dead letters and prices
		"SELECT count() FROM bandplane.dead_letters FINAL UNION ALL SELECT count() FROM bandplane.prices FINAL",
		// a literal's parenthesis is not a subquery
		"SELECT if(a = '', '(x', a) FROM bandplane.events FINAL WHERE " + org,
	} {
		assert.Empty(t, tenantProblems("q", good), good)
	}
}

// hostileValues are ids full of what breaks string literals and URL encodings.
var hostileValues = []string{`a'b`, `x\`, `x\' OR 1=1 --`, `c,d`, `e&f=g%20`, `ünï "模型" ✓`, "new\nline", `$__timeFilter(x)`, `') OR (1=1`, `{a,b}`, `%27`}

// TestNoVariableValueChangesTheStatement expands every query with each hostile value in
// each of its variables (and with two values, as a URL can give): the statement must be
// the same as with a plain value, save for the contents of the decodeURLComponent
// literals, which hold only characters no string literal treats specially.
func TestNoVariableValueChangesTheStatement(t *testing.T) {
	literal := regexp.MustCompile(`decodeURLComponent\('([^']*)'\)`)
	shape := func(s string) string { return literal.ReplaceAllString(s, "decodeURLComponent(?)") }
	from, to := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	for name, d := range All() {
		var names []string
		for _, v := range d.Templating.List {
			if v.Type != "datasource" {
				names = append(names, v.Name)
			}
		}
		request := func(set map[string]Variable) Request {
			r := Request{From: from, To: to, Interval: time.Hour}
			for _, n := range names {
				if v, ok := set[n]; ok {
					r.Vars = append(r.Vars, v)
				} else {
					r.Vars = append(r.Vars, one(n, "plain"))
				}
			}
			return r
		}
		for _, q := range queries(name, d) {
			plain, err := request(nil).Expand(q.sql)
			require.NoError(t, err, q.where)
			for _, n := range names {
				for _, h := range hostileValues {
					for _, v := range []Variable{one(n, h), {Name: n, Values: []string{h, "plain"}, Multi: true}} {
						got, err := request(map[string]Variable{n: v}).Expand(q.sql)
						require.NoError(t, err, q.where)
						if shape(got) != shape(plain) {
							t.Errorf("%s: %s = %q changes the statement:\n%s", q.where, n, v.Values, got)
						}
						for _, m := range literal.FindAllStringSubmatch(got, -1) {
							if !safeLiteral.MatchString(m[1]) {
								t.Errorf("%s: %s = %q: literal %q holds an unsafe character", q.where, n, h, m[1])
							}
						}
					}
				}
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
		if _, ok := vars[varOrg]; !ok {
			t.Errorf("%s: no org variable", name)
		}
		used := map[string]bool{}
		for _, q := range queries(name, d) {
			for _, m := range varRef.FindAllStringSubmatch(q.sql, -1) {
				used[m[1]+m[3]] = true
			}
		}
		for _, v := range d.Templating.List {
			if v.Type == "datasource" {
				continue
			}
			if !used[v.Name] {
				t.Errorf("%s: variable %s is used by no query", name, v.Name)
			}
			if v.Type == "textbox" {
				continue
			}
			// Single value with "All" selected by default: see vars.go for why not multi.
			assert.True(t, v.IncludeAll != nil && *v.IncludeAll, "%s: %s has no All option", name, v.Name)
			assert.False(t, v.Multi != nil && *v.Multi, "%s: %s is multi-valued", name, v.Name)
			assert.Equal(t, AllValue, deref(v.Current.Value.String), "%s: %s", name, v.Name)
			if v.Type == "query" {
				assert.Equal(t, "${datasource}", deref(v.Datasource.Uid), "%s: %s", name, v.Name)
				// The plugin's query object (vars.go, variableQuery), the SQL also as the
				// definition.
				if assert.NotNil(t, v.Query, "%s: %s", name, v.Name) {
					assert.Nil(t, v.Query.String, "%s: %s: a plain string gives no options in some plugin releases", name, v.Name)
					sql, ok := VariableSQL(v.Query)
					assert.True(t, ok, "%s: %s: no rawSql", name, v.Name)
					assert.Equal(t, map[string]any{"refId": "var", "editorType": "sql", "queryType": "sql", "rawSql": sql}, v.Query.Map, "%s: %s", name, v.Name)
					assert.Equal(t, sql, deref(v.Definition), "%s: %s", name, v.Name)
				}
			}
		}
	}
}

var dataLinkURL = regexp.MustCompile(`^/d/([\w-]+)\?\$\{__url_time_range\}&(\$\{org:queryparam\}&)?var-(\w+)=\$\{__data\.fields\.(\w+):percentencode\}$`)

// TestLinks: every dashboard links to the others keeping the time range and the
// variables, and table cells link organization → agent → room with the range, the
// organization and the row's id.
func TestLinks(t *testing.T) {
	uids := map[string]bool{}
	all := All()
	for _, d := range all {
		uids[deref(d.Uid)] = true
	}
	links := 0
	for name, d := range all {
		require.Len(t, d.Links, 1, name)
		l := d.Links[0]
		assert.Equal(t, dashboard.DashboardLinkTypeDashboards, l.Type, name)
		assert.Equal(t, []string{"bandplane"}, l.Tags, name)
		assert.True(t, l.KeepTime && l.IncludeVars, "%s: the link must keep the time range and the variables", name)
		assert.Contains(t, d.Tags, "bandplane", name)
		for _, p := range panels(d) {
			if p.FieldConfig == nil {
				continue
			}
			for _, o := range p.FieldConfig.Overrides {
				for _, prop := range o.Properties {
					if prop.Id != "links" {
						continue
					}
					for _, link := range prop.Value.([]map[string]any) {
						links++
						url := link["url"].(string)
						m := dataLinkURL.FindStringSubmatch(url)
						if !assert.NotNil(t, m, "%s: %s: link %s", name, deref(p.Title), url) {
							continue
						}
						assert.True(t, uids[m[1]], "%s: link to unknown dashboard %s", name, m[1])
						target := all[fileOf(all, m[1])]
						assert.True(t, hasVariable(target, m[3]), "%s: link sets var-%s, which %s does not have", name, m[3], m[1])
						assert.True(t, strings.HasSuffix(m[4], "_id"), "%s: link passes %s, want an id column", name, m[4])
					}
				}
			}
		}
	}
	assert.GreaterOrEqual(t, links, 8)
}

func fileOf(all map[string]dashboard.Dashboard, uid string) string {
	for name, d := range all {
		if deref(d.Uid) == uid {
			return name
		}
	}
	return ""
}

func hasVariable(d dashboard.Dashboard, name string) bool {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return true
		}
	}
	return false
}

// TestGeneratedFilesUpToDate is `bandplane dashboards --check` as a test: the committed
// JSON (dashboards and alert rules) must be what the code generates.
func TestGeneratedFilesUpToDate(t *testing.T) {
	problems, err := Check(os.DirFS(generatedDir))
	require.NoError(t, err)
	for _, p := range problems {
		t.Errorf("%s/%s", generatedDir, p)
	}
	problems, err = CheckAlerts(os.DirFS(alertsDir))
	require.NoError(t, err)
	for _, p := range problems {
		t.Errorf("%s/%s", alertsDir, p)
	}
	if t.Failed() {
		t.Log("regenerate with: go run ./cmd/bandplane dashboards")
	}
}

func TestCheckReportsStaleFiles(t *testing.T) {
	files, err := Files()
	require.NoError(t, err)
	// Grafana's file provider reads every *.json below its path, subfolders too; other
	// files it ignores.
	dir := fstest.MapFS{
		"old.json":                  {Data: []byte("{}\n")},
		"README.md":                 {Data: []byte("not a dashboard")},
		"sub/sub.json":              {Data: []byte("{}\n")},
		"sub/notes.txt":             {Data: []byte("not a dashboard")},
		"a/b/" + CostFile:           {Data: files[CostFile]},
		"dir.json/inside/deep.json": {Data: []byte("{}\n")},
	}
	for name, b := range files {
		if name != IngestFile {
			dir[name] = &fstest.MapFile{Data: b}
		}
	}
	problems, err := Check(dir)
	require.NoError(t, err)
	stray := ": not generated by any dashboard (removed? delete the file)"
	want := []string{
		IngestFile + ": missing",
		"a/b/" + CostFile + stray,
		"dir.json/inside/deep.json" + stray,
		"old.json" + stray,
		"sub/sub.json" + stray,
	}
	if diff := cmp.Diff(want, problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}

	dir[IngestFile] = &fstest.MapFile{Data: append([]byte(nil), files[IngestFile]...)}
	dir[IngestFile].Data[len(dir[IngestFile].Data)-1] = ' ' // one byte changed
	for _, name := range []string{"old.json", "sub/sub.json", "a/b/" + CostFile, "dir.json/inside/deep.json"} {
		delete(dir, name)
	}
	problems, err = Check(dir)
	require.NoError(t, err)
	if diff := cmp.Diff([]string{IngestFile + ": differs from the generated dashboard"}, problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	dir[IngestFile].Data = files[IngestFile]
	problems, err = Check(dir)
	assert.NoError(t, err)
	assert.Empty(t, problems)
}

func TestCheckAlertsReportsStaleAndForeignFiles(t *testing.T) {
	b, err := AlertFile()
	require.NoError(t, err)
	problems, err := CheckAlerts(fstest.MapFS{"README.md": {Data: []byte("x")}})
	require.NoError(t, err)
	assert.Equal(t, []string{
		AlertsFile + ": missing",
		"README.md: not generated (Grafana's alerting provisioning reads every file of this folder; remove it)",
	}, problems)
	stale := append([]byte(nil), b...)
	stale[10] = 'X'
	problems, err = CheckAlerts(fstest.MapFS{AlertsFile: {Data: stale}})
	require.NoError(t, err)
	assert.Equal(t, []string{AlertsFile + ": differs from the generated alert rules"}, problems)
	problems, err = CheckAlerts(fstest.MapFS{AlertsFile: {Data: b}})
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestAlertFileIsGrafanaProvisioning reads the generated file back in the shape of
// Grafana's file provisioning (pkg/services/provisioning/alerting/rules_types.go).
func TestAlertFileIsGrafanaProvisioning(t *testing.T) {
	b, err := AlertFile()
	require.NoError(t, err)
	var f struct {
		APIVersion int `json:"apiVersion"`
		Groups     []struct {
			OrgID    int64  `json:"orgId"`
			Name     string `json:"name"`
			Folder   string `json:"folder"`
			Interval string `json:"interval"`
			Rules    []struct {
				UID, Title, Condition, NoDataState, ExecErrState, For string
				Labels, Annotations                                   map[string]string
				Data                                                  []struct {
					RefID             string `json:"refId"`
					DatasourceUID     string `json:"datasourceUid"`
					RelativeTimeRange struct{ From, To int64 }
					Model             map[string]any
				}
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, json.Unmarshal(b, &f))
	require.Equal(t, 1, f.APIVersion)
	require.Len(t, f.Groups, 1)
	g := f.Groups[0]
	assert.Equal(t, int64(1), g.OrgID)
	assert.Equal(t, "bandplane", g.Name)
	assert.Equal(t, "bandplane", g.Folder)
	assert.Equal(t, "1m", g.Interval)
	rules := Alerts()
	require.Len(t, g.Rules, len(rules))
	ds, err := os.ReadFile("../deploy/grafana/provisioning/datasources/clickhouse.yaml")
	require.NoError(t, err)
	assert.Contains(t, string(ds), "uid: "+DatasourceUID, "the rules name the provisioned data source by its uid")
	for i, r := range g.Rules {
		want := rules[i]
		assert.Equal(t, want.UID, r.UID)
		assert.Equal(t, want.Title, r.Title)
		assert.Equal(t, "B", r.Condition)
		assert.NotContains(t, r.Title, "$", "provisioning expands $VARIABLES in titles")
		require.Len(t, r.Data, 2, r.UID)
		a, th := r.Data[0], r.Data[1]
		assert.Equal(t, "A", a.RefID)
		assert.Equal(t, DatasourceUID, a.DatasourceUID)
		assert.Equal(t, int64(want.Range/time.Second), a.RelativeTimeRange.From, r.UID)
		assert.Equal(t, want.SQL, a.Model["rawSql"], r.UID)
		assert.Equal(t, float64(FormatTable), a.Model["format"], r.UID)
		assert.Equal(t, "__expr__", th.DatasourceUID)
		assert.Equal(t, "threshold", th.Model["type"])
		assert.Equal(t, "A", th.Model["expression"])
		cond := th.Model["conditions"].([]any)[0].(map[string]any)["evaluator"].(map[string]any)
		assert.Equal(t, "gt", cond["type"])
		assert.Equal(t, []any{want.Above}, cond["params"])
		assert.Contains(t, []string{"OK", "Alerting"}, r.NoDataState)
		assert.NotEmpty(t, r.Annotations["summary"])
		assert.Equal(t, want.Description, r.Annotations["description"], r.UID)
		for _, a := range r.Annotations {
			assert.NotContains(t, a, "${", "provisioning expands ${VARIABLES} in annotations")
		}
	}
}

// The seal status reads what ClickHouse holds and checks no signature: its description
// must say so and name what does, and the unsealed rule must say that serve's metric is
// the sealer's own view.
func TestSealStatusSaysWhatItCannotCheck(t *testing.T) {
	var desc string
	for _, p := range panels(All()[ComplianceFile]) {
		if deref(p.Title) == "Latest seal per organization" {
			desc = deref(p.Description)
		}
	}
	for _, says := range []string{"as ClickHouse holds it", "untrusted", "a forged checkpoint row shows here as the newest checkpoint",
		"cannot make events without a leaf look sealed", "`bandplane audit verify` is what checks the signatures and the proofs"} {
		assert.Contains(t, desc, says)
	}
	var rule *AlertRule
	for _, r := range Alerts() {
		if r.UID == "bandplane-audit-unsealed" {
			rule = &r
		}
	}
	require.NotNil(t, rule)
	assert.Contains(t, rule.Description, "bandplane_audit_unsealed_age_seconds of each serve is the sealer process's own view")
	assert.Equal(t, float64(600), rule.Above, "fires above 10 minutes")
	// Events within the grace are a healthy sealer's next run: they make no row (no
	// alert instance) at all.
	assert.Contains(t, rule.SQL, "WHERE ingested < now() - "+unsealedGrace)
	// Without the rule's range the query would read the whole trail.
	assert.Contains(t, rule.SQL, "ingested_at >= "+fromTime)
}

func TestMarshalIsStableReadableJSON(t *testing.T) {
	a, err := Files()
	require.NoError(t, err)
	b, err := Files()
	require.NoError(t, err)
	alerts, err := AlertFiles()
	require.NoError(t, err)
	for name, f := range alerts {
		a[name], b[name] = f, f
	}
	for name := range a {
		assert.Equal(t, string(a[name]), string(b[name]), "%s: two generations differ", name)
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
