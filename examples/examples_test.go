// Package examples_test checks the example BuildEnvironments and pipeline against a real API
// server and the operator's own checks, so that what the examples show works.
package examples_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

const namespace = "examples"

// privilegedNamespace enforces the privileged Pod Security level, as the job namespace of an
// operator installed for privilegedExamples would.
const privilegedNamespace = "examples-privileged"

// The environments the README and docs/pipelines.md describe.
var wantEnvironments = []string{"default", "git-mirrors", "go-1-26", "go-1-26-postgres", "large", "privileged-node"}

// readEnvironments decodes every example BuildEnvironment, refusing fields the API does not
// have (a typo the API server would silently drop).
func readEnvironments(t *testing.T) map[string]*bkv1.BuildEnvironment {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("buildenvironments", "*.yaml"))
	require.NoError(t, err)
	out := map[string]*bkv1.BuildEnvironment{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		e := &bkv1.BuildEnvironment{}
		require.NoError(t, yaml.UnmarshalStrict(b, e), "%s", f)
		assert.Equal(t, bkv1.GroupVersion.String(), e.APIVersion, "%s", f)
		assert.Equal(t, "BuildEnvironment", e.Kind, "%s", f)
		assert.Equal(t, e.Name+".yaml", filepath.Base(f), "each file is named after its environment")
		out[e.Name] = e
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	slices.Sort(names)
	require.Equal(t, wantEnvironments, names)
	return out
}

// privilegedExamples run only in a job namespace at the privileged Pod Security level (a
// second operator's, as their files say), and carry the warning every privileged environment
// gets.
var privilegedExamples = map[string]bool{"privileged-node": true}

// Each example passes the webhook's checks with no warning but the one a privileged
// environment always gets: they are meant to be copied.
func TestExampleEnvironmentsAreValid(t *testing.T) {
	for name, e := range readEnvironments(t) {
		errs, warnings := validation.BuildEnvironment(e)
		assert.Empty(t, errs, "%s", name)
		if privilegedExamples[name] {
			require.Len(t, warnings, 1, "%s", name)
			assert.Contains(t, warnings[0], "privileged containers and hostPath volumes", "%s", name)
			continue
		}
		assert.Empty(t, warnings, "%s", name)
	}
}

// Applied with kubectl to an API server with the CRDs, each example is stored as written,
// the BuildEnvironment controller marks it Ready, and the pod of a job in it is one the API
// server accepts in a namespace that enforces the restricted Pod Security Standard.
func TestExampleEnvironmentsOnAnAPIServer(t *testing.T) {
	env, err := testenv.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := env.Client
	// Labelled as the chart labels its job namespace: each example's pods must meet the
	// restricted Pod Security Standard, which the API server's admission enforces.
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}))
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: privilegedNamespace,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}))
	// What large.yaml says must exist.
	require.NoError(t, c.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "ci-large"}, Value: 1000}))

	out, err := exec.CommandContext(ctx, env.Kubectl(), "--kubeconfig", env.KubeconfigPath,
		"apply", "--server-side", "-n", namespace, "-f", "buildenvironments").CombinedOutput()
	require.NoError(t, err, "kubectl apply: %s", out)

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
	})
	require.NoError(t, err)
	require.NoError(t, buildenvironment.Setup(mgr, nil))
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { stop(); <-done })

	for name, want := range readEnvironments(t) {
		t.Run(name, func(t *testing.T) {
			got := &bkv1.BuildEnvironment{}
			require.Eventually(t, func() bool {
				if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, got); err != nil {
					return false
				}
				ready := meta.FindStatusCondition(got.Status.Conditions, bkv1.ConditionReady)
				return ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == got.Generation
			}, 30*time.Second, 100*time.Millisecond, "%s never became Ready: %+v", name, got.Status.Conditions)

			// Stored as written: nothing pruned by the schema (the API server's defaults
			// filled in on our side too).
			wantSpec := want.Spec.DeepCopy()
			if wantSpec.Runner == "" {
				wantSpec.Runner = bkv1.DefaultRunner
			}
			assert.Equal(t, toJSON(t, wantSpec), toJSON(t, got.Spec))

			job := gen.BuildJob("example-job", gen.SetBuildJobNamespace(namespace), gen.SetBuildJobUID("00000000-0000-4000-8000-000000000001"),
				gen.SetBuildJobEnvironment(name), gen.SetBuildJobPipeline(pipelineFor(got)))
			errs, _ := validation.BuildJob(job, got, nil, nil)
			assert.Empty(t, errs, "a job in %s", name)
			pod, err := podbuilder.Build(job, got, podbuilder.Options{AgentEndpoint: "https://agent.buildkite.com/v3", PodSecurity: podbuilder.PodSecurityRestricted})
			require.NoError(t, err)
			pod.OwnerReferences = nil // its BuildJob does not exist here
			if !privilegedExamples[name] {
				require.NoError(t, c.Create(ctx, pod, client.DryRunAll), "the API server refuses the pod of a job in %s", name)
				return
			}
			// Under restricted it is refused by Pod Security admission, saying why (not as an
			// invalid pod); in a privileged namespace, built for that level, it is accepted.
			err = c.Create(ctx, pod, client.DryRunAll)
			require.Error(t, err)
			assert.Contains(t, err.Error(), `violates PodSecurity "restricted`)
			pod, err = podbuilder.Build(job, got, podbuilder.Options{AgentEndpoint: "https://agent.buildkite.com/v3", PodSecurity: podbuilder.PodSecurityPrivileged})
			require.NoError(t, err)
			pod.OwnerReferences, pod.Namespace = nil, privilegedNamespace
			require.NoError(t, c.Create(ctx, pod, client.DryRunAll), "the API server refuses the pod of a job in %s in a privileged namespace", name)
		})
	}
}

// pipelineFor is a pipeline slug the environment allows.
func pipelineFor(e *bkv1.BuildEnvironment) string {
	for _, p := range e.Spec.AllowedPipelines {
		if !strings.ContainsAny(p, "*?[") {
			return p
		}
	}
	return gen.DefaultPipeline
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// The example pipeline and the project's own (.buildkite/pipeline.yml) give options the
// operator accepts, naming example environments, with the plugin referred to as a git URL at
// a release tag; between them they use every example environment.
func TestExamplePipelines(t *testing.T) {
	envs := readEnvironments(t)
	used := map[string]bool{}
	for _, file := range []string{"pipeline.yml", filepath.Join("..", ".buildkite", "pipeline.yml")} {
		t.Run(file, func(t *testing.T) {
			for name := range pipelineEnvironments(t, file, envs) {
				used[name] = true
			}
		})
	}
	assert.Len(t, used, len(wantEnvironments), "the pipelines use every example environment")
}

// pipelineEnvironments checks the command steps of the pipeline in file and returns the
// environments they run in. Steps without a command (wait, block) are left alone.
func pipelineEnvironments(t *testing.T, file string, envs map[string]*bkv1.BuildEnvironment) map[string]bool {
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var doc struct {
		Steps []json.RawMessage `json:"steps"`
	}
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.NotEmpty(t, doc.Steps)
	used := map[string]bool{}
	for _, raw := range doc.Steps {
		var s struct {
			Label   string            `json:"label"`
			Command string            `json:"command"`
			Env     map[string]string `json:"env"`
			Plugins []map[string]any  `json:"plugins"`
			Agents  map[string]string `json:"agents"`
		}
		if json.Unmarshal(raw, &s) != nil || s.Command == "" {
			continue // "wait", or a step that runs nothing
		}
		assert.True(t, strings.HasPrefix(s.Agents["queue"], "bk-operator"), "%s targets an operator's queue, not %q", s.Label, s.Agents["queue"])
		jobEnv := map[string]string{}
		for k, v := range s.Env {
			jobEnv[k] = v
		}
		if len(s.Plugins) > 0 {
			for _, p := range s.Plugins {
				for source := range p {
					assert.True(t, plugin.IsOperatorSource(source), "%s: %s", s.Label, source)
					assert.Regexp(t, `^https://github\.com/buildkite-operator/buildkite-operator\.git#v\d+\.\d+\.\d+$`, source)
				}
			}
			pj, err := json.Marshal(s.Plugins)
			require.NoError(t, err)
			jobEnv[plugin.PluginsEnv] = string(pj)
		}
		opts, err := plugin.FromJob(jobEnv)
		require.NoError(t, err, "%s", s.Label)
		name := opts.BuildEnvironment
		if name == "" {
			name = "default"
		}
		assert.Contains(t, envs, name, "%s names an example environment", s.Label)
		used[name] = true
	}
	require.NotEmpty(t, used, "%s has no command step", file)
	return used
}
