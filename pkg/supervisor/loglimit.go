package supervisor

import (
	"fmt"
	"sync/atomic"
)

// logLimitWarning returns what the uploader calls with the offset of each chunk it sends:
// once a chunk starts past limit (Buildkite's log_max_size_bytes), it warns once in the
// supervisor's own log, as the agent's log streamer does in the agent's. Like the agent
// (v3.52.0 to v3.138.1), the supervisor still sends everything: Buildkite enforces the
// limit and may drop what is past it, and a job's output is never cut short on this side.
// A warning in the job's log would be past the limit too, so it goes where the platform
// team looks (kubectl logs of the job's pod).
func logLimitWarning(limit int64, logf func(string, ...any)) func(offset uint64) {
	if limit <= 0 {
		return func(uint64) {}
	}
	var warned atomic.Bool
	return func(offset uint64) {
		// Chunks go out two at a time; the first to pass the limit warns.
		if offset > uint64(limit) && warned.CompareAndSwap(false, true) {
			logf("the job's log has reached %s, past the most Buildkite keeps of it (log_max_size_bytes, %s): Buildkite may drop what comes after; it is sent all the same, as the agent sends it", ibytes(offset), ibytes(uint64(limit)))
		}
	}
}

// ibytes shows a size in bytes as the agent's warning does: in IEC units, to one decimal.
func ibytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
