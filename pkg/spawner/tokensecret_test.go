package spawner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/attacker"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// markUnreportable records on the BuildJob what the controller records of a job it could
// not report because its token Secret is gone (pkg/controller's unreportable): the
// outcome (Finished True, with finished as its message), reportedAt, and Reported False
// with reason TokenSecretMissing.
func markUnreportable(t *testing.T, ns, name, finished, reason string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var bj v1alpha1.BuildJob
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &bj))
		now := metav1.Now()
		exit := int32(-1)
		bj.Status.ExitStatus = &exit
		bj.Status.Phase = v1alpha1.PhaseFailed
		bj.Status.Times.FinishedAt, bj.Status.Times.ReportedAt = &now, &now
		bj.Status.Message = finished + " Buildkite was not told how the job ended: the job token Secret is missing."
		meta.SetStatusCondition(&bj.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionFinished, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPodFailed, Message: finished,
		})
		meta.SetStatusCondition(&bj.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionReported, Status: metav1.ConditionFalse, Reason: reason,
			Message: "Buildkite was not told how the job ended: the job token Secret is missing",
		})
		err := env.Client.Status().Update(ctx, &bj)
		if apierrors.IsConflict(err) {
			return false
		}
		require.NoError(t, err)
		return true
	}, 10*time.Second, 20*time.Millisecond)
}

// Row 4 of issue 23: a job's token Secret deleted by a namespace editor makes the controller let its
// BuildJob go unreported. The job must not stay accepted or running on Buildkite until
// its timeout: the slot, which accepted it and still holds its token, finishes it once,
// with -1, agent_stop and an explanation after whatever output the pod sent; a job
// Buildkite already ended is left as it is. Either way the slot takes the next job.
func TestTokenSecretDeletedFinishesTheJob(t *testing.T) {
	const finished = "The job's container ended with exit code 137 before the supervisor recorded how the job ended."
	cases := []struct {
		name string
		// pod does, with the job token, what the job's pod did before the Secret went.
		pod func(t *testing.T, bk *agentapi.Client, jobID string)
		// stoppedBefore: Buildkite had already ended the job: the slot finishes nothing.
		stoppedBefore bool
		// logStart is what the log starts with: the pod's output, before the explanation.
		logStart string
	}{{
		name: "the pod never started the job",
		pod:  func(*testing.T, *agentapi.Client, string) {},
	}, {
		name: "the pod started the job and sent output",
		pod: func(t *testing.T, bk *agentapi.Client, jobID string) {
			ctx := context.Background()
			require.NoError(t, bk.Start(ctx, jobID, time.Now()))
			require.NoError(t, bk.UploadChunk(ctx, jobID, 1, 0, []byte("some output\n")))
		},
		logStart: "some output\n",
	}, {
		name: "the pod's supervisor had finished the job",
		pod: func(t *testing.T, bk *agentapi.Client, jobID string) {
			ctx := context.Background()
			require.NoError(t, bk.Start(ctx, jobID, time.Now()))
			require.NoError(t, bk.Finish(ctx, jobID, agentapi.Finish{ExitStatus: 0}))
		},
		stoppedBefore: true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			fake := startFake(t)
			startSpawner(t, fake, ns, oneSlot)
			b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
			require.NoError(t, err)
			jobID := b.Jobs[0]
			bj := waitBuildJob(t, fake, ns, jobID)

			var sec corev1.Secret
			require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bj.Spec.TokenSecretRef.Name}, &sec))
			bk := agentapi.New(agentapi.Config{Endpoint: fake.Endpoint(), Token: string(sec.Data[bj.Spec.TokenSecretRef.KeyOrDefault()])})
			tc.pod(t, bk, jobID)
			// A namespace editor deletes it.
			mallory, err := attacker.Client(context.Background(), env.Client, env.Config, ns)
			require.NoError(t, err)
			require.NoError(t, mallory.Delete(context.Background(), &sec))
			markUnreportable(t, ns, bj.Name, finished, v1alpha1.ReasonTokenSecretMissing)

			if tc.stoppedBefore {
				waitFor(t, fake, 20*time.Second, "the slot to let the job go", func() bool { return slotIdle(t, ns) })
				j, _ := fake.Job(jobID)
				assert.Equal(t, 1, j.FinishCount, "finished once, by the pod")
				assert.Equal(t, "0", j.ExitStatus)
			} else {
				waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
				j, _ := fake.Job(jobID)
				assert.Equal(t, 1, j.FinishCount)
				assert.Equal(t, "-1", j.ExitStatus)
				assert.Equal(t, agentapi.SignalReasonAgentStop, j.SignalReason)
				log := fakebuildkite.PlainLog(j.Log)
				assert.True(t, strings.HasPrefix(log, tc.logStart), "the pod's output first, then the explanation: %q", log)
				for _, want := range []string{
					"the job token Secret " + bj.Spec.TokenSecretRef.Name + " was deleted before the job's end was reported to Buildkite",
					finished,
					"finished it with the token it accepted the job with",
				} {
					assert.Contains(t, log, want)
				}
				assert.NotContains(t, log, "bkaj_", "no token in the log")
			}

			// The slot is free again: the next job runs.
			startReporter(t, ns, 0)
			b2, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
			require.NoError(t, err)
			waitJobsFinished(t, fake, b2.Jobs, 30*time.Second)
			j2, _ := fake.Job(b2.Jobs[0])
			assert.Equal(t, "0", j2.ExitStatus)
			j, _ := fake.Job(jobID)
			assert.Equal(t, 1, j.FinishCount, "still finished exactly once")
		})
	}
}

// A BuildJob made by an operator from before intake nonces has no intake annotation, so
// the controller takes it for one made by hand and reports nothing (MadeByHand). Its slot,
// which knows it as its own, finishes the job rather than leave it accepted on Buildkite.
func TestOlderBuildJobReportedAsMadeByHandIsFinished(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startSpawner(t, fake, ns, oneSlot)
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	bj := waitBuildJob(t, fake, ns, b.Jobs[0])
	markUnreportable(t, ns, bj.Name, "The job's command exited with status 0.", v1alpha1.ReasonMadeByHand)

	waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
	j, _ := fake.Job(b.Jobs[0])
	assert.Equal(t, 1, j.FinishCount)
	assert.Equal(t, "-1", j.ExitStatus)
	assert.Contains(t, fakebuildkite.PlainLog(j.Log), "made by an older version of the operator")
}
