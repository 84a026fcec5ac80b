package validation

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// EffectiveResources is what the job's container gets: the environment's resources, with
// each resource the step names replacing the environment's value for that resource. The
// pod builder uses it, so that validation checks what will actually be asked of the node.
func EffectiveResources(job *corev1.ResourceRequirements, env *corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := corev1.ResourceRequirements{}
	merge := func(dst *corev1.ResourceList, lists ...corev1.ResourceList) {
		for _, l := range lists {
			for name, q := range l {
				if *dst == nil {
					*dst = corev1.ResourceList{}
				}
				(*dst)[name] = q.DeepCopy()
			}
		}
	}
	var envReq, envLim, jobReq, jobLim corev1.ResourceList
	if env != nil {
		envReq, envLim = env.Requests, env.Limits
	}
	if job != nil {
		jobReq, jobLim = job.Requests, job.Limits
	}
	merge(&out.Requests, envReq, jobReq)
	merge(&out.Limits, envLim, jobLim)
	return out
}

// sortedNames returns the resource names of l in a stable order, so that errors come
// out in the same order on every call.
func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	return names
}

// knownResourceName mirrors the API server's rule for container resources: a standard
// name, a hugepages size, or a domain-qualified extended resource such as nvidia.com/gpu.
func knownResourceName(name corev1.ResourceName) bool {
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
		return true
	}
	s := string(name)
	return strings.HasPrefix(s, corev1.ResourceHugePagesPrefix) || strings.Contains(s, "/")
}

// checkResourceList reports unknown resource names and negative quantities.
func checkResourceList(path *field.Path, l corev1.ResourceList) field.ErrorList {
	var errs field.ErrorList
	for _, name := range sortedNames(l) {
		q := l[name]
		p := path.Key(string(name))
		if !knownResourceName(name) {
			errs = append(errs, field.Invalid(p, string(name), "not a resource Kubernetes knows; use cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as nvidia.com/gpu"))
			continue
		}
		if q.Sign() < 0 {
			errs = append(errs, field.Invalid(p, q.String(), "must not be negative"))
		}
	}
	return errs
}

// checkRequirements checks one container's resources: names, signs, and requests not
// above limits (the API server refuses a pod whose request exceeds its limit).
func checkRequirements(path *field.Path, r corev1.ResourceRequirements) field.ErrorList {
	errs := checkResourceList(path.Child("requests"), r.Requests)
	errs = append(errs, checkResourceList(path.Child("limits"), r.Limits)...)
	errs = append(errs, checkRequestsWithinLimits(path, r, "")...)
	return errs
}

// checkRequestsWithinLimits reports each request above its limit. from, when not empty,
// says where the values came from (for a job, the environment supplies part of them).
func checkRequestsWithinLimits(path *field.Path, r corev1.ResourceRequirements, from string) field.ErrorList {
	var errs field.ErrorList
	for _, name := range sortedNames(r.Requests) {
		req := r.Requests[name]
		lim, ok := r.Limits[name]
		if !ok || req.Cmp(lim) <= 0 {
			continue
		}
		errs = append(errs, field.Invalid(path.Child("requests").Key(string(name)), req.String(),
			fmt.Sprintf("must be less than or equal to the %s limit of %s%s; lower the request or raise the limit", name, lim.String(), from)))
	}
	return errs
}

// checkMax reports each value of l above the same resource in max.
func checkMax(path *field.Path, l corev1.ResourceList, max corev1.ResourceList, what, fix string) field.ErrorList {
	var errs field.ErrorList
	for _, name := range sortedNames(l) {
		q := l[name]
		m, ok := max[name]
		// A negative maximum is reported where it is set; comparing against it here
		// would only repeat that error for every value.
		if !ok || m.Sign() < 0 || q.Cmp(m) <= 0 {
			continue
		}
		errs = append(errs, field.Invalid(path.Key(string(name)), q.String(),
			fmt.Sprintf("exceeds the maximum of %s %s; %s", m.String(), what, fix)))
	}
	return errs
}

// limitRangeMax returns, per resource, the smallest max any LimitRange sets for a
// container (a Container max, or a Pod max, which no single container can exceed either),
// with the name of the LimitRange that sets it.
func limitRangeMax(limits []corev1.LimitRange) (corev1.ResourceList, map[corev1.ResourceName]string) {
	max := corev1.ResourceList{}
	from := map[corev1.ResourceName]string{}
	for _, lr := range limits {
		for _, item := range lr.Spec.Limits {
			if item.Type != corev1.LimitTypeContainer && item.Type != corev1.LimitTypePod {
				continue
			}
			for name, q := range item.Max {
				if cur, ok := max[name]; !ok || q.Cmp(cur) < 0 {
					max[name] = q.DeepCopy()
					from[name] = lr.Name
				}
			}
		}
	}
	return max, from
}
