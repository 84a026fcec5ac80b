package buildjob_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// The tests in this file check that every wait of the controller has an end: for the
// job token, for quota, for a volume, for a supervisor that does not stop a canceled
// command, for a pod that may still start, and for a slow Buildkite.

// fastEnv is a BuildEnvironment with a one-second grace period, so that the waits that
// depend on it stay short.
const fastEnv = "fast"

func (w *world) createFastEnvironment() {
	w.t.Helper()
	require.NoError(w.t, w.c.Create(w.ctx, gen.BuildEnvironment(fastEnv,
		gen.SetBuildEnvironmentNamespace(w.ns),
		gen.SetBuildEnvironmentImage("bk-operator/job:dev"),
		gen.SetBuildEnvironmentTerminationGracePeriod(1),
	)))
}

// deleteTokenSecret deletes j's token Secret, as someone cleaning up by hand might.
func (w *world) deleteTokenSecret(j bkJob) {
	w.t.Helper()
	require.NoError(w.t, w.c.Delete(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: j.name + "-token", Namespace: w.ns}}))
}

// runningWithoutToken runs j's command, then deletes its token Secret.
func (w *world) runningWithoutToken(j bkJob) *supervisor {
	w.t.Helper()
	w.run(j.name)
	s := w.supervisor(j).write("working\n")
	w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
	w.deleteTokenSecret(j)
	return s
}

// waitPodDeleting waits until the pod has a deletion timestamp and returns when.
func (w *world) waitPodDeleting(name string) time.Time {
	w.t.Helper()
	require.Eventually(w.t, func() bool {
		pod := &corev1.Pod{}
		err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, pod)
		return err == nil && !pod.DeletionTimestamp.IsZero()
	}, waitFor, tick, "the controller did not delete pod %s", name)
	return time.Now()
}

// stopped is what a kubelet does with a deleted pod whose command never started: it
// stops what runs, and the pod fails; a container that never started stays waiting.
func stopped(pod *corev1.Pod) {
	pod.Status.Phase = corev1.PodFailed
}

// podEvent records an event about the job's pod, as a kubelet would.
func (w *world) podEvent(name, reason, message string) {
	w.t.Helper()
	pod := w.waitPod(name)
	now := metav1.Now()
	require.NoError(w.t, w.c.Create(w.ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: name + ".", Namespace: w.ns},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", Namespace: w.ns, Name: name, UID: pod.UID, APIVersion: "v1",
		},
		Reason: reason, Message: message, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "kubelet", Host: nodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}))
}

// reportedCondition is the BuildJob's Reported condition, which must exist.
func reportedCondition(t *testing.T, bj *bkv1.BuildJob) *metav1.Condition {
	t.Helper()
	c := condition(bj, bkv1.ConditionReported)
	require.NotNil(t, c, "the Reported condition")
	return c
}

// Item 3 of issue 15: a job whose token Secret is gone waits a bounded time, and a
// deleted BuildJob does not wait at all: its finalizer goes, and why Buildkite was not
// told is in its events and status (the job's log cannot say it without the token).
func TestMissingTokenSecret(t *testing.T) {
	cases := []struct {
		name    string
		timeout time.Duration
		// secret: the token Secret is created with the BuildJob.
		secret bool
		drive  func(w *world, j bkJob)
		// deleted: the drive deletes the BuildJob, which must then go.
		deleted bool
		// finished is the reason of the Finished condition of a job that is not deleted.
		finished string
	}{
		{
			name:     "never created",
			timeout:  1500 * time.Millisecond,
			drive:    func(*world, bkJob) {},
			finished: bkv1.ReasonTokenSecretMissing,
		},
		{
			name:    "never created, and the BuildJob is deleted",
			timeout: time.Minute,
			drive: func(w *world, j bkJob) {
				w.waitBuildJob(j.name, "waiting for its Secret", func(bj *bkv1.BuildJob) bool {
					c := condition(bj, bkv1.ConditionPodCreated)
					return c != nil && c.Reason == bkv1.ReasonWaitingForTokenSecret
				})
				require.NoError(w.t, w.c.Delete(w.ctx, w.buildJob(j.name)))
			},
			deleted: true,
		},
		{
			name:    "deleted while the command runs, which then ends",
			timeout: 1500 * time.Millisecond,
			secret:  true,
			drive: func(w *world, j bkJob) {
				s := w.runningWithoutToken(j)
				w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
			},
			finished: bkv1.ReasonExited,
		},
		{
			// Buildkite cannot be asked how far the job got: the pod's last sight says.
			name:    "deleted while the command runs, whose pod is then deleted with force",
			timeout: 1500 * time.Millisecond,
			secret:  true,
			drive: func(w *world, j bkJob) {
				w.runningWithoutToken(j)
				w.forceDeletePod(j.name)
			},
			finished: bkv1.ReasonPodDeleted,
		},
		{
			name:    "deleted while the command runs, and the BuildJob is deleted",
			timeout: time.Minute,
			secret:  true,
			drive: func(w *world, j bkJob) {
				s := w.runningWithoutToken(j)
				require.NoError(w.t, w.c.Delete(w.ctx, w.buildJob(j.name)))
				w.waitPodDeleting(j.name)
				w.kubelet(j.name, terminate(143, "Error", s.exited(-1, "SIGTERM", "")))
			},
			deleted: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions()
			opts.TokenWaitTimeout = tc.timeout
			w := newWorld(t, opts)
			j := w.acceptJob()
			bj := w.newBuildJob(j)
			require.NoError(t, w.c.Create(w.ctx, bj))
			if tc.secret {
				w.createTokenSecret(j)
			}
			began := time.Now()
			tc.drive(w, j)

			// Buildkite cannot be told anything without the token.
			defer func() {
				assert.Equal(t, 0, w.bkSnapshot(j.id).FinishCount, "finish calls")
			}()
			if tc.deleted {
				w.waitGone(bj)
				assert.Less(t, time.Since(began), tc.timeout/2, "a deleted BuildJob waited for the token")
				w.waitEvents(j.name, bkv1.ReasonTokenSecretMissing)
				return
			}
			got := w.waitReported(j.name)
			assert.GreaterOrEqual(t, time.Since(began), tc.timeout-time.Second, "gave up before the token wait's bound")
			fin := condition(got, bkv1.ConditionFinished)
			require.NotNil(t, fin)
			assert.Equal(t, tc.finished, fin.Reason)
			rep := reportedCondition(t, got)
			assert.Equal(t, metav1.ConditionFalse, rep.Status)
			assert.Equal(t, bkv1.ReasonTokenSecretMissing, rep.Reason)
			assert.Contains(t, rep.Message, j.name+"-token")
			assert.Contains(t, got.Status.Message, "Buildkite was not told")
			w.waitEvents(j.name, bkv1.ReasonTokenSecretMissing)
			w.waitBuildJob(j.name, "without its finalizer", func(bj *bkv1.BuildJob) bool {
				return !contains(bj.Finalizers, buildjob.Finalizer)
			})
		})
	}
}

// Item 4 of issue 15: while the command runs, the controller still asks Buildkite
// about the job, slowly. A cancel the supervisor does not act on within the pod's grace
// period (and a margin) makes the controller delete the pod and finish the job itself.
func TestCancelWhileTheCommandRuns(t *testing.T) {
	const grace = time.Second // fastEnv's
	cases := []struct {
		name string
		// supervisor acts on the cancel: the command ends in time.
		supervisor bool
	}{
		{name: "the supervisor stops the command", supervisor: true},
		{name: "the supervisor is stuck or its node gone"},
	}
	opts := testOptions()
	opts.RunningJobStateInterval = 200 * time.Millisecond
	opts.JobStatusInterval = 200 * time.Millisecond
	opts.CancelMargin = 500 * time.Millisecond
	opts.ResyncInterval = time.Hour // only the job state poll looks at a running job
	w := newWorld(t, opts)
	w.createFastEnvironment()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			w.createBuildJob(j, gen.SetBuildJobEnvironment(fastEnv))
			w.run(j.name)
			s := w.supervisor(j).write("working\n")
			w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
			canceledAt := time.Now()
			require.NoError(t, w.bk.CancelJob(j.id))

			if tc.supervisor {
				time.Sleep(300 * time.Millisecond)
				assert.False(t, podIsGoing(w, j.name), "the pod was deleted while its supervisor had time to stop the command")
				w.kubelet(j.name, terminate(0, "Completed", s.write("terminated\n").exited(-1, "SIGTERM", "cancel")))
			} else {
				deletedAt := w.waitPodDeleting(j.name)
				assert.GreaterOrEqual(t, deletedAt.Sub(canceledAt), grace, "the pod was deleted before its grace period was over")
				w.waitEvents(j.name, buildjob.EventCanceling)
			}

			bj := w.waitReported(j.name)
			assert.Equal(t, bkv1.PhaseCanceled, bj.Status.Phase)
			assert.Equal(t, bkv1.ReasonCanceled, condition(bj, bkv1.ConditionFinished).Reason)
			assert.Equal(t, "cancel", bj.Status.SignalReason)
			snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
			require.NoError(t, err)
			assert.Equal(t, fakebuildkite.StateCanceled, snap.State)
			assert.Equal(t, 1, snap.FinishCount)
			assert.Equal(t, 1, snap.StartCount, "the controller must not start a job the supervisor started")
			assert.Equal(t, "cancel", snap.SignalReason)
			log := fakebuildkite.PlainLog(snap.Log)
			if tc.supervisor {
				assert.Equal(t, "working\nterminated\n", log)
				return
			}
			assert.True(t, strings.HasPrefix(log, "working\n"), "log %q", log)
			assert.Contains(t, log, "did not stop")
			assert.Contains(t, bj.Status.Message, "did not stop")
		})
	}
	w.t = t
}

// exceededQuota makes a ResourceQuota that allows no pods, with the status the quota
// controller (which envtest does not run) would give it, so that the API server refuses
// every pod create for quota.
func (w *world) exceededQuota() {
	w.t.Helper()
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: w.ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
	}
	require.NoError(w.t, w.c.Create(w.ctx, q))
	q.Status = corev1.ResourceQuotaStatus{
		Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
		Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
	}
	require.NoError(w.t, w.c.Status().Update(w.ctx, q))
}

// failedSetup shows the pod scheduled, its containers waiting for the sandbox and its
// volumes, as a kubelet shows a pod whose volume will not mount; condition says whether
// the kubelet reports the PodReadyToStartContainers condition.
func failedSetup(condition bool) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		waiting(podcontract.JobContainer, "ContainerCreating", "")(pod)
		if condition {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
				Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now(),
			})
		}
	}
}

// volumeWillNotMount schedules the pod and shows it failing to mount a volume, with the
// message in a FailedMount event; once the controller has deleted the pod, the kubelet
// stops it.
func volumeWillNotMount(condition bool, message string) func(w *world, j bkJob) {
	return func(w *world, j bkJob) {
		w.bind(j.name)
		w.kubelet(j.name, failedSetup(condition))
		w.podEvent(j.name, "FailedMount", message)
		w.waitPodDeleting(j.name)
		w.kubelet(j.name, stopped)
	}
}

// Item 5 of issue 15: every wait before the command starts has a bound, and a cancel on
// Buildkite is noticed during each.
func TestWaitsBeforeTheCommandStartsAreBounded(t *testing.T) {
	const mountFailure = `MountVolume.SetUp failed for volume "cache" : secret "no-such-secret" not found`
	cases := []struct {
		name  string
		opts  func(*buildjob.Options)
		setup func(w *world)
		drive func(w *world, j bkJob)
		// canceled: the drive cancels the job on Buildkite, and it must end so.
		canceled bool
		reason   string
		// explanation must be in the log and the status.
		explanation []string
		noPod       bool
	}{
		{
			name:   "quota refuses the pod",
			opts:   func(o *buildjob.Options) { o.QuotaTimeout = 1500 * time.Millisecond },
			setup:  (*world).exceededQuota,
			drive:  func(*world, bkJob) {},
			reason: bkv1.ReasonPodRejected, noPod: true,
			explanation: []string{"exceeded quota", "for 1.5s"},
		},
		{
			name:  "canceled on Buildkite while waiting for quota",
			opts:  func(o *buildjob.Options) { o.QuotaTimeout = time.Minute },
			setup: (*world).exceededQuota,
			drive: func(w *world, j bkJob) {
				w.waitBuildJob(j.name, "waiting for quota", func(bj *bkv1.BuildJob) bool {
					c := condition(bj, bkv1.ConditionPodCreated)
					return c != nil && c.Reason == bkv1.ReasonWaitingForQuota
				})
				require.NoError(w.t, w.bk.CancelJob(j.id))
			},
			canceled: true, reason: bkv1.ReasonCanceled, noPod: true,
		},
		{
			name:        "a volume will not mount",
			opts:        func(o *buildjob.Options) { o.PodSetupTimeout = 1500 * time.Millisecond },
			drive:       volumeWillNotMount(true, mountFailure),
			reason:      bkv1.ReasonCreateContainerError,
			explanation: []string{"could not get ready to start its containers", mountFailure},
		},
		{
			name:        "a volume will not mount, on a kubelet without the pod condition",
			opts:        func(o *buildjob.Options) { o.PodSetupTimeout = 1500 * time.Millisecond },
			drive:       volumeWillNotMount(false, mountFailure),
			reason:      bkv1.ReasonCreateContainerError,
			explanation: []string{"could not get ready to start its containers", mountFailure},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions()
			tc.opts(&opts)
			w := newWorld(t, opts)
			if tc.setup != nil {
				tc.setup(w)
			}
			j := w.acceptJob()
			w.createBuildJob(j)
			tc.drive(w, j)
			bj := w.waitReported(j.name)
			assert.Equal(t, tc.reason, condition(bj, bkv1.ConditionFinished).Reason)
			snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
			require.NoError(t, err)
			if tc.noPod {
				assert.Empty(t, bj.Status.PodName)
			}
			if tc.canceled {
				assert.Equal(t, bkv1.PhaseCanceled, bj.Status.Phase)
				assert.Equal(t, fakebuildkite.StateCanceled, snap.State)
				return
			}
			assert.Equal(t, bkv1.PhaseFailed, bj.Status.Phase)
			assert.Equal(t, 1, snap.FinishCount)
			assert.Equal(t, "-1", snap.ExitStatus)
			assert.Equal(t, "stack_error", snap.SignalReason)
			log := fakebuildkite.PlainLog(snap.Log)
			for _, e := range tc.explanation {
				assert.Contains(t, log, e)
				assert.Contains(t, bj.Status.Message, e)
			}
		})
	}
}

// Item 7 of issue 15: a job given up before its command started is finished on
// Buildkite only once its pod has ended, so that the pod cannot start the command (or
// the supervisor the job) after the finish. A supervisor that did start meanwhile has
// the last word.
func TestNoFinishWhileThePodMayStillStart(t *testing.T) {
	cases := []struct {
		name  string
		drive func(w *world, j bkJob) *supervisor
		// end is what the kubelet shows once the controller deleted the pod.
		end          func(s *supervisor) func(*corev1.Pod)
		reason       string
		signalReason string
		log          string
		startCount   int
	}{
		{
			// The supervisor started the job an instant before the kubelet reported
			// its container running: the controller sees a cancel on Buildkite and a
			// pod that has not started.
			name: "canceled while the supervisor starts",
			drive: func(w *world, j bkJob) *supervisor {
				w.bind(j.name)
				w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
				s := w.supervisor(j).write("starting\n")
				require.NoError(w.t, w.bk.CancelJob(j.id))
				return s
			},
			end: func(s *supervisor) func(*corev1.Pod) {
				return terminate(0, "Completed", s.exited(-1, "SIGTERM", "cancel"))
			},
			reason: bkv1.ReasonCanceled, signalReason: "cancel", log: "starting\n", startCount: 1,
		},
		{
			name: "an image that will not pull",
			drive: func(w *world, j bkJob) *supervisor {
				w.bind(j.name)
				w.kubelet(j.name, waiting(podcontract.JobContainer, "ImagePullBackOff", "Back-off pulling image"))
				return nil
			},
			end:    func(*supervisor) func(*corev1.Pod) { return stopped },
			reason: bkv1.ReasonImagePullFailed, signalReason: "stack_error", startCount: 1,
		},
	}
	w := newWorld(t, testOptions())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			w.createBuildJob(j)
			s := tc.drive(w, j)
			w.waitPodDeleting(j.name)
			require.Never(t, func() bool { return w.bkSnapshot(j.id).FinishCount > 0 }, time.Second, tick,
				"the job was finished while its pod could still start the command")
			w.kubelet(j.name, tc.end(s))

			bj := w.waitReported(j.name)
			assert.Equal(t, tc.reason, condition(bj, bkv1.ConditionFinished).Reason)
			snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
			require.NoError(t, err)
			assert.Equal(t, 1, snap.FinishCount)
			assert.Equal(t, tc.startCount, snap.StartCount)
			assert.Equal(t, tc.signalReason, snap.SignalReason)
			log := fakebuildkite.PlainLog(snap.Log)
			assert.True(t, strings.HasPrefix(log, tc.log), "log %q does not start with the supervisor's %q", log, tc.log)
		})
	}
	w.t = t
}

// Item 9 of issue 15: a Buildkite that is slow to refuse the finish of some jobs holds
// no reconcile worker for long: other BuildJobs still get their pods and are reported
// promptly.
func TestSlowBuildkiteDoesNotStarveOtherJobs(t *testing.T) {
	const stuck, others = 3, 3
	const prompt = 4 * time.Second
	opts := testOptions()
	opts.MaxConcurrentReconciles = 2
	opts.BuildkiteTimeout = 300 * time.Millisecond
	opts.BuildkiteRetryInterval = 500 * time.Millisecond
	w := newWorld(t, opts)

	// Jobs whose finish Buildkite answers with 503 after a second, for as long as
	// the test lasts, and asks to be called again in an hour.
	for i := 0; i < stuck; i++ {
		j := w.acceptJob()
		w.bk.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPFinish, JobID: j.id, Status: 503, Latency: time.Second, RetryAfter: time.Hour})
		w.createBuildJob(j)
		w.run(j.name)
		s := w.supervisor(j).write(fmt.Sprintf("stuck %d\n", i))
		w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
		require.Eventually(t, func() bool { return w.bk.RequestCount(fakebuildkite.EPFinish, j.id) > 0 }, waitFor, tick,
			"the controller never tried to finish job %d", i)
	}

	for i := 0; i < others; i++ {
		j := w.acceptJob()
		created := time.Now()
		w.createBuildJob(j)
		w.waitPod(j.name)
		assert.Less(t, time.Since(created), prompt, "job %d's pod was created late", i)
		w.run(j.name)
		s := w.supervisor(j).write("fine\n")
		ended := time.Now()
		w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
		bj := w.waitReported(j.name)
		assert.Less(t, time.Since(ended), prompt, "job %d was reported late", i)
		assert.Equal(t, bkv1.ReasonReported, reportedCondition(t, bj).Reason)
	}
}
