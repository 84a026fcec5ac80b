package leaderelection

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// While the spawner lingers the manager's probe server is gone: the process answers the
// kubelet itself, alive but not ready.
func TestServeLiveness(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	// The manager's probe server lets go of the address a moment later.
	time.AfterFunc(300*time.Millisecond, func() { _ = ln.Close() })
	stop := serveLiveness(addr)
	defer stop()

	cases := []struct {
		path string
		want int
	}{{livenessPath, http.StatusOK}, {readinessPath, http.StatusServiceUnavailable}}
	for _, tc := range cases {
		resp, err := http.Get("http://" + addr + tc.path)
		require.NoError(t, err, tc.path)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode, tc.path)
		assert.Contains(t, string(body), "lingering", tc.path)
	}
	stop()
	_, err = http.Get("http://" + addr + livenessPath)
	assert.Error(t, err, "stopped")
}

// fakeManager's Start stands for a manager's: it returns err, after ctx ends when wait.
type fakeManager struct {
	wait bool
	err  error
}

func (m fakeManager) Start(ctx context.Context) error {
	if m.wait {
		<-ctx.Done()
	}
	return m.err
}

// fakeSpawner records what Run asks of the spawner, and what the kubelet would see of the
// process while it lingers.
type fakeSpawner struct {
	probeAddr      string
	lingered       bool
	liveWhile      int
	stoppedBeating bool
}

func (s *fakeSpawner) Linger(context.Context) {
	s.lingered = true
	resp, err := http.Get("http://" + s.probeAddr + livenessPath)
	if err == nil {
		s.liveWhile = resp.StatusCode
		_ = resp.Body.Close()
	}
}

func (s *fakeSpawner) StopHeartbeats() { s.stoppedBeating = true }

// A manager that stops by itself (its Lease lost) leaves the spawner lingering, the
// process alive to the kubelet, then fails the process so that it rejoins the election; a
// manager stopped by a signal ends it quietly, and the heartbeats stop either way.
func TestRun(t *testing.T) {
	lost := errors.New("leader election lost")
	cases := []struct {
		name        string
		mgr         fakeManager
		signal      bool
		noSpawner   bool
		wantErr     string
		wantLingers bool
	}{
		{name: "the lease is lost", mgr: fakeManager{err: lost}, wantErr: "running the manager: leader election lost", wantLingers: true},
		{name: "a signal", mgr: fakeManager{wait: true}, signal: true},
		{name: "a signal, the manager says canceled", mgr: fakeManager{wait: true, err: context.Canceled}, signal: true},
		{name: "a signal, the manager fails stopping", mgr: fakeManager{wait: true, err: lost}, signal: true, wantErr: "running the manager: leader election lost"},
		{name: "the lease is lost without a spawner", mgr: fakeManager{err: lost}, noSpawner: true, wantErr: "running the manager: leader election lost"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.signal {
				cancel()
			}
			sp := &fakeSpawner{probeAddr: freeAddr(t)}
			var l Lingerer = sp
			if tc.noSpawner {
				l = nil
			}
			err := Run(ctx, tc.mgr, l, sp.probeAddr)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			if tc.noSpawner {
				return
			}
			assert.Equal(t, tc.wantLingers, sp.lingered, "lingered")
			assert.True(t, sp.stoppedBeating, "the heartbeats are stopped")
			if tc.wantLingers {
				assert.Equal(t, http.StatusOK, sp.liveWhile, "alive to the kubelet while lingering")
				_, err := http.Get("http://" + sp.probeAddr + livenessPath)
				assert.Error(t, err, "the probes are no longer answered once the spawner stopped lingering")
			}
		})
	}
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
