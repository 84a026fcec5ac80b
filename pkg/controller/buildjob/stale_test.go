package buildjob_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
)

// A reconcile brought by a pod's event can be handed a BuildJob older than what this
// process wrote (the BuildJobs' informer lags the pods' under load: 1000 jobs in flight on
// kwok made one). A pod that is gone is not made again from such a copy, which shows no
// pod: a second pod would start a job Buildkite has finished, or run a job twice.
func TestNoPodFromAStaleCopy(t *testing.T) {
	cases := []struct {
		name string
		// then takes the job from its running pod to where the pod is deleted.
		then func(w *world, r *buildjob.Reconciler, j bkJob, req reconcile.Request)
	}{
		{
			name: "the job is reported, and its pod deleted after",
			then: func(w *world, r *buildjob.Reconciler, j bkJob, req reconcile.Request) {
				s := w.supervisor(j).write("ok\n")
				w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
				reconcileUntil(w, r, req, "the job is reported", func(bj *bkv1.BuildJob) bool { return bj.Status.Times.ReportedAt != nil })
			},
		},
		{
			name: "the job runs, its pod recorded in the status, and the pod is deleted",
			then: func(w *world, r *buildjob.Reconciler, j bkJob, req reconcile.Request) {
				w.supervisor(j).write("working\n")
				reconcileUntil(w, r, req, "the status says the job runs", func(bj *bkv1.BuildJob) bool { return bj.Status.Phase == bkv1.PhaseRunning })
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := prepareWorld(t)
			opts := testOptions()
			opts.AgentEndpoint = w.bk.Endpoint()
			var stale *bkv1.BuildJob
			r := buildjob.NewReconcilerForTest(staleClient(t, &stale), opts)
			// The BuildJob comes after this process began and its margin (creation times
			// have whole seconds): nothing is asked of Buildkite before its pod is made, as
			// for any new job.
			_, err := r.Reconcile(w.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: "none"}})
			require.NoError(t, err)
			time.Sleep(3100 * time.Millisecond)

			j := w.acceptJob()
			w.createBuildJob(j, func(bj *bkv1.BuildJob) { bj.Finalizers = []string{buildjob.Finalizer} }) // as the spawner makes it
			before := w.buildJob(j.name)
			req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: j.name}}
			reconcileUntil(w, r, req, "the pod is made", func(*bkv1.BuildJob) bool { return w.podExists(j.name) })
			w.run(j.name)
			tc.then(w, r, j, req)
			w.forceDeletePod(j.name) // no kubelet here would end a graceful deletion
			require.Eventually(t, func() bool { return !w.podExists(j.name) }, waitFor, tick)

			stale = before
			_, err = r.Reconcile(w.ctx, req)
			require.NoError(t, err)
			assert.False(t, w.podExists(j.name), "the job's pod was made again from a copy of its BuildJob that shows no pod")
			assert.LessOrEqual(t, w.bkSnapshot(j.id).FinishCount, 1)
		})
	}
}

// staleClient is the test API server's client, except that it hands out *stale as the
// BuildJob of its name while *stale is set, as a lagging cache would.
func staleClient(t *testing.T, stale **bkv1.BuildJob) client.Client {
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	return interceptor.NewClient(wc, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if bj, ok := obj.(*bkv1.BuildJob); ok && *stale != nil && key.Name == (*stale).Name {
				(*stale).DeepCopyInto(bj)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
}

// reconcileUntil runs r's reconcile of req until done says so of the BuildJob.
func reconcileUntil(w *world, r *buildjob.Reconciler, req reconcile.Request, what string, done func(*bkv1.BuildJob) bool) {
	w.t.Helper()
	require.Eventually(w.t, func() bool {
		_, err := r.Reconcile(w.ctx, req)
		require.NoError(w.t, err)
		return done(w.buildJob(req.Name))
	}, waitFor, tick, what)
}
