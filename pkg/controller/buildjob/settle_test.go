package buildjob_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// A pod's states are written to its BuildJob's status only once the pod has shown them
// for PhaseSettle: a job whose pod passes through pending, scheduled and running quicker
// has its outcome as its first status write, which records the pod as well; one that
// stays in a state has it written.
func TestPhaseSettle(t *testing.T) {
	intermediate := map[bkv1.BuildJobPhase]bool{bkv1.PhasePending: true, bkv1.PhaseScheduled: true, bkv1.PhaseRunning: true}
	cases := []struct {
		name   string
		settle time.Duration
		drive  func(w *world, j bkJob)
		// shown: the intermediate phases the status said, in order.
		shown []bkv1.BuildJobPhase
	}{
		{
			name:   "a quick job: the outcome is the first write",
			settle: 5 * time.Second,
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("quick\n")
				w.kubelet(j.name, terminate(0, "Completed", s.finished(0)))
			},
		},
		{
			name: "a pod that stays scheduled, then runs",
			// The pod's timestamps are whole seconds, so a state can count as up to a second
			// older than it is: 3 s keeps the moment between the pod's create and its bind
			// (a loaded machine's hundreds of milliseconds) from counting as a settled Pending.
			settle: 3 * time.Second,
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
				w.run(j.name)
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				s := w.supervisor(j).write("slow\n")
				w.kubelet(j.name, terminate(0, "Completed", s.finished(0)))
			},
			shown: []bkv1.BuildJobPhase{bkv1.PhaseScheduled, bkv1.PhaseRunning},
		},
		{
			name: "no settle: every state the controller sees is written",
			drive: func(w *world, j bkJob) {
				w.waitBuildJob(j.name, "pending", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhasePending })
				w.bind(j.name)
				w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
				w.run(j.name)
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				s := w.supervisor(j).write("seen\n")
				w.kubelet(j.name, terminate(0, "Completed", s.finished(0)))
			},
			shown: []bkv1.BuildJobPhase{bkv1.PhasePending, bkv1.PhaseScheduled, bkv1.PhaseRunning},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions()
			opts.PhaseSettle = tc.settle
			w := newWorld(t, opts)
			j := w.acceptJob()
			history := w.watchStatus(j.name)
			w.createBuildJob(j)
			w.waitPod(j.name)
			tc.drive(w, j)
			bj := w.waitReported(j.name)

			assert.Equal(t, bkv1.PhaseSucceeded, bj.Status.Phase)
			// The outcome's write carries the pod's record whether or not a state was
			// written before it.
			assert.Equal(t, j.name, bj.Status.PodName)
			assert.NotNil(t, bj.Status.Times.PodCreatedAt)
			assert.True(t, conditionTrue(bj, bkv1.ConditionPodCreated), "PodCreated")
			assert.True(t, conditionTrue(bj, bkv1.ConditionStarted), "Started")

			require.Eventually(t, func() bool {
				seen := history.list()
				return len(seen) > 0 && seen[len(seen)-1].Times.ReportedAt != nil
			}, waitFor, tick, "the watch never saw the report")
			var shown []bkv1.BuildJobPhase
			for _, s := range history.list() {
				if intermediate[s.Phase] && (len(shown) == 0 || shown[len(shown)-1] != s.Phase) {
					shown = append(shown, s.Phase)
				}
			}
			assert.Equal(t, tc.shown, shown, "the states the status said before the outcome")
		})
	}
}
