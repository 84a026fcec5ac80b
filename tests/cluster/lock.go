package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockPath serialises nodes started through the Go API on this machine: two nodes would
// share the kubepods cgroups, the cni0 bridge and the hardcoded host paths. Tests in
// several packages (run in parallel by `go test ./...`) therefore take turns.
var lockPath = filepath.Join(os.TempDir(), "bk-operator-localnode.lock")

// machineLock waits for the lock until ctx ends. The lock lives as long as the returned
// file stays open; the kernel releases it if the process dies.
func machineLock(ctx context.Context, logf func(string, ...any)) (*os.File, error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the local node lock %s: %w", lockPath, err)
	}
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", lockPath, err)
		}
		if !logged {
			logf("another local node runs on this machine (lock %s): waiting for it to stop", lockPath)
			logged = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for another local node on this machine to stop: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
