package buildjob_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// TestWithOnlyTheChartsRBAC runs the controller as the chart's ServiceAccount (impersonated,
// with the chart's Roles and ClusterRole rendered for the test's namespace as the job
// namespace and nothing else):
// a job that passes, one that fails and one canceled on Buildkite all go through.
func TestWithOnlyTheChartsRBAC(t *testing.T) {
	w := prepareWorld(t)
	w.cfg = asChartServiceAccount(t, w)
	w.startController(testOptions())

	for i, exit := range []int{0, 3} {
		j := w.acceptJob()
		w.createBuildJob(j)
		w.run(j.name)
		s := w.supervisor(j).write(fmt.Sprintf("job %d\n", i))
		w.kubelet(j.name, terminate(int32(exit), "Completed", s.exited(exit, "", "")))
		bj := w.waitReported(j.name)
		require.Equal(t, int32(exit), *bj.Status.ExitStatus)
	}

	// Canceled before its command started: the controller polls Buildkite, deletes the pod
	// and finishes the job, all with the chart's permissions.
	j := w.acceptJob()
	w.createBuildJob(j)
	require.NoError(t, w.bk.CancelJob(j.id))
	w.waitReported(j.name)
}

// asChartServiceAccount installs the chart's ServiceAccount and RBAC for a release in a
// namespace of its own whose job namespace is w's, and returns a config that impersonates
// that ServiceAccount: the controller needs nothing in the operator's namespace.
func asChartServiceAccount(t *testing.T, w *world) *rest.Config {
	t.Helper()
	release := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "operator-"}}
	require.NoError(t, w.c.Create(w.ctx, release))
	user, err := helmchart.ApplyServiceAccount(w.ctx, w.c, release.Name, w.ns)
	require.NoError(t, err)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}
