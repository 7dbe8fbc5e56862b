package dashboards

// This file expands a query's SQL the way Grafana and the ClickHouse data source plugin
// (grafana-clickhouse-datasource v4) do before ClickHouse sees it. Only the tests use it
// (they run every panel, variable and alert rule on real ClickHouse servers), but it
// lives in the package so that the rules the dashboards' SQL must follow are written
// down next to that SQL, once.
//
// Plugin releases: this is the plugin from 4.0.3 to 4.18.x (4.2.0 added the
// $__dateTimeFilter / $__dt modelled below, which the dashboards do not use), and the
// deployment pins PluginVersion, 4.3.2, a release of that range whose CHANGELOG was
// checked against this file. Around the range the backend differs:
//   - 4.0.0 to 4.0.2 expand $__timeFilter, $__fromTime and $__toTime to
//     toDateTime64(ms / 1000, 3), which ClickHouse 18.16 does not have (Code 46,
//     UNKNOWN_FUNCTION); 4.0.3 went back to toDateTime(seconds) (CHANGELOG 4.0.3,
//     grafana/clickhouse-datasource#699) and added the *_ms macros. So 4.0.3 is the
//     oldest release the dashboards run on.
//   - 4.19.0 replaced the backend's engine, the SDK's sqlutil.Interpolate modelled in
//     step 3, with grafana/macropro (#1802: nested macros stopped expanding until 4.20,
//     comments and quoted text are skipped), and moved variables onto its own
//     CustomVariableSupport. The dashboards' SQL avoids what differs (no backend macro
//     nested in another, none in a comment or a literal), but this file models the
//     earlier engine, and the releases after 4.18 are not tested.
//
// A panel query goes through three steps, in this order:
//
//  1. The plugin's frontend, Datasource.applyTemplateVariables
//     (grafana/clickhouse-datasource, src/data/CHDatasource.ts): applyConditionalAll
//     replaces each $__conditionalAll(condition, $var) with 1=1 when the variable's
//     value is "" or $__all, and with the condition otherwise (scanning the arguments
//     with getMacroArgs, which counts parentheses and commas even inside string
//     literals, and putting the phrase back with String.prototype.replace, whose
//     replacement string gives $$, $&, $` and $' their special meanings).
//  2. Grafana's template service, getTemplateSrv().replace(sql, scopedVars, format),
//     with the plugin's format function (arrays become 'a','b' unescaped, a single
//     value goes in as it is) for references without an explicit format. References are
//     found with Grafana's variableRegex (public/app/features/variables/utils.ts):
//     $var, [[var]] / [[var:fmt]], ${var} / ${var.path} / ${var:fmt}; an unknown name
//     is left as it is. Formats are those of the format registry
//     (grafana/scenes packages/scenes/src/variables/interpolation/formatRegistry.ts,
//     and the legacy public/app/features/templating/formatRegistry.ts).
//  3. The plugin's backend, sqlutil.Interpolate (grafana/grafana-plugin-sdk-go,
//     data/sqlutil/macros.go) with the plugin's macros (grafana/clickhouse-datasource,
//     pkg/macros/macros.go) and the SDK's defaults: $__timeFilter(col), $__fromTime,
//     $__toTime, $__interval_s, … Each macro name is found with `\$__name\b`; its
//     arguments are whatever lies between the next "(" and its matching ")", even for a
//     macro that takes none: `$__toTime AND f(x)` swallows " AND f(x)". Arguments are
//     split at every comma and trimmed. Every occurrence of the matched text is
//     replaced. The macros are applied in Go map order (random), so a query whose result
//     depends on that order is an error here.
//
// Alert rules only take step 3: Grafana's alerting sends the stored model to the
// plugin's backend, with no template variables and no frontend.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// PluginVersion is the release of grafana-clickhouse-datasource the deployment installs
// (deploy/grafana/README.md) and this file models.
const PluginVersion = "4.3.2"

// VariableSQL is the SQL a query variable runs, read from its stored query the way the
// plugin does: an object's rawSql, when its editorType is "sql" or missing
// (Datasource.metricFindQuery, and CHVariableSupport.query from 4.19). A plain string
// gives nothing here: it is the SQL for metricFindQuery, but the CHVariableSupport.query
// of some releases reads target.rawSql only and gives a string no options at all, so
// only the object form works with every release (vars.go, variableQuery).
func VariableSQL(q *dashboard.StringOrMap) (string, bool) {
	if q == nil || q.Map == nil {
		return "", false
	}
	if e, ok := q.Map["editorType"]; ok && e != "sql" {
		return "", false
	}
	s, ok := q.Map["rawSql"].(string)
	return s, ok && s != ""
}

// AllValue is the value Grafana gives a variable whose "All" option is selected.
const AllValue = "$__all"

// AllText is the text of the "All" option.
const AllText = "All"

// Variable is the state of one dashboard variable when a query is expanded.
type Variable struct {
	Name string
	// Values are the selected values: one, or several when Multi.
	Values []string
	// Texts are the selected options' texts (for the text format); Values when nil.
	Texts []string
	// Multi says the value is an array: a multi-value variable, or a URL that gave a
	// single-value variable several values (Grafana keeps them as an array).
	Multi bool
	// All is the "All" option. Without AllValueCustom, Grafana then stands for every
	// option's value (Options), as an array.
	All            bool
	Options        []string
	AllValueCustom string
}

// QueryParamStyle is how the queryparam format renders a value; Grafana releases
// differ.
type QueryParamStyle int

const (
	// QueryParamURLSync is scenes-powered dashboards (Grafana 11 and later): the
	// variable's URL state through urlUtil.toUrlParams, whose encodeURIComponentAsAngularJS
	// leaves @ : $ , ; unescaped and writes a space as %20 (and, in recent releases,
	// escapes ! ' ( ) *). "All" is var-name=$__all.
	QueryParamURLSync QueryParamStyle = iota
	// QueryParamURLSyncOld is the same in the releases whose toUrlParams did not escape
	// ! ' ( ) * yet: a ' comes through as it is.
	QueryParamURLSyncOld
	// QueryParamLegacy is the pre-scenes template service: var-name=<encodeURIComponentStrict>,
	// "All" is var-name=All.
	QueryParamLegacy
)

// Request is what a query is expanded with: the dashboard's time range, the panel's
// interval and the variables.
type Request struct {
	From, To   time.Time
	Interval   time.Duration
	Vars       []Variable
	QueryParam QueryParamStyle
}

func (r Request) variable(name string) (*Variable, bool) {
	for i := range r.Vars {
		if r.Vars[i].Name == name {
			return &r.Vars[i], true
		}
	}
	return nil, false
}

// Expand is the SQL ClickHouse receives for a panel's or a variable's rawSql.
func (r Request) Expand(sql string) (string, error) {
	front, err := r.Frontend(sql)
	if err != nil {
		return "", err
	}
	return r.Backend(front)
}

// Frontend is steps 1 and 2: $__conditionalAll, then the template variables.
func (r Request) Frontend(sql string) (string, error) {
	sql = r.conditionalAll(sql)
	return r.interpolate(sql)
}

// ---- step 1: $__conditionalAll (CHDatasource.applyConditionalAll) ----

const conditionalAllMacro = "$__conditionalAll("

func (r Request) conditionalAll(raw string) string {
	i := strings.LastIndex(raw, conditionalAllMacro)
	for i != -1 {
		params := macroArgs(raw, i+len(conditionalAllMacro)-1)
		if len(params) != 2 {
			return raw // the plugin gives up and sends the rest as it is
		}
		phrase := params[0]
		if name, ok := conditionalVarName(strings.TrimSpace(params[1])); ok {
			if v, ok := r.variable(name); ok {
				if s := v.currentValueString(); s == "" || s == AllValue {
					phrase = "1=1"
				}
			}
		}
		raw = jsReplaceFirst(raw, conditionalAllMacro+params[0]+","+params[1]+")", phrase)
		i = strings.LastIndex(raw, conditionalAllMacro)
	}
	return raw
}

// currentValueString is `variable.current.value.toString()`: an array joins with ",",
// "All" is $__all.
func (v *Variable) currentValueString() string {
	if v.All {
		return AllValue
	}
	return strings.Join(v.Values, ",")
}

// macroArgs is CHDatasource.getMacroArgs: from the "(" at argsIndex, the arguments up to
// the matching ")", split at commas at depth one; nil when the parentheses do not close.
// It counts parentheses inside string literals too. (Indexes are bytes here and UTF-16
// units there; the delimiters are ASCII, so the cuts are the same.)
func macroArgs(query string, argsIndex int) []string {
	s := query[argsIndex:]
	var args []string
	depth, last := 0, 1
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 1 {
				args = append(args, s[last:i])
				last = i + 1
			}
		default:
			continue
		}
		if depth == 0 {
			return append(args, s[last:i])
		}
	}
	return nil
}

// conditionalVarName applies /(?<=\$\{)[\w\d]+(?=\})|(?<=\$)[\w\d]+/ (the current
// plugin; older releases took the parameter without its first character, which is the
// same for the $var form the dashboards use) and returns the first match.
func conditionalVarName(p string) (string, bool) {
	for i := 0; i < len(p); i++ {
		// ${name}
		if i >= 2 && p[i-2] == '$' && p[i-1] == '{' {
			j := i
			for j < len(p) && isWord(p[j]) {
				j++
			}
			if j > i && j < len(p) && p[j] == '}' {
				return p[i:j], true
			}
		}
		// $name
		if i >= 1 && p[i-1] == '$' && isWord(p[i]) {
			j := i
			for j < len(p) && isWord(p[j]) {
				j++
			}
			return p[i:j], true
		}
	}
	return "", false
}

func isWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// jsReplaceFirst is String.prototype.replace(pattern, replacement) with a string
// pattern: the first occurrence only, and the replacement's $$, $&, $` and $' patterns
// (GetSubstitution; a string pattern has no captures, so $1 and $<x> stay as they are).
func jsReplaceFirst(s, pattern, replacement string) string {
	i := strings.Index(s, pattern)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for j := 0; j < len(replacement); j++ {
		c := replacement[j]
		if c != '$' || j+1 == len(replacement) {
			b.WriteByte(c)
			continue
		}
		switch replacement[j+1] {
		case '$':
			b.WriteByte('$')
		case '&':
			b.WriteString(pattern)
		case '`':
			b.WriteString(s[:i])
		case '\'':
			b.WriteString(s[i+len(pattern):])
		default:
			b.WriteByte(c)
			continue
		}
		j++
	}
	b.WriteString(s[i+len(pattern):])
	return b.String()
}

// ---- step 2: template variables (templateSrv.replace) ----

// variableRegex is Grafana's: $var | [[var]] / [[var:fmt]] | ${var} / ${var.path} / ${var:fmt}.
var variableRegex = regexp.MustCompile(`\$(\w+)|\[\[([\s\S]+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}`)

func (r Request) interpolate(sql string) (string, error) {
	var errs []error
	out := variableRegex.ReplaceAllStringFunc(sql, func(match string) string {
		m := variableRegex.FindStringSubmatch(match)
		name := m[1] + m[2] + m[4] // exactly one is set
		format := m[3] + m[6]
		if m[5] != "" {
			errs = append(errs, fmt.Errorf("%s: field paths are not supported here", match))
			return match
		}
		v, ok := r.variable(name)
		if !ok {
			return match // Grafana leaves unknown names alone
		}
		s, err := r.format(v, format)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", match, err))
			return match
		}
		return s
	})
	return out, errors.Join(errs...)
}

// jsValue is what a format function receives: one string, or an array.
type jsValue struct {
	one   string
	many  []string
	array bool
}

func (x jsValue) strings() []string {
	if x.array {
		return x.many
	}
	return []string{x.one}
}

// jsString is String(value): an array joins with ",".
func (x jsValue) jsString() string { return strings.Join(x.strings(), ",") }

// format renders v's current value in the named format ("" is the plugin's own
// function), as templateSrv.replace does: a custom all value is put in unformatted
// (except for text and percentencode); otherwise "All" stands for every option's value.
func (r Request) format(v *Variable, format string) (string, error) {
	if i := strings.IndexByte(format, ':'); i >= 0 {
		format = format[:i] // arguments are only used by formats the dashboards avoid
	}
	cur := jsValue{array: v.Multi}
	if v.Multi {
		cur.many = v.Values
	} else if len(v.Values) > 0 {
		cur.one = v.Values[0]
	}
	if format == "queryparam" {
		return r.queryParam(v, cur), nil
	}
	if v.All {
		if v.AllValueCustom != "" && format != "text" && format != "percentencode" {
			return v.AllValueCustom, nil
		}
		cur = jsValue{many: v.Options, array: true}
		if v.AllValueCustom != "" {
			cur = jsValue{one: v.AllValueCustom}
		}
	}
	switch format {
	case "": // the plugin's format function
		if cur.array {
			return "'" + strings.Join(cur.many, "','") + "'", nil
		}
		return cur.one, nil
	case "raw", "csv":
		return cur.jsString(), nil
	case "text":
		if v.All {
			return AllText, nil
		}
		if v.Texts != nil {
			return strings.Join(v.Texts, " + "), nil
		}
		return strings.Join(v.Values, " + "), nil
	case "singlequote":
		return quoteEach(cur, "'", `\'`), nil
	case "doublequote":
		return quoteEachDouble(cur), nil
	case "sqlstring":
		q := make([]string, 0, len(cur.strings()))
		for _, s := range cur.strings() {
			s = strings.NewReplacer(`'`, `''`, `"`, `\"`).Replace(s)
			q = append(q, "'"+s+"'")
		}
		return strings.Join(q, ","), nil
	case "percentencode":
		if cur.array {
			return encodeURIComponentStrict("{" + strings.Join(cur.many, ",") + "}")
		}
		return encodeURIComponentStrict(cur.one)
	case "json":
		if !cur.array {
			return cur.one, nil
		}
		b, err := json.Marshal(cur.many)
		return string(b), err
	case "pipe":
		return strings.Join(cur.strings(), "|"), nil
	}
	return "", fmt.Errorf("format %q is not modelled (the dashboards do not use it)", format)
}

func quoteEach(cur jsValue, q, escaped string) string {
	out := make([]string, 0, len(cur.strings()))
	for _, s := range cur.strings() {
		out = append(out, q+strings.ReplaceAll(s, q, escaped)+q)
	}
	return strings.Join(out, ",")
}

func quoteEachDouble(cur jsValue) string { return quoteEach(cur, `"`, `\"`) }

// queryParam is the queryparam format in the chosen Grafana style.
func (r Request) queryParam(v *Variable, cur jsValue) string {
	vals := cur.strings()
	switch r.QueryParam {
	case QueryParamLegacy:
		if v.All {
			vals = []string{AllText}
		}
		out := make([]string, 0, len(vals))
		for _, s := range vals {
			e, err := encodeURIComponentStrict(s)
			if err != nil {
				e = s
			}
			out = append(out, "var-"+v.Name+"="+e)
		}
		return strings.Join(out, "&")
	default:
		if v.All {
			vals = []string{AllValue}
		}
		out := make([]string, 0, len(vals))
		for _, s := range vals {
			out = append(out, angularEncode("var-"+v.Name, r.QueryParam)+"="+angularEncode(s, r.QueryParam))
		}
		return strings.Join(out, "&")
	}
}

// encodeURIComponent's unreserved set: A–Z a–z 0–9 - _ . ! ~ * ' ( ).
func uriComponentUnreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("-_.!~*'()", c) >= 0
}

// encodeURIComponent percent-encodes every UTF-8 byte outside its unreserved set, in
// upper-case hex. JavaScript strings cannot hold invalid UTF-8 (a lone surrogate makes
// it throw URIError), so neither may s.
func encodeURIComponent(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", fmt.Errorf("%q is not valid UTF-8 (encodeURIComponent throws URIError)", s)
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if uriComponentUnreserved(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String(), nil
}

// encodeURIComponentStrict is Grafana's: encodeURIComponent, then ! ' ( ) * escaped
// too, which leaves only A–Z a–z 0–9 - _ . ~ unescaped.
func encodeURIComponentStrict(s string) (string, error) {
	e, err := encodeURIComponent(s)
	if err != nil {
		return "", err
	}
	return strings.NewReplacer("!", "%21", "'", "%27", "(", "%28", ")", "%29", "*", "%2A").Replace(e), nil
}

// angularEncode is urlUtil's encodeURIComponentAsAngularJS(v, pctEncodeSpaces=true).
func angularEncode(s string, style QueryParamStyle) string {
	e, err := encodeURIComponent(s)
	if err != nil {
		return s
	}
	e = strings.NewReplacer("%40", "@", "%3A", ":", "%24", "$", "%2C", ",", "%3B", ";").Replace(e)
	if style == QueryParamURLSync {
		e = strings.NewReplacer("!", "%21", "'", "%27", "(", "%28", ")", "%29", "*", "%2A").Replace(e)
	}
	return e
}

// ---- step 3: the plugin's backend macros (sqlutil.Interpolate) ----

type macroFunc func(r Request, args []string) (string, error)

func dateTime(t time.Time) string { return fmt.Sprintf("toDateTime(%d)", t.Unix()) }

func oneArg(name string, f func(string) string) macroFunc {
	return func(_ Request, args []string) (string, error) {
		if len(args) != 1 {
			return "", fmt.Errorf("$__%s: unexpected number of arguments: expected 1 argument, received %d", name, len(args))
		}
		return f(args[0]), nil
	}
}

// backendMacros are pkg/macros.Macros of the plugin plus the SDK's DefaultMacros it does
// not override.
func backendMacros() map[string]macroFunc {
	return map[string]macroFunc{
		"fromTime": func(r Request, _ []string) (string, error) { return dateTime(r.From), nil },
		"toTime":   func(r Request, _ []string) (string, error) { return dateTime(r.To), nil },
		"fromTime_ms": func(r Request, _ []string) (string, error) {
			return fmt.Sprintf("fromUnixTimestamp64Milli(%d)", r.From.UnixMilli()), nil
		},
		"toTime_ms": func(r Request, _ []string) (string, error) {
			return fmt.Sprintf("fromUnixTimestamp64Milli(%d)", r.To.UnixMilli()), nil
		},
		"timeFilter": func(r Request, args []string) (string, error) {
			return oneArg("timeFilter", func(c string) string {
				return fmt.Sprintf("%s >= %s AND %s <= %s", c, dateTime(r.From), c, dateTime(r.To))
			})(r, args)
		},
		"timeFilter_ms": func(r Request, args []string) (string, error) {
			return oneArg("timeFilter_ms", func(c string) string {
				return fmt.Sprintf("%s >= fromUnixTimestamp64Milli(%d) AND %s <= fromUnixTimestamp64Milli(%d)", c, r.From.UnixMilli(), c, r.To.UnixMilli())
			})(r, args)
		},
		"dateFilter": func(r Request, args []string) (string, error) {
			return oneArg("dateFilter", func(c string) string {
				return fmt.Sprintf("%s >= toDate('%s') AND %s <= toDate('%s')", c, r.From.Format("2006-01-02"), c, r.To.Format("2006-01-02"))
			})(r, args)
		},
		"dateTimeFilter": dateTimeFilter,
		"dt":             dateTimeFilter,
		"timeInterval": func(r Request, args []string) (string, error) {
			return oneArg("timeInterval", func(c string) string {
				return fmt.Sprintf("toStartOfInterval(toDateTime(%s), INTERVAL %d second)", c, intervalSeconds(r))
			})(r, args)
		},
		"timeInterval_ms": func(r Request, args []string) (string, error) {
			return oneArg("timeInterval_ms", func(c string) string {
				ms := int(math.Max(float64(r.Interval.Milliseconds()), 1))
				return fmt.Sprintf("toStartOfInterval(toDateTime64(%s, 3), INTERVAL %d millisecond)", c, ms)
			})(r, args)
		},
		"interval_s": func(r Request, _ []string) (string, error) { return fmt.Sprintf("%d", intervalSeconds(r)), nil },
		// The SDK's defaults (data/sqlutil/macros.go): RFC 3339 strings, and a table and a
		// column that a raw SQL query does not have.
		"timeFrom": func(r Request, args []string) (string, error) {
			return oneArg("timeFrom", func(c string) string { return fmt.Sprintf("%s >= '%s'", c, r.From.UTC().Format(time.RFC3339)) })(r, args)
		},
		"timeTo": func(r Request, args []string) (string, error) {
			return oneArg("timeTo", func(c string) string { return fmt.Sprintf("%s <= '%s'", c, r.To.UTC().Format(time.RFC3339)) })(r, args)
		},
		"timeGroup": func(Request, []string) (string, error) {
			return "", errors.New("$__timeGroup: the SDK's default writes SQL Server's datepart, not ClickHouse")
		},
		"table":  func(Request, []string) (string, error) { return "", nil },
		"column": func(Request, []string) (string, error) { return "", nil },
	}
}

func dateTimeFilter(r Request, args []string) (string, error) {
	if len(args) != 2 {
		return "", fmt.Errorf("$__dateTimeFilter: unexpected number of arguments: expected 2 arguments, received %d", len(args))
	}
	return fmt.Sprintf("(%s >= toDate('%s') AND %s <= toDate('%s')) AND (%s >= %s AND %s <= %s)",
		args[0], r.From.Format("2006-01-02"), args[0], r.To.Format("2006-01-02"),
		args[1], dateTime(r.From), args[1], dateTime(r.To)), nil
}

func intervalSeconds(r Request) int { return int(math.Max(r.Interval.Seconds(), 1)) }

// Backend is step 3. The plugin applies its macros in map order; Backend applies them
// in name order and in reverse name order and reports an error if the two differ (the
// query's meaning would depend on the run).
func (r Request) Backend(sql string) (string, error) {
	macros := backendMacros()
	names := make([]string, 0, len(macros))
	for n := range macros {
		names = append(names, n)
	}
	sort.Strings(names)
	a, err := r.applyMacros(sql, macros, names)
	if err != nil {
		return "", err
	}
	rev := append([]string(nil), names...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b, err := r.applyMacros(sql, macros, rev)
	if err != nil {
		return "", err
	}
	if a != b {
		return "", fmt.Errorf("the expansion depends on the order the plugin applies its macros in (a macro without arguments followed by \"(\"?):\n%s\n---\n%s", a, b)
	}
	return a, nil
}

func (r Request) applyMacros(sql string, macros map[string]macroFunc, order []string) (string, error) {
	for _, name := range order {
		for _, m := range macroMatches(sql, name) {
			args := strings.Split(m.args, ",")
			for i := range args {
				args[i] = strings.TrimSpace(args[i])
			}
			res, err := macros[name](r, args)
			if err != nil {
				return "", err
			}
			sql = strings.ReplaceAll(sql, m.text, res)
		}
	}
	return sql, nil
}

type macroMatch struct{ text, args string }

// macroMatches is sqlutil's getMacroMatches: each `\$__name\b`, with the arguments
// between the first "(" after it and its matching ")" — unless a ")" comes first, or
// there is no parenthesis at all: then the macro has no arguments (one empty one).
func macroMatches(input, name string) []macroMatch {
	re := regexp.MustCompile(`\$__` + regexp.QuoteMeta(name) + `\b`)
	var out []macroMatch
	for _, loc := range re.FindAllStringIndex(input, -1) {
		rest := input[loc[0]:]
		end, argStart, depth := 0, 0, 0
		for i := 0; i < len(rest); i++ {
			if depth == 0 && end > 0 {
				break
			}
			if rest[i] == '(' {
				depth++
				if argStart == 0 {
					argStart = i + 1
				}
			} else if rest[i] == ')' {
				if depth == 0 {
					end = 0
					break
				}
				depth--
				end = i + 1
			}
		}
		if end == 0 {
			end = loc[1] - loc[0]
		}
		m := macroMatch{text: rest[:end]}
		if argStart > 0 && argStart <= end-1 {
			m.args = rest[argStart : end-1]
		}
		out = append(out, m)
	}
	return out
}
