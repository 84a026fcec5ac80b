package cluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// journal is what the node changed on the host, written to the state dir before each
// change is made, so that Down (even after a crash) undoes exactly that and nothing else.
type journal struct {
	path string

	// Processes the node started, with their start time so a reused pid is never signalled.
	Processes []procRecord `json:"processes"`
	// Sysctls holds the values before the node started (the kubelet and the bridge plugin
	// change some of them).
	Sysctls map[string]string `json:"sysctls"`
	// Chains holds, per "<binary>/<table>", the chains that existed before.
	Chains map[string][]string `json:"chains"`
	// Paths are host paths outside the state dir that did not exist before: the kubelet and
	// containerd create them whatever they are told.
	Paths []string `json:"paths"`
	// Netns are the network namespaces in /run/netns before the node started.
	Netns []string `json:"netns"`
	// Cgroups are the kubelet's cgroup roots that did not exist before.
	Cgroups []string `json:"cgroups"`
	// Links are network interfaces the node created.
	Links []string `json:"links"`
	// HostsLine is the line added to /etc/hosts, if one was.
	HostsLine string `json:"hostsLine,omitempty"`
	// Addresses of the running node, for `status` and for reattaching.
	APIServer string `json:"apiServer,omitempty"`
	Hostname  string `json:"hostname,omitempty"`
}

type procRecord struct {
	Name  string `json:"name"`
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

func loadJournal(path string) (*journal, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	j := &journal{path: path}
	if err := json.Unmarshal(data, j); err != nil {
		return nil, fmt.Errorf("reading %s: %w (delete it only if no node is running)", path, err)
	}
	return j, nil
}

func (j *journal) save() error {
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	tmp := j.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return fmt.Errorf("writing %s: %w", j.path, err)
	}
	return nil
}

// The sysctls the kubelet (container manager), the CNI bridge plugin and the node itself
// (startServices) set.
var watchedSysctls = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward",
	"net/ipv6/conf/all/forwarding",
	"net/ipv4/conf/all/route_localnet",
	bridgeNetfilter,
}

func readSysctls() map[string]string {
	out := map[string]string{}
	for _, k := range watchedSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			out[k] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// restoreSysctls writes back each recorded value that changed.
func restoreSysctls(saved map[string]string) []error {
	var errs []error
	now := readSysctls()
	keys := make([]string, 0, len(saved))
	for k := range saved {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if now[k] == saved[k] {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(saved[k]+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s to %s: %w", k, saved[k], err))
		}
	}
	return errs
}

var (
	iptablesBinaries = []string{"iptables", "ip6tables"}
	iptablesTables   = []string{"filter", "nat", "mangle"}
)

// listChains returns the chains of one table, built-in ones included.
func listChains(bin, table string) ([]string, error) {
	out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -t %s -S: %w", bin, table, err)
	}
	var chains []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "-N" || f[0] == "-P") {
			chains = append(chains, f[1])
		}
	}
	return chains, nil
}

func snapshotChains() map[string][]string {
	out := map[string][]string{}
	for _, bin := range iptablesBinaries {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		for _, t := range iptablesTables {
			if chains, err := listChains(bin, t); err == nil {
				out[bin+"/"+t] = chains
			}
		}
	}
	return out
}

// ownedChain says whether a chain is one the kubelet or the CNI plugins make; only those
// are removed, and only when they did not exist before the node started.
func ownedChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// removeNewChains deletes the rules that jump to chains created since the snapshot, then
// the chains themselves.
func removeNewChains(before map[string][]string) []error {
	var errs []error
	for key, old := range before {
		bin, table, _ := strings.Cut(key, "/")
		existed := map[string]bool{}
		for _, c := range old {
			existed[c] = true
		}
		chains, err := listChains(bin, table)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var added []string
		for _, c := range chains {
			if !existed[c] && ownedChain(c) {
				added = append(added, c)
			}
		}
		if len(added) == 0 {
			continue
		}
		isAdded := map[string]bool{}
		for _, c := range added {
			isAdded[c] = true
		}
		out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Rules in chains that stay but jump into removed chains go first.
		for _, line := range strings.Split(string(out), "\n") {
			f := ruleFields(line)
			if len(f) < 2 || f[0] != "-A" || isAdded[f[1]] {
				continue
			}
			for i := 0; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && isAdded[f[i+1]] {
					args := append([]string{"-w", "-t", table, "-D"}, f[1:]...)
					if b, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
						errs = append(errs, fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, b))
					}
					break
				}
			}
		}
		for _, c := range added {
			_ = exec.Command(bin, "-w", "-t", table, "-F", c).Run()
		}
		for _, c := range added {
			if b, err := exec.Command(bin, "-w", "-t", table, "-X", c).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -X %s: %v: %s", bin, table, c, err, b))
			}
		}
	}
	return errs
}

// mountsUnder lists mount points at or below any of the prefixes, deepest first.
// ruleFields splits a line of `iptables -S` into the arguments that made it: as a shell
// would, since a rule's comment is printed in double quotes ("kubernetes service portals",
// kube-proxy's) and must reach `iptables -D` as one argument without them.
func ruleFields(line string) []string {
	var (
		fields []string
		cur    strings.Builder
		inWord bool
		quoted bool
	)
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quoted && ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case ch == '"':
			quoted, inWord = !quoted, true
		case !quoted && (ch == ' ' || ch == '\t'):
			if inWord {
				fields = append(fields, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		fields = append(fields, cur.String())
	}
	return fields
}

func mountsUnder(prefixes ...string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, p := range prefixes {
			if p != "" && (mp == p || strings.HasPrefix(mp, p+"/")) {
				out = append(out, mp)
				break
			}
		}
	}
	// Deepest first, and the later of two mounts on one point first.
	sort.SliceStable(out, func(a, b int) bool { return len(out[a]) > len(out[b]) })
	return out, sc.Err()
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts everything at or below the prefixes, repeating while a pass makes
// progress (a bind mount of a folder onto itself shows up twice).
func unmountAll(prefixes ...string) []error {
	var last []error
	for pass := 0; pass < 5; pass++ {
		mps, err := mountsUnder(prefixes...)
		if err != nil {
			return []error{err}
		}
		if len(mps) == 0 {
			return nil
		}
		last = nil
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
				if err2 := syscall.Unmount(mp, syscall.MNT_DETACH); err2 != nil && !errors.Is(err2, syscall.EINVAL) {
					last = append(last, fmt.Errorf("unmounting %s: %w", mp, err2))
				}
			}
		}
	}
	if mps, _ := mountsUnder(prefixes...); len(mps) > 0 {
		last = append(last, fmt.Errorf("still mounted: %s", strings.Join(mps, ", ")))
	}
	return last
}

func listNetns() []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// cgroupRoots are the kubelet's top cgroups in every mounted hierarchy (cgroupfs driver).
func cgroupRoots() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name(), "kubepods"))
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		out = append(out, "/sys/fs/cgroup/kubepods")
	}
	return out
}

// cgroupProcs lists the processes in a cgroup tree.
func cgroupProcs(root string) []int {
	var pids []int
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, s := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(s); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removeCgroupTree removes a cgroup folder and its children, deepest first (rmdir is the
// only way to delete a cgroup, and it fails while processes remain).
func removeCgroupTree(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var firstErr error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) && firstErr == nil {
			firstErr = fmt.Errorf("removing cgroup %s: %w", dirs[i], err)
		}
	}
	return firstErr
}

// hostsFile is /etc/hosts; tests point it elsewhere.
var hostsFile = "/etc/hosts"

// hostsHasLoopbackName says whether /etc/hosts maps name to 127.0.0.1.
func hostsHasLoopbackName(name string) bool {
	b, err := os.ReadFile(hostsFile)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "127.0.0.1" {
			continue
		}
		for _, n := range f[1:] {
			if strings.EqualFold(n, name) {
				return true
			}
		}
	}
	return false
}

func appendHostsLine(line string) error {
	f, err := os.OpenFile(hostsFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("adding %q to /etc/hosts: %w", line, err)
	}
	defer func() { _ = f.Close() }()
	_, err = f.WriteString(line + "\n")
	return err
}

// removeHostsLine removes the exact line that was added, in place (/etc/hosts may be a
// bind mount that cannot be replaced by rename).
func removeHostsLine(line string) error {
	b, err := os.ReadFile(hostsFile)
	if err != nil {
		return err
	}
	lines := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	removed := false
	for _, l := range lines {
		if !removed && strings.TrimRight(l, "\n") == line {
			removed = true
			continue
		}
		out.WriteString(l)
	}
	if !removed {
		return nil
	}
	return os.WriteFile(hostsFile, []byte(out.String()), 0o644)
}

func pathExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
