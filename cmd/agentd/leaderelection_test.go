package main

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// The lease timings default to values that ride out a short API server outage and reach
// the manager from flags or their variables; the leader releases its Lease when it stops
// gracefully.
func TestLeaderElectionTimings(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want leaderTimings
	}{{
		name: "defaults",
		want: leaderTimings{DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod},
	}, {
		name: "from the environment",
		env: map[string]string{
			"BK_OPERATOR_LEADER_ELECT_LEASE_DURATION": "90s",
			"BK_OPERATOR_LEADER_ELECT_RENEW_DEADLINE": "1m",
			"BK_OPERATOR_LEADER_ELECT_RETRY_PERIOD":   "2s",
		},
		want: leaderTimings{90 * time.Second, time.Minute, 2 * time.Second},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c operatorConfig
			require.NoError(t, flagenv.ParseEnv(c.flags(), nil, func(k string) string { return tc.env[k] }))
			assert.Equal(t, tc.want, c.manager.leader)
			require.NoError(t, c.manager.leader.check())
			var opts ctrl.Options
			c.manager.leader.apply(&opts)
			assert.Equal(t, tc.want.leaseDuration, *opts.LeaseDuration)
			assert.Equal(t, tc.want.renewDeadline, *opts.RenewDeadline)
			assert.Equal(t, tc.want.retryPeriod, *opts.RetryPeriod)
			assert.True(t, opts.LeaderElectionReleaseOnCancel)
		})
	}
	// Buildkite marks an agent lost after about 3 minutes without a heartbeat: a crashed
	// leader's successor must start well before.
	assert.Less(t, DefaultLeaseDuration, 2*time.Minute)
}

func TestLeaderElectionTimingsChecked(t *testing.T) {
	cases := []struct {
		name   string
		timing leaderTimings
		want   string
	}{
		{"lease not longer than the renew deadline", leaderTimings{30 * time.Second, 30 * time.Second, 5 * time.Second}, "-leader-elect-lease-duration 30s must be longer than -leader-elect-renew-deadline 30s"},
		{"renew deadline within the jittered retry period", leaderTimings{time.Minute, 6 * time.Second, 5 * time.Second}, "-leader-elect-renew-deadline 6s must be longer than 1.2 times -leader-elect-retry-period 5s"},
		{"no retry period", leaderTimings{time.Minute, 45 * time.Second, 0}, "-leader-elect-retry-period 0s: give a positive duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.timing.check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

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
