package buildjob

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
// when there is no token to use (see token). The client is remembered for the job's next
// calls (jobMemory.client); scope.buildkite makes it once per reconcile.
func (r *Reconciler) agentClient(ctx context.Context, s *scope) (*agentapi.Client, error) {
	job := s.job
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
	if c := s.memory().client; c != nil && c.endpoint == endpoint && c.token == tok {
		return c.c, nil
	}
	c := &jobClient{endpoint: endpoint, token: tok, c: r.shared.get(r.opts.AgentAPI).WithEndpoint(endpoint).WithToken(tok)}
	s.remember(func(m *jobMemory) { m.client = c })
	return c.c, nil
}

// sharedClient is the client every job's client is derived from, whose dozen HTTP clients
// (one per kind of call, each with its retry rules) they share.
type sharedClient struct {
	once sync.Once
	c    *agentapi.Client
}

// get is the shared client, made from conf the first time.
func (s *sharedClient) get(conf agentapi.Config) *agentapi.Client {
	s.once.Do(func() { s.c = agentapi.New(conf) })
	return s.c
}

// waitForToken is what a job whose outcome must be sent to Buildkite does without its
// token: it waits, at most opts.TokenWaitTimeout from when the wait began (recorded in the
// Reported condition), for the Secret to come back. giveUp: the Secret did not come back,
// the job already waited for it in vain before its pod (its outcome says so), or the
// BuildJob is being deleted, which nothing should hold up: the job is let go of
// unreported (unreportable).
func (r *Reconciler) waitForToken(ctx context.Context, s *scope, o *outcome) (giveUp bool, err error) {
	job := s.job
	if o.reason == bkv1.ReasonTokenSecretMissing || !job.DeletionTimestamp.IsZero() {
		return true, nil
	}
	msg := s.tokenMissingMessage(ctx)
	var since time.Time
	err = r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
		since = waitingSince(job, bkv1.ConditionReported, metav1.ConditionUnknown, bkv1.ReasonWaitingForTokenSecret,
			"Cannot tell Buildkite how the job ended: "+msg, s.now)
	})
	if err != nil {
		return false, err
	}
	left := since.Add(r.opts.TokenWaitTimeout).Sub(s.now)
	if left <= 0 {
		return true, nil
	}
	r.event(job, nil, corev1.EventTypeWarning, bkv1.ReasonWaitingForTokenSecret, "Report",
		"Cannot tell Buildkite how the job ended: %s; giving up in %s", msg, left.Round(time.Second))
	s.requeueAfter(min(left, 10*r.opts.JobStatePollInterval))
	return false, nil
}

// unreportable lets go of a job whose outcome cannot reach Buildkite from here because its
// token Secret is gone: the status message and an event say why; the Reported condition
// is False with bkv1.ReasonTokenSecretMissing. That condition is what the spawner's slot
// that accepted the job waits for: it still holds the job's token, and finishes the job
// itself, with an explanation (the Finished condition's message) in its log, so the job
// is not left accepted or running on Buildkite until its timeout.
func (r *Reconciler) unreportable(ctx context.Context, s *scope, o *outcome) error {
	job := s.job
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
		return err
	}
	return r.markReported(ctx, s, o, bkv1.ReasonTokenSecretMissing, "Buildkite was not told how the job ended: "+detail, metav1.ConditionFalse)
}

// tokenMissingMessage says what is wrong with the job's token Secret.
func (s *scope) tokenMissingMessage(ctx context.Context) string {
	if _, err := s.buildkite(ctx); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("the job token Secret %q is missing", s.job.Spec.TokenSecretRef.Name)
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
