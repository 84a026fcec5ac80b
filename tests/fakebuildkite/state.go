package fakebuildkite

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Job states, as Buildkite names them (the subset a command job goes through).
const (
	StateScheduled = "scheduled"
	StateAssigned  = "assigned"
	StateAccepted  = "accepted"
	StateRunning   = "running"
	StateFinished  = "finished"
	StateCanceling = "canceling"
	StateCanceled  = "canceled"
	StateTimingOut = "timing_out"
	StateTimedOut  = "timed_out"
)

// Agent states as the fake reports them.
const (
	AgentRegistered   = "registered"
	AgentConnected    = "connected"
	AgentDisconnected = "disconnected"
	AgentStopped      = "stopped"
	AgentLost         = "lost"
)

// Ping actions.
const (
	ActionIdle       = "idle"
	ActionPause      = "pause"
	ActionDisconnect = "disconnect"
)

// IsTerminal reports whether a job in this state will never change again.
func IsTerminal(state string) bool {
	switch state {
	case StateFinished, StateCanceled, StateTimedOut:
		return true
	}
	return false
}

type agent struct {
	id, name           string
	tags               []string
	state              string
	action             string
	ignoreInDispatches bool
	revoked            bool
	currentJob         string
	registeredAt       time.Time
	lastPing           time.Time
	lastHeartbeat      time.Time
	version            string
	hostname           string
	pingCount          int
	streamsOpened      int
	lastStream         time.Time // when its streaming ping last opened or closed
}

type build struct {
	id, org, pipeline string
	number            int
	url               string
	repo, commit      string
	branch, message   string
	env               map[string]string
	createdAt         time.Time
	jobs              []string
	metaData          map[string]string
	annotations       []*annotation              // build-scoped, in the order written
	uploads           map[string]*pipelineUpload // by upload uuid
}

type pipelineUpload struct {
	uuid, jobID, state, message string
	jobs                        []string
}

type job struct {
	id, buildID           string
	stepID, stepKey       string
	label, command        string
	plugins               string // canonical BUILDKITE_PLUGINS JSON
	stepJSON              []byte
	rules                 []string
	timeoutMinutes        int
	parallelJob           int // -1 when the step has no parallelism
	parallelCount         int
	env                   map[string]string
	state                 string
	assignedTo            string
	acceptedBy            string
	token                 string
	createdAt             time.Time
	acceptedAt, startedAt time.Time
	finishedAt            time.Time
	exitStatus            string
	signal, signalReason  string
	finishCount           int
	finishesAccepted      int
	finishesRefused       int
	startCount            int
	acceptCount           int
	chunksFailedCount     int
	log                   chunkLog
	uploadedFromJob       string
	annotations           []*annotation // job-scoped, in the order written
	offeredVia            []string      // every offer of the job, in order: ViaPing, ViaStream, ViaAcquire
	acceptedVia           string        // the offer the accepting agent took
}

// Build is what CreateBuild returns.
type Build struct {
	ID     string   `json:"id"`
	Number int      `json:"number"`
	URL    string   `json:"url"`
	Jobs   []string `json:"jobs"`
}

// BuildSnapshot is a copy of a build's state.
type BuildSnapshot struct {
	ID          string            `json:"id"`
	Number      int               `json:"number"`
	URL         string            `json:"url"`
	Org         string            `json:"org"`
	Pipeline    string            `json:"pipeline"`
	Repo        string            `json:"repo"`
	Commit      string            `json:"commit"`
	Branch      string            `json:"branch"`
	Message     string            `json:"message"`
	State       string            `json:"state"`
	Jobs        []string          `json:"jobs"`
	MetaData    map[string]string `json:"meta_data"`
	Annotations []Annotation      `json:"annotations"`
	CreatedAt   time.Time         `json:"created_at"`
}

// Annotation is one annotation as Buildkite shows it, by context: a build's own
// (BuildSnapshot.Annotations) or a job's (JobSnapshot.Annotations, written with scope "job").
type Annotation struct {
	Context string `json:"context"`
	Style   string `json:"style"`
	Body    string `json:"body"`
}

// annotation is an Annotation with what orders it on the page.
type annotation struct {
	Annotation
	priority int
}

// shownAnnotations is anns in the order Buildkite shows them: highest priority first, then
// in the order written.
func shownAnnotations(anns []*annotation) []Annotation {
	sorted := slices.Clone(anns)
	slices.SortStableFunc(sorted, func(a, b *annotation) int { return b.priority - a.priority })
	out := make([]Annotation, 0, len(sorted))
	for _, a := range sorted {
		out = append(out, a.Annotation)
	}
	return out
}

// JobSnapshot is a copy of a job's state.
type JobSnapshot struct {
	ID          string `json:"id"`
	BuildID     string `json:"build_id"`
	BuildNumber int    `json:"build_number"`
	State       string `json:"state"`
	// Log is the reassembled log: chunks in offset order, duplicates dropped.
	Log          []byte `json:"-"`
	ExitStatus   string `json:"exit_status"`
	Signal       string `json:"signal"`
	SignalReason string `json:"signal_reason"`
	// FinishCount counts every authenticated finish call, the rejected ones (422) included, so
	// that a test can assert "finished exactly once".
	FinishCount int `json:"finish_count"`
	// FinishesAccepted counts the finish calls that ended the job (200), and FinishesRefused
	// those answered 422 because the job had already ended: a second finish. Buildkite
	// accepts one finish per job, and so does the fake, so FinishesAccepted above 1 would be
	// a bug in the fake; a refused finish is the operator finishing twice, which Buildkite
	// forgives but a test may count.
	FinishesAccepted  int `json:"finishes_accepted"`
	FinishesRefused   int `json:"finishes_refused"`
	ChunksFailedCount int `json:"chunks_failed_count"`
	// ChunkCount is how many distinct chunks were stored.
	ChunkCount  int    `json:"chunk_count"`
	StartCount  int    `json:"start_count"`
	AcceptCount int    `json:"accept_count"`
	AssignedTo  string `json:"assigned_to"`
	AcceptedBy  string `json:"accepted_by"`
	// OfferedVia is how the job was offered to agents, each time, in order: ViaPing (in a
	// ping's answer), ViaStream (pushed over an agent's streaming ping) or ViaAcquire.
	OfferedVia []string `json:"offered_via"`
	// AcceptedVia is the offer the agent that accepted the job took: the latest to it.
	AcceptedVia     string            `json:"accepted_via"`
	Env             map[string]string `json:"env"`
	StepKey         string            `json:"step_key"`
	StepID          string            `json:"step_id"`
	Label           string            `json:"label"`
	Command         string            `json:"command"`
	Plugins         string            `json:"plugins"`
	AgentQueryRules []string          `json:"agent_query_rules"`
	TimeoutMinutes  int               `json:"timeout_in_minutes"`
	// ParallelJob is -1 for a step without parallelism.
	ParallelJob   int `json:"parallel_job"`
	ParallelCount int `json:"parallel_job_count"`
	// Annotations are the job-scoped annotations, as the job shows them.
	Annotations []Annotation `json:"annotations"`
	// UploadedFromJob is the job whose pipeline upload created this job, if any.
	UploadedFromJob string    `json:"uploaded_from_job,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	AcceptedAt      time.Time `json:"accepted_at"`
	StartedAt       time.Time `json:"started_at"`
	FinishedAt      time.Time `json:"finished_at"`
}

// AgentSnapshot is a copy of a registered agent's state.
type AgentSnapshot struct {
	ID                 string   `json:"id"`
	Name               string   `json:"name"`
	Tags               []string `json:"tags"`
	State              string   `json:"state"`
	Connected          bool     `json:"connected"`
	Action             string   `json:"action"`
	IgnoreInDispatches bool     `json:"ignore_in_dispatches"`
	Revoked            bool     `json:"revoked"`
	CurrentJob         string   `json:"current_job"`
	Version            string   `json:"version"`
	Hostname           string   `json:"hostname"`
	PingCount          int      `json:"ping_count"`
	// Streaming: the agent's streaming ping is open now; StreamsOpened counts them.
	Streaming     bool      `json:"streaming"`
	StreamsOpened int       `json:"streams_opened"`
	RegisteredAt  time.Time `json:"registered_at"`
	LastPing      time.Time `json:"last_ping"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
}

func (s *Server) jobSnapshotLocked(j *job) JobSnapshot {
	b := s.builds[j.buildID]
	return JobSnapshot{
		ID:                j.id,
		BuildID:           j.buildID,
		BuildNumber:       b.number,
		State:             j.state,
		Log:               j.log.bytes(),
		ExitStatus:        j.exitStatus,
		Signal:            j.signal,
		SignalReason:      j.signalReason,
		FinishCount:       j.finishCount,
		FinishesAccepted:  j.finishesAccepted,
		FinishesRefused:   j.finishesRefused,
		ChunksFailedCount: j.chunksFailedCount,
		ChunkCount:        len(j.log.chunks),
		StartCount:        j.startCount,
		AcceptCount:       j.acceptCount,
		AssignedTo:        j.assignedTo,
		AcceptedBy:        j.acceptedBy,
		OfferedVia:        slices.Clone(j.offeredVia),
		AcceptedVia:       j.acceptedVia,
		Env:               maps.Clone(j.env),
		StepKey:           j.stepKey,
		StepID:            j.stepID,
		Label:             j.label,
		Command:           j.command,
		Plugins:           j.plugins,
		AgentQueryRules:   slices.Clone(j.rules),
		TimeoutMinutes:    j.timeoutMinutes,
		ParallelJob:       j.parallelJob,
		ParallelCount:     j.parallelCount,
		UploadedFromJob:   j.uploadedFromJob,
		Annotations:       shownAnnotations(j.annotations),
		CreatedAt:         j.createdAt,
		AcceptedAt:        j.acceptedAt,
		StartedAt:         j.startedAt,
		FinishedAt:        j.finishedAt,
	}
}

func (s *Server) agentSnapshotLocked(a *agent) AgentSnapshot {
	state := a.state
	_, streaming := s.streams[a.id]
	if state == AgentConnected && !streaming {
		last := latest(a.lastPing, a.lastHeartbeat, a.registeredAt, a.lastStream)
		if time.Since(last) > s.opts.AgentLostAfter {
			state = AgentLost
		}
	}
	return AgentSnapshot{
		ID:                 a.id,
		Name:               a.name,
		Tags:               slices.Clone(a.tags),
		State:              state,
		Connected:          state == AgentConnected,
		Action:             a.action,
		IgnoreInDispatches: a.ignoreInDispatches,
		Revoked:            a.revoked,
		CurrentJob:         a.currentJob,
		Version:            a.version,
		Hostname:           a.hostname,
		PingCount:          a.pingCount,
		Streaming:          streaming,
		StreamsOpened:      a.streamsOpened,
		RegisteredAt:       a.registeredAt,
		LastPing:           a.lastPing,
		LastHeartbeat:      a.lastHeartbeat,
	}
}

func latest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}

func (s *Server) buildSnapshotLocked(b *build) BuildSnapshot {
	return BuildSnapshot{
		ID: b.id, Number: b.number, URL: b.url, Org: b.org, Pipeline: b.pipeline,
		Repo: b.repo, Commit: b.commit, Branch: b.branch, Message: b.message,
		State: s.buildStateLocked(b), Jobs: slices.Clone(b.jobs), MetaData: maps.Clone(b.metaData),
		Annotations: shownAnnotations(b.annotations), CreatedAt: b.createdAt,
	}
}

// buildStateLocked derives a build state from its jobs the way Buildkite reports it.
func (s *Server) buildStateLocked(b *build) string {
	started, canceled, failed, done := false, false, false, 0
	for _, id := range b.jobs {
		j := s.jobs[id]
		switch j.state {
		case StateScheduled, StateAssigned:
		case StateCanceled:
			canceled = true
			done++
		case StateFinished, StateTimedOut:
			started = true
			done++
			if j.exitStatus != "0" {
				failed = true
			}
		case StateCanceling:
			return "canceling"
		default:
			started = true
		}
	}
	switch {
	case done == len(b.jobs) && canceled:
		return "canceled"
	case done == len(b.jobs) && failed:
		return "failed"
	case done == len(b.jobs):
		return "passed"
	case started || done > 0:
		return "running"
	}
	return "scheduled"
}

// Job returns a copy of the job's state.
func (s *Server) Job(id string) (JobSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return JobSnapshot{}, false
	}
	return s.jobSnapshotLocked(j), true
}

// Jobs returns every job in creation order.
func (s *Server) Jobs() []JobSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]JobSnapshot, 0, len(s.jobOrder))
	for _, id := range s.jobOrder {
		out = append(out, s.jobSnapshotLocked(s.jobs[id]))
	}
	return out
}

// Build returns a copy of the build's state.
func (s *Server) Build(id string) (BuildSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.builds[id]
	if !ok {
		return BuildSnapshot{}, false
	}
	return s.buildSnapshotLocked(b), true
}

// Builds returns every build in creation order.
func (s *Server) Builds() []BuildSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]BuildSnapshot, 0, len(s.buildOrder))
	for _, id := range s.buildOrder {
		out = append(out, s.buildSnapshotLocked(s.builds[id]))
	}
	return out
}

// Agents returns every agent that ever registered, in registration order.
func (s *Server) Agents() []AgentSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]AgentSnapshot, 0, len(s.agentOrder))
	for _, id := range s.agentOrder {
		out = append(out, s.agentSnapshotLocked(s.agents[id]))
	}
	return out
}

// ConnectedAgents is how many agents are connected now.
func (s *Server) ConnectedAgents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.agents {
		if a.state == AgentConnected {
			n++
		}
	}
	return n
}

// Agent returns a copy of one agent's state.
func (s *Server) Agent(id string) (AgentSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.agents[id]
	if !ok {
		return AgentSnapshot{}, false
	}
	return s.agentSnapshotLocked(a), true
}

// ErrClosed is returned by waits on a closed server.
var ErrClosed = errors.New("fake buildkite: server closed")

// WaitJob blocks until cond holds for the job, the context ends or the server closes.
func (s *Server) WaitJob(ctx context.Context, id string, cond func(JobSnapshot) bool) (JobSnapshot, error) {
	for {
		s.mu.Lock()
		j, ok := s.jobs[id]
		var snap JobSnapshot
		if ok {
			snap = s.jobSnapshotLocked(j)
		}
		ch, closed := s.changed, s.closed
		s.mu.Unlock()
		if !ok {
			return JobSnapshot{}, fmt.Errorf("fake buildkite: no job %q", id)
		}
		if cond(snap) {
			return snap, nil
		}
		if closed {
			return snap, ErrClosed
		}
		select {
		case <-ctx.Done():
			return snap, fmt.Errorf("waiting for job %s (state %s): %w", id, snap.State, ctx.Err())
		case <-ch:
		}
	}
}

// WaitFor blocks until cond (called with no lock held) returns true, re-checking on every state
// change of the fake. Use it for conditions on agents or builds.
func (s *Server) WaitFor(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		ch, closed := s.changed, s.closed
		s.mu.Unlock()
		if cond() {
			return nil
		}
		if closed {
			return ErrClosed
		}
		// Agent liveness changes with time alone, so poll as well as wait.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CancelJob cancels a job as the Buildkite UI does: a running job goes to canceling (and to
// canceled once its agent finishes it); a job no agent has started yet is canceled at once.
func (s *Server) CancelJob(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return fmt.Errorf("fake buildkite: cannot cancel job %q: no such job", id)
	}
	switch j.state {
	case StateScheduled, StateAssigned, StateAccepted:
		j.state = StateCanceled
		j.finishedAt = time.Now()
		s.releaseAgentLocked(j)
	case StateRunning, StateTimingOut:
		j.state = StateCanceling
	case StateCanceling:
		return nil
	default:
		return fmt.Errorf("fake buildkite: cannot cancel job %s: it is already %s", id, j.state)
	}
	s.logf("fake buildkite: job %s: cancel requested, now %s", id, j.state)
	s.notifyLocked()
	return nil
}

// releaseAgentLocked frees the agent that held j, so that it can be dispatched another job.
func (s *Server) releaseAgentLocked(j *job) {
	for _, id := range []string{j.assignedTo, j.acceptedBy} {
		if a, ok := s.agents[id]; ok && a.currentJob == j.id {
			a.currentJob = ""
		}
	}
}

// RevokeAgent makes the agent's access token invalid: every later call with it gets 401,
// and its open streaming ping ends with unauthenticated.
func (s *Server) RevokeAgent(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.agents[id]; ok {
		a.revoked = true
		if st := s.streams[id]; st != nil {
			st.stop(streamEnd{err: connect.NewError(connect.CodeUnauthenticated, errors.New("this agent's access token has been revoked"))})
		}
		s.logf("fake buildkite: agent %s revoked", id)
		s.notifyLocked()
	}
}

// SetAgentAction sets the action returned by the agent's next pings: "idle" (the default;
// jobs are dispatched), "pause" (no jobs) or "disconnect". An agent whose streaming ping is
// open is told at once.
func (s *Server) SetAgentAction(id, action string) error {
	switch action {
	case ActionIdle, ActionPause, ActionDisconnect:
	default:
		return fmt.Errorf("fake buildkite: unknown ping action %q: use idle, pause or disconnect", action)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.agents[id]
	if !ok {
		return fmt.Errorf("fake buildkite: no agent %q", id)
	}
	a.action = action
	if st := s.streams[id]; st != nil {
		s.tellActionLocked(a, st)
	}
	s.notifyLocked()
	return nil
}

// startTimeoutLocked arms the job's timeout_in_minutes, counted from start.
func (s *Server) startTimeoutLocked(j *job) {
	if j.timeoutMinutes <= 0 || s.closed {
		return
	}
	d := time.Duration(j.timeoutMinutes) * s.opts.MinuteDuration
	id := j.id
	t := time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		j, ok := s.jobs[id]
		if !ok || j.state != StateRunning {
			return
		}
		j.state = StateTimingOut
		s.logf("fake buildkite: job %s timed out after %d minute(s), now %s", id, j.timeoutMinutes, j.state)
		s.notifyLocked()
	})
	s.timers = append(s.timers, t)
}

// tagMatches reports whether an agent with tags satisfies every one of the job's rules.
func rulesMatch(rules, tags []string) bool {
	have := map[string][]string{}
	for _, t := range tags {
		k, v, _ := strings.Cut(t, "=")
		have[k] = append(have[k], v)
	}
	for _, r := range rules {
		k, want, _ := strings.Cut(r, "=")
		vals, ok := have[k]
		if !ok {
			return false
		}
		if want == "*" {
			continue
		}
		if !slices.Contains(vals, want) {
			return false
		}
	}
	return true
}
