package validation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Admission is what the API server's admission chain does to a new BuildJob: Default (the
// mutating webhook), then Check (the validating webhook). The webhooks call the two steps,
// each in its own admission request; the spawner, which must know before it creates a
// BuildJob whether the API server will take it, calls Admit, which runs the same two steps
// against one reading of the environment. Neither has a defaulting or a check of its own,
// so the two cannot drift apart.
type Admission struct {
	// Reader looks up what a BuildJob is checked against: its BuildEnvironment, the
	// LimitRanges of its namespace and, for the message of a job that cannot use its
	// environment, the namespace's BuildEnvironments. An uncached reader (the manager's
	// APIReader) or CacheFirst: a BuildEnvironment created a moment ago must be seen.
	Reader client.Reader
	// DefaultEnvironment is the BuildEnvironment of a BuildJob that names none.
	DefaultEnvironment string
}

// Verdict is what Check found in a BuildJob.
type Verdict struct {
	// Problems make the BuildJob invalid, each saying what to fix.
	Problems field.ErrorList
	// Warnings are what is legal but likely a mistake.
	Warnings []string
	// Environment is the BuildEnvironment the BuildJob was checked against: the one its
	// spec.buildEnvironment names, nil when it names none or that one does not exist.
	Environment *bkv1.BuildEnvironment
}

// Default looks up the BuildEnvironment job runs in (the default one when it names none)
// and fills in what job leaves out (ApplyDefaults). The error is for a failed lookup only.
func (a Admission) Default(ctx context.Context, job *bkv1.BuildJob) error {
	_, err := a.defaults(ctx, job)
	return err
}

// Check looks up what job is checked against and checks it (BuildJob), as it is: the
// validating webhook sees the BuildJob the mutating one made. The error is for a failed
// lookup only; what is wrong with job is in the Verdict.
func (a Admission) Check(ctx context.Context, job *bkv1.BuildJob) (Verdict, error) {
	env, err := GetEnvironment(ctx, a.Reader, job.Namespace, job.Spec.BuildEnvironment)
	if err != nil {
		return Verdict{}, err
	}
	return a.checkAgainst(ctx, job, env)
}

// Admit defaults job, then checks it, as the admission chain would on its create: the
// environment Default reads is the one Check would, so it is read once. job is changed
// (defaulted) even when the Verdict has problems. The error is for a failed lookup only;
// job may then be half defaulted, so a caller that retries starts again from a copy.
func (a Admission) Admit(ctx context.Context, job *bkv1.BuildJob) (Verdict, error) {
	env, err := a.defaults(ctx, job)
	if err != nil {
		return Verdict{}, err
	}
	return a.checkAgainst(ctx, job, env)
}

// defaults is Default, returning the environment job now names (nil when there is none).
func (a Admission) defaults(ctx context.Context, job *bkv1.BuildJob) (*bkv1.BuildEnvironment, error) {
	env, err := GetEnvironment(ctx, a.Reader, job.Namespace, EnvironmentName(job, a.DefaultEnvironment))
	if err != nil {
		return nil, err
	}
	ApplyDefaults(job, a.DefaultEnvironment, env)
	return env, nil
}

// checkAgainst checks job against env, the environment its spec.buildEnvironment names,
// with the LimitRanges of its namespace and, only when job cannot use env, the
// namespace's environments for the message: an extra request on a path that fails anyway.
func (a Admission) checkAgainst(ctx context.Context, job *bkv1.BuildJob, env *bkv1.BuildEnvironment) (Verdict, error) {
	var limits corev1.LimitRangeList
	if err := a.Reader.List(ctx, &limits, client.InNamespace(job.Namespace)); err != nil {
		return Verdict{}, fmt.Errorf("listing LimitRanges in namespace %q: %w", job.Namespace, err)
	}
	var available []bkv1.BuildEnvironment
	if job.Spec.BuildEnvironment == "" || env == nil || !PipelineAllowed(env, job.Spec.PipelineSlug) {
		var err error
		if available, err = ListEnvironments(ctx, a.Reader, job.Namespace); err != nil {
			return Verdict{}, err
		}
	}
	problems, warnings := BuildJob(job, env, limits.Items, available)
	return Verdict{Problems: problems, Warnings: warnings, Environment: env}, nil
}
