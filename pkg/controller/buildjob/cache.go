package buildjob

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
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

// agentClients keeps one agent API client per BuildJob, for as long as its endpoint and
// token stay the same. All are derived from one client (shared), whose dozen HTTP clients
// (one per kind of call, each with its retry rules) they share.
type agentClients struct {
	mu sync.Mutex
	m  map[types.NamespacedName]agentClientEntry

	baseOnce sync.Once
	base     *agentapi.Client
}

type agentClientEntry struct {
	endpoint, token string
	c               *agentapi.Client
}

// get returns the client of key for endpoint and token, made with mk when there is none.
func (a *agentClients) get(key types.NamespacedName, endpoint, token string, mk func() *agentapi.Client) *agentapi.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.m[key]; ok && e.endpoint == endpoint && e.token == token {
		return e.c
	}
	if a.m == nil {
		a.m = map[types.NamespacedName]agentClientEntry{}
	}
	c := mk()
	a.m[key] = agentClientEntry{endpoint: endpoint, token: token, c: c}
	return c
}

// shared is the client every job's client is derived from, made from conf the first time.
func (a *agentClients) shared(conf agentapi.Config) *agentapi.Client {
	a.baseOnce.Do(func() { a.base = agentapi.New(conf) })
	return a.base
}

// forget drops key's client: its job is reported, or its BuildJob gone.
func (a *agentClients) forget(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, key)
}

// jobSet remembers, by BuildJob, what the controller did that its cache may not show yet:
//
//   - created: the pod was created, and the status does not say so yet (no status is
//     written with the create): until it does, a pod the cache does not show is looked up
//     in the API server rather than created again;
//   - deleted: the pod of a reported job was deleted, so that a reconcile reading the
//     cache before the deletion shows does not delete it again.
//
// An entry goes when the status records the pod, the job is reported, or the BuildJob is
// gone (Reconcile).
type jobSet struct{ m sync.Map }

func (c *jobSet) add(key types.NamespacedName)      { c.m.Store(key, struct{}{}) }
func (c *jobSet) remove(key types.NamespacedName)   { c.m.Delete(key) }
func (c *jobSet) has(key types.NamespacedName) bool { _, ok := c.m.Load(key); return ok }
