package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/suggest"
)

// Option names, as plugin.yml and the README spell them.
const (
	optBuildEnvironment = "build_environment"
	optLogPaths         = "log_paths"
	optTimeout          = "timeout_in_minutes"
	optResources        = "resources"
)

var (
	topLevelOptions = []string{optBuildEnvironment, optLogPaths, optTimeout, optResources}
	resourceGroups  = []string{"requests", "limits"}
	resourceNames   = []string{"cpu", "memory", "ephemeral-storage"}
)

// FromJob reads a job's options from its env: the buildkite-operator entry of
// BUILDKITE_PLUGINS (in any source form, see IsOperatorSource) and, as a
// fallback, the step env BK_OPERATOR_BUILD_ENVIRONMENT, BK_OPERATOR_LOG_PATHS
// (";"-separated), BK_OPERATOR_TIMEOUT_IN_MINUTES and
// BK_OPERATOR_RESOURCES_{REQUESTS,LIMITS}_{CPU,MEMORY,EPHEMERAL_STORAGE}.
// Plugin options win field by field (for resources, quantity by quantity).
// Every problem found is reported, each saying what is wrong and how to fix it;
// on error the returned Options are zero.
func FromJob(env map[string]string) (Options, error) {
	var errs []error
	fromPlugin, pluginSet, err := pluginOptions(env[PluginsEnv])
	if err != nil {
		errs = append(errs, err)
	}
	fromEnv, err := envOptions(env)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return Options{}, errors.Join(errs...)
	}
	merged := merge(fromPlugin, fromEnv)
	namer := mergedNamer(pluginSet)
	if err := errors.Join(checkRequestsWithinLimits(merged.Resources, namer)...); err != nil {
		return Options{}, err
	}
	return merged, nil
}

// Validate checks options on their own: a valid BuildEnvironment name, absolute
// log paths without "..", a timeout within bounds, quantities that parse and
// requests no larger than their limits. Errors name the options as a step writes
// them in the plugin's config.
func (o Options) Validate() error {
	return errors.Join(validate(o, pluginNamer)...)
}

// pluginOptions finds the operator's entry in BUILDKITE_PLUGINS and decodes and
// validates its config. set holds the options (dotted paths for resources) it
// gave, so that merged errors can name the source of each value.
func pluginOptions(pluginsJSON string) (o Options, set map[string]bool, err error) {
	entries, _, err := parsePlugins(pluginsJSON)
	if err != nil {
		return Options{}, nil, err
	}
	var found []pluginEntry
	for _, el := range entries {
		for _, e := range el {
			if IsOperatorSource(e.source) {
				found = append(found, e)
			}
		}
	}
	switch len(found) {
	case 0:
		return Options{}, map[string]bool{}, nil
	case 1:
	default:
		sources := make([]string, len(found))
		for i, e := range found {
			sources[i] = strconv.Quote(e.source)
		}
		return Options{}, nil, fmt.Errorf("plugin %s: the step lists the plugin %d times (%s): list it once and put all its options there",
			Name, len(found), strings.Join(sources, ", "))
	}
	// Validate what did decode too, so that one run shows every problem.
	o, set, errs := decodeConfig(found[0].config)
	errs = append(errs, validate(o, pluginNamer)...)
	return o, set, errors.Join(errs...)
}

// decodeConfig turns the plugin's config object into Options. It decodes by hand,
// rather than with json.Unmarshal into Options, to report every unknown option
// and every wrong type with the option's name and a fix.
func decodeConfig(cfg json.RawMessage) (Options, map[string]bool, []error) {
	set := map[string]bool{}
	if len(cfg) == 0 {
		return Options{}, set, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(cfg, &obj); err != nil {
		return Options{}, nil, []error{pluginErr("the plugin's config is %s, not a map of options: write the options under the plugin, such as\n"+
			"  - %s#v0.1.0:\n      build_environment: go", describeJSON(cfg), Name)}
	}
	var o Options
	var errs []error
	for _, key := range sortedKeys(obj) {
		val := bytes.TrimSpace(obj[key])
		switch key {
		case optBuildEnvironment:
			if err := json.Unmarshal(val, &o.BuildEnvironment); err != nil || val[0] != '"' {
				errs = append(errs, pluginErr("%s is %s, not a string: give the name of a BuildEnvironment, such as go-1-26", key, describeJSON(val)))
				continue
			}
			set[key] = true
		case optLogPaths:
			if err := json.Unmarshal(val, &o.LogPaths); err != nil || val[0] != '[' {
				errs = append(errs, pluginErr("%s is %s, not a list of strings: write one absolute path per line, such as\n"+
					"      log_paths:\n        - /workspace/service.log", key, describeJSON(val)))
				continue
			}
			set[key] = true
		case optTimeout:
			n, err := parseMinutes(string(val), pluginNamer(key, -1))
			if err != nil && !errors.Is(err, errNotMinutes) {
				errs = append(errs, err)
				continue
			}
			if err != nil || val[0] == '"' {
				errs = append(errs, pluginErr("%s is %s, not a whole number of minutes: write it without quotes, such as %s: 30", key, describeJSON(val), key))
				continue
			}
			o.TimeoutMinutes = &n
			set[key] = true
		case optResources:
			r, rset, rerrs := decodeResources(val)
			errs = append(errs, rerrs...)
			o.Resources = r
			for k := range rset {
				set[k] = true
			}
		default:
			errs = append(errs, pluginErr("unknown option %q%s: the options are %s", key, didYouMean(key, topLevelOptions), strings.Join(topLevelOptions, ", ")))
		}
	}
	return o, set, errs
}

func decodeResources(val json.RawMessage) (*Resources, map[string]bool, []error) {
	set := map[string]bool{}
	var groups map[string]json.RawMessage
	if err := json.Unmarshal(val, &groups); err != nil || val[0] != '{' {
		return nil, nil, []error{pluginErr("resources is %s, not a map: write requests and/or limits under it, such as\n"+
			"      resources:\n        requests: {cpu: 500m, memory: 1Gi}", describeJSON(val))}
	}
	var errs []error
	r := &Resources{}
	for _, g := range sortedKeys(groups) {
		gval := bytes.TrimSpace(groups[g])
		if g != "requests" && g != "limits" {
			errs = append(errs, pluginErr("unknown option \"resources.%s\"%s: resources takes requests and limits", g, didYouMean(g, resourceGroups)))
			continue
		}
		var list map[string]json.RawMessage
		if err := json.Unmarshal(gval, &list); err != nil || gval[0] != '{' {
			errs = append(errs, pluginErr("resources.%s is %s, not a map: give quantities by resource name, such as {cpu: 500m, memory: 1Gi}", g, describeJSON(gval)))
			continue
		}
		rl := &ResourceList{}
		for _, name := range sortedKeys(list) {
			qval := bytes.TrimSpace(list[name])
			var q Quantity
			if err := q.UnmarshalJSON(qval); err != nil {
				errs = append(errs, pluginErr("resources.%s.%s is %s, not a quantity: give a string such as \"500m\" or \"1Gi\", or a number such as 2", g, name, describeJSON(qval)))
				continue
			}
			field := rl.field(name)
			if field == nil {
				errs = append(errs, pluginErr("unknown resource \"resources.%s.%s\"%s: a step may size %s", g, name, didYouMean(name, resourceNames), strings.Join(resourceNames, ", ")))
				continue
			}
			*field = q
			set["resources."+g+"."+name] = true
		}
		if g == "requests" {
			r.Requests = rl
		} else {
			r.Limits = rl
		}
	}
	return r, set, errs
}

// field returns the quantity of a resource by its Kubernetes name, or nil.
func (rl *ResourceList) field(name string) *Quantity {
	switch name {
	case "cpu":
		return &rl.CPU
	case "memory":
		return &rl.Memory
	case "ephemeral-storage":
		return &rl.EphemeralStorage
	}
	return nil
}

// envOptions reads the BK_OPERATOR_* step env. Empty variables count as unset,
// because pipelines often write `VAR: ""` to turn something off.
func envOptions(env map[string]string) (Options, error) {
	known := map[string]bool{}
	var o Options
	var errs []error
	get := func(option string) string {
		name := envName(option)
		known[name] = true
		return strings.TrimSpace(env[name])
	}
	if v := get(optBuildEnvironment); v != "" {
		o.BuildEnvironment = v
	}
	if v := get(optLogPaths); v != "" {
		for p := range strings.SplitSeq(v, ";") {
			if p = strings.TrimSpace(p); p != "" {
				o.LogPaths = append(o.LogPaths, p)
			}
		}
	}
	if v := get(optTimeout); v != "" {
		n, err := parseMinutes(v, envNamer(optTimeout, -1))
		if err != nil && !errors.Is(err, errNotMinutes) {
			errs = append(errs, err)
		} else if err != nil {
			errs = append(errs, fmt.Errorf("step env %s=%q is not a whole number of minutes: give one such as 30", envName(optTimeout), v))
		} else {
			o.TimeoutMinutes = &n
		}
	}
	for _, g := range resourceGroups {
		for _, name := range resourceNames {
			v := get("resources." + g + "." + name)
			if v == "" {
				continue
			}
			if o.Resources == nil {
				o.Resources = &Resources{}
			}
			rl := &o.Resources.Requests
			if g == "limits" {
				rl = &o.Resources.Limits
			}
			if *rl == nil {
				*rl = &ResourceList{}
			}
			*(*rl).field(name) = Quantity(v)
		}
	}
	var unknown []string
	for k := range env {
		if strings.HasPrefix(k, StepEnvPrefix) && !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	knownNames := sortedKeys(known)
	for _, k := range unknown {
		errs = append(errs, fmt.Errorf("step env %s is not an option of %s%s: the step env options are %s",
			k, Name, didYouMean(k, knownNames), strings.Join(knownNames, ", ")))
	}
	if len(errs) > 0 {
		return Options{}, errors.Join(errs...)
	}
	return o, errors.Join(validate(o, envNamer)...)
}

// merge lays the plugin's options over the step env's, field by field.
func merge(fromPlugin, fromEnv Options) Options {
	out := fromEnv
	if fromPlugin.BuildEnvironment != "" {
		out.BuildEnvironment = fromPlugin.BuildEnvironment
	}
	if fromPlugin.LogPaths != nil {
		out.LogPaths = fromPlugin.LogPaths
	}
	if fromPlugin.TimeoutMinutes != nil {
		out.TimeoutMinutes = fromPlugin.TimeoutMinutes
	}
	out.Resources = mergeResources(fromPlugin.Resources, fromEnv.Resources)
	return out
}

func mergeResources(p, e *Resources) *Resources {
	if p == nil && e == nil {
		return nil
	}
	out := &Resources{}
	var pr, pl, er, el *ResourceList
	if p != nil {
		pr, pl = p.Requests, p.Limits
	}
	if e != nil {
		er, el = e.Requests, e.Limits
	}
	out.Requests = mergeList(pr, er)
	out.Limits = mergeList(pl, el)
	return out
}

func mergeList(p, e *ResourceList) *ResourceList {
	if p == nil && e == nil {
		return nil
	}
	out := &ResourceList{}
	for _, name := range resourceNames {
		var v Quantity
		if e != nil {
			v = *e.field(name)
		}
		if p != nil && *p.field(name) != "" {
			v = *p.field(name)
		}
		*out.field(name) = v
	}
	return out
}

// parseMinutes reads a whole number of minutes. Numbers beyond int32 are
// reported here, with the text as given; the range of smaller ones is
// validate's job, so that every source gets the same message.
func parseMinutes(s string, subject string) (int32, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%s %s is out of range: give a whole number of minutes from 1 to %d (7 days)", subject, strings.TrimSpace(s), MaxTimeoutMinutes)
	}
	if err != nil {
		return 0, errNotMinutes
	}
	return int32(n), nil
}

var errNotMinutes = errors.New("not a whole number of minutes")

// envName is the step env variable of an option: log_paths → BK_OPERATOR_LOG_PATHS,
// resources.requests.ephemeral-storage → BK_OPERATOR_RESOURCES_REQUESTS_EPHEMERAL_STORAGE.
func envName(option string) string {
	return StepEnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(option))
}

func pluginErr(format string, args ...any) error {
	return fmt.Errorf("plugin "+Name+": "+format, args...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// didYouMean returns ` (did you mean "x"?)` when a known name is a likely typo of got
// (at most three edits away).
func didYouMean(got string, known []string) string {
	best := suggest.Nearest(got, known, 3)
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}
