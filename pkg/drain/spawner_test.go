package drain

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The operator container's args end up with the spawner off whatever they said, and are
// left alone when they already had it off.
func TestSpawnerOff(t *testing.T) {
	cases := []struct {
		name        string
		args        []string
		want        []string
		wantChanged bool
	}{
		{"no args", nil, []string{"--spawner=false"}, true},
		{"spawner not mentioned", []string{"operator"}, []string{"operator", "--spawner=false"}, true},
		{"spawner on", []string{"operator", "--spawner=true", "--slots=3"}, []string{"operator", "--spawner=false", "--slots=3"}, true},
		{"spawner already off", []string{"operator", "--spawner=false"}, []string{"operator", "--spawner=false"}, false},
		{"on, then off", []string{"--spawner=true", "--spawner=false"}, []string{"--spawner=false", "--spawner=false"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := append([]string(nil), tc.args...)
			got, changed := spawnerOff(tc.args)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wantChanged, changed)
			assert.Equal(t, before, tc.args, "the Deployment's own args are not written to")
		})
	}
}

// The drain turns the spawner off in the operator's Deployment and waits for the rollout
// (a stand-in for the Deployment controller reports it); no Deployment means nothing takes
// jobs, and a rollout that never ends is an error once the drain's time is up.
func TestStopSpawner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := env.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "drain-spawner-"}}
	require.NoError(t, cl.Create(ctx, ns))

	cases := []struct {
		name     string
		args     []string // nil: no Deployment
		rollsOut bool
		wantArgs []string
		// wantPatched: the drain changed the pod template (a new generation).
		wantPatched bool
		wantOutput  string
		wantErr     string
	}{
		{name: "no Deployment", wantOutput: "nothing takes jobs"},
		{name: "spawner on", args: []string{"operator", "--spawner=true"}, rollsOut: true,
			wantArgs: []string{"operator", "--spawner=false"}, wantPatched: true, wantOutput: "spawner off, waiting for the rollout"},
		{name: "spawner already off", args: []string{"operator", "--spawner=false"}, rollsOut: true,
			wantArgs: []string{"operator", "--spawner=false"}},
		{name: "the rollout never ends", args: []string{"operator"}, wantArgs: []string{"operator", "--spawner=false"},
			wantPatched: true, wantErr: "to roll out without the spawner"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "operator-" + string(rune('a'+i))
			if tc.args != nil {
				require.NoError(t, cl.Create(ctx, operatorDeployment(ns.Name, name, tc.args)))
			}
			if tc.rollsOut {
				stop := rollOut(ctx, cl, client.ObjectKey{Namespace: ns.Name, Name: name})
				defer stop()
			}
			var out bytes.Buffer
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			defer dcancel()
			err := (&Drainer{Client: cl, Namespace: ns.Name, Deployment: name, Out: &out}).stopSpawner(dctx)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Contains(t, out.String(), tc.wantOutput)
			if tc.args == nil {
				return
			}
			var d appsv1.Deployment
			require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: name}, &d))
			assert.Equal(t, tc.wantArgs, d.Spec.Template.Spec.Containers[0].Args)
			assert.Equal(t, tc.wantPatched, d.Generation > 1, "patched")
		})
	}
}

func operatorDeployment(namespace, name string, args []string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "operator", Image: "agentd", Args: args}}},
			},
		},
	}
}

// rollOut stands for the Deployment controller, which envtest does not run: it reports
// every generation of the Deployment rolled out. It returns a function that stops it.
func rollOut(ctx context.Context, cl client.Client, key client.ObjectKey) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var d appsv1.Deployment
			if cl.Get(ctx, key, &d) == nil && d.Status.ObservedGeneration < d.Generation {
				n := ptr.Deref(d.Spec.Replicas, 1)
				d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n}
				_ = cl.Status().Update(ctx, &d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() { cancel(); <-done }
}

// A Deployment is rolled out once every replica runs its latest template and one is
// available.
func TestRolledOut(t *testing.T) {
	cases := []struct {
		name   string
		gen    int64
		status appsv1.DeploymentStatus
		want   bool
	}{
		{"rolled out", 2, appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 2}, true},
		{"one available is enough", 2, appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 1}, true},
		{"the controller has not seen the change", 3, appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 2}, false},
		{"an old replica is left", 2, appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 3, UpdatedReplicas: 2, AvailableReplicas: 2}, false},
		{"nothing available", 2, appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 2}, false},
		{"fewer replicas than asked for", 2, appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := operatorDeployment("ns", "operator", nil)
			d.Generation, d.Status = tc.gen, tc.status
			assert.Equal(t, tc.want, rolledOut(d))
		})
	}
}
