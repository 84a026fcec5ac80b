package buildjob

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// makeRoomForJob deletes one idle warm pod of the namespace per refusal: of any
// environment, those not yet running first, then the newest; never an assigned one, one
// that ended, or one that changed since the cache showed it (a job may just have been
// assigned it); and says which in an event.
func TestMakeRoomForJob(t *testing.T) {
	const ns = "jobs"
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	warmPod := func(name, env string, age time.Duration, phase corev1.PodPhase) *corev1.Pod {
		controller := true
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name),
				CreationTimestamp: metav1.NewTime(t0.Add(-age)),
				Labels:            map[string]string{podbuilder.LabelWarmPool: env},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: bkv1.GroupVersion.String(), Kind: "BuildEnvironment",
					Name: env, UID: types.UID("uid-" + env), Controller: &controller}}},
			Status: corev1.PodStatus{Phase: phase},
		}
	}
	assigned := warmPod("assigned", "go", time.Second, corev1.PodPending)
	assigned.OwnerReferences[0].Kind, assigned.OwnerReferences[0].Name = "BuildJob", "other-job"
	running := warmPod("go-warm-old", "go", time.Hour, corev1.PodRunning)
	pendingOld := warmPod("go-warm-pending", "go", time.Minute, corev1.PodPending)
	pendingNew := warmPod("rust-warm-new", "rust", time.Second, corev1.PodPending)
	ended := warmPod("go-warm-ended", "go", 0, corev1.PodFailed)
	cases := []struct {
		name string
		pods []*corev1.Pod
		// changed names the pod that changed since the cache showed it.
		changed string
		noPools bool
		// deleted is the pod that makes room, "" for none.
		deleted string
	}{
		{name: "the newest pod not yet running, of any environment", pods: []*corev1.Pod{running, pendingOld, pendingNew, assigned, ended}, deleted: pendingNew.Name},
		{name: "a running one when none is pending", pods: []*corev1.Pod{running, assigned}, deleted: running.Name},
		{name: "not one that changed since the cache showed it", pods: []*corev1.Pod{running, pendingOld, pendingNew}, changed: pendingNew.Name, deleted: pendingOld.Name},
		{name: "none idle", pods: []*corev1.Pod{assigned, ended}},
		{name: "warm pools off", pods: []*corev1.Pod{running}, noPools: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := &bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waiting-job"}}
			job.Status.Conditions = []metav1.Condition{{Type: bkv1.ConditionPodCreated, Status: metav1.ConditionFalse,
				Reason: bkv1.ReasonWaitingForQuota, Message: "Waiting for quota", LastTransitionTime: metav1.NewTime(t0)}}
			objs := []client.Object{job}
			reg := handoff.NewRegistry()
			for _, p := range tc.pods {
				objs = append(objs, p.DeepCopy())
				require.NoError(t, reg.Register(handoff.RefTo(p)))
			}
			c := fake.NewClientBuilder().WithScheme(testenv.Scheme()).WithObjects(objs...).WithStatusSubresource(&bkv1.BuildJob{}).
				WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if err := c.List(ctx, list, opts...); err != nil {
						return err
					}
					if pods, ok := list.(*corev1.PodList); ok {
						for i := range pods.Items {
							if pods.Items[i].Name == tc.changed {
								pods.Items[i].ResourceVersion = "1" // as the cache saw it, before an assignment
							}
						}
					}
					return nil
				}}).Build()
			rec := events.NewFakeRecorder(10)
			opts := Options{Handoff: reg}
			if tc.noPools {
				opts.Handoff = nil
			}
			r := &Reconciler{client: c, apiReader: c, recorder: rec, opts: opts.withDefaults()}
			stored := &bkv1.BuildJob{}
			require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(job), stored))

			r.makeRoomForJob(context.Background(), r.newScope(stored))

			for _, p := range tc.pods {
				err := c.Get(context.Background(), client.ObjectKeyFromObject(p), &corev1.Pod{})
				if p.Name == tc.deleted {
					assert.True(t, apierrors.IsNotFound(err), "pod %s was not deleted: %v", p.Name, err)
					assert.Equal(t, handoff.StateUnknown, reg.State(handoff.RefTo(p)), "the registry still knows the deleted pod")
				} else {
					assert.NoError(t, err, "pod %s was deleted", p.Name)
				}
			}
			close(rec.Events)
			var got []string
			for e := range rec.Events {
				got = append(got, e)
			}
			if tc.deleted == "" {
				assert.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			assert.True(t, strings.HasPrefix(got[0], "Normal "+EventWarmPodRemoved+" Deleted idle warm pod "+tc.deleted+" of BuildEnvironment "),
				"event: %s", got[0])
			assert.Contains(t, got[0], "a ResourceQuota of namespace jobs refused")
		})
	}
}
