package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// preflightConfig is what `agentd operator` is told for its start-up check of Buildkite
// (pkg/preflight): an API access token, and which organization and cluster to look in.
type preflightConfig struct {
	tokenFile    string
	organization string
	cluster      string
	endpoint     string
}

func (p *preflightConfig) bindFlags(fs *flag.FlagSet) {
	flagenv.String(fs, &p.tokenFile, "buildkite-api-token-file", envName("buildkite-api-token-file"), "",
		"file holding a Buildkite API access token (not the agent token) with the read_clusters scope, and read_organizations when --buildkite-organization is empty: "+
			"with it, agentd checks once at start-up that its cluster and queue exist and that dispatch is not paused there, and says what to fix in events on its Pod; without it nothing is checked")
	flagenv.String(fs, &p.organization, "buildkite-organization", envName("buildkite-organization"), "",
		"slug of the Buildkite organization agentd registers in, for the start-up check; the one organization the API token reaches when empty")
	flagenv.String(fs, &p.cluster, "buildkite-cluster", envName("buildkite-cluster"), "",
		"name or UUID of the Buildkite cluster whose agent token agentd registers with, for the start-up check; every cluster is searched for the queue when empty")
	flagenv.String(fs, &p.endpoint, "buildkite-api-endpoint", envName("buildkite-api-endpoint"), preflight.DefaultEndpoint,
		"Buildkite REST API endpoint the start-up check asks (it is sent the API token)")
}

// orgSlug is what an organization slug may be: it goes into the REST API's paths as is.
var orgSlug = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// check refuses what cannot be right whatever Buildkite answers.
func (p *preflightConfig) check() error {
	if !validation.ValidEndpoint(p.endpoint) {
		return fmt.Errorf("--buildkite-api-endpoint %q: give an http(s) URL with a host and no user, query or fragment, such as %s", p.endpoint, preflight.DefaultEndpoint)
	}
	if p.organization != "" && !orgSlug.MatchString(p.organization) {
		return fmt.Errorf("--buildkite-organization %q: give the organization's slug, as in https://buildkite.com/organizations/<slug>", p.organization)
	}
	return nil
}

// Pod identity, from the downward API in the chart's Deployment: the start-up check's
// events are about the Pod, so that `kubectl describe pod` shows them.
const (
	envPodName      = "POD_NAME"
	envPodNamespace = "POD_NAMESPACE"
	envPodUID       = "POD_UID"
)

// addPreflight adds the start-up check to mgr, unless the spawner is off (nothing then
// registers with Buildkite).
//
// It runs on every replica, not only the leader: each replica's Pod then tells its own
// `kubectl describe` what is wrong, whichever one is looked at; it does not wait for an
// election, which may take a lease duration or, for a standby, forever; and its few
// read-only calls per start cost Buildkite's rate limit nothing that matters. It never
// holds up the spawner: the manager starts it beside everything else, and it ends once it
// has reported.
func addPreflight(mgr ctrl.Manager, cfg *operatorConfig) error {
	if !cfg.spawnerEnabled {
		return nil
	}
	if err := cfg.preflight.check(); err != nil {
		return err
	}
	pod := podReference(os.Getenv, cfg.manager.namespace)
	return mgr.Add(&preflightRun{
		config:    cfg.preflight,
		queue:     cmp.Or(cfg.spawner.Queue, spawner.DefaultQueue),
		userAgent: userAgent(),
		events:    &podEvents{client: mgr.GetClient(), pod: pod},
		log:       ctrl.Log.WithName("preflight"),
	})
}

// podReference is the operator's own Pod, from the downward API's variables; no name when
// POD_NAME is not set.
func podReference(getenv func(string) string, namespace string) corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion: "v1", Kind: "Pod",
		Name:      getenv(envPodName),
		Namespace: cmp.Or(getenv(envPodNamespace), namespace),
		UID:       types.UID(getenv(envPodUID)),
	}
}

// preflightRun is the start-up check, a manager Runnable.
type preflightRun struct {
	config    preflightConfig
	queue     string
	userAgent string
	events    eventSink
	log       logr.Logger
	// timeout bounds the REST API calls; preflight.DefaultTimeout when 0.
	timeout time.Duration
}

// NeedLeaderElection is false: every replica checks (addPreflight says why).
func (p *preflightRun) NeedLeaderElection() bool { return false }

// Start runs the check once and reports it; it never fails the manager.
func (p *preflightRun) Start(ctx context.Context) error {
	p.report(ctx, p.findings(ctx))
	return nil
}

// findings are the check's outcome, or the one reason it could not run.
func (p *preflightRun) findings(ctx context.Context) []preflight.Finding {
	if p.config.tokenFile == "" {
		return []preflight.Finding{{Reason: preflight.ReasonSkipped, Message: fmt.Sprintf(
			"no Buildkite API token (--buildkite-api-token-file), so it was not checked that Buildkite has the cluster and queue %q agentd registers with, "+
				"nor whether dispatch is paused there: give a token with the %s scope to have it checked at start-up", p.queue, preflight.ScopeReadClusters)}}
	}
	token, err := readAPIToken(p.config.tokenFile)
	if err != nil {
		return []preflight.Finding{{Reason: preflight.ReasonTokenUnreadable, Problem: true, Message: fmt.Sprintf(
			"%v, so nothing about Buildkite's cluster and queue %q was checked: put the API token in that file (the chart mounts it from buildkite.preflight.apiTokenSecret)",
			err, p.queue)}}
	}
	r := &preflight.Runner{Endpoint: p.config.endpoint, Token: token, UserAgent: p.userAgent, Timeout: p.timeout}
	return r.Run(ctx, preflight.Config{Organization: p.config.organization, Cluster: p.config.cluster, Queue: p.queue})
}

// readAPIToken reads the token file, as the agent reads its token file: the whole file,
// spaces and line ends around it trimmed.
func readAPIToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the Buildkite API token file (--buildkite-api-token-file): %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("the Buildkite API token file %s (--buildkite-api-token-file) is empty", path)
	}
	return token, nil
}

// report logs every finding and records events on the Pod: a Warning for each problem, or
// one Normal event when there is none. Messages never hold the token: findings are made
// from Buildkite's answers and the configuration only.
func (p *preflightRun) report(ctx context.Context, findings []preflight.Finding) {
	problems := preflight.Problems(findings)
	for _, f := range findings {
		p.log.Info("Buildkite start-up check: "+f.Message, "reason", f.Reason, "problem", f.Problem)
	}
	if len(problems) > 0 {
		for _, f := range problems {
			p.event(ctx, corev1.EventTypeWarning, f.Reason, f.Message)
		}
		return
	}
	if len(findings) == 0 {
		return
	}
	msgs := make([]string, 0, len(findings))
	for _, f := range findings {
		msgs = append(msgs, f.Message)
	}
	reason := findings[0].Reason // Passed, or Skipped without a token
	p.event(ctx, corev1.EventTypeNormal, reason, strings.Join(msgs, "; "))
}

func (p *preflightRun) event(ctx context.Context, eventType, reason, message string) {
	if err := p.events.record(ctx, eventType, reason, message); err != nil {
		p.log.Info("the Buildkite start-up check's finding is only in this log: "+err.Error(), "reason", reason)
	}
}

// eventSink records one event about the operator.
type eventSink interface {
	record(ctx context.Context, eventType, reason, message string) error
}

// podEvents records core/v1 Events about the operator's Pod, in its namespace (where the
// operator's Role already allows events create and patch; the events.k8s.io API is
// granted only in the job namespace). An event without the Pod's UID is not shown by
// `kubectl describe pod`, which selects on it.
type podEvents struct {
	client client.Client
	pod    corev1.ObjectReference
	// noPod says once that there is no Pod to record events on.
	noPod sync.Once
}

// eventSource names the operator in the events it records.
const eventSource = "buildkite-operator"

// maxEventMessage is what the API server's event recorders keep of a message.
const maxEventMessage = 1024

var errNoPod = errors.New("POD_NAME is not set (the downward API), so there is no Pod to record events on")

func (e *podEvents) record(ctx context.Context, eventType, reason, message string) error {
	if e.pod.Name == "" {
		err := errNoPod
		e.noPod.Do(func() {
			err = fmt.Errorf("%w: set POD_NAME, POD_NAMESPACE and POD_UID from the Pod's metadata", errNoPod)
		})
		return err
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// As client-go's recorders name theirs: the object's name and a unique suffix.
			GenerateName: e.pod.Name + ".",
			Namespace:    e.pod.Namespace,
		},
		InvolvedObject: e.pod,
		Type:           eventType,
		Reason:         reason,
		Message:        truncate(message, maxEventMessage),
		Source:         corev1.EventSource{Component: eventSource},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if err := e.client.Create(ctx, ev); err != nil {
		return fmt.Errorf("recording event %s on Pod %s/%s: %w", reason, e.pod.Namespace, e.pod.Name, err)
	}
	return nil
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "..."
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}
