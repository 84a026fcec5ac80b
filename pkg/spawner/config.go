package spawner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	bkvalidation "github.com/buildkite-operator/buildkite-operator/pkg/validation"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Defaults of Config: setDefaults fills in those that a zero field may take; the flags
// (BindFlags) start from all of them.
const (
	// DefaultName is the flags' operator name; Config itself has none.
	DefaultName = "bk-operator"
	// DefaultSlots is the flags' number of slots; Config itself has none.
	DefaultSlots           = 10
	DefaultQueue           = "bk-operator"
	DefaultCreateTimeout   = 2 * time.Minute
	DefaultReregisterAfter = time.Minute
)

// Config configures a Spawner.
type Config struct {
	// Name names the operator: slot i registers as the agent "<Name>-<i>", and the slots'
	// state Secrets are "<Name>-slot-<i>". Two operators sharing one Buildkite organization
	// need different names.
	Name string
	// Namespace is the operator's own: it holds the registration token Secret and the
	// slots' state Secrets, which jobs must never read.
	Namespace string
	// JobNamespace holds the BuildJobs, their token Secrets and the BuildEnvironments: where
	// job pods run. Namespace when empty.
	JobNamespace string
	// Endpoint is the Buildkite agent API, such as https://agent.buildkite.com/v3.
	Endpoint string
	// AllowedEndpoints are the further agent API endpoints job tokens may be sent to, each
	// matched exactly (validation.EndpointAllowed): where Buildkite may move an agent with
	// a register or ping response. A move anywhere else must not be followed
	// (EndpointAllowed).
	AllowedEndpoints []string
	// Slots is the most jobs in flight: one agent registration per slot.
	Slots int
	// Queue is the value of the queue tag every slot carries; DefaultQueue when empty.
	Queue string
	// Tags are extra agent tags ("key=value"), such as cluster=gke-prod, that route jobs
	// to this operator among several.
	Tags []string
	// Priority is every slot's agent priority, sent when it registers, as the agent's
	// --priority: Buildkite offers a job to the agents of higher priority first. "" sends
	// none.
	Priority string
	// PingMode is how slots learn of their jobs, as the agent's --ping-mode: PingModeAuto
	// (Buildkite's streaming ping where it offers it, polling while it is down or where it
	// does not), PingModePingOnly or PingModeStreamOnly. PingModeAuto when "".
	PingMode string

	// Policy is what the slots check of every job before it gets a BuildJob, as the agent
	// that accepts a job does before bootstrap runs: its signature (signed pipelines) and
	// the allowlists. New loads it (the key set file is read then) and fails on a policy
	// that cannot be applied. Its zero value verifies nothing, allows everything, and
	// refuses a signed job, there being no keys to verify it with.
	Policy jobpolicy.Config
	// policy is Policy loaded, by validate.
	policy *jobpolicy.Policy

	// RegistrationTokenFile is a file holding the agent registration token; or
	// RegistrationTokenSecret names a Secret key in Namespace holding it. Exactly one.
	RegistrationTokenFile   string
	RegistrationTokenSecret *SecretKey

	// DefaultBuildEnvironment is the BuildEnvironment of jobs that name none, as the
	// mutating webhook fills it in; the spawner applies it before validating so that the
	// pipeline author hears about a job that cannot run in the job's own log.
	DefaultBuildEnvironment string
	// CreateTimeout bounds the retries of creating a job's BuildJob and token Secret while
	// the API server is unreachable; past it the job is failed, and idle slots take no more
	// jobs until the API server answers again. DefaultCreateTimeout when 0.
	CreateTimeout time.Duration
	// ReregisterAfter is how long a slot told to disconnect by Buildkite waits before it
	// registers anew: Buildkite disconnects an agent that is to go away (a deleted agent,
	// a cluster maintenance), but the operator still wants Slots jobs in flight.
	// DefaultReregisterAfter when 0.
	ReregisterAfter time.Duration

	// Cache is where the spawner watches BuildJobs (the manager's cache): a busy slot is
	// woken when its BuildJob is reported or deleted.
	Cache cache.Cache
	// APIReader reads without a cache (the manager's APIReader): slot state Secrets,
	// BuildEnvironments and LimitRanges for validation. The client given to New when nil.
	APIReader client.Reader

	// UserAgent is sent to Buildkite; "buildkite-operator" when empty.
	UserAgent string
	// Version is reported as the agents' version.
	Version string
	// APIWaitScale scales every wait between agent API retries (tests make it small); 1 when 0.
	APIWaitScale float64
	// APITimeout bounds one agent API request; 60 s when 0.
	APITimeout time.Duration
	// Log receives structured logs; never a token.
	Log logr.Logger
}

// EndpointAllowed reports whether job tokens may go to endpoint: Endpoint, or one of
// AllowedEndpoints. A register or ping response that moves an agent elsewhere must not be
// followed (nor the endpoint given to a BuildJob), or whoever answers there gets the tokens.
func (c *Config) EndpointAllowed(endpoint string) bool {
	return endpoint != "" && bkvalidation.EndpointAllowed(endpoint, c.Endpoint, c.AllowedEndpoints...)
}

// SecretKey names one key of a Secret in the spawner's namespace.
type SecretKey struct {
	Name, Key string
}

func (c *Config) setDefaults() {
	if c.JobNamespace == "" {
		c.JobNamespace = c.Namespace
	}
	if c.Queue == "" {
		c.Queue = DefaultQueue
	}
	if c.CreateTimeout <= 0 {
		c.CreateTimeout = DefaultCreateTimeout
	}
	if c.ReregisterAfter <= 0 {
		c.ReregisterAfter = DefaultReregisterAfter
	}
	if c.RegistrationTokenSecret != nil && c.RegistrationTokenSecret.Key == "" {
		c.RegistrationTokenSecret.Key = v1alpha1.DefaultSecretKey
	}
	if c.UserAgent == "" {
		c.UserAgent = "buildkite-operator"
	}
	if mode, err := canonicalPingMode(c.PingMode); err == nil {
		c.PingMode = mode // else validate says what is wrong
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// validate reports every problem with the configuration, each saying how to fix it, and
// loads Policy into policy.
func (c *Config) validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(c.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("name %q: %s; give the operator a short lower-case name such as bk-operator-gke-prod", c.Name, strings.Join(msgs, "; ")))
	} else if len(c.Name)+len("-slot-")+5 > validation.DNS1123LabelMaxLength {
		errs = append(errs, fmt.Errorf("name %q is too long: slot Secrets are named <name>-slot-<n>; use at most %d characters", c.Name, validation.DNS1123LabelMaxLength-len("-slot-")-5))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty: name the namespace that holds BuildJobs"))
	}
	if c.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is empty: give the Buildkite agent API URL, such as https://agent.buildkite.com/v3"))
	}
	if c.Slots < 1 {
		errs = append(errs, fmt.Errorf("slots is %d: allow at least 1 job in flight", c.Slots))
	}
	for _, t := range c.allTags() {
		k, _, ok := strings.Cut(t, "=")
		if !ok || k == "" || strings.ContainsAny(t, " \t\n") {
			errs = append(errs, fmt.Errorf("tag %q: tags are key=value with no spaces, such as cluster=gke-prod", t))
		}
	}
	switch {
	case c.RegistrationTokenFile == "" && c.RegistrationTokenSecret == nil:
		errs = append(errs, errors.New("no registration token: give a token file or a Secret holding the agent registration token"))
	case c.RegistrationTokenFile != "" && c.RegistrationTokenSecret != nil:
		errs = append(errs, errors.New("both a registration token file and a Secret are given: give one"))
	case c.RegistrationTokenSecret != nil && c.RegistrationTokenSecret.Name == "":
		errs = append(errs, errors.New("the registration token Secret has no name"))
	}
	if c.Cache == nil {
		errs = append(errs, errors.New("no cache to watch BuildJobs in: pass the manager's cache (mgr.GetCache())"))
	}
	if err := validPriority(c.Priority); err != nil {
		errs = append(errs, err)
	}
	if _, err := canonicalPingMode(c.PingMode); err != nil {
		errs = append(errs, err)
	}
	// Loading the policy is its check: a key set that cannot be read or used fails here,
	// before any slot takes a job, as the agent refuses to start with one. The loaded policy
	// is kept for the slots.
	if p, err := jobpolicy.New(c.Policy); err != nil {
		errs = append(errs, fmt.Errorf("job policy: %w", err))
	} else {
		c.policy = p
	}
	return errors.Join(errs...)
}

// validPriority checks an agent priority: Buildkite takes a whole number, and a slot whose
// registration Buildkite refuses for it would retry for ever.
func validPriority(p string) error {
	if p == "" {
		return nil
	}
	if _, err := strconv.Atoi(p); err != nil {
		return fmt.Errorf("priority %q is not a whole number: give one such as 10 (higher priorities are offered jobs first), or none", p)
	}
	return nil
}

// allTags are the tags every slot registers with: the queue first.
func (c *Config) allTags() []string {
	tags := []string{"queue=" + c.Queue}
	for _, t := range c.Tags {
		if strings.HasPrefix(t, "queue=") {
			continue // the queue is Config.Queue; a second queue tag would be ambiguous
		}
		tags = append(tags, t)
	}
	return tags
}

// registrationToken reads the registration token. Errors name where it was looked for,
// never what it holds.
func (c *Config) registrationToken(ctx context.Context, r client.Reader) (string, error) {
	if c.RegistrationTokenFile != "" {
		b, err := os.ReadFile(c.RegistrationTokenFile)
		if err != nil {
			return "", fmt.Errorf("reading the registration token file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("the registration token file %s is empty: put the agent registration token in it", c.RegistrationTokenFile)
		}
		return tok, nil
	}
	ref := c.RegistrationTokenSecret
	var s corev1.Secret
	if err := r.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: ref.Name}, &s); err != nil {
		return "", fmt.Errorf("reading the registration token from Secret %s/%s: %w", c.Namespace, ref.Name, err)
	}
	tok := strings.TrimSpace(string(s.Data[ref.Key]))
	if tok == "" {
		return "", fmt.Errorf("the Secret %s/%s has no key %q (or it is empty): put the agent registration token under that key", c.Namespace, ref.Name, ref.Key)
	}
	return tok, nil
}
