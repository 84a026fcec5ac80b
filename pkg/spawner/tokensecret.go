package spawner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/buildkite/agent/v3/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/seal"
)

// moveEnvToSecret takes the job's env out of bj's spec, leaving only the names
// (spec.envNames), and returns it for the token Secret. A pipeline's env holds its
// secrets, and a BuildJob or a pod spec may be read by many more people than its Secret.
// The error, an *intakeError, names a variable whose name cannot make a Secret key.
func moveEnvToSecret(bj *v1alpha1.BuildJob) (map[string]string, error) {
	env := bj.Spec.Env
	names := slices.Sorted(maps.Keys(env))
	var problems []string
	for _, n := range names {
		if msgs := k8svalidation.IsConfigMapKey(v1alpha1.EnvSecretKey(n)); len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("the step's env variable %.80q cannot be kept in a Secret: %s", n, strings.Join(msgs, "; ")))
		}
	}
	if len(problems) > 0 {
		return nil, &intakeError{IntakeInvalidJob, strings.Join(problems, "\n") + "\nRename or shorten the variable in the pipeline, then retry the job."}
	}
	bj.Spec.Env, bj.Spec.EnvNames = nil, names
	if len(names) == 0 {
		bj.Spec.EnvNames = nil
	}
	return env, nil
}

// adoptedEnv is the env of a BuildJob made by an earlier life of the slot, in case its
// Secret is still to be made: the job's env mapped again, as it was then. Should the
// mapping fail now, the Secret holds the token alone, and the pod, missing its env, fails
// to start with an explanation from the controller.
func adoptedEnv(job *api.Job, cur *v1alpha1.BuildJob) map[string]string {
	if len(cur.Spec.EnvNames) == 0 {
		return nil
	}
	bj, err := buildJobFor(job, cur.Namespace, job.Endpoint)
	if err != nil {
		return nil
	}
	return bj.Spec.Env
}

// createTokenSecret makes the BuildJob's Secret: the job token, the value from env of
// each variable the BuildJob lists in spec.envNames, and the seal that tells the
// controller the Secret is the spawner's, made for this BuildJob. A Secret of that name
// that is already there is used only if it is this one (made by an earlier attempt); one
// from before seals, controlled by owner, is sealed now. Any other is someone else's: the
// token is not written there (errForeignSecret).
func (cr *creator) createTokenSecret(ctx context.Context, owner *v1alpha1.BuildJob, token string, env map[string]string) error {
	key, err := cr.sealKey(ctx)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      owner.Spec.TokenSecretRef.Name,
			Namespace: owner.Namespace,
			Labels:    map[string]string{v1alpha1.LabelJob: owner.Labels[v1alpha1.LabelJob]},
		},
		Type: corev1.SecretTypeOpaque,
		// Nothing changes a token Secret once made, and the kubelet does not watch an
		// immutable Secret a pod mounts or reads env from: one watch less per job pod.
		Immutable: ptr.To(true),
		Data: map[string][]byte{
			owner.Spec.TokenSecretRef.KeyOrDefault(): []byte(token),
			v1alpha1.TokenSecretSealKey:              []byte(key.BuildJob(owner)),
		},
	}
	for _, n := range owner.Spec.EnvNames {
		if v, ok := env[n]; ok {
			sec.Data[v1alpha1.EnvSecretKey(n)] = []byte(v)
		}
	}
	if owner.Labels[v1alpha1.LabelJob] == "" {
		sec.Labels = nil
	}
	if err := controllerutil.SetControllerReference(owner, sec, cr.c.Scheme()); err != nil {
		return fmt.Errorf("owning the token Secret by its BuildJob: %w", err)
	}
	return retryKube(ctx, func() error {
		err := cr.c.Create(ctx, sec.DeepCopy())
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		var cur corev1.Secret
		if err := cr.r.Get(ctx, client.ObjectKeyFromObject(sec), &cur); err != nil {
			return err
		}
		switch {
		case key.TokenSecret(owner, &cur):
			return nil
		case ownedBy(&cur, owner) && len(cur.Data[v1alpha1.TokenSecretSealKey]) == 0:
			return cr.sealLegacy(ctx, key, owner, &cur)
		}
		return errForeignSecret{sec.Name}
	})
}

// sealLegacy seals the token Secret of a BuildJob made before seals, so that the
// controller, which uses only sealed Secrets, can still report its job.
func (cr *creator) sealLegacy(ctx context.Context, key *seal.Key, owner *v1alpha1.BuildJob, sec *corev1.Secret) error {
	sec = sec.DeepCopy()
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[v1alpha1.TokenSecretSealKey] = []byte(key.BuildJob(owner))
	if err := cr.c.Update(ctx, sec); err != nil {
		return fmt.Errorf("sealing the token Secret %s of BuildJob %s: %w", sec.Name, owner.Name, err)
	}
	return nil
}

// ownedBy reports whether obj is controlled by owner, by UID.
func ownedBy(obj metav1.Object, owner *v1alpha1.BuildJob) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == owner.UID
}

// errForeignSecret: the token Secret's name is taken by a Secret the spawner did not make.
type errForeignSecret struct{ name string }

func (e errForeignSecret) Error() string {
	return fmt.Sprintf("Secret %s, where the job's token goes, was made by someone other than the operator", e.name)
}
