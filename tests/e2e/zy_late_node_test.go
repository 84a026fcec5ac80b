package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// A job whose pod waits for a node keeps waiting while a cluster autoscaler may still add
// one: the suite's operator runs with the default --unschedulable-timeout (30 minutes). The
// job is dispatched when the suite starts (startLateNodeJob) to an environment whose
// nodeSelector no node matches, so that its wait overlaps the whole suite (operator kills
// and chart upgrades included) instead of adding to it; TestZYNodeArrives, run after the
// other job tests, checks that it is still waiting past five minutes (the old bound),
// then gives the node the label, as an autoscaler's new node would have, and sees it run.

// lateNodeLabel is the node label the late-node environment selects.
const lateNodeLabel = "e2e.buildkite-operator.dev/late"

// lateWaitAtLeast is how long the pod must have waited for a node before one appears.
const lateWaitAtLeast = 5*time.Minute + 10*time.Second

// lateJobID is the late-node job, or "" when it could not be dispatched (lateErr says why).
var (
	lateJobID string
	lateErr   error
)

// startLateNodeJob applies the late-node environment and dispatches its job.
func startLateNodeJob(ctx context.Context, e *harness.Env) error {
	be := gen.BuildEnvironment("late-node",
		gen.SetBuildEnvironmentImage(e.Opts.JobImage), gen.SetBuildEnvironmentImagePullPolicy(e.Opts.JobImagePullPolicy),
		gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand),
		func(be *bkv1.BuildEnvironment) { be.Spec.NodeSelector = map[string]string{lateNodeLabel: "true"} })
	if err := e.ApplyEnvironment(ctx, be); err != nil {
		return fmt.Errorf("applying the late-node environment: %w", err)
	}
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline: "e2e-late-node",
		PipelineYAML: `agents:
  queue: bk-operator
steps:
  - command: echo "ran on the node that appeared"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: late-node
`,
	})
	if err != nil {
		return fmt.Errorf("dispatching the late-node job: %w", err)
	}
	lateJobID = b.Jobs[0]
	return nil
}

func TestZYNodeArrives(t *testing.T) {
	e := needEnv(t)
	require.NoError(t, lateErr, "the late-node job was not dispatched")
	ctx, cancel := context.WithTimeout(context.Background(), lateWaitAtLeast+3*time.Minute)
	defer cancel()

	waitForNotice(ctx, t, e, lateJobID, []string{"Waiting for a node", "didn't match Pod's node affinity/selector", "within 30 minutes"}, nil)
	pod, ok := jobPod(ctx, e, lateJobID)
	require.True(t, ok, "the late-node job has no pod")
	if left := time.Until(pod.CreationTimestamp.Add(lateWaitAtLeast)); left > 0 {
		t.Logf("the pod has waited %s for a node; waiting %s more before one appears", time.Since(pod.CreationTimestamp.Time).Round(time.Second), left.Round(time.Second))
		time.Sleep(left)
	}
	j, ok := e.Fake.Job(lateJobID)
	require.True(t, ok)
	require.False(t, fakebuildkite.IsTerminal(j.State), "the job ended before a node appeared; its log:\n%s", fakebuildkite.PlainLog(j.Log))
	_, shown := waitNotice(j)
	require.True(t, shown, "the wait notice is gone while the job still waits")
	pod, ok = jobPod(ctx, e, lateJobID)
	require.True(t, ok, "the late-node job's pod is gone")
	require.Equal(t, corev1.PodPending, pod.Status.Phase)
	require.Empty(t, pod.Spec.NodeName, "the pod was scheduled although no node had the label")
	waited := time.Since(pod.CreationTimestamp.Time)

	// A node "appears": the one node gets the label the environment selects.
	setNodeLabel(ctx, t, e, lateNodeLabel, "true")
	t.Cleanup(func() { setNodeLabel(context.Background(), t, e, lateNodeLabel, "") })

	j, err := e.Fake.WaitJob(ctx, lateJobID, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
	require.NoError(t, err)
	recordTiming("%-50s waited %s for a node, finished %s after it appeared", t.Name(), waited.Round(time.Second), time.Since(pod.CreationTimestamp.Add(waited)).Round(10*time.Millisecond))
	log := fakebuildkite.PlainLog(j.Log)
	assert.Equal(t, fakebuildkite.StateFinished, j.State, "log:\n%s", log)
	assert.Equal(t, "0", j.ExitStatus, "log:\n%s", log)
	assert.Contains(t, log, "ran on the node that appeared")
	assert.Equal(t, 1, j.FinishCount)
	_, shown = waitNotice(j)
	assert.False(t, shown, "the wait notice stays after the job ran")
}

// setNodeLabel sets label key to value on every node of the cluster, or removes it when
// value is empty.
func setNodeLabel(ctx context.Context, t *testing.T, e *harness.Env, key, value string) {
	t.Helper()
	var nodes corev1.NodeList
	require.NoError(t, e.Client.List(ctx, &nodes))
	require.NotEmpty(t, nodes.Items)
	for i := range nodes.Items {
		n := &nodes.Items[i]
		patch := client.MergeFrom(n.DeepCopy())
		if value == "" {
			delete(n.Labels, key)
		} else {
			n.Labels[key] = value
		}
		require.NoError(t, e.Client.Patch(ctx, n, patch), "labelling node %s", n.Name)
	}
}
