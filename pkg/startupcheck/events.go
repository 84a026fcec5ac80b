package startupcheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EventSink records one event about the operator.
type EventSink interface {
	Record(ctx context.Context, eventType, reason, message string) error
}

// Pod identity, from the downward API in the chart's Deployment: the start-up check's
// events are about the Pod, so that `kubectl describe pod` shows them.
const (
	EnvPodName      = "POD_NAME"
	EnvPodNamespace = "POD_NAMESPACE"
	EnvPodUID       = "POD_UID"
)

// PodReference is the operator's own Pod, from the downward API's variables (getenv is
// os.Getenv but in tests); namespace when POD_NAMESPACE is not set, and no name when
// POD_NAME is not.
func PodReference(getenv func(string) string, namespace string) corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion: "v1", Kind: "Pod",
		Name:      getenv(EnvPodName),
		Namespace: cmp.Or(getenv(EnvPodNamespace), namespace),
		UID:       types.UID(getenv(EnvPodUID)),
	}
}

// PodEvents records core/v1 Events about the operator's Pod, in its namespace (where the
// operator's Role already allows events create and patch; the events.k8s.io API is
// granted only in the job namespace). An event without the Pod's UID is not shown by
// `kubectl describe pod`, which selects on it.
type PodEvents struct {
	Client client.Client
	Pod    corev1.ObjectReference
	// noPod says once that there is no Pod to record events on.
	noPod sync.Once
}

// eventSource names the operator in the events it records.
const eventSource = "buildkite-operator"

// maxEventMessage is what the API server's event recorders keep of a message.
const maxEventMessage = 1024

var errNoPod = errors.New("POD_NAME is not set (the downward API), so there is no Pod to record events on")

// Record creates one Event about the Pod. Without a Pod name it records nothing, and the
// first such error says how to give one.
func (e *PodEvents) Record(ctx context.Context, eventType, reason, message string) error {
	if e.Pod.Name == "" {
		err := errNoPod
		e.noPod.Do(func() {
			err = fmt.Errorf("%w: set POD_NAME, POD_NAMESPACE and POD_UID from the Pod's metadata", errNoPod)
		})
		return err
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// As client-go's recorders name theirs: the object's name and a unique suffix.
			GenerateName: e.Pod.Name + ".",
			Namespace:    e.Pod.Namespace,
		},
		InvolvedObject: e.Pod,
		Type:           eventType,
		Reason:         reason,
		Message:        truncate(message, maxEventMessage),
		Source:         corev1.EventSource{Component: eventSource},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if err := e.Client.Create(ctx, ev); err != nil {
		return fmt.Errorf("recording event %s on Pod %s/%s: %w", reason, e.Pod.Namespace, e.Pod.Name, err)
	}
	return nil
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "..."
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
