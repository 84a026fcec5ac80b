package buildjob

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// A pod whose command has not started waits for something: a node, an image, a volume.
// podstate says what, and since when; here each wait gets its bound. Before the bound,
// the wait is shown on the Buildkite job (waiting.go); after it, the job fails.

// observePending follows a pod whose command has not started: it fails the job once a
// wait has lasted past its bound, and otherwise shows what the pod waits for and says
// when to look again.
func (r *Reconciler) observePending(ctx context.Context, s *scope) (*outcome, error) {
	job, pod := s.job, s.pod
	events, eventsDue, err := r.eventsOfSlowPod(ctx, s)
	if err != nil {
		return nil, err
	}
	waits := podstate.Waiting(pod, events)
	o, left := r.pendingFailure(job, waits, s.now)
	if o != nil && eventsDue > 0 {
		// A wait with a bound shorter than eventsAfter: the job fails with what the
		// events say of it.
		if events, err = s.podEvents(ctx); err != nil {
			return nil, err
		}
		waits = podstate.Waiting(pod, events)
		o, left = r.pendingFailure(job, waits, s.now)
	}
	if o != nil {
		o.deletePod = true
		return o, nil
	}
	// What keeps the command from starting shows on the Buildkite job while it lasts.
	if err := r.showWait(ctx, s, r.podWaitNotice(s, waits)); err != nil {
		return nil, err
	}
	// Until the supervisor runs, nothing else notices a cancel on Buildkite.
	if o, err = r.canceledBeforeStart(ctx, s); err != nil || o != nil {
		return o, err
	}
	s.requeueAfter(r.opts.JobStatePollInterval, left, eventsDue)
	return nil, nil
}

// eventsAfter is how long a pod must have been on its node before its events are read:
// most pods start their containers sooner, and what only events say (an image being
// pulled, a volume that does not mount, a sandbox that cannot be made) matters for a pod
// that takes longer. Reading them for every pending pod was one uncached list per job.
const eventsAfter = 3 * time.Second

// eventsOfSlowPod lists the events of the job's pod once it has been on its node for
// eventsAfter; before, it says how long until then (0 for a pod on no node: it has none).
// A pod that is about to fail before then has its events read too (observePending).
func (r *Reconciler) eventsOfSlowPod(ctx context.Context, s *scope) ([]corev1.Event, time.Duration, error) {
	pod := s.pod
	if !podstate.Scheduled(pod) {
		return nil, 0, nil
	}
	if left := podstate.ScheduledSince(pod).Add(eventsAfter).Sub(s.now); left > 0 {
		return nil, left, nil
	}
	events, err := s.podEvents(ctx)
	return events, 0, err
}

// pendingFailure is the outcome of a pod of job whose wait has lasted past its bound: a
// container that cannot start, no node, or a pod that cannot get ready to start its
// containers, in this order. Otherwise it says how long until the first bound is reached
// (0 when no wait has one).
func (r *Reconciler) pendingFailure(job *bkv1.BuildJob, waits podstate.Waits, now time.Time) (*outcome, time.Duration) {
	o, left := containerFailure(waits, r.opts.ImagePullGrace, now)
	if o != nil {
		return o, 0
	}
	o, leftNode := nodeFailure(job, waits.First(podstate.WaitNode), r.opts.UnschedulableTimeout, now)
	if o != nil {
		return o, 0
	}
	o, leftSetup := setupFailure(waits.First(podstate.WaitPodSetup), r.opts.PodSetupTimeout, now)
	return o, operator.Soonest(left, leftNode, leftSetup)
}

// containerFailure looks for a container whose status says it cannot start: an image that
// cannot be pulled or is invalid, or a container that cannot be created. It returns the
// outcome when the failure is final (at once for an image nothing recovers, after grace
// for the others) and otherwise how long until it would be.
func containerFailure(waits podstate.Waits, grace time.Duration, now time.Time) (*outcome, time.Duration) {
	var wait time.Duration
	for _, w := range waits {
		if w.FromEvents {
			continue // the container's status has the last word
		}
		left := w.Since.Add(grace).Sub(now)
		detail := ""
		if w.Message != "" {
			detail = ": " + w.Message
		}
		switch w.Kind {
		case podstate.WaitImageInvalid:
			return neverRan(bkv1.ReasonInvalidImage, fmt.Sprintf(
				"The image %q of container %q is not a valid image reference%s. Fix the image in the BuildEnvironment, for example golang:1.26 or registry.example.com/ci/go@sha256:....",
				w.Image, w.Container, detail), progressZero), 0
		case podstate.WaitImageNeverPull:
			return neverRan(bkv1.ReasonImagePullFailed, fmt.Sprintf(
				"The image %q of container %q is not on the node, and its pull policy is Never%s. Load the image onto the nodes, or set imagePullPolicy to IfNotPresent.",
				w.Image, w.Container, detail), progressZero), 0
		case podstate.WaitImagePull:
			if left <= 0 {
				return neverRan(bkv1.ReasonImagePullFailed, fmt.Sprintf(
					"The image %q of container %q could not be pulled (%s%s). Check the image's name and tag, and that the cluster can reach its registry (a private registry needs imagePullSecrets in the BuildEnvironment).",
					w.Image, w.Container, w.Reason, detail), progressZero), 0
			}
			wait = left
		case podstate.WaitCreateContainer:
			if left <= 0 {
				return neverRan(bkv1.ReasonCreateContainerError, fmt.Sprintf(
					"Container %q could not be created (%s%s). Check the Secrets, ConfigMaps and volumes the BuildEnvironment refers to.",
					w.Container, w.Reason, detail), progressZero), 0
			}
			wait = left
		}
	}
	return nil, wait
}

// unschedulable returns the outcome of a pod of job that has been unschedulable for longer
// than its bound, and otherwise how long until it would be (0 when it is not unschedulable).
// The bound is timeout (--unschedulable-timeout: long, as a cluster autoscaler may still add
// a node), or the job's own timeout when that is shorter.
func unschedulable(job *bkv1.BuildJob, pod *corev1.Pod, timeout time.Duration, now time.Time) (*outcome, time.Duration) {
	return nodeFailure(job, podstate.Waiting(pod, nil).First(podstate.WaitNode), timeout, now)
}

// nodeFailure is unschedulable, for the pod's wait for a node (nil: it has one).
func nodeFailure(job *bkv1.BuildJob, w *podstate.Wait, timeout time.Duration, now time.Time) (*outcome, time.Duration) {
	if w == nil {
		return nil, 0
	}
	bound, byJob := schedulingBound(job, timeout)
	left := w.Since.Add(bound).Sub(now)
	if left > 0 {
		return nil, left
	}
	msg := "The job's pod could not be scheduled for " + humanDuration(bound)
	if byJob {
		msg += ", the job's own timeout"
	}
	if w.Message != "" {
		msg += ": " + strings.TrimSuffix(w.Message, ".")
	}
	msg += ". Ask for fewer resources, or check the BuildEnvironment's nodeSelector, tolerations and affinity against the cluster's nodes."
	return neverRan(bkv1.ReasonUnschedulable, msg, progressZero), 0
}

// schedulingBound is how long the pod of job may wait for a node: timeout, or the job's
// own timeout when that is shorter (byJob). The job's spec holds its timeout, its step's or
// its environment's default (set at admission); the cached pod does not (trimPod drops its
// environment).
func schedulingBound(job *bkv1.BuildJob, timeout time.Duration) (bound time.Duration, byJob bool) {
	if m := job.Spec.TimeoutMinutes; m != nil && *m > 0 {
		if jt := time.Duration(*m) * time.Minute; jt < timeout {
			return jt, true
		}
	}
	return timeout, false
}

// setupFailure is the outcome of a pod on a node that has not got ready to start its
// containers (w; nil: nothing is wrong) for timeout: its volumes do not mount or attach,
// or its sandbox cannot be created. Otherwise it says how long until it would be.
func setupFailure(w *podstate.Wait, timeout time.Duration, now time.Time) (*outcome, time.Duration) {
	if w == nil {
		return nil, 0
	}
	if left := w.Since.Add(timeout).Sub(now); left > 0 {
		return nil, left
	}
	detail := ""
	if w.LatestReason != "" {
		detail = fmt.Sprintf(" (%s: %s)", w.LatestReason, strings.TrimSuffix(w.LatestMessage, "."))
	}
	return neverRan(bkv1.ReasonCreateContainerError, fmt.Sprintf(
		"The job's pod could not get ready to start its containers for %s%s. Check the volumes, Secrets and ConfigMaps the BuildEnvironment mounts, and the node's container runtime and network.",
		timeout, detail), progressZero), 0
}
