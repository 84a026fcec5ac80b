package v1alpha1

// TokenSecretName is the name of the Secret holding the job token of BuildJob
// buildJobName: with the intake's nonce in it, so that nobody can make a Secret of that
// name before the spawner does (the spawner would find it there and could not use it).
// Without a nonce (a BuildJob from before nonces), the name it had then.
func TokenSecretName(buildJobName, nonce string) string {
	if nonce == "" {
		return buildJobName + "-token"
	}
	return buildJobName + "-token-" + nonce
}
