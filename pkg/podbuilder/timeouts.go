package podbuilder

import (
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// gracePeriods are the pod's terminationGracePeriodSeconds and the supervisor's wait
// between SIGTERM and SIGKILL: spec.agent.cancelGracePeriodSeconds when set (the pod's
// grace period then long enough for it, unless the environment sets its own), else the
// pod's grace period less the margin the supervisor needs to send the last output.
func gracePeriods(s *bkv1.BuildEnvironmentSpec, opts Options) (grace, signalGrace time.Duration) {
	grace = DefaultGracePeriod
	if s.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*s.TerminationGracePeriodSeconds) * time.Second
	}
	cancel := s.Agent.CancelGracePeriodSeconds
	if cancel == nil {
		return grace, max(grace-opts.SignalGraceMargin, time.Second)
	}
	signalGrace = time.Duration(*cancel) * time.Second
	if s.TerminationGracePeriodSeconds == nil {
		return max(grace, signalGrace+opts.SignalGraceMargin), signalGrace
	}
	// The webhook refuses a grace period that does not exceed the cancel grace period; an
	// environment admitted without it still gets its SIGKILL from the supervisor first.
	return grace, max(min(signalGrace, grace-time.Second), time.Second)
}

// GracePeriod is the terminationGracePeriodSeconds of a job pod of env (nil: none), as
// Build sets it: how long the kubelet gives the pod's containers once it is deleted.
func GracePeriod(env *bkv1.BuildEnvironment, opts Options) time.Duration {
	var spec bkv1.BuildEnvironmentSpec
	if env != nil {
		spec = env.Spec
	}
	grace, _ := gracePeriods(&spec, opts)
	return grace
}

func seconds(d time.Duration) string {
	return strconv.FormatInt(int64(max(d, time.Second)/time.Second), 10)
}

// timeoutMinutes is the job's timeout: its own, else its environment's default; 0 for none.
func timeoutMinutes(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) int32 {
	if job.Spec.TimeoutMinutes != nil {
		return *job.Spec.TimeoutMinutes
	}
	if d := env.Spec.Timeouts.DefaultMinutes; d != nil {
		return *d
	}
	return 0
}

// setActiveDeadline gives the pod activeDeadlineSeconds when the job has a timeout: the
// timeout and opts.DeadlineMargin, a backstop past the supervisor's own end of the command.
func setActiveDeadline(pod *corev1.Pod, job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options) {
	if minutes := timeoutMinutes(job, env); minutes > 0 {
		deadline := int64((time.Duration(minutes)*time.Minute + opts.DeadlineMargin) / time.Second)
		pod.Spec.ActiveDeadlineSeconds = &deadline
	}
}
