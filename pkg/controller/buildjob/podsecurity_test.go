package buildjob_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// In a job namespace that enforces the restricted Pod Security Standard (as the chart makes
// it), the API server's admission accepts the pod of an ordinary environment as the
// controller builds it; an environment that runs as root is refused, and the job fails with
// a log that says whom to ask.
func TestRestrictedJobNamespace(t *testing.T) {
	w := prepareWorld(t)
	ns := &corev1.Namespace{}
	require.NoError(t, w.c.Get(w.ctx, client.ObjectKey{Name: w.ns}, ns))
	patch := client.MergeFrom(ns.DeepCopy())
	ns.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	require.NoError(t, w.c.Patch(w.ctx, ns, patch))
	require.NoError(t, w.c.Create(w.ctx, gen.BuildEnvironment("root",
		gen.SetBuildEnvironmentNamespace(w.ns),
		gen.SetBuildEnvironmentImage("bk-operator/job:dev"),
		gen.SetBuildEnvironmentAllow(bkv1.Allow{RunAsRoot: true}),
		func(e *bkv1.BuildEnvironment) {
			e.Spec.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr(int64(0))}
		},
	)))
	opts := testOptions()
	opts.PodSecurity = podbuilder.PodSecurityRestricted
	w.startController(opts)

	ok := w.acceptJob()
	w.createBuildJob(ok)
	pod := w.waitPod(ok.name)
	assert.Equal(t, ptr(podbuilder.DefaultRestrictedUser), pod.Spec.SecurityContext.RunAsUser)

	root := w.acceptJob()
	w.createBuildJob(root, gen.SetBuildJobEnvironment("root"))
	bj := w.waitReported(root.name)
	finished := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionFinished)
	require.NotNil(t, finished)
	assert.Equal(t, bkv1.ReasonPodRejected, finished.Reason)
	log := string(w.bkSnapshot(root.id).Log)
	assert.Contains(t, log, `violates PodSecurity "restricted`)
	assert.Contains(t, log, `enforces a Pod Security level that BuildEnvironment "root" does not meet: ask a cluster operator`)
}
