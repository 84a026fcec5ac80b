package buildjob_test

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// BK_TEST_LOG=1 shows the controller's log.
	out := io.Discard
	if os.Getenv("BK_TEST_LOG") != "" {
		out = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(out)))
	testenv.Run(m, &env)
}

// endCase is one way a job ends: how the pod and the supervisor behave, and what Buildkite
// and the BuildJob must show afterwards.
type endCase struct {
	name   string
	change gen.BuildJobModifier
	drive  func(w *world, j bkJob)

	phase        bkv1.BuildJobPhase
	reason       string // of the Finished condition
	exitStatus   string
	signal       string
	signalReason string
	// supervisorLog is what the supervisor sent; the log must start with it exactly.
	supervisorLog string
	// explanation are pieces of text that must follow it, in the log and in the status.
	explanation []string
	noPod       bool
	// progressLost: the supervisor's record went with the pod, so the status cannot
	// count the log's bytes.
	progressLost bool
}

func TestJobEnds(t *testing.T) {
	cases := []endCase{
		{
			name: "command exits 0",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("hello\n").write("world\n")
				w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
			},
			phase: bkv1.PhaseSucceeded, reason: bkv1.ReasonExited, exitStatus: "0",
			supervisorLog: "hello\nworld\n",
		},
		{
			name: "command exits 3",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("FAIL: TestSomething\n")
				w.kubelet(j.name, terminate(0, "Completed", s.exited(3, "", "")))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonExited, exitStatus: "3",
			supervisorLog: "FAIL: TestSomething\n",
		},
		{
			name: "canceled on Buildkite, handled by the supervisor",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("sleeping\n")
				require.NoError(w.t, w.bk.CancelJob(j.id))
				w.kubelet(j.name, terminate(0, "Completed", s.exited(-1, "SIGTERM", "cancel")))
			},
			phase: bkv1.PhaseCanceled, reason: bkv1.ReasonCanceled, exitStatus: "-1", signal: "SIGTERM", signalReason: "cancel",
			supervisorLog: "sleeping\n",
		},
		{
			name: "OOM killed while running",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("allocating\n")
				w.kubelet(j.name, terminate(137, "OOMKilled", s.killedNow()))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonOOMKilled, exitStatus: "-1", signal: "SIGKILL",
			supervisorLog: "allocating\n",
			explanation:   []string{"ran out of memory", "memory limit of " + memoryLimit},
		},
		{
			name: "OOM killed before the job started",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.kubelet(j.name, terminate(137, "OOMKilled", nil))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonOOMKilled, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{"ran out of memory"},
		},
		{
			// The runtime can miss the OOM event and report a plain exit code 137.
			name: "SIGKILLed with no reason given",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("allocating\n")
				w.kubelet(j.name, terminate(137, "Error", s.killedNow()))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonPodFailed, exitStatus: "-1", signal: "SIGKILL",
			supervisorLog: "allocating\n",
			explanation:   []string{"exit code 137 (SIGKILL) before the supervisor recorded", "OOM killer", "memory limit of " + memoryLimit},
		},
		{
			name: "image cannot be pulled",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, waiting(podcontract.JobContainer, "ImagePullBackOff", `Back-off pulling image "bk-operator/job:dev"`))
				// The job is finished once the kubelet has stopped the pod.
				w.waitPodDeleting(j.name)
				w.kubelet(j.name, stopped)
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonImagePullFailed, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{`The image "bk-operator/job:dev" of container "job" could not be pulled (ImagePullBackOff: Back-off pulling image`},
		},
		{
			name: "invalid image name",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, waiting(podcontract.JobContainer, "InvalidImageName", `couldn't parse image name "Bad Image"`))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonInvalidImage, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{"is not a valid image reference", `couldn't parse image name "Bad Image"`},
		},
		{
			name: "unschedulable",
			drive: func(w *world, j bkJob) {
				w.waitPod(j.name)
				w.kubelet(j.name, func(pod *corev1.Pod) {
					pod.Status.Phase = corev1.PodPending
					pod.Status.Conditions = []corev1.PodCondition{{
						Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
						Message: "0/3 nodes are available: 3 Insufficient memory.", LastTransitionTime: metav1.Now(),
					}}
				})
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonUnschedulable, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{"could not be scheduled for 1.5s: 0/3 nodes are available: 3 Insufficient memory."},
		},
		{
			name: "evicted",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("building\n")
				w.kubelet(j.name, func(pod *corev1.Pod) {
					terminate(137, "Error", s.killedNow())(pod)
					pod.Status.Phase = corev1.PodFailed
					pod.Status.Reason = "Evicted"
					pod.Status.Message = "The node was low on resource: ephemeral-storage."
				})
			},
			// A disruption: agent_stop, for a retry rule to match.
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodePressure, exitStatus: "-1", signal: "SIGKILL", signalReason: "agent_stop",
			supervisorLog: "building\n",
			explanation:   []string{"The kubelet evicted the job's pod because its node node-1 ran low on ephemeral-storage: The node was low on resource: ephemeral-storage.", "signal_reason: agent_stop"},
		},
		{
			name: "deadline exceeded",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("still going\n")
				w.kubelet(j.name, func(pod *corev1.Pod) {
					terminate(143, "Error", s.killedNow())(pod)
					pod.Status.Phase = corev1.PodFailed
					pod.Status.Reason = "DeadlineExceeded"
					pod.Status.Message = "Pod was active on the node longer than the specified deadline"
				})
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonDeadlineExceeded, exitStatus: "-1", signal: "SIGTERM",
			supervisorLog: "still going\n",
			explanation:   []string{"ran past its deadline", "Pod was active on the node longer than the specified deadline"},
		},
		{
			name: "pod deleted from outside while running",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("working\n")
				pod := w.waitPod(j.name)
				require.NoError(w.t, w.c.Delete(w.ctx, pod))
				w.kubelet(j.name, terminate(143, "Error", s.exited(-1, "SIGTERM", "")))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonPodDeleted, exitStatus: "-1", signal: "SIGTERM", signalReason: "agent_stop",
			supervisorLog: "working\n",
			explanation:   []string{"was deleted while the job was running, by something other than the operator"},
		},
		{
			// The watch's last sight of the pod, with its deletion, is all the controller
			// gets: no termination message, no container status after running.
			name: "pod deleted with force while running",
			drive: func(w *world, j bkJob) {
				w.forceDeleteRunningPod(j)
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonPodDeleted, exitStatus: "-1", signal: "SIGTERM", signalReason: "agent_stop",
			supervisorLog: "working\n",
			progressLost:  true,
			explanation:   []string{"was deleted while the job was running, by something other than the operator"},
		},
		{
			name: "node lost",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.supervisor(j).write("working\n")
				w.kubelet(j.name, func(pod *corev1.Pod) {
					pod.Status.Phase = corev1.PodUnknown
					pod.Status.Reason = "NodeLost"
					pod.Status.Message = "Node node-1 which was running pod is unresponsive"
				})
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodeLost, exitStatus: "-1", signal: "SIGKILL", signalReason: "agent_stop",
			supervisorLog: "working\n",
			progressLost:  true,
			explanation:   []string{"The node node-1 running the job's pod was lost", "Node node-1 which was running pod is unresponsive"},
		},
		{
			name: "node stops responding while the pod is deleted",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.supervisor(j).write("working\n")
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				pod := w.waitPod(j.name)
				require.NoError(w.t, w.c.Delete(w.ctx, pod, client.GracePeriodSeconds(1)))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodeLost, exitStatus: "-1", signal: "SIGKILL", signalReason: "agent_stop",
			supervisorLog: "working\n",
			progressLost:  true,
			explanation:   []string{"The node node-1 running the job's pod was lost: the pod was deleted but never stopped"},
		},
		{
			name:   "environment missing",
			change: gen.SetBuildJobEnvironment("no-such-env"),
			drive:  func(*world, bkJob) {},
			phase:  bkv1.PhaseFailed, reason: bkv1.ReasonEnvironmentNotFound, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{`BuildEnvironment "no-such-env" does not exist.`},
			noPod:       true,
		},
		{
			name: "init container fails",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, func(pod *corev1.Pod) {
					pod.Status.Phase = corev1.PodFailed
					pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{
						Name: podcontract.InstallContainer, Image: "bk-operator/agentd:dev",
						State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}},
					}}
				})
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonInitContainerFailed, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{`Init container "agentd-install" failed with exit code 1`},
		},
		{
			name: "supervisor cannot run the job",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.kubelet(j.name, terminate(1, "Error", &jobprogress.Progress{Error: "exec /bin/sh: no such file or directory"}))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonSupervisorFailed, exitStatus: "-1", signalReason: "stack_error",
			explanation: []string{"could not run the job: exec /bin/sh: no such file or directory"},
		},
	}
	runEndCases(t, cases)
}

// runEndCases runs each case on one world: a job accepted, its BuildJob made, driven to
// its end, and what Buildkite and the BuildJob show of it checked.
func runEndCases(t *testing.T, cases []endCase) {
	t.Helper()
	w := newWorld(t, testOptions())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			w.createBuildJob(j, tc.change)
			tc.drive(w, j)
			bj := w.waitReported(j.name)
			checkEnd(t, w, j, bj, tc)
		})
	}
	w.t = t
}

func checkEnd(t *testing.T, w *world, j bkJob, bj *bkv1.BuildJob, tc endCase) {
	t.Helper()
	// Buildkite: one finish, with the right result, and the log the job wrote followed by
	// the explanation.
	snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
	require.NoError(t, err)
	assert.Equal(t, 1, snap.FinishCount, "finish calls")
	assert.Equal(t, 1, snap.StartCount, "start calls")
	assert.Equal(t, tc.exitStatus, snap.ExitStatus)
	assert.Equal(t, tc.signal, snap.Signal)
	assert.Equal(t, tc.signalReason, snap.SignalReason)
	log := fakebuildkite.PlainLog(snap.Log)
	assert.True(t, strings.HasPrefix(log, tc.supervisorLog), "log %q does not start with the supervisor's output %q", log, tc.supervisorLog)
	rest := strings.TrimPrefix(log, tc.supervisorLog)
	if tc.explanation == nil {
		assert.Empty(t, rest, "nothing may follow the command's own output")
	} else {
		assert.Contains(t, rest, "buildkite-operator")
		for _, e := range tc.explanation {
			assert.Contains(t, rest, e)
		}
	}

	// The BuildJob.
	assert.Equal(t, tc.phase, bj.Status.Phase)
	require.NotNil(t, bj.Status.ExitStatus)
	assert.Equal(t, tc.exitStatus, fmt.Sprint(*bj.Status.ExitStatus))
	assert.Equal(t, tc.signal, bj.Status.Signal)
	assert.Equal(t, tc.signalReason, bj.Status.SignalReason)
	for _, e := range tc.explanation {
		assert.Contains(t, bj.Status.Message, e)
	}
	fin := condition(bj, bkv1.ConditionFinished)
	require.NotNil(t, fin)
	assert.Equal(t, metav1.ConditionTrue, fin.Status)
	assert.Equal(t, tc.reason, fin.Reason)
	assert.Equal(t, bj.Generation, fin.ObservedGeneration)
	rep := condition(bj, bkv1.ConditionReported)
	require.NotNil(t, rep)
	assert.Equal(t, metav1.ConditionTrue, rep.Status)
	assert.NotNil(t, bj.Status.Times.FinishedAt)
	assert.NotNil(t, bj.Status.Times.ReportedAt)
	w.waitBuildJob(j.name, "without its finalizer once reported", func(bj *bkv1.BuildJob) bool {
		return !contains(bj.Finalizers, buildjob.Finalizer)
	})
	if !tc.progressLost {
		assert.Equal(t, int64(len(snap.Log)), bj.Status.Log.Bytes, "log bytes in the status")
	}
	if tc.noPod {
		assert.Empty(t, bj.Status.PodName)
	} else {
		assert.Equal(t, j.name, bj.Status.PodName)
		assert.NotNil(t, bj.Status.Times.PodCreatedAt)
		assert.True(t, conditionTrue(bj, bkv1.ConditionPodCreated))
		// The pod is let go of: no finalizer of the operator's holds it.
		assert.Eventually(t, func() bool {
			pod := &corev1.Pod{}
			err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: j.name}, pod)
			return client.IgnoreNotFound(err) == nil && !contains(pod.Finalizers, podbuilder.PodFinalizer)
		}, waitFor, tick, "the operator's finalizer is still on the pod")
	}

	// Events: how a job failed, and nothing routine (each is a write per job): not a pass,
	// nor a report that went well.
	if tc.phase != bkv1.PhaseSucceeded {
		w.waitEvents(j.name, tc.reason)
	}
	events := w.eventReasons(j.name)
	assert.NotContains(t, events, bkv1.ReasonReported, "a report that went well needs no event")
	if tc.phase == bkv1.PhaseSucceeded {
		assert.NotContains(t, events, tc.reason, "a job that passed needs no event")
	}
}

func condition(bj *bkv1.BuildJob, t string) *metav1.Condition {
	for i := range bj.Status.Conditions {
		if bj.Status.Conditions[i].Type == t {
			return &bj.Status.Conditions[i]
		}
	}
	return nil
}

func conditionTrue(bj *bkv1.BuildJob, t string) bool {
	c := condition(bj, t)
	return c != nil && c.Status == metav1.ConditionTrue
}

func TestStatusFollowsThePod(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)

	bj := w.waitBuildJob(j.name, "pending with a pod", func(bj *bkv1.BuildJob) bool {
		return bj.Status.Phase == bkv1.PhasePending && conditionTrue(bj, bkv1.ConditionPodCreated)
	})
	assert.Contains(t, bj.Finalizers, buildjob.Finalizer)
	assert.Equal(t, j.name, bj.Status.PodName)
	pod := w.waitPod(j.name)
	assert.True(t, metav1.IsControlledBy(pod, bj))
	assert.Empty(t, pod.Finalizers, "the pod of a job the operator accepted is not held: Buildkite has its record")
	assert.False(t, *pod.Spec.AutomountServiceAccountToken)

	w.bind(j.name)
	w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
	w.run(j.name)
	bj = w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
	assert.True(t, conditionTrue(bj, bkv1.ConditionStarted))
	assert.NotNil(t, bj.Status.Times.StartedAt)
	assert.False(t, conditionTrue(bj, bkv1.ConditionFinished))
	// The phase is in the status: no event per step (each would be a write per job).
	events := w.eventReasons(j.name)
	for _, routine := range []string{bkv1.ReasonPodCreated, "Scheduled", "Started"} {
		assert.NotContains(t, events, routine)
	}

	// Nothing reaches Buildkite from the controller while the command runs.
	time.Sleep(300 * time.Millisecond)
	snap := w.bkSnapshot(j.id)
	assert.Equal(t, 0, snap.FinishCount)
	assert.Equal(t, fakebuildkite.StateAccepted, snap.State)
}

func TestWaitsForTheTokenSecret(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	require.NoError(t, w.c.Create(w.ctx, w.newBuildJob(j)))
	w.waitBuildJob(j.name, "waiting for its Secret", func(bj *bkv1.BuildJob) bool {
		c := condition(bj, bkv1.ConditionPodCreated)
		return c != nil && c.Reason == bkv1.ReasonWaitingForTokenSecret
	})
	err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: j.name}, &corev1.Pod{})
	assert.True(t, client.IgnoreNotFound(err) == nil && err != nil, "no pod before the token Secret exists")

	w.createTokenSecret(j)
	w.waitPod(j.name)
	w.waitBuildJob(j.name, "pod created", func(bj *bkv1.BuildJob) bool { return conditionTrue(bj, bkv1.ConditionPodCreated) })
}

func TestCanceledOnBuildkiteBeforeThePodRuns(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)
	w.bind(j.name)
	w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
	require.NoError(t, w.bk.CancelJob(j.id))

	bj := w.waitReported(j.name)
	assert.Equal(t, bkv1.PhaseCanceled, bj.Status.Phase)
	assert.Equal(t, "cancel", bj.Status.SignalReason)
	assert.Equal(t, bkv1.ReasonCanceled, condition(bj, bkv1.ConditionFinished).Reason)
	assert.Equal(t, bkv1.ReasonAlreadyFinished, condition(bj, bkv1.ConditionReported).Reason)
	// Buildkite canceled a job no agent had started: it takes no start and no finish.
	snap := w.bkSnapshot(j.id)
	assert.Equal(t, fakebuildkite.StateCanceled, snap.State)
	assert.Equal(t, 0, snap.FinishCount)
	assert.Equal(t, 0, snap.StartCount)
	require.Eventually(t, func() bool { return podIsGoing(w, j.name) }, waitFor, tick, "the pod of a canceled job must be deleted")
}

// A finish that Buildkite answers with 422 is the finish an earlier run of the operator
// already sent: it is recorded as reported, not retried.
func TestAlreadyFinishedJobIsRecorded(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)
	w.run(j.name)
	s := w.supervisor(j).write("done\n")
	p := s.exited(0, "", "")
	require.NoError(t, s.client().Finish(w.ctx, j.id, agentapiFinish(0)))
	w.kubelet(j.name, terminate(0, "Completed", p))

	bj := w.waitReported(j.name)
	assert.Equal(t, bkv1.PhaseSucceeded, bj.Status.Phase)
	assert.Equal(t, bkv1.ReasonAlreadyFinished, condition(bj, bkv1.ConditionReported).Reason)
	snap := w.bkSnapshot(j.id)
	assert.Equal(t, 2, snap.FinishCount, "the earlier finish and the one refused with 422")
	assert.Equal(t, "0", snap.ExitStatus)
}

// An operator that stopped between recording a job's outcome and recording its report
// asks Buildkite first, and does not send finish again.
func TestResumedReportDoesNotFinishTwice(t *testing.T) {
	w := newWorld(t, testOptions())
	w.stopController()
	j := w.acceptJob()
	w.createBuildJob(j)
	s := w.supervisor(j).write("output\n")
	require.NoError(t, s.client().Finish(w.ctx, j.id, agentapiFinish(0)))

	// What a controller that stopped right after sending finish left behind.
	bj := w.buildJob(j.name)
	bj.Finalizers = []string{buildjob.Finalizer}
	require.NoError(t, w.c.Update(w.ctx, bj))
	zero := int32(0)
	now := metav1.Now()
	bj.Status = bkv1.BuildJobStatus{
		Phase: bkv1.PhaseRunning, ExitStatus: &zero, Times: bkv1.BuildJobTimes{FinishedAt: &now},
		Conditions: []metav1.Condition{
			{Type: bkv1.ConditionFinished, Status: metav1.ConditionTrue, Reason: bkv1.ReasonExited, Message: "exited", LastTransitionTime: now},
			{Type: bkv1.ConditionReported, Status: metav1.ConditionUnknown, Reason: bkv1.ReasonReporting, Message: "reporting", LastTransitionTime: now},
		},
	}
	require.NoError(t, w.c.Status().Update(w.ctx, bj))

	w.startController(testOptions())
	bj = w.waitReported(j.name)
	assert.Equal(t, bkv1.ReasonAlreadyFinished, condition(bj, bkv1.ConditionReported).Reason)
	assert.Equal(t, bkv1.PhaseSucceeded, bj.Status.Phase)
	assert.Equal(t, 1, w.bkSnapshot(j.id).FinishCount)
	w.waitBuildJob(j.name, "without its finalizer once reported", func(bj *bkv1.BuildJob) bool {
		return !contains(bj.Finalizers, buildjob.Finalizer)
	})
}

func TestReaping(t *testing.T) {
	w := newWorld(t, testOptions())
	environment := &bkv1.BuildEnvironment{}
	require.NoError(t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, environment))
	environment.Spec.Retention = bkv1.Retention{
		SucceededPods: &metav1.Duration{Duration: 0},
		FailedPods:    &metav1.Duration{Duration: 1500 * time.Millisecond},
		BuildJobs:     &metav1.Duration{Duration: 3 * time.Second},
	}
	require.NoError(t, w.c.Update(w.ctx, environment))

	pass, fail := w.acceptJob(), w.acceptJob()
	for _, j := range []bkJob{pass, fail} {
		w.createBuildJob(j)
		w.run(j.name)
	}
	s := w.supervisor(pass).write("ok\n")
	w.kubelet(pass.name, terminate(0, "Completed", s.exited(0, "", "")))
	s = w.supervisor(fail).write("boom\n")
	w.kubelet(fail.name, terminate(0, "Completed", s.exited(1, "", "")))
	passed, failed := w.waitReported(pass.name), w.waitReported(fail.name)

	// The passed job's pod goes at once; the failed job's is kept for debugging, then goes.
	require.Eventually(t, func() bool { return podIsGoing(w, pass.name) }, waitFor, tick, "the passed job's pod must be deleted")
	pod := &corev1.Pod{}
	require.NoError(t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: fail.name}, pod))
	if time.Since(failed.Status.Times.ReportedAt.Time) < time.Second {
		assert.True(t, pod.DeletionTimestamp.IsZero(), "the failed job's pod was deleted before its retention")
	}
	require.Eventually(t, func() bool { return podIsGoing(w, fail.name) }, waitFor, tick, "the failed job's pod must be deleted after its retention")
	assert.GreaterOrEqual(t, time.Since(failed.Status.Times.ReportedAt.Time), 1500*time.Millisecond)

	// The BuildJobs go after theirs.
	for _, bj := range []*bkv1.BuildJob{passed, failed} {
		reportedAt := bj.Status.Times.ReportedAt.Time
		w.waitGone(bj)
		assert.GreaterOrEqual(t, time.Since(reportedAt), 3*time.Second, "BuildJob %s deleted before its retention", bj.Name)
	}
}

// Restarting the controller in the middle of 20 running jobs changes nothing in what
// Buildkite receives: each job is finished once, with its whole log.
func TestRestartInTheMiddleOfTwentyJobs(t *testing.T) {
	const n = 20
	w := newWorld(t, testOptions())
	jobs := make([]bkJob, n)
	sups := make([]*supervisor, n)
	for i := range jobs {
		jobs[i] = w.acceptJob()
		w.createBuildJob(jobs[i])
	}
	for i, j := range jobs {
		w.run(j.name)
		sups[i] = w.supervisor(j).write(fmt.Sprintf("job %d line 1\n", i))
	}
	for _, j := range jobs {
		w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
	}
	// Half the jobs end while the controller is up, the rest while it is down.
	for i := 0; i < n/2; i++ {
		w.kubelet(jobs[i].name, terminate(0, "Completed", sups[i].write(fmt.Sprintf("job %d line 2\n", i)).exited(i%3, "", "")))
	}
	w.stopController()
	for i := n / 2; i < n; i++ {
		w.kubelet(jobs[i].name, terminate(0, "Completed", sups[i].write(fmt.Sprintf("job %d line 2\n", i)).exited(i%3, "", "")))
	}
	w.startController(testOptions())

	for i, j := range jobs {
		bj := w.waitReported(j.name)
		snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
		require.NoError(t, err)
		assert.Equal(t, 1, snap.FinishCount, "job %d", i)
		assert.Equal(t, fmt.Sprint(i%3), snap.ExitStatus, "job %d", i)
		assert.Equal(t, fmt.Sprintf("job %d line 1\njob %d line 2\n", i, i), string(snap.Log), "job %d", i)
		assert.Equal(t, int32(i%3), *bj.Status.ExitStatus)
	}
}

func TestMetrics(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)
	w.run(j.name)
	s := w.supervisor(j).write("metrics\n")
	w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
	w.waitReported(j.name)

	got := gatherMetrics(t)
	for _, name := range []string{
		// Reconciles are counted by controller-runtime, not by the operator.
		"controller_runtime_reconcile_total",
		"controller_runtime_reconcile_time_seconds",
		"buildkite_operator_buildjob_to_running_seconds",
		"buildkite_operator_pod_end_to_finish_seconds",
		"buildkite_operator_jobs_finished_total",
		"buildkite_operator_job_log_bytes_total",
	} {
		assert.Greater(t, got[name], 0.0, "metric %s", name)
	}
}

// TestSupervisorFinished: a supervisor that finished the job itself (its output all sent)
// leaves the controller only the record: no finish of its own, the outcome and the report
// in the status, and the pod reaped as for any reported job.
func TestSupervisorFinished(t *testing.T) {
	w := newWorld(t, testOptions())
	for _, exit := range []int{0, 5} {
		j := w.acceptJob()
		w.createBuildJob(j)
		w.run(j.name)
		s := w.supervisor(j).write("done\n")
		w.kubelet(j.name, terminate(int32(exit), "Completed", s.finished(exit)))
		bj := w.waitReported(j.name)

		snap := w.bkSnapshot(j.id)
		assert.Equal(t, 1, snap.FinishCount, "the supervisor's finish only")
		assert.Equal(t, fmt.Sprint(exit), snap.ExitStatus)
		require.NotNil(t, bj.Status.ExitStatus)
		assert.Equal(t, int32(exit), *bj.Status.ExitStatus)
		assert.True(t, conditionTrue(bj, bkv1.ConditionFinished))
		assert.Equal(t, bkv1.ReasonReported, condition(bj, bkv1.ConditionReported).Reason)
		assert.Equal(t, int64(len("done\n")), bj.Status.Log.Bytes)
		if exit == 0 {
			require.Eventually(t, func() bool { return podIsGoing(w, j.name) }, waitFor, tick, "the passed job's pod must be deleted")
		}
	}
}
