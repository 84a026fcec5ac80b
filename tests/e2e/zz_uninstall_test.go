package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestZZUninstall runs last: `helm uninstall` while jobs run, then the namespace is deleted.
// The chart's drain hook turns the spawner off and ends each running job on Buildkite, with
// an explanation in its log, before the operator goes; nothing is left running, no job is
// finished twice, and the namespace is gone within a minute.
func TestZZUninstall(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "the operator runs in the cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const n = 3
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline: "e2e-uninstall",
		PipelineYAML: fmt.Sprintf(`agents:
  queue: bk-operator
steps:
  - command: echo "started"; sleep 600; echo "never printed"
    parallelism: %d
`, n),
	})
	require.NoError(t, err)
	for _, id := range b.Jobs {
		_, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool {
			return strings.Contains(fakebuildkite.PlainLog(j.Log), "started") || fakebuildkite.IsTerminal(j.State)
		})
		require.NoError(t, err)
	}

	t0 := time.Now()
	require.NoError(t, e.Release.Uninstall(ctx))
	recordTiming("uninstall: helm uninstall with %d running jobs took %s", n, time.Since(t0).Round(10*time.Millisecond))
	for _, id := range b.Jobs {
		j, ok := e.Fake.Job(id)
		require.True(t, ok, "job %s", id)
		log := fakebuildkite.PlainLog(j.Log)
		assert.True(t, fakebuildkite.IsTerminal(j.State), "job %s is %s after the uninstall; log:\n%s", id, j.State, log)
		assert.Equal(t, 1, j.FinishCount, "job %s is finished exactly once", id)
		assert.Contains(t, log, "buildkite-operator", "job %s's log explains why it ended:\n%s", id, log)
		assert.NotContains(t, log, "\nnever printed\n", "job %s was stopped, not run to its end", id)
	}
	assert.Zero(t, e.Fake.ConnectedAgents(), "no agent of the uninstalled operator is still connected")

	// The job namespace is kept by helm (the chart says so: it may hold environments a user
	// wants back); both namespaces delete at once, nothing left holding them.
	t1 := time.Now()
	for _, name := range []string{e.Namespace, e.JobNamespace} {
		ns := &corev1.Namespace{}
		require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Name: name}, ns), "namespace %s after the uninstall", name)
		require.NoError(t, e.Client.Delete(ctx, ns))
	}
	deadline, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	for _, name := range []string{e.Namespace, e.JobNamespace} {
		ns := &corev1.Namespace{}
		for {
			err := e.Client.Get(deadline, client.ObjectKey{Name: name}, ns)
			if apierrors.IsNotFound(err) {
				break
			}
			require.NoError(t, deadline.Err(), "namespace %s still there a minute after its deletion: %+v", name, ns.Status)
			time.Sleep(500 * time.Millisecond)
		}
	}
	recordTiming("uninstall: both namespaces deleted in %s", time.Since(t1).Round(10*time.Millisecond))
}
