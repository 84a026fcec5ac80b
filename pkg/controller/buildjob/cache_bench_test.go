package buildjob_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// BenchmarkCacheRetainedBuildJobs measures what one reported BuildJob, retained until its
// reaping, costs in the heap of an informer cache: BK_BENCH_JOBS (2000) reported BuildJobs,
// shaped as the spawner makes them from a job of the fake Buildkite, are listed into a
// fresh cache, and the heap in use after a GC, less that of the same cache on an empty
// namespace, is divided by their number. Two caches: "whole" is agentd's before BuildJobs
// were trimmed (managedFields stripped, nothing else), "trimmed" is ConfigureCache's. Each
// iteration is one run; run three and read min/median/max:
//
//	go test ./pkg/controller/buildjob/ -run '^$' -bench CacheRetained -benchtime=3x
func BenchmarkCacheRetainedBuildJobs(b *testing.B) {
	f := retainedFixture(b)
	variants := []struct {
		name string
		opts func(ns string) cache.Options
	}{
		{"whole", func(ns string) cache.Options {
			return cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}},
				DefaultTransform: cache.TransformStripManagedFields()}
		}},
		{"trimmed", func(ns string) cache.Options {
			opts := cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}}
			buildjob.ConfigureCache(&opts)
			return opts
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			var perJob []float64
			for range b.N {
				empty := cacheHeap(b, v.opts(f.emptyNS), 0)
				full := cacheHeap(b, v.opts(f.ns), f.n)
				perJob = append(perJob, float64(full-empty)/float64(f.n))
			}
			slices.Sort(perJob)
			b.ReportMetric(perJob[0], "B/job-min")
			b.ReportMetric(perJob[len(perJob)/2], "B/job-median")
			b.ReportMetric(perJob[len(perJob)-1], "B/job-max")
			b.Logf("%s: %d BuildJobs of %d env names each, bytes per job of each run: %.0f", v.name, f.n, f.envNames, perJob)
		})
	}
}

// cacheHeap is the heap in use, after a GC, held by a cache made with opts once it has
// listed the BuildJobs of its namespace (want of them), less the heap in use before.
func cacheHeap(b *testing.B, opts cache.Options, want int) int64 {
	b.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)

	c, err := cache.New(env.Config, opts)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Start(ctx) }()
	_, err = c.GetInformer(ctx, &bkv1.BuildJob{})
	require.NoError(b, err)
	require.True(b, c.WaitForCacheSync(ctx))
	var list bkv1.BuildJobList
	require.NoError(b, c.List(ctx, &list))
	require.Len(b, list.Items, want)
	list = bkv1.BuildJobList{}

	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(c)
	cancel()
	<-done
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// fixture is the namespace of n reported BuildJobs, and an empty one, made once per process.
type fixture struct {
	ns, emptyNS string
	n           int
	// envNames counts the env names of each BuildJob (spec.envNames).
	envNames int
}

var (
	fixtureOnce sync.Once
	theFixture  fixture
	fixtureErr  error
)

func retainedFixture(b *testing.B) fixture {
	b.Helper()
	fixtureOnce.Do(func() { theFixture, fixtureErr = makeFixture() })
	require.NoError(b, fixtureErr)
	return theFixture
}

func makeFixture() (fixture, error) {
	n := 2000
	if v := os.Getenv("BK_BENCH_JOBS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return fixture{}, fmt.Errorf("BK_BENCH_JOBS=%q is not a positive number", v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f := fixture{ns: "bench-retained", emptyNS: "bench-empty", n: n}
	for _, ns := range []string{f.ns, f.emptyNS} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return f, fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	job, err := fakeJob(ctx)
	if err != nil {
		return f, err
	}
	f.envNames = len(retainedBuildJob(job, f.ns, 0).Spec.EnvNames)
	// n BuildJobs written by 8 workers: the API server takes them in about half a minute.
	names := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				if err := createRetained(ctx, retainedBuildJob(job, f.ns, i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() {
		defer close(names)
		for i := range n {
			select {
			case names <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		return f, err
	}
	return f, ctx.Err()
}

// createRetained stores bj as the controller leaves it once reported: its status written,
// no finalizer.
func createRetained(ctx context.Context, bj *bkv1.BuildJob) error {
	st := bj.Status
	if err := env.Client.Create(ctx, bj); err != nil {
		return fmt.Errorf("creating BuildJob %s: %w", bj.Name, err)
	}
	bj.Status = st
	if err := env.Client.Status().Update(ctx, bj); err != nil {
		return fmt.Errorf("writing the status of BuildJob %s: %w", bj.Name, err)
	}
	return nil
}

// benchPipeline is a step as pipelines write them: a label, a key, two commands, the
// operator's plugin, agent tags, artifact paths, a timeout, and env of the pipeline's and
// the step's own (their names go into the BuildJob, their values into its Secret).
const benchPipeline = `env:
  GOFLAGS: -mod=readonly
  DOCKER_BUILDKIT: "1"
  AWS_REGION: eu-west-1
  AWS_DEFAULT_REGION: eu-west-1
  SERVICE_NAME: payments-api
steps:
  - label: ":go: unit tests"
    key: unit-tests
    command:
      - make lint
      - go test -race -count=1 -coverprofile=coverage/unit.out ./...
    env:
      GOCACHE: /workspace/.cache/go-build
      GOMODCACHE: /workspace/.cache/go-mod
      CGO_ENABLED: "1"
      TEST_DATABASE_URL: postgres://test@localhost:5432/test?sslmode=disable
      REDIS_URL: redis://localhost:6379/0
      LOG_LEVEL: debug
      FEATURE_FLAGS: new-checkout,fast-refunds
    agents:
      queue: bk-operator
      cluster: prod
    artifact_paths: "coverage/**/*"
    timeout_in_minutes: 30
    plugins:
      - buildkite-operator#v0.1.0:
          build_environment: go
          log_paths:
            - /workspace/service.log
`

// fakeJob is a job of benchPipeline as the fake Buildkite hands it to an agent that
// accepts it.
func fakeJob(ctx context.Context) (*api.Job, error) {
	bk, err := fakebuildkite.Start(fakebuildkite.Options{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = bk.Close() }()
	if _, err := bk.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "payments-api", Org: "acme", PipelineYAML: benchPipeline,
		Repo: "git@github.com:acme/payments-api.git", Branch: "feature/faster-refunds", Commit: "3f2b1c0d9e8f0190f1b48c1e4a6a9d7e3f2b1c0d",
		Message: "Make refunds faster\n\nRefunds are batched per merchant instead of one by one."}); err != nil {
		return nil, fmt.Errorf("creating a build on the fake: %w", err)
	}
	reg := agentapi.New(agentapi.Config{Endpoint: bk.Endpoint(), Token: bk.RegistrationToken(), WaitScale: 0.001})
	ar, err := reg.Register(ctx, &api.AgentRegisterRequest{Name: "bench", Tags: []string{"queue=bk-operator", "cluster=prod"}})
	if err != nil {
		return nil, fmt.Errorf("registering with the fake: %w", err)
	}
	agent := reg.WithToken(ar.AccessToken)
	if err := agent.Connect(ctx); err != nil {
		return nil, fmt.Errorf("connecting to the fake: %w", err)
	}
	for ctx.Err() == nil {
		p, err := agent.Ping(ctx)
		if err == nil && p.Job != nil {
			return agent.Accept(ctx, p.Job.ID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, ctx.Err()
}

// retainedBuildJob is the i-th BuildJob of the fixture: job's, as the spawner makes it
// (pkg/spawner's buildJobFor, moveEnvToSecret, prepare; labels by validation.ApplyDefaults),
// under a name of its own, with the status the controller leaves once it has reported it.
func retainedBuildJob(job *api.Job, ns string, i int) *bkv1.BuildJob {
	id := fmt.Sprintf("%08x-8c1e-4a6a-9d7e-%012x", i, i)
	nonce := fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15)
	envNames := map[string]string{}
	maps.Copy(envNames, job.Env)
	agentEnv, err := jobpolicy.AgentEnv(job)
	if err != nil {
		panic(err)
	}
	maps.Copy(envNames, agentEnv)
	delete(envNames, "BUILDKITE_AGENT_ACCESS_TOKEN")
	delete(envNames, "BUILDKITE_AGENT_TOKEN")
	number, _ := strconv.ParseInt(job.Env["BUILDKITE_BUILD_NUMBER"], 10, 64)
	timeout := int32(30)
	bj := &bkv1.BuildJob{
		ObjectMeta: metav1.ObjectMeta{
			Name: id, Namespace: ns,
			Annotations: map[string]string{
				bkv1.AnnotationAcceptedAt: time.Now().UTC().Format(time.RFC3339Nano),
				bkv1.AnnotationIntake:     nonce,
			},
		},
		Spec: bkv1.BuildJobSpec{
			JobID:            id,
			OrganizationSlug: job.Env["BUILDKITE_ORGANIZATION_SLUG"],
			PipelineSlug:     job.Env["BUILDKITE_PIPELINE_SLUG"],
			BuildID:          job.Env["BUILDKITE_BUILD_ID"],
			BuildNumber:      number,
			BuildURL:         job.Env["BUILDKITE_BUILD_URL"],
			StepKey:          job.Env["BUILDKITE_STEP_KEY"],
			Label:            job.Env["BUILDKITE_LABEL"],
			Command:          job.Env["BUILDKITE_COMMAND"],
			AgentTags:        map[string]string{"queue": "bk-operator", "cluster": "prod"},
			EnvNames:         slices.Sorted(maps.Keys(envNames)),
			BuildEnvironment: "go",
			LogPaths:         []string{"/workspace/service.log"},
			TimeoutMinutes:   &timeout,
			Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")},
			},
			TokenSecretRef: bkv1.SecretKeyRef{Name: bkv1.TokenSecretName(id, nonce), Key: bkv1.DefaultSecretKey},
			AgentEndpoint:  "https://agent.buildkite.com/v3",
			LogLimits:      bkv1.LogLimits{ChunksMaxSizeBytes: 102400, ChunksIntervalSeconds: 1, LogMaxSizeBytes: 1 << 30},
		},
	}
	validation.ApplyDefaults(bj, "go", nil)
	bj.Status = reportedStatus(bj)
	return bj
}

// reportedStatus is the status the controller writes for a job whose command exited 0 and
// whose supervisor finished it on Buildkite.
func reportedStatus(bj *bkv1.BuildJob) bkv1.BuildJobStatus {
	t := func(d time.Duration) *metav1.Time {
		at := metav1.NewTime(time.Now().Add(d).Truncate(time.Second))
		return &at
	}
	cond := func(typ, reason, msg string, d time.Duration) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: 1, LastTransitionTime: *t(d)}
	}
	exit := int32(0)
	return bkv1.BuildJobStatus{
		Phase: bkv1.PhaseSucceeded, ExitStatus: &exit, PodName: bj.Name,
		Times: bkv1.BuildJobTimes{AcceptedAt: t(-90 * time.Second), PodCreatedAt: t(-89 * time.Second),
			StartedAt: t(-80 * time.Second), FinishedAt: t(-time.Second), ReportedAt: t(0)},
		Log:                bkv1.LogProgress{Bytes: 184_320, Chunks: 19},
		Message:            "The job's command exited with status 0.",
		ObservedGeneration: 1,
		Conditions: []metav1.Condition{
			cond(bkv1.ConditionPodCreated, bkv1.ReasonPodCreated, "Pod "+bj.Name+" created", -89*time.Second),
			cond(bkv1.ConditionStarted, bkv1.ReasonCommandRan, "The job's command ran", -80*time.Second),
			cond(bkv1.ConditionFinished, bkv1.ReasonExited, "The job's command exited with status 0.", -time.Second),
			cond(bkv1.ConditionReported, bkv1.ReasonReported, "The job's supervisor finished the job on Buildkite with exit status 0", 0),
		},
	}
}
