package podcontract

import "fmt"

// EnvMessage is the job's commit message, which the agent bounds before it runs a job.
const EnvMessage = "BUILDKITE_MESSAGE"

// MessageMax bounds the entry "BUILDKITE_MESSAGE=value\0" of a job's env, as the agent
// bounds it (agent.BuildkiteMessageMax, 64 KiB, in buildkite-agent v3.138.1; truncateEnv in
// v3.52.0): a commit message can be any length, and Linux refuses to exec a process with
// one env entry over MAX_ARG_STRLEN (128 KiB), so an uncut one makes the pod's supervisor
// fail to start with E2BIG.
const MessageMax = 64 * 1024

// MessageKept is the length of a cut BUILDKITE_MESSAGE, its marker included: the entry at
// MessageMax, with the name, "=" and the NUL.
const MessageKept = MessageMax - len(EnvMessage) - len("=\x00")

// TruncateMessage cuts a commit message as the agent does: a value within MessageMax is
// kept whole (its entry may then be 19 bytes longer, as the agent allows); a longer one is
// cut to MessageKept bytes, its end replaced by "[value truncated N -> M bytes]" so that
// the job can tell. Bytes, not characters, as the agent cuts them.
func TruncateMessage(v string) string {
	if len(v) <= MessageMax {
		return v
	}
	note := fmt.Sprintf("[value truncated %d -> %d bytes]", len(v), MessageKept)
	return v[:MessageKept-len(note)] + note
}
