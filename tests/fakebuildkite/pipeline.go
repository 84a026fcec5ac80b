package fakebuildkite

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	pipeline "github.com/buildkite/go-pipeline"
	"github.com/buildkite/go-pipeline/ordered"
)

// BuildRequest describes a build to create, as a person or a webhook would trigger it.
type BuildRequest struct {
	Pipeline     string            `json:"pipeline"` // slug; default "pipeline"
	Org          string            `json:"org"`      // slug; default "org"
	PipelineYAML string            `json:"pipeline_yaml"`
	Repo         string            `json:"repo"`
	Commit       string            `json:"commit"`  // default "HEAD"
	Branch       string            `json:"branch"`  // default "main"
	Message      string            `json:"message"` // default "Build"
	Env          map[string]string `json:"env"`
}

// stepSpec is one command step, flattened out of groups, before parallelism is expanded.
type stepSpec struct {
	step       *pipeline.CommandStep
	group      *pipeline.GroupStep
	groupID    string
	pipeEnv    map[string]string
	pipeAgents any
}

// CreateBuild makes a build from pipeline YAML: one job per command step (N per step with
// parallelism), each scheduled for agents whose tags satisfy its agent query rules.
// Wait, block, input and trigger steps are not modelled: every command job is runnable at once.
func (s *Server) CreateBuild(req BuildRequest) (*Build, error) {
	if req.Pipeline == "" {
		req.Pipeline = "pipeline"
	}
	if req.Org == "" {
		req.Org = "org"
	}
	if req.Commit == "" {
		req.Commit = "HEAD"
	}
	if req.Branch == "" {
		req.Branch = "main"
	}
	if req.Message == "" {
		req.Message = "Build"
	}
	if !slugRE.MatchString(req.Pipeline) || !slugRE.MatchString(req.Org) {
		return nil, fmt.Errorf("fake buildkite: pipeline %q and org %q must be slugs (lower-case letters, digits and '-')", req.Pipeline, req.Org)
	}
	specs, err := parseSteps([]byte(req.PipelineYAML))
	if err != nil {
		return nil, err
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("fake buildkite: the pipeline has no command steps: give it at least one step with command or commands")
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	key := req.Org + "/" + req.Pipeline
	s.buildNums[key]++
	b := &build{
		id: newUUID(), org: req.Org, pipeline: req.Pipeline, number: s.buildNums[key],
		repo: req.Repo, commit: req.Commit, branch: req.Branch, message: req.Message,
		env: maps.Clone(req.Env), createdAt: time.Now(), metaData: map[string]string{},
		uploads: map[string]*pipelineUpload{},
	}
	b.url = fmt.Sprintf("%s/%s/%s/builds/%d", s.baseURL, b.org, b.pipeline, b.number)
	ids, err := s.addJobsLocked(b, specs, "")
	if err != nil {
		s.buildNums[key]--
		return nil, err
	}
	s.builds[b.id] = b
	s.buildOrder = append(s.buildOrder, b.id)
	s.logf("fake buildkite: build %s #%d (%s) created with %d job(s)", b.id, b.number, key, len(ids))
	s.notifyLocked()
	return &Build{ID: b.id, Number: b.number, URL: b.url, Jobs: ids}, nil
}

var slugRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// parseSteps reads a pipeline (YAML or JSON) and flattens its command steps.
func parseSteps(src []byte) ([]stepSpec, error) {
	p, err := pipeline.Parse(bytes.NewReader(src))
	if err != nil {
		return nil, fmt.Errorf("fake buildkite: parse pipeline: %w", err)
	}
	var pipeEnv map[string]string
	if p.Env != nil {
		pipeEnv = p.Env.ToMap()
	}
	pipeAgents := p.RemainingFields["agents"]
	var specs []stepSpec
	var walk func(steps pipeline.Steps, g *pipeline.GroupStep, gid string) error
	walk = func(steps pipeline.Steps, g *pipeline.GroupStep, gid string) error {
		for _, st := range steps {
			switch st := st.(type) {
			case *pipeline.CommandStep:
				specs = append(specs, stepSpec{step: st, group: g, groupID: gid, pipeEnv: pipeEnv, pipeAgents: pipeAgents})
			case *pipeline.GroupStep:
				if err := walk(st.Steps, st, newUUID()); err != nil {
					return err
				}
			case *pipeline.UnknownStep:
				return fmt.Errorf("fake buildkite: unknown step %v: a step needs command, commands, wait, block, input, trigger or group", st.Contents)
			}
		}
		return nil
	}
	if err := walk(p.Steps, nil, ""); err != nil {
		return nil, err
	}
	return specs, nil
}

// addJobsLocked turns step specs into scheduled jobs of b: all of them, or none on error.
func (s *Server) addJobsLocked(b *build, specs []stepSpec, fromJob string) ([]string, error) {
	var ids []string
	var jobs []*job
	for _, sp := range specs {
		st := sp.step
		rest := map[string]any{}
		for k, v := range st.RemainingFields {
			rest[k] = ordered.ToMapRecursive(v)
		}
		agents := rest["agents"]
		if agents == nil {
			agents = ordered.ToMapRecursive(sp.pipeAgents)
		}
		rules, err := agentQueryRules(agents)
		if err != nil {
			return nil, err
		}
		timeout, err := intField(rest, "timeout_in_minutes")
		if err != nil {
			return nil, err
		}
		parallelism, err := intField(rest, "parallelism")
		if err != nil {
			return nil, err
		}
		pluginsJSON := ""
		if len(st.Plugins) > 0 {
			pj, err := json.Marshal(st.Plugins)
			if err != nil {
				return nil, fmt.Errorf("fake buildkite: encode plugins: %w", err)
			}
			pluginsJSON = string(pj)
		}
		stepJSON, err := json.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("fake buildkite: encode step: %w", err)
		}
		artifactPaths := ""
		switch ap := rest["artifact_paths"].(type) {
		case string:
			artifactPaths = ap
		case []any:
			var parts []string
			for _, p := range ap {
				parts = append(parts, fmt.Sprint(p))
			}
			artifactPaths = strings.Join(parts, ";")
		}
		stepID := newUUID()
		count := max(parallelism, 1)
		for n := range count {
			j := &job{
				id: newUUID(), buildID: b.id, stepID: stepID, stepKey: st.Key, label: st.Label,
				command: st.Command, plugins: pluginsJSON, stepJSON: stepJSON, rules: rules,
				timeoutMinutes: timeout, parallelJob: -1, state: StateScheduled,
				createdAt: time.Now(), uploadedFromJob: fromJob,
			}
			if parallelism > 0 {
				j.parallelJob, j.parallelCount = n, parallelism
			}
			env := map[string]string{}
			maps.Copy(env, sp.pipeEnv)
			maps.Copy(env, b.env)
			maps.Copy(env, st.Env)
			label := st.Label
			if label == "" {
				label = st.Command
			}
			std := map[string]string{
				"BUILDKITE":                           "true",
				"CI":                                  "true",
				"BUILDKITE_JOB_ID":                    j.id,
				"BUILDKITE_BUILD_ID":                  b.id,
				"BUILDKITE_BUILD_NUMBER":              strconv.Itoa(b.number),
				"BUILDKITE_BUILD_URL":                 b.url,
				"BUILDKITE_BUILD_AUTHOR":              "Fake Buildkite",
				"BUILDKITE_BUILD_AUTHOR_EMAIL":        "fake@buildkite.invalid",
				"BUILDKITE_BUILD_CREATOR":             "Fake Buildkite",
				"BUILDKITE_BUILD_CREATOR_EMAIL":       "fake@buildkite.invalid",
				"BUILDKITE_SOURCE":                    "api",
				"BUILDKITE_PIPELINE_SLUG":             b.pipeline,
				"BUILDKITE_PIPELINE_NAME":             b.pipeline,
				"BUILDKITE_PIPELINE_ID":               pipelineID(b.org, b.pipeline),
				"BUILDKITE_PIPELINE_DEFAULT_BRANCH":   "main",
				"BUILDKITE_PIPELINE_PROVIDER":         provider(b.repo),
				"BUILDKITE_ORGANIZATION_SLUG":         b.org,
				"BUILDKITE_ORGANIZATION_ID":           pipelineID(b.org, ""),
				"BUILDKITE_REPO":                      b.repo,
				"BUILDKITE_COMMIT":                    b.commit,
				"BUILDKITE_BRANCH":                    b.branch,
				"BUILDKITE_TAG":                       "",
				"BUILDKITE_MESSAGE":                   b.message,
				"BUILDKITE_PULL_REQUEST":              "false",
				"BUILDKITE_PULL_REQUEST_BASE_BRANCH":  "",
				"BUILDKITE_PULL_REQUEST_REPO":         "",
				"BUILDKITE_REBUILT_FROM_BUILD_ID":     "",
				"BUILDKITE_REBUILT_FROM_BUILD_NUMBER": "",
				"BUILDKITE_TRIGGERED_FROM_BUILD_ID":   "",
				"BUILDKITE_RETRY_COUNT":               "0",
				"BUILDKITE_COMMAND":                   st.Command,
				"BUILDKITE_LABEL":                     label,
				"BUILDKITE_STEP_KEY":                  st.Key,
				"BUILDKITE_STEP_ID":                   stepID,
				"BUILDKITE_PLUGINS":                   pluginsJSON,
				"BUILDKITE_ARTIFACT_PATHS":            artifactPaths,
				"BUILDKITE_TIMEOUT":                   "false",
			}
			if timeout > 0 {
				std["BUILDKITE_TIMEOUT"] = strconv.Itoa(timeout)
			}
			if parallelism > 0 {
				std["BUILDKITE_PARALLEL_JOB"] = strconv.Itoa(n)
				std["BUILDKITE_PARALLEL_JOB_COUNT"] = strconv.Itoa(parallelism)
			}
			if sp.group != nil {
				std["BUILDKITE_GROUP_ID"] = sp.groupID
				std["BUILDKITE_GROUP_KEY"] = sp.group.Key
				if sp.group.Group != nil {
					std["BUILDKITE_GROUP_LABEL"] = *sp.group.Group
				}
			}
			// Buildkite's own variables win over user env of the same name.
			maps.Copy(env, std)
			j.env = env
			jobs = append(jobs, j)
		}
	}
	for _, j := range jobs {
		s.jobs[j.id] = j
		s.jobOrder = append(s.jobOrder, j.id)
		b.jobs = append(b.jobs, j.id)
		ids = append(ids, j.id)
	}
	return ids, nil
}

// agentQueryRules turns a step's agents (a map or a list of "key=value") into rules. Every job
// targets a queue: without a queue rule it gets queue=default, as Buildkite does.
func agentQueryRules(agents any) ([]string, error) {
	var rules []string
	switch a := agents.(type) {
	case nil:
	case map[string]any:
		keys := make([]string, 0, len(a))
		for k := range a {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			rules = append(rules, k+"="+scalarString(a[k]))
		}
	case []any:
		for _, r := range a {
			str, ok := r.(string)
			if !ok || !strings.Contains(str, "=") {
				return nil, fmt.Errorf("fake buildkite: agents list entry %v must be a \"key=value\" string", r)
			}
			rules = append(rules, str)
		}
	default:
		return nil, fmt.Errorf("fake buildkite: agents must be a map or a list of \"key=value\" strings, not %T", agents)
	}
	hasQueue := false
	for _, r := range rules {
		if strings.HasPrefix(r, "queue=") {
			hasQueue = true
		}
	}
	if !hasQueue {
		rules = append(rules, "queue=default")
	}
	return rules, nil
}

func scalarString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func intField(m map[string]any, key string) (int, error) {
	switch v := m[key].(type) {
	case nil:
		return 0, nil
	case int:
		return v, nil
	case int64:
		return int(v), nil
	case uint64:
		return int(v), nil
	case float64:
		if v == float64(int(v)) {
			return int(v), nil
		}
	case string:
		if n, err := strconv.Atoi(v); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("fake buildkite: %s must be a whole number, not %v", key, m[key])
}

func provider(repo string) string {
	u, err := url.Parse(repo)
	if err == nil && strings.Contains(u.Host, "github.com") || strings.Contains(repo, "github.com:") {
		return "github"
	}
	return "git"
}

// pipelineID derives a stable UUID-shaped id from a name, so that the same pipeline keeps
// the same id across builds.
func pipelineID(org, pipe string) string {
	h := fnv64(org + "/" + pipe)
	h2 := fnv64(pipe + "/" + org)
	s := fmt.Sprintf("%016x%016x", h, h2)
	return s[0:8] + "-" + s[8:12] + "-4" + s[13:16] + "-8" + s[17:20] + "-" + s[20:32]
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
