package buildjob_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
)

// A reconcile brought by a pod's event can be handed a BuildJob older than the report this
// process recorded (the BuildJobs' informer lags the pods' under load: 1000 jobs in flight
// on kwok). Its pod, deleted after the report, is not made again from it: a second pod
// would start a job Buildkite has finished.
func TestNoPodFromAStaleCopyOfAReportedJob(t *testing.T) {
	w := prepareWorld(t)
	opts := testOptions()
	opts.AgentEndpoint = w.bk.Endpoint()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	var stale *bkv1.BuildJob
	c := interceptor.NewClient(wc, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if bj, ok := obj.(*bkv1.BuildJob); ok && stale != nil && key.Name == stale.Name {
				stale.DeepCopyInto(bj)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	r := buildjob.NewReconcilerForTest(c, opts)
	// The BuildJob comes after this process began and its margin (creation times have
	// whole seconds): it asks Buildkite nothing before making the pod, as for any new job.
	_, err = r.Reconcile(w.ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: "none"}})
	require.NoError(t, err)
	time.Sleep(3100 * time.Millisecond)

	j := w.acceptJob()
	w.createBuildJob(j, func(bj *bkv1.BuildJob) { bj.Finalizers = []string{buildjob.Finalizer} }) // as the spawner makes it
	before := w.buildJob(j.name)
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: j.name}}
	reconcileUntil := func(what string, done func() bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			_, err := r.Reconcile(w.ctx, req)
			require.NoError(t, err)
			return done()
		}, waitFor, tick, what)
	}
	reconcileUntil("the pod is made", func() bool { return w.podExists(j.name) })
	w.run(j.name)
	s := w.supervisor(j).write("ok\n")
	w.kubelet(j.name, terminate(0, "Completed", s.exited(0, "", "")))
	reconcileUntil("the job is reported", func() bool { return w.buildJob(j.name).Status.Times.ReportedAt != nil })
	w.forceDeletePod(j.name) // its deletion after the report: no kubelet here ends it
	require.Eventually(t, func() bool { return !w.podExists(j.name) }, waitFor, tick)

	stale = before
	_, err = r.Reconcile(w.ctx, req)
	require.NoError(t, err)
	require.False(t, w.podExists(j.name), "a pod was made again for a reported job, from a stale copy of its BuildJob")
	require.Equal(t, 1, w.bkSnapshot(j.id).FinishCount)
}
