package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// supervisorOutput is go test's output of BenchmarkSupervisorStream -count 2 as it prints
// it, with what the benchmark logs between the result lines.
const supervisorOutput = "goos: linux\n" +
	"goarch: amd64\n" +
	"pkg: github.com/buildkite-operator/buildkite-operator/pkg/supervisor\n" +
	"cpu: AMD EPYC\n" +
	"BenchmarkSupervisorStream-2   \t       1\t 720898114 ns/op\t  27.74 MB/s\t        13.57 cpu-ms/MB\t        18.01 peak-RSS-MiB\t         9.977 peak-anon-MiB\n" +
	"--- BENCH: BenchmarkSupervisorStream-2\n" +
	"    server.go:244: fake buildkite: job 4118bae0 started\n" +
	"    bench_test.go:76: supervisor output:\n" +
	"BenchmarkSupervisorStream-2   \t       1\t 558544852 ns/op\t  35.81 MB/s\t        15.08 cpu-ms/MB\t        18.09 peak-RSS-MiB\t        10.06 peak-anon-MiB\n" +
	"PASS\n" +
	"ok  \tgithub.com/buildkite-operator/buildkite-operator/pkg/supervisor\t3.380s\n"

const gzipOutput = "BenchmarkGzipFloor/io.Copy-2 \t1\t 900000000 ns/op\t 222.2 MB/s\t 4.40 cpu-ms/MB\t 46.00 %-compressed\n" +
	"BenchmarkGzipFloor/chunks-2  \t1\t1100000000 ns/op\t 181.8 MB/s\t 5.60 cpu-ms/MB\t 47.00 %-compressed\n" +
	"BenchmarkGzipFloor/chunks    \t1\t1000000000 ns/op\t 200.0 MB/s\t 5.40 cpu-ms/MB\t 47.10 %-compressed\n"

func TestParseBenchOutput(t *testing.T) {
	tests := []struct {
		name, output, bench string
		want                []BenchLine
		err                 string
	}{
		{
			name: "the supervisor's runs, the lines it logs skipped", output: supervisorOutput, bench: benchSupervisorStream,
			want: []BenchLine{
				{Name: benchSupervisorStream, Metrics: map[string]float64{"ns/op": 720898114, metricMBPerSec: 27.74, metricCPUPerMB: 13.57, metricPeakRSS: 18.01, metricPeakAnon: 9.977}},
				{Name: benchSupervisorStream, Metrics: map[string]float64{"ns/op": 558544852, metricMBPerSec: 35.81, metricCPUPerMB: 15.08, metricPeakRSS: 18.09, metricPeakAnon: 10.06}},
			},
		},
		{
			name: "one sub-benchmark of several, with and without the GOMAXPROCS suffix", output: gzipOutput, bench: benchGzipChunks,
			want: []BenchLine{
				{Name: benchGzipChunks, Metrics: map[string]float64{"ns/op": 1.1e9, metricMBPerSec: 181.8, metricCPUPerMB: 5.6, metricCompressed: 47}},
				{Name: benchGzipChunks, Metrics: map[string]float64{"ns/op": 1e9, metricMBPerSec: 200, metricCPUPerMB: 5.4, metricCompressed: 47.1}},
			},
		},
		{
			name: "go test -v prints the name alone first", bench: benchSupervisorStream,
			output: "BenchmarkSupervisorStream\nBenchmarkSupervisorStream-2 \t1\t5 ns/op\t12.5 cpu-ms/MB\n",
			want:   []BenchLine{{Name: benchSupervisorStream, Metrics: map[string]float64{"ns/op": 5, metricCPUPerMB: 12.5}}},
		},
		{name: "another benchmark's name is no match", output: gzipOutput, bench: benchSupervisorStream, err: "no result line of BenchmarkSupervisorStream"},
		{name: "a failed run has no result line", output: "--- FAIL: BenchmarkSupervisorStream-2\nFAIL\n", bench: benchSupervisorStream, err: "no result line"},
		{name: "a value that is not a number", output: "BenchmarkSupervisorStream-2 1 12,5 cpu-ms/MB\n", bench: benchSupervisorStream, err: `"12,5"`},
		{name: "a value without its unit", output: "BenchmarkSupervisorStream-2 1 5 ns/op 12.5\n", bench: benchSupervisorStream, err: "without a unit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseBenchOutput(strings.NewReader(tt.output), tt.bench)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPrintSupervisor(t *testing.T) {
	stream, err := parseBenchOutput(strings.NewReader(supervisorOutput+strings.Replace(supervisorOutput, "15.08 cpu-ms/MB", "14.00 cpu-ms/MB", 1)), benchSupervisorStream)
	require.NoError(t, err)
	floor, err := parseBenchOutput(strings.NewReader(gzipOutput), benchGzipChunks)
	require.NoError(t, err)
	var buf bytes.Buffer
	PrintSupervisor(&buf, &SupervisorResult{Binary: "/bin/agentd-supervise", Stream: stream, GzipFloor: floor})
	out := buf.String()
	assert.Contains(t, out, "4 run(s)")
	// min / median (the mean of the middle two of four) / max, each metric on its own.
	assert.Contains(t, out, "| 13.6 ms/MB / 13.8 ms/MB / 15.1 ms/MB |")
	assert.Contains(t, out, "| 27.7 MB/s / 31.8 MB/s / 35.8 MB/s |")
	assert.Contains(t, out, "| 5.4 ms/MB / 5.5 ms/MB / 5.6 ms/MB |")
}
