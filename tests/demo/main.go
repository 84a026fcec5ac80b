// Command demo runs buildkite-operator end to end on real pods: it starts the local
// single-node Kubernetes (or uses a cluster you already have), the fake Buildkite, installs
// the CRDs and sample BuildEnvironments, runs `agentd operator`, creates a sample build and
// shows how its jobs end. Ctrl-C stops everything it started.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// samplePipeline shows the four kinds of step: one that passes, one that fails, one that
// chooses its BuildEnvironment and extra log files with the plugin, and one that runs under
// buildkite-agent bootstrap and uploads another step.
const samplePipeline = `agents:
  queue: bk-operator
steps:
  - label: passes
    command: echo "hello from a Kubernetes pod" && uname -a
  - label: exits 3
    command: echo "this step fails on purpose" && exit 3
  - label: plugin options
    command: |
      echo "the service writes its own log file" > /workspace/service.log
      echo "the command is done; the plugin adds /workspace/service.log to this log"
    plugins:
      - buildkite-operator#v0.1.0:
          build_environment: default
          log_paths:
            - /workspace/service.log
`

// uploadStep needs a repository: buildkite-agent bootstrap checks one out before anything.
const uploadStep = `  - label: pipeline upload
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap
    command: |
      buildkite-agent meta-data set demo-greeting hello
      printf 'steps:\n  - label: uploaded step\n    command: echo added by pipeline upload\n    agents:\n      queue: bk-operator\n' | buildkite-agent pipeline upload
`

// expected is each step's exit status when the demo works.
var expected = map[string]string{
	"passes":          "0",
	"exits 3":         "3",
	"plugin options":  "0",
	"pipeline upload": "0",
	"uploaded step":   "0",
}

type config struct {
	agentd, imagesDir, stateDir string
	kubeconfig, namespace       string
	useCurrentContext           bool
	exitWhenDone                bool
	timeout                     time.Duration
	fakeAddr, advertise         string
	jobImage, operatorImage     string
	pullPolicy, repo            string
}

func main() {
	var c config
	root := testkit.RepoRoot()
	flag.StringVar(&c.agentd, "agentd", filepath.Join(root, "bin", "agentd"), "the agentd binary to run as the operator")
	flag.StringVar(&c.imagesDir, "images", filepath.Join(root, ".cache", "images"), "image tarballs imported into the local node")
	flag.StringVar(&c.stateDir, "state", filepath.Join(root, ".cache", "demo"), "state dir: the local node, the operator's log")
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "run against the cluster of this kubeconfig instead of starting the local node")
	flag.StringVar(&c.namespace, "namespace", harness.DefaultNamespace, "namespace of the operator; its BuildJobs, BuildEnvironments and job pods are in <namespace>-jobs")
	flag.BoolVar(&c.useCurrentContext, "use-current-context", os.Getenv("USE_CURRENT_CONTEXT") == "1",
		"run against the current kube context ($KUBECONFIG or ~/.kube/config) instead of starting the local node (env USE_CURRENT_CONTEXT=1)")
	flag.BoolVar(&c.exitWhenDone, "exit-when-done", false, "stop everything once the sample build has finished; exit 1 unless every step ended as expected")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Minute, "how long the sample build may take")
	flag.StringVar(&c.fakeAddr, "fake-addr", "", "listen address of the fake Buildkite (default: the local node's bridge gateway, or 0.0.0.0 with an existing cluster)")
	flag.StringVar(&c.advertise, "advertise", "", "host pods use to reach the fake Buildkite when it listens on all interfaces (default: this host's address)")
	flag.StringVar(&c.jobImage, "job-image", images.JobImage, "image of the sample BuildEnvironments (it needs a shell; the bootstrap one needs buildkite-agent)")
	flag.StringVar(&c.operatorImage, "operator-image", images.AgentdImage, "image holding agentd, for the job pods' init container")
	flag.StringVar(&c.pullPolicy, "pull-policy", "", "image pull policy of the sample BuildEnvironments (default Never on the local node, IfNotPresent elsewhere)")
	flag.StringVar(&c.repo, "repo", "", "with an existing cluster: a git repository URL its pods can clone, for the bootstrap step (the local node gets a sample repository)")
	flag.Parse()

	code, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(c config) (int, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if c.useCurrentContext && c.kubeconfig == "" {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		c.kubeconfig = rules.GetDefaultFilename()
		if c.kubeconfig == "" {
			return 1, fmt.Errorf("no kube context is configured: set KUBECONFIG or write ~/.kube/config, or run without USE_CURRENT_CONTEXT to use the local node")
		}
	}
	pull := corev1.PullPolicy(c.pullPolicy)
	if pull == "" {
		pull = corev1.PullNever
		if c.kubeconfig != "" {
			pull = corev1.PullIfNotPresent
		}
	}
	say := func(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }
	logf := func(format string, args ...any) {
		// The fake logs every request; the demo shows only its own steps and the node's.
		if !strings.HasPrefix(format, "fake buildkite") {
			fmt.Printf("    "+format+"\n", args...)
		}
	}

	if c.kubeconfig == "" {
		say("starting the local single-node Kubernetes (needs root; state in %s)", c.stateDir)
	} else {
		say("using the cluster of %s", c.kubeconfig)
	}
	env, err := harness.Start(ctx, harness.Options{
		Kubeconfig: c.kubeconfig, Namespace: c.namespace, StateDir: c.stateDir, ImagesDir: c.imagesDir, Agentd: c.agentd,
		FakeAddr: c.fakeAddr, AdvertiseHost: c.advertise, Spawn: 4,
		JobImage: c.jobImage, OperatorImage: c.operatorImage, JobImagePullPolicy: pull,
		// On the local node the chart installs the operator, image and all; a cluster of the
		// current context may not have the locally built image, so the operator runs here.
		HostProcess: c.kubeconfig != "",
		Logf:        logf,
	})
	if err != nil {
		return 1, err
	}
	defer func() {
		say("stopping the operator, the fake Buildkite and the node")
		if err := env.Stop(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "demo: stopping:", err)
		} else {
			say("stopped")
		}
	}()

	say("everything is up in %s (node %s)", env.Total.Round(time.Millisecond), env.NodeStart.Round(time.Millisecond))
	kubectl := kubectlPath()
	where := fmt.Sprintf(`where to look:
    %[1]s --kubeconfig %[2]s get buildjobs,pods -n %[3]s
    %[1]s --kubeconfig %[2]s get buildenvironments -n %[3]s
    the fake Buildkite's web page: %[4]s
    the operator's log: %[5]s`, kubectl, env.Kubeconfig, env.JobNamespace, env.Fake.URL(), env.Operator.LogHint())
	say("%s", where)

	pipeline, repoURL := samplePipeline, c.repo
	if env.Node != nil {
		// The one local node can mount a repository from this host.
		if repoURL, err = mountSampleRepo(ctx, env, filepath.Join(c.stateDir, "repo")); err != nil {
			return 1, err
		}
	}
	if repoURL != "" {
		pipeline += uploadStep
	} else {
		say("no repository for buildkite-agent bootstrap (give one with --repo): leaving out the pipeline upload step")
		delete(expected, "pipeline upload")
		delete(expected, "uploaded step")
	}
	b, err := env.Fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "demo", PipelineYAML: pipeline, Repo: repoURL, Message: "buildkite-operator demo"})
	if err != nil {
		return 1, fmt.Errorf("creating the sample build: %w", err)
	}
	say("created build #%d (%s) with %d jobs; waiting for them", b.Number, b.URL, len(b.Jobs))

	wctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	jobs, err := env.WaitBuild(wctx, b.ID, 3*time.Second, func(jobs []fakebuildkite.JobSnapshot) {
		fmt.Printf("\n[%s]\n%s", time.Since(start).Round(time.Second), harness.Table(jobs))
	})
	if ctx.Err() != nil {
		say("interrupted")
		return 130, nil
	}
	if err != nil {
		return 1, fmt.Errorf("%w\nthe operator's log ends:\n%s", err, env.Operator.Tail(30))
	}
	fmt.Printf("\n==> the sample build finished in %s:\n%s\n", time.Since(start).Round(100*time.Millisecond), harness.Table(jobs))
	problems := check(jobs)
	for _, p := range problems {
		fmt.Println("    UNEXPECTED:", p)
	}
	if len(problems) == 0 {
		say("every step ended as expected")
	}
	say("%s", where)
	code := 0
	if len(problems) > 0 {
		code = 1
	}
	if c.exitWhenDone {
		return code, nil
	}
	say("press Ctrl-C to stop everything")
	<-ctx.Done()
	return code, nil
}

func logTail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "        " + strings.Join(lines, "\n        ")
}

// repoMount is where the demo's pods see the sample repository.
const repoMount = "/srv/demo-repo"

// mountSampleRepo makes a git repository on this host and mounts it (hostPath) into the
// sample BuildEnvironments, returning the URL their jobs clone.
func mountSampleRepo(ctx context.Context, env *harness.Env, dir string) (string, error) {
	_ = os.RemoveAll(dir)
	repo, err := harness.MakeRepo(dir)
	if err != nil {
		return "", fmt.Errorf("making the sample repository: %w", err)
	}
	if err := harness.GiveToPods(repo.Dir); err != nil {
		return "", err
	}
	for _, be := range harness.SampleEnvironments(env.JobNamespace, env.Opts.JobImage, env.Opts.JobImagePullPolicy) {
		be.Spec.Allow.HostPath = true // hostPath volumes need it
		be.Spec.Volumes = append(be.Spec.Volumes, corev1.Volume{Name: "demo-repo", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: repo.Dir}}})
		be.Spec.VolumeMounts = append(be.Spec.VolumeMounts, corev1.VolumeMount{Name: "demo-repo", MountPath: repoMount, ReadOnly: true})
		if err := env.ApplyEnvironment(ctx, be); err != nil {
			return "", err
		}
	}
	return repoMount, nil
}

// kubectlPath is kubectl from PATH, else the one `make cluster-binaries` built.
func kubectlPath() string {
	if _, err := exec.LookPath("kubectl"); err == nil {
		return "kubectl"
	}
	built := filepath.Join(testkit.RepoRoot(), ".cache", "kube-v1.35.4", "kubectl")
	if _, err := os.Stat(built); err == nil {
		return built
	}
	return "kubectl"
}

// check compares the jobs with what the sample pipeline should do.
func check(jobs []fakebuildkite.JobSnapshot) []string {
	var problems []string
	seen := map[string]bool{}
	for _, j := range jobs {
		want, ok := expected[j.Label]
		if !ok {
			problems = append(problems, fmt.Sprintf("a job %q that the sample pipeline does not have", j.Label))
			continue
		}
		seen[j.Label] = true
		if j.State != fakebuildkite.StateFinished || j.ExitStatus != want || j.FinishCount != 1 {
			problems = append(problems, fmt.Sprintf("%q ended %s with exit status %q (signal reason %q, finished %d times); want finished with %s once; its log ends:\n%s",
				j.Label, j.State, j.ExitStatus, j.SignalReason, j.FinishCount, want, logTail(fakebuildkite.PlainLog(j.Log), 15)))
		}
	}
	for label := range expected {
		if !seen[label] {
			problems = append(problems, fmt.Sprintf("no job %q", label))
		}
	}
	return problems
}
