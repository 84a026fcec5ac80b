// Package memlimit sets the Go collector's soft memory limit from the container's memory
// limit (--memory-limit), so that the collector works harder as the process nears the
// limit instead of the kernel killing it.
package memlimit

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// The collector's soft limit is share of the container's limit, less reserve. The
// runtime does not count all the process's resident memory: the pages of the binary's
// code and read-only data it has read (44-51 MB of agentd's resident memory in the bench,
// RssFile) count against the container's limit too, though the kernel can drop them under
// pressure and read them again; and the collector overshoots a little.
const (
	share   = 0.9
	reserve = 32 << 20
)

// Limit is --memory-limit: the container's memory limit, in bytes; 0 when none. It is a
// flag.Value taking bytes or a quantity such as 512Mi.
type Limit int64

// BindFlags binds --memory-limit, with its environment variable, to l.
func (l *Limit) BindFlags(fs *flag.FlagSet) {
	flagenv.Var(fs, l, "memory-limit", "BK_OPERATOR_MEMORY_LIMIT",
		"the container's memory limit (bytes, or a quantity such as 512Mi; the chart sets it from resources.limits.memory): the Go collector keeps what the runtime holds under 90% of it less 32 MiB (at least half of it), collecting more often as it nears that rather than letting the heap reach twice what is live; GOMEMLIMIT wins when set; 0: no such limit")
}

func (l *Limit) String() string { return fmt.Sprint(int64(*l)) }

// Set reads a number of bytes or a Kubernetes quantity, as a container's limit is given.
func (l *Limit) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a quantity of bytes, such as 536870912 or 512Mi", s)
	}
	if q.Sign() < 0 {
		return fmt.Errorf("%q: a memory limit cannot be negative", s)
	}
	*l = Limit(q.Value())
	return nil
}

// Soft is the collector's soft limit for a container limit of l: share of it less
// reserve, and never less than half of it.
func (l Limit) Soft() int64 {
	return max(int64(float64(l)*share)-reserve, int64(l)/2)
}

// Apply sets the Go collector's soft memory limit (Soft), so that it collects harder as
// the process nears the container's limit instead of letting the heap grow to twice what
// is live (GOGC=100) and the kernel kill it. GOMEMLIMIT, when set, is the runtime's own
// setting and wins. It returns the soft limit set, 0 when none.
func (l Limit) Apply() int64 {
	if l <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	soft := l.Soft()
	debug.SetMemoryLimit(soft)
	return soft
}
