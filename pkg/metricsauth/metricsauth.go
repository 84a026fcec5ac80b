// Package metricsauth lets only the scrapers the cluster allows read the operator's
// metrics: each request's bearer token is checked with a TokenReview, and what it asks for
// with a SubjectAccessReview of the non-resource URL it names (a scraper's ServiceAccount
// needs `nonResourceURLs: ["/metrics"], verbs: ["get"]`).
//
// controller-runtime's own filter (metrics/filters) does the same through k8s.io/apiserver's
// delegating authenticator and authorizer, which bring the API server's packages (CEL, gRPC,
// OpenTelemetry) into the binary: 20 MB of the 54 MB agentd, nearly all of it mapped into
// memory at run time. These are two API calls.
package metricsauth

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Timeout bounds each review, so that a slow API server fails a scrape rather than holding it.
const Timeout = 10 * time.Second

// Filter is a metricsserver.FilterProvider: set it as the metrics server's FilterProvider
// (with SecureServing), as controller-runtime's WithAuthenticationAndAuthorization is.
func Filter(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authenticationclient.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	authz, err := authorizationclient.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		g := &guard{tokens: authn.TokenReviews(), access: authz.SubjectAccessReviews(), log: log, next: next}
		return g, nil
	}, nil
}

type guard struct {
	tokens authenticationclient.TokenReviewInterface
	access authorizationclient.SubjectAccessReviewInterface
	log    logr.Logger
	next   http.Handler
}

func (g *guard) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithTimeout(req.Context(), Timeout)
	defer cancel()
	token, ok := bearerToken(req)
	if !ok {
		http.Error(w, "Unauthorized: send a bearer token (a ServiceAccount's) in the Authorization header", http.StatusUnauthorized)
		return
	}
	user, err := g.authenticate(ctx, token)
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
	allowed, reason, err := g.authorize(ctx, user, req.URL.Path, verb)
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
