package podcontract

// The agent's image and the git credentials of a job pod: names the pod builder gives them,
// which a BuildEnvironment may not take for its own containers, volumes and mounts.
const (
	// AgentInstallContainer is the init container that runs the agent's image (Buildkite's
	// buildkite/agent, or the BuildEnvironment's spec.agent.image) to copy its
	// buildkite-agent, AgentImageBinaryPath, to AgentPath in BinVolume.
	AgentInstallContainer = "buildkite-agent-install"
	// AgentImageBinaryPath is where Buildkite's agent images (and images built from them)
	// keep buildkite-agent.
	AgentImageBinaryPath = "/usr/local/bin/buildkite-agent"

	// GitSSHVolume is the Secret of BuildEnvironment spec.git.sshSecret, mounted read-only
	// at GitSSHDir in the job container: the private key as GitSSHKeyFile, the known_hosts
	// lines, when given, as GitKnownHostsFile.
	GitSSHVolume      = "buildkite-git-ssh"
	GitSSHDir         = "/buildkite/git-ssh"
	GitSSHKeyFile     = "key"
	GitKnownHostsFile = "known_hosts"

	// GitCredentialsVolume is the Secret of BuildEnvironment spec.git.credentialsSecret,
	// mounted read-only at GitCredentialsDir in the job container: the git-credentials file
	// as GitCredentialsFile, or the username and password as GitUsernameFile and
	// GitPasswordFile.
	GitCredentialsVolume = "buildkite-git-credentials"
	GitCredentialsDir    = "/buildkite/git-credentials"
	GitCredentialsFile   = "git-credentials"
	GitUsernameFile      = "username"
	GitPasswordFile      = "password"
)
