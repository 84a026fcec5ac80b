package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// rendered is one rendering of the chart (release buildkite-operator in namespace
// buildkite), decoded, with accessors that return zero values for what is not there, so
// that a check can run on a rendering that lacks what it looks for and fail, not panic.
type rendered struct{ objs []*unstructured.Unstructured }

func renderObjects(t *testing.T, args ...string) rendered {
	t.Helper()
	objs, err := helmchart.Objects(render(t, args...))
	require.NoError(t, err)
	return rendered{objs}
}

// get decodes the object of kind named name ("" for the only one of its kind) into out.
func get[T any](r rendered, kind, name string) (out T, ok bool) {
	for _, o := range r.objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &out); err != nil {
				panic(fmt.Sprintf("decoding %s %s: %v", kind, o.GetName(), err))
			}
			return out, true
		}
	}
	return out, false
}

// all returns the objects of kind.
func all[T any](r rendered, kind string) []T {
	var out []T
	for _, o := range r.objs {
		if o.GetKind() == kind {
			var v T
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &v); err != nil {
				panic(fmt.Sprintf("decoding %s %s: %v", kind, o.GetName(), err))
			}
			out = append(out, v)
		}
	}
	return out
}

func (r rendered) has(kind, name string) bool {
	_, ok := get[map[string]any](r, kind, name)
	return ok
}

func (r rendered) deployment() appsv1.Deployment {
	d, _ := get[appsv1.Deployment](r, "Deployment", "buildkite-operator")
	return d
}

func (r rendered) pod() corev1.PodSpec { return r.deployment().Spec.Template.Spec }

func (r rendered) operator() corev1.Container {
	for _, c := range r.pod().Containers {
		if c.Name == "operator" {
			return c
		}
	}
	return corev1.Container{}
}

// arg is the value the operator's last --name= argument gives, "<unset>" without one.
func (r rendered) arg(name string) string {
	v := "<unset>"
	for _, a := range r.operator().Args {
		if rest, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			v = rest
		}
	}
	return v
}

func (r rendered) drain() batchv1.Job {
	j, _ := get[batchv1.Job](r, "Job", "buildkite-operator-drain")
	return j
}

func (r rendered) drainContainer() corev1.Container {
	for _, c := range r.drain().Spec.Template.Spec.Containers {
		return c
	}
	return corev1.Container{}
}

func (r rendered) containerPort(name string) int32 {
	for _, p := range r.operator().Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func (r rendered) operatorPolicy() networkingv1.NetworkPolicy {
	np, _ := get[networkingv1.NetworkPolicy](r, "NetworkPolicy", "buildkite-operator")
	return np
}

// webhooks lists every webhook of both configurations.
func (r rendered) webhooks() []admissionregistrationv1.ValidatingWebhook {
	var out []admissionregistrationv1.ValidatingWebhook
	for _, c := range all[admissionregistrationv1.ValidatingWebhookConfiguration](r, "ValidatingWebhookConfiguration") {
		out = append(out, c.Webhooks...)
	}
	for _, c := range all[admissionregistrationv1.MutatingWebhookConfiguration](r, "MutatingWebhookConfiguration") {
		for _, w := range c.Webhooks {
			out = append(out, admissionregistrationv1.ValidatingWebhook{Name: w.Name, TimeoutSeconds: w.TimeoutSeconds, NamespaceSelector: w.NamespaceSelector, ClientConfig: w.ClientConfig})
		}
	}
	return out
}

func (r rendered) unstructured(kind, name string) map[string]any {
	o, _ := get[map[string]any](r, kind, name)
	return o
}

// field reads a nested field of an unstructured object, "" when absent.
func field(obj map[string]any, path ...string) string {
	v, ok, _ := unstructured.NestedFieldNoCopy(obj, path...)
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

func (r rendered) prometheusRules() []prometheusRule {
	var out []prometheusRule
	for _, o := range r.objs {
		if o.GetKind() == "PrometheusRule" {
			b, _ := sigsyaml.Marshal(o.Object)
			var pr prometheusRule
			_ = sigsyaml.Unmarshal(b, &pr)
			out = append(out, pr)
		}
	}
	return out
}

func (r rendered) dashboard() (corev1.ConfigMap, bool) {
	return get[corev1.ConfigMap](r, "ConfigMap", "buildkite-operator-buildkite-dashboard")
}

// valueCase sets values of values.yaml to something other than their defaults and checks
// the effect in the rendered objects.
type valueCase struct {
	// values are the paths of values.yaml the row sets: a leaf, or a free-form map.
	values []string
	// base are the values the row's take effect under (pprof.port needs pprof.enabled);
	// set the row's own.
	base, set []string
	// check must pass on base and set together, and fail on base alone.
	check func(c assert.TestingT, r rendered)
}

// flag is a row for a value that is an operator flag, and nothing more.
func flagRow(value, setting, flag, want string) valueCase {
	return valueCase{values: []string{value}, set: []string{"--set", value + "=" + setting}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, want, r.arg(flag), "--%s", flag)
	}}
}

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

var valueCases = []valueCase{
	// The operator's image reaches its pods, the drain hook and job pods' init container.
	{values: []string{"image.repository"}, set: []string{"--set", "image.repository=registry.example.com/ci/bko"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "registry.example.com/ci/bko:0.1.0", r.operator().Image)
		assert.Equal(c, "registry.example.com/ci/bko:0.1.0", r.drainContainer().Image)
		assert.Equal(c, "registry.example.com/ci/bko:0.1.0", r.arg("operator-image"))
	}},
	{values: []string{"image.tag"}, set: []string{"--set", "image.tag=v9.9.9"}, check: func(c assert.TestingT, r rendered) {
		want := "ghcr.io/buildkite-operator/buildkite-operator:v9.9.9"
		assert.Equal(c, want, r.operator().Image)
		assert.Equal(c, want, r.drainContainer().Image)
		assert.Equal(c, want, r.arg("operator-image"))
		assert.Equal(c, "v9.9.9", r.deployment().Labels["app.kubernetes.io/version"])
	}},
	{values: []string{"image.digest"}, set: []string{"--set", "image.digest=" + testDigest, "--set", "image.tag=v9.9.9"}, check: func(c assert.TestingT, r rendered) {
		want := "ghcr.io/buildkite-operator/buildkite-operator@" + testDigest
		assert.Equal(c, want, r.operator().Image, "the digest, the tag ignored")
		assert.Equal(c, want, r.drainContainer().Image)
		assert.Equal(c, want, r.arg("operator-image"), "job pods pull it by digest")
	}},
	{values: []string{"image.pullPolicy"}, set: []string{"--set", "image.pullPolicy=Always"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, corev1.PullAlways, r.operator().ImagePullPolicy)
		assert.Equal(c, corev1.PullAlways, r.drainContainer().ImagePullPolicy)
	}},
	{values: []string{"imagePullSecrets"}, set: []string{"--set", "imagePullSecrets[0].name=registry"}, check: func(c assert.TestingT, r rendered) {
		want := []corev1.LocalObjectReference{{Name: "registry"}}
		assert.Equal(c, want, r.pod().ImagePullSecrets)
		assert.Equal(c, want, r.drain().Spec.Template.Spec.ImagePullSecrets)
		assert.Equal(c, "registry", r.arg("job-image-pull-secrets"), "job pods")
	}},
	flagRow("agentImage.repository", "registry.example.com/mirror/buildkite-agent", "agent-image", "registry.example.com/mirror/buildkite-agent:3.138.1"),
	flagRow("agentImage.tag", "3.139.0", "agent-image", "buildkite/agent:3.139.0"),
	flagRow("agentImage.digest", testDigest, "agent-image", "buildkite/agent@"+testDigest),
	flagRow("agentImage.pullPolicy", "Always", "agent-image-pull-policy", "Always"),
	flagRow("binariesFrom", "init-container", "binaries-from", "init-container"),
	{values: []string{"replicaCount"}, set: []string{"--set", "replicaCount=3"}, check: func(c assert.TestingT, r rendered) {
		if assert.NotNil(c, r.deployment().Spec.Replicas) {
			assert.Equal(c, int32(3), *r.deployment().Spec.Replicas)
		}
	}},

	flagRow("buildkite.registrationTokenSecret.name", "ci-token", "registration-token-secret", "ci-token/token"),
	flagRow("buildkite.registrationTokenSecret.key", "agent-token", "registration-token-secret", "buildkite-agent-token/agent-token"),
	flagRow("buildkite.agentEndpoint", "https://agent.example.com/v3", "agent-endpoint", "https://agent.example.com/v3"),
	{values: []string{"buildkite.allowedAgentEndpoints"}, set: []string{"--set-json", `buildkite.allowedAgentEndpoints=["https://agent-edge.buildkite.com/v3","https://agent-eu.example.com/v3"]`},
		check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, "https://agent-edge.buildkite.com/v3,https://agent-eu.example.com/v3", r.arg("allowed-agent-endpoints"))
		}},
	flagRow("buildkite.name", "ci-linux", "spawner-name", "ci-linux"),
	flagRow("buildkite.slots", "25", "slots", "25"),
	flagRow("buildkite.queue", "linux", "queue", "linux"),
	{values: []string{"buildkite.tags"}, set: []string{"--set", "buildkite.tags.os=linux", "--set", "buildkite.tags.cluster=gke-prod"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "cluster=gke-prod,os=linux", r.arg("tags"))
	}},
	flagRow("buildkite.defaultBuildEnvironment", "go", "default-build-environment", "go"),
	flagRow("buildkite.priority", "5", "priority", "5"),
	flagRow("buildkite.pingMode", "stream-only", "ping-mode", "stream-only"),
	{values: []string{"buildkite.preflight.apiTokenSecret.name"}, set: []string{"--set", "buildkite.preflight.apiTokenSecret.name=buildkite-api-token"},
		check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, "/etc/buildkite-operator/api-token/token", r.arg("buildkite-api-token-file"))
			assert.Contains(c, r.operator().VolumeMounts, corev1.VolumeMount{Name: "buildkite-api-token", MountPath: "/etc/buildkite-operator/api-token", ReadOnly: true})
			assert.True(c, slices.ContainsFunc(r.pod().Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && v.Secret.SecretName == "buildkite-api-token" && v.Secret.Optional != nil && *v.Secret.Optional
			}), "the Secret is mounted, optional so that a missing one is the preflight's finding")
		}},
	{values: []string{"buildkite.preflight.apiTokenSecret.key"}, base: []string{"--set", "buildkite.preflight.apiTokenSecret.name=buildkite-api-token"},
		set: []string{"--set", "buildkite.preflight.apiTokenSecret.key=api"}, check: func(c assert.TestingT, r rendered) {
			assert.True(c, slices.ContainsFunc(r.pod().Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && slices.Equal(v.Secret.Items, []corev1.KeyToPath{{Key: "api", Path: "token"}})
			}), "the key is mounted where --buildkite-api-token-file reads")
		}},
	flagRow("buildkite.preflight.organization", "acme", "buildkite-organization", "acme"),
	flagRow("buildkite.preflight.cluster", "gke-prod", "buildkite-cluster", "gke-prod"),
	flagRow("buildkite.preflight.apiEndpoint", "https://bk-api.example.com/", "buildkite-api-endpoint", "https://bk-api.example.com/"),
	{values: []string{"buildkite.jobPolicy.verification.jwksSecret.name"}, set: []string{"--set", "buildkite.jobPolicy.verification.jwksSecret.name=pipeline-jwks"},
		check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, "/etc/buildkite-operator/verification/jwks.json", r.arg("verification-jwks-file"))
			assert.Contains(c, r.operator().VolumeMounts, corev1.VolumeMount{Name: "verification-jwks", MountPath: "/etc/buildkite-operator/verification", ReadOnly: true})
			assert.True(c, slices.ContainsFunc(r.pod().Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && v.Secret.SecretName == "pipeline-jwks"
			}), "the Secret is mounted")
		}},
	{values: []string{"buildkite.jobPolicy.verification.jwksSecret.key"}, base: []string{"--set", "buildkite.jobPolicy.verification.jwksSecret.name=pipeline-jwks"},
		set: []string{"--set", "buildkite.jobPolicy.verification.jwksSecret.key=keys.json"}, check: func(c assert.TestingT, r rendered) {
			assert.True(c, slices.ContainsFunc(r.pod().Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && slices.Equal(v.Secret.Items, []corev1.KeyToPath{{Key: "keys.json", Path: "jwks.json"}})
			}), "the key is mounted where --verification-jwks-file reads")
		}},
	flagRow("buildkite.jobPolicy.verification.jwksKeyID", "ci-2026", "verification-jwks-key-id", "ci-2026"),
	flagRow("buildkite.jobPolicy.verification.failureBehavior", "warn", "verification-failure-behavior", "warn"),
	{values: []string{"buildkite.jobPolicy.allowedRepositories"}, set: []string{"--set-json", `buildkite.jobPolicy.allowedRepositories=["^git@github\\.com:acme/","^https://github\\.com/acme/"]`},
		check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, `^git@github\.com:acme/,^https://github\.com/acme/`, r.arg("allowed-repositories"))
		}},
	{values: []string{"buildkite.jobPolicy.allowedPlugins"}, set: []string{"--set-json", `buildkite.jobPolicy.allowedPlugins=["^github\\.com/buildkite-plugins/"]`},
		check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, `^github\.com/buildkite-plugins/`, r.arg("allowed-plugins"))
		}},
	flagRow("buildkite.jobPolicy.enableEnvironmentVariableAllowlist", "true", "enable-environment-variable-allowlist", "true"),
	{values: []string{"buildkite.jobPolicy.allowedEnvironmentVariables"}, set: []string{"--set-json", `buildkite.jobPolicy.allowedEnvironmentVariables=["^CI_","^NODE_ENV$"]`},
		check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, "^CI_,^NODE_ENV$", r.arg("allowed-environment-variables"))
		}},

	{values: []string{"jobNamespace.name"}, set: []string{"--set", "jobNamespace.name=ci-jobs"}, check: func(c assert.TestingT, r rendered) {
		assert.True(c, r.has("Namespace", "ci-jobs"))
		assert.Equal(c, "ci-jobs", r.arg("job-namespace"))
		role, _ := get[rbacv1.Role](r, "Role", "buildkite-operator")
		roles := all[rbacv1.Role](r, "Role")
		assert.True(c, slices.ContainsFunc(roles, func(x rbacv1.Role) bool { return x.Name == role.Name && x.Namespace == "ci-jobs" }), "the operator's Role there")
	}},
	{values: []string{"jobNamespace.create"}, set: []string{"--set", "jobNamespace.create=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Empty(c, all[corev1.Namespace](r, "Namespace"), "no Namespace made")
		assert.Equal(c, "buildkite-jobs", r.arg("job-namespace"), "the jobs still go there")
	}},
	{values: []string{"jobNamespace.podSecurity"}, set: []string{"--set", "jobNamespace.podSecurity=baseline"}, check: func(c assert.TestingT, r rendered) {
		ns, _ := get[corev1.Namespace](r, "Namespace", "buildkite-jobs")
		assert.Equal(c, "baseline", ns.Labels["pod-security.kubernetes.io/enforce"])
		assert.Equal(c, "baseline", r.arg("job-pod-security"))
	}},

	flagRow("operator.createTimeout", "3m", "create-timeout", "3m"),
	flagRow("operator.reregisterAfter", "2m", "reregister-after", "2m"),
	flagRow("operator.unschedulableTimeout", "1h", "unschedulable-timeout", "1h"),
	flagRow("operator.imagePullGrace", "1m", "image-pull-grace", "1m"),
	flagRow("operator.failedPodRetention", "1h", "failed-pod-retention", "1h"),
	flagRow("operator.maxRetainedBuildJobs", "20000", "max-retained-buildjobs", "20000"),
	flagRow("operator.jobStatusInterval", "10s", "job-status-interval", "10s"),
	flagRow("operator.tokenWaitTimeout", "3m", "token-wait-timeout", "3m"),
	flagRow("operator.quotaTimeout", "15m", "quota-timeout", "15m"),
	flagRow("operator.podSetupTimeout", "10m", "pod-setup-timeout", "10m"),
	flagRow("operator.runningJobStateInterval", "1m", "running-job-state-interval", "1m"),
	flagRow("operator.cancelMargin", "1m", "cancel-margin", "1m"),
	flagRow("operator.buildkiteTimeout", "20s", "buildkite-timeout", "20s"),
	flagRow("operator.phaseSettle", "0s", "phase-settle", "0s"),
	flagRow("operator.maxConcurrentReconciles", "4", "max-concurrent-reconciles", "4"),
	flagRow("operator.kubeApiQps", "50", "kube-api-qps", "50"),
	flagRow("operator.kubeApiBurst", "100", "kube-api-burst", "100"),
	flagRow("operator.jobImagePullPolicy", "Always", "operator-image-pull-policy", "Always"),
	flagRow("operator.spawner", "false", "spawner", "false"),
	flagRow("operator.leaderElection.enabled", "false", "leader-elect", "false"),
	flagRow("operator.leaderElection.id", "ci-lease", "leader-election-id", "ci-lease"),
	flagRow("operator.leaderElection.leaseDuration", "2m", "leader-elect-lease-duration", "2m"),
	flagRow("operator.leaderElection.renewDeadline", "1m", "leader-elect-renew-deadline", "1m"),
	flagRow("operator.leaderElection.retryPeriod", "10s", "leader-elect-retry-period", "10s"),
	flagRow("operator.logging.level", "debug", "zap-log-level", "debug"),
	flagRow("operator.logging.encoder", "console", "zap-encoder", "console"),
	{values: []string{"operator.extraArgs"}, set: []string{"--set-json", `operator.extraArgs=["--zap-stacktrace-level=panic"]`}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "panic", r.arg("zap-stacktrace-level"))
	}},
	{values: []string{"operator.extraEnv"}, set: []string{"--set-json", `operator.extraEnv=[{"name":"GOGC","value":"50"}]`}, check: func(c assert.TestingT, r rendered) {
		assert.Contains(c, r.operator().Env, corev1.EnvVar{Name: "GOGC", Value: "50"})
	}},

	{values: []string{"webhooks.enabled"}, set: []string{"--set", "webhooks.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Empty(c, r.webhooks(), "no webhook configurations")
		assert.False(c, r.has("Service", "buildkite-operator-webhook"), "no webhook Service")
		assert.Equal(c, "false", r.arg("webhooks"))
	}},
	{values: []string{"webhooks.certManager.enabled"}, set: []string{"--set", "webhooks.certManager.enabled=true"}, check: func(c assert.TestingT, r rendered) {
		assert.True(c, r.has("Certificate", "buildkite-operator-webhook"))
		assert.True(c, r.has("Issuer", "buildkite-operator-selfsigned"), "a self-signed Issuer without issuerRef")
		assert.Equal(c, "false", r.arg("manage-webhook-certs"), "the operator leaves the certificates to cert-manager")
		for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
			assert.Equal(c, "buildkite/buildkite-operator-webhook", field(r.unstructured(kind, ""), "metadata", "annotations", "cert-manager.io/inject-ca-from"), kind)
		}
		assert.Contains(c, r.operator().VolumeMounts, corev1.VolumeMount{Name: "webhook-tls", MountPath: "/tmp/k8s-webhook-server/serving-certs", ReadOnly: true})
	}},
	{values: []string{"webhooks.certManager.issuerRef"}, base: []string{"--set", "webhooks.certManager.enabled=true"},
		set: []string{"--set", "webhooks.certManager.issuerRef.name=corp-ca", "--set", "webhooks.certManager.issuerRef.kind=ClusterIssuer"},
		check: func(c assert.TestingT, r rendered) {
			cert := r.unstructured("Certificate", "buildkite-operator-webhook")
			assert.Equal(c, "corp-ca", field(cert, "spec", "issuerRef", "name"))
			assert.Equal(c, "ClusterIssuer", field(cert, "spec", "issuerRef", "kind"))
			assert.False(c, r.has("Issuer", ""), "no self-signed Issuer")
		}},
	{values: []string{"webhooks.timeoutSeconds"}, set: []string{"--set", "webhooks.timeoutSeconds=5"}, check: func(c assert.TestingT, r rendered) {
		hooks := r.webhooks()
		assert.Len(c, hooks, 3)
		for _, w := range hooks {
			if assert.NotNil(c, w.TimeoutSeconds, w.Name) {
				assert.Equal(c, int32(5), *w.TimeoutSeconds, w.Name)
			}
		}
	}},
	{values: []string{"webhooks.port"}, set: []string{"--set", "webhooks.port=10250"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "10250", r.arg("webhook-port"))
		assert.Equal(c, int32(10250), r.containerPort("webhook"))
	}},
	{values: []string{"webhooks.allNamespaces"}, set: []string{"--set", "webhooks.allNamespaces=true"}, check: func(c assert.TestingT, r rendered) {
		hooks := r.webhooks()
		assert.Len(c, hooks, 3)
		for _, w := range hooks {
			assert.Nil(c, w.NamespaceSelector, "%s judges every namespace", w.Name)
		}
	}},

	{values: []string{"metrics.enabled"}, set: []string{"--set", "metrics.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "0", r.arg("metrics-bind-address"))
		assert.False(c, r.has("Service", "buildkite-operator-metrics"))
		assert.Zero(c, r.containerPort("metrics"))
	}},
	{values: []string{"metrics.secure"}, set: []string{"--set", "metrics.secure=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "false", r.arg("metrics-secure"))
		assert.False(c, r.has("ClusterRole", "buildkite-operator-buildkite-metrics-reader"), "no reader role for plain HTTP")
	}},
	{values: []string{"metrics.port"}, set: []string{"--set", "metrics.port=9090"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, ":9090", r.arg("metrics-bind-address"))
		assert.Equal(c, int32(9090), r.containerPort("metrics"))
		svc, _ := get[corev1.Service](r, "Service", "buildkite-operator-metrics")
		assert.Equal(c, []corev1.ServicePort{{Name: "metrics", Port: 9090, TargetPort: intstr.FromString("metrics")}}, svc.Spec.Ports)
	}},
	{values: []string{"metrics.serviceMonitor.enabled"}, set: []string{"--set", "metrics.serviceMonitor.enabled=true"}, check: func(c assert.TestingT, r rendered) {
		sm := r.unstructured("ServiceMonitor", "buildkite-operator")
		assert.Equal(c, "metrics", field(sm, "spec", "selector", "matchLabels", "app.kubernetes.io/component"), "it selects the metrics Service")
	}},
	{values: []string{"metrics.serviceMonitor.interval"}, base: []string{"--set", "metrics.serviceMonitor.enabled=true"},
		set: []string{"--set", "metrics.serviceMonitor.interval=1m"}, check: func(c assert.TestingT, r rendered) {
			endpoints, _, _ := unstructured.NestedSlice(r.unstructured("ServiceMonitor", "buildkite-operator"), "spec", "endpoints")
			if assert.Len(c, endpoints, 1) {
				assert.Equal(c, "1m", field(endpoints[0].(map[string]any), "interval"))
			}
		}},
	{values: []string{"metrics.serviceMonitor.labels"}, base: []string{"--set", "metrics.serviceMonitor.enabled=true"},
		set: []string{"--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack"}, check: func(c assert.TestingT, r rendered) {
			assert.Equal(c, "kube-prometheus-stack", field(r.unstructured("ServiceMonitor", "buildkite-operator"), "metadata", "labels", "release"))
		}},
	{values: []string{"metrics.prometheusRule.enabled"}, set: []string{"--set", "metrics.prometheusRule.enabled=true"}, check: func(c assert.TestingT, r rendered) {
		rules := r.prometheusRules()
		if assert.Len(c, rules, 1) && assert.Len(c, rules[0].Spec.Groups, 1) {
			assert.NotEmpty(c, rules[0].Spec.Groups[0].Rules)
		}
	}},
	{values: []string{"metrics.prometheusRule.labels"}, base: []string{"--set", "metrics.prometheusRule.enabled=true"},
		set: []string{"--set", "metrics.prometheusRule.labels.release=kube-prometheus-stack"}, check: func(c assert.TestingT, r rendered) {
			rules := r.prometheusRules()
			if assert.Len(c, rules, 1) {
				assert.Equal(c, "kube-prometheus-stack", rules[0].Metadata.Labels["release"])
			}
		}},
	{values: []string{"metrics.prometheusRule.alertLabels"}, base: []string{"--set", "metrics.prometheusRule.enabled=true"},
		set: []string{"--set", "metrics.prometheusRule.alertLabels.team=ci"}, check: func(c assert.TestingT, r rendered) {
			for _, pr := range r.prometheusRules() {
				for _, rule := range pr.Spec.Groups[0].Rules {
					assert.Equal(c, "ci", rule.Labels["team"], rule.Alert)
				}
			}
		}},
	{values: []string{"metrics.prometheusRule.selector"}, base: []string{"--set", "metrics.prometheusRule.enabled=true"},
		set: []string{"--set", `metrics.prometheusRule.selector=job="ci-operator"`}, check: func(c assert.TestingT, r rendered) {
			for _, pr := range r.prometheusRules() {
				for _, rule := range pr.Spec.Groups[0].Rules {
					assert.Contains(c, rule.Expr, `{job="ci-operator"`, rule.Alert)
					assert.NotContains(c, rule.Expr, `namespace="buildkite"`, rule.Alert)
				}
			}
		}},
	{values: []string{"metrics.grafanaDashboard.enabled"}, set: []string{"--set", "metrics.grafanaDashboard.enabled=true"}, check: func(c assert.TestingT, r rendered) {
		cm, ok := r.dashboard()
		assert.True(c, ok, "the dashboard's ConfigMap")
		assert.Equal(c, "1", cm.Labels["grafana_dashboard"], "the label kube-prometheus-stack's sidecar looks for")
		assert.Contains(c, cm.Data["buildkite-operator-buildkite.json"], `"panels"`)
	}},
	{values: []string{"metrics.grafanaDashboard.labels"}, base: []string{"--set", "metrics.grafanaDashboard.enabled=true"},
		set: []string{"--set", "metrics.grafanaDashboard.labels.grafana_dashboard=null", "--set", "metrics.grafanaDashboard.labels.dashboards=ci"},
		check: func(c assert.TestingT, r rendered) {
			cm, _ := r.dashboard()
			assert.Equal(c, "ci", cm.Labels["dashboards"])
			assert.NotContains(c, cm.Labels, "grafana_dashboard", "the default label given up")
		}},
	{values: []string{"metrics.grafanaDashboard.annotations"}, base: []string{"--set", "metrics.grafanaDashboard.enabled=true"},
		set: []string{"--set", "metrics.grafanaDashboard.annotations.grafana_folder=CI"}, check: func(c assert.TestingT, r rendered) {
			cm, _ := r.dashboard()
			assert.Equal(c, "CI", cm.Annotations["grafana_folder"])
		}},
	{values: []string{"metrics.grafanaDashboard.namespace"}, base: []string{"--set", "metrics.grafanaDashboard.enabled=true"},
		set: []string{"--set", "metrics.grafanaDashboard.namespace=monitoring"}, check: func(c assert.TestingT, r rendered) {
			cm, _ := r.dashboard()
			assert.Equal(c, "monitoring", cm.Namespace)
		}},
	{values: []string{"probes.port"}, set: []string{"--set", "probes.port=9091"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, ":9091", r.arg("health-probe-bind-address"))
		assert.Equal(c, int32(9091), r.containerPort("probes"), "the probes' named port")
	}},

	{values: []string{"networkPolicy.enabled"}, set: []string{"--set", "networkPolicy.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Empty(c, all[networkingv1.NetworkPolicy](r, "NetworkPolicy"))
	}},
	{values: []string{"networkPolicy.webhookFromCIDRs"}, set: []string{"--set-json", `networkPolicy.webhookFromCIDRs=["172.16.0.0/28"]`}, check: func(c assert.TestingT, r rendered) {
		ingress := r.operatorPolicy().Spec.Ingress
		if assert.NotEmpty(c, ingress) {
			assert.Equal(c, []networkingv1.NetworkPolicyPeer{cidr("172.16.0.0/28")}, ingress[0].From)
		}
	}},
	{values: []string{"networkPolicy.webhookExceptCIDRs"}, set: []string{"--set-json", `networkPolicy.webhookExceptCIDRs=["10.244.0.0/16"]`}, check: func(c assert.TestingT, r rendered) {
		ingress := r.operatorPolicy().Spec.Ingress
		if assert.NotEmpty(c, ingress) {
			assert.Contains(c, ingress[0].From, cidr("0.0.0.0/0", "10.244.0.0/16"))
		}
	}},
	{values: []string{"networkPolicy.webhookFrom"}, set: []string{"--set-json", `networkPolicy.webhookFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"konnectivity"}}}]`},
		check: func(c assert.TestingT, r rendered) {
			ingress := r.operatorPolicy().Spec.Ingress
			if assert.NotEmpty(c, ingress) {
				assert.Contains(c, ingress[0].From, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "konnectivity"}}})
			}
		}},
	{values: []string{"networkPolicy.metricsFromOtherNamespaces"}, set: []string{"--set", "networkPolicy.metricsFromOtherNamespaces=false"}, check: func(c assert.TestingT, r rendered) {
		for _, rule := range r.operatorPolicy().Spec.Ingress {
			for _, p := range rule.Ports {
				assert.NotEqual(c, int32(8443), p.Port.IntVal, "nobody may reach the metrics port")
			}
		}
		assert.NotEmpty(c, r.operatorPolicy().Spec.PodSelector.MatchLabels, "the policy is there")
	}},
	{values: []string{"networkPolicy.metricsFrom"}, set: []string{"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
		check: func(c assert.TestingT, r rendered) {
			ingress := r.operatorPolicy().Spec.Ingress
			if assert.Len(c, ingress, 3) {
				assert.Contains(c, ingress[2].From, prometheus)
			}
		}},
	{values: []string{"networkPolicy.denyJobPodIngress"}, set: []string{"--set", "networkPolicy.denyJobPodIngress=false"}, check: func(c assert.TestingT, r rendered) {
		assert.False(c, r.has("NetworkPolicy", "buildkite-operator-jobs-deny-ingress"))
		assert.True(c, r.has("NetworkPolicy", "buildkite-operator"), "the operator's own stays")
	}},
	{values: []string{"warmPools.enabled"}, set: []string{"--set", "warmPools.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "false", r.arg("warm-pools"))
		for _, rule := range r.operatorPolicy().Spec.Ingress {
			for _, peer := range rule.From {
				assert.Nil(c, peer.PodSelector, "no warm pods admitted")
			}
		}
	}},
	flagRow("warmPools.handoffURL", "https://handoff.example.com/handoff", "handoff-url", "https://handoff.example.com/handoff"),
	flagRow("warmPools.handoffAudience", "ci.example.com/handoff", "handoff-audience", "ci.example.com/handoff"),
	flagRow("warmPools.handoffCAConfigMap", "handoff-ca", "handoff-ca-configmap", "handoff-ca"),
	flagRow("warmPools.checkAddress", "false", "handoff-check-address", "false"),
	flagRow("pprof.enabled", "true", "pprof-bind-address", "127.0.0.1:6060"),
	{values: []string{"pprof.port"}, base: []string{"--set", "pprof.enabled=true"}, set: []string{"--set", "pprof.port=7070"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "127.0.0.1:7070", r.arg("pprof-bind-address"))
	}},
	{values: []string{"serviceAccount.name"}, set: []string{"--set", "serviceAccount.name=ci-operator"}, check: func(c assert.TestingT, r rendered) {
		assert.True(c, r.has("ServiceAccount", "ci-operator"))
		assert.Equal(c, "ci-operator", r.pod().ServiceAccountName)
		for _, b := range all[rbacv1.RoleBinding](r, "RoleBinding") {
			if b.Name == "buildkite-operator" {
				assert.Equal(c, "ci-operator", b.Subjects[0].Name, "RoleBinding in %s", b.Namespace)
			}
		}
		crb, _ := get[rbacv1.ClusterRoleBinding](r, "ClusterRoleBinding", "buildkite-operator-buildkite")
		if assert.Len(c, crb.Subjects, 1) {
			assert.Equal(c, "ci-operator", crb.Subjects[0].Name)
		}
	}},
	{values: []string{"serviceAccount.annotations"}, set: []string{"--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/ci"}, check: func(c assert.TestingT, r rendered) {
		sa, _ := get[corev1.ServiceAccount](r, "ServiceAccount", "buildkite-operator")
		assert.Equal(c, "arn:aws:iam::1:role/ci", sa.Annotations["eks.amazonaws.com/role-arn"])
	}},
	{values: []string{"podDisruptionBudget.enabled"}, set: []string{"--set", "podDisruptionBudget.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.False(c, r.has("PodDisruptionBudget", ""), "no PodDisruptionBudget")
	}},
	{values: []string{"podDisruptionBudget.minAvailable"}, set: []string{"--set", "replicaCount=3", "--set", "podDisruptionBudget.minAvailable=2"}, check: func(c assert.TestingT, r rendered) {
		pdb, _ := get[policyv1.PodDisruptionBudget](r, "PodDisruptionBudget", "buildkite-operator")
		assert.Equal(c, ptrTo(intstr.FromInt32(2)), pdb.Spec.MinAvailable)
	}},
	{values: []string{"resources.requests.cpu"}, set: []string{"--set", "resources.requests.cpu=250m"}, check: func(c assert.TestingT, r rendered) {
		q := r.operator().Resources.Requests[corev1.ResourceCPU]
		assert.Equal(c, "250m", q.String())
	}},
	{values: []string{"resources.requests.memory"}, set: []string{"--set", "resources.requests.memory=256Mi"}, check: func(c assert.TestingT, r rendered) {
		q := r.operator().Resources.Requests[corev1.ResourceMemory]
		assert.Equal(c, "256Mi", q.String())
	}},
	{values: []string{"resources.limits.memory"}, set: []string{"--set", "resources.limits.memory=1Gi"}, check: func(c assert.TestingT, r rendered) {
		q := r.operator().Resources.Limits[corev1.ResourceMemory]
		assert.Equal(c, "1Gi", q.String(), "the container's limit, which --memory-limit reads")
	}},
	{values: []string{"podAnnotations"}, set: []string{"--set", "podAnnotations.example\\.com/team=ci"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "ci", r.deployment().Spec.Template.Annotations["example.com/team"])
	}},
	{values: []string{"podLabels"}, set: []string{"--set", "podLabels.team=ci"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "ci", r.deployment().Spec.Template.Labels["team"])
	}},
	{values: []string{"nodeSelector"}, set: []string{"--set", "nodeSelector.pool=system"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, map[string]string{"pool": "system"}, r.pod().NodeSelector)
		assert.Equal(c, map[string]string{"pool": "system"}, r.drain().Spec.Template.Spec.NodeSelector, "the drain hook's pod")
	}},
	{values: []string{"tolerations"}, set: []string{"--set-json", `tolerations=[{"key":"system","operator":"Exists","effect":"NoSchedule"}]`}, check: func(c assert.TestingT, r rendered) {
		want := []corev1.Toleration{{Key: "system", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		assert.Equal(c, want, r.pod().Tolerations)
		assert.Equal(c, want, r.drain().Spec.Template.Spec.Tolerations, "the drain hook's pod")
	}},
	{values: []string{"affinity"}, set: []string{"--set-json", `affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["system"]}]}]}}}`},
		check: func(c assert.TestingT, r rendered) {
			a := r.pod().Affinity
			if assert.NotNil(c, a) && assert.NotNil(c, a.NodeAffinity) {
				assert.NotNil(c, a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
			}
		}},
	{values: []string{"topologySpread.enabled"}, set: []string{"--set", "topologySpread.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Empty(c, r.pod().TopologySpreadConstraints)
		assert.NotEmpty(c, r.pod().Containers, "the Deployment is there")
	}},
	{values: []string{"priorityClassName"}, set: []string{"--set", "priorityClassName=system-cluster-critical"}, check: func(c assert.TestingT, r rendered) {
		assert.Equal(c, "system-cluster-critical", r.pod().PriorityClassName)
	}},
	{values: []string{"drainOnUninstall.enabled"}, set: []string{"--set", "drainOnUninstall.enabled=false"}, check: func(c assert.TestingT, r rendered) {
		assert.Empty(c, all[batchv1.Job](r, "Job"), "no drain hook")
	}},
	{values: []string{"drainOnUninstall.timeoutSeconds"}, set: []string{"--set", "drainOnUninstall.timeoutSeconds=300"}, check: func(c assert.TestingT, r rendered) {
		assert.Contains(c, r.drainContainer().Args, "--timeout=300s")
		if assert.NotNil(c, r.drain().Spec.ActiveDeadlineSeconds) {
			assert.Equal(c, int64(360), *r.drain().Spec.ActiveDeadlineSeconds, "the timeout and a minute")
		}
	}},
	{values: []string{"buildEnvironments"}, set: []string{"--set", "buildEnvironments.go.image=golang:1.26"}, check: func(c assert.TestingT, r rendered) {
		env := r.unstructured("BuildEnvironment", "go")
		assert.Equal(c, "buildkite-jobs", field(env, "metadata", "namespace"))
		assert.Equal(c, "golang:1.26", field(env, "spec", "image"))
	}},
}

func ptrTo[T any](v T) *T { return &v }

// failures records whether a check failed, for running it where it must.
type failures struct{ failed []string }

func (f *failures) Errorf(format string, args ...any) {
	f.failed = append(f.failed, fmt.Sprintf(format, args...))
}

// TestEveryValueHasAnEffect renders the chart with each value of values.yaml set to
// something other than its default, and checks its effect in the rendered objects. A
// check must fail on the rendering without the row's setting: one that passes there too
// would check nothing.
func TestEveryValueHasAnEffect(t *testing.T) {
	var mu sync.Mutex
	bases := map[string]rendered{}
	baseOf := func(t *testing.T, args []string) rendered {
		key := strings.Join(args, "\x00")
		mu.Lock()
		defer mu.Unlock()
		if r, ok := bases[key]; ok {
			return r
		}
		r := renderObjects(t, args...)
		bases[key] = r
		return r
	}
	for _, tc := range valueCases {
		t.Run(strings.Join(tc.values, ","), func(t *testing.T) {
			t.Parallel()
			tc.check(t, renderObjects(t, append(slices.Clone(tc.base), tc.set...)...))
			without := &failures{}
			tc.check(without, baseOf(t, tc.base))
			assert.NotEmpty(t, without.failed, "the check passes without %v too: it checks nothing", tc.set)
		})
	}
}

// valuesLeaves are the values of values.yaml: every leaf of its tree, a free-form map
// (whose keys are the user's) counting as one.
func valuesLeaves(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(helmchart.ChartDir(), "values.yaml"))
	require.NoError(t, err)
	var values map[string]any
	require.NoError(t, sigsyaml.Unmarshal(data, &values))
	open := map[string]bool{}
	for _, p := range freeForm {
		open[strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", ".")] = true
	}
	var leaves []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 || (open[path] && path != "resources") {
			leaves = append(leaves, path)
			return
		}
		for k, child := range m {
			p := k
			if path != "" {
				p = path + "." + k
			}
			walk(p, child)
		}
	}
	walk("", values)
	sort.Strings(leaves)
	return leaves
}

// Every value of values.yaml has a row in valueCases, and every row names a value that
// values.yaml has: a new value needs a row that shows what it does.
func TestEveryValueHasARow(t *testing.T) {
	leaves := valuesLeaves(t)
	require.Contains(t, leaves, "operator.unschedulableTimeout")
	require.Contains(t, leaves, "resources.limits.memory", "resources' own values count one by one")
	require.Contains(t, leaves, "metrics.grafanaDashboard.labels", "a free-form map counts as one value")
	rows := map[string]bool{}
	for _, tc := range valueCases {
		for _, v := range tc.values {
			assert.False(t, rows[v], "two rows for %s", v)
			rows[v] = true
		}
	}
	var missing []string
	for _, l := range leaves {
		if !rows[l] {
			missing = append(missing, l)
		}
		delete(rows, l)
	}
	assert.Empty(t, missing, "values of values.yaml that no row of valueCases sets")
	assert.Empty(t, rows, "rows of valueCases for values that values.yaml does not have")
}

// The operator's PodDisruptionBudget keeps one of its two replicas through node drains; a
// single replica gets none, which would block every drain of its node.
func TestPodDisruptionBudget(t *testing.T) {
	r := renderObjects(t)
	pdb, ok := get[policyv1.PodDisruptionBudget](r, "PodDisruptionBudget", "buildkite-operator")
	require.True(t, ok, "a PodDisruptionBudget by default")
	assert.Equal(t, "buildkite", pdb.Namespace)
	assert.Equal(t, ptrTo(intstr.FromInt32(1)), pdb.Spec.MinAvailable)
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	require.NoError(t, err)
	assert.True(t, sel.Matches(labels.Set(r.deployment().Spec.Template.Labels)), "it selects the operator's pods")

	one := renderObjects(t, "--set", "replicaCount=1")
	assert.False(t, one.has("PodDisruptionBudget", ""), "none for a single replica")
}
