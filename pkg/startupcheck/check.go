package startupcheck

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
)

// Check is the start-up check, a controller-runtime manager Runnable.
type Check struct {
	Config Config
	// Queue is the queue agentd's agents register in.
	Queue string
	// UserAgent is sent with the REST API calls.
	UserAgent string
	// Events records what was found.
	Events EventSink
	Log    logr.Logger
	// Timeout bounds the REST API calls; preflight.DefaultTimeout when 0.
	Timeout time.Duration
}

// NeedLeaderElection is false: every replica checks (the package's comment says why).
func (c *Check) NeedLeaderElection() bool { return false }

// Start runs the check once and reports it; it never fails the manager.
func (c *Check) Start(ctx context.Context) error {
	c.report(ctx, c.findings(ctx))
	return nil
}

// findings are the check's outcome, or the one reason it could not run.
func (c *Check) findings(ctx context.Context) []preflight.Finding {
	if c.Config.TokenFile == "" {
		return []preflight.Finding{{Reason: preflight.ReasonSkipped, Message: fmt.Sprintf(
			"no Buildkite API token (--buildkite-api-token-file), so it was not checked that Buildkite has the cluster and queue %q agentd registers with, "+
				"nor whether dispatch is paused there: give a token with the %s scope to have it checked at start-up", c.Queue, preflight.ScopeReadClusters)}}
	}
	token, err := readAPIToken(c.Config.TokenFile)
	if err != nil {
		return []preflight.Finding{{Reason: preflight.ReasonTokenUnreadable, Problem: true, Message: fmt.Sprintf(
			"%v, so nothing about Buildkite's cluster and queue %q was checked: put the API token in that file (the chart mounts it from buildkite.preflight.apiTokenSecret)",
			err, c.Queue)}}
	}
	r := &preflight.Runner{Endpoint: c.Config.Endpoint, Token: token, UserAgent: c.UserAgent, Timeout: c.Timeout}
	return r.Run(ctx, preflight.Config{Organization: c.Config.Organization, Cluster: c.Config.Cluster, Queue: c.Queue})
}

// readAPIToken reads the token file, as the agent reads its token file: the whole file,
// spaces and line ends around it trimmed.
func readAPIToken(path string) (string, error) {
	token, err := preflight.ReadAPIToken(path)
	if err != nil {
		return "", fmt.Errorf("reading the Buildkite API token file (--buildkite-api-token-file): %w", err)
	}
	return token, nil
}

// report logs every finding and records events on the Pod: a Warning for each problem, or
// one Normal event when there is none. Messages never hold the token: findings are made
// from Buildkite's answers and the configuration only.
func (c *Check) report(ctx context.Context, findings []preflight.Finding) {
	problems := preflight.Problems(findings)
	for _, f := range findings {
		c.Log.Info("Buildkite start-up check: "+f.Message, "reason", f.Reason, "problem", f.Problem)
	}
	if len(problems) > 0 {
		for _, f := range problems {
			c.event(ctx, corev1.EventTypeWarning, f.Reason, f.Message)
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
	c.event(ctx, corev1.EventTypeNormal, reason, strings.Join(msgs, "; "))
}

func (c *Check) event(ctx context.Context, eventType, reason, message string) {
	if err := c.Events.Record(ctx, eventType, reason, message); err != nil {
		c.Log.Info("the Buildkite start-up check's finding is only in this log: "+err.Error(), "reason", reason)
	}
}
