package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
)

// Leader election: its timings, and what the operator does when it loses the lease.
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
// process exits and rejoins the election. Jobs waiting in Buildkite's queue wait for the
// new leader, and a job the spawner was creating a BuildJob for is resumed by it rather
// than failed after CreateTimeout.
const (
	DefaultLeaseDuration = 60 * time.Second
	DefaultRenewDeadline = 45 * time.Second
	DefaultRetryPeriod   = 5 * time.Second
)

// leaderElectionJitter is client-go's leaderelection.JitterFactor: the renew deadline
// must exceed the retry period times it.
const leaderElectionJitter = 1.2

// leaderTimings are the leader election timings of a manager.
type leaderTimings struct {
	leaseDuration, renewDeadline, retryPeriod time.Duration
}

func (l *leaderTimings) bindFlags(fs *flag.FlagSet) {
	flagenv.Duration(fs, &l.leaseDuration, "leader-elect-lease-duration", envName("leader-elect-lease-duration"), DefaultLeaseDuration,
		"how long another replica waits, once the leader stopped renewing its Lease, before taking it: a crashed leader's successor starts this late; keep it well under the 3 minutes after which Buildkite marks a silent agent lost")
	flagenv.Duration(fs, &l.renewDeadline, "leader-elect-renew-deadline", envName("leader-elect-renew-deadline"), DefaultRenewDeadline,
		"how long the leader tries to renew its Lease (an API server outage) before it stops; less than the lease duration")
	flagenv.Duration(fs, &l.retryPeriod, "leader-elect-retry-period", envName("leader-elect-retry-period"), DefaultRetryPeriod,
		"how often the leader renews its Lease, and others try to take it")
}

// check refuses timings client-go's leader election would refuse, saying how to fix them.
func (l *leaderTimings) check() error {
	switch {
	case l.retryPeriod <= 0:
		return fmt.Errorf("-leader-elect-retry-period %s: give a positive duration", l.retryPeriod)
	case l.renewDeadline <= time.Duration(leaderElectionJitter*float64(l.retryPeriod)):
		return fmt.Errorf("-leader-elect-renew-deadline %s must be longer than %.1f times -leader-elect-retry-period %s", l.renewDeadline, leaderElectionJitter, l.retryPeriod)
	case l.leaseDuration <= l.renewDeadline:
		return fmt.Errorf("-leader-elect-lease-duration %s must be longer than -leader-elect-renew-deadline %s, or a replica could take the Lease while the leader still acts", l.leaseDuration, l.renewDeadline)
	}
	return nil
}

// apply sets the timings in opts, and has the leader release its Lease when it stops
// gracefully: the process exits as soon as the manager has stopped (runLeader), so the
// successor may start at once.
func (l *leaderTimings) apply(opts *ctrl.Options) {
	opts.LeaseDuration = &l.leaseDuration
	opts.RenewDeadline = &l.renewDeadline
	opts.RetryPeriod = &l.retryPeriod
	opts.LeaderElectionReleaseOnCancel = true
}

// runLeader runs mgr until SIGTERM or SIGINT. sp, when not nil, is the spawner mgr runs:
// should mgr stop by itself (it lost its Lease), the spawner lingers, its busy slots
// heartbeating until the API server answers again, while probeAddr tells the kubelet the
// process is alive (the manager's own probes stopped with it). The error then is the
// manager's, so that the process exits non-zero and restarts into the election.
func runLeader(mgr ctrl.Manager, sp *spawner.Spawner, probeAddr string) error {
	ctx := ctrl.SetupSignalHandler()
	err := mgr.Start(ctx)
	if sp != nil {
		if err != nil && ctx.Err() == nil {
			ctrl.Log.Error(err, "the manager stopped by itself; the spawner's busy slots keep heartbeating until the API server answers again")
			stop := serveLiveness(probeAddr)
			sp.Linger(ctx)
			stop()
		}
		sp.StopHeartbeats()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// Paths of the manager's probes (controller-runtime's defaults).
const (
	livenessPath  = "/healthz"
	readinessPath = "/readyz"
)

// serveLiveness answers the probes on addr while the spawner lingers: alive, and not
// ready (it serves no webhook). It returns a function that stops it. The manager's probe
// server may still be letting go of addr: it tries for a few seconds.
func serveLiveness(addr string) (stop func()) {
	if addr == "" || addr == "0" {
		return func() {}
	}
	const msg = "lingering after the leader lease was lost: heartbeats only\n"
	mux := http.NewServeMux()
	mux.HandleFunc(livenessPath, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, msg) })
	mux.HandleFunc(readinessPath, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, msg, http.StatusServiceUnavailable) })
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		ctrl.Log.Error(err, "cannot answer the probes while lingering; the kubelet may restart the process early", "address", addr)
		return func() {}
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}
