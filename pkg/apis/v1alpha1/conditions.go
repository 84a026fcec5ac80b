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
	// ConditionWaitShown is True while an annotation on the Buildkite job tells the
	// pipeline's authors what keeps the job's command from starting: its reason is one of
	// the Reason*ing wait reasons below and its message the annotation's text. It is False
	// (ReasonWaitOver) once the annotation has been removed, when the command started or
	// the job ended, and absent when nothing was ever shown.
	ConditionWaitShown = "WaitShown"
	// ConditionWarmStart says how a job of a BuildEnvironment with a warm pool
	// (spec.warmPool.size above 0) got its pod, when the operator runs warm pools: True
	// (ReasonWarmPodAssigned) in a warm pod of the pool, False when it started in a pod of
	// its own, cold, with the reason why (ReasonNoIdleWarmPod, ReasonNoWarmPodFits,
	// ReasonWarmPodStopped) and, in its message, the detail. Absent for a job whose
	// environment has no pool.
	ConditionWarmStart = "WarmStart"
	// ConditionPodGone is True once the job's pod is gone while Buildkite still has its
	// command running, before the operator saw how it ended (reason ReasonPodDeleted): the
	// operator waits from then (its lastTransitionTime, which a restart keeps) for the
	// pod's supervisor to stop, the pod's grace period and a few seconds, before it
	// finishes the job. Absent otherwise.
	ConditionPodGone = "PodGone"
)

// Reasons of the WarmStart condition, and the values of the reason label of the
// buildkite_operator_warm_pool_job_starts_total metric.
const (
	// ReasonWarmPodAssigned (True): the job runs in a warm pod of its environment's pool,
	// named in the message.
	ReasonWarmPodAssigned = "WarmPodAssigned"
	// ReasonNoIdleWarmPod: no warm pod of the pool was idle when the job needed its pod
	// (the pool was empty, starting up, or every pod was taken by other jobs).
	ReasonNoIdleWarmPod = "NoIdleWarmPod"
	// ReasonNoWarmPodFits: there were idle warm pods, but the job's pod would differ
	// from theirs (the job asks for its own resources, say); the message says how.
	ReasonNoWarmPodFits = "NoWarmPodFits"
	// ReasonWarmPodStopped: the job was given a warm pod, which stopped before it took
	// the job, so the job was taken back from it and started in a pod of its own.
	ReasonWarmPodStopped = "WarmPodStopped"
)

// Reasons of the WaitShown condition: what the job's pod waits for, as the annotation on
// the Buildkite job says. ReasonWaitingForQuota is one too.
const (
	// ReasonWaitingForNode: the scheduler finds no node for the pod.
	ReasonWaitingForNode = "WaitingForNode"
	// ReasonPullingImage: the kubelet is pulling an image of the pod.
	ReasonPullingImage = "PullingImage"
	// ReasonImagePullFailing: an image of the pod cannot be pulled, so far.
	ReasonImagePullFailing = "ImagePullFailing"
	// ReasonContainerCreateFailing: a container of the pod cannot be created, so far.
	ReasonContainerCreateFailing = "ContainerCreateFailing"
	// ReasonPodSetupFailing: the pod cannot get ready to start its containers (a volume
	// that will not mount or attach, a sandbox that cannot be created), so far.
	ReasonPodSetupFailing = "PodSetupFailing"
	// ReasonInitContainerFailing: an init container or sidecar keeps failing, and the
	// job's command waits for it.
	ReasonInitContainerFailing = "InitContainerFailing"
	// ReasonWaitOver (False): the annotation was removed.
	ReasonWaitOver = "WaitOver"
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
	// ReasonMadeByHand (Reported): the BuildJob was made by hand (MadeByHand), not from a
	// Buildkite job, so there is nothing to tell Buildkite.
	ReasonMadeByHand = "MadeByHand"
	// ReasonEnvironmentUnchecked (Finished): a BuildJob made by hand names an environment
	// that gives its pods Secrets or a service account, and no webhook checked that its
	// creator may use them (the operator runs without webhooks).
	ReasonEnvironmentUnchecked = "EnvironmentUnchecked"
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
	// ReasonEndedOnBuildkite: Buildkite had ended the job (canceled while its pod started)
	// before the supervisor could start it; nothing ran, and nothing is reported.
	ReasonEndedOnBuildkite = "EndedOnBuildkite"
)

// Reasons of the Finished condition for a job whose pod Kubernetes took away for a reason
// of its own, not the job's (a disruption). Such a job is finished with exit status -1 and
// signal reason agent_stop, as an agent stopped under its job (a host shutdown, a spot
// termination) finishes it, so that one automatic retry rule for agent_stop retries them
// all; its log ends with what happened. Beside these, ReasonEvicted (the Eviction API:
// a node drain, the cluster autoscaler), ReasonPreempted (the scheduler), ReasonNodeLost
// (the node stopped responding, or was tainted NoExecute) and ReasonPodDeleted (the pod
// deleted by something other than the operator) are disruptions too.
const (
	// ReasonNodePressure: the kubelet evicted the pod because its node ran low on a
	// resource (memory, disk, process IDs).
	ReasonNodePressure = "NodePressure"
	// ReasonNodeShutdown: the kubelet stopped the pod because its node was shutting down.
	ReasonNodeShutdown = "NodeShutdown"
	// ReasonNodeDeleted: the pod went with its node, which was deleted from the cluster.
	ReasonNodeDeleted = "NodeDeleted"
	// ReasonDisrupted: Kubernetes marked the pod as disrupted (its DisruptionTarget
	// condition) for a reason the operator does not know by name.
	ReasonDisrupted = "Disrupted"
)

// ReasonStorageLimitExceeded (Finished): the kubelet evicted the pod because it used more
// local storage than its limits allow (ephemeral-storage, an emptyDir's sizeLimit). Unlike
// a disruption this is the job's own doing: a retry fails the same way.
const ReasonStorageLimitExceeded = "StorageLimitExceeded"
