package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// TestZZZPlainInstall runs after the chart's release is gone: it installs the operator from
// deploy/install.yaml with the commands docs/install.md gives ("With plain manifests"), runs
// a job through it, and uninstalls it with the documented drain ("A plain-manifest install")
// while a job runs: the job ends once, with an explanation, and nothing of the operator is
// left in the cluster. The commands are read from the document, so the docs are what is
// tested. The manifest is changed only as any user of this suite's cluster must: the locally
// built image for the published one, the fake Buildkite for Buildkite's agent API.
func TestZZZPlainInstall(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Node, "the plain install needs the local node's kubectl")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	docs, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "docs", "install.md"))
	require.NoError(t, err)
	install := shellBlockAfter(t, string(docs), "## With plain manifests")
	uninstall := shellBlockAfter(t, string(docs), "### A plain-manifest install")

	raw, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "deploy", "install.yaml"))
	require.NoError(t, err)
	manifest := string(raw)
	published := regexp.MustCompile(`ghcr\.io/buildkite-operator/buildkite-operator(:[^\s"@]+)?(@sha256:[a-f0-9]{64})?`)
	require.Regexp(t, published, manifest, "the manifest names the published operator image")
	manifest = published.ReplaceAllString(manifest, e.Opts.OperatorImage)
	const endpointArg = "--agent-endpoint=https://agent.buildkite.com/v3"
	require.Contains(t, manifest, endpointArg)
	manifest = strings.ReplaceAll(manifest, endpointArg, "--agent-endpoint="+e.Fake.Endpoint())
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "deploy"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "deploy", "install.yaml"), []byte(manifest), 0o644))

	// The token placeholder gets the fake's token (a fake's, so a command line may hold it;
	// the log shows the placeholder).
	require.Contains(t, install, "<agent token>")
	token := e.Fake.RegistrationToken()
	t0 := time.Now()
	runShell(ctx, t, e.Node.BinDir(), e.Kubeconfig, dir, strings.ReplaceAll(install, "<agent token>", token), token)
	runShell(ctx, t, e.Node.BinDir(), e.Kubeconfig, dir, "kubectl -n buildkite rollout status deployment/buildkite-operator --timeout=4m", "")
	require.NoError(t, e.Fake.WaitFor(ctx, func() bool { return e.Fake.ConnectedAgents() >= 10 }),
		"the plain install's 10 agents did not connect")
	recordTiming("plain install: applied and 10 agents connected in %s", time.Since(t0).Round(10*time.Millisecond))

	require.NoError(t, e.ApplyEnvironment(ctx, gen.BuildEnvironment("plain",
		gen.SetBuildEnvironmentImage(e.Opts.JobImage), gen.SetBuildEnvironmentImagePullPolicy(e.Opts.JobImagePullPolicy),
		gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand))))
	run := func(command string) string {
		b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
			Pipeline: "e2e-plain",
			PipelineYAML: fmt.Sprintf(`agents:
  queue: bk-operator
steps:
  - command: %s
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: plain
`, command),
		})
		require.NoError(t, err)
		return b.Jobs[0]
	}
	done := run(`echo "ran through the plain install"`)
	j, err := e.Fake.WaitJob(ctx, done, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
	require.NoError(t, err)
	assert.Equal(t, "0", j.ExitStatus, "log:\n%s", fakebuildkite.PlainLog(j.Log))
	assert.Contains(t, fakebuildkite.PlainLog(j.Log), "ran through the plain install")

	// Uninstall as documented while a job runs.
	running := run(`echo "started"; sleep 600; echo "never printed"`)
	_, err = e.Fake.WaitJob(ctx, running, func(j fakebuildkite.JobSnapshot) bool {
		return strings.Contains(fakebuildkite.PlainLog(j.Log), "started") || fakebuildkite.IsTerminal(j.State)
	})
	require.NoError(t, err)
	t1 := time.Now()
	runShell(ctx, t, e.Node.BinDir(), e.Kubeconfig, dir, uninstall, "")
	recordTiming("plain install: the documented uninstall with a running job took %s", time.Since(t1).Round(10*time.Millisecond))

	j, ok := e.Fake.Job(running)
	require.True(t, ok)
	log := fakebuildkite.PlainLog(j.Log)
	assert.True(t, fakebuildkite.IsTerminal(j.State), "the running job is %s after the uninstall; log:\n%s", j.State, log)
	assert.Equal(t, 1, j.FinishCount, "the running job is finished exactly once")
	assert.Contains(t, log, "buildkite-operator", "the job's log explains why it ended:\n%s", log)
	assert.NotContains(t, log, "\nnever printed\n")
	assert.Zero(t, e.Fake.ConnectedAgents(), "no agent of the plain install is still connected")

	// Nothing is left: the namespaces (the docs delete the release's; the manifest's delete
	// takes the job namespace) and every cluster-scoped object the manifest made.
	for _, name := range []string{"buildkite", "buildkite-jobs"} {
		require.Eventually(t, func() bool {
			err := e.Client.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
			return apierrors.IsNotFound(err)
		}, 2*time.Minute, time.Second, "namespace %s is left after the documented uninstall", name)
	}
	instance := client.MatchingLabels{"app.kubernetes.io/instance": "buildkite-operator"}
	for _, list := range []client.ObjectList{&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{},
		&admissionregistrationv1.ValidatingWebhookConfigurationList{}, &admissionregistrationv1.MutatingWebhookConfigurationList{}} {
		require.NoError(t, e.Client.List(ctx, list, instance))
		items, err := meta.ExtractList(list)
		require.NoError(t, err)
		assert.Empty(t, items, "%T left after the documented uninstall", list)
	}
}

// shellBlockAfter is the first ```sh block after heading in a Markdown document.
func shellBlockAfter(t *testing.T, doc, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	require.True(t, ok, "docs/install.md has no heading %q", heading)
	_, rest, ok = strings.Cut(rest, "```sh\n")
	require.True(t, ok, "no sh block after %q", heading)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok, "the sh block after %q does not end", heading)
	return block
}

// runShell runs script with bash -e in dir, kubectl from binDir and the cluster's
// kubeconfig; what it logs shows secret, when set, as <agent token>.
func runShell(ctx context.Context, t *testing.T, binDir, kubeconfig, dir, script, secret string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+binDir+":"+os.Getenv("PATH"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	shown := fmt.Sprintf("$ %s\n%s", strings.TrimSpace(script), out.String())
	if secret != "" {
		shown = strings.ReplaceAll(shown, secret, "<agent token>")
	}
	t.Logf("%s", shown)
	require.NoError(t, err, "the documented commands failed")
}
