package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/attacker"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// TestSquatGetsNothing plays, against the chart-installed operator, a namespace editor
// who knows the UUID of a job Buildkite has not dispatched yet (the fake's pings are held
// back meanwhile) and tries to take it: a BuildJob under the job's name running her own
// command with the step's secret env, and a Secret under the name the job's token Secret
// used to have. The webhook refuses the BuildJob; the Secret gets nothing when the job is
// dispatched; the job runs once, with its own BuildJob and sealed token Secret.
func TestSquatGetsNothing(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	mallory, err := attacker.Client(ctx, e.Client, e.REST, e.JobNamespace)
	require.NoError(t, err)

	e.Fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPPing, Status: 503, Message: "held back by TestSquatGetsNothing"})
	// The streaming ping too, or it hands the job out while pings are held back.
	e.Fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPStreamPings, Status: 503, Message: "held back by TestSquatGetsNothing"})
	released := false
	release := func() {
		if !released {
			e.Fake.ClearFaults()
			released = true
		}
	}
	defer release()
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline:     "payments",
		PipelineYAML: "steps:\n  - command: test \"$DEPLOY_PASSWORD\" = hunter2 && echo deployed with the password\n    agents:\n      queue: bk-operator\n    env:\n      DEPLOY_PASSWORD: hunter2\n",
	})
	require.NoError(t, err)
	jobID := b.Jobs[0]
	name := strings.ToLower(jobID)

	squat := gen.BuildJob(name, gen.SetBuildJobNamespace(e.JobNamespace), gen.SetBuildJobJobID(name),
		gen.SetBuildJobCommand("echo stolen: $DEPLOY_PASSWORD $BUILDKITE_AGENT_ACCESS_TOKEN"),
		func(bj *bkv1.BuildJob) { bj.Spec.EnvNames = []string{"DEPLOY_PASSWORD"} })
	err = mallory.Create(ctx, squat)
	require.Error(t, err, "the webhook let an editor make a BuildJob in a waiting job's name")
	assert.Contains(t, err.Error(), "named after a Buildkite job")
	trap := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-token", Namespace: e.JobNamespace}}
	require.NoError(t, mallory.Create(ctx, trap), "an editor may make Secrets")

	release()
	snap, err := e.Fake.WaitJob(ctx, jobID, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
	require.NoError(t, err, "the job did not end")
	assert.Equal(t, "0", snap.ExitStatus, "log:\n%s", snap.Log)
	assert.Equal(t, 1, snap.FinishCount)
	assert.Contains(t, string(snap.Log), "deployed with the password")
	assert.NotContains(t, string(snap.Log), "stolen")

	var got corev1.Secret
	require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(trap), &got))
	assert.Empty(t, got.Data, "the editor's Secret got the job's token or env")
	var list bkv1.BuildJobList
	require.NoError(t, e.Client.List(ctx, &list, client.InNamespace(e.JobNamespace), client.MatchingLabels{bkv1.LabelJob: name}))
	require.Len(t, list.Items, 1, "one BuildJob for the job")
	own := list.Items[0]
	assert.False(t, bkv1.MadeByHand(&own), "the job's BuildJob is the operator's")
	assert.NotEqual(t, trap.Name, own.Spec.TokenSecretRef.Name, "the job's token Secret is not under the name the editor took")
}
