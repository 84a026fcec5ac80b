package v1alpha1

// Condition types of a BuildJob.
const (
	// ConditionPodCreated is True once the job's pod exists.
	ConditionPodCreated = "PodCreated"
	// ConditionStarted is True once the job's command has started.
	ConditionStarted = "Started"
	// ConditionFinished is True once the job has ended, whatever the outcome.
	ConditionFinished = "Finished"
	// ConditionReported is True once Buildkite has accepted the job's finish.
	ConditionReported = "Reported"
)

// Reasons of the PodCreated, Started and Reported conditions. Started is True with
// CommandRunning while the command runs and CommandRan once it has ended.
const (
	ReasonPodCreated            = "Created"
	ReasonWaitingForTokenSecret = "WaitingForTokenSecret"
	ReasonPodPending            = "PodPending"
	ReasonPodScheduled          = "PodScheduled"
	ReasonCommandRunning        = "CommandRunning"
	ReasonCommandRan            = "CommandRan"
	ReasonNeverRan              = "NeverRan"
	ReasonReporting             = "Reporting"
	ReasonReported              = "Reported"
	ReasonAlreadyFinished       = "AlreadyFinished"
	ReasonFinishRejected        = "FinishRejected"
	// ReasonWaitingForQuota (PodCreated): a ResourceQuota refuses the job's pod for now.
	ReasonWaitingForQuota = "WaitingForQuota"
	// ReasonTokenSecretMissing (Finished, Reported): the job token Secret did not appear
	// in time, or was gone when the job had to be reported, so Buildkite could not be
	// told; why is in the BuildJob's status and events, since the job's log cannot be
	// written without the token.
	ReasonTokenSecretMissing = "TokenSecretMissing"
)

// Reasons of the Finished condition: how the job ended.
const (
	ReasonExited               = "Exited"
	ReasonCanceled             = "Canceled"
	ReasonEnvironmentNotFound  = "EnvironmentNotFound"
	ReasonInvalidPod           = "InvalidPod"
	ReasonPodRejected          = "PodRejected"
	ReasonImagePullFailed      = "ImagePullFailed"
	ReasonInvalidImage         = "InvalidImage"
	ReasonCreateContainerError = "CreateContainerFailed"
	ReasonUnschedulable        = "Unschedulable"
	ReasonOOMKilled            = "OOMKilled"
	ReasonEvicted              = "Evicted"
	ReasonPreempted            = "Preempted"
	ReasonDeadlineExceeded     = "DeadlineExceeded"
	ReasonPodDeleted           = "PodDeleted"
	ReasonNodeLost             = "NodeLost"
	ReasonInitContainerFailed  = "InitContainerFailed"
	ReasonSupervisorFailed     = "SupervisorFailed"
	ReasonPodFailed            = "PodFailed"
	ReasonBuildJobDeleted      = "BuildJobDeleted"
)
