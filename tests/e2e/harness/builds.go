package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// BuildJobs are the jobs of a build, including those a pipeline upload added, in the order
// they were created.
func (e *Env) BuildJobs(buildID string) []fakebuildkite.JobSnapshot {
	var out []fakebuildkite.JobSnapshot
	for _, j := range e.Fake.Jobs() {
		if j.BuildID == buildID {
			out = append(out, j)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].CreatedAt.Before(out[b].CreatedAt) })
	return out
}

// WaitBuild waits until every job of the build is in a terminal state and no job was added
// for settle (a pipeline upload adds jobs while its job runs). progress, when set, is
// called with the jobs on every change.
func (e *Env) WaitBuild(ctx context.Context, buildID string, settle time.Duration, progress func([]fakebuildkite.JobSnapshot)) ([]fakebuildkite.JobSnapshot, error) {
	var last string
	var doneSince time.Time
	for {
		jobs := e.BuildJobs(buildID)
		key := summary(jobs)
		if key != last {
			last = key
			if progress != nil {
				progress(jobs)
			}
		}
		allDone := len(jobs) > 0
		for _, j := range jobs {
			allDone = allDone && fakebuildkite.IsTerminal(j.State)
		}
		if allDone {
			if doneSince.IsZero() {
				doneSince = time.Now()
			}
			if time.Since(doneSince) >= settle {
				return jobs, nil
			}
		} else {
			doneSince = time.Time{}
		}
		select {
		case <-ctx.Done():
			return jobs, fmt.Errorf("waiting for build %s: %w; jobs:\n%s", buildID, ctx.Err(), Table(jobs))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func summary(jobs []fakebuildkite.JobSnapshot) string {
	var b strings.Builder
	for _, j := range jobs {
		fmt.Fprintf(&b, "%s:%s:%s;", j.ID, j.State, j.ExitStatus)
	}
	return b.String()
}

// Table shows jobs as a table: step, state, exit status, signal reason.
func Table(jobs []fakebuildkite.JobSnapshot) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATE\tEXIT STATUS\tSIGNAL REASON\tFINISHES\tDURATION")
	for _, j := range jobs {
		label := j.Label
		if label == "" {
			label = j.Command
		}
		if j.UploadedFromJob != "" {
			label += " (uploaded)"
		}
		dur := "-"
		if !j.StartedAt.IsZero() && !j.FinishedAt.IsZero() {
			dur = j.FinishedAt.Sub(j.StartedAt).Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", label, j.State, dash(j.ExitStatus), dash(j.SignalReason), j.FinishCount, dur)
	}
	_ = tw.Flush()
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
