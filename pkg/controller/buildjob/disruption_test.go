package buildjob_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// What the kubelet and the scheduler say of a pod they stop, as Kubernetes 1.35 words it.
const (
	pressureMessage = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi. Container job was using 1800Mi, request is 0, has larger consumption of memory."
	shutdownMessage = "Pod was terminated in response to imminent node shutdown."
	preemptMessage  = "default-scheduler: preempting to accommodate a higher priority pod"
	taintMessage    = "Taint manager: deleting due to NoExecute taint"
	podGCMessage    = "PodGC: node no longer exists"
	storageMessage  = "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi."
	retryRule       = "automatic retry rule for agent_stop (retry: {automatic: [{signal_reason: agent_stop"
)

// disruptionTarget marks the pod as the one who stops it does (the scheduler, the taint
// manager, pod GC, the kubelet), before it stops it.
func disruptionTarget(reason, message string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason, Message: message,
			LastTransitionTime: metav1.Now(),
		})
	}
}

// failed ends the pod as the kubelet does once all its containers have stopped.
func failed(reason, message string) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		pod.Status.Phase = corev1.PodFailed
		pod.Status.Reason, pod.Status.Message = reason, message
	}
}

func both(changes ...func(*corev1.Pod)) func(*corev1.Pod) {
	return func(pod *corev1.Pod) {
		for _, c := range changes {
			c(pod)
		}
	}
}

// deletePod deletes the job's pod as the one who disrupts it does.
func (w *world) deletePod(name string, opts ...client.DeleteOption) {
	w.t.Helper()
	require.NoError(w.t, w.c.Delete(w.ctx, w.waitPod(name), opts...))
}

// runAndWrite runs the pod and has its supervisor send text, once the BuildJob says the
// command runs.
func (w *world) runAndWrite(j bkJob, text string) *supervisor {
	w.t.Helper()
	w.run(j.name)
	s := w.supervisor(j).write(text)
	w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
	return s
}

// A pod that Kubernetes takes away for a reason of its own (evicted, preempted, its node
// lost or deleted) ends its job with -1 and agent_stop, as an agent stopped under its job
// does, so that an automatic retry rule for agent_stop retries it; the log says what
// happened after the output the supervisor sent, and the Finished condition and an event
// name the cause.
func TestDisruptions(t *testing.T) {
	stop := agentapi.SignalReasonAgentStop
	cases := []endCase{
		{
			name: "preempted by the scheduler while the command runs",
			drive: func(w *world, j bkJob) {
				s := w.runAndWrite(j, "building\n")
				w.kubelet(j.name, disruptionTarget("PreemptionByScheduler", preemptMessage))
				w.deletePod(j.name)
				// The supervisor, told to stop, stops the command, sends the rest of the
				// output and leaves the finish to the controller.
				s.write("terminated\n")
				w.kubelet(j.name, terminate(143, "Error", s.exited(-1, "SIGTERM", stop)))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonPreempted, exitStatus: "-1", signal: "SIGTERM", signalReason: stop,
			supervisorLog: "building\nterminated\n",
			explanation: []string{
				"Kubernetes preempted the job's pod: the scheduler stopped it to make room on node node-1 for a pod of higher priority: " + preemptMessage + ".",
				retryRule,
			},
		},
		{
			name: "evicted through the Eviction API, the supervisor killed at the end of its grace",
			drive: func(w *world, j bkJob) {
				s := w.runAndWrite(j, "building\n")
				// The API server marks the pod and deletes it, as for kubectl drain.
				pod := w.waitPod(j.name)
				require.NoError(w.t, w.c.SubResource("eviction").Create(w.ctx, pod, &policyv1.Eviction{
					ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
				}))
				w.waitPodDeleting(j.name)
				w.kubelet(j.name, terminate(137, "Error", s.killedNow()))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonEvicted, exitStatus: "-1", signal: "SIGKILL", signalReason: stop,
			supervisorLog: "building\n",
			explanation: []string{
				"Kubernetes evicted the job's pod from node node-1 through the Eviction API, as a node drain or the cluster autoscaler does",
				retryRule,
			},
		},
		{
			name: "evicted by the kubelet under memory pressure",
			drive: func(w *world, j bkJob) {
				s := w.runAndWrite(j, "building\n")
				// The condition comes while the containers stop; the phase once they have.
				w.kubelet(j.name, disruptionTarget("TerminationByKubelet", pressureMessage))
				s.write("terminated\n")
				w.kubelet(j.name, both(terminate(143, "Error", s.exited(-1, "SIGTERM", stop)), failed("Evicted", pressureMessage)))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodePressure, exitStatus: "-1", signal: "SIGTERM", signalReason: stop,
			supervisorLog: "building\nterminated\n",
			explanation: []string{
				"The kubelet evicted the job's pod because its node node-1 ran low on memory: The node was low on resource: memory. Threshold quantity: 100Mi",
				retryRule,
			},
		},
		{
			name: "stopped by the kubelet as its node shuts down",
			drive: func(w *world, j bkJob) {
				s := w.runAndWrite(j, "building\n")
				w.kubelet(j.name, disruptionTarget("TerminationByKubelet", shutdownMessage))
				w.kubelet(j.name, both(terminate(143, "Error", s.exited(-1, "SIGTERM", stop)), failed("Terminated", shutdownMessage)))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodeShutdown, exitStatus: "-1", signal: "SIGTERM", signalReason: stop,
			supervisorLog: "building\n",
			explanation:   []string{"The kubelet stopped the job's pod because its node node-1 was shutting down: " + shutdownMessage, retryRule},
		},
		{
			name: "node lost: deleted by the taint manager, never stopped",
			drive: func(w *world, j bkJob) {
				w.runAndWrite(j, "working\n")
				w.kubelet(j.name, disruptionTarget("DeletionByTaintManager", taintMessage))
				w.deletePod(j.name)
				// No kubelet answers: the pod never stops.
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodeLost, exitStatus: "-1", signal: "SIGKILL", signalReason: stop,
			supervisorLog: "working\n",
			progressLost:  true,
			explanation: []string{
				"The node node-1 running the job's pod was lost: Kubernetes deleted the pod because the node was tainted NoExecute, most often because it stopped responding: " + taintMessage + ".",
				retryRule,
			},
		},
		{
			name: "node deleted: the pod removed by pod GC",
			drive: func(w *world, j bkJob) {
				w.runAndWrite(j, "working\n")
				w.kubelet(j.name, disruptionTarget("DeletionByPodGC", podGCMessage))
				w.deletePod(j.name, client.GracePeriodSeconds(0))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonNodeDeleted, exitStatus: "-1", signal: "SIGKILL", signalReason: stop,
			supervisorLog: "working\n",
			progressLost:  true,
			explanation:   []string{"The node node-1 running the job's pod was deleted from the cluster (or taken out of service), and Kubernetes removed the pod with it: " + podGCMessage + ".", retryRule},
		},
		{
			name: "preempted before the command started",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, disruptionTarget("PreemptionByScheduler", preemptMessage))
				w.deletePod(j.name)
				w.kubelet(j.name, stopped)
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonPreempted, exitStatus: "-1", signalReason: stop,
			explanation: []string{"Kubernetes preempted the job's pod", retryRule},
		},
		{
			name: "the command had ended before the preemption",
			drive: func(w *world, j bkJob) {
				s := w.runAndWrite(j, "FAIL\n")
				// The command exited 3; the pod went before the supervisor had sent all
				// its output, so it did not finish the job.
				p := s.exited(3, "", "")
				p.Flushed = false
				w.kubelet(j.name, disruptionTarget("PreemptionByScheduler", preemptMessage))
				w.deletePod(j.name)
				w.kubelet(j.name, terminate(143, "Error", p))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonExited, exitStatus: "3",
			supervisorLog: "FAIL\n",
			explanation:   []string{"Kubernetes preempted the job's pod", "The job's command had already ended, so its exit status stands."},
		},
		{
			// Not a disruption: the job's own doing, which a retry repeats.
			name: "evicted for going over its own storage limit",
			drive: func(w *world, j bkJob) {
				s := w.runAndWrite(j, "writing\n")
				w.kubelet(j.name, both(terminate(137, "Error", s.killedNow()), failed("Evicted", storageMessage)))
			},
			phase: bkv1.PhaseFailed, reason: bkv1.ReasonStorageLimitExceeded, exitStatus: "-1", signal: "SIGKILL",
			supervisorLog: "writing\n",
			explanation:   []string{"used more local storage than its limits allow: " + storageMessage[:len(storageMessage)-1], "Give the step more ephemeral-storage"},
		},
	}
	runEndCases(t, cases)
}

// The supervisor's record says how far the log got: a supervisor that flushed it gets the
// explanation right after its last chunk; one that did not may have had chunks on their
// way that its record does not count, so the explanation goes past any log a job can
// have, where it cannot take the place of one of them.
func TestDisruptionExplanationAfterChunksInFlight(t *testing.T) {
	w := newWorld(t, testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)
	s := w.runAndWrite(j, "one\n")
	recorded := s.killedNow()
	// A chunk that reached Buildkite after the supervisor's last record of its progress.
	s.write("two\n")
	w.kubelet(j.name, disruptionTarget("PreemptionByScheduler", preemptMessage))
	w.deletePod(j.name)
	w.kubelet(j.name, terminate(137, "Error", recorded))
	w.waitReported(j.name)
	snap := w.bkSnapshot(j.id)
	log := fakebuildkite.PlainLog(snap.Log)
	assert.True(t, strings.HasPrefix(log, "one\ntwo\n"), "the chunk in flight is kept: %q", log)
	assert.Contains(t, log, "Kubernetes preempted the job's pod", "and so is the explanation")
	assert.Equal(t, "-1", snap.ExitStatus)
	assert.Equal(t, agentapi.SignalReasonAgentStop, snap.SignalReason)
	assert.Equal(t, 1, snap.FinishCount)
}
