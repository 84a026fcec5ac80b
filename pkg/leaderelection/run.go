package leaderelection

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Manager is what Run runs: a controller-runtime manager.
type Manager interface {
	Start(ctx context.Context) error
}

// Lingerer is the spawner a manager runs (spawner.Spawner): after the manager lost its
// Lease, Linger keeps the busy slots heartbeating until the API server answers again or
// ctx ends, and StopHeartbeats stops whatever still heartbeats.
type Lingerer interface {
	Linger(ctx context.Context)
	StopHeartbeats()
}

// Run runs mgr until ctx ends (SIGTERM or SIGINT, with ctrl.SetupSignalHandler). sp, when
// not nil, is the spawner mgr runs: should mgr stop by itself (it lost its Lease), the
// spawner lingers, its busy slots heartbeating until the API server answers again, while
// probeAddr tells the kubelet the process is alive (the manager's own probes stopped with
// it). The error then is the manager's, so that the process exits non-zero and restarts
// into the election.
func Run(ctx context.Context, mgr Manager, sp Lingerer, probeAddr string) error {
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
