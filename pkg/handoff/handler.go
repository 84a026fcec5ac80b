// Package handoff is the operator's side of the warm-pod hand-off: an HTTP endpoint that
// gives a warm pod the job assigned to it, and to no other pod. A pod proves who it is
// with a projected ServiceAccount token bound to it and minted for the endpoint's
// audience; the Kubernetes API server checks the token (a TokenReview) and names the pod,
// by name and UID, that the token is bound to. The job then goes to that pod once.
package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
)

// The endpoint asks the API server whose token a request carries.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// Path is where the operator serves the endpoint, beside its admission webhooks.
const Path = "/handoff"

// LogHandedOff is the message of the log line of each hand-off; the bench times hand-offs
// on the node by it.
const LogHandedOff = "handed off a job to its warm pod"

// The keys of a TokenReview's user extra naming the pod a token is bound to.
const (
	ExtraPodName = "authentication.kubernetes.io/pod-name"
	ExtraPodUID  = "authentication.kubernetes.io/pod-uid"
)

const (
	// DefaultMaxWait bounds the long poll of a pod with no job yet. The http.Server
	// serving the handler needs a WriteTimeout above it.
	DefaultMaxWait = 30 * time.Second
	// DefaultReviewTimeout bounds the TokenReview.
	DefaultReviewTimeout = 10 * time.Second
	// maxBodyBytes: the request has nothing to say in its body; a little is tolerated.
	maxBodyBytes = 4 << 10
	// maxTokenBytes: projected tokens are a few KiB; more is not a token.
	maxTokenBytes = 16 << 10
	saPrefix      = "system:serviceaccount:"
)

// Config configures the endpoint.
type Config struct {
	// Audience is the audience the pods' projected tokens are minted for; tokens for any
	// other audience (the API server's own, above all) are refused.
	Audience string
	// Client creates the TokenReviews (RBAC: create tokenreviews.authentication.k8s.io).
	Client client.Client
	// Assignments says which job, if any, the pod gets.
	Assignments Assignments
	// Addresses, when set, binds a token to its pod's network address as well: a request
	// is refused unless it comes from an address the pod the token names has. A token
	// copied out of a pod (by anyone who could read its files) is then of no use from
	// anywhere else. Nil turns the check off, for a network where something between the
	// pods and the operator (a proxy, a NAT) hides the pods' addresses.
	Addresses PodAddresses
	// MaxWait bounds how long a pod with no job yet is held before it is told to ask
	// again (204). DefaultMaxWait when zero.
	MaxWait time.Duration
	// ReviewTimeout bounds the TokenReview. DefaultReviewTimeout when zero.
	ReviewTimeout time.Duration
	// Log is told of each hand-off and refusal, never of a token or a job's secrets.
	Log logr.Logger
}

// Handler serves the hand-off.
type Handler struct {
	cfg Config
}

// NewHandler checks the configuration and returns the endpoint.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Audience == "" {
		return nil, errors.New("hand-off endpoint: an audience is needed, the one the warm pods' projected tokens are minted for")
	}
	if cfg.Client == nil {
		return nil, errors.New("hand-off endpoint: a Kubernetes client is needed for the TokenReviews")
	}
	if cfg.Assignments == nil {
		return nil, errors.New("hand-off endpoint: no Assignments to ask for the pods' jobs")
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.ReviewTimeout <= 0 {
		cfg.ReviewTimeout = DefaultReviewTimeout
	}
	return &Handler{cfg: cfg}, nil
}

// refusal is an answer other than a job, with the reason kept apart for the log.
type refusal struct {
	status  int
	reason  string
	message string
	// detail goes to the log only (the API server's word on a token, say).
	detail string
	// routine: an answer the endpoint gives in normal operation, logged at V(1) only
	// (a warm pod that reached a replica which is not the leader, say).
	routine bool
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := h.cfg.Log.WithValues("remote", r.RemoteAddr)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.refuse(w, log, refusal{status: http.StatusMethodNotAllowed, reason: handoffclient.ReasonMethodNotAllowed,
			message: fmt.Sprintf("method %s is not allowed: the hand-off is a POST", r.Method)})
		return
	}
	// The body says nothing; read what little there may be so the connection can be
	// reused, and refuse a large one before anything else is done for it.
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxBodyBytes)); err != nil {
		h.refuse(w, log, refusal{status: http.StatusRequestEntityTooLarge, reason: handoffclient.ReasonBadRequest,
			message: fmt.Sprintf("the request body is too large or unreadable: the hand-off takes no body (at most %d bytes)", maxBodyBytes)})
		return
	}
	token, ref := bearerToken(r.Header.Get("Authorization"))
	if ref != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="buildkite-operator hand-off"`)
		h.refuse(w, log, *ref)
		return
	}
	pod, ref := h.review(r.Context(), token)
	if ref != nil {
		if ref.status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="buildkite-operator hand-off"`)
		}
		h.refuse(w, log, *ref)
		return
	}
	log = log.WithValues("pod", pod.String())
	if ref := h.checkAddress(r.Context(), r.RemoteAddr, pod); ref != nil {
		h.refuse(w, log, *ref)
		return
	}
	h.handOff(r.Context(), w, log, pod)
}

// PodAddresses tells which IP addresses a pod has: ErrUnknownPod when there is no such
// pod (by name and UID), none while it has not been given one yet.
type PodAddresses interface {
	PodIPs(ctx context.Context, pod PodRef) ([]string, error)
}

// PodAddressesFrom reads a pod's addresses from reader (the manager's cache: a warm pod
// asks for its job only once it runs, by when its address is known).
func PodAddressesFrom(reader client.Reader) PodAddresses { return cachedAddresses{reader} }

type cachedAddresses struct{ r client.Reader }

func (c cachedAddresses) PodIPs(ctx context.Context, ref PodRef) ([]string, error) {
	var p corev1.Pod
	if err := c.r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, ErrUnknownPod
		}
		return nil, fmt.Errorf("reading pod %s: %w", ref, err)
	}
	if p.UID != ref.UID {
		return nil, ErrUnknownPod
	}
	ips := make([]string, 0, len(p.Status.PodIPs))
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips, nil
}

// checkAddress refuses a request that does not come from the pod its token names
// (Config.Addresses).
func (h *Handler) checkAddress(ctx context.Context, remote string, pod PodRef) *refusal {
	if h.cfg.Addresses == nil {
		return nil
	}
	from, _, err := net.SplitHostPort(remote)
	if err != nil {
		from = remote
	}
	ips, err := h.cfg.Addresses.PodIPs(ctx, pod)
	switch {
	case errors.Is(err, ErrUnknownPod):
		return &refusal{status: http.StatusForbidden, reason: handoffclient.ReasonUnknownPod,
			message: fmt.Sprintf("pod %s/%s (uid %s) is not a warm pod of this operator waiting for a job", pod.Namespace, pod.Name, pod.UID)}
	case err != nil:
		return &refusal{status: http.StatusServiceUnavailable, reason: handoffclient.ReasonUnavailable,
			message: "the operator could not look up the pod's address; try again", detail: err.Error()}
	case len(ips) == 0:
		// The kubelet has not reported the address yet; it will, within moments.
		return &refusal{status: http.StatusServiceUnavailable, reason: handoffclient.ReasonUnavailable, routine: true,
			message: "the operator does not know this pod's address yet; try again"}
	}
	if slices.ContainsFunc(ips, func(ip string) bool { return sameIP(ip, from) }) {
		return nil
	}
	return &refusal{status: http.StatusForbidden, reason: handoffclient.ReasonWrongAddress,
		message: fmt.Sprintf("the token is pod %s/%s's, but the request does not come from that pod: a warm pod's token is good only from the pod itself "+
			"(if a proxy or NAT between the pods and the operator hides their addresses, the operator's --handoff-check-address=false turns this check off)", pod.Namespace, pod.Name),
		detail: fmt.Sprintf("from %s, the pod's addresses %v", from, ips)}
}

// sameIP compares two addresses as IPs (an IPv4 address may arrive IPv6-mapped).
func sameIP(a, b string) bool {
	x, y := net.ParseIP(a), net.ParseIP(b)
	return x != nil && y != nil && x.Equal(y)
}

// bearerToken takes the token from an Authorization header.
func bearerToken(header string) (string, *refusal) {
	scheme, token, ok := strings.Cut(header, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", &refusal{status: http.StatusUnauthorized, reason: handoffclient.ReasonUnauthenticated,
			message: "no bearer token: send the pod's projected ServiceAccount token as `Authorization: Bearer <token>`"}
	}
	if len(token) > maxTokenBytes || strings.ContainsAny(token, " \t") {
		return "", &refusal{status: http.StatusUnauthorized, reason: handoffclient.ReasonUnauthenticated,
			message: "the bearer token is malformed: send the content of the projected token file, nothing else"}
	}
	return token, nil
}

// review asks the API server whose token this is, and returns the pod it is bound to.
func (h *Handler) review(ctx context.Context, token string) (PodRef, *refusal) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ReviewTimeout)
	defer cancel()
	tr := &authv1.TokenReview{Spec: authv1.TokenReviewSpec{Token: token, Audiences: []string{h.cfg.Audience}}}
	if err := h.cfg.Client.Create(ctx, tr); err != nil {
		return PodRef{}, &refusal{status: http.StatusServiceUnavailable, reason: handoffclient.ReasonReviewUnavailable,
			message: "the operator could not have the token reviewed by the Kubernetes API server; try again", detail: err.Error()}
	}
	st := tr.Status
	if !st.Authenticated {
		// The API server says why (expired, its pod deleted, another audience, a bad
		// signature); that is for the operator's log, not for whoever holds the token,
		// except for the audience, which is a mistake in the pod's spec worth naming.
		if strings.Contains(st.Error, "audience") {
			return PodRef{}, wrongAudience(h.cfg.Audience, st.Error)
		}
		return PodRef{}, &refusal{status: http.StatusUnauthorized, reason: handoffclient.ReasonUnauthenticated,
			message: "the token was not accepted: it must be a current projected ServiceAccount token of a pod that still exists, minted for the audience " + h.cfg.Audience,
			detail:  st.Error}
	}
	if !slices.Contains(st.Audiences, h.cfg.Audience) {
		// The API server intersects the token's audiences with ours; an authenticator that
		// ignores audiences would leave ours out, and its token was not minted for us.
		return PodRef{}, wrongAudience(h.cfg.Audience, fmt.Sprintf("reviewed audiences %v", st.Audiences))
	}
	notAPod := func(detail string) (PodRef, *refusal) {
		return PodRef{}, &refusal{status: http.StatusForbidden, reason: handoffclient.ReasonNotAPod,
			message: "the token is not bound to a pod: only a warm pod's projected ServiceAccount token can take a job", detail: detail}
	}
	rest, ok := strings.CutPrefix(st.User.Username, saPrefix)
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return notAPod("user " + st.User.Username + " is not a service account")
	}
	name, uid := single(st.User.Extra[ExtraPodName]), single(st.User.Extra[ExtraPodUID])
	if name == "" || uid == "" {
		return notAPod("service account " + ns + "/" + sa + " token has no bound pod")
	}
	return PodRef{Namespace: ns, Name: name, UID: types.UID(uid)}, nil
}

func wrongAudience(audience, detail string) *refusal {
	return &refusal{status: http.StatusUnauthorized, reason: handoffclient.ReasonWrongAudience,
		message: fmt.Sprintf("the token is not for the audience %s: mount a projected serviceAccountToken with `audience: %s`", audience, audience),
		detail:  detail}
}

func single(v authv1.ExtraValue) string {
	if len(v) != 1 {
		return ""
	}
	return v[0]
}

// handOff answers with the pod's job, waiting for one up to MaxWait.
func (h *Handler) handOff(ctx context.Context, w http.ResponseWriter, log logr.Logger, pod PodRef) {
	timer := time.NewTimer(h.cfg.MaxWait)
	defer timer.Stop()
	for {
		// Taken before the claim, so that an assignment between the two still wakes us.
		changed := h.cfg.Assignments.Changed(pod)
		if ctx.Err() != nil {
			// The pod has gone away: do not take a job it would never receive.
			return
		}
		job, err := h.cfg.Assignments.Claim(ctx, pod)
		switch {
		case err == nil:
			h.sendJob(w, log, job)
			return
		case errors.Is(err, ErrNotAssigned):
			select {
			case <-changed:
				continue
			case <-timer.C:
				log.V(1).Info("the pod has no job yet: told to ask again")
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusNoContent)
				return
			case <-ctx.Done():
				return
			}
		case errors.Is(err, ErrAlreadyHandedOff):
			h.refuse(w, log, refusal{status: http.StatusConflict, reason: handoffclient.ReasonAlreadyHandedOff,
				message: "this pod's job was handed off already: a warm pod takes one job, once"})
			return
		case errors.Is(err, ErrUnknownPod):
			h.refuse(w, log, refusal{status: http.StatusForbidden, reason: handoffclient.ReasonUnknownPod,
				message: fmt.Sprintf("pod %s/%s (uid %s) is not a warm pod of this operator waiting for a job", pod.Namespace, pod.Name, pod.UID)})
			return
		case errors.Is(err, ErrNotReady):
			w.Header().Set("Retry-After", "1")
			h.refuse(w, log, refusal{status: http.StatusServiceUnavailable, reason: handoffclient.ReasonUnavailable, routine: true,
				message: "this replica of the operator does not know its warm pods (it is starting, or another replica leads): try again, on a new connection"})
			return
		default:
			h.refuse(w, log, refusal{status: http.StatusInternalServerError, reason: handoffclient.ReasonInternal,
				message: "the operator could not look up this pod's job; try again", detail: err.Error()})
			return
		}
	}
}

func (h *Handler) sendJob(w http.ResponseWriter, log logr.Logger, job handoffclient.Job) {
	body, err := json.Marshal(job)
	if err != nil {
		// Cannot happen for this type; the job is claimed and lost all the same.
		log.Error(err, "encoding a claimed job", "job", job.ID)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		// The job is claimed: it will not be handed out again, and its pod will not
		// start it. Say so loudly; the BuildJob's pod not starting the job shows the rest.
		log.Error(err, "the job was claimed but could not be sent to its pod", "job", job.ID, "buildJob", job.BuildJob)
		return
	}
	log.Info(LogHandedOff, "job", job.ID, "buildJob", job.BuildJob)
}

func (h *Handler) refuse(w http.ResponseWriter, log logr.Logger, ref refusal) {
	kv := []any{"status", ref.status, "reason", ref.reason}
	if ref.detail != "" {
		kv = append(kv, "detail", ref.detail)
	}
	switch {
	case ref.routine:
		log.V(1).Info("hand-off deferred", append(kv, "message", ref.message)...)
	case ref.status >= 500:
		log.Error(errors.New(ref.message), "hand-off failed", kv...)
	default:
		log.Info("hand-off refused", kv...)
	}
	body, _ := json.Marshal(handoffclient.ErrorResponse{Reason: ref.reason, Message: ref.message})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(ref.status)
	_, _ = w.Write(append(body, '\n'))
}
