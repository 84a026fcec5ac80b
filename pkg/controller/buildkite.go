package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

var errNoToken = errors.New("job token Secret missing")

// token reads the job token from its Secret, straight from the API server: the operator
// does not cache Secrets. errNoToken: the Secret or its key does not exist (yet).
func (r *Reconciler) token(ctx context.Context, job *bkv1.BuildJob) (string, error) {
	ref := job.Spec.TokenSecretRef
	key := ref.KeyOrDefault()
	var s corev1.Secret
	err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: ref.Name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("%w: waiting for Secret %q with the job token (spec.tokenSecretRef)", errNoToken, ref.Name)
	case err != nil:
		return "", fmt.Errorf("reading the job token Secret %s/%s: %w", job.Namespace, ref.Name, err)
	}
	tok := string(s.Data[key])
	if tok == "" {
		return "", fmt.Errorf("%w: Secret %q has no key %q with the job token", errNoToken, ref.Name, key)
	}
	return tok, nil
}

// agentClient is a Buildkite client with the job's token, or nil when the token's Secret
// is missing.
func (r *Reconciler) agentClient(ctx context.Context, job *bkv1.BuildJob) (*agentapi.Client, error) {
	tok, err := r.token(ctx, job)
	if errors.Is(err, errNoToken) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	conf := r.opts.AgentAPI
	conf.Token = tok
	// The job token goes only to the operator's own endpoint: a BuildJob admitted
	// without the webhook may name any URL.
	conf.Endpoint = r.opts.AgentEndpoint
	if e := job.Spec.AgentEndpoint; e != "" && validation.EndpointAllowed(e, r.opts.AgentEndpoint) {
		conf.Endpoint = e
	}
	return agentapi.New(conf), nil
}

func (r *Reconciler) waitForToken(ctx context.Context, job *bkv1.BuildJob) (ctrl.Result, error) {
	_, err := r.token(ctx, job)
	msg := "the job token Secret is missing"
	if err != nil {
		msg = err.Error()
	}
	r.event(job, nil, corev1.EventTypeWarning, bkv1.ReasonWaitingForTokenSecret, "Report", "Cannot tell Buildkite how the job ended: %s", msg)
	return ctrl.Result{RequeueAfter: 10 * r.opts.JobStatePollInterval}, nil
}

// isGone: Buildkite refused a job call because the job is already finished or canceled
// (422), or its job token is no longer valid, which it stops being when the job ends (401).
func isGone(err error) bool {
	return err != nil && (agentapi.IsAlreadyFinished(err) || agentapi.IsUnauthorized(err))
}
