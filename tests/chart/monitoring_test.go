package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// The metrics the operator exports are the ones docs/metrics.md lists in its tables, a list
// `go test ./cmd/agentd -run TestMetricsDoc` holds to what agentd registers (name, type and
// labels). The chart's alerts and dashboard are checked against that list, not one of
// their own.

// metricsDocRow is a row of docs/metrics.md's tables: a metric's name, then its type.
var metricsDocRow = regexp.MustCompile("^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\| (counter|gauge|histogram|summary) \\|")

// documentedMetrics reads the metrics docs/metrics.md lists, by name, with their types.
func documentedMetrics(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "docs", "metrics.md"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		if m := metricsDocRow.FindStringSubmatch(line); m != nil {
			out[m[1]] = m[2]
		}
	}
	require.GreaterOrEqual(t, len(out), 19, "docs/metrics.md's tables list the operator's metrics")
	require.Contains(t, out, "buildkite_operator_spawner_slots", "docs/metrics.md's tables list the operator's metrics")
	return out
}

// seriesOf maps a series name an expression may use to the metric it belongs to: each
// metric's own name, and a histogram's or summary's _bucket, _sum and _count.
func seriesOf(documented map[string]string) map[string]string {
	out := map[string]string{}
	for name, typ := range documented {
		out[name] = name
		switch typ {
		case "histogram":
			out[name+"_bucket"] = name
			fallthrough
		case "summary":
			out[name+"_sum"] = name
			out[name+"_count"] = name
		}
	}
	return out
}

// scrapeSeries are series Prometheus makes of every scrape itself, which an exporter never
// exports: the alert that the operator is down watches `up`.
var scrapeSeries = map[string]bool{"up": true}

// promqlKeywords are PromQL's words that are neither functions nor metrics.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
}

// labelListKeywords take a parenthesised list of label names, which are not metrics.
var labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// metricNames returns the metric names a PromQL expression (or a Grafana variable query
// such as label_values(metric{...}, label)) selects: every bare identifier that is not a
// function, a keyword or a label name. It strips strings, label matchers ({...}) and range
// or subquery brackets ([...]) first, so that label values and durations are never taken
// for names. It is not a PromQL parser: it knows what this chart's expressions use.
func metricNames(expr string) ([]string, error) {
	s := stripDelimited(stripStrings(expr))
	// label_values(expr, label): the label is a name, not a metric.
	s = regexp.MustCompile(`label_values\(([^()]*(?:\([^()]*\))*[^()]*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)`).ReplaceAllString(s, "($1)")
	var names []string
	rs := []rune(s)
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case unicode.IsDigit(r) || r == '.':
			// A number, or a duration (5m) outside brackets, as after offset.
			for i < len(rs) && (unicode.IsLetter(rs[i]) || unicode.IsDigit(rs[i]) || rs[i] == '.' || rs[i] == '_') {
				i++
			}
		case r == '$':
			// A Grafana variable.
			for i++; i < len(rs) && (unicode.IsLetter(rs[i]) || unicode.IsDigit(rs[i]) || rs[i] == '_'); i++ {
			}
		case unicode.IsLetter(r) || r == '_' || r == ':':
			j := i
			for j < len(rs) && (unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j]) || rs[j] == '_' || rs[j] == ':') {
				j++
			}
			word := string(rs[i:j])
			k := j
			for k < len(rs) && rs[k] == ' ' {
				k++
			}
			call := k < len(rs) && rs[k] == '('
			// An aggregation may put its grouping before its argument: sum by (le) (...).
			rest := string(rs[k:])
			grouped := strings.HasPrefix(rest, "by ") || strings.HasPrefix(rest, "by(") ||
				strings.HasPrefix(rest, "without ") || strings.HasPrefix(rest, "without(")
			switch {
			case labelListKeywords[word] && call:
				// Skip the label list.
				end := slices.Index(rs[k:], ')')
				if end < 0 {
					return nil, fmt.Errorf("no ) closes the label list of %s in %s", word, expr)
				}
				j = k + end + 1
			case promqlKeywords[word], call, grouped:
				// A keyword, or a function or aggregation being called.
			default:
				names = append(names, word)
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

// stripStrings blanks PromQL's string literals ("...", '...', `...`).
func stripStrings(s string) string {
	var b strings.Builder
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case quote == 0 && (r == '"' || r == '\'' || r == '`'):
			quote = r
			b.WriteRune(' ')
		case quote != 0:
			switch {
			case escaped:
				escaped = false
			case r == '\\' && quote != '`':
				escaped = true
			case r == quote:
				quote = 0
			}
			b.WriteRune(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// stripDelimited blanks what is between braces (label matchers) and brackets (ranges).
func stripDelimited(s string) string {
	var b strings.Builder
	depth := 0
	for _, r := range s {
		switch {
		case r == '{' || r == '[':
			depth++
			b.WriteRune(' ')
		case r == '}' || r == ']':
			depth--
			b.WriteRune(' ')
		case depth > 0:
			b.WriteRune(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The scanner finds the metrics of the expressions the chart writes, and only those: a
// misspelt or unknown name is found, label names, values, functions and durations are not.
func TestMetricNames(t *testing.T) {
	cases := []struct {
		expr string
		want []string
	}{
		{`absent(up{job="x-metrics",namespace="ci"} == 1)`, []string{"up"}},
		{`sum by (spawner) (buildkite_operator_spawner_slots{job="j",state="busy"}) / sum by (spawner) (buildkite_operator_spawner_slots{job="j"}) > 0.9`,
			[]string{"buildkite_operator_spawner_slots", "buildkite_operator_spawner_slots"}},
		{`histogram_quantile(0.95, sum by (le) (rate(buildkite_operator_buildjob_to_running_seconds_bucket{namespace="$namespace"}[$__rate_interval]))) > 300`,
			[]string{"buildkite_operator_buildjob_to_running_seconds_bucket"}},
		{`sum(rate(a_total{code=~"5.."}[10m])) * 60 or vector(0)`, []string{"a_total"}},
		{`max(x) < 1 or absent(y{name="lease"})`, []string{"x", "y"}},
		{`sum by (le) (rate(b_bucket[5m])) / count without(pod) (c)`, []string{"b_bucket", "c"}},
		{`sum without (pod) (rate(z[5m] offset 1h))`, []string{"z"}},
		{`a / on (pod) group_left (node) b`, []string{"a", "b"}},
		{`label_values(controller_runtime_reconcile_total{controller="buildjob",namespace="$namespace"}, job)`, []string{"controller_runtime_reconcile_total"}},
		{`sum(rate(buildkite_operatr_jobs_finished_total[1h]))`, []string{"buildkite_operatr_jobs_finished_total"}},
		{`max by (pod, name) (leader_election_master_status{job="a,b"})`, []string{"leader_election_master_status"}},
	}
	for _, tc := range cases {
		got, err := metricNames(tc.expr)
		require.NoError(t, err, tc.expr)
		assert.Equal(t, tc.want, got, tc.expr)
	}
}

// unknownMetrics lists what names of expr are neither a documented metric's series nor
// one Prometheus makes of a scrape; used collects the metrics it names.
func unknownMetrics(t *testing.T, expr string, series map[string]string, used map[string]bool) []string {
	t.Helper()
	names, err := metricNames(expr)
	require.NoError(t, err)
	require.NotEmpty(t, names, "%s names no metric", expr)
	var unknown []string
	for _, n := range names {
		switch m, ok := series[n]; {
		case ok:
			used[m] = true
		case scrapeSeries[n]:
		default:
			unknown = append(unknown, n)
		}
	}
	return unknown
}

// alertDocRow is a row of docs/metrics.md's alert table: the alert's name as the chart's
// PrometheusRule names it, its description, its expression and its for.
var alertDocRow = regexp.MustCompile("^\\| (BuildkiteOperator[A-Za-z]+) \\| [^|]+ \\| `(.+)` \\| ([0-9]+[smh]) \\|")

// documentedAlerts reads docs/metrics.md's alert table: name -> for.
func documentedAlerts(t *testing.T) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "docs", "metrics.md"))
	require.NoError(t, err)
	out := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		if m := alertDocRow.FindStringSubmatch(line); m != nil {
			out[m[1]] = m[3]
		}
	}
	require.GreaterOrEqual(t, len(out), 10, "docs/metrics.md's alert table")
	return out
}

// prometheusRule is the part of a monitoring.coreos.com/v1 PrometheusRule the tests read.
type prometheusRule struct {
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// dashboardOf decodes the dashboard of the chart's dashboard ConfigMap.
func dashboardOf(t *testing.T, cm corev1.ConfigMap) map[string]any {
	t.Helper()
	require.Len(t, cm.Data, 1, "one dashboard")
	var d map[string]any
	for _, v := range cm.Data {
		require.NoError(t, json.Unmarshal([]byte(v), &d))
	}
	return d
}

// dashboardQueries returns each PromQL query of a dashboard, "<panel>: <expr>", from its
// panels (rows' too) and its variables.
func dashboardQueries(d map[string]any) []string {
	var out []string
	var walk func(panels []any)
	walk = func(panels []any) {
		for _, p := range panels {
			panel, _ := p.(map[string]any)
			for _, tg := range asList(panel["targets"]) {
				if e, ok := tg.(map[string]any)["expr"].(string); ok {
					out = append(out, panel["title"].(string)+": "+e)
				}
			}
			walk(asList(panel["panels"]))
		}
	}
	walk(asList(d["panels"]))
	if tmpl, ok := d["templating"].(map[string]any); ok {
		for _, v := range asList(tmpl["list"]) {
			variable := v.(map[string]any)
			if variable["type"] == "query" {
				out = append(out, "variable "+variable["name"].(string)+": "+variable["query"].(string))
			}
		}
	}
	return out
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// Neither the alerts nor the dashboard is rendered unless asked for: both need something
// (the Prometheus Operator's CRDs, Grafana's sidecar) that a cluster may not have.
func TestMonitoringOffByDefault(t *testing.T) {
	out := render(t)
	assert.Empty(t, byKind[prometheusRule](t, out, "PrometheusRule"), "no PrometheusRule by default")
	for _, cm := range byKind[corev1.ConfigMap](t, out, "ConfigMap") {
		assert.NotContains(t, cm.Name, "dashboard", "no dashboard by default")
		assert.NotContains(t, cm.Labels, "grafana_dashboard", "no dashboard by default")
	}
	for _, enable := range []string{"metrics.prometheusRule.enabled=true", "metrics.grafanaDashboard.enabled=true"} {
		_, err := helmchart.Render("buildkite", "--set", enable, "--set", "metrics.enabled=false")
		require.Error(t, err, "%s without metrics", enable)
		assert.Contains(t, err.Error(), "needs metrics.enabled", enable)
	}
}

// The PrometheusRule holds exactly the alerts of docs/metrics.md's table, with the same
// for; every expression names only metrics the operator exports (or up, the scrape's
// own) and is narrowed to this release's series.
func TestPrometheusRule(t *testing.T) {
	series := seriesOf(documentedMetrics(t))
	wantAlerts := documentedAlerts(t)
	out := render(t, "--set", "metrics.prometheusRule.enabled=true")
	rules := byKind[prometheusRule](t, out, "PrometheusRule")
	require.Len(t, rules, 1)
	pr := rules[0]
	assert.Equal(t, "buildkite", pr.Metadata.Namespace)
	require.Len(t, pr.Spec.Groups, 1)

	got := map[string]string{}
	used := map[string]bool{}
	const selector = `job="buildkite-operator-metrics",namespace="buildkite"`
	for _, r := range pr.Spec.Groups[0].Rules {
		assert.NotContains(t, got, r.Alert, "alert %s twice", r.Alert)
		got[r.Alert] = r.For
		if r.For == "" {
			got[r.Alert] = "0m"
		}
		assert.Empty(t, unknownMetrics(t, r.Expr, series, used), "alert %s names metrics the operator does not export: %s", r.Alert, r.Expr)
		assertScoped(t, r.Expr, selector)
		assert.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], r.Alert)
		assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
		assert.NotEmpty(t, r.Annotations["description"], r.Alert)
	}
	assert.Equal(t, wantAlerts, got, "the PrometheusRule's alerts (and their for) are docs/metrics.md's")
	assert.Contains(t, used, "buildkite_operator_spawner_slots")

	// A selector of the user's replaces the chart's in every rule; alertLabels reach every
	// alert; labels the rule itself.
	out = render(t, "--set", "metrics.prometheusRule.enabled=true",
		"--set", `metrics.prometheusRule.selector=job="ci-operator"`,
		"--set", "metrics.prometheusRule.alertLabels.team=ci",
		"--set", "metrics.prometheusRule.labels.release=kube-prometheus-stack")
	rules = byKind[prometheusRule](t, out, "PrometheusRule")
	require.Len(t, rules, 1)
	assert.Equal(t, "kube-prometheus-stack", rules[0].Metadata.Labels["release"])
	for _, r := range rules[0].Spec.Groups[0].Rules {
		assert.NotContains(t, r.Expr, selector, r.Alert)
		assert.Contains(t, r.Expr, `{job="ci-operator"`, r.Alert)
		assert.Equal(t, "ci", r.Labels["team"], r.Alert)
	}
}

// The dashboard's every query (panels and variables) names only metrics the operator
// exports, and together they show every metric docs/metrics.md lists. Each release's copy
// is a dashboard of its own.
func TestGrafanaDashboard(t *testing.T) {
	documented := documentedMetrics(t)
	series := seriesOf(documented)
	dashboards := func(namespace string) []corev1.ConfigMap {
		out, err := helmchart.Render(namespace, "--set", "metrics.grafanaDashboard.enabled=true")
		require.NoError(t, err)
		var cms []corev1.ConfigMap
		for _, cm := range byKind[corev1.ConfigMap](t, out, "ConfigMap") {
			if cm.Labels["grafana_dashboard"] == "1" {
				cms = append(cms, cm)
			}
		}
		return cms
	}
	cms := dashboards("buildkite")
	require.Len(t, cms, 1)
	d := dashboardOf(t, cms[0])
	queries := dashboardQueries(d)
	require.NotEmpty(t, queries)
	used := map[string]bool{}
	for _, q := range queries {
		where, expr, _ := strings.Cut(q, ": ")
		assert.Empty(t, unknownMetrics(t, expr, series, used), "%s names metrics the operator does not export", q)
		if !strings.HasPrefix(where, "variable ") {
			assertScoped(t, expr, `namespace="$namespace",job="$job"`)
		}
	}
	var missing []string
	for name := range documented {
		if !used[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	assert.Empty(t, missing, "metrics docs/metrics.md lists that no panel of the dashboard shows")

	uid, _ := d["uid"].(string)
	assert.True(t, strings.HasPrefix(uid, "bko-") && len(uid) <= 40, "a uid of the release's, as long as Grafana takes: %q", uid)
	other := dashboardOf(t, dashboards("ci")[0])
	assert.NotEqual(t, uid, other["uid"], "releases in two namespaces make two dashboards")
	assert.NotEqual(t, d["title"], other["title"])
	var current []string
	for _, v := range asList(d["templating"].(map[string]any)["list"]) {
		variable := v.(map[string]any)
		if c, ok := variable["current"].(map[string]any); ok && c["value"] != nil {
			current = append(current, variable["name"].(string)+"="+c["value"].(string))
		}
	}
	assert.Equal(t, []string{"namespace=buildkite", "job=buildkite-operator-metrics"}, current, "the variables start on the release's series")
}

// assertScoped checks that every metric of expr is selected with labels that begin with
// selector: one release's series, never another's.
func assertScoped(t *testing.T, expr, selector string) {
	t.Helper()
	selectors := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\{([^}]*)\}`).FindAllStringSubmatch(expr, -1)
	names, err := metricNames(expr)
	require.NoError(t, err)
	assert.Len(t, selectors, len(names), "a metric without a selector would take every release's series: %s", expr)
	for _, s := range selectors {
		assert.True(t, strings.HasPrefix(s[1], selector), "%s selects more than this release's series (want %s first): %s", s[0], selector, expr)
	}
}
