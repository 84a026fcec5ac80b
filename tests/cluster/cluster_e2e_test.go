package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// hostSnapshot is what the node may change on the host and must put back.
type hostSnapshot struct {
	sysctls map[string]string
	chains  map[string][]string
	rules   map[string]string
	hosts   string
	paths   map[string]bool
	links   map[string]bool
	cgroups map[string]bool
}

func snapshotHost(t *testing.T) hostSnapshot {
	t.Helper()
	hosts, err := os.ReadFile("/etc/hosts")
	require.NoError(t, err)
	s := hostSnapshot{sysctls: readSysctls(), chains: snapshotChains(), hosts: string(hosts),
		rules: map[string]string{}, paths: map[string]bool{}, links: map[string]bool{}, cgroups: map[string]bool{}}
	for _, bin := range iptablesBinaries {
		for _, table := range iptablesTables {
			out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
			require.NoError(t, err, "%s -t %s -S", bin, table)
			s.rules[bin+"/"+table] = string(out)
		}
	}
	for _, p := range hostPaths {
		s.paths[p] = pathExists(p)
	}
	ifaces, err := net.Interfaces()
	require.NoError(t, err)
	for _, i := range ifaces {
		s.links[i.Name] = true
	}
	for _, cg := range cgroupRoots() {
		s.cgroups[cg] = pathExists(cg)
	}
	return s
}

// TestLocalNode starts a real node, runs real pods on it, stops it and checks that the
// host is as it was. It needs root and the binaries from `make cluster-binaries`, so it
// runs under `make test-e2e` (E2E=1).
func TestLocalNode(t *testing.T) {
	if os.Getenv("E2E") != "1" {
		t.Skip("end-to-end test on a real node: run `make test-e2e` (sets E2E=1; needs root, make node-deps and make cluster-binaries)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	imgDir := filepath.Join(testkit.RepoRoot(), ".cache", "images")
	jobTar, err := images.BuildJob(ctx, imgDir, "")
	require.NoError(t, err)
	// The stand-in of Buildkite's agent image, whose static buildkite-agent a pod runs from an
	// image volume.
	agentTar, err := images.BuildAgent(ctx, imgDir, "")
	require.NoError(t, err)

	state, err := os.MkdirTemp("", "localnode-e2e-")
	require.NoError(t, err)
	// Hold the machine lock from the first look at the host to the last, so that no other
	// node (another package's tests) changes the host in between.
	lock, err := machineLock(ctx, t.Logf)
	require.NoError(t, err)
	defer func() { _ = lock.Close() }()
	before := snapshotHost(t)

	start := time.Now()
	c, err := Up(ctx, Options{StateDir: state, Logf: t.Logf, heldLock: lock})
	require.NoError(t, err)
	upTime := time.Since(start)
	t.Logf("node up in %s", upTime)
	stopped := false
	defer func() {
		if !stopped {
			assert.NoError(t, c.Down(context.Background()))
		}
	}()

	// This kubelet is told not to make iptables chains, but chains of the kind it and
	// kube-proxy make, appearing while the node runs, must go with it.
	for _, args := range [][]string{{"-N", "KUBE-LOCALNODE-E2E"}, {"-A", "FORWARD", "-s", "10.88.0.0/16", "-j", "KUBE-LOCALNODE-E2E"}} {
		out, err := exec.Command("iptables", append([]string{"-w"}, args...)...).CombinedOutput()
		require.NoError(t, err, "iptables %v: %s", args, out)
	}

	t0 := time.Now()
	require.NoError(t, c.ImportImage(ctx, jobTar))
	require.NoError(t, c.ImportImage(ctx, agentTar))
	t.Logf("job and agent images imported in %s", time.Since(t0))

	cfg, err := c.RESTConfig()
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	// The node runs the containerd that make cluster-binaries built (image volumes need 2.1),
	// not the host's.
	node, err := cs.CoreV1().Nodes().Get(ctx, c.NodeName(), metav1.GetOptions{})
	require.NoError(t, err)
	// (The kubelet drops the version's "v".)
	assert.Equal(t, "containerd://"+strings.TrimPrefix(ContainerdVersion, "v"), node.Status.NodeInfo.ContainerRuntimeVersion, "the node's container runtime")

	// A server on the host, reached from a pod at HostAddress.
	ln, err := net.Listen("tcp", net.JoinHostPort(c.HostAddress(), "0"))
	require.NoError(t, err, "listening on the bridge gateway")
	defer func() { _ = ln.Close() }()
	hostHits := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		buf := make([]byte, 64)
		n, _ := conn.Read(buf)
		hostHits <- string(buf[:n])
	}()
	hostPort := ln.Addr().(*net.TCPAddr).Port

	job := func(name string, mem string, containers ...corev1.Container) *corev1.Pod {
		for i := range containers {
			containers[i].Image = images.JobImage
			containers[i].ImagePullPolicy = corev1.PullNever
			containers[i].VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
			if mem != "" {
				q := resource.MustParse(mem)
				containers[i].Resources = corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceMemory: q, corev1.ResourceCPU: resource.MustParse("200m")},
					Requests: corev1.ResourceList{corev1.ResourceMemory: q, corev1.ResourceCPU: resource.MustParse("200m")},
				}
			}
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: new(int64),
				Containers:                    containers,
				Volumes:                       []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		}
	}
	sh := func(name, script string) corev1.Container {
		return corev1.Container{Name: name, Command: []string{"/bin/sh", "-c", script}}
	}
	// The agent's image as a volume, as job pods get buildkite-agent (pkg/podbuilder): its
	// program folder as a read-only subPath, and the whole image beside it. The job image has
	// a buildkite-agent of its own, so the script runs the volume's by its path.
	imageVolume := job("image-volume", "", sh("main", `/agent-bin/buildkite-agent --version
test -x /agent-image`+podcontract.AgentImageBinaryPath+` && echo whole-image
test -d /agent-bin && ! touch /agent-bin/x 2>/dev/null && echo read-only`))
	imageVolume.Spec.Volumes = append(imageVolume.Spec.Volumes, corev1.Volume{Name: "agent", VolumeSource: corev1.VolumeSource{
		Image: &corev1.ImageVolumeSource{Reference: images.AgentImage, PullPolicy: corev1.PullNever},
	}})
	imageVolume.Spec.Containers[0].VolumeMounts = append(imageVolume.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "agent", MountPath: "/agent-bin", SubPath: podcontract.ImageBinDir, ReadOnly: true},
		corev1.VolumeMount{Name: "agent", MountPath: "/agent-image", ReadOnly: true})

	cases := []struct {
		name      string
		pod       *corev1.Pod
		phase     corev1.PodPhase
		container string
		exitCode  int32
		reason    string
		logs      []string
	}{
		{
			name: "shared emptyDir, git and the agent",
			pod: job("shared", "",
				sh("writer", "echo from-writer > /shared/msg.tmp && mv /shared/msg.tmp /shared/msg"),
				sh("reader", fmt.Sprintf(`while [ ! -f /shared/msg ]; do sleep 0.1; done; cat /shared/msg
git --version && buildkite-agent --version
git init -q /tmp/r && cd /tmp/r && git -c user.email=a@b -c user.name=n commit -q --allow-empty -m one && git clone -q file:///tmp/r /workspace/c && git -C /workspace/c log --format=%%s
printf hello | nc -w 3 %s %d && echo reached-host`, c.HostAddress(), hostPort)),
			),
			phase: corev1.PodSucceeded, container: "reader", exitCode: 0,
			logs: []string{"from-writer", "git version", "buildkite-agent version " + strings.TrimPrefix(testkit.AgentVersion, "v"), "one", "reached-host"},
		},
		{
			name:  "exit code 3",
			pod:   job("exit3", "", sh("main", "echo failing; exit 3")),
			phase: corev1.PodFailed, container: "main", exitCode: 3, reason: "Error",
			logs: []string{"failing"},
		},
		{
			name: "OOM killed by the memory limit",
			// The pause lets containerd watch the container's cgroup before the OOM kill: an
			// OOM in the container's first moments was once reported as a plain "Error".
			pod:   job("oom", "32Mi", sh("main", "echo allocating; sleep 1; dd if=/dev/zero of=/dev/null bs=256M count=1")),
			phase: corev1.PodFailed, container: "main", exitCode: 137, reason: "OOMKilled",
			logs: []string{"allocating"},
		},
		{
			name:  "buildkite-agent from an image volume",
			pod:   imageVolume,
			phase: corev1.PodSucceeded, container: "main", exitCode: 0,
			logs: []string{"buildkite-agent version " + strings.TrimPrefix(testkit.AgentVersion, "v"), "whole-image", "read-only"},
		},
	}
	for _, tc := range cases {
		_, err := cs.CoreV1().Pods("default").Create(ctx, tc.pod, metav1.CreateOptions{})
		require.NoError(t, err, tc.name)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var pod *corev1.Pod
			require.Eventually(t, func() bool {
				pod, err = cs.CoreV1().Pods("default").Get(ctx, tc.pod.Name, metav1.GetOptions{})
				return err == nil && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed)
			}, 2*time.Minute, 200*time.Millisecond, "pod %s never finished", tc.pod.Name)
			assert.Equal(t, tc.phase, pod.Status.Phase)
			var term *corev1.ContainerStateTerminated
			for _, st := range pod.Status.ContainerStatuses {
				if st.Name == tc.container {
					term = st.State.Terminated
				}
			}
			require.NotNil(t, term, "container %s has not terminated: %+v", tc.container, pod.Status.ContainerStatuses)
			assert.Equal(t, tc.exitCode, term.ExitCode)
			if tc.reason != "" {
				assert.Equal(t, tc.reason, term.Reason)
			}
			logs, err := cs.CoreV1().Pods("default").GetLogs(tc.pod.Name, &corev1.PodLogOptions{Container: tc.container}).DoRaw(ctx)
			require.NoError(t, err)
			for _, want := range tc.logs {
				assert.Contains(t, string(logs), want)
			}
		})
	}
	select {
	case got := <-hostHits:
		assert.Equal(t, "hello", got, "what the pod sent to the host")
	case <-time.After(5 * time.Second):
		t.Error("the pod never reached the host server at HostAddress")
	}
	// Pods' veths have come and gone on the bridge: its address must not have followed them,
	// or pods' ARP caches go stale and their traffic to the host stalls.
	mac, err := os.ReadFile("/sys/class/net/" + bridgeName + "/address")
	require.NoError(t, err)
	assert.Equal(t, bridgeMAC, strings.TrimSpace(string(mac)), "the bridge's MAC address")

	started := append([]procRecord(nil), c.j.Processes...)
	t0 = time.Now()
	require.NoError(t, c.Down(context.Background()))
	stopped = true
	t.Logf("node down in %s", time.Since(t0))

	after := snapshotHost(t)
	assert.Equal(t, before.sysctls, after.sysctls, "sysctls restored")
	assert.Equal(t, sortedChains(before.chains), sortedChains(after.chains), "iptables chains as before")
	assert.Equal(t, before.rules, after.rules, "iptables rules as before")
	for key, chains := range after.chains {
		for _, ch := range chains {
			assert.False(t, strings.HasPrefix(ch, "KUBE-"), "chain %s left in %s", ch, key)
		}
	}
	assert.Equal(t, before.hosts, after.hosts, "/etc/hosts as before")
	assert.Equal(t, before.paths, after.paths, "host paths as before")
	assert.Equal(t, before.links, after.links, "network interfaces as before")
	assert.Equal(t, before.cgroups, after.cgroups, "kubelet cgroups as before")
	mounts, err := mountsUnder(state)
	require.NoError(t, err)
	assert.Empty(t, mounts, "mounts left under the state dir")
	assert.Empty(t, processesNamed("kubelet"), "kubelet still running")
	for _, p := range started {
		assert.False(t, p.alive(), "%s (pid %d) still running", p.Name, p.Pid)
		assert.Empty(t, inGroup(p.Pid), "processes forked by %s still running", p.Name)
	}
	assert.Empty(t, shimsOf(c.ContainerdSocket()), "containerd shims still running")
	_, err = os.Stat(filepath.Join(state, "host.json"))
	assert.True(t, os.IsNotExist(err), "journal removed after a clean stop")
	if !t.Failed() {
		assert.NoError(t, os.RemoveAll(state))
	}
	assert.Less(t, upTime, 60*time.Second, "node start time")
}

func sortedChains(m map[string][]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		v = append([]string(nil), v...)
		sort.Strings(v)
		out[k] = strings.Join(v, ",")
	}
	return out
}

// Down run twice, or on a state dir whose processes are already gone, does nothing harmful.
func TestJournalRoundTrip(t *testing.T) {
	dir := t.TempDir()
	j := &journal{path: filepath.Join(dir, "host.json"), Sysctls: map[string]string{"vm/panic_on_oom": "0"},
		Processes: []procRecord{{Name: "gone", Pid: 1 << 22, Start: 1}}}
	require.NoError(t, j.save())
	c, err := Open(Options{StateDir: dir})
	require.NoError(t, err)
	assert.Equal(t, j.Sysctls, c.j.Sysctls)
	assert.Equal(t, j.Processes, c.j.Processes)
	assert.False(t, c.j.Processes[0].alive(), "a pid that does not exist is not alive")
}

func TestProcessIdentity(t *testing.T) {
	self := os.Getpid()
	st, err := startTime(self)
	require.NoError(t, err)
	cases := []struct {
		name  string
		rec   procRecord
		alive bool
	}{
		{"this process", procRecord{Pid: self, Start: st}, true},
		{"same pid, other start time (a reused pid)", procRecord{Pid: self, Start: st + 1}, false},
		{"no such pid", procRecord{Pid: 1 << 22, Start: st}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.alive, tc.rec.alive())
		})
	}
}

func TestUnescapeMount(t *testing.T) {
	cases := []struct{ in, want string }{
		{`/plain/path`, "/plain/path"},
		{`/a\040b`, "/a b"},
		{`/tab\011x`, "/tab\tx"},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, unescapeMount(tc.in))
	}
}

// inGroup lists the processes in process group pgid.
func inGroup(pgid int) []int {
	var out []int
	for _, pid := range pids() {
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}
