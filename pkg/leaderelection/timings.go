// Package leaderelection holds the operator's leader election: its timings and their flags,
// and what the process does when it loses the lease.
//
// Only the leader takes jobs and reconciles. The leader renews its Lease through the API
// server every retry period; when it has not managed to for the renew deadline, it stops
// (controller-runtime ends the manager, and the process exits). Another replica takes the
// Lease once it has not seen it renewed for the lease duration, which is longer, so that
// the old leader has stopped acting by then: one active spawner at a time.
//
// The timings trade two things. A short renew deadline turns a short API server outage
// (an upgrade of the control plane, an etcd election) into a restart of the operator; a
// long lease duration makes a crashed leader (kill -9, a lost node) wait that long for its
// successor, during which no job is taken and the busy agents send no heartbeat. Buildkite
// marks an agent lost after about three minutes without one, so the lease must stay well
// under that. The defaults ride out outages of up to 45 s without a restart, and fail over
// from a crash within a minute. A graceful stop (a rolling update) releases the Lease
// (LeaderElectionReleaseOnCancel), so the successor takes it at once whatever the timings.
//
// An outage longer than the renew deadline still costs the lease. The spawner then
// lingers (spawner.Spawner.Linger): its busy slots keep heartbeating, taking nothing, until
// the API server answers again, so Buildkite never sees their agents go silent; then the
// process exits and rejoins the election (Run). Jobs waiting in Buildkite's queue wait for
// the new leader, and a job the spawner was creating a BuildJob for is resumed by it rather
// than failed after CreateTimeout.
package leaderelection

import (
	"flag"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// The Lease the leader holds, in the operator's namespace.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=buildkite,resources=leases,verbs=get;create;update

// Default timings: see the package's comment for why.
const (
	DefaultLeaseDuration = 60 * time.Second
	DefaultRenewDeadline = 45 * time.Second
	DefaultRetryPeriod   = 5 * time.Second
)

// jitter is client-go's leaderelection.JitterFactor: the renew deadline must exceed the
// retry period times it.
const jitter = 1.2

// Timings are the leader election timings of a manager.
type Timings struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// BindFlags binds the timings' flags, each with its environment variable, to t.
func (t *Timings) BindFlags(fs *flag.FlagSet) {
	flagenv.Duration(fs, &t.LeaseDuration, "leader-elect-lease-duration", "BK_OPERATOR_LEADER_ELECT_LEASE_DURATION", DefaultLeaseDuration,
		"how long another replica waits, once the leader stopped renewing its Lease, before taking it: a crashed leader's successor starts this late; keep it well under the 3 minutes after which Buildkite marks a silent agent lost")
	flagenv.Duration(fs, &t.RenewDeadline, "leader-elect-renew-deadline", "BK_OPERATOR_LEADER_ELECT_RENEW_DEADLINE", DefaultRenewDeadline,
		"how long the leader tries to renew its Lease (an API server outage) before it stops; less than the lease duration")
	flagenv.Duration(fs, &t.RetryPeriod, "leader-elect-retry-period", "BK_OPERATOR_LEADER_ELECT_RETRY_PERIOD", DefaultRetryPeriod,
		"how often the leader renews its Lease, and others try to take it")
}

// Check refuses timings client-go's leader election would refuse, saying how to fix them.
func (t *Timings) Check() error {
	switch {
	case t.RetryPeriod <= 0:
		return fmt.Errorf("-leader-elect-retry-period %s: give a positive duration", t.RetryPeriod)
	case t.RenewDeadline <= time.Duration(jitter*float64(t.RetryPeriod)):
		return fmt.Errorf("-leader-elect-renew-deadline %s must be longer than %.1f times -leader-elect-retry-period %s", t.RenewDeadline, jitter, t.RetryPeriod)
	case t.LeaseDuration <= t.RenewDeadline:
		return fmt.Errorf("-leader-elect-lease-duration %s must be longer than -leader-elect-renew-deadline %s, or a replica could take the Lease while the leader still acts", t.LeaseDuration, t.RenewDeadline)
	}
	return nil
}

// Apply sets the timings in opts, and has the leader release its Lease when it stops
// gracefully: the process exits as soon as the manager has stopped (Run), so the
// successor may start at once.
func (t *Timings) Apply(opts *ctrl.Options) {
	opts.LeaseDuration = &t.LeaseDuration
	opts.RenewDeadline = &t.RenewDeadline
	opts.RetryPeriod = &t.RetryPeriod
	opts.LeaderElectionReleaseOnCancel = true
}
