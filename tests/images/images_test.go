package images

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/image"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

func TestLibPath(t *testing.T) {
	cases := []struct{ in, want string }{
		{"\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)", "/lib/x86_64-linux-gnu/libz.so.1"},
		{"\t/lib64/ld-linux-x86-64.so.2 (0x00007f)", "/lib64/ld-linux-x86-64.so.2"},
		{"\tlinux-vdso.so.1 (0x00007ffd)", ""},
		{"", ""},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, libPath(tc.in), tc.in)
	}
}

func TestJobImageHasBusyboxGitAndAgent(t *testing.T) {
	agent := testkit.RequireAgent(t)
	out, err := BuildJob(context.Background(), t.TempDir(), agent)
	require.NoError(t, err)
	tag, err := name.NewTag(JobImage)
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(out, &tag)
	require.NoError(t, err)
	hdrs := map[string]bool{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		hdrs[strings.TrimSuffix(h.Name, "/")] = true
	}
	for _, want := range []string{"bin/busybox", "bin/sh", "usr/bin/git", "usr/lib/git-core/git", "usr/lib/git-core/git-upload-pack",
		"usr/bin/ssh", "usr/local/bin/buildkite-agent", "lib64/ld-linux-x86-64.so.2", "etc/ssl/certs/ca-certificates.crt", "workspace", "tmp"} {
		assert.Contains(t, hdrs, want)
	}
}

func TestOperatorImageIsTheProductImage(t *testing.T) {
	out, err := BuildAgentd(context.Background(), t.TempDir())
	require.NoError(t, err)
	img := readTarball(t, out, AgentdImage)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "65532:65532", cf.Config.User)
	assert.Equal(t, []string{image.AgentdPath}, cf.Config.Entrypoint)
	hdrs := entries(t, img)
	assert.Contains(t, hdrs, "usr/local/bin/agentd-supervise")
	assert.NotContains(t, hdrs, "usr/local/bin/buildkite-agent", "job pods get the agent from the agent's image")
}

// readTarball reads the image ref from a tarball Build wrote.
func readTarball(t *testing.T, path, ref string) v1.Image {
	t.Helper()
	tag, err := name.NewTag(ref)
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(path, &tag)
	require.NoError(t, err)
	return img
}

// entries are the headers of img's flattened filesystem, by path.
func entries(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	hdrs := map[string]*tar.Header{}
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs
		}
		require.NoError(t, err)
		hdrs[strings.TrimSuffix(h.Name, "/")] = h
	}
}

// The agent image the local node gets is tagged as the chart's and the operator's default
// agent image, of the release the Makefile builds (testkit checks AgentVersion against the
// Makefile), so the tests install with the defaults and run the agent the operator is
// written for.
func TestAgentImageIsTheDefault(t *testing.T) {
	assert.Equal(t, podbuilder.DefaultAgentImage, AgentImage)
	assert.Equal(t, "buildkite/agent:"+strings.TrimPrefix(testkit.AgentVersion, "v"), AgentImage, "the agent image is of the release the tests build")
}

// The agent image holds what job pods copy, where Buildkite's image has it, and the shell
// and cp the copy needs; run as a job pod runs it (chrooted into the image's files, as uid
// 1000, with the pod builder's very command), it puts a buildkite-agent that runs into the
// bin volume.
func TestAgentImageCopiesTheAgent(t *testing.T) {
	agent := testkit.RequireAgent(t)
	out, err := BuildAgent(context.Background(), t.TempDir(), agent)
	require.NoError(t, err)
	img := readTarball(t, out, AgentImage)
	hdrs := entries(t, img)
	for _, want := range []string{"bin/busybox", "bin/sh", "bin/cp", "usr/local/bin/buildkite-agent"} {
		assert.Contains(t, hdrs, want)
	}
	assert.Equal(t, int64(0o755), hdrs["usr/local/bin/buildkite-agent"].Mode)

	if os.Geteuid() != 0 {
		t.Skip("running the copy in the image's files needs root (chroot)")
	}
	root := t.TempDir()
	require.NoError(t, os.Chmod(root, 0o755))
	extract(t, img, root)
	// The bin volume: an emptyDir, which anyone may write.
	bin := filepath.Join(root, strings.TrimPrefix(podcontract.BinDir, "/"))
	require.NoError(t, os.MkdirAll(bin, 0o777))
	require.NoError(t, os.Chmod(bin, 0o777))

	pod, err := podbuilder.Build(agentJob(), agentEnv(), podbuilder.Options{PodSecurity: podbuilder.PodSecurityRestricted})
	require.NoError(t, err)
	var install *corev1.Container
	for i, c := range pod.Spec.InitContainers {
		if c.Name == podcontract.AgentInstallContainer {
			install = &pod.Spec.InitContainers[i]
		}
	}
	require.NotNil(t, install)
	assert.Equal(t, AgentImage, install.Image)
	uid := uint32(*pod.Spec.SecurityContext.RunAsUser)

	run := func(argv ...string) (string, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		cmd.Dir = "/"
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	got, err := run(install.Command...)
	require.NoError(t, err, "%s", got)
	got, err = run(podcontract.AgentPath, "--version")
	require.NoError(t, err, "%s", got)
	assert.Contains(t, got, "buildkite-agent version "+strings.TrimPrefix(testkit.AgentVersion, "v"))

	// An image without the agent says so, and what to use instead.
	require.NoError(t, os.Remove(filepath.Join(root, strings.TrimPrefix(podcontract.AgentImageBinaryPath, "/"))))
	got, err = run(install.Command...)
	require.Error(t, err)
	assert.Contains(t, got, "the agent image has no buildkite-agent at /usr/local/bin/buildkite-agent: use buildkite/agent, or an image built from it")
}

// extract writes img's files under root, as a container runtime unpacks them.
func extract(t *testing.T, img v1.Image, root string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		require.NoError(t, err)
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(p, os.FileMode(h.Mode).Perm()|0o700))
			require.NoError(t, os.Chmod(p, os.FileMode(h.Mode).Perm()))
		case tar.TypeSymlink:
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.Symlink(h.Linkname, p))
		case tar.TypeReg:
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			require.NoError(t, err)
			_, err = io.Copy(f, tr)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			require.NoError(t, os.Chmod(p, os.FileMode(h.Mode).Perm()))
		}
	}
}

func agentJob() *bkv1.BuildJob {
	job := &bkv1.BuildJob{}
	job.Name, job.Namespace = "copy", "ci"
	job.Spec.JobID = "0190b8c4-1f2a-4c3d-9e8f-0123456789ab"
	job.Spec.TokenSecretRef.Name = "copy-token"
	return job
}

func agentEnv() *bkv1.BuildEnvironment {
	env := &bkv1.BuildEnvironment{}
	env.Name, env.Namespace = "any", "ci"
	env.Spec.Image = "golang:1.26"
	return env
}
