package buildjob_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Beyond the cap the longest reported BuildJobs go before their retention (an hour here),
// and a BuildJob whose job still runs is neither counted nor deleted, however old.
func TestMaxRetainedBuildJobs(t *testing.T) {
	const maxKept, reportedJobs = 2, 5
	opts := testOptions()
	opts.MaxRetainedBuildJobs = maxKept
	w := newWorld(t, opts)

	running := w.acceptJob()
	w.createBuildJob(running)
	w.run(running.name)
	w.supervisor(running).write("still going\n")

	reportedAt := map[string]time.Time{}
	for i := range reportedJobs {
		j := w.acceptJob()
		w.createBuildJob(j)
		w.run(j.name)
		s := w.supervisor(j).write(fmt.Sprintf("job %d\n", i))
		w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
		reportedAt[j.name] = w.waitReported(j.name).Status.Times.ReportedAt.Time
	}

	var left []bkv1.BuildJob
	require.Eventually(t, func() bool {
		var list bkv1.BuildJobList
		require.NoError(t, w.c.List(w.ctx, &list, client.InNamespace(w.ns)))
		left = left[:0]
		for _, bj := range list.Items {
			if bj.Name != running.name && bj.DeletionTimestamp.IsZero() {
				left = append(left, bj)
			}
		}
		return len(left) == maxKept
	}, waitFor, tick, "the reported BuildJobs beyond the cap of %d must be deleted", maxKept)

	// Those kept are the latest reported: none was reported before one that was deleted.
	var oldestKept time.Time
	for _, bj := range left {
		if at := bj.Status.Times.ReportedAt.Time; oldestKept.IsZero() || at.Before(oldestKept) {
			oldestKept = at
		}
		delete(reportedAt, bj.Name)
	}
	require.Len(t, reportedAt, reportedJobs-maxKept)
	for name, at := range reportedAt {
		assert.False(t, at.After(oldestKept), "%s (reported %s) was deleted while one reported at %s was kept", name, at, oldestKept)
	}

	// The running job's BuildJob is still there, and still running, two sweeps later.
	time.Sleep(2 * opts.ResyncInterval)
	bj := w.buildJob(running.name)
	assert.True(t, bj.DeletionTimestamp.IsZero(), "a running job's BuildJob was deleted by the cap")
	assert.Equal(t, bkv1.PhaseRunning, bj.Status.Phase)
}
