package images

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// readTar returns every entry of a tarball with its content.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		hdrs[h.Name], data[h.Name] = h, b
	}
}

func TestBuildWritesDockerSaveLayout(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tool")
	require.NoError(t, os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o755))
	spec := Spec{
		Name:   "example/thing:v1",
		OutDir: filepath.Join(dir, "out"),
		Files: append(Base(),
			File{Path: "/usr/local/bin/tool", Source: src},
			File{Path: "/bin/alias", Link: "/usr/local/bin/tool"},
			File{Path: "etc/motd", Data: []byte("hello")},
		),
		Entrypoint: []string{"/usr/local/bin/tool"},
		WorkingDir: "/workspace",
	}
	out, err := Build(context.Background(), spec)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "out", "example_thing_v1.tar"), out)

	f, err := os.Open(out)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	_, files := readTar(t, f)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	require.NoError(t, json.Unmarshal(files["manifest.json"], &manifest))
	require.Len(t, manifest, 1)
	assert.Equal(t, []string{"example/thing:v1"}, manifest[0].RepoTags)
	require.Len(t, manifest[0].Layers, 1)

	var config struct {
		OS     string `json:"os"`
		Config struct {
			Entrypoint []string
			WorkingDir string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	require.NoError(t, json.Unmarshal(files[manifest[0].Config], &config))
	assert.Equal(t, "linux", config.OS)
	assert.Equal(t, spec.Entrypoint, config.Config.Entrypoint)
	assert.Equal(t, "/workspace", config.Config.WorkingDir)
	require.Len(t, config.RootFS.DiffIDs, 1)

	layer := files[manifest[0].Layers[0]]
	hdrs, content := readTar(t, bytesReader(layer))
	cases := []struct {
		name     string
		typ      byte
		mode     int64
		content  string
		linkname string
	}{
		{name: "usr/local/bin/tool", typ: tar.TypeReg, mode: 0o755, content: "#!/bin/sh\necho hi\n"},
		{name: "usr/local/bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/alias", typ: tar.TypeSymlink, mode: 0o777, linkname: "/usr/local/bin/tool"},
		{name: "etc/motd", typ: tar.TypeReg, mode: 0o644, content: "hello"},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: "workspace/", typ: tar.TypeDir, mode: 0o777},
	}
	for _, tc := range cases {
		h, ok := hdrs[tc.name]
		if !assert.True(t, ok, "missing %s", tc.name) {
			continue
		}
		assert.Equal(t, tc.typ, h.Typeflag, tc.name)
		assert.Equal(t, tc.mode, h.Mode, tc.name)
		assert.Equal(t, tc.content, string(content[tc.name]), tc.name)
		assert.Equal(t, tc.linkname, h.Linkname, tc.name)
	}
	assert.Contains(t, string(content["etc/passwd"]), "root:x:0:0:")

	// The same files give the same image: digests only change with content.
	again, err := Build(context.Background(), spec)
	require.NoError(t, err)
	b1, err := os.ReadFile(out)
	require.NoError(t, err)
	b2, err := os.ReadFile(again)
	require.NoError(t, err)
	assert.Equal(t, b1, b2)
}

func TestBuildRejectsIncompleteSpec(t *testing.T) {
	_, err := Build(context.Background(), Spec{Name: "x:y"})
	require.Error(t, err)
	_, err = Build(context.Background(), Spec{Name: "x:y", OutDir: t.TempDir(), Files: []File{{Path: "/a", Source: "/does/not/exist"}}})
	require.ErrorContains(t, err, "/does/not/exist")
}

func TestJobImageHasBusyboxGitAndAgent(t *testing.T) {
	agent := AgentBinary()
	if _, err := os.Stat(agent); err != nil {
		t.Fatalf("the job image needs buildkite-agent at %s: run `make agent-binary`", agent)
	}
	out, err := BuildJob(context.Background(), t.TempDir(), agent)
	require.NoError(t, err)
	f, err := os.Open(out)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	_, files := readTar(t, f)
	var manifest []struct{ Layers []string }
	require.NoError(t, json.Unmarshal(files["manifest.json"], &manifest))
	hdrs, _ := readTar(t, bytesReader(files[manifest[0].Layers[0]]))
	for _, want := range []string{"bin/busybox", "bin/sh", "usr/bin/git", "usr/lib/git-core/git", "usr/lib/git-core/git-upload-pack",
		"usr/local/bin/buildkite-agent", "lib64/ld-linux-x86-64.so.2", "etc/ssl/certs/ca-certificates.crt", "workspace/", "tmp/"} {
		assert.Contains(t, hdrs, want)
	}
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
