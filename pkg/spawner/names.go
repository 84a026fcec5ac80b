package spawner

import (
	cryptorand "crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
)

// BuildJobName is the name of the BuildJob of a Buildkite job: its UUID, lower-cased,
// so that a retried create can never make a second one.
func BuildJobName(jobID string) string { return strings.ToLower(jobID) }

// buildJobNames are the names the spawner gives the BuildJob of a job, in order: the
// job's own (BuildJobName), then, should someone else have made a BuildJob of that name
// (they can: Buildkite shows job UUIDs before the jobs run), the name with the intake's
// nonce, which nobody can know before the spawner makes it. Both derive from what the
// slot saved before accepting, so a retry never makes a second BuildJob.
func buildJobNames(jobID, nonce string) []string {
	name := BuildJobName(jobID)
	if nonce == "" {
		return []string{name}
	}
	return []string{name, name + "-" + nonce}
}

// newIntakeNonce draws an intake's nonce: 8 characters of a-z and 2-7 (40 random bits),
// short enough for object names and too many to guess.
func newIntakeNonce() string {
	var b [5]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // never, on Linux
	}
	return strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
}
