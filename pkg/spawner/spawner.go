// Package spawner is the JobSpawner: it holds a pool of Buildkite agent registrations
// (slots), takes the jobs Buildkite assigns to them and turns each into a BuildJob, as
// `buildkite-agent start --spawn N` would run them itself.
//
// Every slot is one registration with its own ping loop and heartbeat, running one job
// at a time: it is busy from accepting a job until the job's BuildJob is reported to
// Buildkite (status.times.reportedAt) or deleted. A job that cannot become a BuildJob is
// started, given an explanation in its log and finished with exit status -1 and signal
// reason stack_error, so that no accepted job is left stuck.
//
// A slot keeps what it needs to survive a kill -9 in a Secret of its own: its
// registration, and a marker naming the job it accepts, written before the accept (the
// one write of the Secret per job). The job's BuildJob, named after the job, and its token
// Secret hold the rest; a job failed at intake is written whole, with why. A restarted
// spawner resumes every slot from its Secret, and the slot of a marker from the BuildJob
// it names, or by accepting the job again (see resumeAccepting).
//
// A slot learns of its jobs as the agent does (Config.PingMode): over Buildkite's streaming
// ping, which pushes a job the moment it is dispatched, where Buildkite offers it, and by
// polling while the stream is down or where it does not (dispatch.go, stream.go). Only the
// slot's own goroutine accepts, whichever way a job came, so a job offered both ways is
// accepted once.
//
// Slots honour the actions Buildkite's pings carry as the agent does: told to disconnect,
// a slot lets its registration go and registers anew after Config.ReregisterAfter; paused,
// it keeps its registration, heartbeats and pings and takes no job until a ping no longer
// says pause; told to stop (pings come only between jobs, so after the job it ran), it
// disconnects and stays down, across restarts, until a person removes the slot-state
// annotation from its Secret or deletes the Secret. Paused and stopped slots say so in
// their Secret's annotations (AnnotationSlotState) and in the slots gauge.
package spawner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/seal"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// RBAC the spawner needs (collected by `make generate` into the chart's files/rbac).
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildjobs,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildenvironments,verbs=get;list;watch
// Its own Secrets (registration token, slot state) in the operator's namespace; a job's
// token Secret in the job namespace.
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=secrets,verbs=get;list;create;update;delete
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=secrets,verbs=create;get;update
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=limitranges,verbs=list;watch

// Spawner is the JobSpawner, a controller-runtime Runnable that runs only on the leader.
type Spawner struct {
	cfg   Config
	r     client.Reader
	log   logr.Logger
	store *stateStore
	reach kubeReach
	// creator makes the BuildJobs and token Secrets of the slots' jobs.
	creator *creator
	// health answers the readiness and liveness probes.
	health *health
	// heartbeats sends the slots' heartbeats.
	heartbeats *heartbeats
	// streamTransport carries the slots' streaming pings; streamRefusedLogged: the log
	// has said Buildkite does not offer them.
	streamTransport     *http.Transport
	streamRefusedLogged atomic.Bool

	mu      sync.Mutex
	waiters map[string]chan struct{} // BuildJob name -> wakes the slot waiting on it
	// slots counts the slots in each of slotStates.
	slots         map[string]int
	announcedDown bool // the log has said the API server is unreachable

	// started and done are closed once Start has begun and returned; lingering are the
	// busy slots whose heartbeats it left running (see Linger).
	started, done chan struct{}
	lingering     []*slot
}

var (
	_ manager.Runnable               = (*Spawner)(nil)
	_ manager.LeaderElectionRunnable = (*Spawner)(nil)
)

// New checks cfg and returns a Spawner that creates BuildJobs with c.
func New(cfg Config, c client.Client) (*Spawner, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("spawner configuration: %w", err)
	}
	if c == nil {
		return nil, errors.New("spawner: no Kubernetes client")
	}
	r := cfg.APIReader
	if r == nil {
		r = c
	}
	lim := newLimiter(maxKubeRequests)
	c, r = limitedWriter{Client: c, l: lim}, limitedReader{r: r, l: lim}
	s := &Spawner{
		cfg:        cfg,
		r:          r,
		log:        cfg.Log.WithValues("spawner", cfg.Name),
		store:      &stateStore{c: c, r: r, namespace: cfg.Namespace, spawner: cfg.Name},
		waiters:    map[string]chan struct{}{},
		slots:      map[string]int{},
		health:     newHealth(),
		heartbeats: newHeartbeats(),
		started:    make(chan struct{}),
		// One transport for every slot's stream: over HTTP/2 they share connections.
		streamTransport: newStreamTransport(),
		done:            make(chan struct{}),
	}
	s.creator = &creator{
		c: c,
		r: r,
		admission: validation.Admission{
			Reader:             validation.CacheFirst{Cache: cfg.Cache, API: r},
			DefaultEnvironment: cfg.DefaultBuildEnvironment,
		},
		namespace: cfg.JobNamespace,
		timeout:   cfg.CreateTimeout,
		reach:     &s.reach,
		log:       s.log,
		spawner:   cfg.Name,
		seal:      &seal.Source{Client: c, Reader: r, Namespace: cfg.Namespace},
	}
	return s, nil
}

// NeedLeaderElection is true: two spawners resuming the same slots would accept twice.
func (s *Spawner) NeedLeaderElection() bool { return true }

// Start runs the slots until ctx ends. Then idle slots tell Buildkite they stop and
// disconnect, and busy ones are left, Secrets and all, to the next instance; their
// heartbeats keep going until Linger or StopHeartbeats, one of which the caller must call
// once Start has returned.
func (s *Spawner) Start(ctx context.Context) error {
	close(s.started)
	s.health.start(s.cfg.Slots)
	defer close(s.done)
	token, err := s.cfg.registrationToken(ctx, s.r)
	if err != nil {
		return err
	}
	unwatch, err := s.watchBuildJobs(ctx)
	if err != nil || unwatch == nil {
		return err
	}
	defer unwatch()
	secrets, ok := s.loadSlots(ctx)
	if !ok {
		return nil
	}
	base := agentapi.New(agentapi.Config{
		Endpoint:  s.cfg.Endpoint,
		Token:     token,
		UserAgent: s.cfg.UserAgent,
		Timeout:   s.cfg.APITimeout,
		WaitScale: s.cfg.APIWaitScale,
		Logf: func(format string, args ...any) {
			s.log.V(1).Info(fmt.Sprintf(format, args...))
		},
	})
	s.runSlots(ctx, base, secrets)
	return nil
}

// watchBuildJobs has the cache's informer wake the slot waiting on a BuildJob when it
// changes (wake), and returns what ends that. Both are nil when ctx ended before the cache
// had synced: nothing was started.
func (s *Spawner) watchBuildJobs(ctx context.Context) (unwatch func(), err error) {
	inf, err := s.cfg.Cache.GetInformer(ctx, &v1alpha1.BuildJob{})
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, fmt.Errorf("watching BuildJobs: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    s.wake,
		UpdateFunc: func(_, obj any) { s.wake(obj) },
		DeleteFunc: s.wake,
	})
	if err != nil {
		return nil, fmt.Errorf("watching BuildJobs: %w", err)
	}
	return func() { _ = inf.RemoveEventHandler(reg) }, nil
}

// loadSlots reads the slots' Secrets, by slot index, retrying until it can or ctx ends
// (ok false).
func (s *Spawner) loadSlots(ctx context.Context) (secrets map[int]*slotSecret, ok bool) {
	for {
		found, err := s.store.load(ctx)
		if err == nil {
			secrets = map[int]*slotSecret{}
			for i, sec := range found {
				secrets[i] = &slotSecret{sec: sec, state: stateFromSecret(sec)}
			}
			return secrets, true
		}
		s.log.Error(err, "cannot read the slots' state; retrying")
		if !sleep(ctx, 5*time.Second) {
			return nil, false
		}
	}
}

// runSlots runs the pool's slots, each resumed from its Secret in secrets, and those of
// secrets beyond the pool, until they have all returned. base is the agent API client
// with the registration token.
func (s *Spawner) runSlots(ctx context.Context, base *agentapi.Client, secrets map[int]*slotSecret) {
	var wg sync.WaitGroup
	for _, i := range s.slotIndexes(secrets) {
		sl := &slot{
			s:     s,
			index: i,
			drain: i >= s.cfg.Slots,
			base:  base,
			log:   s.log.WithValues("slot", i),
		}
		if sec := secrets[i]; sec != nil {
			sl.secret, sl.state = sec.sec, sec.state
			sl.savedJob = sec.state.JobID != ""
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sl.run(ctx)
		}()
	}
	s.log.Info("spawner started", "slots", s.cfg.Slots, "tags", s.cfg.allTags(), "endpoint", s.cfg.Endpoint)
	wg.Wait()
	s.log.Info("spawner stopped")
}

// slotIndexes are the indexes of the slots to run, in order: the pool's, and those of
// slots of an earlier, larger pool found in secrets.
func (s *Spawner) slotIndexes(secrets map[int]*slotSecret) []int {
	indexes := make([]int, 0, s.cfg.Slots+len(secrets))
	for i := range s.cfg.Slots {
		indexes = append(indexes, i)
	}
	for i, sec := range secrets {
		if i >= s.cfg.Slots {
			// A slot of an earlier, larger pool: finish its job if it has one, then let it go.
			indexes = append(indexes, i)
			s.log.Info("slot beyond the configured pool size found; it is drained and removed", "slot", i, "busy", sec.state.busy())
		}
	}
	sort.Ints(indexes)
	return indexes
}

// wake tells the slot waiting on a BuildJob that it changed.
func (s *Spawner) wake(obj any) {
	key, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil || ns != s.cfg.JobNamespace {
		return
	}
	s.mu.Lock()
	ch := s.waiters[name]
	s.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (s *Spawner) addWaiter(name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.waiters[name] = ch
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		if s.waiters[name] == ch {
			delete(s.waiters, name)
		}
		s.mu.Unlock()
	}
}

// slotChanged moves one slot between the states of the slots gauge: from and to are
// one of slotStates, or "" (not counted).
func (s *Spawner) slotChanged(from, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from != "" {
		s.slots[from]--
	}
	if to != "" {
		s.slots[to]++
	}
	for _, state := range slotStates {
		slotsMetric.WithLabelValues(s.cfg.Name, state).Set(float64(s.slots[state]))
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
