package buildjob_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/tests/attacker"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// TestNoBuildkiteForBuildJobsTheOperatorDidNotMake plays a namespace editor on a cluster
// that runs without webhooks (nothing here serves them): she makes BuildJobs for a job the
// operator never accepted, naming as their token Secret the sealed one of a job the
// operator did accept. One is made by hand; the other forges the intake annotation. The
// controller must not speak to Buildkite about the job they name at all, must never run
// the forged one (its Secret is not sealed for it), and runs the hand-made one without
// Buildkite.
func TestNoBuildkiteForBuildJobsTheOperatorDidNotMake(t *testing.T) {
	opts := testOptions()
	opts.TokenWaitTimeout = 2 * time.Second
	w := newWorld(t, opts)
	mallory, err := attacker.Client(w.ctx, w.c, env.Config, w.ns)
	require.NoError(t, err)

	accepted := w.acceptJob()
	w.createBuildJob(accepted)
	victim, err := w.bk.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline:     "payments",
		PipelineYAML: "steps:\n  - command: make deploy\n    agents:\n      queue: somewhere-else\n",
	})
	require.NoError(t, err)
	victimID := victim.Jobs[0]

	borrowed := bkv1.SecretKeyRef{Name: accepted.name + "-token", Key: bkv1.DefaultSecretKey}
	mods := []gen.BuildJobModifier{
		gen.SetBuildJobNamespace(w.ns), gen.SetBuildJobJobID(victimID), gen.SetBuildJobEnvironment(envName),
		gen.SetBuildJobAgentEndpoint(w.bk.Endpoint()), gen.SetBuildJobTokenSecretRef(borrowed),
	}
	forged := gen.BuildJob("forged", append(mods, gen.SetBuildJobIntake("guessed"))...)
	handMade := gen.BuildJob("hand-made", mods...)
	require.NoError(t, mallory.Create(w.ctx, forged))
	require.NoError(t, mallory.Create(w.ctx, handMade))

	// The forged one waits for a sealed Secret that never comes, then fails unreported.
	got := w.waitBuildJob(forged.Name, "the forged BuildJob given up", func(bj *bkv1.BuildJob) bool {
		c := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionReported)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == bkv1.ReasonTokenSecretMissing
	})
	assert.Contains(t, got.Status.Message, "not sealed for it")
	err = w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: forged.Name}, &corev1.Pod{})
	assert.True(t, apierrors.IsNotFound(err), "no pod for the forged BuildJob: %v", err)

	// The hand-made one runs, and its end is not reported to Buildkite.
	pod := w.waitPod(handMade.Name)
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				assert.NotEqual(t, borrowed.Name, e.ValueFrom.SecretKeyRef.Name, "the hand-made pod reads the borrowed Secret (%s)", e.Name)
			}
		}
	}
	w.run(handMade.Name)
	w.kubelet(handMade.Name, terminate(0, "Completed", &jobprogress.Progress{ExitStatus: 0}))
	w.waitBuildJob(handMade.Name, "the hand-made BuildJob over, unreported", func(bj *bkv1.BuildJob) bool {
		c := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionReported)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == bkv1.ReasonMadeByHand
	})

	// Give a stray poll of the job's state time to happen before counting.
	time.Sleep(2 * opts.JobStatePollInterval)
	assert.Zero(t, w.bk.RequestCount("", victimID), "requests about a job the operator never accepted")
	for _, r := range w.bk.Requests() {
		assert.NotEqual(t, victimID, r.JobID, "%s %s", r.Method, r.Path)
	}
	snap, ok := w.bk.Job(victimID)
	require.True(t, ok)
	assert.Zero(t, snap.StartCount+snap.FinishCount+snap.ChunkCount, "the victim job was touched")
}

// TestHandMadeBuildJobsWithoutWebhooks: without the webhooks nobody checks who made a
// BuildJob by hand, so it may not use an environment that gives its pods a Secret; it may
// still use one that gives none.
func TestHandMadeBuildJobsWithoutWebhooks(t *testing.T) {
	opts := testOptions()
	opts.Webhooks = false
	w := newWorld(t, opts)
	mallory, err := attacker.Client(w.ctx, w.c, env.Config, w.ns)
	require.NoError(t, err)
	require.NoError(t, w.c.Create(w.ctx, gen.BuildEnvironment("deploy",
		gen.SetBuildEnvironmentNamespace(w.ns),
		gen.SetBuildEnvironmentImage("bk-operator/job:dev"),
		func(e *bkv1.BuildEnvironment) {
			e.Spec.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "deploy-credentials"}}}}
			e.Spec.Allow.Secrets = []string{"deploy-credentials"}
		})))

	for _, tc := range []struct{ name, env string }{{"into-deploy", "deploy"}, {"into-plain", envName}} {
		require.NoError(t, mallory.Create(w.ctx, gen.BuildJob(tc.name, gen.SetBuildJobNamespace(w.ns), gen.SetBuildJobEnvironment(tc.env))))
	}
	got := w.waitBuildJob("into-deploy", "refused", func(bj *bkv1.BuildJob) bool {
		c := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionFinished)
		return c != nil && c.Reason == bkv1.ReasonEnvironmentUnchecked
	})
	assert.Contains(t, got.Status.Message, `Secret "deploy-credentials"`)
	err = w.c.Get(w.ctx, client.ObjectKey{Namespace: w.ns, Name: "into-deploy"}, &corev1.Pod{})
	assert.True(t, apierrors.IsNotFound(err), "no pod in the environment with a Secret: %v", err)
	w.waitPod("into-plain")
}
