package buildjob_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// forceDeletePod removes the job's pod from the API server at once, as `kubectl delete
// --force` or the pod garbage collector after its node is gone do: the controller never
// sees how its containers ended.
func (w *world) forceDeletePod(name string) {
	w.t.Helper()
	pod := w.waitPod(name)
	require.Empty(w.t, pod.Finalizers, "the pod of a job the operator accepted carries no finalizer")
	require.NoError(w.t, w.c.Delete(w.ctx, pod, client.GracePeriodSeconds(0)))
}

// podExists says whether the BuildJob's pod is there.
func (w *world) podExists(name string) bool {
	w.t.Helper()
	err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, &corev1.Pod{})
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(w.t, err)
	return true
}

// TestPodGoneAfterSupervisorFinished: a job pod is not held by a finalizer, so it may be
// gone before the controller reads its supervisor's record. When Buildkite has the job
// over, the controller records that and sends nothing more: no second finish, nothing
// appended to a log Buildkite has closed.
func TestPodGoneAfterSupervisorFinished(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)
	w.run(j.name)
	w.supervisor(j).write("all done\n").finished(0)
	w.forceDeletePod(j.name)

	bj := w.waitReported(j.name)
	snap := w.bkSnapshot(j.id)
	assert.Equal(t, 1, snap.FinishCount, "the supervisor's finish, and no other")
	assert.Equal(t, "0", snap.ExitStatus, "the supervisor's exit status stands on Buildkite")
	assert.Equal(t, "all done\n", fakebuildkite.PlainLog(snap.Log), "nothing may follow the job's own output")
	assert.Equal(t, bkv1.ReasonPodDeleted, condition(bj, bkv1.ConditionFinished).Reason)
	assert.Contains(t, bj.Status.Message, "Buildkite had ended the job (finished)")
	assert.False(t, w.podExists(j.name), "no pod is made again for a job that is over")
}

// TestPodGoneWhileOperatorDown: the job's pod is deleted while the operator is down, and a
// restarted operator (or the replica that leads next) finds its BuildJob without a pod and
// without a status that records one. It asks Buildkite how far the job got before it makes
// a pod: a job whose command ran is never run a second time.
func TestPodGoneWhileOperatorDown(t *testing.T) {
	cases := []struct {
		name string
		// supervise is what the pod's supervisor did before the pod went.
		supervise func(w *world, j bkJob)
		// again: a pod is made again, and the job runs in it.
		again bool
		// reason, message and log are the outcome's, when the job is not run again.
		reason, message, log string
		// podGone: the controller waited for the supervisor, saying so (ConditionPodGone).
		podGone bool
	}{
		{
			name:      "its command never started",
			supervise: func(*world, bkJob) {},
			again:     true,
		},
		{
			name:      "its command was running",
			supervise: func(w *world, j bkJob) { w.supervisor(j).write("working\n") },
			reason:    bkv1.ReasonPodDeleted, message: "disappeared while the job was running",
			log: "working\n", podGone: true,
		},
		{
			name:      "its supervisor had finished the job",
			supervise: func(w *world, j bkJob) { w.supervisor(j).write("all done\n").finished(0) },
			reason:    bkv1.ReasonPodDeleted, message: "Buildkite had ended the job (finished)",
			log: "all done\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions()
			// No state is written before the outcome: the status never records the pod, as
			// with a job whose pod was made moments before the operator went down.
			opts.PhaseSettle = time.Hour
			w := newWorld(t, opts)
			j := w.acceptJob()
			w.createBuildJob(j)
			w.run(j.name)
			tc.supervise(w, j)
			w.stopController()
			w.forceDeletePod(j.name)
			require.Nil(t, condition(w.buildJob(j.name), bkv1.ConditionPodCreated), "the status must not record the pod")

			w.startController(opts)
			if tc.again {
				pod := w.waitPod(j.name)
				assert.Empty(t, pod.Finalizers)
				w.run(j.name)
				w.kubelet(j.name, terminate(0, "Completed", w.supervisor(j).write("second pod\n").finished(0)))
				bj := w.waitReported(j.name)
				assert.Equal(t, bkv1.PhaseSucceeded, bj.Status.Phase)
				assert.Equal(t, 1, w.bkSnapshot(j.id).StartCount, "the job started once, in its second pod")
				return
			}
			bj := w.waitReported(j.name)
			assert.False(t, w.podExists(j.name), "no second pod for a job whose command ran")
			snap := w.bkSnapshot(j.id)
			assert.Equal(t, 1, snap.StartCount, "the job started once")
			assert.Equal(t, 1, snap.FinishesAccepted)
			assert.Equal(t, tc.reason, condition(bj, bkv1.ConditionFinished).Reason)
			assert.Contains(t, bj.Status.Message, tc.message)
			assert.Contains(t, fakebuildkite.PlainLog(snap.Log), tc.log)
			if gone := condition(bj, bkv1.ConditionPodGone); tc.podGone {
				require.NotNil(t, gone, "the wait for the supervisor is in the status, which a restart keeps")
				assert.Equal(t, bkv1.ReasonPodDeleted, gone.Reason)
				assert.Contains(t, gone.Message, "the job is finished once its supervisor has had 1.5s to stop")
			} else {
				assert.Nil(t, gone)
			}
		})
	}
}

// TestPodGoneWaitOutlivesRestarts: the wait for a gone pod's supervisor counts from when
// the pod was found gone, which the status keeps, so an operator restarted more often
// than the wait still finishes the job (the chaos soak, with a kill every 5-20 s and a
// 35 s wait, left such jobs running for ever while the wait was kept in memory).
func TestPodGoneWaitOutlivesRestarts(t *testing.T) {
	opts := testOptions()
	opts.PhaseSettle = time.Hour
	opts.PodTerminationTimeout = 3 * time.Second // the wait: less than the env's grace period and the margin
	w := newWorld(t, opts)
	j := w.acceptJob()
	w.createBuildJob(j)
	w.run(j.name)
	w.supervisor(j).write("working\n")
	w.stopController()
	w.forceDeletePod(j.name)

	// Restarted every second, for twice the wait: no process lives through a whole wait.
	deadline := time.Now().Add(2 * opts.PodTerminationTimeout)
	for time.Now().Before(deadline) {
		w.startController(opts)
		time.Sleep(time.Second)
		w.stopController()
	}
	bj := w.buildJob(j.name)
	require.NotNil(t, bj.Status.Times.ReportedAt, "the job must be finished while the operator keeps restarting: %s", statusJSON(bj))
	assert.Equal(t, bkv1.ReasonPodDeleted, condition(bj, bkv1.ConditionFinished).Reason)
	assert.False(t, w.podExists(j.name), "no second pod for a job whose command ran")
}
