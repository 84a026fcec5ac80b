package spawner_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestStopDuringIntakeKeepsTheBuildJob stops the spawner (its lease lost, say) while it
// creates a job's token Secret, after the BuildJob. The BuildJob must be left for the next
// spawner to adopt, not deleted: a BuildJob being deleted is a cancel, and the chaos soak
// saw two undisturbed jobs finished as cancelled that way.
func TestStopDuringIntakeKeepsTheBuildJob(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)

	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	var (
		first *running
		once  sync.Once
	)
	cl := interceptor.NewClient(wc, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			// The job's token Secret: the one the spawner makes in the job namespace.
			if s, ok := obj.(*corev1.Secret); ok && s.Labels[v1alpha1.LabelJob] != "" {
				stopped := false
				once.Do(func() { first.cancel(); stopped = true })
				if stopped {
					return context.Canceled
				}
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	first = startSpawnerWith(t, fake, ns, cl, func(sc *spawner.Config) { sc.Slots = 1 })
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	select {
	case <-first.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the spawner did not stop")
	}
	first.sp.StopHeartbeats()

	var bj v1alpha1.BuildJob
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: b.Jobs[0]}, &bj),
		"the BuildJob of the job in hand was deleted")
	assert.Nil(t, bj.DeletionTimestamp, "the BuildJob of the job in hand is being deleted: the job would be cancelled")

	startSpawner(t, fake, ns, func(sc *spawner.Config) { sc.Slots = 1 })
	waitJobsFinished(t, fake, b.Jobs, 60*time.Second)
	j, _ := fake.Job(b.Jobs[0])
	assert.Equal(t, "0", j.ExitStatus, "log:\n%s", fakebuildkite.PlainLog(j.Log))
}
