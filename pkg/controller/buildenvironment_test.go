package controller_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// A job whose environment is missing or forbidden is told, in its Buildkite log, which
// environments its pipeline may use and the nearest name, with no Kubernetes field paths
// or kubectl commands.
func TestUnusableEnvironmentIsExplainedToTheAuthor(t *testing.T) {
	w := newWorld(t, testOptions())
	for _, e := range []*bkv1.BuildEnvironment{
		gen.BuildEnvironment("go-1-26", gen.SetBuildEnvironmentNamespace(w.ns), gen.SetBuildEnvironmentAllowedPipelines("my-*")),
		gen.BuildEnvironment("payments", gen.SetBuildEnvironmentNamespace(w.ns), gen.SetBuildEnvironmentAllowedPipelines("payments-*")),
	} {
		require.NoError(t, w.c.Create(w.ctx, e))
	}
	cases := []struct {
		name  string
		asked string
		want  []string
	}{
		{
			name:  "missing",
			asked: "go-1-25",
			want: []string{
				`BuildEnvironment "go-1-25" does not exist.`,
				`Did you mean "go-1-26"?`,
				`Pipeline "my-app" may use "go", "go-1-26";`,
			},
		},
		{
			name:  "forbidden",
			asked: "payments",
			want: []string{
				`The pipeline "my-app" may not use BuildEnvironment "payments", which is for pipelines matching "payments-*".`,
				`Pipeline "my-app" may use "go", "go-1-26";`,
				`ask a cluster operator to allow pipeline "my-app" in BuildEnvironment "payments"`,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			w.createBuildJob(j, gen.SetBuildJobEnvironment(tc.asked))
			bj := w.waitReported(j.name)
			assert.Equal(t, bkv1.PhaseFailed, bj.Status.Phase)
			assert.Equal(t, bkv1.ReasonEnvironmentNotFound, condition(bj, bkv1.ConditionFinished).Reason)
			snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
			require.NoError(t, err)
			log := fakebuildkite.PlainLog(snap.Log)
			for _, want := range tc.want {
				assert.Contains(t, log, want)
				assert.Contains(t, bj.Status.Message, want)
			}
			assert.NotContains(t, log, "spec.")
			assert.NotContains(t, log, "kubectl")
		})
	}
	w.t = t
}
