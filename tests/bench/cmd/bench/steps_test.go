package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/bench"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// defaults are the flags' defaults, as main sets them.
func defaults() options {
	return options{
		backend: bench.BackendKwok, sizes: "10,100,1000", dispatch: dispatchFull, runs: 3, rounds: 2,
		supervisorRuns: 3, retentionRate: 5, retentionSlots: 50, warm: true,
	}
}

func TestParsePlan(t *testing.T) {
	tests := []struct {
		name string
		set  func(*options)
		want plan
		err  string
	}{
		{
			name: "make bench",
			set: func(o *options) {
				o.nodeSizes, o.supervisor, o.thenRetention, o.retentionJobs = "1,10", "bin/linux/agentd-supervise", true, 10000
			},
			want: plan{sizes: []int{10, 100, 1000}, nodeSizes: []int{1, 10}, dispatch: &bench.DispatchFull},
		},
		{
			name: "the retention mode runs nothing else",
			set:  func(o *options) { o.sizes, o.retentionJobs = "50", 10000 },
			want: plan{sizes: []int{50}},
		},
		{
			name: "the retention mode takes one size",
			set:  func(o *options) { o.retentionJobs = 10000 },
			err:  "-retention-jobs without -then-retention is the retention mode: give it one size",
		},
		{
			name: "the retention mode with node sizes",
			set:  func(o *options) { o.sizes, o.nodeSizes, o.retentionJobs = "50", "1", 100 },
			err:  "-node-sizes: the retention mode runs nothing else",
		},
		{
			name: "a retention run after the rest with no slot",
			set:  func(o *options) { o.thenRetention, o.retentionJobs, o.retentionSlots = true, 100, 0 },
			err:  "-retention-slots: 0",
		},
		{
			name: "-then-retention with -retention-jobs 0 skips it",
			set:  func(o *options) { o.thenRetention, o.retentionSlots = true, 0 },
			want: plan{sizes: []int{10, 100, 1000}, dispatch: &bench.DispatchFull},
		},
		{
			name: "a bad node size",
			set:  func(o *options) { o.nodeSizes = "1,ten" },
			err:  `-node-sizes: "ten" is not a positive number of jobs`,
		},
		{
			name: "negative supervisor runs",
			set:  func(o *options) { o.supervisorRuns = -1 },
			err:  "-supervisor-runs: -1",
		},
		{
			name: "the supervisor benchmark alone",
			set:  func(o *options) { o.sizes, o.dispatch = "", dispatchOff },
			want: plan{},
		},
		{
			name: "nothing to run",
			set:  func(o *options) { o.sizes, o.dispatch, o.supervisorRuns = "", dispatchOff, 0 },
			err:  "nothing to run",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := defaults()
			tt.set(&o)
			got, err := parsePlan(o)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestWhyNoNode(t *testing.T) {
	full := t.TempDir()
	for _, b := range []string{"kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager", "containerd", "ctr"} {
		require.NoError(t, os.WriteFile(filepath.Join(full, b), nil, 0o755))
	}
	for _, img := range []string{images.JobImage, images.AgentdImage} {
		require.NoError(t, os.WriteFile(filepath.Join(full, images.TarName(img)), nil, 0o644))
	}
	found := func(string) (string, error) { return "/usr/bin/x", nil }
	notFound := func(string) (string, error) { return "", errors.New("not found") }
	tests := []struct {
		name string
		host nodeHost
		want []string // in the reason; none: the node can run
	}{
		{"root, everything there", nodeHost{euid: 0, kubeBin: full, containerdDir: full, imagesDir: full, lookPath: found}, nil},
		{"not root", nodeHost{euid: 1000, kubeBin: full, containerdDir: full, imagesDir: full, lookPath: found}, []string{"not root"}},
		{"root, nothing built", nodeHost{euid: 0, kubeBin: t.TempDir(), containerdDir: t.TempDir(), imagesDir: t.TempDir(), lookPath: notFound}, []string{
			"missing kube-apiserver in ", "kubelet in ", "(make cluster-binaries)", images.TarName(images.JobImage) + " (make images)",
			images.TarName(images.AgentdImage), "containerd in ", "ctr in ", "runc (make node-deps)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.host.whyNoNode()
			if tt.want == nil {
				assert.Empty(t, got)
				return
			}
			for _, w := range tt.want {
				assert.Contains(t, got, w)
			}
		})
	}
}

// A node the bench cannot run skips the node rows, runs nothing and fails nothing: the
// targets say why.
func TestNodeSizesSkip(t *testing.T) {
	b := &bencher{o: options{nodeSizes: "1,10"}}
	host := nodeHost{euid: 1000}
	require.NoError(t, b.nodeSizes(context.Background(), []int{1, 10}, rateFlag{}, host))
	assert.Empty(t, b.in.Runs)
	assert.Empty(t, b.results)
	assert.Equal(t, "skipped: not root: the local node mounts, and creates cgroups and network devices", b.in.WhyNoNode)
	for _, tg := range bench.Targets(b.in)[1:3] {
		assert.Equal(t, bench.StatusNotMeasured, tg.Status)
		assert.Contains(t, tg.Verdict, "skipped: not root")
	}
}

func TestCheckBinary(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "agentd-supervise"), filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(exe, nil, 0o755))
	require.NoError(t, os.WriteFile(plain, nil, 0o644))
	got, err := checkBinary("-supervisor", exe, supervisorHint)
	require.NoError(t, err)
	assert.Equal(t, exe, got)
	_, err = checkBinary("-supervisor", filepath.Join(dir, "missing"), supervisorHint)
	assert.ErrorContains(t, err, "make release-binaries builds bin/linux/agentd-supervise")
	_, err = checkBinary("-supervisor", plain, supervisorHint)
	assert.ErrorContains(t, err, "is not an executable file")
	_, err = checkBinary("-supervisor", dir, supervisorHint)
	assert.ErrorContains(t, err, "is not an executable file")
}
