package controller_test

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// TestWithOnlyTheChartsRBAC runs the controller as the chart's ServiceAccount (impersonated,
// with the chart's Role and ClusterRole rendered for the test's namespace and nothing else):
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

// asChartServiceAccount installs the chart's ServiceAccount and RBAC for w's namespace and
// returns a config that impersonates that ServiceAccount.
func asChartServiceAccount(t *testing.T, w *world) *rest.Config {
	t.Helper()
	out, err := helmchart.Render(w.ns, "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml")
	require.NoError(t, err)
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	var name string
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil || len(obj.Object) == 0 {
			continue
		}
		if obj.GetKind() == "ServiceAccount" {
			name = obj.GetName()
		}
		require.NoError(t, w.c.Create(w.ctx, obj), "creating %s %s", obj.GetKind(), obj.GetName())
	}
	require.NotEmpty(t, name, "the chart renders a ServiceAccount")
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("system:serviceaccount:%s:%s", w.ns, name)}
	return cfg
}
