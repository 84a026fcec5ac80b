package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

func TestSpreadOf(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want spreadOf
	}{
		{"none", nil, spreadOf{}},
		{"one", []float64{4}, spreadOf{4, 4, 4}},
		{"three, unsorted", []float64{9, 1, 5}, spreadOf{1, 5, 9}},
		{"even: the mean of the middle two", []float64{8, 2, 4, 6}, spreadOf{2, 5, 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]float64(nil), tt.in...)
			assert.Equal(t, tt.want, newSpread(tt.in))
			assert.Equal(t, in, tt.in, "the input is left as it was")
		})
	}
}

func TestRowCells(t *testing.T) {
	runs := []*Result{
		{BarePod: Stats{P50: 30, P95: 100, P99: 300}},
		{BarePod: Stats{P50: 10, P95: 200, P99: 100}},
		{BarePod: Stats{P50: 20, P95: 300, P99: 200}},
	}
	rw := row{name: "floor", values: func(r *Result) []float64 { return p50p95p99(r.BarePod) }, format: ms}
	assert.Equal(t, []string{"10 ms / 100 ms / 100 ms", "20 ms / 200 ms / 200 ms", "30 ms / 300 ms / 300 ms"}, rw.cells(runs),
		"each percentile's min, median and max across the runs, on its own")
	assert.Equal(t, []string{"30 ms / 100 ms / 300 ms"}, rw.cells(runs[:1]), "one run: its values")
}

func TestPrintRuns(t *testing.T) {
	run := func(jps, floorP50, pickupP50 float64) *Result {
		return &Result{
			Backend: BackendKwok, Mode: ModeOpen, Rate: 4, InFlight: 10, Jobs: 20, Passed: 20, JobsPerSecond: jps,
			Limits:  []ClientLimit{{Client: "kube-scheduler", QPS: 1000, Burst: 2000, From: "its configuration file"}},
			BarePod: Stats{Samples: 10, P50: floorP50},
			Phases: []Phase{
				{Name: "pod created → pod running", Stats: Stats{Samples: 20}, Floor: true},
				{Name: pickupPhase, Stats: Stats{Samples: 20, P50: pickupP50}, Floor: true},
			},
			PickupOverFloorMs: pickupP50 - floorP50,
			CPU:               CPU{Processes: []ProcessCPU{{Name: "etcd", Seconds: 2}}, RunSeconds: 2, MachineSeconds: 3, WindowSeconds: 10},
		}
	}
	var out strings.Builder
	PrintRuns(&out, []*Result{run(3, 100, 700), run(1, 300, 600), run(2, 200, 900)})
	text := out.String()
	for _, want := range []string{
		"kwok backend, open loop: one job every 250 ms (4.00 a second); 10 in flight, 20 jobs a run, 3 run(s): 60 of 60 jobs passed",
		"kube-scheduler 1000 / 2000 (its configuration file)",
		"| measure | min | median | max |",
		"| jobs per second over the window | 1.00 | 2.00 | 3.00 |",
		"| pickup p50 − floor p50, each run (target ≤ 500 ms) | 300 ms | 600 ms | 700 ms |",
		"|   etcd | 100.0 ms | 100.0 ms | 100.0 ms |",
		"| CPU per job, the rest of the machine (others' work on it) | 50.0 ms | 50.0 ms | 50.0 ms |",
	} {
		assert.Contains(t, text, want)
	}
	assert.Equal(t, 1, strings.Count(text, "**floor**"), "the floor row once, after the phase it bounds (pickup has its own row)")
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, line string
		want       procStat
		err        bool
	}{
		{
			name: "plain",
			line: "15843 (kube-apiserver) S 15841 15841 7804 0 -1 4194304 101 0 0 0 1234 56 7 8 20 0 1 0 3353290 3133440 380\n",
			want: procStat{comm: "kube-apiserver", ppid: 15841, cpu: 1290 * clockTick},
		},
		{
			name: "a name with spaces and parentheses",
			line: "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1",
			want: procStat{comm: "a (b) c", ppid: 1, cpu: 7 * clockTick},
		},
		{name: "short", line: "7 (x) R 1 2 3", err: true},
		{name: "no name", line: "7 x R 1 2 3 4 5 6 7 8 9 10 11 12 13", err: true},
		{name: "not a number", line: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 4 0 0", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.line)
			if tt.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestReadStatSelf(t *testing.T) {
	st, err := readStat(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, os.Getppid(), st.ppid)
	assert.NotEmpty(t, st.comm)
}

func TestParseStatusKB(t *testing.T) {
	status := "Name:\tagentd\nVmPeak:\t 2000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n"
	hwm, err := parseStatusKB(strings.NewReader(status), "VmHWM")
	require.NoError(t, err)
	assert.Equal(t, int64(50<<20), hwm)
	rss, err := parseStatusKB(strings.NewReader(status), "VmRSS")
	require.NoError(t, err)
	assert.Equal(t, int64(40<<20), rss)
	_, err = parseStatusKB(strings.NewReader(status), "VmSwap")
	assert.Error(t, err)
}

func TestParseCPULine(t *testing.T) {
	busy, err := parseCPULine("cpu  100 2 30 5000 60 4 5 700 0 0\n")
	require.NoError(t, err)
	assert.Equal(t, 141*clockTick, busy, "user, nice, system, irq and softirq; not idle, iowait or steal")
	_, err = parseCPULine("cpu0 1 2 3 4 5 6 7 8")
	assert.Error(t, err)
}

func TestUnderRoot(t *testing.T) {
	all := map[int]procStat{
		1:  {comm: "init"},
		10: {comm: "bench", ppid: 1},
		11: {comm: "etcd", ppid: 10},
		12: {comm: "kube-apiserver", ppid: 10},
		13: {comm: "helper", ppid: 12},
		20: {comm: "other", ppid: 1},
	}
	got := underRoot(all, 10)
	assert.Len(t, got, 3)
	for _, pid := range []int{11, 12, 13} {
		assert.Contains(t, got, pid)
	}
}

func TestCPUBetween(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	a := cpuSnapshot{at: t0, self: time.Second, machine: 10 * time.Second, procs: map[int]procStat{
		11: {comm: "etcd", cpu: 2 * time.Second},
		12: {comm: "kwok-v0.8.0", cpu: time.Second},
		13: {comm: "old", cpu: 5 * time.Second},
	}}
	b := cpuSnapshot{at: t0.Add(10 * time.Second), self: 3 * time.Second, machine: 20 * time.Second, procs: map[int]procStat{
		11: {comm: "etcd", cpu: 3 * time.Second},
		12: {comm: "kwok-v0.8.0", cpu: 2 * time.Second},
		13: {comm: "new", cpu: 500 * time.Millisecond}, // the pid taken by another program
		14: {comm: "etcd", cpu: time.Second},           // started in the window
	}}
	got := cpuBetween(a, b, 10)
	assert.Equal(t, []ProcessCPU{
		{Name: benchProcess, Seconds: 2, SecondsPerJob: 0.2}, // a tie: by name
		{Name: "etcd", Seconds: 2, SecondsPerJob: 0.2},
		{Name: "kwok", Seconds: 1, SecondsPerJob: 0.1},
		{Name: "new", Seconds: 0.5, SecondsPerJob: 0.05},
	}, got.Processes)
	assert.InDelta(t, 5.5, got.RunSeconds, 1e-9)
	assert.InDelta(t, 10.0, got.MachineSeconds, 1e-9)
	assert.InDelta(t, 10.0, got.WindowSeconds, 1e-9)
	assert.InDelta(t, 1.0, got.seconds("kwok"), 1e-9)
}

func TestSchedulerConfig(t *testing.T) {
	var conf struct {
		APIVersion       string `json:"apiVersion"`
		Kind             string `json:"kind"`
		ClientConnection struct {
			Kubeconfig string  `json:"kubeconfig"`
			QPS        float64 `json:"qps"`
			Burst      int     `json:"burst"`
		} `json:"clientConnection"`
		LeaderElection struct {
			LeaderElect *bool `json:"leaderElect"`
		} `json:"leaderElection"`
	}
	require.NoError(t, yaml.UnmarshalStrict([]byte(schedulerConfig(`/tmp/a "b".kubeconfig`)), &conf))
	assert.Equal(t, "KubeSchedulerConfiguration", conf.Kind)
	assert.Equal(t, `/tmp/a "b".kubeconfig`, conf.ClientConnection.Kubeconfig)
	assert.InDelta(t, float64(SchedulerQPS), conf.ClientConnection.QPS, 0)
	assert.Equal(t, SchedulerBurst, conf.ClientConnection.Burst)
	require.NotNil(t, conf.LeaderElection.LeaderElect)
	assert.False(t, *conf.LeaderElection.LeaderElect)
}

func TestOperatorLimitSettings(t *testing.T) {
	help := "Usage of operator:\n  -kube-api-burst int\n    \trequests at once (env BK_OPERATOR_KUBE_API_BURST) (default 400)\n" +
		"  -kube-api-qps float\n    \trequests per second (default 200)\n  -leader-elect\n    \tone at a time (default true)\n"
	assert.Equal(t, "400", flagDefault(help, "kube-api-burst"))
	assert.Equal(t, "200", flagDefault(help, "kube-api-qps"))
	assert.Empty(t, flagDefault(help, "kube-api"), "a flag's name is matched whole")

	tests := []struct {
		name      string
		args, env []string
		want      string
	}{
		{"none", nil, nil, ""},
		{"--flag=v", []string{"--slots", "3", "--kube-api-qps=50"}, nil, "50"},
		{"-flag v", []string{"-kube-api-qps", "70"}, []string{"BK_OPERATOR_KUBE_API_QPS=9"}, "70"},
		{"the environment", nil, []string{"GOMEMLIMIT=1GiB", "BK_OPERATOR_KUBE_API_QPS=9"}, "9"},
		{"another flag's value", []string{"--label", "kube-api-qps"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, setting(tt.args, tt.env, "kube-api-qps", "BK_OPERATOR_KUBE_API_QPS"))
		})
	}
}

func TestPhaseNamesByBackend(t *testing.T) {
	m := [][nMoments]time.Time{{}}
	finish := func(ps []Phase) string { return ps[7].Name }
	assert.Equal(t, "command end → finish received: the bench's stand-in supervisor, not the product's", finish(phases(m, true)))
	assert.Equal(t, "command end → finish received: the product's supervisor (target p99 < 500 ms)", finish(phases(m, false)))
}

func TestSpreadSamples(t *testing.T) {
	ten := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	assert.Equal(t, []int{0, 3, 6, 9}, spread(ten, 4))
	assert.Equal(t, ten, spread(ten, 25))
	assert.Equal(t, []int{0, 4, 9}, spread(ten, 3))
}

func TestArrival(t *testing.T) {
	assert.Equal(t, time.Duration(0), arrival(0, 4))
	assert.Equal(t, 250*time.Millisecond, arrival(1, 4))
	assert.Equal(t, 5*time.Second, arrival(10, 2))
}

func TestOperatorLimit(t *testing.T) {
	// No agentd to ask: what the flags say is all there is.
	missing := filepath.Join(t.TempDir(), "agentd")
	assert.Equal(t, ClientLimit{Client: operatorClient, QPS: 50, Burst: 80, From: "-operator-args or -operator-env"},
		operatorLimit(missing, []string{"--kube-api-qps=50"}, []string{"BK_OPERATOR_KUBE_API_BURST=80"}))
	assert.Equal(t, ClientLimit{Client: operatorClient, QPS: -1, Burst: 10, Unlimited: true, From: "-operator-args or -operator-env: a QPS of 0 or less"},
		operatorLimit(missing, []string{"--kube-api-qps=-1", "--kube-api-burst", "10"}, nil))
	unknown := operatorLimit(missing, nil, nil)
	assert.True(t, unknown.Unknown)
	assert.Equal(t, `agentd ? (read "" and "" from the flags and `+"`agentd operator -h`)", unknown.String())
}
