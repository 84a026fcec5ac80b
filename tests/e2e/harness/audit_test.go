package harness

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// numbered is the output of NumberedCommand(n, ...) for the lines in is, with the
// timestamps and colours the fake keeps in a log around each line.
func numbered(n int, is ...int) []byte {
	var b strings.Builder
	b.WriteString("\x1b_bk;t=1700000000000\x07$ the command\n")
	for _, i := range is {
		fmt.Fprintf(&b, "\x1b_bk;t=1700000000000\x07numbered line %d of %d\n", i, n)
	}
	return []byte(b.String())
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestAuditJobs feeds the audit crafted records: each way a job can go wrong must be
// counted, under its own measure, and a clean job under none.
func TestAuditJobs(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	// finished is a job that was accepted, finished once with exit 0 after d, and holds log.
	finished := func(d time.Duration, log []byte) fakebuildkite.JobSnapshot {
		return fakebuildkite.JobSnapshot{
			ID: "job", State: fakebuildkite.StateFinished, ExitStatus: "0",
			AcceptCount: 1, FinishCount: 1, FinishesAccepted: 1,
			CreatedAt: t0, AcceptedAt: t0, FinishedAt: t0.Add(d), Log: log,
		}
	}
	with := func(j fakebuildkite.JobSnapshot, f func(*fakebuildkite.JobSnapshot)) fakebuildkite.JobSnapshot {
		f(&j)
		return j
	}
	whole := numbered(5, seq(1, 5)...)
	tests := []struct {
		name      string
		job       fakebuildkite.JobSnapshot
		disturbed bool
		// want: the measures the job counts under, by name.
		want []string
		// refused finishes counted
		refused int
	}{
		{name: "clean", job: finished(time.Minute, whole)},
		{name: "a second finish refused is not doubled", job: with(finished(time.Minute, whole), func(j *fakebuildkite.JobSnapshot) {
			j.FinishCount, j.FinishesRefused = 2, 1
		}), refused: 1},
		{name: "accepted, never finished", job: with(finished(0, nil), func(j *fakebuildkite.JobSnapshot) {
			j.State, j.FinishesAccepted, j.FinishCount, j.FinishedAt = fakebuildkite.StateRunning, 0, 0, time.Time{}
		}), want: []string{"lost"}},
		{name: "never accepted", job: fakebuildkite.JobSnapshot{ID: "job", State: fakebuildkite.StateScheduled, CreatedAt: t0},
			want: []string{"stuck"}},
		{name: "finished past its bound", job: finished(6*time.Minute, whole), want: []string{"stuck"}},
		{name: "two finishes accepted", job: with(finished(time.Minute, whole), func(j *fakebuildkite.JobSnapshot) {
			j.FinishCount, j.FinishesAccepted = 2, 2
		}), want: []string{"doubled"}},
		{name: "a hole in the middle", job: finished(time.Minute, numbered(5, 1, 2, 4, 5)), want: []string{"incomplete"}},
		{name: "the end missing", job: finished(time.Minute, numbered(5, 1, 2, 3)), want: []string{"incomplete"}},
		{name: "the start missing", job: finished(time.Minute, numbered(5, 2, 3, 4, 5)), want: []string{"incomplete"}},
		{name: "a line twice", job: finished(time.Minute, numbered(5, 1, 2, 2, 3, 4, 5)), want: []string{"incomplete"}},
		{name: "out of order", job: finished(time.Minute, numbered(5, 1, 3, 2, 4, 5)), want: []string{"incomplete"}},
		{name: "lines of another count", job: finished(time.Minute, numbered(6, seq(1, 6)...)), want: []string{"incomplete"}},
		{name: "no log at all", job: finished(time.Minute, nil), want: []string{"incomplete"}},
		{name: "failed though undisturbed", job: with(finished(time.Minute, whole), func(j *fakebuildkite.JobSnapshot) { j.ExitStatus = "1" }),
			want: []string{"failed"}},
		{name: "accepted twice", job: with(finished(time.Minute, whole), func(j *fakebuildkite.JobSnapshot) { j.AcceptCount = 2 }),
			want: []string{"reaccepted"}},
		{name: "disturbed: failed with a prefix of its lines", disturbed: true,
			job: with(finished(time.Minute, numbered(5, 1, 2)), func(j *fakebuildkite.JobSnapshot) { j.ExitStatus = "-1" })},
		{name: "disturbed: a hole is still a hole", disturbed: true,
			job:  with(finished(time.Minute, numbered(5, 1, 3)), func(j *fakebuildkite.JobSnapshot) { j.ExitStatus = "-1" }),
			want: []string{"incomplete"}},
		{name: "disturbed: lost is lost", disturbed: true, job: with(finished(0, nil), func(j *fakebuildkite.JobSnapshot) {
			j.State, j.FinishesAccepted, j.FinishCount = fakebuildkite.StateRunning, 0, 0
		}), want: []string{"lost"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := AuditJobs([]fakebuildkite.JobSnapshot{tt.job}, func(string) Expect {
				return Expect{Lines: 5, Bound: 5 * time.Minute, Disturbed: tt.disturbed}
			})
			var got []string
			for _, m := range []struct {
				name string
				ids  []string
			}{{"lost", a.Lost}, {"doubled", a.Doubled}, {"stuck", a.Stuck}, {"incomplete", a.IncompleteLogs},
				{"reaccepted", a.Reaccepted}, {"failed", a.FailedUndisturbed}} {
				if len(m.ids) > 0 {
					got = append(got, m.name)
				}
			}
			assert.ElementsMatch(t, tt.want, got, "%s", a)
			assert.Equal(t, tt.refused, a.RefusedFinishes)
			promises := false
			for _, w := range tt.want {
				promises = promises || w == "lost" || w == "doubled" || w == "stuck" || w == "incomplete"
			}
			assert.Equal(t, promises, a.Failed(), "Failed() is true exactly when a promise failed")
			if len(tt.want) > 0 {
				assert.NotEmpty(t, a.Problems["job"], "the problem is explained")
			}
		})
	}
}

// TestNumberedCommand runs the command jobs print their lines with under a shell: its
// output is what the audit counts as whole, and any line taken out is seen.
func TestNumberedCommand(t *testing.T) {
	for _, pause := range []time.Duration{0, 10 * time.Millisecond} {
		out, err := exec.Command("/bin/sh", "-e", "-c", NumberedCommand(7, pause)).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Empty(t, checkNumbered(string(out), 7, false), "output:\n%s", out)
		lines := strings.SplitAfter(string(out), "\n")
		holed := strings.Join(append(lines[:3:3], lines[4:]...), "")
		assert.NotEmpty(t, checkNumbered(holed, 7, false), "line 4 taken out")
		assert.NotEmpty(t, checkNumbered(holed, 7, true), "line 4 taken out, as a prefix")
	}

	// Through a pipeline, the fake hands the job the command as it is.
	fake, err := fakebuildkite.Start(fakebuildkite.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer func() { _ = fake.Close() }()
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "audit",
		PipelineYAML: "steps:\n" + NumberedStep("numbered", 3, time.Second, "parallelism: 2")})
	require.NoError(t, err)
	require.Len(t, b.Jobs, 2)
	j, _ := fake.Job(b.Jobs[1])
	assert.Equal(t, NumberedCommand(3, time.Second), j.Command)
	assert.Equal(t, 1, j.ParallelJob)
}
