package webhook_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/attacker"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// TestOnlyTheOperatorMakesJobBuildJobs: a namespace editor may make BuildJobs by hand,
// but neither under a Buildkite job's name (a squat on a job still waiting in Buildkite)
// nor with the intake annotation; the operator (here the test's admin, who the webhook's
// SelfSubjectReview finds the manager runs as) may do both.
func TestOnlyTheOperatorMakesJobBuildJobs(t *testing.T) {
	ctx := context.Background()
	ns := "intake-rules"
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	require.NoError(t, env.Client.Create(ctx, gen.BuildEnvironment(defaultEnvironment, gen.SetBuildEnvironmentNamespace(ns))))
	mallory, err := attacker.Client(ctx, env.Client, env.Config, ns)
	require.NoError(t, err)

	const jobID = "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f"
	for _, tc := range []struct {
		name    string
		job     *bkv1.BuildJob
		refused string // "" when an editor may make it
	}{
		{"a job's name", gen.BuildJob(jobID, gen.SetBuildJobJobID(jobID)), "named after a Buildkite job"},
		{"a job's other name", gen.BuildJob(jobID + "-abcdefgh"), "named after a Buildkite job"},
		{"the intake annotation", gen.BuildJob("try-it", gen.SetBuildJobIntake("abcdefgh")), "only the operator marks"},
		{"made by hand", gen.BuildJob("try-env"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := gen.BuildJobFrom(tc.job, gen.SetBuildJobNamespace(ns))
			err := mallory.Create(ctx, job.DeepCopy())
			if tc.refused == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "an editor made it")
			assert.Contains(t, err.Error(), tc.refused)
			assert.Contains(t, err.Error(), attacker.User, "the message names who was refused")
			require.NoError(t, env.Client.Create(ctx, job.DeepCopy()), "the operator may")
		})
	}
}
