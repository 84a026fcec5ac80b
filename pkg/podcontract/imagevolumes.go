package podcontract

// A job pod whose binaries come from image volumes (podbuilder's BinariesImageVolume)
// mounts the operator's image and the agent's image read-only, each at its folder of
// programs, instead of copying agentd-supervise and buildkite-agent in init containers.
// Kubernetes mounts only folders of an image volume (a subPath that names a file is
// refused by the container runtime), so each image's ImageBinDir gets a folder of its own
// under BinDir.
const (
	// SupervisorImageVolume is the image volume of the operator's image.
	SupervisorImageVolume = "agentd-image"
	// AgentImageVolume is the image volume of the agent's image.
	AgentImageVolume = "buildkite-agent-image"
	// ImageBinDir is the folder of both images that holds their programs
	// (ImageSupervisorPath, AgentImageBinaryPath), as an image volume's subPath.
	ImageBinDir = "usr/local/bin"
	// SupervisorImageDir is where the job container sees the operator image's ImageBinDir.
	SupervisorImageDir = BinDir + "/agentd"
	// AgentImageDir is where the job container sees the agent image's ImageBinDir: the
	// job's BUILDKITE_BIN_PATH. Bootstrap puts it last on the job's PATH, as an agent does
	// with the folder of its own binary, so the agent image's other programs never shadow
	// the job image's.
	AgentImageDir = BinDir + "/agent"
)
