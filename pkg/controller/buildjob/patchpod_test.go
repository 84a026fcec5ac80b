package buildjob_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
)

// TestPatchPod runs patchPod against a real API server, whose resourceVersions make the
// conflicts: someone else writes the pod between its read and the patch.
func TestPatchPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := "patchpod-" + strconv.FormatInt(namespaceSeq.Add(1), 10)
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))

	// someoneElse changes the pod on the server, as another writer would.
	someoneElse := func(t *testing.T, key client.ObjectKey) {
		t.Helper()
		p := &corev1.Pod{}
		require.NoError(t, env.Client.Get(ctx, key, p))
		n, _ := strconv.Atoi(p.Annotations["writes"])
		p.Annotations = map[string]string{"writes": strconv.Itoa(n + 1)}
		require.NoError(t, env.Client.Update(ctx, p))
	}
	deleteIt := func(t *testing.T, key client.ObjectKey) {
		t.Helper()
		// Unscheduled and without finalizers, the pod goes at once.
		require.NoError(t, env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}))
	}

	cases := []struct {
		name    string
		labeled bool // the pod has the label already: nothing to change
		// afterRead, beforePatch and beforeGet act on the server after the pod is read,
		// before each of patchPod's patches, and before each of its reads.
		afterRead, beforePatch, beforeGet func(*testing.T, client.ObjectKey)

		wantPatches, wantGets int
		wantErr               bool
		wantLabel             bool // the server's pod has the label afterwards
		wantGone              bool
	}{
		{
			name: "conflict, then read again and patched", afterRead: someoneElse,
			wantPatches: 2, wantGets: 1, wantLabel: true,
		},
		{
			name: "gone before the patch", afterRead: deleteIt,
			wantPatches: 1, wantGone: true,
		},
		{
			name: "conflict, then gone when read again", afterRead: someoneElse, beforeGet: deleteIt,
			wantPatches: 1, wantGets: 1, wantGone: true,
		},
		{
			name: "nothing to change", labeled: true,
			wantLabel: true,
		},
		{
			name: "gives up after 5 conflicts", beforePatch: someoneElse,
			wantPatches: 6, wantGets: 5, wantErr: true,
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-" + strconv.Itoa(i)},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "job", Image: "job:dev"}}},
			}
			if tc.labeled {
				pod.Labels = map[string]string{"patched": "yes"}
			}
			require.NoError(t, env.Client.Create(ctx, pod))
			key := client.ObjectKeyFromObject(pod)
			createdRV := pod.ResourceVersion
			if tc.afterRead != nil {
				tc.afterRead(t, key)
			}

			wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
			require.NoError(t, err)
			var patches, gets int
			c := interceptor.NewClient(wc, interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					patches++
					if tc.beforePatch != nil {
						tc.beforePatch(t, key)
					}
					return c.Patch(ctx, obj, patch, opts...)
				},
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					gets++
					if tc.beforeGet != nil {
						tc.beforeGet(t, key)
					}
					return c.Get(ctx, key, obj, opts...)
				},
			})
			r := buildjob.NewReconcilerForTest(c, testOptions())

			what := "labeling pod " + key.String()
			err = r.PatchPodForTest(ctx, pod, what, func(p *corev1.Pod) bool {
				if p.Labels["patched"] == "yes" {
					return false
				}
				if p.Labels == nil {
					p.Labels = map[string]string{}
				}
				p.Labels["patched"] = "yes"
				return true
			})
			if tc.wantErr {
				require.Error(t, err)
				assert.True(t, apierrors.IsConflict(err), "the conflict is wrapped: %v", err)
				assert.True(t, strings.HasPrefix(err.Error(), what+": "), "the error says what: %v", err)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantPatches, patches, "patches")
			assert.Equal(t, tc.wantGets, gets, "reads after a conflict")

			got := &corev1.Pod{}
			err = env.Client.Get(ctx, key, got)
			if tc.wantGone {
				require.True(t, apierrors.IsNotFound(err), "the pod is gone: %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantLabel, got.Labels["patched"] == "yes", "the label on the server")
			if tc.afterRead != nil || tc.beforePatch != nil {
				assert.NotEmpty(t, got.Annotations["writes"], "the other writer's change is kept")
			}
			if patches == 0 {
				assert.Equal(t, createdRV, got.ResourceVersion, "nothing was written")
			}
		})
	}
}
