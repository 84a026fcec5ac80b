package drain

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// env is the control plane every test of the package shares.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

// Issue 23: the drain's BuildJobs are deleted marked as stopped for the uninstall, so that
// the controller says in each job's log that the operator is being uninstalled (and
// finishes it with agent_stop, as for any deleted BuildJob: TestDeletedBuildJobStopsItsJob).
// A BuildJob someone deleted by hand before the drain keeps the words of its own deletion.
func TestDrainMarksTheUninstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := env.Client

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "drain-"}}
	require.NoError(t, cl.Create(ctx, ns))
	names := []string{"running-1", "running-2", "deleted-by-hand"}
	for _, name := range names {
		bj := gen.BuildJob(name, gen.SetBuildJobNamespace(ns.Name))
		// The controller's finalizer keeps a deleted BuildJob until its job is ended.
		bj.Finalizers = []string{buildjob.Finalizer}
		require.NoError(t, cl.Create(ctx, bj))
	}
	byHand := &bkv1.BuildJob{}
	require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "deleted-by-hand"}, byHand))
	require.NoError(t, cl.Delete(ctx, byHand))

	// A stand-in for the controller: it records the stop reason each BuildJob had when it
	// found it deleted, and lets it go.
	var mu sync.Mutex
	reasons := map[string]string{}
	stopCtl := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stopCtl:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var list bkv1.BuildJobList
			if cl.List(ctx, &list, client.InNamespace(ns.Name)) != nil {
				continue
			}
			for i := range list.Items {
				bj := &list.Items[i]
				if bj.DeletionTimestamp.IsZero() {
					continue
				}
				mu.Lock()
				reasons[bj.Name] = bj.Annotations[bkv1.AnnotationStopReason]
				mu.Unlock()
				bj.Finalizers = nil
				_ = cl.Update(ctx, bj)
			}
		}
	}()
	defer func() { close(stopCtl); <-done }()

	require.NoError(t, (&Drainer{Client: cl, Out: io.Discard}).endBuildJobs(ctx, ns.Name))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]string{
		"running-1":       bkv1.StopReasonUninstall,
		"running-2":       bkv1.StopReasonUninstall,
		"deleted-by-hand": "",
	}, reasons)
}
