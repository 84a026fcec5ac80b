package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// The pending-pod cases: a job whose pod waits shows why on the Buildkite job while it
// waits, and ends (when the operator's bound on the wait runs out) with one finish and
// without the notice. The suite's operator bounds these waits at waitBound.

// waitBound is the operator's --quota-timeout and --image-pull-grace in the suite: long
// enough for a loaded node to try the pull (the grace counts from the pod's scheduling),
// short enough for the cases to end soon. The wait for a node keeps the operator's default
// (see zy_late_node_test.go); its case here is bounded by the step's own timeout.
const waitBound = 20 * time.Second

// noticeDelay bounds the time from the Kubernetes event that delays a job to its notice
// on Buildkite: five seconds, and one for the second-rounded times Kubernetes records.
const noticeDelay = 6 * time.Second

// quotaPriorityClass scopes the suite's ResourceQuota to the pods of one
// BuildEnvironment, so that it refuses those and no other job's.
const quotaPriorityClass = "bk-operator-e2e-quota"

// waitNoticeContext is the context of the annotation the operator writes on job id while
// its pod waits.
func waitNoticeContext(id string) string { return "buildkite-operator-waiting-" + id }

// waitNotice is job j's notice of what it waits for, if it shows one.
func waitNotice(j fakebuildkite.JobSnapshot) (fakebuildkite.Annotation, bool) {
	for _, a := range j.Annotations {
		if a.Context == waitNoticeContext(j.ID) {
			return a, true
		}
	}
	return fakebuildkite.Annotation{}, false
}

// pendingCases are the jobCase entries for TestJobs whose pods wait; setupPending makes
// what they need.
func pendingCases() []jobCase {
	return []jobCase{
		{
			name: "a pod no node can take shows why it waits",
			pipeline: `steps:
  - command: echo never runs
    timeout_in_minutes: 1
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: huge
`,
			notice:      []string{"Waiting for a node: 0/1 nodes are available: 1 Insufficient cpu.", `BuildEnvironment "huge" asks for cpu 64`, "within 1 minute, its own timeout"},
			noticeSince: podScheduledFalseSince,
			state:       fakebuildkite.StateFinished, exitStatus: "-1", signalReason: "stack_error",
			logHas:    []string{"could not be scheduled for 1 minute, the job's own timeout", "Insufficient cpu"},
			logHasNot: []string{"never runs"},
		},
		{
			name: "an image that cannot be pulled shows why the pod waits",
			pipeline: `steps:
  - command: echo never runs
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: unpullable
`,
			notice:      []string{"Image " + unpullableImage + " cannot be pulled: ErrImagePull"},
			noticeSince: pullFailedSince,
			state:       fakebuildkite.StateFinished, exitStatus: "-1", signalReason: "stack_error",
			logHas:    []string{`The image "` + unpullableImage + `" of container "job" could not be pulled`},
			logHasNot: []string{"never runs"},
		},
		{
			name: "a pod a ResourceQuota refuses shows why it waits",
			pipeline: `steps:
  - command: echo never runs
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: over-quota
`,
			notice:      []string{"Waiting for quota: Kubernetes refuses the job's pod for now (exceeded quota: e2e-no-pods"},
			noticeSince: quotaRefusedSince,
			state:       fakebuildkite.StateFinished, exitStatus: "-1", signalReason: "stack_error",
			logHas:    []string{"Kubernetes refused to create the job's pod", "exceeded quota"},
			logHasNot: []string{"never runs"},
		},
	}
}

// unpullableImage is on a registry that refuses connections: the pull fails at once (a
// registry whose name does not resolve can take longer than the suite's pull grace).
const unpullableImage = "127.0.0.1:1/bk-operator/nope:1"

// setupPending makes the BuildEnvironments of the pending cases, and the ResourceQuota
// that refuses the over-quota environment's pods (and only those).
func setupPending(t *testing.T, e *harness.Env) {
	t.Helper()
	ctx := context.Background()
	envs := []*bkv1.BuildEnvironment{
		gen.BuildEnvironment("huge", gen.SetBuildEnvironmentImage(e.Opts.JobImage), gen.SetBuildEnvironmentImagePullPolicy(e.Opts.JobImagePullPolicy),
			gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand),
			gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}})),
		gen.BuildEnvironment("unpullable", gen.SetBuildEnvironmentImage(unpullableImage), gen.SetBuildEnvironmentImagePullPolicy(corev1.PullIfNotPresent),
			gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
		gen.BuildEnvironment("over-quota", gen.SetBuildEnvironmentImage(e.Opts.JobImage), gen.SetBuildEnvironmentImagePullPolicy(e.Opts.JobImagePullPolicy),
			gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand),
			func(be *bkv1.BuildEnvironment) {
				be.Spec.PriorityClassName = quotaPriorityClass
				be.Spec.Allow.PriorityClasses = []string{quotaPriorityClass}
			}),
	}
	for _, be := range envs {
		require.NoError(t, e.ApplyEnvironment(ctx, be))
	}
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: quotaPriorityClass}, Value: 0,
		Description: "the e2e suite's over-quota BuildEnvironment: its ResourceQuota refuses these pods"}
	require.NoError(t, client.IgnoreAlreadyExists(e.Client.Create(ctx, pc)))
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-no-pods", Namespace: e.JobNamespace},
		Spec: corev1.ResourceQuotaSpec{
			Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
				ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{quotaPriorityClass},
			}}},
		},
	}
	require.NoError(t, client.IgnoreAlreadyExists(e.Client.Create(ctx, quota)))
	t.Cleanup(func() {
		_ = e.Client.Delete(context.Background(), quota)
		_ = e.Client.Delete(context.Background(), pc)
	})
	// Until the quota controller has counted the namespace's pods, admission refuses
	// every pod the quota covers as of unknown status, not as over quota.
	require.Eventually(t, func() bool {
		var q corev1.ResourceQuota
		return e.Client.Get(ctx, client.ObjectKeyFromObject(quota), &q) == nil && q.Status.Hard != nil && q.Status.Used != nil
	}, time.Minute, 200*time.Millisecond, "the quota controller never counted ResourceQuota %s", quota.Name)
}

// waitForNotice waits, while job id waits, for its notice to show every one of want; it
// fails the test if the job ends without one. since, when set, is when Kubernetes
// recorded what delays the job: the notice must follow within noticeDelay.
func waitForNotice(ctx context.Context, t *testing.T, e *harness.Env, id string, want []string, since func(context.Context, *harness.Env, string) (time.Time, bool)) {
	t.Helper()
	shows := func(j fakebuildkite.JobSnapshot) bool {
		a, ok := waitNotice(j)
		if !ok {
			return false
		}
		for _, s := range want {
			if !strings.Contains(a.Body, s) {
				return false
			}
		}
		return true
	}
	j, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool { return shows(j) || fakebuildkite.IsTerminal(j.State) })
	seen := time.Now()
	require.NoError(t, err, "waiting for the job's notice %q", want)
	a, _ := waitNotice(j)
	require.True(t, shows(j), "the job (%s) never showed %q while it waited; its notice: %+v; its log:\n%s", j.State, want, a, fakebuildkite.TimedLog(j.Log))
	require.NotEqual(t, fakebuildkite.StateRunning, j.State, "the notice shows while the job waits, before it starts")
	t.Logf("the job's notice: %s", a.Body)
	if since == nil {
		return
	}
	at, ok := since(ctx, e, id)
	require.True(t, ok, "what delayed the job was not found in Kubernetes")
	delay := seen.Sub(at)
	recordTiming("%-50s notice %s after the delaying event", t.Name(), delay.Round(10*time.Millisecond))
	require.LessOrEqual(t, delay, noticeDelay, "the notice showed %s after Kubernetes recorded what delays the job (at %s)", delay, at.UTC().Format(timeOfDay))
}

// jobPod is job id's pod, once it exists.
func jobPod(ctx context.Context, e *harness.Env, id string) (*corev1.Pod, bool) {
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(e.JobNamespace), client.MatchingLabels{bkv1.LabelJob: id}); err != nil || len(pods.Items) == 0 {
		return nil, false
	}
	return &pods.Items[0], true
}

// podScheduledFalseSince is when the scheduler found no node for job id's pod.
func podScheduledFalseSince(ctx context.Context, e *harness.Env, id string) (time.Time, bool) {
	pod, ok := jobPod(ctx, e, id)
	if !ok {
		return time.Time{}, false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// pullFailedSince is when the kubelet first failed to pull the image of job id's pod.
func pullFailedSince(ctx context.Context, e *harness.Env, id string) (time.Time, bool) {
	pod, ok := jobPod(ctx, e, id)
	if !ok {
		return time.Time{}, false
	}
	var events corev1.EventList
	if err := e.Client.List(ctx, &events, client.InNamespace(e.JobNamespace)); err != nil {
		return time.Time{}, false
	}
	var first time.Time
	for _, ev := range events.Items {
		if ev.InvolvedObject.UID == pod.UID && ev.Reason == "Failed" && strings.Contains(ev.Message, unpullableImage) {
			if at := ev.FirstTimestamp.Time; first.IsZero() || at.Before(first) {
				first = at
			}
		}
	}
	return first, !first.IsZero()
}

// quotaRefusedSince is when the operator's create of job id's pod was first refused for
// quota, as its BuildJob records.
func quotaRefusedSince(ctx context.Context, e *harness.Env, id string) (time.Time, bool) {
	var jobs bkv1.BuildJobList
	if err := e.Client.List(ctx, &jobs, client.InNamespace(e.JobNamespace), client.MatchingLabels{bkv1.LabelJob: id}); err != nil || len(jobs.Items) == 0 {
		return time.Time{}, false
	}
	for _, c := range jobs.Items[0].Status.Conditions {
		if c.Type == bkv1.ConditionPodCreated && c.Reason == bkv1.ReasonWaitingForQuota {
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}
