package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// ModeSupervisor is the log streaming benchmark's entry in the JSON.
const ModeSupervisor = "supervisor log streaming"

// The benchmarks the bench runs with `go test`, and the metrics they report
// (pkg/supervisor/bench_test.go, pkg/agentapi/bench_test.go).
const (
	benchSupervisorStream = "BenchmarkSupervisorStream"
	benchGzipChunks       = "BenchmarkGzipFloor/chunks"

	metricCPUPerMB   = "cpu-ms/MB"
	metricMBPerSec   = "MB/s"
	metricPeakRSS    = "peak-RSS-MiB"
	metricPeakAnon   = "peak-anon-MiB"
	metricCompressed = "%-compressed"
)

// SupervisorResult is the log streaming benchmark: the supervisor as its own process, as in
// a job pod, streaming 200 MB of job output with redaction to the fake Buildkite, and the
// floor under it, compressing the same output in Buildkite's 100 KiB chunks.
type SupervisorResult struct {
	Mode    string    `json:"mode"`
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	// Binary is the agentd-supervise the benchmark ran.
	Binary string `json:"binary"`
	// Stream and GzipFloor are one entry per run, in order.
	Stream    []BenchLine `json:"stream"`
	GzipFloor []BenchLine `json:"gzip_floor_chunks"`
}

// BenchLine is one result line of `go test -bench`: the benchmark's name without its
// GOMAXPROCS suffix, and each metric by unit (ns/op, MB/s, cpu-ms/MB, ...).
type BenchLine struct {
	Name    string             `json:"name"`
	Metrics map[string]float64 `json:"metrics"`
}

// metric is each line's value of unit, skipping the lines without it.
func metric(lines []BenchLine, unit string) []float64 {
	var vs []float64
	for _, l := range lines {
		if v, ok := l.Metrics[unit]; ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// procsSuffix is the "-2" go test appends to a benchmark's name when GOMAXPROCS is not 1.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// parseBenchOutput reads the result lines of the benchmark named name from go test's
// output: "BenchmarkX-2  1  720898114 ns/op  27.74 MB/s  13.57 cpu-ms/MB". The lines the
// benchmark logs around them are skipped.
func parseBenchOutput(r io.Reader, name string) ([]BenchLine, error) {
	var out []BenchLine
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || procsSuffix.ReplaceAllString(f[0], "") != name {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue // not a result line: the name alone, as go test -v prints it
		}
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("%s: a result line without a unit for each value: %q", name, sc.Text())
		}
		l := BenchLine{Name: name, Metrics: map[string]float64{}}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q in %q is not a number", name, f[i], sc.Text())
			}
			l.Metrics[f[i+1]] = v
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no result line of %s in go test's output", name)
	}
	return out, nil
}

// BuildSupervisor builds agentd-supervise into dir as the image's is built (static and
// stripped, as `make release-binaries` does), which is what the CPU per MB is of.
func BuildSupervisor(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "agentd-supervise")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./cmd/agentd-supervise")
	cmd.Dir = testkit.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building agentd-supervise: %w: %s", err, b)
	}
	return out, nil
}

// RunSupervisor runs the log streaming benchmark (pkg/supervisor, with binary as
// SUPERVISOR_BINARY) and the gzip floor (pkg/agentapi) runs times each, as `go test`
// subprocesses from the repository's root.
func RunSupervisor(ctx context.Context, binary string, runs int, logf func(string, ...any)) (*SupervisorResult, error) {
	res := &SupervisorResult{Mode: ModeSupervisor, Started: time.Now(), Machine: machine(), Binary: binary}
	var err error
	logf("log streaming: %s, %d run(s) of 200 MB", binary, runs)
	if res.Stream, err = goBench(ctx, "./pkg/supervisor/", "SupervisorStream", benchSupervisorStream, runs, "SUPERVISOR_BINARY="+binary); err != nil {
		return nil, err
	}
	logf("log streaming: the gzip floor, %d run(s)", runs)
	if res.GzipFloor, err = goBench(ctx, "./pkg/agentapi/", "GzipFloor/chunks", benchGzipChunks, runs); err != nil {
		return nil, err
	}
	res.Machine.LoadAfter = loadAverage()
	return res, nil
}

// goBench runs `go test -bench pattern -benchtime 1x -count runs pkg` and returns name's
// result lines.
func goBench(ctx context.Context, pkg, pattern, name string, runs int, env ...string) ([]BenchLine, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", "1x", "-count", strconv.Itoa(runs), pkg)
	cmd.Dir = testkit.RepoRoot()
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %w; the end of its output:\n%s", strings.Join(cmd.Args, " "), err, tail(out))
	}
	lines, err := parseBenchOutput(bytes.NewReader(out), name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; the end of its output:\n%s", strings.Join(cmd.Args, " "), err, tail(out))
	}
	return lines, nil
}

// tail is the last 20 lines of a command's output, for an error.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-20, 0):], "\n")
}

// PrintSupervisor writes the log streaming benchmark as a Markdown table: min / median /
// max across the runs.
func PrintSupervisor(w io.Writer, r *SupervisorResult) {
	fmt.Fprintf(w, "log streaming: the supervisor (%s) as its own process, 200 MB of job output with redaction to the fake Buildkite in 100 KiB chunks; %d run(s)\n",
		r.Binary, len(r.Stream))
	fmt.Fprintf(w, "machine: %d CPUs, load average %.1f before, %.1f after; %s\n", r.Machine.CPUs, r.Machine.LoadBefore, r.Machine.LoadAfter, r.Machine.Commit)
	fmt.Fprintln(w, "each cell is min / median / max across the runs")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measure | value |")
	fmt.Fprintln(w, "|---|---|")
	rows := []struct {
		name   string
		values []float64
		format func(float64) string
	}{
		{"supervisor CPU per MB (user + system; the `cat` it runs included)", metric(r.Stream, metricCPUPerMB), msPerMB},
		{"throughput, the supervisor to the fake (which shares the cores)", metric(r.Stream, metricMBPerSec), fixedUnit(1, "MB/s")},
		{"supervisor peak RSS (VmHWM)", metric(r.Stream, metricPeakRSS), mib},
		{"supervisor peak private memory (RssAnon)", metric(r.Stream, metricPeakAnon), mib},
		{"**floor**: compressing the same output in 100 KiB chunks (`GzipFloor/chunks`), CPU per MB", metric(r.GzipFloor, metricCPUPerMB), msPerMB},
		{"the floor's compressed size", metric(r.GzipFloor, metricCompressed), fixedUnit(0, "%")},
	}
	for _, rw := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", rw.name, spreadText(rw.values, rw.format))
	}
}

func msPerMB(v float64) string { return fmt.Sprintf("%.1f ms/MB", v) }

func fixedUnit(digits int, unit string) func(float64) string {
	return func(v float64) string { return fmt.Sprintf("%.*f %s", digits, v, unit) }
}

// spreadText is one value, the min / median / max of several, or "none".
func spreadText(vs []float64, format func(float64) string) string {
	switch len(vs) {
	case 0:
		return "none"
	case 1:
		return format(vs[0])
	}
	s := newSpread(vs)
	return format(s.min) + " / " + format(s.median) + " / " + format(s.max)
}
