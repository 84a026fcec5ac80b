package buildjob_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// The tests in this file check what the pipeline's authors see on the Buildkite job while
// its pod waits: an annotation on the job that says what for, written once per reason,
// and gone when the command starts or the job ends.

// waitContext is the context of the annotation that shows what job id waits for.
func waitContext(id string) string { return "buildkite-operator-waiting-" + id }

// jobAnnotation is the job-scoped annotation of context on the fake's job, if there is one.
func (w *world) jobAnnotation(id, context string) (fakebuildkite.Annotation, bool) {
	for _, a := range w.bkSnapshot(id).Annotations {
		if a.Context == context {
			return a, true
		}
	}
	return fakebuildkite.Annotation{}, false
}

// waitAnnotation waits until the job shows an annotation of context whose body has every
// one of want, and returns it.
func (w *world) waitAnnotation(id, context string, want ...string) fakebuildkite.Annotation {
	w.t.Helper()
	var got fakebuildkite.Annotation
	require.Eventually(w.t, func() bool {
		a, ok := w.jobAnnotation(id, context)
		got = a
		if !ok {
			return false
		}
		for _, s := range want {
			if !strings.Contains(a.Body, s) {
				return false
			}
		}
		return true
	}, waitFor, tick, "job %s shows no annotation %q with %q; last: %+v", id, context, want, got)
	return got
}

// annotationCalls counts the annotation calls with method the fake took for job id.
func (w *world) annotationCalls(id, method string) int {
	n := 0
	for _, r := range w.bk.Requests() {
		if r.Endpoint == fakebuildkite.EPAnnotations && r.JobID == id && r.Method == method && r.Status/100 == 2 {
			n++
		}
	}
	return n
}

// pullEvent records a kubelet's event about the image of a container of the pod.
func (w *world) pullEvent(name, container, reason, message string) {
	w.t.Helper()
	w.pullEventAt(name, container, reason, message, time.Now())
}

// pullEventAt is pullEvent, as if it happened at at.
func (w *world) pullEventAt(name, container, reason, message string, at time.Time) {
	w.t.Helper()
	pod := w.waitPod(name)
	now := metav1.NewTime(at)
	require.NoError(w.t, w.c.Create(w.ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: name + ".", Namespace: w.ns},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", Namespace: w.ns, Name: name, UID: pod.UID, APIVersion: "v1",
			FieldPath: "spec.containers{" + container + "}",
		},
		Reason: reason, Message: message, Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "kubelet", Host: nodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}))
}

// unschedulableNow shows the pod as the scheduler does when no node can take it.
func unschedulableNow(message string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodPending
		pod.Status.Conditions = []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: message, LastTransitionTime: metav1.Now(),
		}}
	}
}

// creating shows the pod on its node with its sandbox ready and its job container being
// created, as while its image is pulled.
func creating(pod *corev1.Pod) {
	waiting(podcontract.JobContainer, "ContainerCreating", "")(pod)
	pod.Status.Conditions = []corev1.PodCondition{{
		Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
	}}
}

// crashLooping shows the pod's sidecar failing over and over, its job container waiting.
func crashLooping(sidecar string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		now := metav1.Now()
		pod.Status.Phase = corev1.PodPending
		pod.Status.Conditions = []corev1.PodCondition{{
			Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: now,
		}}
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{
			{Name: podcontract.InstallContainer, Image: "bk-operator/agentd:dev",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}},
			{Name: sidecar, Image: "postgres:17", RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", StartedAt: now, FinishedAt: now}}},
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: podcontract.JobContainer, Image: "bk-operator/job:dev",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
		}}
	}
}

// Issue 14, what the author sees while the pod waits: each wait of a pod before its
// command starts shows on the Buildkite job as an annotation of its own, written once
// however many reconciles see the same wait, and removed when the command starts.
func TestWaitsShowOnTheBuildkiteJob(t *testing.T) {
	const sidecarEnv = "with-db"
	cases := []struct {
		name string
		env  string
		// wait makes the pod (or its create) wait.
		wait func(w *world, j bkJob)
		// unwait lets the pod be created, where the wait kept it from being.
		unwait func(w *world)
		reason string
		style  string
		text   []string
		// notStarted: the notice may go before the command starts, once the pod is
		// created or scheduled.
		notStarted bool
	}{
		{
			name: "no node can take the pod",
			wait: func(w *world, j bkJob) {
				w.waitPod(j.name)
				w.kubelet(j.name, unschedulableNow("0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."))
			},
			reason: bkv1.ReasonWaitingForNode, style: "warning",
			text:       []string{"Waiting for a node: 0/1 nodes are available: 1 Insufficient cpu.", `BuildEnvironment "go"`, "within 1 minute"},
			notStarted: true,
		},
		{
			name: "an image is being pulled",
			wait: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, creating)
				w.pullEvent(j.name, podcontract.JobContainer, "Pulling", `Pulling image "bk-operator/job:dev"`)
			},
			reason: bkv1.ReasonPullingImage, style: "info",
			text: []string{"Pulling image bk-operator/job:dev (started "},
		},
		{
			name: "an image cannot be pulled",
			wait: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, waiting(podcontract.JobContainer, "ErrImagePull", `failed to pull and unpack image "bk-operator/job:dev": not found`))
			},
			reason: bkv1.ReasonImagePullFailing, style: "warning",
			text: []string{`Image bk-operator/job:dev cannot be pulled: ErrImagePull: failed to pull and unpack image "bk-operator/job:dev": not found.`, "1 minute"},
		},
		{
			// The kubelet records the failed pull as an event before (sometimes well
			// before, on a busy node) it writes the container's ErrImagePull status: the
			// notice follows the event, with the same text the status gives.
			name: "an image cannot be pulled, as yet only in the kubelet's event",
			wait: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, creating)
				// The failure first, so that no reconcile in between shows the pull as
				// going on: this case is about one wait, the failing pull.
				now := time.Now()
				w.pullEventAt(j.name, podcontract.JobContainer, "Failed", `Failed to pull image "bk-operator/job:dev": failed to pull and unpack image "bk-operator/job:dev": not found`, now.Add(time.Second))
				w.pullEventAt(j.name, podcontract.JobContainer, "Pulling", `Pulling image "bk-operator/job:dev"`, now)
				// What the kubelet says next, in the same second and after: the failure
				// is still what the notice shows.
				w.pullEventAt(j.name, podcontract.JobContainer, "Failed", "Error: ErrImagePull", now.Add(time.Second))
				w.pullEventAt(j.name, podcontract.JobContainer, "BackOff", `Back-off pulling image "bk-operator/job:dev"`, now.Add(2*time.Second))
			},
			reason: bkv1.ReasonImagePullFailing, style: "warning",
			text: []string{`Image bk-operator/job:dev cannot be pulled: ErrImagePull: failed to pull and unpack image "bk-operator/job:dev": not found.`, "1 minute"},
		},
		{
			name: "a ResourceQuota refuses the pod",
			wait: func(w *world, _ bkJob) { w.exceededQuota() },
			unwait: func(w *world) {
				require.NoError(w.t, w.c.Delete(w.ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: w.ns}}))
			},
			reason: bkv1.ReasonWaitingForQuota, style: "warning",
			text:       []string{"Waiting for quota: Kubernetes refuses the job's pod for now (exceeded quota: no-pods", "1 minute"},
			notStarted: true,
		},
		{
			name: "a volume will not mount",
			wait: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, failedSetup(true))
				w.podEvent(j.name, "FailedMount", `MountVolume.SetUp failed for volume "cache" : secret "no-such-secret" not found`)
			},
			reason: bkv1.ReasonPodSetupFailing, style: "warning",
			text: []string{`FailedMount: MountVolume.SetUp failed for volume "cache" : secret "no-such-secret" not found.`},
		},
		{
			name: "a sidecar keeps failing",
			env:  sidecarEnv,
			wait: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, crashLooping("db"))
			},
			reason: bkv1.ReasonInitContainerFailing, style: "warning",
			text: []string{`Container "db" keeps failing (exit code 1)`, sidecarEnv},
		},
	}
	opts := testOptions()
	for _, o := range []*time.Duration{&opts.UnschedulableTimeout, &opts.ImagePullGrace, &opts.QuotaTimeout, &opts.PodSetupTimeout} {
		*o = time.Minute // the waits last while the test looks
	}
	w := newWorld(t, opts)
	require.NoError(t, w.c.Create(w.ctx, gen.BuildEnvironment(sidecarEnv,
		gen.SetBuildEnvironmentNamespace(w.ns),
		gen.SetBuildEnvironmentImage("bk-operator/job:dev"),
		gen.SetBuildEnvironmentSidecars(corev1.Container{Name: "db", Image: "postgres:17"}),
	)))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			defer func() { w.t = t }()
			j := w.acceptJob()
			env := envName
			if tc.env != "" {
				env = tc.env
			}
			if tc.unwait != nil {
				tc.wait(w, j) // before the BuildJob: its first create is refused
				w.createBuildJob(j, gen.SetBuildJobEnvironment(env))
			} else {
				w.createBuildJob(j, gen.SetBuildJobEnvironment(env))
				tc.wait(w, j)
			}

			a := w.waitAnnotation(j.id, waitContext(j.id), tc.text...)
			assert.Equal(t, tc.style, a.Style)
			b, _ := w.bk.Build(w.bkSnapshot(j.id).BuildID)
			assert.Empty(t, b.Annotations, "the notice is the job's, not the build's")
			bj := w.waitBuildJob(j.name, "showing the wait", func(bj *bkv1.BuildJob) bool {
				c := condition(bj, bkv1.ConditionWaitShown)
				return c != nil && c.Status == metav1.ConditionTrue
			})
			shown := condition(bj, bkv1.ConditionWaitShown)
			assert.Equal(t, tc.reason, shown.Reason)
			assert.Equal(t, a.Body, shown.Message)

			// Reconciles go on every 200 ms (the job state poll) while the pod waits; the
			// notice is not written again.
			time.Sleep(time.Second)
			assert.Equal(t, 1, w.annotationCalls(j.id, http.MethodPost), "annotation writes for one wait")

			if tc.unwait != nil {
				tc.unwait(w)
			}
			w.run(j.name)
			bj = w.waitBuildJob(j.name, "no longer showing the wait", func(bj *bkv1.BuildJob) bool {
				c := condition(bj, bkv1.ConditionWaitShown)
				return c != nil && c.Status == metav1.ConditionFalse && c.Reason == bkv1.ReasonWaitOver
			})
			if !tc.notStarted {
				assert.Equal(t, "The job's command started.", condition(bj, bkv1.ConditionWaitShown).Message)
			}
			_, still := w.jobAnnotation(j.id, waitContext(j.id))
			assert.False(t, still, "the notice is gone once the command started")
			assert.Equal(t, 1, w.annotationCalls(j.id, http.MethodDelete), "annotation removals")

			s := w.supervisor(j).write("ok\n")
			w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
			w.waitReported(j.name)
			assert.Equal(t, 1, w.bkSnapshot(j.id).FinishCount)
			assert.Equal(t, 1, w.annotationCalls(j.id, http.MethodPost), "annotation writes")
			assert.Equal(t, 1, w.annotationCalls(j.id, http.MethodDelete), "annotation removals")
		})
	}
}

// The notice follows the wait: a new reason replaces it, a wait that ends without the
// command starting (the pod was scheduled) removes it, and a job that ends before its
// command started leaves none behind.
func TestWaitNoticeFollowsTheWait(t *testing.T) {
	opts := testOptions()
	opts.UnschedulableTimeout = time.Minute
	opts.ImagePullGrace = 2 * time.Second
	w := newWorld(t, opts)
	j := w.acceptJob()
	w.createBuildJob(j)

	w.waitPod(j.name)
	w.kubelet(j.name, unschedulableNow("0/1 nodes are available: 1 node(s) had untolerated taint."))
	w.waitAnnotation(j.id, waitContext(j.id), "Waiting for a node")

	// Scheduled: nothing unusual is waited for, so nothing shows.
	w.bind(j.name)
	w.kubelet(j.name, func(pod *corev1.Pod) {
		creating(pod)
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
	})
	require.Eventually(t, func() bool {
		_, ok := w.jobAnnotation(j.id, waitContext(j.id))
		return !ok
	}, waitFor, tick, "the notice of a wait that is over stays")

	// The image cannot be pulled: shown, and the job fails after the grace.
	w.kubelet(j.name, waiting(podcontract.JobContainer, "ImagePullBackOff", `Back-off pulling image "bk-operator/job:dev": ErrImagePull: not found`))
	a := w.waitAnnotation(j.id, waitContext(j.id), "cannot be pulled: ErrImagePull: not found.")
	assert.Equal(t, "warning", a.Style)
	// The kubelet alternates between the two reasons while it retries: one notice.
	w.kubelet(j.name, waiting(podcontract.JobContainer, "ErrImagePull", "not found"))
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, 2, w.annotationCalls(j.id, http.MethodPost), "writes: the node wait, then the image")

	w.waitPodDeleting(j.name)
	w.kubelet(j.name, stopped)
	bj := w.waitReported(j.name)
	assert.Equal(t, bkv1.ReasonImagePullFailed, condition(bj, bkv1.ConditionFinished).Reason)
	_, still := w.jobAnnotation(j.id, waitContext(j.id))
	assert.False(t, still, "a job that ended keeps the notice of what it waited for")
	c := condition(bj, bkv1.ConditionWaitShown)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, "The job ended.", c.Message)
	snap := w.bkSnapshot(j.id)
	assert.Equal(t, 1, snap.FinishCount)
	assert.Contains(t, fakebuildkite.PlainLog(snap.Log), "could not be pulled", "the log still explains the end")
}

// A Buildkite that fails the annotation calls does not hold the job up: the notice is
// tried again later, and the command still starts and the job finishes.
func TestWaitNoticeDoesNotHoldTheJob(t *testing.T) {
	opts := testOptions()
	opts.UnschedulableTimeout = time.Minute
	opts.BuildkiteTimeout = 500 * time.Millisecond
	w := newWorld(t, opts)
	w.bk.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPAnnotations, Status: http.StatusServiceUnavailable, Message: "down"})
	j := w.acceptJob()
	w.createBuildJob(j)
	w.waitPod(j.name)
	w.kubelet(j.name, unschedulableNow("0/1 nodes are available: 1 Insufficient memory."))
	require.Eventually(t, func() bool { return w.bk.RequestCount(fakebuildkite.EPAnnotations, j.id) >= 2 }, waitFor, tick,
		"the notice was not tried, or not tried again")
	w.bk.ClearFaults()
	w.waitAnnotation(j.id, waitContext(j.id), "Insufficient memory")

	w.run(j.name)
	s := w.supervisor(j).write("ok\n")
	w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
	bj := w.waitReported(j.name)
	assert.Equal(t, bkv1.PhaseSucceeded, bj.Status.Phase)
	_, still := w.jobAnnotation(j.id, waitContext(j.id))
	assert.False(t, still)
}

// A reconcile handed a stale BuildJob by a lagging cache, one that does not yet show the
// notice the last reconcile wrote, writes nothing more to Buildkite: the notice is written
// once per change of what the job waits for (a loaded machine posted it twice). The status
// it could not see is written again, or read again after a conflict.
func TestWaitNoticeOnceFromAStaleBuildJob(t *testing.T) {
	w := prepareWorld(t)
	j := w.acceptJob()
	w.createBuildJob(j)
	opts := testOptions()
	opts.AgentEndpoint = w.bk.Endpoint()
	r := buildjob.NewReconcilerForTest(w.c, opts)

	stale := w.buildJob(j.name)
	const text = "Waiting for a node: 0/1 nodes are available."
	require.NoError(t, r.ShowWaitForTest(w.ctx, stale.DeepCopy(), bkv1.ReasonWaitingForNode, text))
	require.Equal(t, 1, w.annotationCalls(j.id, http.MethodPost))

	err := r.ShowWaitForTest(w.ctx, stale.DeepCopy(), bkv1.ReasonWaitingForNode, text)
	if err != nil {
		assert.True(t, apierrors.IsConflict(err), "the stale copy's status write: %v", err)
	}
	assert.Equal(t, 1, w.annotationCalls(j.id, http.MethodPost), "the same notice was posted again from a stale BuildJob")

	fresh := w.buildJob(j.name)
	require.NoError(t, r.ShowWaitForTest(w.ctx, fresh, bkv1.ReasonWaitingForNode, text))
	assert.Equal(t, 1, w.annotationCalls(j.id, http.MethodPost))
	c := condition(fresh, bkv1.ConditionWaitShown)
	require.NotNil(t, c)
	assert.Equal(t, text, c.Message)

	// A new wait is posted, even from a copy that still shows the old one.
	const image = "The image cannot be pulled."
	require.NoError(t, r.ShowWaitForTest(w.ctx, w.buildJob(j.name), bkv1.ReasonImagePullFailing, image))
	assert.Equal(t, 2, w.annotationCalls(j.id, http.MethodPost))
	w.waitAnnotation(j.id, waitContext(j.id), image)
}
