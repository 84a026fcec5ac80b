// Package warmdemand sizes warm pools from demand: a BuildEnvironment whose
// spec.warmPool.maxSize is above its size keeps, between the two, as many idle warm pods as
// there are jobs waiting for an agent on the operator's queue. It reads them from
// Buildkite's REST API with github.com/buildkite/go-buildkite and the operator's optional
// API token (the one the start-up check uses, pkg/startupcheck); without a token, or while
// Buildkite cannot be read, every pool stays at its size, and the keeper says why in
// status.warmPool.message.
//
// A job waits for an agent while it is "scheduled": Buildkite has not assigned it to an
// agent, as every slot that could take it is busy. The REST API has no count of them, so
// the Poller lists the organization's builds that may hold one (scheduled, running or
// failing) with their jobs, and counts the command jobs that are scheduled and that
// agentd's slots could take: in the cluster's queue of agentd's queue key when a cluster is
// configured (the job's cluster_queue_id), on queue=<queue> otherwise, and with every other
// agent tag the job asks for among agentd's (--tags, such as cluster=gke-prod, which
// routes jobs among operators).
//
// Every pool that follows demand may grow to the whole count, each up to its own maxSize.
// The REST API cannot tell which environment a waiting job will choose: its plugin options
// are not in the job's REST view, and reading its environment would take the read_job_env
// scope, and with it every job's secrets in the operator's hands. Splitting the count among
// pools instead would starve the one that gets the jobs, which is the one that matters. The
// cost of the overshoot is bounded by each maxSize, which is the budget the environment's
// owner chose, and it ends when the queue drains: the pool shrinks to its size again.
//
// Pools grow at once and shrink late: the size follows the most jobs that waited in the
// last ShrinkDelay (DefaultShrinkDelay, 2 minutes), since a warm pod deleted between two
// waves of jobs must be started again for the next.
//
// The Poller polls every Interval (DefaultInterval, 30 s), on the leader only, and only
// while a pool that follows demand has asked for its size lately: Buildkite allows 200 REST
// calls a minute for a whole organization, every token and person together, so a poll of
// one page every 30 s costs 1% of it, and never more than maxPages calls. It yields when
// the organization has less than a tenth of its calls left in the window, and after a 429
// it waits until the window resets.
package warmdemand

import (
	"fmt"
	"time"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Sizer says how large each environment's warm pool should be now. The warm pool keeper
// asks it on every keep.
type Sizer interface {
	// Desired is how many idle warm pods env's pool keeps now: spec.warmPool.size, or more
	// up to its ceiling (WarmPool.Ceiling) while jobs wait. why says, for a person, what
	// the size follows or why the pool stays at its size although it has a maxSize, for
	// status.warmPool.message; it is "" for a pool without a maxSize above its size.
	Desired(env *bkv1.BuildEnvironment) (size int32, why string)
	// RecheckAfter is how soon a pool that follows demand should be kept again, so that
	// it follows the next count: the poll interval; 0 when no count will ever come.
	RecheckAfter() time.Duration
}

// NoToken is the Sizer of an operator without a Buildkite API token: every pool stays at
// its size, and a pool with a maxSize says why.
type NoToken struct{}

// Desired is env's spec.warmPool.size.
func (NoToken) Desired(env *bkv1.BuildEnvironment) (int32, string) {
	w := env.Spec.WarmPool
	if !w.FollowsDemand() {
		return w.Floor(), ""
	}
	return w.Floor(), fmt.Sprintf(
		"The pool stays at its size, %d: spec.warmPool.maxSize (%d) has it follow the jobs waiting on the operator's queue, but the operator has no Buildkite API token to read them. "+
			"Give agentd one with the %s scope (--buildkite-api-token-file; the chart's buildkite.preflight.apiTokenSecret)",
		w.Floor(), w.Ceiling(), ScopeReadBuilds)
}

// RecheckAfter is 0: nothing will change without a token.
func (NoToken) RecheckAfter() time.Duration { return 0 }

// clamp is n bounded by floor and ceiling.
func clamp(n int, floor, ceiling int32) int32 {
	switch {
	case n < int(floor):
		return floor
	case n > int(ceiling):
		return ceiling
	}
	return int32(n)
}
