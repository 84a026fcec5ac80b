package e2e

import (
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// warmEnvironment is the BuildEnvironment of TestWarmPool, with a pool of warmPoolSize.
const (
	warmEnvironment = "warm"
	warmPoolSize    = 2
)

// TestWarmPool runs jobs in warm pods of the chart-installed operator (two replicas, webhooks
// and leader election on): the pods' supervisors fetch their jobs from the operator's
// hand-off endpoint through the webhook Service, by name (kube-proxy and the node's cluster
// DNS), and run them with the real agent. Pods that are not assigned cannot take a job, and
// deleting a warm pod before or after its hand-off loses no job.
func TestWarmPool(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "warm pools need the operator's webhook server: the chart install")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(e.REST)
	require.NoError(t, err)

	// The real agent's bootstrap checks out the host's repository in the warm pods.
	be := repoEnvironment(warmEnvironment, true)
	be.Namespace = e.JobNamespace
	be.Spec.WarmPool = &bkv1.WarmPool{Size: warmPoolSize}
	require.NoError(t, e.ApplyEnvironment(ctx, be))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, client.IgnoreNotFound(e.Client.Delete(ctx, &bkv1.BuildEnvironment{ObjectMeta: metav1.ObjectMeta{Namespace: e.JobNamespace, Name: warmEnvironment}})))
	})
	t0 := time.Now()
	idle := waitIdleWarmPods(ctx, t, e, warmPoolSize)
	recordTiming("warm pool: %d warm pods running %s after the BuildEnvironment", warmPoolSize, time.Since(t0).Round(10*time.Millisecond))

	t.Run("jobs run in warm pods", func(t *testing.T) {
		ids := warmBuild(t, e, "e2e-warm", `echo "ran in $(hostname)"; cat file.txt`, warmPoolSize)
		for _, id := range ids {
			j, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
			require.NoError(t, err)
			log := fakebuildkite.PlainLog(j.Log)
			require.Equal(t, "0", j.ExitStatus, "job %s; log:\n%s\noperator:\n%s", id, log, e.Operator.Tail(40))
			bj := recordedBuildJob(ctx, t, e, id)
			assert.Contains(t, idle, bj.Status.PodName, "job %s ran in pod %s, which was not one of the warm pods waiting before it came", id, bj.Status.PodName)
			assert.Contains(t, log, "ran in "+bj.Status.PodName, "the job's command ran in its warm pod, through the real agent")
			assert.Contains(t, log, "version one", "the agent checked out the repository at the build's commit")
			assert.True(t, hasEvent(ctx, t, cs, bj, buildjob.EventWarmPodAssigned), "BuildJob %s has a %s event", bj.Name, buildjob.EventWarmPodAssigned)
		}
		// The pool is refilled with new pods.
		refilled := waitIdleWarmPods(ctx, t, e, warmPoolSize)
		for _, p := range refilled {
			assert.NotContains(t, idle, p, "a warm pod is never reused")
		}
		idle = refilled
	})

	t.Run("a pod that is not assigned cannot take a job", func(t *testing.T) {
		var warm corev1.Pod
		require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: e.JobNamespace, Name: idle[0]}, &warm))
		cases := []struct {
			name   string
			token  corev1.VolumeProjection
			status int
			reason string
		}{
			{name: "its own valid token", token: tokenProjection(t, &warm, ""), status: 403, reason: handoffclient.ReasonUnknownPod},
			{name: "another audience", token: tokenProjection(t, &warm, "vault"), status: 401, reason: handoffclient.ReasonWrongAudience},
			{name: "a warm pod's stolen token", token: stolenToken(ctx, t, e, &warm), status: 403, reason: handoffclient.ReasonWrongAddress},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				log := runIntruder(ctx, t, e, cs, &warm, fmt.Sprintf("intruder-%d", i), tc.token)
				assert.Contains(t, log, fmt.Sprintf("(HTTP %d %s)", tc.status, tc.reason), "the intruder's log:\n%s", log)
			})
		}
		// The pod whose token was stolen still waits for its own job.
		assert.ElementsMatch(t, idle, waitIdleWarmPods(ctx, t, e, warmPoolSize), "the pool is as it was")
	})

	t.Run("a warm pod deleted before its hand-off is replaced", func(t *testing.T) {
		victim := idle[0]
		require.NoError(t, e.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.JobNamespace, Name: victim}}))
		require.Eventually(t, func() bool {
			now := idleWarmPodNames(ctx, t, e)
			return len(now) == warmPoolSize && !slices.Contains(now, victim)
		}, 2*time.Minute, 200*time.Millisecond, "the deleted warm pod was not replaced")
		idle = waitIdleWarmPods(ctx, t, e, warmPoolSize)
		ids := warmBuild(t, e, "e2e-warm-after-delete", `echo "ran after a warm pod was deleted"`, 1)
		j, err := e.Fake.WaitJob(ctx, ids[0], func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
		require.NoError(t, err)
		assert.Equal(t, "0", j.ExitStatus, "log:\n%s", fakebuildkite.PlainLog(j.Log))
		assert.Contains(t, idle, recordedBuildJob(ctx, t, e, ids[0]).Status.PodName)
	})

	t.Run("a warm pod deleted after its hand-off fails its job as any job pod", func(t *testing.T) {
		ids := warmBuild(t, e, "e2e-warm-delete-running", `echo "started"; sleep 120; echo "ended after $((60*2)) s"`, 1)
		j, err := e.Fake.WaitJob(ctx, ids[0], func(j fakebuildkite.JobSnapshot) bool {
			return strings.Contains(fakebuildkite.PlainLog(j.Log), "started") || fakebuildkite.IsTerminal(j.State)
		})
		require.NoError(t, err)
		require.False(t, fakebuildkite.IsTerminal(j.State), "the job ended early; log:\n%s", fakebuildkite.PlainLog(j.Log))
		pod := jobPodName(ctx, t, e, ids[0])
		require.Contains(t, idle, pod, "the job runs in a warm pod")
		require.NoError(t, e.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.JobNamespace, Name: pod}}))
		j, err = e.Fake.WaitJob(ctx, ids[0], func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
		require.NoError(t, err, "the job of a deleted warm pod must end, not hang")
		log := fakebuildkite.PlainLog(j.Log)
		assert.NotEqual(t, "0", j.ExitStatus, "log:\n%s", log)
		assert.NotContains(t, log, "ended after 120 s", "the command was stopped with its pod")
		assert.Contains(t, log, "was deleted while the job was running", "the log says why the job failed")
		assert.Equal(t, 1, j.FinishesAccepted, "finished once")
		assert.Zero(t, j.FinishesRefused)
	})
}

// warmBuild creates a build of n jobs of command in the warm environment and returns their IDs.
func warmBuild(t *testing.T, e *harness.Env, pipeline, command string, n int) []string {
	t.Helper()
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline: pipeline, Repo: repoMount, Commit: repo.First,
		PipelineYAML: fmt.Sprintf(`steps:
  - command: %s
    parallelism: %d
    agents:
      queue: bk-operator
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: %s
`, command, n, warmEnvironment),
	})
	require.NoError(t, err)
	require.Len(t, b.Jobs, n)
	return b.Jobs
}

// idleWarmPodNames are the warm pool's running pods that have no job.
func idleWarmPodNames(ctx context.Context, t *testing.T, e *harness.Env) []string {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, e.Client.List(ctx, &pods, client.InNamespace(e.JobNamespace),
		client.MatchingLabels{podbuilder.LabelWarmPool: warmEnvironment}))
	var names []string
	for _, p := range pods.Items {
		if _, assigned := p.Labels[bkv1.LabelJob]; !assigned && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return names
}

// waitIdleWarmPods waits until the pool has n idle running pods, and the BuildEnvironment's
// status says so, and returns their names.
func waitIdleWarmPods(ctx context.Context, t *testing.T, e *harness.Env, n int) []string {
	t.Helper()
	var names []string
	require.Eventually(t, func() bool {
		names = idleWarmPodNames(ctx, t, e)
		var be bkv1.BuildEnvironment
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: e.JobNamespace, Name: warmEnvironment}, &be); err != nil || be.Status.WarmPool == nil {
			return false
		}
		return len(names) == n && int(be.Status.WarmPool.Idle) == n
	}, 2*time.Minute, 200*time.Millisecond, "the warm pool never had %d idle pods (now %v); operator:\n%s", n, names, e.Operator.Tail(30))
	return names
}

func buildJobOf(ctx context.Context, t *testing.T, e *harness.Env, jobID string) bkv1.BuildJob {
	t.Helper()
	var list bkv1.BuildJobList
	require.NoError(t, e.Client.List(ctx, &list, client.InNamespace(e.JobNamespace), client.MatchingLabels{bkv1.LabelJob: jobID}))
	require.Len(t, list.Items, 1, "job %s has one BuildJob", jobID)
	return list.Items[0]
}

// recordedBuildJob is the job's BuildJob once its status names its pod: the supervisor may
// finish the job in Buildkite before the controller writes the outcome, pod included.
func recordedBuildJob(ctx context.Context, t *testing.T, e *harness.Env, jobID string) bkv1.BuildJob {
	t.Helper()
	var bj bkv1.BuildJob
	require.Eventually(t, func() bool {
		bj = buildJobOf(ctx, t, e, jobID)
		return bj.Status.PodName != "" && bj.Status.ExitStatus != nil
	}, time.Minute, 100*time.Millisecond, "BuildJob of job %s never recorded its pod and outcome", jobID)
	return bj
}

// jobPodName is the name of the pod that carries the job's label: its warm pod, once
// assigned.
func jobPodName(ctx context.Context, t *testing.T, e *harness.Env, jobID string) string {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, e.Client.List(ctx, &pods, client.InNamespace(e.JobNamespace), client.MatchingLabels{bkv1.LabelJob: jobID}))
	require.Len(t, pods.Items, 1, "job %s has one pod", jobID)
	return pods.Items[0].Name
}

func hasEvent(ctx context.Context, t *testing.T, cs kubernetes.Interface, bj bkv1.BuildJob, reason string) bool {
	t.Helper()
	list, err := cs.EventsV1().Events(bj.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + bj.Name})
	require.NoError(t, err)
	return slices.ContainsFunc(list.Items, func(ev eventsv1.Event) bool { return ev.Reason == reason })
}

// handoffVolume is a warm pod's hand-off volume: its token and the endpoint's CA bundle.
func handoffVolume(t *testing.T, warm *corev1.Pod) corev1.Volume {
	t.Helper()
	i := slices.IndexFunc(warm.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == validation.VolumeHandoff })
	require.GreaterOrEqual(t, i, 0, "warm pod %s has a hand-off volume", warm.Name)
	return *warm.Spec.Volumes[i].DeepCopy()
}

// tokenProjection is the warm pod's own token source, for audience when it is not empty.
func tokenProjection(t *testing.T, warm *corev1.Pod, audience string) corev1.VolumeProjection {
	t.Helper()
	for _, src := range handoffVolume(t, warm).Projected.Sources {
		if src.ServiceAccountToken != nil {
			if audience != "" {
				src.ServiceAccountToken.Audience = audience
			}
			return src
		}
	}
	t.Fatalf("warm pod %s has no projected token", warm.Name)
	return corev1.VolumeProjection{}
}

// stolenToken is a token of the warm pod's own, minted as the kubelet mints it for the pod
// (bound to it, for the hand-off's audience), put where an intruder can mount it: what
// someone who read the file in the warm pod would hold.
func stolenToken(ctx context.Context, t *testing.T, e *harness.Env, warm *corev1.Pod) corev1.VolumeProjection {
	t.Helper()
	own := tokenProjection(t, warm, "")
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		Audiences:         []string{own.ServiceAccountToken.Audience},
		ExpirationSeconds: ptr.To[int64](600),
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: warm.Name, UID: warm.UID},
	}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: warm.Namespace, Name: warm.Spec.ServiceAccountName}}
	require.NoError(t, e.Client.SubResource("token").Create(ctx, sa, tr))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: warm.Namespace, GenerateName: "stolen-"},
		Data: map[string][]byte{"token": []byte(tr.Status.Token)}}
	require.NoError(t, e.Client.Create(ctx, secret))
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), secret) })
	return corev1.VolumeProjection{Secret: &corev1.SecretProjection{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret.Name},
		Items:                []corev1.KeyToPath{{Key: "token", Path: own.ServiceAccountToken.Path}},
	}}
}

// runIntruder runs the operator's own supervisor in a pod of the job namespace that is not
// a warm pod, told to fetch a job as a warm pod would, with token as its hand-off token,
// and returns its log once it has given up.
func runIntruder(ctx context.Context, t *testing.T, e *harness.Env, cs kubernetes.Interface, warm *corev1.Pod, name string, token corev1.VolumeProjection) string {
	t.Helper()
	vol := handoffVolume(t, warm)
	sources := []corev1.VolumeProjection{token}
	for _, src := range vol.Projected.Sources {
		if src.ServiceAccountToken == nil {
			sources = append(sources, src) // the CA bundle
		}
	}
	vol.Projected.Sources = sources
	job := slices.IndexFunc(warm.Spec.Containers, func(c corev1.Container) bool { return c.Name == podcontract.JobContainer })
	require.GreaterOrEqual(t, job, 0)
	var env []corev1.EnvVar
	for _, v := range warm.Spec.Containers[job].Env {
		if slices.Contains([]string{podcontract.EnvHandoffURL, podcontract.EnvHandoffTokenPath, podcontract.EnvHandoffCAPath}, v.Name) {
			env = append(env, v)
		}
	}
	require.Len(t, env, 3, "the warm pod's hand-off settings")
	env = append(env, corev1.EnvVar{Name: podcontract.EnvProgressPath, Value: path.Join("/tmp", "progress")})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.JobNamespace, Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Volumes:       []corev1.Volume{vol},
			Containers: []corev1.Container{{
				Name: "intruder", Image: e.Opts.OperatorImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{podcontract.ImageSupervisorPath},
				Env:          env,
				VolumeMounts: []corev1.VolumeMount{{Name: vol.Name, MountPath: validation.HandoffPath, ReadOnly: true}},
			}},
		},
	}
	require.NoError(t, e.Client.Create(ctx, pod))
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), pod) })
	require.Eventually(t, func() bool {
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false
		}
		return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	}, 2*time.Minute, 200*time.Millisecond, "intruder %s never gave up", name)
	assert.Equal(t, corev1.PodFailed, pod.Status.Phase, "the intruder got no job")
	rc, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).Stream(ctx)
	require.NoError(t, err)
	defer func() { _ = rc.Close() }()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(b)
}
