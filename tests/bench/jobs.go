package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// buildSize is how many steps each of the closed loop's builds has.
const buildSize = 50

// queued is the jobs queued so far, in order: the sampler reads it while the run queues.
type queued struct {
	mu  sync.Mutex
	ids []string
}

func (q *queued) add(ids ...string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ids = append(q.ids, ids...)
}

func (q *queued) all() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.ids)
}

// windowEnd is what the bench reads at each end of the measured window.
type windowEnd struct {
	at      time.Time
	cpu     cpuSnapshot
	metrics metrics
}

func (r *run) windowEnd(ctx context.Context) (windowEnd, error) {
	cpu, err := takeCPU()
	if err != nil {
		return windowEnd{}, err
	}
	m, err := scrape(ctx, r.metricsAddr)
	if err != nil {
		return windowEnd{}, err
	}
	return windowEnd{at: time.Now(), cpu: cpu, metrics: m}, nil
}

// jobs queues the run's jobs, all at once or at the open loop's rate, waits for them to
// finish and their pods to go, and fills in the result.
func (r *run) jobs(ctx context.Context) error {
	start, err := r.windowEnd(ctx)
	if err != nil {
		return err
	}
	from := time.Now()
	q := &queued{}
	samples := r.startSampling(ctx, from, q)
	if err := r.queue(ctx, from, q); err != nil {
		samples.stop()
		return err
	}
	if err := r.waitJobs(ctx, q.all()); err != nil {
		samples.stop()
		return err
	}
	jobs := r.tally(q.all(), from)

	// The requests a job causes go on after its finish: the pod is deleted, and the
	// BuildJob's status updated. They are counted until the pods are gone.
	r.cfg.Logf("all %d jobs ended in %.1f s; waiting for their pods to go", len(jobs), r.res.Seconds)
	gctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := r.w.waitFor(gctx, "the jobs' pods to be deleted", func() bool { return len(r.w.jobPods) == 0 }); err != nil {
		r.cfg.Logf("%v: counting requests up to now", err)
	}
	end, err := r.windowEnd(ctx)
	r.res.Samples = samples.stop()
	if err != nil {
		return err
	}
	if err := r.measureAgentd(start, end); err != nil {
		return err
	}
	if r.sup != nil {
		if err := r.sup.wait(); err != nil {
			return fmt.Errorf("the stand-in supervisor: %w", err)
		}
	}
	if r.res.Requests, err = requestsPerJob(r.ce.auditLog, from, end.at, r.res.Jobs); err != nil {
		return err
	}
	seen, err := r.podMoments()
	if err != nil {
		return err
	}
	r.res.Phases = phases(jobMoments(jobs, r.fake.Requests(), seen), r.ce.simulated)
	r.res.PickupOverFloorMs = pickupOverFloor(r.res.Phases, r.res.BarePod)
	r.res.Machine.LoadAfter = loadAverage()
	return nil
}

// podMoments are the moments of each job's BuildJob and pod: on the kwok backend the API
// server's (serverTimes), which also give the floor again; else the watch's.
func (r *run) podMoments() (map[string]observed, error) {
	r.res.MomentsFrom = momentsFromWatch
	if !r.ce.simulated {
		return r.w.jobsSeen(), nil
	}
	st, err := readServerTimes(r.ce.auditLog)
	if err != nil {
		return nil, err
	}
	if floor, ok := st.barePods(r.cfg.InFlight); ok {
		r.res.BarePod = floor
	} else {
		r.cfg.Logf("the audit log lacks a bare pod's create or running: the floor is the watch's")
	}
	r.res.MomentsFrom = momentsFromServer
	return st.apply(r.w.jobsSeen()), nil
}

// measureAgentd fills in what agentd and every other process cost between the window's
// ends, and stops agentd, unless the warm phase follows: its CPU from its start is then
// what /proc says at the window's end.
func (r *run) measureAgentd(start, end windowEnd) error {
	rss, err := r.op.peakRSS()
	if err != nil {
		return err
	}
	r.res.CPU = cpuBetween(start.cpu, end.cpu, r.res.Jobs)
	r.res.Controller = controllerStats(start.metrics, end.metrics, end.at.Sub(start.at), r.res.Jobs)
	pid := r.op.pid()
	r.res.Agentd = Process{
		PeakRSSMiB:       float64(rss) / (1 << 20),
		CPUSecondsPerJob: (end.cpu.procs[pid].cpu - start.cpu.procs[pid].cpu).Seconds() / float64(r.res.Jobs),
		Goroutines:       int(end.metrics.sum("go_goroutines", "")),
		HeapInuseMiB:     end.metrics.sum("go_memstats_heap_inuse_bytes", "") / (1 << 20),
		StackInuseMiB:    end.metrics.sum("go_memstats_stack_inuse_bytes", "") / (1 << 20),
	}
	if r.cfg.Warm {
		r.res.Agentd.CPUSecondsTotal = end.cpu.procs[pid].cpu.Seconds()
		return nil
	}
	if err := r.op.stop(30 * time.Second); err != nil {
		return err
	}
	if ru := r.op.rusage(); ru != nil {
		r.res.Agentd.CPUSecondsTotal = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	r.op = nil
	return nil
}

// queue creates the run's jobs: in the closed loop all at once, in builds of buildSize
// steps; in the open loop one build of one step every 1/Rate seconds.
func (r *run) queue(ctx context.Context, from time.Time, q *queued) error {
	total := r.res.Jobs
	command := "echo bench"
	if !r.ce.simulated && r.cfg.CommandDuration > 0 {
		command += fmt.Sprintf(" && sleep %g", r.cfg.CommandDuration.Seconds())
	}
	if r.cfg.Rate <= 0 {
		r.cfg.Logf("queueing %d jobs at once", total)
		for first := 0; first < total; first += buildSize {
			if err := r.createBuild(first, min(buildSize, total-first), command, q); err != nil {
				return err
			}
		}
		return nil
	}
	r.cfg.Logf("queueing %d jobs, %.2f a second: %s", total, r.cfg.Rate, arrival(total, r.cfg.Rate).Round(time.Second))
	lastLog := time.Now()
	for i := range total {
		// The schedule is fixed from the start: a job queued late does not put the next
		// ones off, as users do not wait for the operator before they push.
		if d := time.Until(from.Add(arrival(i, r.cfg.Rate))); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		if !r.op.running() {
			return fmt.Errorf("the operator exited with %d of %d jobs queued; its log ends:\n%s", i, total, r.op.tail())
		}
		if err := r.createBuild(i, 1, command, q); err != nil {
			return err
		}
		if time.Since(lastLog) > 15*time.Second {
			r.cfg.Logf("%d of %d jobs queued", i+1, total)
			lastLog = time.Now()
		}
	}
	return nil
}

// arrival is when the open loop's job i arrives, from the first.
func arrival(i int, rate float64) time.Duration {
	return time.Duration(float64(i) / rate * float64(time.Second))
}

// createBuild creates one build of n steps, numbered from first.
func (r *run) createBuild(first, n int, command string, q *queued) error {
	var b strings.Builder
	b.WriteString("steps:\n")
	for i := first; i < first+n; i++ {
		fmt.Fprintf(&b, "  - label: \"bench %d\"\n    command: %q\n    agents:\n      queue: bk-operator\n", i, command)
	}
	build, err := r.fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "bench", PipelineYAML: b.String()})
	if err != nil {
		return fmt.Errorf("creating a build: %w", err)
	}
	q.add(build.Jobs...)
	return nil
}

// tally counts the jobs that passed and the throughput, from the window's start to the
// last finish, and returns the jobs as the fake has them.
func (r *run) tally(ids []string, from time.Time) []fakebuildkite.JobSnapshot {
	jobs := make([]fakebuildkite.JobSnapshot, 0, len(ids))
	last := from
	for _, id := range ids {
		j, _ := r.fake.Job(id)
		jobs = append(jobs, j)
		if j.ExitStatus == "0" {
			r.res.Passed++
		}
		if j.FinishedAt.After(last) {
			last = j.FinishedAt
		}
	}
	r.res.Seconds = last.Sub(from).Seconds()
	r.res.JobsPerSecond = float64(len(ids)) / r.res.Seconds
	return jobs
}

// waitJobs waits until every job has ended on the fake, or the run's timeout.
func (r *run) waitJobs(ctx context.Context, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	left := ids
	lastLog := time.Now()
	for len(left) > 0 {
		var still []string
		for _, id := range left {
			if j, ok := r.fake.Job(id); !ok || !fakebuildkite.IsTerminal(j.State) {
				still = append(still, id)
			}
		}
		left = still
		if len(left) == 0 {
			break
		}
		if !r.op.running() {
			return fmt.Errorf("the operator exited with %d jobs unfinished; its log ends:\n%s", len(left), r.op.tail())
		}
		if r.sup != nil {
			if err := r.sup.failed(); err != nil {
				return fmt.Errorf("the stand-in supervisor failed with %d jobs unfinished: %w", len(left), err)
			}
		}
		if time.Since(lastLog) > 15*time.Second {
			r.cfg.Logf("%d of %d jobs finished", len(ids)-len(left), len(ids))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			j, _ := r.fake.Job(left[0])
			return fmt.Errorf("%d of %d jobs did not finish within %s (job %s is %s); the operator's log ends:\n%s",
				len(left), len(ids), r.cfg.Timeout, j.ID, j.State, r.op.tail())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}
