package buildjob

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// ConfigureCache sets up opts, the manager's cache, for the controller:
//
//   - Secrets: only the job token Secrets the spawner makes (labelled with the job), and
//     of each only its job token. Every Buildkite call needs the job's token, and reading
//     it from the API server each time was a third of the operator's reads per job; the
//     job's env, which the spawner keeps in the same Secret, is the pod's to read and never
//     enters the operator's memory. A Secret the cache does not have is read from the API
//     server (token).
//   - Pods: without what their containers are told (env, command, arguments, mounts) and
//     their volumes (trimPod): the controller reads a pod's status, node, containers'
//     names, images and resources, never those, which made most of a cached job pod (at
//     1000 jobs in flight, 12 of the 79 MB the operator kept). The pod is only ever
//     patched from the cache (its finalizer), never updated whole.
//   - Everything: without managedFields, which the operator never reads and which are,
//     for a pod, about as large as the rest of it (memory at 1000 jobs in flight).
func ConfigureCache(opts *cache.Options) {
	req, err := labels.NewRequirement(bkv1.LabelJob, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant label key: cannot fail
	}
	if opts.ByObject == nil {
		opts.ByObject = map[client.Object]cache.ByObject{}
	}
	opts.ByObject[&corev1.Secret{}] = cache.ByObject{Label: labels.NewSelector().Add(*req), Transform: trimTokenSecret}
	opts.ByObject[&corev1.Pod{}] = cache.ByObject{Transform: trimPod}
	if opts.DefaultTransform == nil {
		opts.DefaultTransform = cache.TransformStripManagedFields()
	}
}

// trimTokenSecret keeps of a Secret what token reads, its name and the job token under
// the default key, and its owner, whose reconcile its events bring. A BuildJob naming
// another key is read from the API server.
var _ toolscache.TransformFunc = trimTokenSecret

func trimTokenSecret(obj any) (any, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	trimmed := &corev1.Secret{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
			Labels: s.Labels, OwnerReferences: s.OwnerReferences, DeletionTimestamp: s.DeletionTimestamp,
		},
		Type: s.Type,
	}
	// The token, and the seal that says the spawner made the Secret for its BuildJob.
	for _, k := range []string{bkv1.DefaultSecretKey, bkv1.TokenSecretSealKey} {
		if v, ok := s.Data[k]; ok {
			if trimmed.Data == nil {
				trimmed.Data = map[string][]byte{}
			}
			trimmed.Data[k] = v
		}
	}
	return trimmed, nil
}

// trimPod drops from a cached pod its managedFields, its volumes and, of each container,
// its env, command, arguments and mounts (see ConfigureCache).
var _ toolscache.TransformFunc = trimPod

func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	p.Spec.Volumes = nil
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			c := &list[i]
			c.Env, c.EnvFrom, c.Command, c.Args, c.VolumeMounts, c.VolumeDevices = nil, nil, nil, nil, nil, nil
		}
	}
	return p, nil
}
