package images

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/image"
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
	agent := AgentBinary()
	if _, err := os.Stat(agent); err != nil {
		t.Fatalf("the job image needs buildkite-agent at %s: run `make agent-binary`", agent)
	}
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
		"usr/local/bin/buildkite-agent", "lib64/ld-linux-x86-64.so.2", "etc/ssl/certs/ca-certificates.crt", "workspace", "tmp"} {
		assert.Contains(t, hdrs, want)
	}
}

func TestOperatorImageIsTheProductImage(t *testing.T) {
	if _, err := os.Stat(AgentBinary()); err != nil {
		t.Fatalf("the operator image needs buildkite-agent at %s: run `make agent-binary`", AgentBinary())
	}
	out, err := BuildAgentd(context.Background(), t.TempDir())
	require.NoError(t, err)
	tag, err := name.NewTag(AgentdImage)
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(out, &tag)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "65532:65532", cf.Config.User)
	assert.Equal(t, []string{image.AgentdPath}, cf.Config.Entrypoint)
}
