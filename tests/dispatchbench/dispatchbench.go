// Package dispatchbench measures how long a job waits between Buildkite dispatching it and
// a slot accepting it (dispatch → accepted: the fake's accepted_at minus the job's
// created_at), with the JobSpawner running in this process against a real API server
// (envtest) and the fake Buildkite. Polling (--ping-mode ping-only), a job waits for the
// next ping of an idle slot; streaming (auto), it is pushed to one at once.
//
// It is one implementation for two callers: pkg/spawner's TestDispatchLatency (a short
// check that streaming takes every job from the push) and the bench (tests/bench, `make
// bench`: the figures of docs/performance.md, "Streaming dispatch"). It lives apart from
// tests/bench so that the spawner's tests do not build the kwok bench with it.
package dispatchbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner/spawnertest"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// Setup is what one measurement runs: the ping interval the fake hands the slots, the
// slots, and the jobs, each a one-step build created a random gap after the last.
type Setup struct {
	// PingInterval is the ping interval in whole seconds: Buildkite's is 10.
	PingInterval int
	Slots, Jobs  int
	// MinGap and MaxGap bound the random time between two jobs' creation.
	MinGap, MaxGap time.Duration
	// Hold is the most a job "runs" before the stand-in controller reports it.
	Hold time.Duration
}

// Full is issue 27's measurement: Buildkite's ping interval, 8 slots, 20 jobs arriving
// 2-6 s apart. About 80 s of arrivals per ping mode.
var Full = Setup{PingInterval: 10, Slots: 8, Jobs: 20, MinGap: 2 * time.Second, MaxGap: 6 * time.Second, Hold: time.Second}

// Short is the same with 5 jobs arriving 0.5-1.5 s apart: enough to see whether the
// stream delivers every job, in a few seconds.
var Short = Setup{PingInterval: 10, Slots: 8, Jobs: 5, MinGap: 500 * time.Millisecond, MaxGap: 1500 * time.Millisecond, Hold: time.Second}

// String says the setup as the tables do: "ping interval 10 s, 8 slots, 20 jobs 2-6 s apart".
func (s Setup) String() string {
	sec := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }
	return fmt.Sprintf("ping interval %d s, %d slots, %d jobs %s-%s s apart", s.PingInterval, s.Slots, s.Jobs, sec(s.MinGap), sec(s.MaxGap))
}

func (s Setup) validate() error {
	switch {
	case s.PingInterval < 1:
		return fmt.Errorf("dispatch setup: ping interval %d s: give at least 1 s", s.PingInterval)
	case s.Slots < 1 || s.Jobs < 1:
		return fmt.Errorf("dispatch setup: %d slots and %d jobs: give at least one of each", s.Slots, s.Jobs)
	case s.MinGap < 0 || s.MaxGap < s.MinGap:
		return fmt.Errorf("dispatch setup: gaps %s-%s: give 0 ≤ the least ≤ the most", s.MinGap, s.MaxGap)
	}
	return nil
}

// Job is one job's dispatch.
type Job struct {
	ID string
	// Wait is dispatch → accepted.
	Wait time.Duration
	// AcceptedVia is the offer the slot took: fakebuildkite.ViaPing or ViaStream.
	AcceptedVia string
	// Accepts counts the job's accept calls: 1, or a slot accepted it twice.
	Accepts int
}

// Run is one measurement in one ping mode.
type Run struct {
	PingMode string
	Setup    Setup
	Jobs     []Job
}

// Waits are the jobs' dispatch → accepted, in the jobs' order.
func (r *Run) Waits() []time.Duration {
	out := make([]time.Duration, len(r.Jobs))
	for i, j := range r.Jobs {
		out[i] = j.Wait
	}
	return out
}

// FromPing counts the jobs a slot took from a ping's answer rather than the stream's push.
func (r *Run) FromPing() int {
	n := 0
	for _, j := range r.Jobs {
		if j.AcceptedVia != fakebuildkite.ViaStream {
			n++
		}
	}
	return n
}

// Check says what went wrong with the dispatch itself, whatever it took: a job accepted
// more than once, or, streaming, a job taken from a ping rather than from the push (the
// stream was down, or the push was lost, and the figure would be polling's).
func (r *Run) Check() error {
	var errs []error
	for _, j := range r.Jobs {
		if j.Accepts != 1 {
			errs = append(errs, fmt.Errorf("job %s was accepted %d times, not once", j.ID, j.Accepts))
		}
		if r.PingMode == spawner.PingModeAuto && j.AcceptedVia != fakebuildkite.ViaStream {
			errs = append(errs, fmt.Errorf("job %s was taken from a %q, not from the stream's push", j.ID, j.AcceptedVia))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s, %s: %w", r.PingMode, r.Setup, errors.Join(errs...))
	}
	return nil
}

// registrationToken is the fake's, and the one the spawner reads from its file.
const registrationToken = "dispatch-registration-token"

// Measure runs s through a spawner in pingMode (spawner.PingModeAuto or PingModePingOnly)
// on env's API server, in a namespace of its own, and returns every job's dispatch →
// accepted. Everything it starts is stopped before it returns. log receives the
// spawner's log.
func Measure(ctx context.Context, env *testenv.Env, s Setup, pingMode string, log logr.Logger) (*Run, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ns, err := newNamespace(ctx, env)
	if err != nil {
		return nil, err
	}
	fake, err := fakebuildkite.Start(fakebuildkite.Options{RegistrationToken: registrationToken, PingInterval: s.PingInterval})
	if err != nil {
		return nil, fmt.Errorf("starting the fake Buildkite: %w", err)
	}
	defer func() { _ = fake.Close() }()

	rep := &spawnertest.Reporter{Client: env.Client, Namespace: ns, Hold: s.Hold}
	repDone := make(chan struct{})
	go func() { defer close(repDone); rep.Run(ctx) }()
	defer func() { cancel(); <-repDone }()

	stopSpawner, spawnerErr, err := startSpawner(ctx, env, fake, ns, s.Slots, pingMode, log)
	if err != nil {
		return nil, err
	}
	defer stopSpawner()
	// explain adds why the spawner or the stand-in controller failed to a wait that did.
	explain := func(err error) error {
		select {
		case serr := <-spawnerErr:
			return fmt.Errorf("%w (the spawner stopped: %v)", err, serr)
		default:
		}
		if rerrs := rep.Errors(); len(rerrs) > 0 {
			return fmt.Errorf("%w (the stand-in controller: %w)", err, errors.Join(rerrs...))
		}
		return err
	}

	ready := func() bool {
		n := 0
		for _, a := range fake.Agents() {
			if a.Connected && (pingMode != spawner.PingModeAuto || a.Streaming) {
				n++
			}
		}
		return n == s.Slots
	}
	if err := waitFor(ctx, 20*time.Second, func(ctx context.Context) error { return fake.WaitFor(ctx, ready) }); err != nil {
		return nil, explain(fmt.Errorf("%d slots (%s) never all connected: %w", s.Slots, pingMode, err))
	}
	// Past each slot's first ping, or its stream's first word: a job is then dispatched
	// to slots in their steady state.
	if err := sleep(ctx, time.Second); err != nil {
		return nil, err
	}

	yaml := "steps:\n  - label: dispatch\n    command: echo dispatch\n    agents: {queue: " + spawner.DefaultQueue + "}\n" +
		"    plugins:\n      - buildkite-operator#v0.1.0:\n          build_environment: " + buildEnvironment + "\n"
	ids := make([]string, 0, s.Jobs)
	for i := range s.Jobs {
		if i > 0 {
			gap := s.MinGap
			if s.MaxGap > s.MinGap {
				gap += rand.N(s.MaxGap - s.MinGap)
			}
			if err := sleep(ctx, gap); err != nil {
				return nil, err
			}
		}
		b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "dispatch", PipelineYAML: yaml})
		if err != nil {
			return nil, fmt.Errorf("creating build %d of %d: %w", i+1, s.Jobs, err)
		}
		ids = append(ids, b.Jobs[0])
	}

	run := &Run{PingMode: pingMode, Setup: s}
	finished := func(j fakebuildkite.JobSnapshot) bool { return j.State == fakebuildkite.StateFinished }
	for _, id := range ids {
		var j fakebuildkite.JobSnapshot
		err := waitFor(ctx, 2*time.Minute, func(ctx context.Context) (err error) { j, err = fake.WaitJob(ctx, id, finished); return err })
		if err != nil {
			return nil, explain(fmt.Errorf("job %s never finished: %w", id, err))
		}
		run.Jobs = append(run.Jobs, Job{ID: id, Wait: j.AcceptedAt.Sub(j.CreatedAt), AcceptedVia: j.AcceptedVia, Accepts: j.AcceptCount})
	}
	return run, nil
}

// buildEnvironment is the BuildEnvironment each namespace has and each job names.
const buildEnvironment = "go"

func newNamespace(ctx context.Context, env *testenv.Env) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "dispatch-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("creating a namespace: %w", err)
	}
	be := gen.BuildEnvironment(buildEnvironment)
	be.Namespace = ns.Name
	if err := env.Client.Create(ctx, be); err != nil {
		return "", fmt.Errorf("creating BuildEnvironment %s/%s: %w", ns.Name, be.Name, err)
	}
	return ns.Name, nil
}

// startSpawner runs a spawner of slots over a cache of ns, as agentd's manager would.
// stop stops it as SIGTERM would and waits for it; errc has Start's error if it returned
// before stop.
func startSpawner(ctx context.Context, env *testenv.Env, fake *fakebuildkite.Server, ns string, slots int, pingMode string, log logr.Logger) (stop func(), errc <-chan error, err error) {
	dir, err := os.MkdirTemp("", "dispatchbench-")
	if err != nil {
		return nil, nil, err
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(registrationToken+"\n"), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		cancel()
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("cache of namespace %s: %w", ns, err)
	}
	cacheDone := make(chan struct{})
	go func() { defer close(cacheDone); _ = c.Start(ctx) }()
	sp, err := spawner.New(spawner.Config{
		Name:                  "bk-dispatch",
		Namespace:             ns,
		Endpoint:              fake.Endpoint(),
		Slots:                 slots,
		PingMode:              pingMode,
		RegistrationTokenFile: tokenFile,
		CreateTimeout:         5 * time.Second,
		Cache:                 c,
		APIReader:             env.Client,
		APIWaitScale:          0.01,
		Log:                   log,
	}, env.Client)
	if err != nil {
		cancel()
		<-cacheDone
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("a spawner of %d slots, %s: %w", slots, pingMode, err)
	}
	errs := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sp.Start(ctx); err != nil {
			errs <- err
		}
	}()
	return func() {
		cancel()
		<-done
		sp.StopHeartbeats()
		<-cacheDone
		_ = os.RemoveAll(dir)
	}, errs, nil
}

// waitFor runs wait with a deadline timeout from now.
func waitFor(ctx context.Context, timeout time.Duration, wait func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := wait(ctx); err != nil {
		return fmt.Errorf("after %s: %w", timeout, err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
