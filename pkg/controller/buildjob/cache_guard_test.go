package buildjob_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// cacheTransform is the transform ConfigureCache gives BuildJobs.
func cacheTransform(t testing.TB) func(any) (any, error) {
	t.Helper()
	var opts cache.Options
	buildjob.ConfigureCache(&opts)
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*bkv1.BuildJob); ok && by.Transform != nil {
			return by.Transform
		}
	}
	require.FailNow(t, "ConfigureCache gives BuildJobs no transform")
	return nil
}

// reportedSpawnerJob is a reported BuildJob let go of by the controller (no finalizer),
// shaped as the spawner makes them, in namespace ns.
func reportedSpawnerJob(name, ns string) *bkv1.BuildJob {
	bj := gen.BuildJob(name,
		gen.SetBuildJobNamespace(ns),
		gen.SetBuildJobEnvironment(envName),
		gen.SetBuildJobAgentTags(map[string]string{"queue": "bk-operator"}),
		gen.SetBuildJobLogPaths("/workspace/service.log"),
		gen.SetBuildJobAgentEndpoint("https://agent.buildkite.com/v3"),
	)
	bj.Spec.EnvNames = []string{"BUILDKITE_BRANCH", "BUILDKITE_COMMIT", "BUILDKITE_MESSAGE"}
	now := metav1.Now()
	bj.Status = bkv1.BuildJobStatus{
		Phase: bkv1.PhaseSucceeded, ExitStatus: ptr(int32(0)), PodName: name,
		Times: bkv1.BuildJobTimes{FinishedAt: &now, ReportedAt: &now},
		Conditions: []metav1.Condition{{
			Type: bkv1.ConditionReported, Status: metav1.ConditionTrue, Reason: bkv1.ReasonReported,
			Message: "Buildkite accepted the finish", LastTransitionTime: now,
		}},
	}
	return bj
}

// TestGuardTrimmed: the guarded client refuses, before any request, every write that could
// put a trimmed copy (or its mark) over the stored BuildJob, and lets through the rest.
func TestGuardTrimmed(t *testing.T) {
	transform := cacheTransform(t)
	cases := []struct {
		name    string
		trimmed bool
		write   func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error
		refused bool
	}{
		{name: "update of a trimmed copy", trimmed: true, refused: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.Labels = map[string]string{"a": "b"}
			return c.Update(ctx, bj)
		}},
		{name: "status update of a trimmed copy", trimmed: true, refused: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.Status.Message = "changed"
			return c.Status().Update(ctx, bj)
		}},
		{name: "status subresource update of a trimmed copy", trimmed: true, refused: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.Status.Message = "changed"
			return c.SubResource("status").Update(ctx, bj)
		}},
		{name: "create from a trimmed copy", trimmed: true, refused: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.ResourceVersion, bj.Name = "", bj.Name+"-again"
			return c.Create(ctx, bj)
		}},
		{name: "server-side apply of a trimmed copy", trimmed: true, refused: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.ManagedFields, bj.ResourceVersion = nil, ""
			whole, err := json.Marshal(bj)
			if err != nil {
				return err
			}
			return c.Patch(ctx, bj, client.RawPatch(types.ApplyPatchType, whole), client.FieldOwner("test"), client.ForceOwnership)
		}},
		{name: "a patch that would store the mark", trimmed: true, refused: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			patch := client.MergeFrom(&bkv1.BuildJob{})
			return c.Patch(ctx, bj, patch)
		}},
		{name: "a diff patch made from a trimmed copy", trimmed: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			patch := client.MergeFrom(bj.DeepCopy())
			bj.Labels = map[string]string{"a": "b"}
			return c.Patch(ctx, bj, patch)
		}},
		{name: "delete of a trimmed copy", trimmed: true, write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			return c.Delete(ctx, bj, client.Preconditions{UID: &bj.UID})
		}},
		{name: "update of a whole copy", write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.Labels = map[string]string{"a": "b"}
			return c.Update(ctx, bj)
		}},
		{name: "status update of a whole copy", write: func(ctx context.Context, c client.Client, bj *bkv1.BuildJob) error {
			bj.Status.Message = "changed"
			return c.Status().Update(ctx, bj)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stored := reportedSpawnerJob("j", "jobs")
			stored.UID = "uid-1"
			c := fake.NewClientBuilder().WithScheme(testenv.Scheme()).WithObjects(stored).WithStatusSubresource(&bkv1.BuildJob{}).Build()
			ctx := context.Background()
			bj := &bkv1.BuildJob{}
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(stored), bj))
			before := bj.DeepCopy()
			if tc.trimmed {
				out, err := transform(bj)
				require.NoError(t, err)
				bj = out.(*bkv1.BuildJob)
				require.True(t, buildjob.TrimmedInCache(bj))
			}

			err := tc.write(ctx, buildjob.GuardTrimmed(c), bj)

			if !tc.refused {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, buildjob.ErrTrimmedCopy)
			assert.Contains(t, err.Error(), "jobs/j", "the error names the BuildJob")
			after := &bkv1.BuildJob{}
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(stored), after))
			assert.Equal(t, before, after, "a refused write must not reach the API server")
		})
	}
}

// startTestCache starts a cache configured as agentd's on namespace ns, until the test ends.
func startTestCache(t *testing.T, ctx context.Context, ns string) cache.Cache {
	t.Helper()
	opts := cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}}
	buildjob.ConfigureCache(&opts)
	c, err := cache.New(env.Config, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.True(t, c.WaitForCacheSync(ctx), "the cache did not sync")
	return c
}

// createReported stores bj as reported: created, then its status written.
func createReported(t *testing.T, ctx context.Context, c client.Client, bj *bkv1.BuildJob) *bkv1.BuildJob {
	t.Helper()
	st := bj.Status
	require.NoError(t, c.Create(ctx, bj))
	bj.Status = st
	require.NoError(t, c.Status().Update(ctx, bj))
	return bj
}

// waitTrimmed waits until the cache holds the BuildJob trimmed, and returns that copy.
func waitTrimmed(t *testing.T, ctx context.Context, c client.Reader, key types.NamespacedName) *bkv1.BuildJob {
	t.Helper()
	var got *bkv1.BuildJob
	require.Eventually(t, func() bool {
		bj := &bkv1.BuildJob{}
		if err := c.Get(ctx, key, bj); err != nil {
			return false
		}
		got = bj
		return buildjob.TrimmedInCache(bj)
	}, waitFor, tick, "the cache never trimmed BuildJob %s", key)
	return got
}

// TestAPIServerRefusesTrimmedCopy: without the guard, the API server itself keeps a trimmed
// copy from replacing the stored BuildJob: an Update is Invalid (the spec is immutable), and
// a status Update takes the status alone, so neither the dropped spec nor the mark is ever
// stored. This is what makes trimming safe for every writer, not only the guarded ones.
func TestAPIServerRefusesTrimmedCopy(t *testing.T) {
	w := prepareWorld(t)
	stored := createReported(t, w.ctx, w.c, reportedSpawnerJob("reported", w.ns))
	want := w.buildJob(stored.Name)
	require.NotEmpty(t, want.Spec.EnvNames)
	require.NotEmpty(t, want.Spec.Command)

	c := startTestCache(t, w.ctx, w.ns)
	key := client.ObjectKeyFromObject(stored)
	trimmed := waitTrimmed(t, w.ctx, c, key)
	assert.Empty(t, trimmed.Spec.EnvNames, "the cache's copy lacks the env names")
	assert.Empty(t, trimmed.Spec.Command, "the cache's copy lacks the command")

	// Update: refused by the CRD's validation.
	upd := trimmed.DeepCopy()
	upd.Labels = map[string]string{"edited": "true"}
	err := env.Client.Update(w.ctx, upd)
	require.Error(t, err, "the API server took a trimmed copy as the BuildJob")
	assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
	assert.Contains(t, err.Error(), "spec is immutable")

	// Status update: the status is taken, nothing else.
	st := trimmed.DeepCopy()
	st.Status.Message = "status written from a trimmed copy"
	require.NoError(t, env.Client.Status().Update(w.ctx, st))

	// A diff patch made from the trimmed copy sends only what changed.
	var fresh *bkv1.BuildJob
	require.Eventually(t, func() bool {
		fresh = waitTrimmed(t, w.ctx, c, key)
		return fresh.Status.Message == st.Status.Message
	}, waitFor, tick, "the cache never saw the status written")
	patch := client.MergeFrom(fresh.DeepCopy())
	fresh.Labels = map[string]string{"patched": "true"}
	require.NoError(t, env.Client.Patch(w.ctx, fresh, patch))

	got := w.buildJob(stored.Name)
	assert.Equal(t, want.Spec, got.Spec, "the stored spec is whole")
	assert.NotContains(t, got.Annotations, buildjob.AnnotationCacheTrimmed, "the mark is never stored")
	assert.Equal(t, "status written from a trimmed copy", got.Status.Message)
	assert.Equal(t, "true", got.Labels["patched"])
	assert.NotContains(t, got.Labels, "edited")
}

// writeRecorder records the BuildJob writes the controller sends through the manager's
// client, and which of them were of a trimmed copy.
type writeRecorder struct {
	client.Client
	mu               sync.Mutex
	writes, trimmed  int
	trimmedRefusals  int
	trimmedWriteKeys []string
}

func (r *writeRecorder) note(obj client.Object, err error) error {
	bj, ok := obj.(*bkv1.BuildJob)
	if !ok {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	if buildjob.TrimmedInCache(bj) {
		r.trimmed++
		r.trimmedWriteKeys = append(r.trimmedWriteKeys, bj.Name)
	}
	if errors.Is(err, buildjob.ErrTrimmedCopy) {
		r.trimmedRefusals++
	}
	return err
}

func (r *writeRecorder) counts() (writes, trimmed, refusals int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes, r.trimmed, r.trimmedRefusals
}

func (r *writeRecorder) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return r.note(obj, r.Client.Update(ctx, obj, opts...))
}

func (r *writeRecorder) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return r.note(obj, r.Client.Patch(ctx, obj, patch, opts...))
}

func (r *writeRecorder) Status() client.SubResourceWriter {
	return statusRecorder{SubResourceWriter: r.Client.Status(), r: r}
}

type statusRecorder struct {
	client.SubResourceWriter
	r *writeRecorder
}

func (s statusRecorder) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.r.note(obj, s.SubResourceWriter.Update(ctx, obj, opts...))
}

func (s statusRecorder) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return s.r.note(obj, s.SubResourceWriter.Patch(ctx, obj, patch, opts...))
}

// startRecordedController runs the controller as startController does, on a manager whose
// client is GuardTrimmed's and records the BuildJob writes in rec.
func (w *world) startRecordedController(opts buildjob.Options, rec *writeRecorder) ctrl.Manager {
	w.t.Helper()
	opts.AgentEndpoint = w.bk.Endpoint()
	copts := cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}}
	buildjob.ConfigureCache(&copts)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  copts,
		NewClient: func(cfg *rest.Config, o client.Options) (client.Client, error) {
			c, err := client.New(cfg, o)
			if err != nil {
				return nil, err
			}
			rec.Client = buildjob.GuardTrimmed(c)
			return rec, nil
		},
	})
	require.NoError(w.t, err)
	require.NoError(w.t, buildjob.Setup(mgr, opts, controller.SetupOptions{SkipNameValidation: true}))
	ctx, cancel := context.WithCancel(w.ctx)
	w.stop, w.done = cancel, make(chan error, 1)
	go func() { w.done <- mgr.Start(ctx) }()
	w.t.Cleanup(w.stopController)
	return mgr
}

// TestControllerNeverWritesTrimmedCopy runs jobs through the controller, with the manager's
// cache as agentd's, to their reaping: each reported BuildJob is held trimmed in the cache
// for its retention and reaped from that copy, and the controller never sends a write of a
// trimmed copy (nor is refused one), while the stored BuildJobs keep their whole spec.
func TestControllerNeverWritesTrimmedCopy(t *testing.T) {
	w := prepareWorld(t)
	environment := &bkv1.BuildEnvironment{}
	require.NoError(t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, environment))
	environment.Spec.Retention = bkv1.Retention{
		SucceededPods: &metav1.Duration{Duration: 0},
		FailedPods:    &metav1.Duration{Duration: time.Second},
		BuildJobs:     &metav1.Duration{Duration: 6 * time.Second},
	}
	require.NoError(t, w.c.Update(w.ctx, environment))
	// Reported before a restart of the operator, whose finalizer was still to come off:
	// the controller removes it with an Update, which must be of a whole copy.
	leftover := reportedSpawnerJob("reported-before-a-restart", w.ns)
	leftover.Finalizers = []string{bkv1.FinishFinalizer}
	leftover = createReported(t, w.ctx, w.c, leftover)
	leftoverSpec := w.buildJob(leftover.Name).Spec
	rec := &writeRecorder{}
	mgr := w.startRecordedController(testOptions(), rec)
	waitTrimmed(t, w.ctx, mgr.GetCache(), client.ObjectKeyFromObject(leftover))
	assert.Equal(t, leftoverSpec, w.buildJob(leftover.Name).Spec, "the stored spec is whole")

	pass, fail, deleted := w.acceptJob(), w.acceptJob(), w.acceptJob()
	specs := map[string]bkv1.BuildJobSpec{}
	for _, j := range []bkJob{pass, fail, deleted} {
		w.createBuildJob(j,
			gen.SetBuildJobAgentTags(map[string]string{"queue": "bk-operator"}),
			gen.SetBuildJobLogPaths("/workspace/service.log"))
		specs[j.name] = w.buildJob(j.name).Spec
		w.run(j.name)
	}
	for j, status := range map[bkJob]int{pass: 0, fail: 1, deleted: 0} {
		s := w.supervisor(j).write("output\n")
		w.kubelet(j.name, terminate(0, "Completed", s.exited(status, "", "")))
	}

	for _, j := range []bkJob{pass, fail, deleted} {
		w.waitReported(j.name)
		key := types.NamespacedName{Namespace: w.ns, Name: j.name}
		waitTrimmed(t, w.ctx, mgr.GetCache(), key)
		assert.Equal(t, specs[j.name], w.buildJob(j.name).Spec, "BuildJob %s: the stored spec is whole", j.name)
	}
	// A retained BuildJob deleted by hand goes at once: nothing holds it any more.
	require.NoError(t, w.c.Delete(w.ctx, w.buildJob(deleted.name)))
	for _, j := range []bkJob{pass, fail, deleted} {
		w.waitGone(&bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: j.name}})
	}
	w.waitGone(&bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: leftover.Name}})
	require.Eventually(t, func() bool { return podIsGoing(w, fail.name) }, waitFor, tick, "the failed job's pod must be deleted")

	writes, trimmed, refusals := rec.counts()
	assert.Positive(t, writes, "the recorder saw none of the controller's BuildJob writes")
	assert.Zero(t, trimmed, "writes of a trimmed copy: %v", rec.trimmedWriteKeys)
	assert.Zero(t, refusals, "writes refused by GuardTrimmed")
}
