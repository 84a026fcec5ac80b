package supervisor

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/logstream/logstreamtest"
	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// supervisorCommand returns how the benchmark runs the supervisor: SUPERVISOR_BINARY, an
// agentd-supervise binary run as a job container runs it (`make build` puts one in bin/);
// AGENTD_BINARY, an agentd binary run as `agentd supervise`, to compare; or an
// agentd-supervise built now.
func supervisorCommand(b *testing.B) []string {
	b.Helper()
	if bin := os.Getenv("SUPERVISOR_BINARY"); bin != "" {
		return []string{bin}
	}
	if bin := os.Getenv("AGENTD_BINARY"); bin != "" {
		return []string{bin, "supervise"}
	}
	bin := filepath.Join(b.TempDir(), "agentd-supervise")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/buildkite-operator/buildkite-operator/cmd/agentd-supervise").CombinedOutput()
	if err != nil {
		b.Fatalf("building agentd-supervise: %v\n%s", err, out)
	}
	return []string{bin}
}

// BenchmarkSupervisorStream runs the supervisor (agentd-supervise) as its own process, as in a
// job pod, for a command that prints 200 MB of job output (SUPERVISOR_BENCH_MB changes it), with a
// dozen secrets in its environment to redact, to the fake Buildkite over HTTP in Buildkite's
// 100 KiB chunks. Besides MB/s it reports the supervisor's peak RSS (VmHWM) and its CPU time
// per MB (user and system, from wait4; the command's, cat of a file, is in it too).
func BenchmarkSupervisorStream(b *testing.B) {
	size := 200_000_000
	if mb, err := strconv.Atoi(os.Getenv("SUPERVISOR_BENCH_MB")); err == nil && mb > 0 {
		size = mb * 1_000_000
	}
	command := supervisorCommand(b)
	secrets := logstreamtest.Secrets()
	file := filepath.Join(b.TempDir(), "output")
	if err := os.WriteFile(file, logstreamtest.JobOutput(size, secrets, 1), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	var (
		peak memory
		cpu  time.Duration
	)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		h := newHarness(b, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("cat " + file)})
		h.command = command
		for i, s := range secrets {
			h.env[fmt.Sprintf("BENCH_%d_SECRET", i)] = s
		}
		for _, kv := range strings.Fields(os.Getenv("SUPERVISOR_BENCH_ENV")) {
			k, v, _ := strings.Cut(kv, "=")
			h.env[k] = v
		}
		b.StartTimer()
		sv := h.start("--finish")
		peaks := sv.watchPeakRSS()
		code := sv.wait(b, 10*time.Minute)
		b.StopTimer()
		if code != 0 {
			b.Fatalf("the supervisor exited with %d", code)
		}
		m := <-peaks
		peak.RSS, peak.Anon = max(peak.RSS, m.RSS), max(peak.Anon, m.Anon)
		if ru, ok := sv.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cpu += logstreamtest.RusageCPU(ru)
		}
		if i == 0 {
			checkRedacted(b, h.snapshot().Log, secrets, size)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(peak.RSS)/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(float64(peak.Anon)/(1<<20), "peak-anon-MiB")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N)/(float64(size)/1e6), "cpu-ms/MB")
}

// checkRedacted fails b unless the log is all there and holds no secret.
func checkRedacted(b *testing.B, log []byte, secrets []string, size int) {
	b.Helper()
	if len(log) < size/2 {
		b.Fatalf("the log has %d bytes of %d", len(log), size)
	}
	if !bytes.Contains(log, []byte(redact.Replacement)) {
		b.Fatal("nothing was redacted")
	}
	for _, s := range secrets {
		for _, line := range bytes.Split([]byte(s), []byte("\n")) {
			if bytes.Contains(log, line) {
				b.Fatalf("the log holds a secret: %q", line)
			}
		}
	}
}
