package spawner

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels on the slots' state Secrets, so that a restarted spawner finds them.
const (
	LabelSpawner = "buildkite-operator.dev/spawner"
	LabelSlot    = "buildkite-operator.dev/slot"
)

// Annotations on a slot's state Secret that say, for `kubectl describe secret`, that
// Buildkite holds the slot: paused (registered and pinging, taking no job) or stopped
// (down for good: see AnnotationSlotState). They are absent while the slot takes jobs.
const (
	// AnnotationSlotState is SlotPaused or SlotStopped. A stopped slot stays down across
	// restarts of the operator; removing this annotation (or deleting the Secret) brings
	// it back: it registers a new agent within a minute.
	AnnotationSlotState = "buildkite-operator.dev/slot-state"
	// AnnotationSlotStateSince is when Buildkite paused or stopped the slot (RFC 3339).
	AnnotationSlotStateSince = "buildkite-operator.dev/slot-state-since"
	// AnnotationSlotStateMessage is the message Buildkite's ping gave with the action,
	// when it gave one.
	AnnotationSlotStateMessage = "buildkite-operator.dev/slot-state-message"
)

// Values of AnnotationSlotState.
const (
	SlotPaused  = "paused"
	SlotStopped = "stopped"
)

// Keys of a slot state Secret.
const (
	keyAccessToken       = "agent-access-token"
	keyAgentID           = "agent-id"
	keyAgentName         = "agent-name"
	keyEndpoint          = "endpoint"
	keyPingInterval      = "ping-interval"
	keyHeartbeatInterval = "heartbeat-interval"
	keyAccepting         = "accepting"
	keyIntake            = "intake"
	keyJobID             = "job-id"
	keyJobToken          = "job-token"
	keyJob               = "job"
	keyBuildJob          = "buildjob"
	keyFailing           = "failing"
)

// slotState is what a slot must remember across a kill -9, kept in its Secret. Every
// field written is written before the step that depends on it: the registration before
// connect, Accepting before accept, Failing (with the job) before the job is started to be
// failed. The accepted job and its BuildJob are not written for a job that goes well: a
// resumed slot finds them from the Accepting marker (slot.resumeAccepting). They are when
// the Secret is saved for another reason while the job is in hand, and read back as such.
type slotState struct {
	// The agent registration.
	AgentID, AgentName, AccessToken, Endpoint string
	PingInterval, HeartbeatInterval           int

	// Accepting is the id of a job being accepted: accept may have happened.
	Accepting string
	// Intake is the nonce of the job in hand, drawn when it was offered and saved with
	// Accepting, before anything of the job exists: the spawner's BuildJob carries it
	// (v1alpha1.AnnotationIntake), which no BuildJob made beforehand by someone else can.
	// Empty in the state of an operator from before nonces (adoptLegacy).
	Intake string
	// JobID, JobToken and Job (the accepted job as JSON) are the job in hand.
	JobID, JobToken string
	Job             []byte
	// BuildJob names the job's BuildJob once it exists with its Secret: a resumed slot
	// adopts it as it is and waits for it, whatever has changed around it since.
	BuildJob string
	// Failing holds "reason\nmessage" once the job is being failed at intake.
	Failing string

	// Held is what Buildkite's pings hold the slot in: "" (it takes jobs), SlotPaused or
	// SlotStopped, since HeldSince, with Buildkite's HeldMessage. Kept in the Secret's
	// annotations, not its data: they are for people to read, and to edit (a stopped
	// slot comes back when the annotation goes).
	Held, HeldSince, HeldMessage string
}

func (s *slotState) paused() bool  { return s.Held == SlotPaused }
func (s *slotState) stopped() bool { return s.Held == SlotStopped }

// hold records that Buildkite holds the slot in held ("" to let it go) since now.
func (s *slotState) hold(held, message string, now time.Time) {
	s.Held, s.HeldMessage, s.HeldSince = held, message, ""
	if held != "" {
		s.HeldSince = now.UTC().Format(time.RFC3339)
	}
}

func (s *slotState) registered() bool { return s.AccessToken != "" }

// busy reports a slot that holds, or may hold, a job.
func (s *slotState) busy() bool { return s.Accepting != "" || s.JobID != "" }

func (s *slotState) clearJob() {
	s.Accepting, s.Intake, s.JobID, s.JobToken, s.Job, s.BuildJob, s.Failing = "", "", "", "", nil, "", ""
}

// fail records why the job in hand is being failed at intake.
func (s *slotState) fail(e *intakeError) { s.Failing = string(e.reason) + "\n" + e.msg }

// failure is the reason and the message that fail recorded.
func (s *slotState) failure() (IntakeFailure, string) {
	reason, msg, _ := strings.Cut(s.Failing, "\n")
	return IntakeFailure(reason), msg
}

func (s *slotState) clearRegistration() {
	s.AgentID, s.AgentName, s.AccessToken, s.Endpoint = "", "", "", ""
	s.PingInterval, s.HeartbeatInterval = 0, 0
}

func (s *slotState) data() map[string][]byte {
	d := map[string][]byte{}
	put := func(k, v string) {
		if v != "" {
			d[k] = []byte(v)
		}
	}
	put(keyAccessToken, s.AccessToken)
	put(keyAgentID, s.AgentID)
	put(keyAgentName, s.AgentName)
	put(keyEndpoint, s.Endpoint)
	if s.PingInterval > 0 {
		put(keyPingInterval, strconv.Itoa(s.PingInterval))
	}
	if s.HeartbeatInterval > 0 {
		put(keyHeartbeatInterval, strconv.Itoa(s.HeartbeatInterval))
	}
	put(keyAccepting, s.Accepting)
	put(keyIntake, s.Intake)
	put(keyJobID, s.JobID)
	put(keyJobToken, s.JobToken)
	if len(s.Job) > 0 {
		d[keyJob] = s.Job
	}
	put(keyBuildJob, s.BuildJob)
	put(keyFailing, s.Failing)
	return d
}

// annotate writes the state's annotations onto sec, leaving any others as they are.
func (s *slotState) annotate(sec *corev1.Secret) {
	set := func(k, v string) {
		switch {
		case v != "":
			if sec.Annotations == nil {
				sec.Annotations = map[string]string{}
			}
			sec.Annotations[k] = v
		case sec.Annotations != nil:
			delete(sec.Annotations, k)
		}
	}
	set(AnnotationSlotState, s.Held)
	set(AnnotationSlotStateSince, s.HeldSince)
	set(AnnotationSlotStateMessage, s.HeldMessage)
}

// stateFromSecret is the state a slot's Secret holds: its data, and what Buildkite holds
// the slot in from its annotations. An annotation with a value the spawner does not
// write is ignored.
func stateFromSecret(sec *corev1.Secret) slotState {
	st := stateFromData(sec.Data)
	if held := sec.Annotations[AnnotationSlotState]; held == SlotPaused || held == SlotStopped {
		st.Held, st.HeldSince, st.HeldMessage = held, sec.Annotations[AnnotationSlotStateSince], sec.Annotations[AnnotationSlotStateMessage]
	}
	return st
}

func stateFromData(d map[string][]byte) slotState {
	atoi := func(k string) int {
		n, _ := strconv.Atoi(string(d[k]))
		return n
	}
	return slotState{
		AccessToken:       string(d[keyAccessToken]),
		AgentID:           string(d[keyAgentID]),
		AgentName:         string(d[keyAgentName]),
		Endpoint:          string(d[keyEndpoint]),
		PingInterval:      atoi(keyPingInterval),
		HeartbeatInterval: atoi(keyHeartbeatInterval),
		Accepting:         string(d[keyAccepting]),
		Intake:            string(d[keyIntake]),
		JobID:             string(d[keyJobID]),
		JobToken:          string(d[keyJobToken]),
		Job:               d[keyJob],
		BuildJob:          string(d[keyBuildJob]),
		Failing:           string(d[keyFailing]),
	}
}

// stateStore keeps the slots' state Secrets. Each slot is the only writer of its Secret.
type stateStore struct {
	c         client.Client
	r         client.Reader
	namespace string
	spawner   string
}

// SlotSecretName is the name of the state Secret of one slot of a spawner.
func SlotSecretName(spawner string, index int) string {
	return fmt.Sprintf("%s-slot-%d", spawner, index)
}

// load returns the state of every slot that has a Secret, by slot index.
func (st *stateStore) load(ctx context.Context) (map[int]*corev1.Secret, error) {
	var list corev1.SecretList
	if err := st.r.List(ctx, &list, client.InNamespace(st.namespace), client.MatchingLabels{LabelSpawner: st.spawner}); err != nil {
		return nil, fmt.Errorf("listing slot state Secrets in namespace %s: %w", st.namespace, err)
	}
	out := map[int]*corev1.Secret{}
	for i := range list.Items {
		sec := &list.Items[i]
		idx, err := strconv.Atoi(sec.Labels[LabelSlot])
		if err != nil || idx < 0 || sec.Name != SlotSecretName(st.spawner, idx) {
			continue // not one of ours, whatever its labels say
		}
		out[idx] = sec
	}
	return out, nil
}

// save writes state into the slot's Secret, creating it when needed. sec is the last
// version written (nil when none); the new version is returned.
func (st *stateStore) save(ctx context.Context, index int, sec *corev1.Secret, state *slotState) (*corev1.Secret, error) {
	if sec == nil {
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Name:      SlotSecretName(st.spawner, index),
			Namespace: st.namespace,
			Labels:    map[string]string{LabelSpawner: st.spawner, LabelSlot: strconv.Itoa(index)},
		}, Type: corev1.SecretTypeOpaque}
	} else {
		sec = sec.DeepCopy()
	}
	sec.Data = state.data()
	state.annotate(sec)
	if sec.ResourceVersion == "" {
		err := st.c.Create(ctx, sec)
		if err == nil {
			return sec, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating slot state Secret %s: %w", sec.Name, err)
		}
		// Left by an earlier life of this slot: take it over.
		var cur corev1.Secret
		if err := st.r.Get(ctx, client.ObjectKeyFromObject(sec), &cur); err != nil {
			return nil, fmt.Errorf("reading slot state Secret %s: %w", sec.Name, err)
		}
		sec.ResourceVersion = cur.ResourceVersion
		sec.Annotations = cur.Annotations
		state.annotate(sec)
	}
	err := st.c.Update(ctx, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec.ResourceVersion = ""
		return st.save(ctx, index, sec, state)
	case apierrors.IsConflict(err):
		var cur corev1.Secret
		if err := st.r.Get(ctx, client.ObjectKeyFromObject(sec), &cur); err != nil {
			return nil, fmt.Errorf("reading slot state Secret %s: %w", sec.Name, err)
		}
		// Someone else wrote it (a person editing its annotations): keep what they set
		// beside the slot's own.
		sec.ResourceVersion = cur.ResourceVersion
		sec.Annotations = cur.Annotations
		state.annotate(sec)
		if err := st.c.Update(ctx, sec); err != nil {
			return nil, fmt.Errorf("updating slot state Secret %s: %w", sec.Name, err)
		}
		return sec, nil
	case err != nil:
		return nil, fmt.Errorf("updating slot state Secret %s: %w", sec.Name, err)
	}
	return sec, nil
}

func (st *stateStore) delete(ctx context.Context, index int) error {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SlotSecretName(st.spawner, index), Namespace: st.namespace}}
	if err := st.c.Delete(ctx, sec); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting slot state Secret %s: %w", sec.Name, err)
	}
	return nil
}
