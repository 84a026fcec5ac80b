package podstate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// seenWait is what a test checks of a podstate.Wait: all of it, but Message and
// LatestMessage only by a part (msg, latest) and LastExit by its exit code (-1: none).
type seenWait struct {
	kind                 podstate.WaitKind
	reason, container    string
	init, recoverable    bool
	fromEvents           bool
	image, since         string
	pullError            string
	latestReason, latest string
	msg                  string
	lastExit             int32
}

// The pull error the registry gave in the fixtures of an image that does not exist.
const notFound = `rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.com/ci/go:nope": failed to resolve reference "registry.example.com/ci/go:nope": registry.example.com/ci/go:nope: not found`

func TestWaiting(t *testing.T) {
	const badImage = "registry.example.com/ci/go:nope"
	pullFailedEvent := seenWait{
		kind: podstate.WaitImagePull, reason: "Failed", container: "job", recoverable: true, fromEvents: true,
		image: badImage, since: "12:00:39", pullError: notFound, msg: `Failed to pull image "` + badImage + `": rpc error`, lastExit: -1,
	}
	cases := []struct {
		fixture string
		want    []seenWait
	}{
		{fixture: "unschedulable", want: []seenWait{{
			kind: podstate.WaitNode, reason: "Unschedulable", recoverable: true, since: "12:00:00",
			msg: "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 2 Insufficient cpu.", lastExit: -1,
		}}},
		{fixture: "image-pull-backoff", want: []seenWait{{
			kind: podstate.WaitImagePull, reason: "ImagePullBackOff", container: "job", recoverable: true, image: badImage,
			since: "12:00:01", pullError: notFound, msg: `Back-off pulling image "` + badImage + `": ErrImagePull: rpc error`, lastExit: -1,
		}, pullFailedEvent}},
		{fixture: "err-image-pull", want: []seenWait{{
			kind: podstate.WaitImagePull, reason: "ErrImagePull", container: "job", recoverable: true, image: badImage,
			since: "12:00:01", pullError: notFound, msg: notFound, lastExit: -1,
		}, pullFailedEvent}},
		{fixture: "pull-failed-event-only", want: []seenWait{pullFailedEvent}},
		{fixture: "pull-retried-and-pulled"},
		{fixture: "pulling", want: []seenWait{{
			kind: podstate.WaitPulling, reason: "Pulling", container: "job", recoverable: true, fromEvents: true,
			image: "golang:1.26", since: "12:00:06", msg: `Pulling image "golang:1.26"`, lastExit: -1,
		}}},
		{fixture: "pulling-operator-image", want: []seenWait{{
			kind: podstate.WaitPulling, reason: "Pulling", container: "agentd-install", init: true, recoverable: true, fromEvents: true,
			image: "ghcr.io/buildkite-operator/agentd:0.1.0", since: "12:00:02", msg: "Pulling image", lastExit: -1,
		}}},
		{fixture: "invalid-image", want: []seenWait{{
			kind: podstate.WaitImageInvalid, reason: "InvalidImageName", container: "job", image: "registry.example.com/ci/Go:1.26",
			since: "12:00:01", msg: "invalid reference format", lastExit: -1,
		}}},
		{fixture: "never-pull", want: []seenWait{{
			kind: podstate.WaitImageNeverPull, reason: "ErrImageNeverPull", container: "job", image: "bk-operator/no-such-image:dev",
			since: "12:00:01", msg: "is not present with pull policy of Never", lastExit: -1,
		}}},
		{fixture: "create-container-config-error", want: []seenWait{{
			kind: podstate.WaitCreateContainer, reason: "CreateContainerConfigError", container: "job", recoverable: true,
			image: "golang:1.26", since: "12:00:01", msg: `secret "npm-token" not found`, lastExit: -1,
		}}},
		{fixture: "failed-mount", want: []seenWait{{
			kind: podstate.WaitPodSetup, reason: "FailedMount", recoverable: true, since: "12:00:01",
			msg: `MountVolume.SetUp failed for volume "cache"`, latestReason: "FailedMount", latest: "timed out waiting for the condition", lastExit: -1,
		}}},
		{fixture: "sandbox-failing-no-condition", want: []seenWait{{
			kind: podstate.WaitPodSetup, reason: "FailedCreatePodSandBox", recoverable: true, since: "12:00:02",
			msg: "no IP addresses available", latestReason: "FailedCreatePodSandBox", latest: "no IP addresses available", lastExit: -1,
		}}},
		{fixture: "sidecar-crash-loop", want: []seenWait{{
			kind: podstate.WaitCrashLoop, reason: "CrashLoopBackOff", container: "db", init: true, recoverable: true,
			image: "postgres:17", since: "12:00:01", msg: "back-off 40s restarting failed container=db", lastExit: 1,
		}}},
		{fixture: "running"},
	}
	for _, tc := range cases {
		t.Run(tc.fixture, func(t *testing.T) {
			pod, events := fixture(t, tc.fixture)
			got := podstate.Waiting(pod, events)
			require.Len(t, got, len(tc.want), "%+v", got)
			for i, w := range got {
				want := tc.want[i]
				assert.Contains(t, w.Message, want.msg)
				assert.Contains(t, w.LatestMessage, want.latest)
				exit := int32(-1)
				if w.LastExit != nil {
					exit = w.LastExit.ExitCode
				}
				assert.Equal(t, want, seenWait{
					kind: w.Kind, reason: w.Reason, container: w.Container, init: w.Init, recoverable: w.Recoverable,
					fromEvents: w.FromEvents, image: w.Image, since: w.Since.UTC().Format("15:04:05"),
					pullError: w.PullError, latestReason: w.LatestReason, latest: want.latest, msg: want.msg, lastExit: exit,
				})
			}
		})
	}
}

// Without its events, a pod shows only what its status says: the kubelet's events are
// read for a pod on a node, and only then.
func TestWaitingWithoutEvents(t *testing.T) {
	for name, want := range map[string][]podstate.WaitKind{
		"pull-failed-event-only":       nil,
		"pulling":                      nil,
		"image-pull-backoff":           {podstate.WaitImagePull},
		"failed-mount":                 {podstate.WaitPodSetup}, // the condition alone says it
		"sandbox-failing-no-condition": nil,
	} {
		t.Run(name, func(t *testing.T) {
			pod, _ := fixture(t, name)
			var kinds []podstate.WaitKind
			for _, w := range podstate.Waiting(pod, nil) {
				kinds = append(kinds, w.Kind)
			}
			assert.Equal(t, want, kinds)
		})
	}
}

// A failed pull the events tell of is over once the container no longer waits: it runs.
func TestPullFailureOverOnceTheContainerRuns(t *testing.T) {
	pod, events := fixture(t, "pull-failed-event-only")
	require.NotNil(t, podstate.Waiting(pod, events).First(podstate.WaitImagePull))
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at(t, "12:01:00"))}}
	assert.Empty(t, podstate.Waiting(pod, events))
}

// The setup wait of a kubelet with the condition starts when the condition turned False,
// whatever the events say, and ends when it turns True.
func TestSetupWaitFollowsTheCondition(t *testing.T) {
	pod, events := fixture(t, "failed-mount")
	w := podstate.Waiting(pod, events).First(podstate.WaitPodSetup)
	require.NotNil(t, w)
	assert.Equal(t, at(t, "12:00:01"), w.Since.UTC())
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReadyToStartContainers {
			pod.Status.Conditions[i].Status = corev1.ConditionTrue
		}
	}
	assert.Nil(t, podstate.Waiting(pod, events).First(podstate.WaitPodSetup))
}

// Pull errors lose the kubelet's framing, whichever of its messages carries them.
func TestPullErrorWithoutTheKubeletsFraming(t *testing.T) {
	cases := []struct{ reason, message, want string }{
		{"ErrImagePull", notFound, notFound},
		{"ImagePullBackOff", `Back-off pulling image "x": ErrImagePull: ` + notFound, notFound},
		{"ImagePullBackOff", `Back-off pulling image "x"`, ""},
		{"ErrImagePull", "", ""},
	}
	for _, tc := range cases {
		pod := &corev1.Pod{
			Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "job", Image: "x"}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
				Name: "job", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: tc.reason, Message: tc.message}},
			}}},
		}
		w := podstate.Waiting(pod, nil).First(podstate.WaitImagePull)
		require.NotNil(t, w, tc.message)
		assert.Equal(t, tc.want, w.PullError, tc.message)
	}
}
