package supervisor

import (
	"sync"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
)

// recorder keeps the job's progress (pkg/jobprogress) in the termination message file,
// rewriting it whole, in place, on every change, for the controller to read once the
// container ends. The file stays open: it is written after every log chunk. With no path
// it only keeps it in memory.
type recorder struct {
	mu   sync.Mutex
	path string
	file *jobprogress.File
	p    jobprogress.Progress
	logf func(format string, args ...any)
	warn bool
}

// update applies change to the progress, then writes it; a write that fails is logged
// once, and the job goes on.
func (r *recorder) update(change func(*jobprogress.Progress)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	change(&r.p)
	if r.path == "" {
		return
	}
	var err error
	if r.file == nil {
		r.file, err = jobprogress.Open(r.path)
	}
	if err == nil {
		err = r.file.Write(r.p)
	}
	if err != nil && !r.warn {
		// Once is enough: the job goes on, only the controller's view of it suffers.
		r.logf("recording progress in %s: %v", r.path, err)
		r.warn = true
	}
}

// failed records that the job could not be run, and why.
func (r *recorder) failed(err error) {
	r.update(func(p *jobprogress.Progress) { p.Error = err.Error() })
}

// close closes the file; later updates open it again.
func (r *recorder) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.file != nil {
		_ = r.file.Close()
		r.file = nil
	}
}
