package buildjob_test

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// Each bound and worker count of the controller can be set by a flag or by its
// environment variable, and has its default when neither is given.
func TestBindFlags(t *testing.T) {
	cases := []struct {
		flag, env, value string
		def, want        any
		get              func(o *buildjob.Options) any
	}{
		{"max-concurrent-reconciles", "BK_OPERATOR_MAX_CONCURRENT_RECONCILES", "16", buildjob.DefaultMaxConcurrentReconciles, 16,
			func(o *buildjob.Options) any { return o.MaxConcurrentReconciles }},
		{"token-wait-timeout", "BK_OPERATOR_TOKEN_WAIT_TIMEOUT", "45s", buildjob.DefaultTokenWaitTimeout, 45 * time.Second,
			func(o *buildjob.Options) any { return o.TokenWaitTimeout }},
		{"quota-timeout", "BK_OPERATOR_QUOTA_TIMEOUT", "1m", buildjob.DefaultQuotaTimeout, time.Minute,
			func(o *buildjob.Options) any { return o.QuotaTimeout }},
		{"pod-setup-timeout", "BK_OPERATOR_POD_SETUP_TIMEOUT", "90s", buildjob.DefaultPodSetupTimeout, 90 * time.Second,
			func(o *buildjob.Options) any { return o.PodSetupTimeout }},
		{"running-job-state-interval", "BK_OPERATOR_RUNNING_JOB_STATE_INTERVAL", "1m", buildjob.DefaultRunningJobStateInterval, time.Minute,
			func(o *buildjob.Options) any { return o.RunningJobStateInterval }},
		{"cancel-margin", "BK_OPERATOR_CANCEL_MARGIN", "10s", buildjob.DefaultCancelMargin, 10 * time.Second,
			func(o *buildjob.Options) any { return o.CancelMargin }},
		{"buildkite-timeout", "BK_OPERATOR_BUILDKITE_TIMEOUT", "3s", buildjob.DefaultBuildkiteTimeout, 3 * time.Second,
			func(o *buildjob.Options) any { return o.BuildkiteTimeout }},
		{"phase-settle", "BK_OPERATOR_PHASE_SETTLE", "0s", buildjob.DefaultPhaseSettle, time.Duration(0),
			func(o *buildjob.Options) any { return o.PhaseSettle }},
		{"job-image-pull-secrets", "BK_OPERATOR_JOB_IMAGE_PULL_SECRETS", "registry, mirror", []corev1.LocalObjectReference(nil),
			[]corev1.LocalObjectReference{{Name: "registry"}, {Name: "mirror"}},
			func(o *buildjob.Options) any { return o.ImagePullSecrets }},
	}
	parse := func(t *testing.T, args []string, env map[string]string) buildjob.Options {
		t.Helper()
		var o buildjob.Options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.BindFlags(fs)
		require.NoError(t, flagenv.ParseEnv(fs, args, func(k string) string { return env[k] }))
		return o
	}
	for _, tc := range cases {
		t.Run(tc.flag, func(t *testing.T) {
			assert.Equal(t, tc.def, tc.get(ptr(parse(t, nil, nil))), "default")
			assert.Equal(t, tc.want, tc.get(ptr(parse(t, []string{"-" + tc.flag + "=" + tc.value}, nil))), "from the flag")
			assert.Equal(t, tc.want, tc.get(ptr(parse(t, nil, map[string]string{tc.env: tc.value}))), "from %s", tc.env)
		})
	}
}

// -job-image-pull-secrets is a list of Secret names: spaces and empty entries are dropped,
// and a name no Secret could have is refused when the flag is parsed, naming it, rather than
// failing every job pod's create.
func TestJobImagePullSecrets(t *testing.T) {
	cases := []struct {
		value   string
		want    []corev1.LocalObjectReference
		wantErr string
	}{
		{value: "", want: nil},
		{value: ",", want: nil},
		{value: " registry ,, mirror.example.com ", want: []corev1.LocalObjectReference{{Name: "registry"}, {Name: "mirror.example.com"}}},
		{value: "Registry", wantErr: `image pull secret "Registry" is not a Secret's name`},
		{value: "registry,under_score", wantErr: `image pull secret "under_score" is not a Secret's name`},
		{value: "a b", wantErr: `image pull secret "a b" is not a Secret's name`},
	}
	for _, tc := range cases {
		t.Run(tc.value, func(t *testing.T) {
			var o buildjob.Options
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.BindFlags(fs)
			err := flagenv.ParseEnv(fs, []string{"-job-image-pull-secrets=" + tc.value}, func(string) string { return "" })
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, o.ImagePullSecrets)
		})
	}
}
