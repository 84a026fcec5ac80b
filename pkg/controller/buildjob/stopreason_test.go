package buildjob_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// Issue 23: a job stopped because its BuildJob was deleted (by hand, or by the drain before
// an uninstall) is finished as an agent finishes a job it stops because it is stopping:
// agent_stop, which a step's automatic retry rule for agent_stop matches, with the reason
// in its log. A cancel from Buildkite that the supervisor acted on first stays a cancel.
func TestDeletedBuildJobStopsItsJob(t *testing.T) {
	cases := []struct {
		name string
		// uninstall: the BuildJob carries the drain's mark before it is deleted.
		uninstall bool
		// drive takes the job as far as the case needs, deletes the BuildJob, and ends the
		// pod as its kubelet would.
		drive                    func(w *world, j bkJob)
		exitStatus, signal       string
		signalReason, supervisor string
		explanation              string
	}{
		{
			name: "deleted by hand before the command started",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				require.NoError(w.t, w.c.Delete(w.ctx, w.buildJob(j.name)))
				w.waitPodDeleting(j.name)
				w.kubelet(j.name, stopped)
			},
			exitStatus: "-1", signalReason: agentapi.SignalReasonAgentStop,
			explanation: "The operator stopped the job because its BuildJob was deleted in Kubernetes.",
		},
		{
			name: "deleted by hand while the command runs",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("long job\n")
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				require.NoError(w.t, w.c.Delete(w.ctx, w.buildJob(j.name)))
				// The controller stops the pod; its supervisor kills the command and
				// sends the rest of the output.
				w.waitPodDeleting(j.name)
				s.write("terminated\n")
				w.kubelet(j.name, terminate(143, "Error", s.exited(-1, "SIGTERM", "")))
			},
			exitStatus: "-1", signal: "SIGTERM", signalReason: agentapi.SignalReasonAgentStop, supervisor: "long job\nterminated\n",
			explanation: "The operator stopped the job because its BuildJob was deleted in Kubernetes.",
		},
		{
			name:      "deleted by the uninstall's drain while the command runs",
			uninstall: true,
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("long job\n")
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				require.NoError(w.t, w.c.Delete(w.ctx, w.buildJob(j.name)))
				w.waitPodDeleting(j.name)
				// The supervisor, told to stop by the pod's deletion, stops the command
				// and leaves the finish to the controller, which knows why.
				s.write("terminated\n")
				w.kubelet(j.name, terminate(143, "Error", s.exited(-1, "SIGTERM", agentapi.SignalReasonAgentStop)))
			},
			exitStatus: "-1", signal: "SIGTERM", signalReason: agentapi.SignalReasonAgentStop, supervisor: "long job\nterminated\n",
			explanation: "The operator stopped the job because the operator is being uninstalled",
		},
		{
			name: "canceled on Buildkite, then deleted by hand",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("long job\n")
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				require.NoError(w.t, w.bk.CancelJob(j.id))
				// The supervisor stops the command for the cancel; its finish does not
				// get through before the BuildJob is deleted.
				s.write("canceled\n")
				require.NoError(w.t, w.c.Delete(w.ctx, w.buildJob(j.name)))
				w.waitPodDeleting(j.name)
				w.kubelet(j.name, terminate(143, "Error", s.exited(-1, "SIGTERM", agentapi.SignalReasonCancel)))
			},
			exitStatus: "-1", signal: "SIGTERM", signalReason: agentapi.SignalReasonCancel, supervisor: "long job\ncanceled\n",
			explanation: "The operator stopped the job because its BuildJob was deleted in Kubernetes.",
		},
	}
	w := newWorld(t, testOptions())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			w.createBuildJob(j)
			w.waitBuildJob(j.name, "has the finalizer and its pod", func(bj *bkv1.BuildJob) bool {
				return contains(bj.Finalizers, buildjob.Finalizer) && bj.Status.PodName != ""
			})
			if tc.uninstall {
				// What `agentd drain` does before it deletes the BuildJobs.
				bj := w.buildJob(j.name)
				if bj.Annotations == nil {
					bj.Annotations = map[string]string{}
				}
				bj.Annotations[bkv1.AnnotationStopReason] = bkv1.StopReasonUninstall
				require.NoError(t, w.c.Update(w.ctx, bj))
			}
			bj := w.buildJob(j.name)
			tc.drive(w, j)
			w.waitGone(bj)

			snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
			require.NoError(t, err)
			assert.Equal(t, 1, snap.FinishCount)
			assert.Equal(t, tc.exitStatus, snap.ExitStatus)
			assert.Equal(t, tc.signal, snap.Signal)
			assert.Equal(t, tc.signalReason, snap.SignalReason)
			log := fakebuildkite.PlainLog(snap.Log)
			assert.True(t, strings.HasPrefix(log, tc.supervisor), "the supervisor's output first: %q", log)
			assert.Contains(t, log, tc.explanation)
			assert.NotContains(t, log, "so the job was canceled", "a stop is not called a cancel")
			require.Eventually(t, func() bool { return podIsGoing(w, j.name) }, waitFor, tick, "the pod must be deleted")
		})
	}
	w.t = t
}
