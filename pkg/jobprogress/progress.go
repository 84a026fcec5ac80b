// Package jobprogress is the record the in-pod supervisor keeps of a job's progress and the
// controller reads back: how far the log got and how the command ended. The supervisor writes
// it to the container's termination message file after every acknowledged log chunk, so the
// controller can read it from the pod status even when the container was OOM-killed or
// SIGKILLed and could not say goodbye.
package jobprogress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultPath is where Kubernetes reads a container's termination message from.
const DefaultPath = "/dev/termination-log"

// MaxSize is the most Kubernetes keeps of a termination message.
const MaxSize = 4096

// Progress is the supervisor's record of one job.
type Progress struct {
	// Started is true once Buildkite accepted the job's start.
	Started bool `json:"started,omitempty"`
	// Sequence is the sequence number of the last log chunk Buildkite acknowledged (from 1).
	Sequence uint64 `json:"seq,omitempty"`
	// Offset is the byte offset just past that chunk: the log's acknowledged length.
	Offset uint64 `json:"offset,omitempty"`
	// FailedChunks counts chunks Buildkite refused; their bytes are missing from the log.
	FailedChunks int `json:"failedChunks,omitempty"`
	// LostBytes counts the bytes of those chunks.
	LostBytes uint64 `json:"lostBytes,omitempty"`
	// Exited is true once the command has ended and ExitStatus/Signal are final.
	Exited bool `json:"exited,omitempty"`
	// ExitStatus of the command; -1 when it was killed by a signal.
	ExitStatus int `json:"exitStatus,omitempty"`
	// Signal that ended the command, such as SIGTERM.
	Signal string `json:"signal,omitempty"`
	// SignalReason for Buildkite: cancel when the job was canceled or timed out.
	SignalReason string `json:"signalReason,omitempty"`
	// Flushed is true once every byte of output has been sent: the controller may finish the job.
	Flushed bool `json:"flushed,omitempty"`
	// Finished is true once Buildkite accepted the supervisor's own finish of the job, sent
	// when the command had ended and all its output was sent: the controller then only
	// records the outcome. A supervisor killed between the finish and this record leaves it
	// to the controller, whose second finish Buildkite refuses.
	Finished bool `json:"finished,omitempty"`
	// Error, when set, says why the supervisor could not run the job.
	Error string `json:"error,omitempty"`
	// EndedOnBuildkite is true when Buildkite had already ended the job (canceled while its
	// pod was starting, say) before the supervisor could start it: the supervisor ran
	// nothing, and Buildkite takes no start, log or finish for the job any more.
	EndedOnBuildkite bool `json:"endedOnBuildkite,omitempty"`
	// BuildkiteState is the job's state on Buildkite that the supervisor saw when it found
	// the job ended, such as canceled ("" when Buildkite only refused the start).
	BuildkiteState string `json:"buildkiteState,omitempty"`
}

// Encode returns p as the compact JSON kept in the termination message.
func (p Progress) Encode() ([]byte, error) {
	if len(p.Error) > 1024 {
		p.Error = p.Error[:1024]
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("progress record is %d bytes, more than the %d a termination message holds", len(b), MaxSize)
	}
	return b, nil
}

// Decode reads a termination message. An empty message is a zero Progress: the
// supervisor never wrote one.
func Decode(msg string) (Progress, error) {
	var p Progress
	if msg == "" {
		return p, nil
	}
	if err := json.Unmarshal([]byte(msg), &p); err != nil {
		return p, fmt.Errorf("reading the supervisor's progress from the termination message: %w", err)
	}
	return p, nil
}

// Write replaces the file at path with p, atomically where the file system allows, so a
// reader never sees half a record. /dev/termination-log is a bind mount that cannot be
// renamed over, so it is written in place (see overwrite).
func Write(path string, p Progress) error {
	b, err := p.Encode()
	if err != nil {
		return err
	}
	if path == DefaultPath {
		return overwrite(path, b)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".progress-*")
	if err != nil {
		return fmt.Errorf("writing progress: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("writing progress: %w", err)
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("writing progress: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

// overwrite writes b over the start of the file at path in one write, padded with spaces
// (which JSON ignores) to the file's length, and never truncates it. Truncating first, as
// os.WriteFile does, left a moment in which a SIGKILL or OOM kill would leave an empty
// message, and the controller would lose the record of how far the log got.
func overwrite(path string, b []byte) error {
	f, err := Open(path)
	if err != nil {
		return err
	}
	if err := f.write(b); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// File is a progress record file kept open for a run of writes, each of which replaces the
// record in place as overwrite does, in one write call and nothing else: the supervisor
// writes its record after every log chunk, on the log's way to Buildkite. A reader that
// reads while it is written may see a torn record, so the controller reads it once the
// container has ended, as Kubernetes does.
type File struct {
	f    *os.File
	size int // the file's length, to which every record is padded
}

// Open opens (or creates) the record file at path for writing in place.
func Open(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("writing progress: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("writing progress: %w", err)
	}
	return &File{f: f, size: int(min(info.Size(), MaxSize))}, nil
}

// Write replaces the record with p.
func (f *File) Write(p Progress) error {
	b, err := p.Encode()
	if err != nil {
		return err
	}
	return f.write(b)
}

func (f *File) write(b []byte) error {
	if f.size > len(b) {
		b = append(b, bytes.Repeat([]byte{' '}, f.size-len(b))...)
	}
	if _, err := f.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("writing progress: %w", err)
	}
	f.size = len(b)
	return nil
}

// Close closes the file.
func (f *File) Close() error {
	if err := f.f.Close(); err != nil {
		return fmt.Errorf("writing progress: %w", err)
	}
	return nil
}
