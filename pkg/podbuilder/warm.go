package podbuilder

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// The hand-off volume of a warm pod: the projected ServiceAccount token with which its
// supervisor proves to the hand-off endpoint which pod it is, and the endpoint's CA bundle.
const (
	// HandoffTokenExpirationSeconds is the lifetime of the projected token. The kubelet
	// renews it well before it ends, and the supervisor reads the file at every attempt.
	HandoffTokenExpirationSeconds = 3600
	// HandoffCAKey is the key of the CA bundle in the ConfigMap Options.HandoffCAConfigMap.
	HandoffCAKey = "ca.crt"
	// defaultServiceAccount is the account of a pod that names none.
	defaultServiceAccount = "default"
	// handoffTokenFile is the token's file in the hand-off volume.
	handoffTokenFile = "token"
)

// BuildWarm returns the pod, named name, of env's warm pool: the pod a job of env would
// get from Build, without what only a job knows (its env, its labels and annotations, its
// resources, its BuildJob as owner, its activeDeadlineSeconds, any reference to its token
// Secret, and the finalizer that its assignment adds with the rest), and with the hand-off
// settings: the endpoint's URL, a projected token for opts.HandoffAudience and the CA bundle
// of opts.HandoffCAConfigMap, in the job container only. The pod is labeled LabelWarmPool,
// annotated with env's generation and with its template (see WarmFits), and owned by env,
// so that deleting the environment deletes its pool.
func BuildWarm(env *bkv1.BuildEnvironment, opts Options, name string) (*corev1.Pod, error) {
	if env == nil {
		return nil, errors.New("building a warm pod needs its BuildEnvironment")
	}
	if name == "" {
		return nil, fmt.Errorf("building a warm pod of BuildEnvironment %s needs a name for it", env.Name)
	}
	if err := checkHandoff(env, opts); err != nil {
		return nil, err
	}
	if err := checkWarmReserved(env); err != nil {
		return nil, err
	}
	pod, err := build(nil, env, opts, warmMeta(env, name))
	if err != nil {
		return nil, err
	}
	addHandoff(pod, opts)
	if pod.Spec.ServiceAccountName == "" {
		// A projected ServiceAccount token needs the account named; the API server would
		// give a pod without one this same default.
		pod.Spec.ServiceAccountName = defaultServiceAccount
	}
	template, err := templateHash(&pod.Spec)
	if err != nil {
		return nil, err
	}
	pod.Annotations[AnnotationWarmTemplate] = template
	pod.Annotations[AnnotationWarmHandoff] = handoffKey(opts)
	return pod, nil
}

// checkHandoff refuses options without which a warm pod could never get its job.
func checkHandoff(env *bkv1.BuildEnvironment, opts Options) error {
	switch {
	case opts.HandoffURL == "":
		return fmt.Errorf("BuildEnvironment %s asks for a warm pool, but the operator has no hand-off endpoint URL for its warm pods to fetch their jobs from: configure the endpoint, or set the environment's spec.warmPool.size to 0", env.Name)
	case !strings.HasPrefix(opts.HandoffURL, "https://"):
		return fmt.Errorf("the hand-off endpoint URL %q is not an https URL; warm pods fetch their jobs (and job tokens) only over https", opts.HandoffURL)
	case opts.HandoffAudience == "":
		return fmt.Errorf("BuildEnvironment %s asks for a warm pool, but the operator has no audience for the warm pods' hand-off tokens: configure one unique to the install, such as buildkite-operator.<namespace>.handoff", env.Name)
	}
	return nil
}

// checkWarmReserved refuses an environment whose own volumes or mounts take the hand-off
// volume's name or path. The webhook refuses such environments too, but one may predate it.
func checkWarmReserved(env *bkv1.BuildEnvironment) error {
	for _, v := range env.Spec.Volumes {
		if v.Name == validation.VolumeHandoff {
			return fmt.Errorf("BuildEnvironment %s has a volume named %q, the name of a warm pod's hand-off volume: rename it", env.Name, v.Name)
		}
	}
	for _, m := range env.Spec.VolumeMounts {
		if path.Clean(m.MountPath) == validation.HandoffPath {
			return fmt.Errorf("BuildEnvironment %s mounts volume %q at %s, where a warm pod's hand-off token is mounted: mount it elsewhere", env.Name, m.Name, m.MountPath)
		}
	}
	return nil
}

// warmMeta names a warm pod of env, labels and annotates it as env's pods, with
// LabelWarmPool and env's generation, and makes env its controlling owner. Its owner
// reference does not block env's deletion: that would need update on
// buildenvironments/finalizers, and nothing waits for a pool to go.
func warmMeta(env *bkv1.BuildEnvironment, name string) metav1.ObjectMeta {
	labels := map[string]string{}
	maps.Copy(labels, env.Spec.PodLabels)
	labels[LabelManagedBy] = ManagedBy
	labels[LabelWarmPool] = validation.LabelValue(env.Name)
	annotations := map[string]string{}
	maps.Copy(annotations, env.Spec.PodAnnotations)
	annotations[AnnotationEnvironmentGeneration] = strconv.FormatInt(env.Generation, 10)
	return metav1.ObjectMeta{
		Name:        name,
		Namespace:   env.Namespace,
		Labels:      labels,
		Annotations: annotations,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: bkv1.GroupVersion.String(),
			Kind:       "BuildEnvironment",
			Name:       env.Name,
			UID:        env.UID,
			Controller: ptr(true),
		}},
	}
}

// addHandoff gives pod's job container the hand-off settings: the endpoint's URL, and the
// projected token and CA bundle, mounted read-only in that container alone.
func addHandoff(pod *corev1.Pod, opts Options) {
	sources := []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
		Audience:          opts.HandoffAudience,
		ExpirationSeconds: ptr(int64(HandoffTokenExpirationSeconds)),
		Path:              handoffTokenFile,
	}}}
	env := []corev1.EnvVar{
		literalEnv(podcontract.EnvHandoffURL, opts.HandoffURL),
		literalEnv(podcontract.EnvHandoffTokenPath, path.Join(validation.HandoffPath, handoffTokenFile)),
	}
	if opts.HandoffCAConfigMap != "" {
		sources = append(sources, corev1.VolumeProjection{ConfigMap: &corev1.ConfigMapProjection{
			LocalObjectReference: corev1.LocalObjectReference{Name: opts.HandoffCAConfigMap},
			Items:                []corev1.KeyToPath{{Key: HandoffCAKey, Path: HandoffCAKey}},
		}})
		env = append(env, literalEnv(podcontract.EnvHandoffCAPath, path.Join(validation.HandoffPath, HandoffCAKey)))
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: validation.VolumeHandoff,
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}})
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name != podcontract.JobContainer {
			continue
		}
		c.Env = append(c.Env, env...)
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: validation.VolumeHandoff, MountPath: validation.HandoffPath, ReadOnly: true})
	}
}

// jobView is a copy of spec as WarmFits compares it, without what a job's hand-off
// carries, what its assignment patches, and the hand-off's own parts, which only a warm pod
// has:
//   - the job container's env: the hand-off brings the whole list Build gives a job's
//     container, and the supervisor lays it over its own environment;
//   - activeDeadlineSeconds, which the assignment sets;
//   - the hand-off volume and its mount.
//
// The rest, the containers, their images, resources and mounts, and the pod's volumes,
// scheduling and security, a job gets only from the pod it runs in.
func jobView(spec *corev1.PodSpec) *corev1.PodSpec {
	out := spec.DeepCopy()
	out.ActiveDeadlineSeconds = nil
	if out.ServiceAccountName == "" {
		out.ServiceAccountName = defaultServiceAccount
	}
	isHandoff := func(name string) bool { return name == validation.VolumeHandoff }
	out.Volumes = slices.DeleteFunc(out.Volumes, func(v corev1.Volume) bool { return isHandoff(v.Name) })
	for i := range out.Containers {
		c := &out.Containers[i]
		if c.Name == podcontract.JobContainer {
			c.Env = nil
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return isHandoff(m.Name) })
		}
	}
	return out
}

// templateHash is a hash of jobView(spec): equal for two specs exactly when their job
// views are (Go's JSON encoding writes map keys in order).
func templateHash(spec *corev1.PodSpec) (string, error) {
	b, err := json.Marshal(jobView(spec))
	if err != nil {
		return "", fmt.Errorf("encoding a pod spec for its template hash: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
