package podstate_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// fixture reads testdata/name.yaml, a List of one Pod and its Events as the API server
// returns them, each decoded strictly so that a misspelt field fails the test rather than
// vanish.
func fixture(t *testing.T, name string) (*corev1.Pod, []corev1.Event) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".yaml"))
	require.NoError(t, err)
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	require.NoError(t, yaml.Unmarshal(b, &list), name)
	var pod *corev1.Pod
	var events []corev1.Event
	for _, item := range list.Items {
		var tm metav1.TypeMeta
		require.NoError(t, json.Unmarshal(item, &tm))
		switch tm.Kind {
		case "Pod":
			require.Nil(t, pod, "%s: one pod per fixture", name)
			pod = &corev1.Pod{}
			strict(t, item, pod)
		case "Event":
			var e corev1.Event
			strict(t, item, &e)
			events = append(events, e)
		default:
			t.Fatalf("%s: unexpected %s", name, tm.Kind)
		}
	}
	require.NotNil(t, pod, "%s has no pod", name)
	return pod, events
}

func strict(t *testing.T, raw json.RawMessage, into any) {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	require.NoError(t, d.Decode(into))
}

// at is a time of the fixtures' day: they start at 12:00:00 UTC, the pod's creation.
func at(t *testing.T, clock string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.DateTime, "2026-11-27 "+clock)
	require.NoError(t, err)
	return ts
}
