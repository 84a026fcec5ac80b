package buildjob_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// A supervisor that found its job already over on Buildkite (canceled while the pod
// started) runs nothing, records EndedOnBuildkite and exits. The controller believes it:
// Buildkite takes no start, log or finish for such a job, so it sends none, and records
// why. (Before, it read the record as a container that died unexplained, and started,
// explained and finished a job Buildkite had ended.)
func TestEndedOnBuildkiteIsNotReportedAgain(t *testing.T) {
	w := prepareWorld(t)
	w.startController(testOptions())
	j := w.acceptJob()
	w.createBuildJob(j)
	w.waitPod(j.name)
	w.bind(j.name)
	w.kubelet(j.name, terminate(0, "Completed", &jobprogress.Progress{EndedOnBuildkite: true, BuildkiteState: "canceled"}))

	bj := w.waitReported(j.name)
	finished := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionFinished)
	require.NotNil(t, finished)
	assert.Equal(t, bkv1.ReasonEndedOnBuildkite, finished.Reason)
	assert.Contains(t, finished.Message, `already over on Buildkite (canceled) when its pod started`)
	reported := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionReported)
	require.NotNil(t, reported)
	assert.Equal(t, bkv1.ReasonAlreadyFinished, reported.Reason)
	for _, r := range w.bk.Requests() {
		if r.JobID != j.id {
			continue
		}
		switch r.Endpoint {
		case fakebuildkite.EPStart, fakebuildkite.EPChunks, fakebuildkite.EPFinish:
			t.Errorf("the controller sent %s %s for a job Buildkite had ended", r.Method, r.Path)
		}
	}
}
