// Package testenv starts a real kube-apiserver and etcd (controller-runtime's envtest,
// with binaries built from Go modules by `make envtest-assets`) with the project's
// CRDs installed. Integration tests use it instead of fake or mocked clients.
package testenv

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// Env is a running control plane.
type Env struct {
	*envtest.Environment
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	// KubeconfigPath is a kubeconfig file for kubectl.
	KubeconfigPath string
}

// Scheme returns a scheme with the Kubernetes built-in types and the project's API.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := bkv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Codecs decodes the project's and Kubernetes' types.
var Codecs = serializer.NewCodecFactory(Scheme())

// AssetsDir finds the folder holding kube-apiserver, etcd and kubectl: KUBEBUILDER_ASSETS
// when set (the Makefile sets it), else the newest .cache/envtest-* folder.
func AssetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	dirs, _ := filepath.Glob(filepath.Join(testkit.RepoRoot(), ".cache", "envtest-*"))
	sort.Strings(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "kube-apiserver")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("no kube-apiserver found: run `make envtest-assets` (or `make test`), which builds it into .cache/")
}

// Options adjusts the environment before it starts.
type Options func(*envtest.Environment)

// Start starts a control plane with the CRDs from crds/ installed. Stop it with Env.Stop.
func Start(opts ...Options) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	scheme := Scheme()
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(testkit.RepoRoot(), "crds")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	for _, o := range opts {
		o(te)
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest from %s: %w", assets, err)
	}
	env := &Env{Environment: te, Config: cfg, Scheme: scheme}
	if env.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("client for envtest: %w", err)
	}
	f, err := os.CreateTemp("", "envtest-kubeconfig-*")
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	if _, err := f.Write(te.KubeConfig); err != nil {
		_ = te.Stop()
		return nil, err
	}
	_ = f.Close()
	env.KubeconfigPath = f.Name()
	return env, nil
}

// Stop stops the control plane and removes its kubeconfig.
func (e *Env) Stop() error {
	if e.KubeconfigPath != "" {
		_ = os.Remove(e.KubeconfigPath)
	}
	return e.Environment.Stop()
}

// Kubectl is the kubectl binary envtest uses.
func (e *Env) Kubectl() string {
	return filepath.Join(e.BinaryAssetsDirectory, "kubectl")
}

// Run runs the tests of a package against one shared control plane, for TestMain:
//
//	func TestMain(m *testing.M) { testenv.Run(m, &env) }
//
// A fuzzing run (`go test -run '^$' -fuzz ...`, as `make fuzz` does) starts no control
// plane: its fuzz targets need none, and each fuzz worker is a process of its own that
// would otherwise start an API server and etcd before it fuzzes anything.
func Run(m *testing.M, env **Env, opts ...Options) {
	if fuzzingOnly() {
		os.Exit(m.Run())
	}
	e, err := Start(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stopping:", err)
	}
	os.Exit(code)
}

// fuzzingOnly says whether this test process only fuzzes: a fuzz worker, or the fuzzing
// coordinator told to run no tests.
func fuzzingOnly() bool {
	flag.Parse()
	value := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return value("test.fuzzworker") == "true" || (value("test.fuzz") != "" && value("test.run") == "^$")
}
