package leaderelection

import (
	"flag"
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
		want Timings
	}{{
		name: "defaults",
		want: Timings{DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod},
	}, {
		name: "from the environment",
		env: map[string]string{
			"BK_OPERATOR_LEADER_ELECT_LEASE_DURATION": "90s",
			"BK_OPERATOR_LEADER_ELECT_RENEW_DEADLINE": "1m",
			"BK_OPERATOR_LEADER_ELECT_RETRY_PERIOD":   "2s",
		},
		want: Timings{90 * time.Second, time.Minute, 2 * time.Second},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l Timings
			fs := flag.NewFlagSet("agentd operator", flag.ContinueOnError)
			l.BindFlags(fs)
			require.NoError(t, flagenv.ParseEnv(fs, nil, func(k string) string { return tc.env[k] }))
			assert.Equal(t, tc.want, l)
			require.NoError(t, l.Check())
			var opts ctrl.Options
			l.Apply(&opts)
			assert.Equal(t, tc.want.LeaseDuration, *opts.LeaseDuration)
			assert.Equal(t, tc.want.RenewDeadline, *opts.RenewDeadline)
			assert.Equal(t, tc.want.RetryPeriod, *opts.RetryPeriod)
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
		timing Timings
		want   string
	}{
		{"lease not longer than the renew deadline", Timings{30 * time.Second, 30 * time.Second, 5 * time.Second}, "-leader-elect-lease-duration 30s must be longer than -leader-elect-renew-deadline 30s"},
		{"renew deadline within the jittered retry period", Timings{time.Minute, 6 * time.Second, 5 * time.Second}, "-leader-elect-renew-deadline 6s must be longer than 1.2 times -leader-elect-retry-period 5s"},
		{"no retry period", Timings{time.Minute, 45 * time.Second, 0}, "-leader-elect-retry-period 0s: give a positive duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.timing.Check()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
