package e2e

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// repoMount is where pods see the host's repository. Pods on the one local node reach it
// through a hostPath volume: simpler than a git server, and git clones a path as it clones
// a URL.
const repoMount = "/srv/repo"

// repoEnvironment mounts the host's repository.
func repoEnvironment(name string, bootstrap bool) *bkv1.BuildEnvironment {
	be := hostPathEnvironment(name, repo.Dir, corev1.VolumeMount{Name: "repo", MountPath: repoMount, ReadOnly: true})
	if bootstrap {
		be.Spec.Runner = bkv1.RunnerBootstrap
	}
	return be
}

// hostDir is a new folder on the host for a hostPath volume, removed when t ends (t.TempDir's
// parent is closed to the pods' user).
func hostDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bk-operator-e2e-host-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// hostPathEnvironment runs the local job image with the host's path hostPath mounted in
// the command container as m says; hostPath needs allowPrivileged.
func hostPathEnvironment(name, hostPath string, m corev1.VolumeMount) *bkv1.BuildEnvironment {
	return gen.BuildEnvironment(name,
		gen.SetBuildEnvironmentImage(images.JobImage),
		gen.SetBuildEnvironmentImagePullPolicy(corev1.PullNever),
		gen.SetBuildEnvironmentAllowPrivileged(true),
		gen.AddBuildEnvironmentVolume(corev1.Volume{Name: m.Name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: hostPath},
		}}, m))
}
