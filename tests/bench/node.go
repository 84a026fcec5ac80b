package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// nodeLock is the local node's machine lock (tests/cluster): one node at a time runs on
// this machine, and the end-to-end suite takes turns with the bench.
var nodeLock = filepath.Join(os.TempDir(), "bk-operator-localnode.lock")

// waitForNodeLock waits, up to wait, until no other local node holds the machine lock. It
// only looks: cluster.Up takes the lock itself.
func waitForNodeLock(ctx context.Context, wait time.Duration, logf func(string, ...any)) error {
	f, err := os.OpenFile(nodeLock, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return fmt.Errorf("opening the local node lock %s: %w", nodeLock, err)
	}
	defer func() { _ = f.Close() }()
	deadline := time.Now().Add(wait)
	for logged := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("looking at the local node lock %s: %w", nodeLock, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("another local node (the end-to-end suite?) has held %s for %s: not starting a second one; try again later", nodeLock, wait)
		}
		if !logged {
			logf("another local node runs on this machine (lock %s): waiting up to %s for it to stop", nodeLock, wait)
			logged = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// startNode starts the local single-node Kubernetes (tests/cluster; root) with the job and
// operator images, on which job pods really run `agentd supervise`.
func startNode(ctx context.Context, cfg *Config) (*clusterEnv, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the node backend starts a local Kubernetes node: run it as root")
	}
	if err := waitForNodeLock(ctx, cfg.NodeWait, cfg.Logf); err != nil {
		return nil, err
	}
	node, err := cluster.Up(ctx, cluster.Options{
		// Its own state dir: a node the end-to-end suite left behind is the suite's to clear.
		StateDir:  filepath.Join(testkit.RepoRoot(), ".cache", "bench-localnode"),
		ImagesDir: cfg.ImagesDir,
		Logf:      cfg.Logf,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the local node: %w", err)
	}
	ce := &clusterEnv{
		operatorKubeconfig: node.Kubeconfig(),
		auditLog:           node.AuditLogPath(),
		fakeAddr:           net.JoinHostPort(node.HostAddress(), "0"),
		hostAddress:        node.HostAddress(),
		jobImage:           images.JobImage,
		pullPolicy:         corev1.PullNever,
		operatorImage:      images.AgentdImage,
		stop:               node.Down,
	}
	if ce.rest, err = node.RESTConfig(); err != nil {
		_ = node.Down(context.WithoutCancel(ctx))
		return nil, err
	}
	return ce, nil
}
