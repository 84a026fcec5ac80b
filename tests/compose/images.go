// Package compose builds the images docker-compose.yml runs (the plugin's bats tests and
// lint, the fake Buildkite and a local buildkite-agent) from files on this machine, with
// tests/images and package image, so that `docker compose up` needs neither a registry nor a
// Dockerfile build: load the tarballs with `docker load` and the services start offline.
package compose

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/image"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// The images docker-compose.yml names (with pull_policy: never: nothing is pulled).
const (
	// PluginImage runs the plugin's bats tests and its lint: bash, bats and its libraries,
	// shellcheck, busybox, and the plugin package's Go tests compiled into one program.
	PluginImage = "bk-operator/compose-plugin:dev"
	// AgentImage runs the fake Buildkite and a local buildkite-agent: both static binaries,
	// bash (the agent's shell and the hook's), git, the ssh client and busybox.
	AgentImage = "bk-operator/compose-agent:dev"
)

// Where the images keep what this package adds; docker-compose.yml runs them by name.
const (
	PluginTestPath    = "/usr/local/bin/plugin.test"
	FakeBuildkitePath = "/usr/local/bin/fake-buildkite"
	AgentPath         = "/usr/local/bin/buildkite-agent"
)

// pluginDebs are the Debian packages whose files the plugin image carries (with the shared
// libraries their programs need): what `make test-deps` installs for the plugin's tests.
var pluginDebs = []string{"bash", "bats", "bats-assert", "bats-support", "shellcheck"}

// BuildImages writes PluginImage and AgentImage as `docker save` tarballs into outDir and
// returns their paths. agentBinary is a static buildkite-agent (testkit.AgentBinary() when
// empty: `make agent-binary` builds it).
func BuildImages(ctx context.Context, outDir, agentBinary string) ([]string, error) {
	plugin, err := BuildPluginImage(ctx, outDir)
	if err != nil {
		return nil, err
	}
	agent, err := BuildAgentImage(ctx, outDir, agentBinary)
	if err != nil {
		return nil, err
	}
	return []string{plugin, agent}, nil
}

// BuildPluginImage writes PluginImage into outDir. The Go checks of the plugin (plugin.yml,
// the schema, the README's examples) run as a compiled test program, so the image needs no
// Go toolchain or module download: rebuild it after changing the plugin's Go code.
func BuildPluginImage(ctx context.Context, outDir string) (string, error) {
	files := images.Base()
	bb, err := images.Busybox(ctx)
	if err != nil {
		return "", err
	}
	files = append(files, bb...)
	debs, err := DebFiles(ctx, pluginDebs...)
	if err != nil {
		return "", err
	}
	files = append(files, debs...)
	test := filepath.Join(outDir, "bin", "plugin.test")
	if err := goTestBinary(ctx, "./plugin", test); err != nil {
		return "", err
	}
	files = append(files, images.File{Path: PluginTestPath, Source: test, Mode: 0o755})
	return images.Build(ctx, images.Spec{Name: PluginImage, OutDir: outDir, Spec: image.Spec{
		Files:      files,
		Env:        []string{image.DefaultPath, "HOME=/root"},
		Cmd:        []string{"bats", "plugin/tests"},
		WorkingDir: "/src",
		Labels:     map[string]string{"org.opencontainers.image.title": "buildkite-operator plugin tests (docker-compose.yml)"},
	}})
}

// BuildAgentImage writes AgentImage into outDir: the static buildkite-agent and the fake
// Buildkite (built from this checkout), with what a job's bootstrap runs (bash, git, ssh).
func BuildAgentImage(ctx context.Context, outDir, agentBinary string) (string, error) {
	if agentBinary == "" {
		agentBinary = testkit.AgentBinary()
	}
	if _, err := os.Stat(agentBinary); err != nil {
		return "", fmt.Errorf("buildkite-agent %s not found at %s: run `make agent-binary`: %w", testkit.AgentVersion, agentBinary, err)
	}
	if err := image.RequireStatic(agentBinary); err != nil {
		return "", fmt.Errorf("%w: build it with CGO_ENABLED=0 (make agent-binary does)", err)
	}
	fake := filepath.Join(outDir, "bin", "fake-buildkite")
	if err := images.GoBuildStatic(ctx, "./tests/fakebuildkite/cmd/fake-buildkite", fake); err != nil {
		return "", err
	}
	files := images.Base()
	for _, part := range []func(context.Context) ([]images.File, error){images.Busybox, images.Git, images.SSH, bash} {
		more, err := part(ctx)
		if err != nil {
			return "", err
		}
		files = append(files, more...)
	}
	files = append(files,
		images.File{Path: AgentPath, Source: agentBinary, Mode: 0o755},
		images.File{Path: FakeBuildkitePath, Source: fake, Mode: 0o755},
		// The working tree is mounted into the container, owned by a user the container
		// does not know: git refuses such a repository unless it is marked safe.
		images.File{Path: "/etc/gitconfig", Data: []byte("[safe]\n\tdirectory = *\n")},
		images.File{Path: "/buildkite/builds", Dir: true, Mode: 0o777},
		images.File{Path: "/buildkite/hooks", Dir: true},
		images.File{Path: "/buildkite/plugins", Dir: true, Mode: 0o777},
	)
	return images.Build(ctx, images.Spec{Name: AgentImage, OutDir: outDir, Spec: image.Spec{
		Files: files,
		Env: []string{
			image.DefaultPath,
			"HOME=/root",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
		Cmd: []string{AgentPath, "start"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "buildkite-agent and the fake Buildkite (docker-compose.yml)",
			"org.opencontainers.image.version": strings.TrimPrefix(testkit.AgentVersion, "v"),
		},
	}})
}

func bash(ctx context.Context) ([]images.File, error) { return DebFiles(ctx, "bash") }

// skippedDirs hold a package's documentation, which no image needs.
var skippedDirs = []string{"/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/lintian/", "/usr/share/locale/"}

// DebFiles is every file the installed Debian packages own (as `dpkg-query -L` lists them,
// documentation left out) at the same path, with the shared libraries their programs need.
// A path that is a directory on the host is a directory in the image, even where the host
// has it as a link (Debian's merged /bin -> usr/bin), so that busybox's /bin stays a folder.
func DebFiles(ctx context.Context, pkgs ...string) ([]images.File, error) {
	var files []images.File
	var programs []string
	for _, pkg := range pkgs {
		out, err := exec.CommandContext(ctx, "dpkg-query", "-L", pkg).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("listing the files of the Debian package %s (install it: apt-get install %s, or make test-deps): %v: %s", pkg, pkg, err, strings.TrimSpace(string(out)))
		}
		for _, p := range strings.Split(string(out), "\n") {
			// dpkg-query also prints notes ("diverted by ..."), which do not start with "/".
			if !strings.HasPrefix(p, "/") || p == "/." || skipped(p) {
				continue
			}
			f, program, err := debFile(p)
			if err != nil {
				return nil, fmt.Errorf("package %s: %w", pkg, err)
			}
			files = append(files, f)
			if program {
				programs = append(programs, p)
			}
		}
	}
	libs, err := images.Libraries(ctx, programs...)
	if err != nil {
		return nil, err
	}
	return append(files, libs...), nil
}

func skipped(p string) bool {
	for _, d := range skippedDirs {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}

// debFile is the image entry of one path a package owns, and whether it is a program whose
// libraries the image needs.
func debFile(p string) (images.File, bool, error) {
	st, err := os.Stat(p)
	if err != nil {
		return images.File{}, false, fmt.Errorf("reading %s: %w", p, err)
	}
	if st.IsDir() {
		return images.File{Path: p, Dir: true}, false, nil
	}
	lst, err := os.Lstat(p)
	if err != nil {
		return images.File{}, false, fmt.Errorf("reading %s: %w", p, err)
	}
	if lst.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(p)
		if err != nil {
			return images.File{}, false, fmt.Errorf("reading the link %s: %w", p, err)
		}
		return images.File{Path: p, Link: target}, false, nil
	}
	return images.File{Path: p, Source: p, Mode: st.Mode().Perm()}, st.Mode()&0o111 != 0, nil
}

// goTestBinary compiles a package's tests into one static program (go test -c), which runs
// them with -test.run where there is no Go toolchain.
func goTestBinary(ctx context.Context, pkg, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(out), err)
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-trimpath", "-o", out, pkg)
	cmd.Dir = testkit.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go test -c %s: %w\n%s", pkg, err, b)
	}
	return nil
}
