package buildjob_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// statusHistory records every status a BuildJob went through, from a watch, so that a
// test can check the path as well as where it ended.
type statusHistory struct {
	mu   sync.Mutex
	seen []bkv1.BuildJobStatus
}

func (h *statusHistory) list() []bkv1.BuildJobStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bkv1.BuildJobStatus(nil), h.seen...)
}

// watchStatus records the statuses of the BuildJob named name, from before it exists.
func (w *world) watchStatus(name string) *statusHistory {
	w.t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(w.t, err)
	wi, err := wc.Watch(w.ctx, &bkv1.BuildJobList{}, client.InNamespace(w.ns), client.MatchingFields{"metadata.name": name})
	require.NoError(w.t, err)
	w.t.Cleanup(wi.Stop)
	h := &statusHistory{}
	go func() {
		for ev := range wi.ResultChan() {
			bj, ok := ev.Object.(*bkv1.BuildJob)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			h.mu.Lock()
			h.seen = append(h.seen, *bj.Status.DeepCopy())
			h.mu.Unlock()
		}
	}()
	return h
}

// phaseOrder ranks phases in the only order a job may go through them.
var phaseOrder = map[bkv1.BuildJobPhase]int{
	"": 0, bkv1.PhasePending: 1, bkv1.PhaseScheduled: 2, bkv1.PhaseRunning: 3,
	bkv1.PhaseSucceeded: 4, bkv1.PhaseFailed: 4, bkv1.PhaseCanceled: 4,
}

// TestStatusTellsTheTruth drives a job to each outcome and checks that the Started
// condition, the phase and the times agree with what happened: a command that ran is
// Started, with a startedAt between the pod's creation and the finish; a command that
// never ran is Started=False/NeverRan with no startedAt; the phase never goes back.
func TestStatusTellsTheTruth(t *testing.T) {
	cases := []struct {
		name   string
		change gen.BuildJobModifier
		drive  func(w *world, j bkJob)
		// ran: the job's command started.
		ran   bool
		phase bkv1.BuildJobPhase
		noPod bool
	}{
		{
			name: "command exits 0, seen running",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				s := w.supervisor(j).write("ok\n")
				w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
			},
			ran: true, phase: bkv1.PhaseSucceeded,
		},
		{
			// The demo's short steps: the container ends between two looks of the
			// controller, which never sees it running.
			name: "command exits 0 before the controller sees it run",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
				s := w.supervisor(j).write("quick\n")
				w.kubelet(j.name, func(pod *corev1.Pod) {
					pod.Status.Phase = corev1.PodSucceeded
					terminate(0, "Completed", s.exited(0, "", ""))(pod)
				})
			},
			ran: true, phase: bkv1.PhaseSucceeded,
		},
		{
			name: "command exits 3",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				s := w.supervisor(j).write("FAIL\n")
				w.kubelet(j.name, terminate(0, "Completed", s.exited(3, "", "")))
			},
			ran: true, phase: bkv1.PhaseFailed,
		},
		{
			name: "canceled on Buildkite while running",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("sleeping\n")
				require.NoError(w.t, w.bk.CancelJob(j.id))
				w.kubelet(j.name, terminate(0, "Completed", s.exited(-1, "SIGTERM", "cancel")))
			},
			ran: true, phase: bkv1.PhaseCanceled,
		},
		{
			name: "OOM killed while running",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				s := w.supervisor(j).write("allocating\n")
				w.kubelet(j.name, terminate(137, "OOMKilled", s.killedNow()))
			},
			ran: true, phase: bkv1.PhaseFailed,
		},
		{
			name: "pod deleted with force while running",
			drive: func(w *world, j bkJob) {
				w.forceDeleteRunningPod(j)
			},
			ran: true, phase: bkv1.PhaseFailed,
		},
		{
			// The container ran, so it was shown as started; the supervisor's record
			// then says the job never started, and the status must follow it.
			name: "OOM killed before the job started",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				w.kubelet(j.name, terminate(137, "OOMKilled", nil))
			},
			phase: bkv1.PhaseFailed,
		},
		{
			name: "supervisor cannot run the job",
			drive: func(w *world, j bkJob) {
				w.run(j.name)
				w.waitBuildJob(j.name, "running", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
				w.kubelet(j.name, terminate(1, "Error", &jobprogress.Progress{Error: "exec /bin/sh: no such file or directory"}))
			},
			phase: bkv1.PhaseFailed,
		},
		{
			name: "image cannot be pulled",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.kubelet(j.name, waiting(podcontract.JobContainer, "ImagePullBackOff", "Back-off pulling image"))
				w.waitPodDeleting(j.name)
				w.kubelet(j.name, stopped)
			},
			phase: bkv1.PhaseFailed,
		},
		{
			name: "canceled on Buildkite before the pod runs",
			drive: func(w *world, j bkJob) {
				w.bind(j.name)
				w.waitBuildJob(j.name, "scheduled", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseScheduled })
				require.NoError(w.t, w.bk.CancelJob(j.id))
			},
			phase: bkv1.PhaseCanceled,
		},
		{
			name:   "environment missing",
			change: gen.SetBuildJobEnvironment("no-such-env"),
			drive:  func(*world, bkJob) {},
			phase:  bkv1.PhaseFailed, noPod: true,
		},
	}
	w := newWorld(t, testOptions())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			history := w.watchStatus(j.name)
			w.createBuildJob(j, tc.change)
			tc.drive(w, j)
			bj := w.waitReported(j.name)
			st := bj.Status

			assert.Equal(t, tc.phase, st.Phase)
			started := condition(bj, bkv1.ConditionStarted)
			require.NotNil(t, started, "the Started condition")
			times := st.Times
			if tc.ran {
				assert.Equal(t, metav1.ConditionTrue, started.Status, "Started: %s/%s", started.Reason, started.Message)
				// Ran, not running: nothing of the running job's words is left.
				assert.Equal(t, bkv1.ReasonCommandRan, started.Reason)
				assert.NotContains(t, st.Message, "is running")
				if assert.NotNil(t, times.StartedAt, "startedAt of a command that ran") {
					assert.False(t, times.StartedAt.After(times.FinishedAt.Time), "startedAt %s after finishedAt %s", times.StartedAt, times.FinishedAt)
					if times.PodCreatedAt != nil {
						assert.False(t, times.PodCreatedAt.After(times.StartedAt.Time), "podCreatedAt %s after startedAt %s", times.PodCreatedAt, times.StartedAt)
					}
				}
			} else {
				assert.Equal(t, metav1.ConditionFalse, started.Status, "Started: %s/%s", started.Reason, started.Message)
				assert.Equal(t, bkv1.ReasonNeverRan, started.Reason)
				assert.Nil(t, times.StartedAt, "startedAt of a command that never ran")
			}
			require.NotNil(t, times.FinishedAt)
			require.NotNil(t, times.ReportedAt)
			assert.False(t, times.FinishedAt.After(times.ReportedAt.Time), "finishedAt %s after reportedAt %s", times.FinishedAt, times.ReportedAt)
			if tc.noPod {
				assert.Nil(t, times.PodCreatedAt)
			} else {
				assert.NotNil(t, times.PodCreatedAt)
			}

			// The path: the phase only moves forward, and a job shown as running had
			// its command started.
			require.Eventually(t, func() bool {
				seen := history.list()
				return len(seen) > 0 && seen[len(seen)-1].Times.ReportedAt != nil
			}, waitFor, tick, "the watch never saw the report")
			prev := bkv1.BuildJobPhase("")
			for i, s := range history.list() {
				assert.GreaterOrEqual(t, phaseOrder[s.Phase], phaseOrder[prev], "status %d: phase went back from %s to %s", i, prev, s.Phase)
				prev = s.Phase
				if s.Phase == bkv1.PhaseRunning {
					assert.NotNil(t, s.Times.StartedAt, "status %d: Running without startedAt", i)
				}
			}
		})
	}
	w.t = t
}
