package main

import (
	"cmp"
	"flag"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/warmdemand"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
)

// warmConfig is how the operator keeps warm pools (BuildEnvironment spec.warmPool): the
// hand-off endpoint, served on the webhook server, from which warm pods fetch their jobs.
type warmConfig struct {
	enabled bool
	// url, audience and caConfigMap are what warm pods are told; each has a default
	// derived from the webhook Service and the namespaces (complete).
	url, audience, caConfigMap string
	// checkAddress binds a token to its pod's address (handoff.Config.Addresses).
	checkAddress bool
}

func (w *warmConfig) bindFlags(fs *flag.FlagSet) {
	flagenv.Bool(fs, &w.enabled, "warm-pools", "BK_OPERATOR_WARM_POOLS", true,
		"keep the warm pools BuildEnvironments ask for (spec.warmPool), serving the hand-off endpoint warm pods fetch their jobs from on the webhook server; needs --webhooks")
	flagenv.String(fs, &w.url, "handoff-url", "BK_OPERATOR_HANDOFF_URL", "",
		"the https URL warm pods fetch their jobs from; https://<webhook service>.<namespace>.svc"+handoff.Path+" when empty")
	flagenv.String(fs, &w.audience, "handoff-audience", "BK_OPERATOR_HANDOFF_AUDIENCE", "",
		"the audience of the ServiceAccount tokens warm pods prove who they are with, unique to the install; buildkite-operator.<namespace>.handoff when empty")
	flagenv.String(fs, &w.caConfigMap, "handoff-ca-configmap", "BK_OPERATOR_HANDOFF_CA_CONFIGMAP", "",
		"the ConfigMap of the job namespace, key ca.crt, with the CA warm pods trust the endpoint's certificate by (written by the operator with --manage-webhook-certs); <webhook service>-ca when empty")
	flagenv.Bool(fs, &w.checkAddress, "handoff-check-address", "BK_OPERATOR_HANDOFF_CHECK_ADDRESS", true,
		"refuse a hand-off unless it comes from an address of the pod its token is bound to, so that a token copied out of a pod is of no use elsewhere; turn off only where a proxy or NAT between the pods and the operator hides their addresses")
}

// complete fills in the defaults that depend on other flags.
func (w *warmConfig) complete(wo webhook.Options) {
	if w.url == "" {
		w.url = fmt.Sprintf("https://%s.%s.svc%s", wo.ServiceName, wo.Namespace, handoff.Path)
	}
	if w.audience == "" {
		w.audience = "buildkite-operator." + wo.Namespace + ".handoff"
	}
	if w.caConfigMap == "" {
		w.caConfigMap = wo.ServiceName + "-ca"
	}
}

// setupWarmPools gives the controller the registry and the hand-off settings, has the
// webhook certificate manager write the CA bundle for warm pods, and returns the warm
// pools the BuildEnvironment reconciler keeps (nil when turned off or without webhooks).
func setupWarmPools(cfg *operatorConfig, co *buildjob.Options, wo *webhook.Options, jobNS string) *buildenvironment.WarmPools {
	w := cfg.warm
	if !w.enabled || !cfg.webhooks {
		return nil
	}
	w.complete(*wo)
	reg := handoff.NewRegistry()
	co.Handoff, co.HandoffURL, co.HandoffAudience, co.HandoffCAConfigMap = reg, w.url, w.audience, w.caConfigMap
	if wo.ManageCerts {
		wo.CAConfigMaps = append(wo.CAConfigMaps, types.NamespacedName{Namespace: jobNS, Name: w.caConfigMap})
	}
	// The pools keep no more idle pods than the slots free to take their jobs; the slots
	// are the flag's, also with --spawner=false, where a spawner elsewhere runs with them.
	return &buildenvironment.WarmPools{Pod: co.PodOptions(), Registry: reg, Slots: cfg.spawner.Slots}
}

// warmDemand sizes the warm pools that follow demand (spec.warmPool.maxSize) from the jobs
// waiting on agentd's queue, read with the start-up check's Buildkite API token and
// settings (docs/preflight.md); without a token, or without the spawner (no queue), every
// pool is its size. The poller runs on the leader, as the pools' keeper does.
func warmDemand(mgr ctrl.Manager, cfg *operatorConfig) (warmdemand.Sizer, error) {
	if cfg.preflight.TokenFile == "" || !cfg.spawnerEnabled {
		return warmdemand.NoToken{}, nil
	}
	if err := cfg.preflight.Validate(); err != nil {
		return nil, err
	}
	wc := warmdemand.Config{
		TokenFile:    cfg.preflight.TokenFile,
		Endpoint:     cfg.preflight.Endpoint,
		Organization: cfg.preflight.Organization,
		Cluster:      cfg.preflight.Cluster,
		Queue:        cmp.Or(cfg.spawner.Queue, spawner.DefaultQueue),
		Tags:         cfg.spawner.Tags,
		Slots:        cfg.spawner.Slots,
		UserAgent:    userAgent(),
		Log:          ctrl.Log.WithName("warmdemand"),
	}
	if err := wc.Validate(); err != nil {
		return nil, err
	}
	p, err := warmdemand.New(wc)
	if err != nil {
		return nil, fmt.Errorf("setting up warm pools that follow demand: %w", err)
	}
	if err := mgr.Add(p); err != nil {
		return nil, fmt.Errorf("adding the reader of the queue's waiting jobs: %w", err)
	}
	return p, nil
}

// serveHandoff serves the hand-off endpoint on mgr's webhook server and marks the registry
// ready once the pools are kept.
func serveHandoff(mgr ctrl.Manager, warm *buildenvironment.WarmPools, audience string, checkAddress bool) error {
	hc := handoff.Config{
		Audience:    audience,
		Client:      mgr.GetClient(),
		Assignments: warm.Registry,
		Log:         ctrl.Log.WithName("handoff"),
	}
	if checkAddress {
		hc.Addresses = handoff.PodAddressesFrom(mgr.GetClient())
	}
	h, err := handoff.NewHandler(hc)
	if err != nil {
		return fmt.Errorf("setting up the hand-off endpoint: %w", err)
	}
	mgr.GetWebhookServer().Register(handoff.Path, h)
	if err := mgr.Add(warm.Ready(mgr.GetCache())); err != nil {
		return fmt.Errorf("adding the warm pools' readiness: %w", err)
	}
	return nil
}
