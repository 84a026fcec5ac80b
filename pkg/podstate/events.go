package podstate

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The kubelet tells some things only in events: a volume that does not mount, a sandbox
// that cannot be made, an image being pulled, and a failed pull seconds (on a busy node,
// much longer) before it writes the container's ErrImagePull status.

// eventTime is when an event first happened, whichever API recorded it.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// eventLastTime is when an event last happened, whichever API recorded it.
func eventLastTime(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	}
	return eventTime(e)
}

// oldestFirst is a copy of events, in the order they first happened.
func oldestFirst(events []corev1.Event) []corev1.Event {
	out := slices.Clone(events)
	slices.SortStableFunc(out, func(a, b corev1.Event) int { return eventTime(&a).Compare(eventTime(&b)) })
	return out
}

// setupFailures are the kubelet's warnings that the pod cannot get ready to start its
// containers, oldest first.
func setupFailures(events []corev1.Event) []corev1.Event {
	var out []corev1.Event
	for _, e := range events {
		if e.Type == corev1.EventTypeWarning && setupFailureEvents[e.Reason] {
			out = append(out, e)
		}
	}
	return out
}

// lastPullEvents is, for each container whose events keep selects, its last such event,
// and the containers in the order of their first.
func lastPullEvents(events []corev1.Event, keep func(*corev1.Event) bool) (order []string, last map[string]*corev1.Event) {
	last = map[string]*corev1.Event{}
	for i := range events {
		e := &events[i]
		m := fieldPathContainer.FindStringSubmatch(e.InvolvedObject.FieldPath)
		if m == nil || !keep(e) {
			continue
		}
		prev, seen := last[m[1]]
		if !seen {
			order = append(order, m[1])
		}
		if !seen || !eventLastTime(e).Before(eventLastTime(prev)) {
			last[m[1]] = e
		}
	}
	return order, last
}

// isFailedPull selects the kubelet's event that carries a failed pull's error. It follows
// the failure with more events of its own ("Error: ErrImagePull", "Back-off pulling
// image", a new "Pulling"), which carry none.
func isFailedPull(e *corev1.Event) bool {
	return e.Reason == eventFailed && failedPullPrefix.MatchString(e.Message)
}

func isPulled(e *corev1.Event) bool    { return e.Reason == eventPulled }
func isPullEvent(e *corev1.Event) bool { return pullEvents[e.Reason] }

// pullError is the error of an image's last pull, from the message of a container in
// ErrImagePull or ImagePullBackOff; "" when the message has none. The two reasons
// alternate while the kubelet retries, and both messages give the same error.
func pullError(message string) string {
	return strings.TrimPrefix(backOffPrefix.ReplaceAllString(message, ""), errImagePullPrefix)
}

// eventPullError is the error of a failed pull, from the message of the kubelet's event
// about it: the same as the container's ErrImagePull status then gives.
func eventPullError(message string) string {
	return pullError(failedPullPrefix.ReplaceAllString(message, ""))
}
