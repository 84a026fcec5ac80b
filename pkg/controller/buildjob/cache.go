package buildjob

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

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
//     1000 jobs in flight, 12 of the 79 MB the operator kept). Image volumes and their
//     mounts stay: a pull that fails for one is reported as its container's, and only
//     they say which image it is (podstate's pulledImage). The pod is only ever
//     patched from the cache (its finalizer), never updated whole.
//   - BuildJobs: whole while their job runs or is being reported; once reported and
//     let go of (trimBuildJob), without the parts of the spec that only running the job
//     needs (its env names, command, agent tags, resources, log paths, timeout,
//     endpoint) and without its labels and annotations. Reported BuildJobs are kept for
//     their retention (an hour by default), so at a steady rate they are most of the
//     BuildJobs in memory: a trimmed one holds 2.7 KB of heap instead of 7.8 KB
//     (BenchmarkCacheRetainedBuildJobs). Such a copy is marked (TrimmedInCache) and can
//     never be written back: see cache_guard.go.
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
	opts.ByObject[&bkv1.BuildJob{}] = cache.ByObject{Transform: trimBuildJob}
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

// trimPod drops from a cached pod its managedFields, its volumes but image volumes and,
// of each container, its env, command, arguments and mounts but those of image volumes
// (see ConfigureCache).
var _ toolscache.TransformFunc = trimPod

func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	images := map[string]bool{}
	p.Spec.Volumes = slices.DeleteFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
		images[v.Name] = v.Image != nil
		return v.Image == nil
	})
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			c := &list[i]
			c.Env, c.EnvFrom, c.Command, c.Args, c.VolumeDevices = nil, nil, nil, nil, nil
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return !images[m.Name] })
		}
	}
	return p, nil
}

// trimBuildJob drops from a cached BuildJob its managedFields (a type's own transform
// replaces the default one), and, once the BuildJob is over (trimmable), the parts of
// its spec that nothing in the process reads any more, marking the copy as trimmed.
//
// What still reads a reported BuildJob, and what of it, so what is kept:
//
//   - the controller's reap (reconcile, reap, reapAfterRetention, getPod, environment,
//     releaseOrphan): name, namespace, UID, finalizers, deletionTimestamp, resourceVersion,
//     spec.buildEnvironment (the retention of its environment) and the status (podName,
//     phase, times.reportedAt, the PodCreated condition); it writes nothing from it but
//     a Delete with the UID as precondition;
//   - the spawner's slot waiting for its job (Spawner.reported): the status
//     (times.reportedAt, the Reported and Finished conditions) and
//     spec.tokenSecretRef.name;
//   - the spawner's informer handler (wake) and the controller's watch predicate
//     (GenerationChangedPredicate): name, namespace and generation.
//
// The webhooks, the drain and the spawner's creator read BuildJobs from the API server,
// not from the cache, and the one list from the cache, the warm pools' (their capacity:
// buildenvironment's capacity.go), is by an index of the unreported BuildJobs, which are
// never trimmed. So a trimmed copy also loses its labels and annotations, but for the mark. It keeps the
// whole status, the rest of the metadata and the spec's identity (job, pipeline, build,
// step, label, URL), which are small: a log line or an event about the job can still name it.
//
// A spec with nothing to drop is left as it is, unmarked: the copy is then the real
// object, which keeps the mark's promise (cache_guard.go). The transform is idempotent (a
// trimmed copy has nothing left to drop).
var _ toolscache.TransformFunc = trimBuildJob

func trimBuildJob(obj any) (any, error) {
	job, ok := obj.(*bkv1.BuildJob)
	if !ok {
		return obj, nil
	}
	job.ManagedFields = nil
	if !trimmable(job) || !dropRunningSpec(&job.Spec) {
		return job, nil
	}
	// Nothing reads a reported BuildJob's labels or annotations (kubectl's last-applied one,
	// on a BuildJob applied by hand, is its spec again); the annotations keep the mark.
	job.Labels = nil
	job.Annotations = map[string]string{AnnotationCacheTrimmed: trimMark}
	return job, nil
}

// trimmable: the BuildJob is over for everything but its reaping: reported (Buildkite was
// told how its job ended, or can no longer be) and without the controller's finalizer,
// which reap removes with an Update (from the whole copy it reads before that Update's
// watch event brings the trimmed one). Nothing adds the finalizer back to a reported
// BuildJob, and the status is never written again, so the controller writes nothing from
// a trimmed copy: it only deletes it after its retention.
func trimmable(job *bkv1.BuildJob) bool {
	return reported(job) && !controllerutil.ContainsFinalizer(job, Finalizer)
}

// dropRunningSpec clears what only running the job reads (building its pod, calling
// Buildkite, its timeout) and reports whether anything was there to clear. A field added
// to the spec later is kept until it is listed here: keeping costs memory, dropping what
// someone reads would cost correctness.
func dropRunningSpec(s *bkv1.BuildJobSpec) bool {
	if s.Command == "" && len(s.AgentTags) == 0 && len(s.Env) == 0 && len(s.EnvNames) == 0 &&
		len(s.LogPaths) == 0 && s.TimeoutMinutes == nil && s.Resources == nil && s.AgentEndpoint == "" {
		return false
	}
	s.Command, s.AgentTags, s.Env, s.EnvNames = "", nil, nil, nil
	s.LogPaths, s.TimeoutMinutes, s.Resources, s.AgentEndpoint = nil, nil, nil, ""
	return true
}
