package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

const metricsDoc = "../../docs/metrics.md"

// madeMetric is a metric the project's sources make with client_golang.
type madeMetric struct {
	name   string
	typ    string // counter, gauge, histogram or summary
	labels []string
	where  string // file:line
}

// metricConstructors are the client_golang functions this test reads, by the type of the
// metric they make. Any other prometheus.New* or promauto.New* call fails the test, so a
// metric made another way is not silently left out of the docs.
var metricConstructors = map[string]string{
	"NewCounter": "counter", "NewCounterVec": "counter", "NewCounterFunc": "counter",
	"NewGauge": "gauge", "NewGaugeVec": "gauge", "NewGaugeFunc": "gauge",
	"NewHistogram": "histogram", "NewHistogramVec": "histogram",
	"NewSummary": "summary", "NewSummaryVec": "summary",
}

// notMetricConstructors are prometheus.New* functions that make no metric of their own.
var notMetricConstructors = map[string]bool{"NewRegistry": true, "NewPedanticRegistry": true}

const (
	prometheusPkg = "github.com/prometheus/client_golang/prometheus"
	promautoPkg   = "github.com/prometheus/client_golang/prometheus/promauto"
)

// madeMetrics reads the metrics made in the module's Go sources under root, tests and the
// test harness (tests/) aside: the name from the Opts literal (Namespace, Subsystem, Name,
// joined as client_golang joins them), the type from the constructor, the labels from a
// Vec's label list. A constructor it cannot read is a problem, not a skip.
func madeMetrics(root string) ([]madeMetric, []string, error) {
	var made []madeMetric
	var problems []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".cache", "bin", "testdata", "tests":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		names := map[string]bool{} // the file's names for prometheus and promauto
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != prometheusPkg && p != promautoPkg {
				continue
			}
			name := filepath.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			names[name] = true
		}
		if len(names) == 0 {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || !names[pkg.Name] || !strings.HasPrefix(sel.Sel.Name, "New") || notMetricConstructors[sel.Sel.Name] {
				return true
			}
			where := fmt.Sprintf("%s:%d", path, fset.Position(call.Pos()).Line)
			typ, ok := metricConstructors[sel.Sel.Name]
			if !ok {
				// NewDesc (a custom collector) and the rest: what they make is not
				// readable from the call alone.
				problems = append(problems, fmt.Sprintf("%s: %s.%s: this test cannot read the metric it makes; teach madeMetrics", where, pkg.Name, sel.Sel.Name))
				return true
			}
			m, err := readMetric(call, typ, strings.HasSuffix(sel.Sel.Name, "Vec"))
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %s.%s: %v", where, pkg.Name, sel.Sel.Name, err))
				return true
			}
			m.where = where
			made = append(made, m)
			return true
		})
		return nil
	})
	return made, problems, err
}

// readMetric reads one constructor call: its first argument a prometheus.*Opts literal,
// and a Vec's second a []string literal.
func readMetric(call *ast.CallExpr, typ string, vec bool) (madeMetric, error) {
	m := madeMetric{typ: typ}
	if len(call.Args) == 0 {
		return m, fmt.Errorf("no options")
	}
	opts, ok := call.Args[0].(*ast.CompositeLit)
	if !ok {
		return m, fmt.Errorf("the options are not a literal: write them in the call, so that the metric's name can be read")
	}
	parts := map[string]string{}
	for _, elt := range opts.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return m, fmt.Errorf("the options are not keyed")
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok || (key.Name != "Namespace" && key.Name != "Subsystem" && key.Name != "Name") {
			continue
		}
		s, err := stringLiteral(kv.Value)
		if err != nil {
			return m, fmt.Errorf("%s: %v", key.Name, err)
		}
		parts[key.Name] = s
	}
	m.name = prometheus.BuildFQName(parts["Namespace"], parts["Subsystem"], parts["Name"])
	if m.name == "" {
		return m, fmt.Errorf("the metric has no name")
	}
	if vec {
		if len(call.Args) < 2 {
			return m, fmt.Errorf("no label names")
		}
		labels, ok := call.Args[1].(*ast.CompositeLit)
		if !ok {
			return m, fmt.Errorf("the label names are not a []string literal")
		}
		for _, elt := range labels.Elts {
			s, err := stringLiteral(elt)
			if err != nil {
				return m, fmt.Errorf("label: %v", err)
			}
			m.labels = append(m.labels, s)
		}
	}
	return m, nil
}

func stringLiteral(e ast.Expr) (string, error) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", fmt.Errorf("not a string literal")
	}
	return strconv.Unquote(lit.Value)
}

// descPattern reads a Desc's String(); client_golang has no getters for its name and labels.
var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

// registeredMetrics is every metric on controller-runtime's registry, which agentd serves,
// with its label names: what this binary's packages registered as they started, the
// project's and controller-runtime's, client-go's and the Go runtime's.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	c, ok := metrics.Registry.(prometheus.Collector)
	require.True(t, ok, "controller-runtime's registry is a prometheus.Registry, which describes its metrics")
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	out := map[string][]string{}
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		require.NotNil(t, m, "cannot read the metric description %s: client_golang changed its format; update descPattern", d)
		var labels []string
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
			}
		}
		out[m[1]] = labels
	}
	return out
}

// documentedMetric is a row of one of docs/metrics.md's tables.
type documentedMetric struct {
	name, typ string
	labels    []string
	line      int
}

var (
	// docRow is a table row whose first cell is a metric's name.
	docRow = regexp.MustCompile("^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\| ([a-z]+) \\| ([^|]*) \\|")
	// docLabel is a label name in the Labels cell.
	docLabel = regexp.MustCompile("`([a-zA-Z_][a-zA-Z0-9_]*)`")
	// docMention is a metric named anywhere in the doc, in an alert's expression too: the
	// families agentd serves.
	docMention = regexp.MustCompile(`\b(?:buildkite_operator|controller_runtime|workqueue|leader_election|rest_client|certwatcher|process|go)_[a-z0-9_]+\b`)
)

// readMetricsDoc returns the doc's table rows and the lines of every metric it names.
func readMetricsDoc(doc string) ([]documentedMetric, map[string][]int) {
	var rows []documentedMetric
	mentions := map[string][]int{}
	for i, line := range strings.Split(doc, "\n") {
		if m := docRow.FindStringSubmatch(line); m != nil {
			row := documentedMetric{name: m[1], typ: m[2], line: i + 1}
			for _, l := range docLabel.FindAllStringSubmatch(m[3], -1) {
				row.labels = append(row.labels, l[1])
			}
			rows = append(rows, row)
		}
		for _, name := range docMention.FindAllString(line, -1) {
			mentions[name] = append(mentions[name], i+1)
		}
	}
	return rows, mentions
}

// metricsDocProblems compares the doc with the metrics the sources make and those the
// registry holds.
func metricsDocProblems(doc string, made []madeMetric, registered map[string][]string) []string {
	var problems []string
	rows, mentions := readMetricsDoc(doc)
	byName := map[string]documentedMetric{}
	for _, r := range rows {
		if _, dup := byName[r.name]; dup {
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s is documented twice", r.line, r.name))
		}
		byName[r.name] = r
	}
	sorted := func(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }
	for _, m := range made {
		r, ok := byName[m.name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: %s (%s, labels %v) is not in the tables of docs/metrics.md: add a row with its type, labels and meaning", m.where, m.name, m.typ, m.labels))
		case r.typ != m.typ:
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s is a %s, not a %s (%s)", r.line, m.name, m.typ, r.typ, m.where))
		case !slices.Equal(sorted(r.labels), sorted(m.labels)):
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s has the labels %v, not %v (%s)", r.line, m.name, m.labels, r.labels, m.where))
		}
		if _, ok := registered[m.name]; !ok {
			problems = append(problems, fmt.Sprintf("%s: %s is made but not on controller-runtime's registry in agentd: register it (metrics.Registry.MustRegister), or drop it", m.where, m.name))
		}
	}
	for _, r := range rows {
		labels, ok := registered[r.name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s is documented but agentd no longer registers it", r.line, r.name))
		case !slices.Equal(sorted(labels), sorted(r.labels)):
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s has the labels %v, not %v", r.line, r.name, labels, r.labels))
		}
		switch r.typ {
		case "counter", "gauge", "histogram", "summary":
		default:
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s: %q is not a metric type", r.line, r.name, r.typ))
		}
	}
	for name, lines := range mentions {
		if _, ok := registered[name]; ok {
			continue
		}
		// A histogram's or summary's series carry a suffix of their own.
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if _, ok := registered[base]; ok && base != name {
			continue
		}
		for _, line := range lines {
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s is named but agentd does not register it", line, name))
		}
	}
	sort.Strings(problems)
	return problems
}

// TestMetricsDoc: docs/metrics.md documents every metric the project makes, with its type
// and labels, and names no metric that agentd does not register. The registry is the one
// this binary's packages filled as they started, as agentd's do: what `agentd operator`
// serves on /metrics.
func TestMetricsDoc(t *testing.T) {
	made, problems, err := madeMetrics("../..")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(made), 10, "the sources' metrics are found (pkg/controller/buildjob/metrics.go, pkg/spawner/metrics.go)")
	doc, err := os.ReadFile(metricsDoc)
	require.NoError(t, err)
	problems = append(problems, metricsDocProblems(string(doc), made, registeredMetrics(t))...)
	if len(problems) > 0 {
		t.Errorf("docs/metrics.md and the metrics disagree:\n%s", strings.Join(problems, "\n"))
	}
}

// TestMetricsDocProblems: the comparison finds a metric left out, a stale row, a wrong type
// or labels, and a stale name in an alert.
func TestMetricsDocProblems(t *testing.T) {
	made := []madeMetric{
		{name: "buildkite_operator_a_total", typ: "counter", labels: []string{"reason"}, where: "a.go:1"},
		{name: "buildkite_operator_b_seconds", typ: "histogram", where: "b.go:1"},
	}
	registered := map[string][]string{"buildkite_operator_a_total": {"reason"}, "buildkite_operator_b_seconds": nil, "workqueue_depth": {"name"}}
	good := "| Metric | Type | Labels | Meaning |\n|---|---|---|---|\n" +
		"| `buildkite_operator_a_total` | counter | `reason` | A. |\n" +
		"| `buildkite_operator_b_seconds` | histogram | none | B. |\n" +
		"| `workqueue_depth` | gauge | `name` | Depth. |\n\n" +
		"`histogram_quantile(0.9, rate(buildkite_operator_b_seconds_bucket[5m]))`, `go_*`\n"
	assert.Empty(t, metricsDocProblems(good, made, registered))

	for name, tc := range map[string]struct{ from, to, want string }{
		"left out":  {"| `buildkite_operator_b_seconds` | histogram | none | B. |\n", "", "b.go:1: buildkite_operator_b_seconds (histogram, labels []) is not in the tables"},
		"stale":     {"| `workqueue_depth`", "| `workqueue_gone`", "docs/metrics.md:5: workqueue_gone is documented but agentd no longer registers it"},
		"type":      {"| histogram |", "| summary |", "docs/metrics.md:4: buildkite_operator_b_seconds is a histogram, not a summary"},
		"labels":    {"| counter | `reason` |", "| counter | `reason`, `call` |", "docs/metrics.md:3: buildkite_operator_a_total has the labels [reason], not [reason call]"},
		"mentioned": {"b_seconds_bucket", "c_seconds_bucket", "docs/metrics.md:7: buildkite_operator_c_seconds_bucket is named but agentd does not register it"},
	} {
		doc := strings.Replace(good, tc.from, tc.to, 1)
		require.NotEqual(t, good, doc, name)
		problems := metricsDocProblems(doc, made, registered)
		assert.True(t, slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }), "%s: want %q in %q", name, tc.want, problems)
	}
}
