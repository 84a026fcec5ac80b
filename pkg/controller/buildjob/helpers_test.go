package buildjob_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/seal"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

const (
	nodeName    = "node-1"
	envName     = "go"
	memoryLimit = "512Mi"
	waitFor     = 20 * time.Second
	tick        = 50 * time.Millisecond
)

// testOptions keep every wait short, so each case takes a second or two.
func testOptions() buildjob.Options {
	return buildjob.Options{
		OperatorImage:           "bk-operator/agentd:dev",
		OperatorImagePullPolicy: corev1.PullNever,
		UnschedulableTimeout:    1500 * time.Millisecond,
		ImagePullGrace:          time.Second,
		JobStatePollInterval:    200 * time.Millisecond,
		PodTerminationTimeout:   1500 * time.Millisecond,
		ResyncInterval:          2 * time.Second,
		FailedPodRetention:      time.Hour,
		AgentAPI:                agentapi.Config{WaitScale: 0.001, Timeout: 5 * time.Second},
		Webhooks:                true,
		Seal:                    seal.Fixed(testSealKey),
	}
}

// testSealKey seals the token Secrets the tests make as the spawner would.
var testSealKey = seal.NewKey([]byte("a seal key for the controller's tests, 32+ bytes"))

var namespaceSeq atomic.Int64

// world is one test's namespace, fake Buildkite and controller.
type world struct {
	t      *testing.T
	ctx    context.Context
	ns     string
	c      client.Client
	bk     *fakebuildkite.Server
	stop   context.CancelFunc
	done   chan error
	agents int
	// cfg is what the controller connects with; the test API server's admin when nil.
	cfg *rest.Config
}

// newWorld makes a namespace with a BuildEnvironment, a fake Buildkite, and a controller
// watching only that namespace.
func newWorld(t *testing.T, opts buildjob.Options) *world {
	t.Helper()
	w := prepareWorld(t)
	w.startController(opts)
	return w
}

// prepareWorld is newWorld without the controller.
func prepareWorld(t *testing.T) *world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, c: env.Client, ns: fmt.Sprintf("reaper-%d", namespaceSeq.Add(1))}
	require.NoError(t, w.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}))

	bk, err := fakebuildkite.Start(fakebuildkite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bk.Close() })
	w.bk = bk

	require.NoError(t, w.c.Create(ctx, gen.BuildEnvironment(envName,
		gen.SetBuildEnvironmentNamespace(w.ns),
		gen.SetBuildEnvironmentImage("bk-operator/job:dev"),
		gen.SetBuildEnvironmentImagePullPolicy(corev1.PullIfNotPresent),
		gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memoryLimit)},
		}),
		gen.SetBuildEnvironmentTerminationGracePeriod(5),
	)))
	return w
}

// startController runs a manager with the controller until stopController.
func (w *world) startController(opts buildjob.Options) {
	w.t.Helper()
	if opts.AgentEndpoint == "" {
		opts.AgentEndpoint = w.bk.Endpoint() // the controller talks to no other
	}
	cfg := w.cfg
	if cfg == nil {
		cfg = env.Config
	}
	copts := cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}}
	buildjob.ConfigureCache(&copts) // as agentd does
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  copts,
	})
	require.NoError(w.t, err)
	require.NoError(w.t, buildjob.Setup(mgr, opts, controller.SetupOptions{SkipNameValidation: true}))
	ctx, cancel := context.WithCancel(w.ctx)
	w.stop, w.done = cancel, make(chan error, 1)
	go func() { w.done <- mgr.Start(ctx) }()
	w.t.Cleanup(w.stopController)
}

func (w *world) stopController() {
	if w.stop == nil {
		return
	}
	stop := w.stop
	w.stop = nil
	stop()
	select {
	case err := <-w.done:
		require.NoError(w.t, err, "stopping the controller's manager")
	case <-time.After(time.Minute):
		require.Fail(w.t, "the controller's manager did not stop within a minute")
	}
}

// bkJob is one job accepted from the fake, as the spawner would.
type bkJob struct {
	id, token string
	name      string // the BuildJob's
}

// acceptJob makes a build with one command step on the fake and accepts its job with an
// agent of its own, giving the job token.
func (w *world) acceptJob() bkJob {
	w.t.Helper()
	_, err := w.bk.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline:     "my-app",
		PipelineYAML: "steps:\n  - command: make test\n    agents:\n      queue: bk-operator\n",
	})
	require.NoError(w.t, err)
	w.agents++
	reg := agentapi.New(agentapi.Config{Endpoint: w.bk.Endpoint(), Token: w.bk.RegistrationToken(), WaitScale: 0.001})
	ar, err := reg.Register(w.ctx, &api.AgentRegisterRequest{Name: fmt.Sprintf("spawner-%d", w.agents), Tags: []string{"queue=bk-operator"}})
	require.NoError(w.t, err)
	agent := reg.WithToken(ar.AccessToken)
	require.NoError(w.t, agent.Connect(w.ctx))
	var jobID string
	require.Eventually(w.t, func() bool {
		p, err := agent.Ping(w.ctx)
		if err == nil && p.Job != nil {
			jobID = p.Job.ID
		}
		return jobID != ""
	}, waitFor, tick, "the fake never offered a job")
	job, err := agent.Accept(w.ctx, jobID)
	require.NoError(w.t, err)
	return bkJob{id: job.ID, token: job.Token, name: job.ID}
}

// newBuildJob is the BuildJob the spawner would make for j, in the world's namespace and
// BuildEnvironment, reporting to the fake; then mods.
func (w *world) newBuildJob(j bkJob, mods ...gen.BuildJobModifier) *bkv1.BuildJob {
	return gen.BuildJob(j.name, append([]gen.BuildJobModifier{
		gen.SetBuildJobNamespace(w.ns),
		gen.AddBuildJobLabels(map[string]string{bkv1.LabelPipeline: "my-app"}),
		gen.SetBuildJobJobID(j.id),
		gen.SetBuildJobBuildNumber(1),
		gen.SetBuildJobEnvironment(envName),
		gen.SetBuildJobAgentEndpoint(w.bk.Endpoint()),
		gen.SetBuildJobLogLimits(bkv1.LogLimits{ChunksMaxSizeBytes: 102400, ChunksIntervalSeconds: 1}),
		gen.SetBuildJobIntake("testnonce"),
	}, mods...)...)
}

// createBuildJob makes the BuildJob and its token Secret for j.
func (w *world) createBuildJob(j bkJob, mods ...gen.BuildJobModifier) *bkv1.BuildJob {
	w.t.Helper()
	bj := w.newBuildJob(j, mods...)
	require.NoError(w.t, w.c.Create(w.ctx, bj))
	w.createTokenSecret(j)
	return bj
}

// createTokenSecret makes the Secret with j's token, as the spawner does: labelled with
// the job, owned by its BuildJob and sealed for it.
func (w *world) createTokenSecret(j bkJob) {
	w.t.Helper()
	bj := w.buildJob(j.name)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: j.name + "-token", Namespace: w.ns, Labels: map[string]string{bkv1.LabelJob: j.name}},
		Data: map[string][]byte{
			bkv1.DefaultSecretKey:   []byte(j.token),
			bkv1.TokenSecretSealKey: []byte(testSealKey.BuildJob(bj)),
		},
	}
	require.NoError(w.t, controllerutil.SetControllerReference(bj, sec, w.c.Scheme()))
	require.NoError(w.t, w.c.Create(w.ctx, sec))
}

func (w *world) buildJob(name string) *bkv1.BuildJob {
	w.t.Helper()
	bj := &bkv1.BuildJob{}
	require.NoError(w.t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, bj))
	return bj
}

// waitBuildJob waits until cond holds for the BuildJob and returns it.
func (w *world) waitBuildJob(name string, what string, cond func(*bkv1.BuildJob) bool) *bkv1.BuildJob {
	w.t.Helper()
	var bj *bkv1.BuildJob
	require.Eventually(w.t, func() bool {
		got := &bkv1.BuildJob{}
		if err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, got); err != nil {
			return false
		}
		bj = got
		return cond(got)
	}, waitFor, tick, "BuildJob %s: %s; last status: %s", name, what, statusJSON(bj))
	return bj
}

func (w *world) waitReported(name string) *bkv1.BuildJob {
	w.t.Helper()
	return w.waitBuildJob(name, "reported", func(bj *bkv1.BuildJob) bool { return bj.Status.Times.ReportedAt != nil })
}

func (w *world) waitGone(obj client.Object) {
	w.t.Helper()
	require.Eventually(w.t, func() bool {
		err := w.c.Get(w.ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err)
	}, waitFor, tick, "%T %s was not deleted", obj, obj.GetName())
}

// waitPod waits for the BuildJob's pod to exist.
func (w *world) waitPod(name string) *corev1.Pod {
	w.t.Helper()
	pod := &corev1.Pod{}
	require.Eventually(w.t, func() bool {
		return w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, pod) == nil
	}, waitFor, tick, "pod %s was not created", name)
	return pod
}

// kubelet changes the pod's status as a kubelet would; there is none in envtest.
func (w *world) kubelet(name string, change func(pod *corev1.Pod)) {
	w.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod := &corev1.Pod{}
		if err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, pod); err != nil {
			return err
		}
		change(pod)
		return w.c.Status().Update(w.ctx, pod)
	})
	require.NoError(w.t, err)
}

// bind schedules the pod onto the node, as the scheduler does.
func (w *world) bind(name string) {
	w.t.Helper()
	pod := w.waitPod(name)
	require.NoError(w.t, w.c.SubResource("binding").Create(w.ctx, pod, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}))
}

// run binds the pod and starts its containers.
func (w *world) run(name string) {
	w.t.Helper()
	if w.waitPod(name).Spec.NodeName == "" {
		w.bind(name)
	}
	w.kubelet(name, func(pod *corev1.Pod) {
		now := metav1.Now()
		pod.Status.Phase = corev1.PodRunning
		pod.Status.StartTime = &now
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{
			Name: podcontract.InstallContainer, Image: "bk-operator/agentd:dev",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
		}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: podcontract.JobContainer, Image: "bk-operator/job:dev", Ready: true, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}}
	})
}

// waiting puts a container of the pod in a waiting state.
func waiting(container, reason, message string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodPending
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: container, Image: "bk-operator/job:dev",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}},
		}}
	}
}

// terminate ends the job container with exitCode, reason and the supervisor's progress
// as its termination message.
func terminate(exitCode int32, reason string, p *jobprogress.Progress) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		msg := ""
		if p != nil {
			b, err := p.Encode()
			if err != nil {
				panic(err)
			}
			msg = string(b)
		}
		now := metav1.Now()
		started := now
		if len(pod.Status.ContainerStatuses) > 0 && pod.Status.ContainerStatuses[0].State.Running != nil {
			started = pod.Status.ContainerStatuses[0].State.Running.StartedAt
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: podcontract.JobContainer, Image: "bk-operator/job:dev",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: reason, Message: msg, StartedAt: started, FinishedAt: now,
			}},
		}}
	}
}

// supervisor does what agentd supervise does with the job token: start the job and send
// output as log chunks. It returns the progress it would record.
type supervisor struct {
	w        *world
	job      bkJob
	progress jobprogress.Progress
}

func (w *world) supervisor(j bkJob) *supervisor {
	s := &supervisor{w: w, job: j}
	bk := s.client()
	require.NoError(w.t, bk.Start(w.ctx, j.id, time.Now()))
	s.progress.Started = true
	return s
}

func (s *supervisor) client() *agentapi.Client {
	return agentapi.New(agentapi.Config{Endpoint: s.w.bk.Endpoint(), Token: s.job.token, WaitScale: 0.001})
}

func (s *supervisor) write(text string) *supervisor {
	s.w.t.Helper()
	seq := s.progress.Sequence + 1
	require.NoError(s.w.t, s.client().UploadChunk(s.w.ctx, s.job.id, seq, s.progress.Offset, []byte(text)))
	s.progress.Sequence = seq
	s.progress.Offset += uint64(len(text))
	return s
}

func (s *supervisor) exited(status int, signal, reason string) *jobprogress.Progress {
	p := s.progress
	p.Exited, p.ExitStatus, p.Signal, p.SignalReason, p.Flushed = true, status, signal, reason, true
	return &p
}

// finished is the progress of a supervisor that finished the job on Buildkite itself
// once its command had exited with status and its output was sent.
func (s *supervisor) finished(status int) *jobprogress.Progress {
	s.w.t.Helper()
	require.NoError(s.w.t, s.client().Finish(s.w.ctx, s.job.id, agentapi.Finish{ExitStatus: status}))
	p := s.exited(status, "", "")
	p.Finished = true
	return p
}

// killedNow is the progress of a supervisor killed mid-job.
func (s *supervisor) killedNow() *jobprogress.Progress {
	p := s.progress
	return &p
}

func (w *world) bkSnapshot(id string) fakebuildkite.JobSnapshot {
	w.t.Helper()
	snap, ok := w.bk.Job(id)
	require.True(w.t, ok, "fake has no job %s", id)
	return snap
}

// events lists the reasons of the events about the BuildJob.
func (w *world) eventReasons(name string) []string {
	w.t.Helper()
	var list corev1.EventList
	require.NoError(w.t, w.c.List(w.ctx, &list, client.InNamespace(w.ns)))
	var reasons []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "BuildJob" && e.InvolvedObject.Name == name {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

func (w *world) waitEvents(name string, want ...string) {
	w.t.Helper()
	var got []string
	require.Eventually(w.t, func() bool {
		got = w.eventReasons(name)
		for _, r := range want {
			if !contains(got, r) {
				return false
			}
		}
		return true
	}, waitFor, tick, "events of BuildJob %s: want %v, got %v", name, want, got)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func statusJSON(bj *bkv1.BuildJob) string {
	if bj == nil {
		return "<none>"
	}
	b, _ := json.Marshal(bj.Status)
	return string(b)
}

func podIsGoing(w *world, name string) bool {
	pod := &corev1.Pod{}
	err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, pod)
	if apierrors.IsNotFound(err) {
		return true
	}
	return err == nil && !pod.DeletionTimestamp.IsZero() && !contains(pod.Finalizers, podbuilder.PodFinalizer)
}

func ptr[T any](v T) *T { return &v }

func agentapiFinish(status int) agentapi.Finish {
	return agentapi.Finish{ExitStatus: status}
}

// gatherMetrics sums each metric of the controller-runtime registry: counter values and
// histogram sample counts.
func gatherMetrics(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				out[f.GetName()] += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[f.GetName()] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// forceDeleteRunningPod lets j's command run and print, then deletes its pod with force, as
// a person with --force or the pod garbage collector would: no termination message and
// no container status after running are ever seen.
func (w *world) forceDeleteRunningPod(j bkJob) {
	w.t.Helper()
	w.run(j.name)
	w.supervisor(j).write("working\n")
	w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
	w.forceDeletePod(j.name)
}
