// Package handoffclient is the warm pod's side of the job hand-off: the pod's supervisor
// proves who it is with its projected ServiceAccount token and receives its job from the
// operator. It holds the wire types too, so that the operator's side (pkg/handoff) imports
// them from here and the supervisor's binary links no Kubernetes package.
package handoffclient

import (
	"fmt"
	"log/slog"
)

// Job is what a warm pod receives at its hand-off: everything that only the job knows.
// It carries the job token, so it prints and logs without its secrets (see Format and
// LogValue); only its JSON encoding, on the wire, holds them.
type Job struct {
	// ID is the Buildkite job's UUID.
	ID string `json:"id"`
	// BuildJob is the name of the BuildJob the pod was assigned to, in the pod's namespace.
	BuildJob string `json:"buildJob,omitempty"`
	// Command is the job's command, as the supervisor's Config.Command.
	Command string `json:"command,omitempty"`
	// Env is the job's environment, as a cold pod's would be.
	Env map[string]string `json:"env,omitempty"`
	// Token is the job token.
	Token string `json:"token"`
}

// Format prints the job without its token and environment values, whatever the verb: a
// job printed by mistake in an error or a log line gives nothing away.
func (j Job) Format(f fmt.State, _ rune) {
	_, _ = fmt.Fprintf(f, "Job{ID:%q BuildJob:%q env:%d vars token:%s}", j.ID, j.BuildJob, len(j.Env), redacted(j.Token))
}

// LogValue keeps the token and environment out of structured logs.
func (j Job) LogValue() slog.Value {
	return slog.GroupValue(slog.String("id", j.ID), slog.String("buildJob", j.BuildJob), slog.Int("envVars", len(j.Env)))
}

func redacted(s string) string {
	if s == "" {
		return "none"
	}
	return "[redacted]"
}

// ErrorResponse is the body of every refusal: a message for people and a reason for code.
type ErrorResponse struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Reasons the endpoint gives when it refuses.
const (
	ReasonMethodNotAllowed  = "MethodNotAllowed"
	ReasonBadRequest        = "BadRequest"
	ReasonUnauthenticated   = "Unauthenticated"
	ReasonWrongAudience     = "WrongAudience"
	ReasonNotAPod           = "NotAPodToken"
	ReasonUnknownPod        = "UnknownPod"
	ReasonWrongAddress      = "WrongAddress"
	ReasonAlreadyHandedOff  = "AlreadyHandedOff"
	ReasonUnavailable       = "Unavailable"
	ReasonInternal          = "Internal"
	ReasonReviewUnavailable = "TokenReviewUnavailable"
)

// MaxJobBytes bounds a hand-off's response: a job's environment is at most what a pod
// spec would have carried, far below this.
const MaxJobBytes = 4 << 20
