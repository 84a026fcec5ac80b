// Package webhook serves the operator's admission webhooks: it validates BuildJobs and
// BuildEnvironments with pkg/validation (the checks the spawner runs too) and fills in
// BuildJob defaults. Setup registers the handlers on a controller-runtime manager and,
// unless cert-manager is in charge, the runnables that keep the webhook's TLS current.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook/certs"
)

// Paths the handlers are served on; the Helm chart's webhook configurations refer to them.
const (
	PathValidateBuildJob         = "/validate-buildjob"
	PathMutateBuildJob           = "/mutate-buildjob"
	PathValidateBuildEnvironment = "/validate-buildenvironment"
)

// What the webhooks read, and what the certificate manager writes.
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildenvironments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=limitranges,verbs=list;watch
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=get;update

// Options configure Setup.
type Options struct {
	// Namespace and ServiceName are the webhook Service: the serving certificate is made
	// for its DNS names.
	Namespace   string
	ServiceName string
	// SecretName is the Secret that holds the CA and serving certificate.
	SecretName string
	// WebhookConfigurationName names the ValidatingWebhookConfiguration and the
	// MutatingWebhookConfiguration whose caBundle the operator keeps current (with
	// ManageCerts). Cluster-scoped, so each operator of a cluster has its own: the chart
	// names them <fullname>-<release namespace>, and its ClusterRole lets the operator
	// update those two alone.
	WebhookConfigurationName string
	// DefaultBuildEnvironment is given to BuildJobs that name none.
	DefaultBuildEnvironment string
	// AgentEndpoint is the Buildkite agent API the operator uses; BuildJobs may name no
	// other (validation.EndpointAllowed). agentapi.DefaultEndpoint when empty.
	AgentEndpoint string
	// AllowedAgentEndpoints are further endpoints BuildJobs may name, each matched
	// exactly (--allowed-agent-endpoints).
	AllowedAgentEndpoints []string
	// ManageCerts makes the operator mint and rotate the webhook's certificates. When
	// false (cert-manager, or any other tool, is in charge) the operator does not touch
	// them: the webhook server reads tls.crt and tls.key from its CertDir and reloads
	// them when they change.
	ManageCerts bool
	// CertValidity and RotateBefore: how long a serving certificate lasts, and how long
	// before its expiry it is replaced (defaults: one year, 30 days).
	CertValidity time.Duration
	RotateBefore time.Duration
	// CAValidity is how long the CA lasts (default ten years).
	CAValidity time.Duration
	// SyncInterval is how often the certificates and caBundle are re-checked even when
	// nothing is due (default one minute).
	SyncInterval time.Duration
	// ExtraHosts are further names or IP addresses for the serving certificate, for an
	// API server that reaches the webhook other than through the Service.
	ExtraHosts []string
	// CAConfigMaps get the CA bundle (with ManageCerts), for pods that reach the operator's
	// server: the warm pods' hand-off endpoint is served beside the webhooks.
	CAConfigMaps []types.NamespacedName
	// GranterClusterRole is the ClusterRole with the verb grant on buildenvironments that
	// refusals tell users to be bound to; default: the Helm chart's, named from
	// ServiceName and Namespace as the chart names both.
	GranterClusterRole string
}

// Setup registers the admission handlers on mgr's webhook server and, with ManageCerts,
// the certificate manager's runnables and a readiness check that passes once a serving
// certificate is loaded. Call it before mgr.Start.
func Setup(mgr ctrl.Manager, opts Options) error {
	server := mgr.GetWebhookServer()
	// An uncached reader: a BuildEnvironment created a moment ago must not be reported
	// missing because an informer has not caught up yet.
	reader := mgr.GetAPIReader()
	scheme := mgr.GetScheme()

	endpoint := opts.AgentEndpoint
	if endpoint == "" {
		endpoint = agentapi.DefaultEndpoint
	}
	// One Admission for both BuildJob webhooks, the one the spawner runs before it creates.
	// Environments and LimitRanges from the cache first, as the spawner reads them
	// (validation.CacheFirst): the webhook runs for every BuildJob the spawner makes.
	jobs := validation.Admission{Reader: validation.CacheFirst{Cache: mgr.GetCache(), API: reader}, DefaultEnvironment: opts.DefaultBuildEnvironment}
	server.Register(PathValidateBuildJob, admission.WithValidator[*bkv1.BuildJob](scheme,
		&buildJobValidator{jobs: jobs, writer: mgr.GetClient(), agentEndpoint: endpoint, allowedEndpoints: opts.AllowedAgentEndpoints, operator: &operatorIdentity{c: mgr.GetClient()}}))
	server.Register(PathMutateBuildJob, admission.WithDefaulter[*bkv1.BuildJob](scheme,
		&buildJobDefaulter{jobs: jobs}))
	server.Register(PathValidateBuildEnvironment, admission.WithValidator[*bkv1.BuildEnvironment](scheme,
		&buildEnvironmentValidator{writer: mgr.GetClient(), granterRole: granterClusterRole(opts)}))

	if !opts.ManageCerts {
		return nil
	}
	srv, ok := server.(*crwebhook.DefaultServer)
	if !ok {
		return fmt.Errorf("managing webhook certificates needs controller-runtime's default webhook server, not %T; use cert-manager instead", server)
	}
	if opts.Namespace == "" || opts.ServiceName == "" {
		return errors.New("managing webhook certificates needs the webhook Service's namespace and name")
	}
	if opts.WebhookConfigurationName == "" {
		return errors.New("managing webhook certificates needs the name of the webhook configurations to write the CA into: set --webhook-configuration-name (the chart sets it to <fullname>-<release namespace>)")
	}
	hosts := []string{
		opts.ServiceName + "." + opts.Namespace + ".svc",
		opts.ServiceName + "." + opts.Namespace + ".svc.cluster.local",
		opts.ServiceName + "." + opts.Namespace,
		opts.ServiceName,
	}
	cm, err := certs.New(mgr.GetClient(), reader, certs.Config{
		Namespace:          opts.Namespace,
		SecretName:         opts.SecretName,
		Hosts:              append(hosts, opts.ExtraHosts...),
		WebhookConfigNames: []string{opts.WebhookConfigurationName},
		CAConfigMaps:       opts.CAConfigMaps,
		CertValidity:       opts.CertValidity,
		CAValidity:         opts.CAValidity,
		RotateBefore:       opts.RotateBefore,
		SyncInterval:       opts.SyncInterval,
	}, mgr.GetLogger().WithName("webhook-certs"))
	if err != nil {
		return err
	}
	// The server reads TLSOpts when it starts, so adding the hook now takes effect; the
	// certificate is then served from memory and a rotation needs no restart.
	srv.Options.TLSOpts = append(srv.Options.TLSOpts, cm.TLSOption)
	for _, r := range cm.Runnables() {
		if err := mgr.Add(r); err != nil {
			return fmt.Errorf("adding webhook certificate manager: %w", err)
		}
	}
	if err := mgr.AddReadyzCheck("webhook-certificate", func(_ *http.Request) error { return cm.Ready() }); err != nil {
		return fmt.Errorf("adding webhook certificate readiness check: %w", err)
	}
	return nil
}

// buildJobValidator runs on CREATE only: a BuildJob's spec is immutable, and checking
// later updates (finalizers, labels) against an environment that has since changed
// would only block the controller from cleaning up.
type buildJobValidator struct {
	// jobs checks the BuildJob (Check: the mutating webhook has defaulted it).
	jobs validation.Admission
	// writer creates the SubjectAccessReviews of trustErrors and handMadeErrors.
	writer           client.Writer
	agentEndpoint    string
	allowedEndpoints []string
	// operator tells the operator's own requests from everyone else's.
	operator *operatorIdentity
}

func (v *buildJobValidator) ValidateCreate(ctx context.Context, job *bkv1.BuildJob) (admission.Warnings, error) {
	fillNamespace(ctx, job)
	verdict, err := v.jobs.Check(ctx, job)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("validating BuildJob %s: %w", job.Name, err))
	}
	trust := v.trustErrors(job)
	intake, err := v.intakeErrors(ctx, job)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("validating BuildJob %s: %w", job.Name, err))
	}
	handMade, err := v.handMadeErrors(ctx, job, verdict.Environment)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("validating BuildJob %s: %w", job.Name, err))
	}
	errs := append(append(verdict.Problems, trust...), intake...)
	return verdict.Warnings, validation.InvalidBuildJob(job, append(errs, handMade...))
}

func (v *buildJobValidator) ValidateUpdate(context.Context, *bkv1.BuildJob, *bkv1.BuildJob) (admission.Warnings, error) {
	return nil, nil
}

func (v *buildJobValidator) ValidateDelete(context.Context, *bkv1.BuildJob) (admission.Warnings, error) {
	return nil, nil
}

type buildJobDefaulter struct {
	// jobs defaults the BuildJob (Default).
	jobs validation.Admission
}

func (d *buildJobDefaulter) Default(ctx context.Context, job *bkv1.BuildJob) error {
	if req, err := admission.RequestFromContext(ctx); err == nil && req.Operation != admissionv1.Create {
		return nil
	}
	fillNamespace(ctx, job)
	if err := d.jobs.Default(ctx, job); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("defaulting BuildJob %s: %w", job.Name, err))
	}
	return nil
}

type buildEnvironmentValidator struct {
	// writer creates the SubjectAccessReviews of grantErrors.
	writer client.Writer
	// granterRole is the ClusterRole that grants the verb grant, for refusals.
	granterRole string
}

func (v *buildEnvironmentValidator) ValidateCreate(ctx context.Context, env *bkv1.BuildEnvironment) (admission.Warnings, error) {
	return v.validate(ctx, env)
}

func (v *buildEnvironmentValidator) ValidateUpdate(ctx context.Context, oldEnv, env *bkv1.BuildEnvironment) (admission.Warnings, error) {
	// An environment on its way out, or one whose spec did not change (metadata, a
	// finalizer), is let through even if today's rules would refuse it: refusing would
	// only make it impossible to delete or relabel.
	if env.DeletionTimestamp != nil || equality.Semantic.DeepEqual(oldEnv.Spec, env.Spec) {
		return nil, nil
	}
	return v.validate(ctx, env)
}

// validate runs the checks of a new or changed spec: validation.BuildEnvironment, and
// whether the writer may grant what spec.allow grants (an update that keeps spec.allow is
// checked too: a new image or command runs with the same privileges).
func (v *buildEnvironmentValidator) validate(ctx context.Context, env *bkv1.BuildEnvironment) (admission.Warnings, error) {
	errs, warnings := validation.BuildEnvironment(env)
	grant, err := v.grantErrors(ctx, env)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("validating BuildEnvironment %s: %w", env.Name, err))
	}
	return warnings, validation.InvalidBuildEnvironment(env, append(errs, grant...))
}

func (*buildEnvironmentValidator) ValidateDelete(context.Context, *bkv1.BuildEnvironment) (admission.Warnings, error) {
	return nil, nil
}

// fillNamespace sets the request's namespace on an object that arrived without one.
func fillNamespace(ctx context.Context, job *bkv1.BuildJob) {
	if job.Namespace != "" {
		return
	}
	if req, err := admission.RequestFromContext(ctx); err == nil {
		job.Namespace = req.Namespace
	}
}
