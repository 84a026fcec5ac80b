package v1alpha1

// MadeByHand reports whether job was made by someone other than the spawner: it lacks
// AnnotationIntake. Such a BuildJob runs its command in its environment, to try the
// environment without Buildkite, but is never given a job token, a job's env or a
// Buildkite job: the controller neither reads a token for it nor speaks to Buildkite.
func MadeByHand(job *BuildJob) bool {
	return job.Annotations[AnnotationIntake] == ""
}
