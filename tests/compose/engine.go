package compose

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Engine is a Docker engine of its own: a containerd and a dockerd started by hand, with all
// their state, sockets and pidfiles in one folder, so that it leaves alone whatever else runs
// on the machine (a local Kubernetes node's containerd among it). It has no bridge and
// changes no iptables rules or sysctls: its containers use the host's network or none.
type Engine struct {
	// Dir holds everything the engine writes.
	Dir string
	// Host is its DOCKER_HOST, unix://<Dir>/docker.sock.
	Host string

	containerd, dockerd *exec.Cmd
	// made are the folders outside Dir that dockerd creates whatever its flags say (it looks
	// for plugins in /run/docker/plugins); Stop removes those that did not exist before.
	// containerd's shims also keep their sockets in /run/containerd/s, whatever containerd's
	// flags say: that folder is left alone, since a Kubernetes node's shims may use it too.
	made []string
}

// sharedDirs are the folders outside Dir that dockerd creates and nothing else uses.
var sharedDirs = []string{"/run/docker", "/run/docker/plugins"}

// maxSocketPath keeps the engine's unix sockets under the kernel's 108-byte limit.
const maxSocketPath = 100

// StartEngine starts containerd and dockerd with their state in dir (created; Stop removes
// it) and waits until dockerd answers. Its error says why no engine could start.
func StartEngine(ctx context.Context, dir string) (*Engine, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("dockerd needs root, and this runs as uid " + strconv.Itoa(os.Geteuid()))
	}
	for _, prog := range []string{"dockerd", "containerd", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(prog); err != nil {
			return nil, fmt.Errorf("%s is not installed (apt-get install docker.io): %w", prog, err)
		}
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if n := len(dir + "/containerd/containerd.sock.ttrpc"); n > maxSocketPath {
		return nil, fmt.Errorf("the engine folder %s is too deep for unix sockets (%d bytes, at most %d): use a shorter path", dir, n, maxSocketPath)
	}
	e := &Engine{Dir: dir, Host: "unix://" + filepath.Join(dir, "docker.sock")}
	for _, d := range sharedDirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			e.made = append(e.made, d)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "containerd"), 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := e.start(ctx); err != nil {
		stopErr := e.Stop()
		return nil, errors.Join(err, stopErr)
	}
	return e, nil
}

func (e *Engine) start(ctx context.Context) error {
	cdir := filepath.Join(e.Dir, "containerd")
	sock := filepath.Join(cdir, "containerd.sock")
	// The CRI plugin is off: this containerd serves dockerd only, never a kubelet.
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = %q
`, filepath.Join(cdir, "root"), filepath.Join(cdir, "state"), sock, sock+".ttrpc", filepath.Join(cdir, "debug.sock"))
	if err := os.WriteFile(filepath.Join(cdir, "config.toml"), []byte(config), 0o600); err != nil {
		return fmt.Errorf("writing the containerd config: %w", err)
	}
	var err error
	e.containerd, err = e.spawn("containerd", "--config", filepath.Join(cdir, "config.toml"))
	if err != nil {
		return err
	}
	if err := e.waitFor(ctx, e.containerd, 20*time.Second, func() bool { return dial(sock) == nil }); err != nil {
		return fmt.Errorf("containerd did not start: %w", err)
	}
	// dockerd writes its identity key to /etc/docker unless its config file says otherwise;
	// its own config file also keeps it from reading the host's /etc/docker/daemon.json.
	dcfg, err := json.Marshal(map[string]string{"deprecated-key-path": filepath.Join(e.Dir, "key.json")})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(e.Dir, "daemon.json"), dcfg, 0o600); err != nil {
		return fmt.Errorf("writing the dockerd config: %w", err)
	}
	e.dockerd, err = e.spawn("dockerd",
		"--config-file="+filepath.Join(e.Dir, "daemon.json"),
		// Without --containerd, dockerd would use a containerd at /run/containerd/containerd.sock,
		// which is the local Kubernetes node's when it runs.
		"--containerd="+sock,
		"--data-root="+filepath.Join(e.Dir, "data"),
		"--exec-root="+filepath.Join(e.Dir, "exec"),
		"--pidfile="+filepath.Join(e.Dir, "dockerd.pid"),
		"-H", e.Host,
		// No docker0 bridge, no NAT or filter rules, no ip_forward: the machine's network
		// stays as it is (a Kubernetes node may own it). Containers get the host's network.
		"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--userland-proxy=false",
	)
	if err != nil {
		return err
	}
	if err := e.waitFor(ctx, e.dockerd, 60*time.Second, e.ping); err != nil {
		return fmt.Errorf("dockerd did not start: %w", err)
	}
	return nil
}

// spawn starts a daemon in its own process group, its output in <Dir>/<name>.log, killed if
// this process dies first.
func (e *Engine) spawn(name string, args ...string) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(e.Dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("creating the %s log: %w", name, err)
	}
	defer func() { _ = logf.Close() }()
	cmd := exec.Command(name, args...)
	cmd.Dir = e.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	// Reap it as soon as it exits, so waitFor sees an early exit.
	go func() { _ = cmd.Wait() }()
	return cmd, nil
}

// waitFor polls ready until it holds, the daemon exits (the error quotes its log) or the
// time is up.
func (e *Engine) waitFor(ctx context.Context, cmd *exec.Cmd, limit time.Duration, ready func() bool) error {
	name := filepath.Base(cmd.Path)
	deadline := time.Now().Add(limit)
	for {
		if ready() {
			return nil
		}
		if !alive(cmd.Process.Pid) {
			return fmt.Errorf("%s exited: %s", name, e.logTail(name))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %s", name, limit, e.logTail(name))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logTail is the last lines of a daemon's log that say something went wrong.
func (e *Engine) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(e.Dir, name+".log"))
	var bad []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "level=fatal") || strings.Contains(l, "level=error") || !strings.Contains(l, "level=") {
			bad = append(bad, l)
		}
	}
	if len(bad) > 5 {
		bad = bad[len(bad)-5:]
	}
	if len(bad) == 0 {
		return "its log (" + filepath.Join(e.Dir, name+".log") + ") has no error"
	}
	return strings.Join(bad, "\n")
}

func (e *Engine) ping() bool {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", strings.TrimPrefix(e.Host, "unix://"))
		},
	}}
	resp, err := c.Get("http://docker/_ping")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Env is the environment for docker and docker-compose to use this engine.
func (e *Engine) Env() []string {
	return append(os.Environ(), "DOCKER_HOST="+e.Host)
}

// Stop ends the engine and everything it started (containers, their shims), unmounts what it
// mounted and removes its folder and the shared folders it created.
func (e *Engine) Stop() error {
	var errs []error
	// dockerd stops its containers when it gets SIGTERM (10 s each, then SIGKILL).
	if e.dockerd != nil {
		errs = append(errs, stop(e.dockerd.Process.Pid, 40*time.Second))
	}
	// Shims (and their containers) outlive a dockerd killed before it could stop them; they
	// name this engine's containerd socket in their arguments.
	for _, pid := range processesUnder(e.Dir) {
		if e.containerd == nil || pid != e.containerd.Process.Pid {
			killTree(pid)
		}
	}
	if e.containerd != nil {
		errs = append(errs, stop(e.containerd.Process.Pid, 20*time.Second))
	}
	if left := processesUnder(e.Dir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes %v of the engine in %s did not end", left, e.Dir))
	}
	errs = append(errs, unmountUnder(e.Dir))
	if err := os.RemoveAll(e.Dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", e.Dir, err))
	}
	// Deepest first; a folder something else has put files in since is not empty, and stays.
	for i := len(e.made) - 1; i >= 0; i-- {
		_ = os.Remove(e.made[i])
	}
	return errors.Join(errs...)
}

// CleanStale removes what engines left in parent's folders named prefix<pid> when the
// process <pid> that started them no longer runs (a test killed before its cleanup could
// run: its daemons die with it, but containers and their shims do not): it kills those
// processes, unmounts and removes the folders.
func CleanStale(parent, prefix string) error {
	entries, err := os.ReadDir(parent)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("reading %s: %w", parent, err)
	}
	var errs []error
	for _, en := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(en.Name(), prefix))
		if !en.IsDir() || !strings.HasPrefix(en.Name(), prefix) || err != nil || alive(pid) {
			continue
		}
		dir := filepath.Join(parent, en.Name())
		for _, p := range processesUnder(dir) {
			killTree(p)
		}
		errs = append(errs, unmountUnder(dir))
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// stop sends SIGTERM to pid, and SIGKILL after grace.
func stop(pid int, grace time.Duration) error {
	if !alive(pid) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50 && alive(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if alive(pid) {
		return fmt.Errorf("process %d did not end after SIGKILL", pid)
	}
	return nil
}

// alive says whether pid runs (a zombie, ended but not yet reaped, does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// processesUnder lists the processes with an argument that names a path in dir: the engine's
// daemons and the shims of its containers.
func processesUnder(dir string) []int {
	var pids []int
	for pid := range processes() {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil || !alive(pid) {
			continue
		}
		if strings.Contains(string(b), dir+"/") {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

// processes maps every process but this one to its parent.
func processes() map[int]int {
	entries, _ := os.ReadDir("/proc")
	parents := map[int]int{}
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", en.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		parents[pid] = ppid
	}
	return parents
}

// killTree kills pid and every process below it, children first so that none is left
// behind under a new parent (a shim's containers outlive a shim killed alone).
func killTree(pid int) {
	parents := processes()
	var walk func(int)
	walk = func(p int) {
		for child, parent := range parents {
			if parent == p {
				walk(child)
			}
		}
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	walk(pid)
	for i := 0; i < 50 && alive(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// unmountUnder detaches every mount below dir (dockerd leaves its netns/default bind mount
// behind), deepest first.
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func dial(sock string) error {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// Load runs `docker load -i` for each tarball, with env (DOCKER_HOST in it names the engine).
func Load(ctx context.Context, env []string, tarballs ...string) error {
	for _, t := range tarballs {
		cmd := exec.CommandContext(ctx, "docker", "load", "-i", t)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("docker load -i %s: %w\n%s", t, err, out)
		}
	}
	return nil
}
