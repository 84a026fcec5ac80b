package bench

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// The kube-scheduler's client limits. Its defaults (50 QPS, burst 100) would cap the
// 1000-in-flight run: every pod is one binding request, and its events more. These are
// far above what the largest run asks, so the scheduler is never what a run waits for.
const (
	SchedulerQPS   = 1000
	SchedulerBurst = 2000
)

// ClientLimit is one client's rate limit towards the API server, as the run set it.
type ClientLimit struct {
	Client string  `json:"client"`
	QPS    float64 `json:"qps"`
	Burst  int     `json:"burst"`
	// Unlimited: the client has no rate limiter (kwok's).
	Unlimited bool `json:"unlimited,omitempty"`
	// Unknown: the bench could not tell.
	Unknown bool `json:"unknown,omitempty"`
	// From says where the figures come from.
	From string `json:"from"`
}

func (l ClientLimit) String() string {
	if l.Unknown {
		return fmt.Sprintf("%s ? (%s)", l.Client, l.From)
	}
	if l.Unlimited {
		return fmt.Sprintf("%s none (%s)", l.Client, l.From)
	}
	return fmt.Sprintf("%s %g / %d (%s)", l.Client, l.QPS, l.Burst, l.From)
}

// SchedulerBinary is kube-scheduler: $KUBE_SCHEDULER when set, else the one beside the
// envtest kube-apiserver (`make cluster-binaries` builds both from tests/tools/kube).
func SchedulerBinary() string { return kubeBinary("KUBE_SCHEDULER", "kube-scheduler") }

// ControllerManagerBinary is kube-controller-manager: $KUBE_CONTROLLER_MANAGER when set,
// else the one beside the envtest kube-apiserver.
func ControllerManagerBinary() string {
	return kubeBinary("KUBE_CONTROLLER_MANAGER", "kube-controller-manager")
}

// kubeBinary is the Kubernetes program name: the path in the environment variable env
// when set, else the one beside the envtest kube-apiserver.
func kubeBinary(env, name string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	assets, err := testenv.AssetsDir()
	if err != nil {
		return name
	}
	apiserver, err := filepath.EvalSymlinks(filepath.Join(assets, "kube-apiserver"))
	if err != nil {
		return filepath.Join(assets, name)
	}
	return filepath.Join(filepath.Dir(apiserver), name)
}

// schedulerConfig is kube-scheduler's configuration file. Its client limits can only be
// set here: the --kube-api-qps and --kube-api-burst flags are deprecated, and ignored
// once there is a file. With a file, leader election is set here too.
func schedulerConfig(kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
`, kubeconfig, SchedulerQPS, SchedulerBurst)
}

// startScheduler runs kube-scheduler with schedulerConfig.
func startScheduler(cfg *Config, kubeconfig string) (*child, error) {
	conf := filepath.Join(cfg.Dir, "kube-scheduler.yaml")
	if err := os.WriteFile(conf, []byte(schedulerConfig(kubeconfig)), 0o644); err != nil {
		return nil, fmt.Errorf("writing kube-scheduler's configuration: %w", err)
	}
	return startChild("kube-scheduler", cfg.Dir, cfg.KubeScheduler, []string{"--config=" + conf, "--secure-port=0"}, nil)
}

// kwokLimits are the kwok backend's client limits besides agentd's.
func kwokLimits() []ClientLimit {
	return []ClientLimit{
		{Client: "kube-scheduler", QPS: SchedulerQPS, Burst: SchedulerBurst, From: "its configuration file"},
		{Client: "kwok", Unlimited: true, From: "its client has no rate limiter"},
	}
}

// benchLimit is the bench's own clients' limit (benchREST).
func benchLimit() ClientLimit {
	return ClientLimit{Client: "bench", QPS: benchQPS, Burst: benchBurst, From: "its clients"}
}

// operatorLimit is agentd's client limit: from the flags or environment the run gives it,
// else the defaults `agentd operator -h` states.
func operatorLimit(agentd string, args, env []string) ClientLimit {
	l := ClientLimit{Client: operatorClient, From: "its defaults"}
	qps, burst := setting(args, env, "kube-api-qps", "BK_OPERATOR_KUBE_API_QPS"), setting(args, env, "kube-api-burst", "BK_OPERATOR_KUBE_API_BURST")
	if qps != "" || burst != "" {
		l.From = "-operator-args or -operator-env"
	}
	if qps == "" || burst == "" {
		help, _ := exec.Command(agentd, "operator", "-h").CombinedOutput()
		qps = cmp.Or(qps, flagDefault(string(help), "kube-api-qps"))
		burst = cmp.Or(burst, flagDefault(string(help), "kube-api-burst"))
	}
	var errQPS, errBurst error
	l.QPS, errQPS = strconv.ParseFloat(qps, 64)
	l.Burst, errBurst = strconv.Atoi(burst)
	switch {
	case errQPS != nil || errBurst != nil:
		l.Unknown = true
		l.From = fmt.Sprintf("read %q and %q from the flags and `agentd operator -h`", qps, burst)
	case l.QPS <= 0:
		l.Unlimited, l.From = true, l.From+": a QPS of 0 or less"
	}
	return l
}

// setting is a flag's value in args (-name v, --name=v, …) or else env's variable.
func setting(args, env []string, flag, variable string) string {
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != flag {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, variable+"="); ok {
			return v
		}
	}
	return ""
}

// flagDefault is "(default X)" from the usage of -name in a Go program's -h output:
// "  -name type" on one line, its usage on the next ones.
func flagDefault(help, name string) string {
	lines := strings.Split(help, "\n")
	for i, line := range lines {
		if f := strings.Fields(line); len(f) == 0 || f[0] != "-"+name {
			continue
		}
		for _, usage := range lines[i+1:] {
			if strings.HasPrefix(strings.TrimSpace(usage), "-") {
				break
			}
			if _, rest, ok := strings.Cut(usage, "(default "); ok {
				v, _, _ := strings.Cut(rest, ")")
				return v
			}
		}
	}
	return ""
}
