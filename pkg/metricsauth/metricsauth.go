// Package metricsauth lets only the scrapers the cluster allows read the operator's
// metrics: each request's bearer token is checked with a TokenReview, and what it asks for
// with a SubjectAccessReview of the non-resource URL it names (a scraper's ServiceAccount
// needs `nonResourceURLs: ["/metrics"], verbs: ["get"]`).
//
// controller-runtime's own filter (metrics/filters) does the same through k8s.io/apiserver's
// delegating authenticator and authorizer, which bring the API server's packages (CEL, gRPC,
// OpenTelemetry) into the binary: 20 MB of the 54 MB agentd, nearly all of it mapped into
// memory at run time. These are two API calls.
//
// Their answers are kept briefly (AllowTTL, DenyTTL), as the API server's own delegating
// authenticator and authorizer keep theirs: a scraper every few seconds, or anyone
// repeating one token, then costs the API server one TokenReview and one
// SubjectAccessReview per token in that time rather than per request. The caches are
// keyed by a SHA-256 digest of the token, never the token itself, and bounded in size.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Timeout bounds each review, so that a slow API server fails a scrape rather than holding it.
const Timeout = 10 * time.Second

// Defaults of Options.
const (
	// DefaultAllowTTL is how long a token that was accepted, and an access that was
	// allowed, are taken as such: the API server's delegating authenticator and
	// authorizer keep theirs as long. A revoked token or role so still works this long.
	DefaultAllowTTL = 10 * time.Second
	// DefaultDenyTTL is how long a refusal (a token not accepted, an access denied) is
	// kept: shorter, so that a scraper that has just been given its role is let in soon,
	// yet long enough that repeating a bad token costs the API server little.
	DefaultDenyTTL = 2 * time.Second
	// DefaultCacheSize bounds each cache: far more scrapers than any cluster runs, and a
	// few hundred kilobytes at most.
	DefaultCacheSize = 1024
)

// Options tune the caches of the filter; zero values take the defaults.
type Options struct {
	AllowTTL, DenyTTL time.Duration
	CacheSize         int
	// Clock tells the time the cached answers expire by (tests step a fake one).
	Clock cache.Clock
}

// Filter is a metricsserver.FilterProvider: set it as the metrics server's FilterProvider
// (with SecureServing), as controller-runtime's WithAuthenticationAndAuthorization is. It
// is FilterWith the default Options.
func Filter(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	return FilterWith(Options{})(cfg, httpClient)
}

// FilterWith is Filter with caches tuned by o.
func FilterWith(o Options) func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	if o.AllowTTL <= 0 {
		o.AllowTTL = DefaultAllowTTL
	}
	if o.DenyTTL <= 0 {
		o.DenyTTL = DefaultDenyTTL
	}
	if o.CacheSize <= 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return func(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
		authn, err := authenticationclient.NewForConfigAndClient(cfg, httpClient)
		if err != nil {
			return nil, fmt.Errorf("metrics authentication: %w", err)
		}
		authz, err := authorizationclient.NewForConfigAndClient(cfg, httpClient)
		if err != nil {
			return nil, fmt.Errorf("metrics authorization: %w", err)
		}
		return func(log logr.Logger, next http.Handler) (http.Handler, error) {
			g := &guard{
				tokens: authn.TokenReviews(), access: authz.SubjectAccessReviews(), log: log, next: next,
				opts:   o,
				users:  cache.NewLRUExpireCacheWithClock(o.CacheSize, o.Clock),
				grants: cache.NewLRUExpireCacheWithClock(o.CacheSize, o.Clock),
			}
			return g, nil
		}, nil
	}
}

type guard struct {
	tokens authenticationclient.TokenReviewInterface
	access authorizationclient.SubjectAccessReviewInterface
	log    logr.Logger
	next   http.Handler
	opts   Options
	// users maps a token's digest to its authentication (authentication);
	// grants maps an access (accessKey) to its authorization (authorization).
	users, grants *cache.LRUExpireCache
	// flights makes concurrent requests with one token, or for one access, wait for a
	// single review rather than each making their own before the first is cached.
	flights singleflight.Group
}

// tokenDigest names a token in the caches and their flights: they never hold the token
// itself, so nothing that outlives a request does (nor a memory dump of its leftovers).
type tokenDigest [sha256.Size]byte

// authentication is a cached TokenReview: who the token is, or nil when the API server
// does not accept it.
type authentication struct {
	user *authenticationv1.UserInfo
}

// accessKey is a cached SubjectAccessReview's question: the token's user, the URL path
// and the verb.
type accessKey struct {
	token      tokenDigest
	path, verb string
}

// authorization is a cached SubjectAccessReview's answer.
type authorization struct {
	allowed bool
	reason  string
}

func (g *guard) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), Timeout)
	defer cancel()
	token, ok := bearerToken(req)
	if !ok {
		http.Error(w, "Unauthorized: send a bearer token (a ServiceAccount's) in the Authorization header", http.StatusUnauthorized)
		return
	}
	digest := tokenDigest(sha256.Sum256([]byte(token)))
	user, err := g.authenticateCached(ctx, digest, token)
	if err != nil {
		// The token is never logged: only that the review could not be made.
		g.log.Error(err, "checking a metrics scraper's token failed")
		http.Error(w, "Internal Server Error: the token could not be checked", http.StatusInternalServerError)
		return
	}
	if user == nil {
		http.Error(w, "Unauthorized: the API server does not accept this token", http.StatusUnauthorized)
		return
	}
	verb := strings.ToLower(req.Method)
	allowed, reason, err := g.authorizeCached(ctx, accessKey{token: digest, path: req.URL.Path, verb: verb}, user)
	if err != nil {
		g.log.Error(err, "checking a metrics scraper's access failed", "user", user.Username, "path", req.URL.Path)
		http.Error(w, "Internal Server Error: access could not be checked", http.StatusInternalServerError)
		return
	}
	if !allowed {
		msg := fmt.Sprintf("Forbidden: %s may not %s %s (it needs a ClusterRole with nonResourceURLs [%q], verbs [%q])", user.Username, verb, req.URL.Path, req.URL.Path, verb)
		if reason != "" {
			msg += ": " + reason
		}
		http.Error(w, msg, http.StatusForbidden)
		return
	}
	g.next.ServeHTTP(w, req)
}

// bearerToken is the request's token, from "Authorization: Bearer <token>".
func bearerToken(req *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authenticateCached is authenticate, answered from the cache while an earlier answer
// for the same token holds. Errors are not kept: the next request asks again.
func (g *guard) authenticateCached(ctx context.Context, digest tokenDigest, token string) (*authenticationv1.UserInfo, error) {
	if v, ok := g.users.Get(digest); ok {
		return v.(authentication).user, nil
	}
	v, err, _ := g.flights.Do("authn:"+hex.EncodeToString(digest[:]), func() (any, error) {
		ctx, cancel := flightContext(ctx)
		defer cancel()
		user, err := g.authenticate(ctx, token)
		if err != nil {
			return nil, err
		}
		ttl := g.opts.AllowTTL
		if user == nil {
			ttl = g.opts.DenyTTL
		}
		g.users.Add(digest, authentication{user: user}, ttl)
		return authentication{user: user}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(authentication).user, nil
}

// authorizeCached is authorize, answered from the cache while an earlier answer to the
// same question holds. The user is the token's (the key's), so the token's digest stands
// for them in the key.
func (g *guard) authorizeCached(ctx context.Context, key accessKey, user *authenticationv1.UserInfo) (bool, string, error) {
	if v, ok := g.grants.Get(key); ok {
		a := v.(authorization)
		return a.allowed, a.reason, nil
	}
	flight := "authz:" + hex.EncodeToString(key.token[:]) + " " + key.verb + " " + key.path
	v, err, _ := g.flights.Do(flight, func() (any, error) {
		ctx, cancel := flightContext(ctx)
		defer cancel()
		allowed, reason, err := g.authorize(ctx, user, key.path, key.verb)
		if err != nil {
			return nil, err
		}
		ttl := g.opts.AllowTTL
		if !allowed {
			ttl = g.opts.DenyTTL
		}
		a := authorization{allowed: allowed, reason: reason}
		g.grants.Add(key, a, ttl)
		return a, nil
	})
	if err != nil {
		return false, "", err
	}
	a := v.(authorization)
	return a.allowed, a.reason, nil
}

// flightContext is the context of a review that other requests may be waiting on: not
// canceled when the request that started it goes away, which would fail them all, but
// bounded by Timeout all the same.
func flightContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), Timeout)
}

// authenticate returns who the token is, or nil when the API server does not accept it.
func (g *guard) authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error) {
	review, err := g.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating a TokenReview: %w", err)
	}
	if !review.Status.Authenticated {
		return nil, nil
	}
	return &review.Status.User, nil
}

// authorize asks whether user may use verb on the non-resource URL path.
func (g *guard) authorize(ctx context.Context, user *authenticationv1.UserInfo, path, verb string) (bool, string, error) {
	extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	review, err := g.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("creating a SubjectAccessReview: %w", err)
	}
	return review.Status.Allowed && !review.Status.Denied, review.Status.Reason, nil
}
