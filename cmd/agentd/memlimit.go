package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The Go collector's soft limit, from the container's memory limit (--memory-limit): 90%
// of it, less memoryLimitReserve. The runtime does not count all the process's resident
// memory: the pages of the binary's code and read-only data it has read (44-51 MB of
// agentd's resident memory in the bench, RssFile) count against the container's limit
// too, though the kernel can drop them under pressure and read them again; and the
// collector overshoots a little.
const (
	memoryLimitShare   = 0.9
	memoryLimitReserve = 32 << 20
)

// memoryLimit is --memory-limit: the container's memory limit, in bytes; 0 when none.
type memoryLimit int64

func (m *memoryLimit) String() string { return fmt.Sprint(int64(*m)) }

func (m *memoryLimit) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a quantity of bytes, such as 536870912 or 512Mi", s)
	}
	if q.Sign() < 0 {
		return fmt.Errorf("%q: a memory limit cannot be negative", s)
	}
	*m = memoryLimit(q.Value())
	return nil
}

// soft is the collector's soft limit for a container limit of m: memoryLimitShare of it
// less memoryLimitReserve, and never less than half of it.
func (m memoryLimit) soft() int64 {
	return max(int64(float64(m)*memoryLimitShare)-memoryLimitReserve, int64(m)/2)
}

// apply sets the Go collector's soft memory limit (soft), so that it collects harder as
// the process nears the container's limit instead of letting the heap grow to twice what
// is live (GOGC=100) and the kernel kill it. GOMEMLIMIT, when set, is the runtime's own
// setting and wins. It returns the soft limit set, 0 when none.
func (m memoryLimit) apply() int64 {
	if m <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	soft := m.soft()
	debug.SetMemoryLimit(soft)
	return soft
}
