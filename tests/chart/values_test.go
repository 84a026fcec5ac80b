package chart

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// webhookServicePort is the port of the webhook Service's that the webhook
// configurations call, and the port of the operator's container it sends to.
func webhookServicePort(t *testing.T, svc corev1.Service, pod corev1.PodSpec) (port int32, containerPort int32) {
	t.Helper()
	require.Len(t, svc.Spec.Ports, 1, "the webhook Service has one port")
	p := svc.Spec.Ports[0]
	c := pod.Containers[0]
	if p.TargetPort.Type == intstr.Int {
		return p.Port, p.TargetPort.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.TargetPort.StrVal {
			return p.Port, cp.ContainerPort
		}
	}
	t.Fatalf("the webhook Service's targetPort %q names no port of container %s", p.TargetPort.StrVal, c.Name)
	return 0, 0
}

// webhooks.port is where the server listens (--webhook-port), the container's port, where
// the Service sends the API server's calls and what the NetworkPolicy admits: all the same
// port, so changing it moves all of them, and nothing is left on the default.
func TestWebhookPort(t *testing.T) {
	for _, port := range []int32{9443, 10250, 10443} {
		t.Run(strconv.Itoa(int(port)), func(t *testing.T) {
			var args []string
			if port != 9443 {
				args = []string{"--set", "webhooks.port=" + strconv.Itoa(int(port))}
			}
			out := render(t, args...)
			d := byKind[appsv1.Deployment](t, out, "Deployment")
			require.Len(t, d, 1)
			pod := d[0].Spec.Template.Spec
			assert.Contains(t, pod.Containers[0].Args, "--webhook-port="+strconv.Itoa(int(port)), "the server listens there")

			var svc *corev1.Service
			for _, s := range byKind[corev1.Service](t, out, "Service") {
				if strings.HasSuffix(s.Name, "-webhook") {
					svc = &s
				}
			}
			require.NotNil(t, svc, "no webhook Service")
			servicePort, containerPort := webhookServicePort(t, *svc, pod)
			assert.Equal(t, port, containerPort, "the Service sends the API server's calls there")

			var configs int
			for _, c := range byKind[admissionregistrationv1.ValidatingWebhookConfiguration](t, out, "ValidatingWebhookConfiguration") {
				for _, w := range c.Webhooks {
					assert.Equal(t, svc.Name, w.ClientConfig.Service.Name, w.Name)
					assert.Equal(t, servicePort, *w.ClientConfig.Service.Port, "%s calls the Service's port", w.Name)
					configs++
				}
			}
			for _, c := range byKind[admissionregistrationv1.MutatingWebhookConfiguration](t, out, "MutatingWebhookConfiguration") {
				for _, w := range c.Webhooks {
					assert.Equal(t, svc.Name, w.ClientConfig.Service.Name, w.Name)
					assert.Equal(t, servicePort, *w.ClientConfig.Service.Port, "%s calls the Service's port", w.Name)
					configs++
				}
			}
			assert.Equal(t, 3, configs)

			var admitted []int32
			for _, np := range byKind[networkingv1.NetworkPolicy](t, out, "NetworkPolicy") {
				if np.Namespace != "buildkite" {
					continue
				}
				for _, r := range np.Spec.Ingress {
					for _, p := range r.Ports {
						admitted = append(admitted, p.Port.IntVal)
					}
				}
			}
			assert.Contains(t, admitted, port, "the NetworkPolicy admits the API server there")
			if port != 9443 {
				assert.NotContains(t, admitted, int32(9443))
				assert.NotContains(t, string(out), "9443", "something still names the default port")
			}
		})
	}
}

// imagePullSecrets reach the operator's pods, the drain hook's, and every job pod through
// --job-image-pull-secrets, which the controller reads into the Secrets the pod builder
// gives job pods (their init containers pull the operator and agent images).
func TestImagePullSecrets(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []corev1.LocalObjectReference
	}{
		{name: "none by default"},
		{name: "two", args: []string{"--set", "imagePullSecrets[0].name=registry", "--set", "imagePullSecrets[1].name=mirror"},
			want: []corev1.LocalObjectReference{{Name: "registry"}, {Name: "mirror"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, tc.args...)
			d := byKind[appsv1.Deployment](t, out, "Deployment")
			require.Len(t, d, 1)
			assert.Equal(t, tc.want, d[0].Spec.Template.Spec.ImagePullSecrets, "the operator's pods")
			jobs := byKind[batchv1.Job](t, out, "Job")
			require.Len(t, jobs, 1, "the drain hook")
			assert.Equal(t, tc.want, jobs[0].Spec.Template.Spec.ImagePullSecrets, "the drain hook's pod")

			// What the controller makes of the Deployment's flag.
			var flagArgs []string
			for _, a := range d[0].Spec.Template.Spec.Containers[0].Args {
				if strings.HasPrefix(a, "--job-image-pull-secrets=") {
					flagArgs = append(flagArgs, a)
				}
			}
			require.Len(t, flagArgs, 1, "the operator is told the job pods' pull secrets once")
			var o buildjob.Options
			fs := flag.NewFlagSet("operator", flag.ContinueOnError)
			o.BindFlags(fs)
			require.NoError(t, flagenv.ParseEnv(fs, flagArgs, func(string) string { return "" }))
			assert.Equal(t, tc.want, o.ImagePullSecrets, "job pods' pull secrets")
		})
	}
	out, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set", "imagePullSecrets[0]=registry").CombinedOutput()
	require.Error(t, err, "a bare name was rendered")
	assert.Contains(t, string(out), "/imagePullSecrets/0")
}

// The schema refuses a value the chart does not know, naming it, at every level of the
// values the chart owns: a misspelt value is an error, never silently the default.
func TestUnknownValuesRefused(t *testing.T) {
	cases := []struct {
		// path is where helm says the unknown key is; empty at the top.
		set, path, key string
	}{
		{"prot=1", "", "prot"},
		{"webhooks.prot=1", "/webhooks", "prot"},
		{"webhooks.certManager.enable=true", "/webhooks/certManager", "enable"},
		{"webhooks.certManager.issuerRef.nmae=ca", "/webhooks/certManager/issuerRef", "nmae"},
		{"buildkite.jobPolicy.nope=1", "/buildkite/jobPolicy", "nope"},
		{"buildkite.jobPolicy.verification.jwksSecret.nam=x", "/buildkite/jobPolicy/verification/jwksSecret", "nam"},
		{"buildkite.registrationTokenSecret.namespace=x", "/buildkite/registrationTokenSecret", "namespace"},
		{"operator.leaderElection.lease=1m", "/operator/leaderElection", "lease"},
		{"operator.logging.format=json", "/operator/logging", "format"},
		{"metrics.serviceMonitor.intervall=1m", "/metrics/serviceMonitor", "intervall"},
		{"networkPolicy.webhookFromCIDR=0.0.0.0/0", "/networkPolicy", "webhookFromCIDR"},
		{"imagePullSecrets[0].nmae=registry", "/imagePullSecrets/0", "nmae"},
		{"agentImage.sha=sha256:0", "/agentImage", "sha"},
		{"metrics.prometheusRule.enable=true", "/metrics/prometheusRule", "enable"},
		{"metrics.grafanaDashboard.folder=CI", "/metrics/grafanaDashboard", "folder"},
		{"drainOnUninstall.timeout=1", "/drainOnUninstall", "timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.set, func(t *testing.T) {
			out, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set", tc.set).CombinedOutput()
			require.Error(t, err, "helm rendered the chart with --set %s", tc.set)
			assert.Contains(t, string(out), "at '"+tc.path+"': additional properties '"+tc.key+"' not allowed")
		})
	}
	// Free-form maps stay open: they are the user's keys, not the chart's.
	for _, set := range []string{"buildkite.tags.cluster=gke-prod", "podAnnotations.a=b", "nodeSelector.disk=ssd",
		"resources.limits.cpu=1", "affinity.nodeAffinity.x=y", "serviceAccount.annotations.a=b", "metrics.serviceMonitor.labels.release=prom"} {
		_, err := helmchart.Render("buildkite", "--set", set)
		assert.NoError(t, err, "--set %s", set)
	}
}

// freeForm are the objects of the values whose keys are the user's (labels, annotations,
// node selectors, Kubernetes types the chart passes through): the schema leaves them open.
// Every other object of the schema lists its properties and refuses any other.
var freeForm = []string{
	"/affinity",
	"/buildEnvironments",
	"/buildEnvironments/*",
	"/buildkite/tags",
	"/metrics/grafanaDashboard/annotations",
	"/metrics/grafanaDashboard/labels",
	"/metrics/prometheusRule/alertLabels",
	"/metrics/prometheusRule/labels",
	"/metrics/serviceMonitor/labels",
	"/networkPolicy/metricsFrom/[]",
	"/networkPolicy/webhookFrom/[]",
	"/nodeSelector",
	"/operator/extraEnv/[]",
	"/podAnnotations",
	"/podLabels",
	"/resources",
	"/serviceAccount/annotations",
	"/tolerations/[]",
}

// The schema closes every object the chart owns (additionalProperties: false), and only
// the free-form ones above are open: a new object in the values must be one or the other.
func TestValuesSchemaClosesEveryObject(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(helmchart.ChartDir(), "values.schema.json"))
	require.NoError(t, err)
	var schema map[string]any
	require.NoError(t, json.Unmarshal(data, &schema))
	var open []string
	var walk func(path string, s map[string]any)
	walk = func(path string, s map[string]any) {
		if isObject(s) {
			if props, ok := s["properties"].(map[string]any); ok {
				assert.Equal(t, false, s["additionalProperties"], "%s lists its properties but takes others too", nonEmpty(path))
				for k, v := range props {
					walk(path+"/"+k, v.(map[string]any))
				}
			} else {
				open = append(open, nonEmpty(path))
				if ap, ok := s["additionalProperties"].(map[string]any); ok {
					walk(path+"/*", ap)
				}
			}
		}
		if items, ok := s["items"].(map[string]any); ok {
			walk(path+"/[]", items)
		}
	}
	walk("", schema)
	sort.Strings(open)
	assert.Equal(t, freeForm, open, "the objects the schema leaves open")
}

func isObject(s map[string]any) bool {
	switch t := s["type"].(type) {
	case string:
		return t == "object"
	case []any:
		return slices.Contains(t, any("object"))
	}
	return false
}

func nonEmpty(path string) string {
	if path == "" {
		return "/"
	}
	return path
}
