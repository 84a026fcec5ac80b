package plugin

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// namer says how an error names an option: as the plugin config writes it, or as
// the step env variable that gave it. option is a dotted path
// ("resources.limits.cpu"); index is a list position or -1.
type namer func(option string, index int) string

func pluginNamer(option string, index int) string {
	if index >= 0 {
		return fmt.Sprintf("plugin %s: %s[%d]", Name, option, index)
	}
	return fmt.Sprintf("plugin %s: %s", Name, option)
}

func envNamer(option string, index int) string {
	if index >= 0 {
		return fmt.Sprintf("step env %s entry %d", envName(option), index+1)
	}
	return "step env " + envName(option)
}

// mergedNamer names each option after the source its value came from.
func mergedNamer(fromPlugin map[string]bool) namer {
	return func(option string, index int) string {
		if fromPlugin[option] {
			return pluginNamer(option, index)
		}
		return envNamer(option, index)
	}
}

// validate returns one error per problem.
func validate(o Options, name namer) []error {
	var errs []error
	if o.BuildEnvironment != "" {
		if problems := validation.IsDNS1123Subdomain(o.BuildEnvironment); len(problems) > 0 {
			errs = append(errs, fmt.Errorf("%s %q is not a valid BuildEnvironment name (%s): give the name of a BuildEnvironment "+
				"in the operator's job namespace (buildkite-jobs by default), such as go-1-26 (`kubectl -n buildkite-jobs get buildenvironments` lists them)",
				name(optBuildEnvironment, -1), o.BuildEnvironment, strings.Join(problems, "; ")))
		}
	}
	errs = append(errs, validateLogPaths(o.LogPaths, name)...)
	if t := o.TimeoutMinutes; t != nil && (*t < 1 || *t > MaxTimeoutMinutes) {
		errs = append(errs, fmt.Errorf("%s %d is out of range: give a whole number of minutes from 1 to %d (7 days); "+
			"the BuildEnvironment may allow less", name(optTimeout, -1), *t, MaxTimeoutMinutes))
	}
	if r := o.Resources; r != nil {
		qerrs := append(validateQuantities("requests", r.Requests, name), validateQuantities("limits", r.Limits, name)...)
		if len(qerrs) == 0 {
			qerrs = checkRequestsWithinLimits(r, name)
		}
		errs = append(errs, qerrs...)
	}
	return errs
}

func validateLogPaths(paths []string, name namer) []error {
	var errs []error
	if len(paths) > MaxLogPaths {
		errs = append(errs, fmt.Errorf("%s lists %d files, more than the %d allowed: stream fewer files, "+
			"or have the job write them into one", name(optLogPaths, -1), len(paths), MaxLogPaths))
	}
	seen := map[string]int{}
	for i, p := range paths {
		at := name(optLogPaths, i)
		switch {
		case p == "":
			errs = append(errs, fmt.Errorf("%s is empty: give the full path of a file inside the job's container, "+
				"such as /workspace/service.log, or remove the entry", at))
		case strings.ContainsAny(p, "\x00\n\r"):
			errs = append(errs, fmt.Errorf("%s %q contains a NUL or line break: give a plain file path, such as /workspace/service.log", at, p))
		case !strings.HasPrefix(p, "/"):
			errs = append(errs, fmt.Errorf("%s %q is not an absolute path: give the full path inside the job's container, "+
				"such as %s", at, p, path.Join("/workspace", p)))
		case hasDotDot(p):
			errs = append(errs, fmt.Errorf("%s %q contains \"..\": name the file by its absolute path without \"..\", such as %s",
				at, p, path.Clean(p)))
		default:
			if j, dup := seen[p]; dup {
				errs = append(errs, fmt.Errorf("%s %q repeats entry %d: list each file once", at, p, j+1))
			}
			seen[p] = i
		}
	}
	return errs
}

func hasDotDot(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return true
		}
	}
	return false
}

func validateQuantities(group string, rl *ResourceList, name namer) []error {
	if rl == nil {
		return nil
	}
	var errs []error
	for _, res := range resourceNames {
		q := *rl.field(res)
		if q == "" {
			continue
		}
		option := "resources." + group + "." + res
		example := "512Mi or 4Gi"
		if res == "cpu" {
			example = "500m or 2"
		}
		parsed, err := resource.ParseQuantity(string(q))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s %q is not a Kubernetes quantity: give a number with an optional unit, such as %s",
				name(option, -1), string(q), example))
		case parsed.Sign() < 0:
			errs = append(errs, fmt.Errorf("%s %q is negative: give a positive quantity, such as %s", name(option, -1), string(q), example))
		}
	}
	return errs
}

// checkRequestsWithinLimits assumes every quantity parses (validate checks that first).
func checkRequestsWithinLimits(r *Resources, name namer) []error {
	if r == nil || r.Requests == nil || r.Limits == nil {
		return nil
	}
	var errs []error
	for _, res := range resourceNames {
		req, lim := *r.Requests.field(res), *r.Limits.field(res)
		if req == "" || lim == "" {
			continue
		}
		rq, err1 := resource.ParseQuantity(string(req))
		lq, err2 := resource.ParseQuantity(string(lim))
		if err1 != nil || err2 != nil {
			continue
		}
		if rq.Cmp(lq) > 0 {
			errs = append(errs, fmt.Errorf("%s %s is more than its limit %s (%s): a request must not exceed its limit; "+
				"raise the limit or lower the request", name("resources.requests."+res, -1), req, lim,
				strings.TrimPrefix(name("resources.limits."+res, -1), "plugin "+Name+": ")))
		}
	}
	return errs
}

// Requirements converts the resources to the Kubernetes form of the job's
// command container; nil when the step sized nothing. Call it on options that
// passed FromJob or Validate; it still reports a bad quantity rather than panicking.
func (r *Resources) Requirements() (*corev1.ResourceRequirements, error) {
	if r == nil {
		return nil, nil
	}
	conv := func(group string, rl *ResourceList) (corev1.ResourceList, error) {
		if rl == nil {
			return nil, nil
		}
		out := corev1.ResourceList{}
		for _, res := range resourceNames {
			q := *rl.field(res)
			if q == "" {
				continue
			}
			parsed, err := resource.ParseQuantity(string(q))
			if err != nil {
				return nil, fmt.Errorf("resources.%s.%s %s: %w", group, res, strconv.Quote(string(q)), err)
			}
			out[corev1.ResourceName(res)] = parsed
		}
		if len(out) == 0 {
			return nil, nil
		}
		return out, nil
	}
	requests, err := conv("requests", r.Requests)
	if err != nil {
		return nil, err
	}
	limits, err := conv("limits", r.Limits)
	if err != nil {
		return nil, err
	}
	if requests == nil && limits == nil {
		return nil, nil
	}
	return &corev1.ResourceRequirements{Requests: requests, Limits: limits}, nil
}
