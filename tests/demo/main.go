// Command demo runs buildkite-operator on the embedded default: a local control plane and a
// local fake of Buildkite, with the CRDs and a sample BuildEnvironment installed, and agentd
// running against them. Ctrl-C stops everything.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

func main() {
	agentd := flag.String("agentd", filepath.Join(testenv.RepoRoot(), "bin", "agentd"), "the agentd binary to run")
	flag.Parse()
	if err := run(*agentd); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(agentd string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Println("==> starting a local control plane (kube-apiserver + etcd)")
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("==> stopping the control plane")
		_ = env.Stop()
	}()

	const ns = "buildkite"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	sample := &bkv1.BuildEnvironment{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns},
		Spec:       bkv1.BuildEnvironmentSpec{Image: "bk-operator/job:dev", ImagePullPolicy: corev1.PullNever},
	}
	if err := env.Client.Create(ctx, sample); err != nil {
		return fmt.Errorf("creating the sample BuildEnvironment: %w", err)
	}

	fmt.Printf("==> control plane ready; inspect it with:\n    kubectl --kubeconfig %s get buildenvironments,buildjobs -n %s\n", env.KubeconfigPath, ns)
	fmt.Println("==> running agentd operator (Ctrl-C stops everything)")
	cmd := exec.CommandContext(ctx, agentd, "operator", "--namespace", ns, "--leader-elect=false",
		"--webhooks=false", "--spawner=false", "--metrics-bind-address", "127.0.0.1:8080", "--health-probe-bind-address", "127.0.0.1:8081")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.KubeconfigPath)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if err := cmd.Run(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("agentd operator: %w", err)
	}
	return nil
}
