package buildjob

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

var errNoToken = errors.New("job token Secret missing")

// ignoreNoToken is err, unless it says the job has no token: a call to Buildkite that can
// wait for the token (a notice, a poll of the job's state) is then skipped.
func ignoreNoToken(err error) error {
	if errors.Is(err, errNoToken) {
		return nil
	}
	return err
}

// token reads the job token from its Secret: from the cache, which holds the token
// Secrets the spawner makes (ConfigureCache), and from the API server for any other, or
// when the cached copy cannot be used (a token under another key, a Secret sealed after it
// was cached). errNoToken: the Secret or its key
// does not exist (yet), or the Secret is not the one the spawner sealed for this BuildJob
// (pkg/seal): a BuildJob made by hand, or a Secret someone else put under the name, never
// has its token used, so the controller never speaks to Buildkite for a job the operator
// did not accept.
func (r *Reconciler) token(ctx context.Context, job *bkv1.BuildJob) (string, error) {
	ref := job.Spec.TokenSecretRef
	if bkv1.MadeByHand(job) {
		return "", fmt.Errorf("%w: the BuildJob was made by hand (it has no %s annotation), and the operator uses no job token for it", errNoToken, bkv1.AnnotationIntake)
	}
	sealKey, err := r.opts.Seal.Key(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the job token Secret %s/%s: %w", job.Namespace, ref.Name, err)
	}
	key := ref.KeyOrDefault()
	var s corev1.Secret
	nn := types.NamespacedName{Namespace: job.Namespace, Name: ref.Name}
	err = r.client.Get(ctx, nn, &s)
	switch {
	case err == nil && len(s.Data[key]) > 0 && sealKey.TokenSecret(job, &s):
		return string(s.Data[key]), nil
	case apierrors.IsNotFound(err) && cachesTokenSecret(job):
		// Not made yet, or not in the cache yet: its creation brings a reconcile
		// (tokenSecretEvents), so the API server is not asked.
	default:
		err = r.apiReader.Get(ctx, nn, &s)
	}
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("%w: waiting for Secret %q with the job token (spec.tokenSecretRef)", errNoToken, ref.Name)
	case err != nil:
		return "", fmt.Errorf("reading the job token Secret %s/%s: %w", job.Namespace, ref.Name, err)
	case !sealKey.TokenSecret(job, &s):
		return "", fmt.Errorf("%w: Secret %q is not the token Secret the operator made for this BuildJob (it is not sealed for it), so its token is not used", errNoToken, ref.Name)
	}
	tok := string(s.Data[key])
	if tok == "" {
		return "", fmt.Errorf("%w: Secret %q has no key %q with the job token", errNoToken, ref.Name, key)
	}
	return tok, nil
}

// cachesTokenSecret: the cache holds job's token Secret once it exists. The cache keeps the
// Secrets labelled with their job, and of each only the token under the default key
// (ConfigureCache); the spawner labels a Secret as it labels its BuildJob.
func cachesTokenSecret(job *bkv1.BuildJob) bool {
	return job.Labels[bkv1.LabelJob] != "" && job.Spec.TokenSecretRef.KeyOrDefault() == bkv1.DefaultSecretKey
}

// agentClient is a Buildkite client with the job's token; an error that wraps errNoToken
// when there is no token to use (see token). The client is kept for the job's next calls
// (agentClients).
func (r *Reconciler) agentClient(ctx context.Context, job *bkv1.BuildJob) (*agentapi.Client, error) {
	tok, err := r.token(ctx, job)
	if err != nil {
		return nil, err
	}
	// The job token goes only to the operator's own endpoint: a BuildJob admitted
	// without the webhook may name any URL.
	endpoint := r.opts.AgentEndpoint
	if e := job.Spec.AgentEndpoint; e != "" && r.opts.endpointAllowed(e) {
		endpoint = e
	}
	return r.clients.get(client.ObjectKeyFromObject(job), endpoint, tok, func() *agentapi.Client {
		return r.clients.shared(r.opts.AgentAPI).WithEndpoint(endpoint).WithToken(tok)
	}), nil
}

// waitForToken is what a job whose outcome must be sent to Buildkite does without its
// token: it waits, at most opts.TokenWaitTimeout from when the wait began (recorded in the
// Reported condition), for the Secret to come back. giveUp: the Secret did not come back,
// the job never had one (o.noToken), or the BuildJob is being deleted, which nothing
// should hold up: the job is let go of unreported (unreportable).
func (r *Reconciler) waitForToken(ctx context.Context, job *bkv1.BuildJob, o *outcome) (giveUp bool, wait ctrl.Result, err error) {
	if o.noToken || !job.DeletionTimestamp.IsZero() {
		return true, ctrl.Result{}, nil
	}
	msg := r.tokenMissingMessage(ctx, job)
	var since time.Time
	err = r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
		since = waitingSince(job, bkv1.ConditionReported, metav1.ConditionUnknown, bkv1.ReasonWaitingForTokenSecret,
			"Cannot tell Buildkite how the job ended: "+msg, r.opts.Now())
	})
	if err != nil {
		return false, ctrl.Result{}, err
	}
	left := since.Add(r.opts.TokenWaitTimeout).Sub(r.opts.Now())
	if left <= 0 {
		return true, ctrl.Result{}, nil
	}
	r.event(job, nil, corev1.EventTypeWarning, bkv1.ReasonWaitingForTokenSecret, "Report",
		"Cannot tell Buildkite how the job ended: %s; giving up in %s", msg, left.Round(time.Second))
	return false, ctrl.Result{RequeueAfter: min(left, 10*r.opts.JobStatePollInterval)}, nil
}

// unreportable lets go of a job whose outcome cannot reach Buildkite from here because its
// token Secret is gone: the status message and an event say why; the Reported condition
// is False with bkv1.ReasonTokenSecretMissing. That condition is what the spawner's slot
// that accepted the job waits for: it still holds the job's token, and finishes the job
// itself, with an explanation (the Finished condition's message) in its log, so the job
// is not left accepted or running on Buildkite until its timeout.
func (r *Reconciler) unreportable(ctx context.Context, job *bkv1.BuildJob, o *outcome) (ctrl.Result, error) {
	detail := fmt.Sprintf("the job token Secret %q is missing (spec.tokenSecretRef), and the controller cannot reach Buildkite without it; "+
		"the spawner's slot that accepted the job, which holds its token, finishes the job and says why in its log",
		job.Spec.TokenSecretRef.Name)
	note := " Buildkite was not told how the job ended: " + detail + "."
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		if !strings.HasSuffix(st.Message, note) {
			st.Message += note
		}
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.markReported(ctx, job, o, bkv1.ReasonTokenSecretMissing, "Buildkite was not told how the job ended: "+detail, metav1.ConditionFalse)
}

// tokenMissingMessage says what is wrong with the job's token Secret.
func (r *Reconciler) tokenMissingMessage(ctx context.Context, job *bkv1.BuildJob) string {
	if _, err := r.token(ctx, job); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("the job token Secret %q is missing", job.Spec.TokenSecretRef.Name)
}

// budgetKey holds, in a reconcile's context, when its Buildkite calls must be done by.
type budgetKey struct{}

// withBuildkiteBudget gives the Buildkite calls made with ctx, retries included, until
// deadline in all: a reconcile never waits longer than that for Buildkite, however many
// calls it makes or however slowly Buildkite answers.
func withBuildkiteBudget(ctx context.Context, deadline time.Time) context.Context {
	return context.WithValue(ctx, budgetKey{}, deadline)
}

// buildkiteContext is the context for one Buildkite call: ctx, ending with the
// reconcile's Buildkite budget. The Kubernetes calls of the reconcile keep ctx itself.
func buildkiteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if deadline, ok := ctx.Value(budgetKey{}).(time.Time); ok {
		return context.WithDeadline(ctx, deadline)
	}
	return context.WithCancel(ctx)
}

// buildkiteUnavailable is a Buildkite call that failed in a way a later try may not: a
// 5xx, a 429, no answer in time. Reconcile tries the BuildJob again after
// opts.BuildkiteRetryInterval instead of failing it, so that the queue's backoff, which
// grows to many minutes, does not delay the job long after Buildkite is back.
type buildkiteUnavailable struct {
	call string
	err  error
}

func (e *buildkiteUnavailable) Error() string { return e.call + ": " + e.err.Error() }
func (e *buildkiteUnavailable) Unwrap() error { return e.err }

// unavailable counts a failed Buildkite call and wraps its error for Reconcile.
func unavailable(call, what string, err error) error {
	buildkiteErrors.WithLabelValues(call).Inc()
	return &buildkiteUnavailable{call: call, err: fmt.Errorf("%s: %w", what, err)}
}

// retryBuildkite is when to try again after Buildkite was unavailable: the interval, and
// up to half of it again at random, so that jobs that failed together do not all come
// back together.
func (r *Reconciler) retryBuildkite() time.Duration {
	d := r.opts.BuildkiteRetryInterval
	return d + rand.N(d/2+1)
}

// isGone: Buildkite refused a job call because the job is already finished or canceled
// (422), or its job token is no longer valid, which it stops being when the job ends (401).
func isGone(err error) bool {
	return err != nil && (agentapi.IsAlreadyFinished(err) || agentapi.IsUnauthorized(err))
}
