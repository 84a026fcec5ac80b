package image

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readImage reads a tarball WriteTarball wrote, as a container runtime would.
func readImage(t *testing.T, path, ref string) v1.Image {
	t.Helper()
	tag, err := name.NewTag(ref)
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(path, &tag)
	require.NoError(t, err)
	return img
}

// filesOf returns every entry of the image's flattened filesystem with its content.
func filesOf(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		// Directories are keyed without their trailing slash, which flattening may drop.
		n := strings.TrimSuffix(h.Name, "/")
		hdrs[n], data[n] = h, b
	}
}

func TestBuildAndWriteTarball(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tool")
	require.NoError(t, os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o755))
	spec := Spec{
		Files: []File{
			{Path: "/usr/local/bin/tool", Source: src},
			{Path: "/bin/alias", Link: "/usr/local/bin/tool"},
			{Path: "etc/motd", Data: []byte("hello")},
			{Path: "/tmp", Dir: true, Mode: 0o777 | os.ModeSticky},
			{Path: "/home/app", Dir: true, Mode: 0o700, UID: 1234, GID: 1234},
		},
		Entrypoint: []string{"/usr/local/bin/tool"},
		WorkingDir: "/workspace",
		User:       "1234:1234",
		Labels:     map[string]string{"org.opencontainers.image.version": "v1"},
	}
	img, err := Build(context.Background(), spec)
	require.NoError(t, err)
	out := filepath.Join(dir, "out", TarName("example/thing:v1"))
	require.NoError(t, WriteTarball(img, "example/thing:v1", out))
	assert.Equal(t, filepath.Join(dir, "out", "example_thing_v1.tar"), out)

	got := readImage(t, out, "example/thing:v1")
	cf, err := got.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, spec.Entrypoint, cf.Config.Entrypoint)
	assert.Equal(t, "/workspace", cf.Config.WorkingDir)
	assert.Equal(t, "1234:1234", cf.Config.User)
	assert.Equal(t, []string{DefaultPath}, cf.Config.Env, "an image that sets no env gets a PATH")
	assert.Equal(t, "v1", cf.Config.Labels["org.opencontainers.image.version"])
	layers, err := got.Layers()
	require.NoError(t, err)
	assert.Len(t, layers, 1)

	hdrs, content := filesOf(t, got)
	cases := []struct {
		name     string
		typ      byte
		mode     int64
		uid      int
		content  string
		linkname string
	}{
		{name: "usr/local/bin/tool", typ: tar.TypeReg, mode: 0o755, content: "#!/bin/sh\necho hi\n"},
		{name: "usr/local/bin", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/alias", typ: tar.TypeSymlink, mode: 0o777, linkname: "/usr/local/bin/tool"},
		{name: "etc/motd", typ: tar.TypeReg, mode: 0o644, content: "hello"},
		{name: "tmp", typ: tar.TypeDir, mode: 0o1777},
		{name: "home/app", typ: tar.TypeDir, mode: 0o700, uid: 1234},
	}
	for _, tc := range cases {
		h, ok := hdrs[tc.name]
		if !assert.True(t, ok, "missing %s", tc.name) {
			continue
		}
		assert.Equal(t, tc.typ, h.Typeflag, tc.name)
		assert.Equal(t, tc.mode, h.Mode, tc.name)
		assert.Equal(t, tc.uid, h.Uid, tc.name)
		assert.Equal(t, tc.content, string(content[tc.name]), tc.name)
		assert.Equal(t, tc.linkname, h.Linkname, tc.name)
	}

	// The same files give the same image: the digest changes only with the content.
	again, err := Build(context.Background(), spec)
	require.NoError(t, err)
	d1, err := img.Digest()
	require.NoError(t, err)
	d2, err := again.Digest()
	require.NoError(t, err)
	assert.Equal(t, d1, d2)
}

func TestBuildRejectsAMissingSource(t *testing.T) {
	_, err := Build(context.Background(), Spec{Files: []File{{Path: "/a", Source: "/does/not/exist"}}})
	require.ErrorContains(t, err, "/does/not/exist")
}

// staticProgram builds a tiny static Go program, standing in for agentd and agentd-supervise.
func staticProgram(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.25\n"), 0o644))
	bin := filepath.Join(dir, "tiny")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func TestOperatorImage(t *testing.T) {
	bin := staticProgram(t)
	bundle := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(bundle, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644))
	spec, err := Operator(context.Background(), OperatorOptions{Agentd: bin, Supervisor: bin, Version: "v1.2.3", Revision: "abc123", CABundle: bundle})
	require.NoError(t, err)
	img, err := Build(context.Background(), spec)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "65532:65532", cf.Config.User, "the operator runs as a fixed non-root uid (runAsNonRoot needs a number)")
	assert.Equal(t, []string{AgentdPath}, cf.Config.Entrypoint)
	assert.Equal(t, "v1.2.3", cf.Config.Labels["org.opencontainers.image.version"])
	assert.Equal(t, "abc123", cf.Config.Labels["org.opencontainers.image.revision"])
	assert.Equal(t, SourceURL, cf.Config.Labels["org.opencontainers.image.source"])

	hdrs, content := filesOf(t, img)
	for _, p := range []string{"usr/local/bin/agentd", "usr/local/bin/agentd-supervise"} {
		require.Contains(t, hdrs, p)
		assert.Equal(t, int64(0o755), hdrs[p].Mode, p)
	}
	assert.NotContains(t, hdrs, "usr/local/bin/buildkite-agent", "job pods get the agent from the agent's image")
	assert.Equal(t, "-----BEGIN CERTIFICATE-----\n", string(content["etc/ssl/certs/ca-certificates.crt"]))
	assert.Contains(t, string(content["etc/passwd"]), "nonroot:x:65532:65532:")
	assert.NotContains(t, hdrs, "bin/sh", "the operator image has no shell")
}

func TestOperatorImageRefusesDynamicBinaries(t *testing.T) {
	sh, err := exec.LookPath("git") // dynamically linked on Debian
	require.NoError(t, err)
	_, err = Operator(context.Background(), OperatorOptions{Agentd: sh, Supervisor: sh})
	require.ErrorContains(t, err, "dynamically linked")
	require.ErrorContains(t, err, "CGO_ENABLED=0")
}
