package spawner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// reportAndCheckOnce reports the build's BuildJobs as the controller would, waits for its
// jobs to finish, and checks that jobID passed, was accepted once and finished once.
func reportAndCheckOnce(t *testing.T, fake *fakebuildkite.Server, ns string, b *fakebuildkite.Build, jobID string) {
	t.Helper()
	rep := startReporter(t, ns, 0)
	waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
	j, _ := fake.Job(jobID)
	assert.Equal(t, "0", j.ExitStatus)
	assert.Equal(t, 1, j.FinishCount)
	assert.Equal(t, 1, j.AcceptCount)
	assert.Empty(t, rep.Errors())
}

// oneSlot configures a spawner of one slot.
func oneSlot(c *spawner.Config) { c.Slots = 1 }

// oneJobThenStop runs a spawner of one slot until the job of a new build of yaml (one
// step) has its BuildJob, then stops it as SIGTERM would, its job in hand. It returns the
// BuildJob and the build.
func oneJobThenStop(t *testing.T, fake *fakebuildkite.Server, ns, yaml string) (v1alpha1.BuildJob, *fakebuildkite.Build) {
	t.Helper()
	first := startSpawner(t, fake, ns, oneSlot)
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: yaml})
	require.NoError(t, err)
	bj := waitBuildJob(t, fake, ns, b.Jobs[0])
	first.stop()
	return bj, b
}

// waitBuildJob waits until the job's BuildJob is made, with its token Secret (made
// last), and returns the BuildJob.
func waitBuildJob(t *testing.T, fake *fakebuildkite.Server, ns, jobID string) v1alpha1.BuildJob {
	t.Helper()
	var bj v1alpha1.BuildJob
	waitFor(t, fake, 20*time.Second, "the job's BuildJob and its token Secret", func() bool {
		var ok bool
		if bj, ok = buildJobs(t, ns)[jobID]; !ok {
			return false
		}
		var sec corev1.Secret
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bj.Spec.TokenSecretRef.Name}, &sec)
		require.NoError(t, client.IgnoreNotFound(err))
		return err == nil
	})
	return bj
}

// TestResumeAdoptsTheBuildJob restarts the spawner while its job runs, after the job's
// BuildEnvironment changed so that the job would no longer pass the intake checks. The
// BuildJob exists: the resumed slot must take it as it is and wait for it, not check the
// job again (and fail a job whose pod is running) nor create anything anew.
func TestResumeAdoptsTheBuildJob(t *testing.T) {
	deleteEnvironment := func(t *testing.T, ns string) {
		be := &v1alpha1.BuildEnvironment{}
		be.Name, be.Namespace = "go", ns
		require.NoError(t, env.Client.Delete(context.Background(), be))
	}
	cases := []struct {
		name   string
		change func(t *testing.T, ns string)
		// fault, when set, is injected into Buildkite before the restart.
		fault *fakebuildkite.Fault
	}{{
		name:   "environment deleted",
		change: deleteEnvironment,
	}, {
		// As if the spawner had died between creating the BuildJob and its token Secret:
		// the resumed slot accepts the job again for its token, and adopts the BuildJob.
		name: "environment deleted, token Secret not made",
		change: func(t *testing.T, ns string) {
			deleteEnvironment(t, ns)
			forgetTokenSecret(t, ns)
		},
	}, {
		// The chaos soak's lost job: Buildkite answers the resumed slot's accept with a 5xx,
		// which is no answer; the job, already this agent's, must not be dropped.
		name: "token Secret not made, the accept again answered 502",
		change: func(t *testing.T, ns string) {
			forgetTokenSecret(t, ns)
		},
		fault: &fakebuildkite.Fault{Endpoint: fakebuildkite.EPAccept, Status: 502, Times: 2},
	}, {
		name: "environment narrowed to other pipelines",
		change: func(t *testing.T, ns string) {
			var be v1alpha1.BuildEnvironment
			require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "go"}, &be))
			be.Spec.AllowedPipelines = []string{"someone-else-*"}
			require.NoError(t, env.Client.Update(context.Background(), &be))
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			fake := startFake(t)
			before, b := oneJobThenStop(t, fake, ns, pipeline(1, goPlugin))
			jobID := b.Jobs[0]

			tc.change(t, ns)
			if tc.fault != nil {
				fake.Inject(*tc.fault)
			}
			restarted := time.Now()
			startSpawner(t, fake, ns, oneSlot)
			// The job keeps "running" until the resumed slot has heartbeaten: by then it has
			// done whatever it does with the job, which a slot that re-ran the intake would
			// have failed.
			j, _ := fake.Job(jobID)
			waitFor(t, fake, 20*time.Second, "a heartbeat of the resumed slot", func() bool {
				for _, r := range fake.Requests() {
					if r.Endpoint == fakebuildkite.EPHeartbeat && r.AgentID == j.AcceptedBy && r.Time.After(restarted) {
						return true
					}
				}
				return false
			})
			rep := startReporter(t, ns, 0)
			waitJobsFinished(t, fake, b.Jobs, 30*time.Second)

			j, _ = fake.Job(jobID)
			assert.Equal(t, "0", j.ExitStatus, "the job ran to its end; log:\n%s", fakebuildkite.PlainLog(j.Log))
			assert.Empty(t, j.SignalReason)
			assert.Equal(t, 1, j.FinishCount)
			assert.NotContains(t, fakebuildkite.PlainLog(j.Log), spawner.FailurePrefix)
			assert.Empty(t, rep.Errors())
			after := buildJobs(t, ns)[jobID]
			assert.Equal(t, before.UID, after.UID, "the BuildJob is the one made before the restart")
		})
	}
}

// TestBuildJobGoneUnreported deletes a BuildJob that was never reported, and forces it out
// (finalizer removed), as a cluster operator cleaning up by hand might. The job must not
// stay accepted in Buildkite for ever: the slot fails it, once, with an explanation, and
// takes the next job. A BuildJob that was reported and is then gone is over for the slot
// without another finish, even when the spawner did not see the report.
func TestBuildJobGoneUnreported(t *testing.T) {
	forceDelete := func(t *testing.T, ns, name string) {
		t.Helper()
		ctx := context.Background()
		var bj v1alpha1.BuildJob
		key := client.ObjectKey{Namespace: ns, Name: name}
		require.NoError(t, env.Client.Get(ctx, key, &bj))
		require.NoError(t, env.Client.Delete(ctx, &bj))
		require.Eventually(t, func() bool {
			err := env.Client.Get(ctx, key, &bj)
			if apierrors.IsNotFound(err) {
				return true
			}
			if err == nil && len(bj.Finalizers) > 0 {
				bj.Finalizers = nil
				_ = env.Client.Update(ctx, &bj)
			}
			return false
		}, 10*time.Second, 50*time.Millisecond, "BuildJob %s still there", name)
	}

	t.Run("never reported", func(t *testing.T) {
		ns := newNamespace(t)
		fake := startFake(t)
		startSpawner(t, fake, ns, oneSlot)
		b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
		require.NoError(t, err)
		jobID := b.Jobs[0]
		bj := waitBuildJob(t, fake, ns, jobID)
		assert.Contains(t, bj.Finalizers, v1alpha1.FinishFinalizer, "created with the controller's finalizer")

		forceDelete(t, ns, bj.Name)
		waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
		assertFailedAtIntake(t, fake, ns, jobID, "BuildJob "+bj.Name+" was deleted before the job's end was reported")

		// The slot is free again: the next job runs.
		startReporter(t, ns, 0)
		b2, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
		require.NoError(t, err)
		waitJobsFinished(t, fake, b2.Jobs, 30*time.Second)
		j2, _ := fake.Job(b2.Jobs[0])
		assert.Equal(t, "0", j2.ExitStatus)
		// Still finished exactly once, whatever the slot did since.
		j, _ := fake.Job(jobID)
		assert.Equal(t, 1, j.FinishCount)
	})

	t.Run("deleted unreported while the spawner was down, its job running", func(t *testing.T) {
		ns := newNamespace(t)
		fake := startFake(t)
		bj, b := oneJobThenStop(t, fake, ns, pipeline(1, goPlugin))
		jobID := b.Jobs[0]
		// The job's pod started it, as its supervisor does; then the BuildJob went, and the
		// slot's Secret holds only the marker of the job.
		var sec corev1.Secret
		require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bj.Spec.TokenSecretRef.Name}, &sec))
		bk := agentapi.New(agentapi.Config{Endpoint: fake.Endpoint(), Token: string(sec.Data[bj.Spec.TokenSecretRef.KeyOrDefault()])})
		require.NoError(t, bk.Start(context.Background(), jobID, time.Now()))
		forceDelete(t, ns, bj.Name)

		startSpawner(t, fake, ns, oneSlot)
		waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
		assertFailedAtIntake(t, fake, ns, jobID, "BuildJob "+bj.Name+" was deleted before the job's end was reported")
		_, again := buildJobs(t, ns)[jobID]
		assert.False(t, again, "a started job is not run a second time")
	})

	t.Run("reported while the spawner was down", func(t *testing.T) {
		ns := newNamespace(t)
		fake := startFake(t)
		bj, b := oneJobThenStop(t, fake, ns, pipeline(1, goPlugin))
		jobID := b.Jobs[0]

		rep := startReporter(t, ns, 0)
		waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
		require.Eventually(t, func() bool {
			cur, ok := buildJobs(t, ns)[jobID]
			return ok && cur.Status.Times.ReportedAt != nil
		}, 10*time.Second, 50*time.Millisecond)
		forceDelete(t, ns, bj.Name)

		startSpawner(t, fake, ns, oneSlot)
		waitFor(t, fake, 20*time.Second, "the resumed slot to let the job go", func() bool {
			return connectedAgents(fake, "bk-operator-test-") == 1 && slotIdle(t, ns)
		})
		j, _ := fake.Job(jobID)
		assert.Equal(t, 1, j.FinishCount, "no second finish")
		assert.Equal(t, "0", j.ExitStatus)
		assert.Empty(t, rep.Errors())
	})
}

// forgetTokenSecret deletes the token Secret of the only BuildJob in ns.
func forgetTokenSecret(t *testing.T, ns string) {
	t.Helper()
	var list v1alpha1.BuildJobList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	require.Len(t, list.Items, 1)
	sec := &corev1.Secret{}
	sec.Name, sec.Namespace = list.Items[0].Spec.TokenSecretRef.Name, ns
	require.NoError(t, env.Client.Delete(context.Background(), sec))
}

// TestResumeWritesNothingPerJob: a slot writes its state Secret once per job (the marker
// before the accept), and a slot resumed from that marker alone takes up the job as it
// was: it waits for the job's BuildJob, which then runs to its end, accepted once.
func TestResumeWritesNothingPerJob(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	_, b := oneJobThenStop(t, fake, ns, pipeline(1, goPlugin))
	jobID := b.Jobs[0]
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: ns, Name: spawner.SlotSecretName("bk-operator-test", 0)}
	require.NoError(t, env.Client.Get(context.Background(), key, &sec))
	assert.Equal(t, jobID, string(sec.Data["accepting"]), "the marker names the job")
	for _, k := range []string{"job-id", "job-token", "job", "buildjob"} {
		assert.NotContains(t, sec.Data, k, "written only when the job goes wrong")
	}

	startSpawner(t, fake, ns, oneSlot)
	reportAndCheckOnce(t, fake, ns, b, jobID)
}

// slotIdle reports whether the spawner's only slot holds no job.
func slotIdle(t *testing.T, ns string) bool {
	t.Helper()
	return !slotHolds(t, ns, "job-id") && !slotHolds(t, ns, "accepting")
}

// slotHolds reports whether the state Secret of the spawner's only slot has key.
func slotHolds(t *testing.T, ns, key string) bool {
	t.Helper()
	var sec corev1.Secret
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: spawner.SlotSecretName("bk-operator-test", 0)}, &sec)
	require.NoError(t, client.IgnoreNotFound(err))
	return len(sec.Data[key]) > 0
}
