package harness

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// The audit: did every job end in exactly one finish, in time, with its whole log? The
// tests that disrupt the operator (failover, upgrade, the chaos soak) ask it of the fake
// Buildkite's records, in one place, so that each measure has one definition.
//
// Their jobs print numbered lines (NumberedCommand), so that a hole anywhere in a log is
// seen, not only a missing end.

// numberedLineRE is one line of NumberedCommand's output, as the fake's plain log shows it.
var numberedLineRE = regexp.MustCompile(`(?m)^numbered line (\d+) of (\d+)\r?$`)

// NumberedCommand is a shell command that prints "numbered line i of n" for i = 1..n,
// sleeping pause between two lines (none when pause is 0). The fake Buildkite does not
// interpolate a pipeline, so the command goes into its YAML as it is.
func NumberedCommand(n int, pause time.Duration) string {
	sleep := ""
	if pause > 0 {
		sleep = fmt.Sprintf(`[ $i -lt %d ] && sleep %g; `, n, pause.Seconds())
	}
	return fmt.Sprintf(`i=1; while [ $i -le %[1]d ]; do echo "numbered line $i of %[1]d"; %[2]si=$((i+1)); done`, n, sleep)
}

// NumberedStep is a pipeline step, in YAML, that runs NumberedCommand on the operator's
// queue; extra is more of the step's YAML, indented as its keys (for "parallelism: 20").
func NumberedStep(label string, n int, pause time.Duration, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - label: %q\n    command: %q\n    agents:\n      queue: bk-operator\n", label, NumberedCommand(n, pause))
	for _, e := range extra {
		fmt.Fprintf(&b, "    %s\n", e)
	}
	return b.String()
}

// Expect is what the audit expects of one job.
type Expect struct {
	// Lines is how many numbered lines the job prints when it runs to its end.
	Lines int
	// Bound is the longest a job may take from its accept to its finish.
	Bound time.Duration
	// Disturbed: the test deleted the job's pod on purpose. Such a job may end early and
	// fail; its log must still hold its lines from the first without a hole, up to where
	// the pod was stopped.
	Disturbed bool
}

// Audit counts, over a set of jobs, the ways a job can go wrong. Each list holds the IDs
// of the jobs concerned; a job is in at most one of Lost and Stuck.
type Audit struct {
	Jobs int `json:"jobs"`
	// Lost: accepted by a slot (the fake recorded an accept) but never finished (no finish
	// accepted by the end of the run).
	Lost []string `json:"lost"`
	// Doubled: more than one finish accepted. The fake, like Buildkite, refuses a second
	// finish, so this counts what the fake let through; the operator's second attempts are
	// RefusedFinishes.
	Doubled []string `json:"doubled"`
	// Stuck: finished more than Expect.Bound after its accept, or never accepted at all by
	// the end of the run (left waiting in the queue).
	Stuck []string `json:"stuck"`
	// IncompleteLogs: the log the fake assembled does not hold the job's numbered lines
	// exactly once each, in order, from the first: all Expect.Lines of them, or, for a
	// disturbed job, a prefix. A missing, repeated or reordered line is a hole.
	IncompleteLogs []string `json:"incomplete_logs"`

	// Not failures of the promises by themselves, but shown:
	// RefusedFinishes counts finish calls refused because the job had already ended.
	RefusedFinishes int `json:"refused_finishes"`
	// Reaccepted: jobs accepted more than once (a retried accept, or two slots).
	Reaccepted []string `json:"reaccepted"`
	// FailedUndisturbed: jobs whose pod was left alone that did not finish with exit
	// status 0.
	FailedUndisturbed []string `json:"failed_undisturbed"`
	// Problems says, per job, what is wrong, for the report.
	Problems map[string][]string `json:"problems,omitempty"`
}

// AuditJobs audits jobs as the fake recorded them, expect saying what each should have done.
func AuditJobs(jobs []fakebuildkite.JobSnapshot, expect func(jobID string) Expect) Audit {
	a := Audit{Jobs: len(jobs), Problems: map[string][]string{}}
	problem := func(id, format string, args ...any) {
		a.Problems[id] = append(a.Problems[id], fmt.Sprintf(format, args...))
	}
	for _, j := range jobs {
		want := expect(j.ID)
		switch {
		case j.AcceptCount == 0:
			a.Stuck = append(a.Stuck, j.ID)
			problem(j.ID, "never accepted (state %s)", j.State)
		case j.FinishesAccepted == 0:
			a.Lost = append(a.Lost, j.ID)
			problem(j.ID, "accepted at %s, never finished (state %s)", j.AcceptedAt.Format(time.TimeOnly), j.State)
		case j.FinishedAt.Sub(j.AcceptedAt) > want.Bound:
			a.Stuck = append(a.Stuck, j.ID)
			problem(j.ID, "finished %s after its accept, past the bound of %s", j.FinishedAt.Sub(j.AcceptedAt).Round(time.Second), want.Bound)
		}
		if j.FinishesAccepted > 1 {
			a.Doubled = append(a.Doubled, j.ID)
			problem(j.ID, "%d finishes accepted", j.FinishesAccepted)
		}
		a.RefusedFinishes += j.FinishesRefused
		if j.AcceptCount > 1 {
			a.Reaccepted = append(a.Reaccepted, j.ID)
			problem(j.ID, "accepted %d times", j.AcceptCount)
		}
		if !want.Disturbed && j.FinishesAccepted > 0 && (j.State != fakebuildkite.StateFinished || j.ExitStatus != "0") {
			a.FailedUndisturbed = append(a.FailedUndisturbed, j.ID)
			problem(j.ID, "ended %s with exit status %q (signal reason %q) though nothing disturbed it", j.State, j.ExitStatus, j.SignalReason)
		}
		if j.FinishesAccepted > 0 {
			if msg := checkNumbered(fakebuildkite.PlainLog(j.Log), want.Lines, want.Disturbed); msg != "" {
				a.IncompleteLogs = append(a.IncompleteLogs, j.ID)
				problem(j.ID, "log: %s", msg)
			}
		}
	}
	return a
}

// checkNumbered says what is wrong with the numbered lines of a log, or "" when they are
// 1..n once each and in order (1..k for some k ≤ n when prefix is allowed).
func checkNumbered(log string, n int, prefix bool) string {
	var got []int
	for _, m := range numberedLineRE.FindAllStringSubmatch(log, -1) {
		i, _ := strconv.Atoi(m[1])
		if of, _ := strconv.Atoi(m[2]); of != n {
			return fmt.Sprintf("a line says it is one of %d, the job prints %d", of, n)
		}
		got = append(got, i)
	}
	for k, i := range got {
		if i != k+1 {
			return fmt.Sprintf("line %d of the output is numbered %d: a line is missing, repeated or out of order (lines seen: %s)", k+1, i, span(got))
		}
	}
	if len(got) > n {
		return fmt.Sprintf("%d numbered lines, the job prints %d", len(got), n)
	}
	if !prefix && len(got) < n {
		return fmt.Sprintf("%d of %d numbered lines: the end is missing", len(got), n)
	}
	return ""
}

// span shows a list of line numbers briefly: its first and last few.
func span(ns []int) string {
	if len(ns) > 8 {
		return fmt.Sprintf("%v ... %v", ns[:4], ns[len(ns)-4:])
	}
	return fmt.Sprint(ns)
}

// Failed reports whether any of the four promises failed: a job lost, doubled, stuck or
// with an incomplete log.
func (a Audit) Failed() bool {
	return len(a.Lost)+len(a.Doubled)+len(a.Stuck)+len(a.IncompleteLogs) > 0
}

// String lists the problems job by job, in a stable order.
func (a Audit) String() string {
	ids := make([]string, 0, len(a.Problems))
	for id := range a.Problems {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var b strings.Builder
	fmt.Fprintf(&b, "%d jobs: %d lost, %d doubled, %d stuck, %d incomplete logs; %d refused finishes, %d accepted twice, %d failed undisturbed\n",
		a.Jobs, len(a.Lost), len(a.Doubled), len(a.Stuck), len(a.IncompleteLogs), a.RefusedFinishes, len(a.Reaccepted), len(a.FailedUndisturbed))
	for _, id := range ids {
		fmt.Fprintf(&b, "  job %s: %s\n", id, strings.Join(a.Problems[id], "; "))
	}
	return b.String()
}
