package images

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/image"
)

// Base is what every image gets: users (among them buildkite, uid 1000, the job pods' user,
// which ssh must find in /etc/passwd), a sticky /tmp, /workspace, a home for root and the
// host's CA bundle (so HTTPS clients in the image trust what the host trusts).
func Base() []File {
	files := []File{
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nbuildkite:x:1000:1000:buildkite:/workspace:/bin/sh\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnogroup:x:65534:\nbuildkite:x:1000:\n")},
		{Path: "/etc/nsswitch.conf", Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
		{Path: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
		{Path: "/workspace", Dir: true, Mode: 0o777},
		{Path: "/root", Dir: true, Mode: 0o700},
	}
	const bundle = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(bundle); err == nil {
		files = append(files, File{Path: bundle, Source: bundle, Mode: 0o644})
	}
	return files
}

// Busybox is the static busybox at /bin/busybox with a symbolic link for every applet it
// lists (sh, ls, cat, sleep, ...).
func Busybox(ctx context.Context) ([]File, error) {
	bin, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox not found: install the busybox-static package (make node-deps): %w", err)
	}
	if err := image.RequireStatic(bin); err != nil {
		return nil, fmt.Errorf("%w: install the busybox-static package (make node-deps)", err)
	}
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets: %w", err)
	}
	files := []File{{Path: "/bin/busybox", Source: bin, Mode: 0o755}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		applet := strings.TrimSpace(sc.Text())
		if applet == "" || applet == "bin/busybox" {
			continue
		}
		files = append(files, File{Path: "/" + applet, Link: "/bin/busybox"})
	}
	return files, nil
}

// Git is the host's git with its helpers from /usr/lib/git-core, its templates, and the
// shared libraries every ELF file among them needs (Debian's git is dynamically linked).
// Helpers written in Perl or Python are copied but will not run without an interpreter;
// clone, fetch and checkout over local paths and file:// only use git itself.
func Git(ctx context.Context) ([]File, error) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		return nil, fmt.Errorf("git not found on the host: apt-get install git: %w", err)
	}
	const core = "/usr/lib/git-core"
	files := []File{}
	var elfs []string
	err = filepath.WalkDir(core, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			files = append(files, File{Path: p, Dir: true})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			files = append(files, File{Path: p, Link: target})
		case d.Type().IsRegular():
			files = append(files, File{Path: p, Source: p})
			if isELF(p) {
				elfs = append(elfs, p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("copying %s: %w", core, err)
	}
	// /usr/bin/git is the same program as git-core/git: a link keeps the image smaller.
	files = append(files, File{Path: "/usr/bin/git", Link: core + "/git"})
	elfs = append(elfs, gitBin)
	const templates = "/usr/share/git-core/templates"
	_ = filepath.WalkDir(templates, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, File{Path: p, Source: p})
		}
		return nil
	})
	libs, err := Libraries(ctx, elfs...)
	if err != nil {
		return nil, err
	}
	return append(files, libs...), nil
}

// SSH is the host's ssh client, /usr/bin/ssh, and the shared libraries it needs: git runs
// it for repositories reached over SSH (GIT_SSH_COMMAND, which a BuildEnvironment's
// spec.git.sshSecret sets). Without an /etc/ssh/ssh_config, ssh takes its defaults. It looks
// its user up in /etc/passwd ("No user exists for uid 1000" otherwise), which Base writes.
// ssh-keyscan is left out: with an SSH key the agent's keyscan is off.
func SSH(ctx context.Context) ([]File, error) {
	const bin = "/usr/bin/ssh"
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("the ssh client is not on the host: apt-get install openssh-client (make node-deps): %w", err)
	}
	libs, err := Libraries(ctx, bin)
	if err != nil {
		return nil, err
	}
	return append([]File{{Path: bin, Source: bin, Mode: 0o755}}, libs...), nil
}

// Libraries lists the shared libraries (and the dynamic loader) that ldd names for the
// given programs, at the paths the programs look for them.
func Libraries(ctx context.Context, programs ...string) ([]File, error) {
	seen := map[string]bool{}
	var files []File
	for _, prog := range programs {
		out, err := exec.CommandContext(ctx, "ldd", prog).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "not a dynamic executable") {
				continue
			}
			return nil, fmt.Errorf("ldd %s: %v: %s", prog, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			lib := libPath(line)
			if lib == "" || seen[lib] {
				continue
			}
			seen[lib] = true
			files = append(files, File{Path: lib, Source: lib, Mode: 0o755})
		}
	}
	return files, nil
}

// libPath takes the library path out of one ldd line:
// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
func libPath(line string) string {
	line = strings.TrimSpace(line)
	if i := strings.Index(line, "=>"); i >= 0 {
		line = strings.TrimSpace(line[i+2:])
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || !strings.HasPrefix(fields[0], "/") {
		return "" // linux-vdso.so.1 and friends live in the kernel
	}
	return fields[0]
}

func isELF(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}
